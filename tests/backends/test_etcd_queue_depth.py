"""Deep work queues on the etcd backend (issue 15), on one local member: the FIFO index
(claim cost independent of the queue's depth), ``enqueue_many`` in one transaction per
chunk, ``queue_stats`` from counters at one revision, the capacity, and the upgrade of a
queue written by the first layout.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from etcd_local import LocalEtcd, backend_of, local_members
from pyetcd import etcdrpc

from consensus_lease import (
    EnqueueItem,
    InvalidArgument,
    LeaseStore,
    QueueFull,
    QueueStats,
    open_store,
)
from consensus_lease.backends.etcd import _queues, _queues_state
from consensus_lease.cli import main
from consensus_lease.testing.conformance import poll_until


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=100)


@pytest.fixture
def url(etcd_server: LocalEtcd) -> str:
    return etcd_server.url_with_prefix(f"deep-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def store(url: str) -> Iterator[LeaseStore]:
    with open_store(url) as store:
        yield store


def _count_sends(store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every request the transport makes (reads and writes)."""
    transport = backend_of(store)._transport
    real = transport.attempt
    sent: list[str] = []

    def attempt(stub: str, method: str, request: Any, timeout_s: float) -> Any:
        sent.append(method)
        return real(stub, method, request, timeout_s)

    monkeypatch.setattr(transport, "attempt", attempt)
    return sent


def _ids(store: LeaseStore, queue: str) -> list[str]:
    return [j.record.job_id for j in store.queue_jobs(queue)]


def _candidates(store: LeaseStore, queue: str, limit: int = 32) -> list[str]:
    return [job_id for job_id, _ in backend_of(store).queue_candidates(queue, limit)]


# -- enqueue_many ---------------------------------------------------------------------------


def test_enqueue_many_is_idempotent_and_keeps_fifo_order(store: LeaseStore) -> None:
    ids = [f"j{i:03d}" for i in range(250)]
    assert store.enqueue_many("q", [(i, i.encode()) for i in ids]) == [True] * 250
    again = store.enqueue_many("q", [(i, b"other") for i in ids[:10]] + [("new", b"n")])
    assert again == [False] * 10 + [True]
    jobs = store.queue_jobs("q")
    assert [j.record.job_id for j in jobs] == [*ids, "new"]
    assert jobs[0].payload == b"j000"  # an existing job is left unchanged
    assert _candidates(store, "q") == ids[:32]  # key order of the index is FIFO order
    assert store.queue_stats("q") == QueueStats("q", 251, 0, 0, None, 0)


def test_enqueue_many_sends_one_transaction_per_chunk(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert backend_of(store).capabilities.max_enqueue_batch == _queues.ENQUEUE_BATCH == 100
    store.enqueue("q", "first")  # the driver has the queue's counters now
    sent = _count_sends(store, monkeypatch)
    assert store.enqueue_many("q", [f"j{i}" for i in range(250)]) == [True] * 250
    assert sent == ["Txn"] * 3
    sent.clear()
    assert store.enqueue("q", "one-more") is True
    assert sent == ["Txn"]


def test_a_job_outside_the_queue_fails_its_chunk_and_nothing_of_it_is_written(
    store: LeaseStore,
) -> None:
    store.enqueue("other", "x")
    ids = [f"j{i:03d}" for i in range(150)]
    with pytest.raises(InvalidArgument) as exc:
        store.enqueue_many("q", [*ids[:120], "x", *ids[120:]])  # "x" is in the 2nd chunk
    assert exc.value.job_id == "x" and "in queue 'other'" in str(exc.value)
    assert _ids(store, "q") == ids[:100]  # the first chunk is in, the second not at all
    with store.session("W", ttl_s=30) as w:
        assert w.claim("named") is not None
        with pytest.raises(InvalidArgument) as exc:
            store.enqueue_many("q", ["a", "named"])
        assert exc.value.job_id == "named" and "claimed by name" in str(exc.value)
    assert store.get("a") is None
    # Again without the culprit: only what is missing is added.
    assert store.enqueue_many("q", ids) == [False] * 100 + [True] * 50
    assert _ids(store, "q") == ids
    assert store.queue_stats("q").available == 150


def test_concurrent_producers_share_the_ordinals(store: LeaseStore, url: str) -> None:
    with open_store(url) as other:
        errors: list[BaseException] = []

        def produce(s: LeaseStore, name: str) -> None:
            try:
                for n in range(5):
                    s.enqueue_many("q", [f"{name}-{n}-{i}" for i in range(30)])
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=produce, args=(s, name))
                   for s, name in ((store, "a"), (other, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors
    assert len(_ids(store, "q")) == 300
    assert store.queue_stats("q").available == 300
    seq = _raw(store, _qdir(store, "q") + b"k/seq")
    assert seq is not None and int(seq.value.split(b"/")[0]) == 300  # none lost or doubled


# -- the index: expiry, requeue -----------------------------------------------------------


def test_an_expired_hold_is_found_again_and_counted_available(store: LeaseStore) -> None:
    store.enqueue_many("q", ["a", "b"])
    with store.session("A", ttl_s=60) as a:
        lease = a.claim_next("q")
        assert lease is not None
        assert store.queue_stats("q").held == 1
        backend_of(store).expire_session(a.session_id)
        poll_until(lambda: store.queue_stats("q").held == 0, 10)  # the marker went with it
    assert store.queue_stats("q").available == 2
    assert sorted(_candidates(store, "q")) == ["a", "b"]
    with store.session("B", ttl_s=60) as b:
        again = b.claim(lease.job_id)
        assert again is not None and again.generation > lease.generation


def test_a_job_released_elsewhere_is_offered_again_within_the_rescan_time(
    store: LeaseStore, url: str
) -> None:
    """Another driver's scans start at its cursor, past the held front of the queue, and
    from the low-water mark again at least every RESCAN_S."""
    store.enqueue_many("q", ["a", "b", "c"])
    with open_store(url) as other, store.session("A", ttl_s=30) as a:
        lease = a.claim("a")
        assert lease is not None
        assert _candidates(other, "q") == ["b", "c"]  # its cursor is at "b" now
        lease.release()
        start = time.monotonic()
        poll_until(lambda: _candidates(other, "q") == ["a", "b", "c"], 10)
        assert time.monotonic() - start < _queues_state.RESCAN_S + 2
        assert _candidates(store, "q") == ["a", "b", "c"]  # at once where it was released


def test_a_requeued_job_goes_to_the_back(store: LeaseStore) -> None:
    store.enqueue_many("q", [EnqueueItem("a", max_attempts=1), "b", "c"])
    with store.session("W", ttl_s=30) as w:
        lease = w.claim("a")
        assert lease is not None
        lease.fail("boom")
    assert store.queue_stats("q") == QueueStats("q", 2, 0, 0, None, 1)
    assert _candidates(store, "q") == ["b", "c"]
    store.requeue("a")
    assert _candidates(store, "q") == ["b", "c", "a"]
    assert store.queue_stats("q") == QueueStats("q", 3, 0, 0, None, 0)


def test_stale_entries_are_deleted_and_the_low_water_mark_rises(store: LeaseStore) -> None:
    ids = [f"j{i:03d}" for i in range(80)]
    store.enqueue_many("q", ids)
    with store.session("W", ttl_s=30) as w:
        for job_id in ids[:70]:
            lease = w.claim(job_id)
            assert lease is not None
            lease.complete(b"")
    assert _candidates(store, "q") == ids[70:]
    qdir = _qdir(store, "q")
    low = _raw(store, qdir + b"k/low")
    assert low is not None and int(low.value) == 70
    entries = _range(store, qdir + b"i/", qdir + b"i0")
    assert len(entries) == 10  # the 70 stale ones are gone
    assert store.purge("q") == 70
    assert store.queue_stats("q") == QueueStats("q", 10, 0, 0, None, 0)


def test_the_scan_jumps_over_a_gap_behind_a_long_hold(store: LeaseStore) -> None:
    """A job held for long keeps the low-water mark at its place; the entries after it
    that were deleted leave a gap wider than a window, which the scan jumps over."""
    ids = [f"j{i:04d}" for i in range(1200)]
    store.enqueue_many("q", ids)
    qdir = _qdir(store, "q")
    kv = backend_of(store)._transport.member().kv
    for i in range(1, 1150):  # as if completed, their stale entries deleted
        kv.DeleteRange(etcdrpc.DeleteRangeRequest(key=qdir + b"p/" + ids[i].encode().hex().encode()),
                       timeout=5)
    kv.DeleteRange(etcdrpc.DeleteRangeRequest(key=qdir + b"i/" + b"%020d" % 1,
                                              range_end=qdir + b"i/" + b"%020d" % 1150),
                   timeout=5)
    with store.session("W", ttl_s=30) as w:
        assert w.claim("j0000") is not None
        assert _candidates(store, "q", 10) == ids[1150:1160]


# -- queue_stats under concurrent claimers ----------------------------------------------------


def test_queue_stats_stay_consistent_under_four_claimers(store: LeaseStore) -> None:
    total = 120
    store.enqueue_many("q", [EnqueueItem(f"j{i}", max_attempts=1 if i % 10 == 0 else None)
                             for i in range(total)])
    released: set[str] = set()
    lock = threading.Lock()
    errors: list[BaseException] = []
    deadline = time.monotonic() + 90

    def work(name: str) -> None:
        try:
            with store.session(name, ttl_s=30) as s:
                while time.monotonic() < deadline:
                    lease = s.claim_next("q")
                    if lease is None:
                        return
                    number = int(lease.job_id[1:])
                    with lock:
                        first = number % 7 == 0 and lease.job_id not in released
                        released.add(lease.job_id)
                    if number % 10 == 0:
                        lease.fail("boom")  # max_attempts=1: FAILED
                    elif first:
                        lease.release()  # available again, claimed later
                    else:
                        lease.complete(b"")
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(f"W{i}",)) for i in range(4)]
    for t in workers:
        t.start()
    reads, last_done = 0, 0
    while any(t.is_alive() for t in workers) and time.monotonic() < deadline:
        s = store.queue_stats("q")
        assert s.available + s.held + s.completed + s.failed == total, s
        assert min(s.available, s.held, s.completed, s.failed) >= 0, s
        assert s.held <= 4, s
        assert s.completed >= last_done, s
        last_done = s.completed
        reads += 1
    for t in workers:
        t.join(timeout=30)
    assert not errors
    assert reads >= 3
    assert store.queue_stats("q") == QueueStats("q", 0, 0, total - 12, None, 12)


# -- capacity ---------------------------------------------------------------------------


def test_a_full_queue_refuses_enqueues_until_purged(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert backend_of(store).capabilities.max_queue_jobs == _queues.MAX_QUEUE_JOBS
    monkeypatch.setattr(_queues, "MAX_QUEUE_JOBS", 5)
    assert store.enqueue_many("q", ["a", "b", "c", "d"]) == [True] * 4
    with pytest.raises(QueueFull):
        store.enqueue_many("q", ["e", "f"])
    assert store.get("e") is None and len(_ids(store, "q")) == 4
    assert store.enqueue("q", "e") is True
    with pytest.raises(QueueFull):
        store.enqueue("q", "f")
    with store.session("W", ttl_s=30) as w:
        lease = w.claim("a")
        assert lease is not None
        lease.complete(b"")
    with pytest.raises(QueueFull):  # completed jobs count until purged
        store.enqueue("q", "f")
    assert store.purge("q") == 1
    assert store.enqueue("q", "f") is True


def test_a_queue_over_its_payload_budget_refuses_enqueues_until_purged(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_queues, "MAX_QUEUE_PAYLOAD_BYTES", 1000)
    assert store.enqueue_many("q", [("a", b"x" * 400), ("b", b"x" * 400)]) == [True, True]
    with pytest.raises(QueueFull) as exc:
        store.enqueue_many("q", [("c", b"x" * 100), ("d", b"x" * 101)])
    assert "payload bytes" in str(exc.value)
    assert store.get("c") is None
    assert store.enqueue("q", "c", b"x" * 200) is True  # exactly at the budget
    with store.session("W", ttl_s=30) as w:
        lease = w.claim("a")
        assert lease is not None
        lease.complete(b"")
    assert store.purge("q") == 1  # gives its 400 bytes back
    assert store.enqueue("q", "d", b"x" * 400) is True
    with pytest.raises(QueueFull):
        store.enqueue("q", "e", b"x")


# -- claim cost independent of depth ------------------------------------------------------


@pytest.mark.slow
def test_claim_latency_at_20000_jobs_is_within_3x_of_200(store: LeaseStore) -> None:
    store.enqueue_many("shallow", [f"s{i}" for i in range(200)])
    store.enqueue_many("deep", [f"d{i}" for i in range(20_000)])
    assert store.queue_stats("deep") == QueueStats("deep", 20_000, 0, 0, None, 0)
    times: dict[str, list[float]] = {"shallow": [], "deep": []}
    with store.session("W", ttl_s=60) as w:
        for _ in range(33):  # interleaved, so load on the machine hits both alike
            for queue, spent in times.items():
                start = time.perf_counter()
                lease = w.claim_next(queue)
                spent.append(time.perf_counter() - start)
                assert lease is not None
                lease.complete(b"")
    shallow = statistics.median(times["shallow"][3:])
    deep = statistics.median(times["deep"][3:])
    assert deep <= 3 * shallow, (deep, shallow)
    assert store.queue_stats("deep") == QueueStats("deep", 20_000 - 33, 0, 33, None, 0)


# -- the first layout ---------------------------------------------------------------------


def _qdir(store: LeaseStore, queue: str) -> bytes:
    return backend_of(store)._layout.queue(queue).base


def _range(store: LeaseStore, key: bytes, end: bytes) -> list[Any]:
    answer = backend_of(store)._transport.member().kv.Range(
        etcdrpc.RangeRequest(key=key, range_end=end), timeout=5)
    return list(answer.kvs)


def _raw(store: LeaseStore, key: bytes) -> Any:
    kvs = _range(store, key, key + b"\x00")
    return kvs[0] if kvs else None


def _to_first_layout(store: LeaseStore, queue: str) -> None:
    """Rewrite ``queue`` as the first layout left it: no index, no counters, empty
    pending keys."""
    qdir = _qdir(store, queue)
    kv = backend_of(store)._transport.member().kv
    for prefix in (b"i/", b"k/", b"h/"):
        kv.DeleteRange(etcdrpc.DeleteRangeRequest(key=qdir + prefix,
                                                  range_end=qdir + prefix[:1] + b"0"),
                       timeout=5)
    for pending in _range(store, qdir + b"p/", qdir + b"p0"):
        kv.Put(etcdrpc.PutRequest(key=pending.key, value=b""), timeout=5)


def test_a_queue_of_the_first_layout_is_refused_until_upgraded(
    store: LeaseStore, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store.enqueue_many("q", [EnqueueItem("a"), EnqueueItem("b"), EnqueueItem("c"),
                             EnqueueItem("d"), EnqueueItem("f", max_attempts=1)])
    with store.session("W", ttl_s=30) as w:
        for job_id, how in (("a", "complete"), ("f", "fail")):
            lease = w.claim(job_id)
            assert lease is not None
            lease.complete(b"") if how == "complete" else lease.fail("boom")
    _to_first_layout(store, "q")
    with open_store(url) as old:  # a driver that has not seen the queue yet
        for call in (lambda: old.enqueue("q", "e"), lambda: old.queue_stats("q"),
                     lambda: backend_of(old).queue_candidates("q", 10)):
            with pytest.raises(InvalidArgument) as exc:
                call()
            assert "consensus-lease upgrade-queue --backend URL q`" in str(exc.value)
        with old.session("W", ttl_s=30) as w, pytest.raises(InvalidArgument):
            w.claim_next("q")
        assert old.get("e") is None
        capsys.readouterr()
        assert main(["upgrade-queue", "--backend", url, "q"]) == 0
        assert capsys.readouterr().out == "queue q: 3 open jobs indexed\n"  # b, c, d
        assert backend_of(old).upgrade_queue("q") == 0  # nothing left to do
        keys_before = [kv.key for kv in _range(store, b"\0", b"\0")]  # every key
        assert backend_of(old).upgrade_queue("no-such-queue") == 0
        assert [kv.key for kv in _range(store, b"\0", b"\0")] == keys_before  # none written
        assert old.queue_stats("q") == QueueStats("q", 3, 0, 1, None, 1)
        assert _candidates(old, "q") == ["b", "c", "d"]  # the old order
        assert old.enqueue("q", "e") is True
        with old.session("W", ttl_s=30) as w:
            lease = w.claim_next("q")
            assert lease is not None
            lease.complete(b"")
        assert old.queue_stats("q").completed == 2
        assert old.purge("q") == 2
        old.requeue("f")
        assert old.queue_stats("q") == QueueStats("q", 4, 0, 0, None, 0)
