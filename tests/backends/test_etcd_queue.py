"""Work queues on the etcd backend, on one local member (metrics are then exact): the key
layout, waking by watch, the payload limit, purge in batches, and lost answers.

The behaviour every backend shares is in the conformance suite (``test_queue_*``, run on
etcd by ``test_etcd_conformance.py``).
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from etcd_local import LocalEtcd, backend_of, local_members, lose_answers, use_member
from purge_budget import drain_then_purge_with_a_tight_budget
from pyetcd import etcdrpc

from consensus_lease import InvalidArgument, JobState, LeaseStore, QueueStats, open_store
from consensus_lease.record import ClaimResult
from consensus_lease.testing.conformance import poll_until
from consensus_lease.validation import MAX_JOB_ID_BYTES

_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=70)


@pytest.fixture
def store(etcd_server: LocalEtcd) -> Iterator[LeaseStore]:
    with open_store(etcd_server.url_with_prefix(f"q-{uuid.uuid4().hex[:12]}")) as store:
        yield store


def _keys_under(store: LeaseStore) -> dict[bytes, Any]:
    backend = backend_of(store)
    answer = backend._transport.member().kv.Range(
        etcdrpc.RangeRequest(key=backend._layout.root, range_end=backend._layout.range_end),
        timeout=5,
    )
    return {bytes(kv.key)[len(backend._layout.root) :]: kv for kv in answer.kvs}


def _hex(text: str) -> str:
    return text.encode().hex()


def _watchers(etcd_server: LocalEtcd | str) -> float:
    """Watchers open on the (first) member; or on the member whose metrics are served at
    the base URL given."""
    base = etcd_server if isinstance(etcd_server, str) else etcd_server.members[0].metrics_url
    with _HTTP.open(f"{base}/metrics", timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("etcd_debugging_mvcc_watcher_total "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no watcher metric")


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


# -- the key layout ---------------------------------------------------------------------------


def test_enqueue_writes_marker_member_pending_and_index_in_one_revision(
    store: LeaseStore,
) -> None:
    assert store.enqueue("mail", "m1", b"hello") is True
    keys = _keys_under(store)
    job, qdir = _hex("m1"), f"q/{_hex('mail')}/"
    first = "0" * 20
    assert set(keys) == {f"{job}/q".encode(), f"{qdir}j/{job}".encode(),
                         f"{qdir}p/{job}".encode(), f"{qdir}i/{first}/{job}".encode(),
                         f"{qdir}k/seq".encode(), f"{qdir}k/low".encode()}
    assert keys[f"{qdir}j/{job}".encode()].value == b"hello"
    assert keys[f"{qdir}p/{job}".encode()].value == first.encode()  # names its entry
    assert keys[f"{qdir}k/seq".encode()].value == b"%020d/%020d" % (1, 5)  # jobs, bytes
    assert len({kv.create_revision for kv in keys.values()}) == 1  # one transaction
    (queued,) = store.queue_jobs("mail")
    assert queued.seq == keys[f"{qdir}j/{job}".encode()].create_revision
    assert queued.record.state is JobState.AVAILABLE and queued.record.generation == 0
    # An enqueued, never-claimed job is a known job everywhere.
    assert store.get("m1") == queued.record
    assert store.records() == [queued.record]


def test_completion_deletes_the_pending_key_and_keeps_the_payload(store: LeaseStore) -> None:
    store.enqueue("q", "a", b"pa")
    store.enqueue("q", "b", b"pb")
    with store.session("W", ttl_s=30) as w:
        lease = w.claim("a")  # claim_next would start at a random one of the oldest
        assert lease is not None
        lease.complete(b"ra")
        pending = [k for k in _keys_under(store) if b"/p/" in k]
        assert pending == [f"q/{_hex('q')}/p/{_hex('b')}".encode()]
        assert backend_of(store).queue_candidates("q", 10) == [("b", b"pb")]
        jobs = store.queue_jobs("q")
        assert [(j.record.job_id, j.record.state, j.payload, j.record.result) for j in jobs] == [
            ("a", JobState.COMPLETED, b"pa", b"ra"),
            ("b", JobState.AVAILABLE, b"pb", None),
        ]


def test_claim_by_name_of_a_queued_job_completes_it_in_the_queue(store: LeaseStore) -> None:
    store.enqueue("q", "named")
    with store.session("W", ttl_s=30) as w:
        lease = w.claim("named")  # the queue was not known: its held marker comes after
        assert lease is not None
        stats = store.queue_stats("q")
        assert (stats.available, stats.held, stats.completed) == (0, 1, 0)
        assert stats.oldest_held_lease_until is not None  # the holder's lease end
        lease.complete(b"")
    assert backend_of(store).queue_candidates("q", 10) == []
    assert store.queue_stats("q").completed == 1
    assert store.purge("q") == 1
    assert store.get("named") is None
    qdir = f"q/{_hex('q')}/".encode()
    left = set(_keys_under(store))  # the queue's counters, no key of the job
    assert left == {qdir + b"k/" + n for n in (b"seq", b"low", b"done", b"purged")}
    assert store.queue_stats("q") == QueueStats("q", 0, 0, 0, None, 0)


def test_completion_reads_the_queue_only_for_a_claim_without_a_handle(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's handle carries the job's queue as the claim transaction read it: one
    transaction completes. A claim rebuilt from its generation alone reads the queue
    marker first, and still deletes the pending key."""
    store.enqueue("q", "a")
    store.enqueue("q", "b")
    backend = backend_of(store)
    handle = backend.open_session("W", 30)
    try:
        first, second = backend.claim(handle, "a"), backend.claim(handle, "b")
        assert first is not None and second is not None
        sent = _count_sends(store, monkeypatch)
        backend.complete(handle, "a", first, b"")
        assert sent == ["Txn"]
        sent.clear()
        backend.complete(handle, "b", ClaimResult(second.generation), b"")
        assert sent == ["Txn", "Txn"]  # the queue marker, then the completion
    finally:
        backend.close_session(handle)
    assert backend.queue_candidates("q", 10) == []
    assert store.queue_stats("q").completed == 2


def test_candidates_are_fifo_skip_held_and_a_released_job_keeps_its_place(
    store: LeaseStore,
) -> None:
    for i in range(5):
        store.enqueue("q", f"j{i}", str(i).encode())
    backend = backend_of(store)
    with store.session("A", ttl_s=30) as a:
        first = a.claim("j0")
        third = a.claim("j2")
        assert first is not None and third is not None
        assert [j for j, _ in backend.queue_candidates("q", 10)] == ["j1", "j3", "j4"]
        assert [j for j, _ in backend.queue_candidates("q", 2)] == ["j1", "j3"]
        first.release()
        assert [j for j, _ in backend.queue_candidates("q", 10)] == ["j0", "j1", "j3", "j4"]
    seqs = [j.seq for j in store.queue_jobs("q")]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5


def test_candidates_page_past_many_held_jobs(store: LeaseStore) -> None:
    """More held jobs at the head of the queue than one page of candidates."""
    jobs = [f"j{i:03d}" for i in range(100)]
    for job in jobs:
        store.enqueue("q", job)
    with store.session("A", ttl_s=30) as a:
        assert all(a.claim_many(jobs[:90]))
        assert [j for j, _ in backend_of(store).queue_candidates("q", 32)] == jobs[90:]


def test_enqueue_conflicts(store: LeaseStore) -> None:
    with store.session("A", ttl_s=30) as a:
        assert a.claim("by-name") is not None
    with pytest.raises(InvalidArgument, match="claimed by name"):
        store.enqueue("q", "by-name")
    store.enqueue("q1", "x", b"first")
    with pytest.raises(InvalidArgument, match="in queue 'q1'"):
        store.enqueue("q2", "x")
    assert store.enqueue("q1", "x", b"second") is False
    assert store.queue_jobs("q1")[0].payload == b"first"
    assert store.queue_jobs("q2") == []


def test_queue_names_do_not_nest(store: LeaseStore) -> None:
    """Queue "a" must not see the jobs of queue "ab" (hex directories end with "/")."""
    store.enqueue("ab", "j1")
    store.enqueue("a", "j2")
    assert [j.record.job_id for j in store.queue_jobs("a")] == ["j2"]
    assert [j for j, _ in backend_of(store).queue_candidates("a", 10)] == ["j2"]


# -- the payload limit ------------------------------------------------------------------------


def test_payload_over_the_limit_is_refused_before_sending(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = store.capabilities.max_payload_bytes
    assert limit == 1024 * 1024
    sent = _count_sends(store, monkeypatch)
    with pytest.raises(InvalidArgument, match="at most"):
        store.enqueue("q", "big", b"x" * (limit + 1))
    assert sent == []


def test_payload_at_the_limit_fits_etcds_default_request_size(store: LeaseStore) -> None:
    """The largest ids and payload in one enqueue, under --max-request-bytes (1.5 MiB)."""
    limit = store.capabilities.max_payload_bytes
    job = "é" * (MAX_JOB_ID_BYTES // 2)  # 256 bytes of UTF-8, 512 hex digits in keys
    queue = "q" * MAX_JOB_ID_BYTES
    payload = os.urandom(limit)
    assert store.enqueue(queue, job, payload) is True
    with store.session("W", ttl_s=30) as w:
        lease = w.claim_next(queue)
        assert lease is not None and lease.payload == payload
        lease.complete(b"")
    assert store.queue_jobs(queue)[0].payload == payload


# -- waiting ----------------------------------------------------------------------------------


def _wait_in_thread(store: LeaseStore, etcd_server: LocalEtcd, session: Any,
                    wait_s: float) -> tuple[threading.Thread, list[Any], float]:
    watchers = _watchers(etcd_server)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(session.claim_next("q", wait_s=wait_s)))
    waiter.start()
    poll_until(lambda: _watchers(etcd_server) > watchers, 10)  # B waits on its watch
    return waiter, got, watchers


@pytest.mark.parametrize("how", ["release", "expiry"])
def test_waiter_is_woken_by_a_release_or_expiry_elsewhere(
    store: LeaseStore, etcd_server: LocalEtcd, how: str
) -> None:
    store.enqueue("q", "only", b"p")
    with store.session("A", ttl_s=60) as a, store.session("B", ttl_s=60) as b:
        held = a.claim_next("q")
        assert held is not None
        waiter, got, watchers = _wait_in_thread(store, etcd_server, b, 30)
        start = time.monotonic()
        if how == "release":
            held.release()
        else:
            backend_of(store).expire_session(a.session_id)
        waiter.join(timeout=30)
        assert got and got[0] is not None and got[0].job_id == "only"
        assert got[0].generation > held.generation
        assert time.monotonic() - start < 2  # woken by the watch, far before 30 s
    poll_until(lambda: _watchers(etcd_server) <= watchers, 10)  # the watches are cancelled


def test_completion_does_not_wake_waiters(store: LeaseStore, etcd_server: LocalEtcd) -> None:
    """A completion frees nothing: the waiter sleeps on to its timeout."""
    store.enqueue("q", "only")
    with store.session("A", ttl_s=60) as a:
        held = a.claim_next("q")
        assert held is not None
        watchers = _watchers(etcd_server)
        done = threading.Timer(0.3, lambda: held.complete(b""))
        done.start()
        start = time.monotonic()
        backend_of(store).wait_for_queue("q", 1.5)
        assert time.monotonic() - start >= 1.4
        done.join()
    poll_until(lambda: _watchers(etcd_server) <= watchers, 10)


def test_waiter_is_woken_by_an_enqueue_and_returns_at_once_if_claimable(
    store: LeaseStore, etcd_server: LocalEtcd
) -> None:
    backend = backend_of(store)
    timer = threading.Timer(0.3, lambda: store.enqueue("q", "new"))
    timer.start()
    start = time.monotonic()
    backend.wait_for_queue("q", 20)
    assert 0.2 < time.monotonic() - start < 3
    timer.join()
    start = time.monotonic()
    backend.wait_for_queue("q", 20)  # "new" is claimable: no waiting
    assert time.monotonic() - start < 1
    start = time.monotonic()
    backend.wait_for_queue("q", 0.3)
    backend.wait_for_queue("other", 0.3)  # an empty queue: the timeout bounds it
    assert time.monotonic() - start < 3


def test_enqueue_into_another_queue_does_not_wake(
    store: LeaseStore, etcd_server: LocalEtcd
) -> None:
    timer = threading.Timer(0.2, lambda: store.enqueue("other", "x"))
    timer.start()
    start = time.monotonic()
    backend_of(store).wait_for_queue("q", 1.0)
    assert time.monotonic() - start >= 0.9
    timer.join()


# -- purge ------------------------------------------------------------------------------------


def test_purge_beyond_one_transaction(store: LeaseStore) -> None:
    """More completed jobs than etcd's 128 operations per transaction."""
    jobs = [f"j{i:03d}" for i in range(300)]
    for job in jobs:
        store.enqueue("q", job, job.encode())
    with store.session("W", ttl_s=60) as w:
        for start in range(0, 200, 50):
            for lease in w.claim_many(jobs[start : start + 50]):
                assert lease is not None
                lease.complete(b"done")
        held = w.claim("j250")
        assert held is not None
        stats = store.queue_stats("q")
        assert (stats.available, stats.held, stats.completed) == (99, 1, 200)
        assert store.purge("q") == 200
        assert store.purge("q") == 0
        left = store.queue_jobs("q")
        assert [j.record.job_id for j in left] == jobs[200:]
        assert all(store.get(job) is None for job in jobs[:200:37])
        assert not any(k.startswith(_hex("j000").encode()) for k in _keys_under(store))


@pytest.mark.parametrize("applied", [True, False])
def test_purge_with_a_lost_answer_counts_once(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    for i in range(3):
        store.enqueue("q", f"j{i}")
    with store.session("W", ttl_s=30) as w:
        for _ in range(2):
            lease = w.claim_next("q")
            assert lease is not None
            lease.complete(b"")
    dropped = lose_answers(store, monkeypatch, applied=applied)
    assert store.purge("q") == 2
    assert dropped
    assert [j.record.state for j in store.queue_jobs("q")] == [JobState.AVAILABLE]


# -- lost answers -----------------------------------------------------------------------------


@pytest.mark.parametrize("applied", [True, False])
def test_enqueue_with_a_lost_answer_is_read_back(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    dropped = lose_answers(store, monkeypatch, applied=applied)
    assert store.enqueue("q", "j", b"p") is True  # ours, whether the first copy landed or not
    assert dropped
    assert store.enqueue("q", "j", b"p") is False
    assert [(j.record.job_id, j.payload) for j in store.queue_jobs("q")] == [("j", b"p")]


def test_batch_claim_read_back_still_completes_in_the_queue(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch claim settled by reading back does not learn the jobs' queue: the
    completion reads it, and still deletes the pending key."""
    store.enqueue("q", "x")
    store.enqueue("q", "y")
    with store.session("W", ttl_s=30) as w:
        lose_answers(store, monkeypatch, applied=True)
        leases = w.claim_many(["x", "y"])
        assert all(leases)
        for lease in leases:
            assert lease is not None
            lease.complete(b"")
    assert backend_of(store).queue_candidates("q", 10) == []
    assert store.purge("q") == 2


# -- job lifecycle ------------------------------------------------------------------------------


def test_a_claim_without_a_limit_is_one_transaction_with_a_limit_two(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The common claim compares the limit key absent: one transaction. A job with a
    limit is refused by it, and claimed by a second one comparing what the first read."""
    store.enqueue("q", "free")
    store.enqueue("q", "limited", max_attempts=2)
    backend = backend_of(store)
    handle = backend.open_session("W", 30)
    try:
        assert len(backend.queue_candidates("q", 10)) == 2  # as claim_next: queue known
        sent = _count_sends(store, monkeypatch)
        free = backend.claim(handle, "free")
        assert free is not None and free.attempt == 1 and sent == ["Txn"]
        sent.clear()
        backend.complete(handle, "free", free, b"")
        assert sent == ["Txn"]
        sent.clear()
        limited = backend.claim(handle, "limited")
        assert limited is not None and limited.attempt == 1
        assert sent == ["Txn", "Txn"]
        sent.clear()
        record = backend.fail(handle, "limited", limited, "x", 0.0)
        assert sent == ["Txn"]
        assert (record.state, record.max_attempts, record.attempt) == (JobState.AVAILABLE, 2, 1)
    finally:
        backend.close_session(handle)


def test_batch_claims_jobs_with_a_limit_on_their_own(store: LeaseStore) -> None:
    """A job with a limit is refused by the batch's nested compare and claimed on its
    own; one whose attempts are used up becomes FAILED there and yields None."""
    store.enqueue("q", "free")
    store.enqueue("q", "limited", max_attempts=2)
    store.enqueue("q", "spent", max_attempts=1)
    with store.session("W", ttl_s=30) as w:
        first = w.claim("spent")
        assert first is not None
        first.release()  # its only attempt, ended without completion
        free, limited, spent = w.claim_many(["free", "limited", "spent"])
        assert free is not None and limited is not None and spent is None
        assert (free.attempt, limited.attempt) == (1, 1)
        assert free.generation != limited.generation  # the limited one: its own transaction
        record = store.get("spent")
        assert record is not None and record.state is JobState.FAILED
        assert record.error == "attempts exhausted: attempt 1 ended without completion"


def test_failed_job_leaves_the_pending_keys_until_requeued(store: LeaseStore) -> None:
    store.enqueue("q", "dead", b"p", max_attempts=1)
    store.enqueue("q", "done", b"d")
    job = _hex("dead")

    def pending() -> list[bytes]:
        return sorted(k for k in _keys_under(store) if b"/p/" in k)

    with store.session("W", ttl_s=30) as w:
        lease = w.claim("dead")
        assert lease is not None
        record = lease.fail("broken", retry_in_s=0)
        assert (record.state, record.attempt, record.error) == (JobState.FAILED, 1, "broken")
        keys = _keys_under(store)
        assert f"{job}/f".encode() in keys and f"{job}/e".encode() in keys
        assert pending() == [f"q/{_hex('q')}/p/{_hex('done')}".encode()]
        assert backend_of(store).queue_candidates("q", 10) == [("done", b"d")]
        done = w.claim("done")
        assert done is not None
        done.complete(b"")
        assert store.purge("q") == 1  # the completed job; FAILED ones stay
        assert store.queue_stats("q").failed == 1
        again = store.requeue("dead")
        assert (again.state, again.attempt, again.error, again.max_attempts) == (
            JobState.AVAILABLE, 1, "broken", 1,
        )
        assert store.get("dead") == again
        assert pending() == [f"q/{_hex('q')}/p/{job}".encode()]
        assert backend_of(store).queue_candidates("q", 10) == [("dead", b"p")]
        second = w.claim_next("q")
        assert second is not None and second.attempt == 2
        assert second.fail("still broken", retry_in_s=0).state is JobState.FAILED  # budget 1
        assert pending() == []


def test_waiter_is_woken_when_a_retry_delay_runs_out(
    store: LeaseStore, etcd_server: LocalEtcd
) -> None:
    store.enqueue("q", "later", b"p")
    with store.session("A", ttl_s=60) as a, store.session("B", ttl_s=60) as b:
        lease = a.claim_next("q")
        assert lease is not None
        sent = time.monotonic()
        lease.fail("not yet", retry_in_s=1)
        assert backend_of(store).queue_candidates("q", 10) == []
        waiter, got, watchers = _wait_in_thread(store, etcd_server, b, 30)
        waiter.join(timeout=30)
        assert got and got[0] is not None and got[0].attempt == 2
        assert 1 <= time.monotonic() - sent < 1 + 3  # the TTL plus etcd's expiry sweep
    poll_until(lambda: _watchers(etcd_server) <= watchers, 10)  # the watches are cancelled


# -- the container kit: three members ---------------------------------------------------------


@pytest.mark.parametrize("how", ["release", "expiry"])
def test_waiter_on_another_member_is_woken(etcd_cluster: Any, key_prefix: str, how: str) -> None:
    """The waiter watches through one member, the holder releases (or its lease is
    revoked) through another: the watch still wakes the waiter at once."""
    url = etcd_cluster.url_with_prefix(key_prefix)
    members = [m.endpoint for m in etcd_cluster.members]
    with open_store(url) as store_a, open_store(url) as store_b:
        use_member(store_a, members[0])
        use_member(store_b, members[1])
        store_a.enqueue("q", "only")
        with store_a.session("A", ttl_s=60) as a, store_b.session("B", ttl_s=60) as b:
            held = a.claim_next("q")
            assert held is not None
            metrics = f"http://{members[1]}"
            watchers = _watchers(metrics)
            got: list[Any] = []
            waiter = threading.Thread(target=lambda: got.append(b.claim_next("q", wait_s=30)))
            waiter.start()
            poll_until(lambda: _watchers(metrics) > watchers, 10)  # B waits on its watch
            start = time.monotonic()
            if how == "release":
                held.release()
            else:
                backend_of(store_a).expire_session(a.session_id)
            waiter.join(timeout=30)
            assert got and got[0] is not None and got[0].generation > held.generation
            assert time.monotonic() - start < 3


def test_purge_beyond_one_transaction_on_the_cluster(etcd_cluster: Any, key_prefix: str) -> None:
    with open_store(etcd_cluster.url_with_prefix(key_prefix)) as store:
        jobs = [f"j{i:03d}" for i in range(150)]
        for job in jobs:
            store.enqueue("q", job)
        with store.session("W", ttl_s=60) as w:
            for start in range(0, 150, 50):
                for lease in w.claim_many(jobs[start : start + 50]):
                    assert lease is not None
                    lease.complete(b"")
        assert store.purge("q") == 150
        assert store.queue_jobs("q") == [] and store.records() == []


# -- a server that allows few operations per transaction -------------------------------------


SMALL_TXN_OPS = 16


@pytest.fixture(scope="module")
def small_txn_server() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=80, extra_args=("--max-txn-ops", str(SMALL_TXN_OPS)))


def test_queue_of_100_jobs_on_a_server_allowing_16_operations_per_transaction(
    small_txn_server: LocalEtcd,
) -> None:
    """Reads that scale with the queue are split to the server's limit, learnt from its
    first refusal; purge is split into smaller batches (each job still deleted in one
    nested transaction)."""
    url = small_txn_server.url_with_prefix(f"small-{uuid.uuid4().hex[:8]}")
    with open_store(url) as store, store.session("A", 30) as a:
        ids = [f"job-{i:03d}" for i in range(100)]
        for job_id in ids:
            assert store.enqueue("work", job_id, job_id.encode())
        done = []
        for _ in range(60):
            lease = a.claim_next("work")
            assert lease is not None and lease.payload is not None
            done.append(lease.job_id)
            lease.complete(b"ok")
        assert len(set(done)) == 60 and set(done) <= set(ids[:68])  # from the oldest 8
        held = a.claim_next("work")
        assert held is not None and held.job_id not in done
        jobs = store.queue_jobs("work")
        assert [j.record.job_id for j in jobs] == ids
        stats = store.queue_stats("work")
        assert (stats.completed, stats.held, stats.available) == (60, 1, 39)
        assert [r.job_id for r in store.records()] == ids
        assert store.purge("work") == 60
        assert [j.record.job_id for j in store.queue_jobs("work")] == [
            i for i in ids if i not in done]
        assert backend_of(store)._ops.txn_limit.max_ops == SMALL_TXN_OPS


def test_a_job_too_large_for_the_servers_txn_limit_names_the_flag() -> None:
    """Splitting cannot help when one job's transaction is over the limit: the error
    names --max-txn-ops, the server's limit and what is needed; nothing is written."""
    with LocalEtcd(size=1, base=85, extra_args=("--max-txn-ops", "3")) as server:
        with open_store(server.url_with_prefix("tiny")) as store:
            for _ in range(2):  # learnt from the refusal, then refused before sending
                with pytest.raises(InvalidArgument) as exc:
                    store.enqueue("work", "job", b"payload")
                message = str(exc.value)
                assert "--max-txn-ops" in message and "allows 3" in message, message
                assert "needs 8" in message, message
            assert store.queue_jobs("work") == [] and store.get("job") is None


def test_needed_ops_counts_nested_transactions_against_the_rest() -> None:
    from consensus_lease.backends.etcd import _transport_requests as rq
    from consensus_lease.backends.etcd._transport_txn_limit import needed_ops

    nested = rq.txn(compare=[rq.exists(b"c")], success=[rq.delete(b"k")] * 8)
    outer = rq.txn(success=[etcdrpc.RequestOp(request_txn=nested)] * 3)
    assert needed_ops(nested) == 8
    assert needed_ops(outer) == 3 + 8  # etcd: nested against --max-txn-ops minus 3
    assert needed_ops(rq.txn(compare=[rq.exists(b"a")] * 5, success=[rq.get(b"a")])) == 5


def test_purge_longer_than_one_timeout_purges_the_whole_queue(etcd_server: LocalEtcd) -> None:
    # Each step has its own deadline: 10,000 jobs take longer than one 1 s budget (about
    # 2.5 s quiet; one deadline for the call gave BackendUnavailable part way), while
    # one step of 64 stays far inside it.
    base = etcd_server.url_with_prefix(f"q-{uuid.uuid4().hex[:12]}")
    n = 10_000
    tight_url = base + ("&" if "?" in base else "?") + "timeout_s=1&connect_timeout_s=1"
    took = drain_then_purge_with_a_tight_budget(base, tight_url, n, 100)
    print(f"purge of {n} jobs: {took:.2f} s with a 1 s budget per step")
