"""Deep queues on the ZooKeeper backend (issue 15): ``enqueue_many`` in one multi per
chunk, the bucketed layout (bounded listings, FIFO across buckets, done buckets never
read again), ``queue_stats`` from counts under concurrent claimers, claim latency
independent of depth, and queues of the layout before buckets refused with the upgrade
step.

Like the other ZooKeeper tests these run on the 3-member container ensemble unless
``CONSENSUS_LEASE_ZK=local`` (see ``zk_local.py``). Nothing sleeps to synchronise.
"""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from zk_local import (  # noqa: F401  (fixtures)
    backend_of,
    chroot_of,
    opened,
    raw_client,
    store,
    zk_target,
    zk_url,
)

from consensus_lease import EnqueueItem, LeaseStore, QueueFull, open_store
from consensus_lease.backends.zookeeper import _queues
from consensus_lease.backends.zookeeper._layout import (
    BUCKET_JOBS,
    LegacyQueueLayout,
    QueueTag,
    encode_job_id,
)
from consensus_lease.cli import main
from consensus_lease.errors import InvalidArgument, UnsupportedOperation
from consensus_lease.record import JobState
from consensus_lease.session import Session
from consensus_lease.testing.conformance import poll_until

pytestmark = pytest.mark.slow


@pytest.fixture
def session_ttl_s() -> float:
    """``opened`` (from zk_local) opens sessions of 30 s here unless told otherwise."""
    return 30.0


def count_multis(store: LeaseStore) -> list[int]:
    """Record each multi the shared client sends (its number of operations)."""
    client = backend_of(store)._wire.reader()
    real = client.transaction
    sent: list[int] = []

    class Counting:
        def __init__(self) -> None:
            self.tx = real()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.tx, name)

        def commit_async(self) -> Any:
            sent.append(len(self.tx.operations))
            return self.tx.commit_async()

    client.transaction = Counting
    return sent


def head_of(url: str, queue: str) -> dict[str, int]:
    client = raw_client(url)
    try:
        data = client.get(f"{chroot_of(url)}/queues/{encode_job_id(queue)}")[0]
    finally:
        client.stop()
        client.close()
    fields: dict[str, int] = json.loads(data)
    return fields


def children(url: str, relative: str) -> list[str]:
    client = raw_client(url)
    try:
        return sorted(client.get_children(f"{chroot_of(url)}/{relative}"))
    finally:
        client.stop()
        client.close()


# -- enqueue_many ---------------------------------------------------------------------------


def test_enqueue_many_is_one_multi_per_chunk_and_idempotent(
    store: LeaseStore, zk_url: str
) -> None:
    """300 jobs: chunks of 128 (the store's max_enqueue_batch), one multi each; the
    first bucket is made by the first multi, the second by the one issuing seq 257 (the
    third)."""
    assert store.backend.capabilities.max_enqueue_batch == _queues.ENQUEUE_BATCH == 128
    ids = [f"job-{i:03d}" for i in range(300)]
    sent = count_multis(store)
    added = store.enqueue_many("q", [(job, job.encode()) for job in ids])
    assert added == [True] * 300
    # the queue's head, buckets and tallies; head + 128 jobs (+ bucket 0), 128, 44 (+
    # bucket 1)
    assert sent == [6, 1 + 6 + 4 * 128, 1 + 4 * 128, 1 + 6 + 4 * 44]
    assert head_of(zk_url, "q") == {"layout": 2, "seq": 300, "jobs": 300,
                                    "bytes": sum(len(j) for j in ids)}
    assert len(children(zk_url, "queues/q/b/0000000000/open")) == BUCKET_JOBS
    assert len(children(zk_url, "queues/q/b/0000000001/open")) == 300 - BUCKET_JOBS
    jobs = store.queue_jobs("q")
    assert [(j.record.job_id, j.seq, j.payload) for j in jobs] == [
        (job, i + 1, job.encode()) for i, job in enumerate(ids)
    ]
    # again, with new ones mixed in: the queued ones are left alone (their payload too)
    sent.clear()
    again = store.enqueue_many("q", [(ids[0], b"other"), "new-1", (ids[299], b"x"), "new-2"])
    assert again == [False, True, False, True]
    assert store.enqueue_many("q", ids) == [False] * 300
    assert head_of(zk_url, "q")["seq"] == 302
    assert store.queue_jobs("q")[0].payload == ids[0].encode()
    assert store.enqueue("q", "new-1") is False


def test_enqueue_many_refuses_a_job_outside_the_queue_and_adds_nothing_of_its_chunk(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str
) -> None:
    store.enqueue("other", "elsewhere")
    lease = opened("A").claim("named")
    assert lease is not None
    for outsider, why in (("elsewhere", "another queue"), ("named", "claimed by name")):
        with pytest.raises(InvalidArgument, match=why):
            store.enqueue_many("q", ["a", "b", outsider, "c"])
        assert store.queue_jobs("q") == []
        assert store.get("a") is None
    # several multis (large payloads): checked before the first is sent
    big = b"x" * 60_000
    with pytest.raises(InvalidArgument, match="another queue"):
        store.enqueue_many("q", [("a", big), ("b", big), ("c", big), ("elsewhere", b"")])
    assert store.queue_jobs("q") == [] and store.get("a") is None
    sent = count_multis(store)
    assert store.enqueue_many("q", [("a", big), ("b", big), ("c", big)]) == [True] * 3
    # 160 KB per multi: head + bucket 0 + two jobs, then head + one job
    assert sent == [1 + 6 + 2 * 4, 1 + 4]
    assert [j.payload for j in store.queue_jobs("q")] == [big] * 3
    with pytest.raises(InvalidArgument, match="twice"):
        store.enqueue_many("q", ["d", "d"])
    assert store.get("d") is None


def test_enqueue_many_is_atomic_per_multi_when_a_job_appears_meanwhile(
    store: LeaseStore, zk_url: str
) -> None:
    """enqueue_many sends its multi without reading first. A job another client made
    fails the multi as a whole: read then, it is left out if it is in this queue, and
    the chunk is refused if it is not (nothing of it added)."""
    other = open_store(zk_url, connect_timeout_s=30)
    try:
        assert store.enqueue("q", "first") is True  # the head is cached from here on
        assert other.enqueue("q", "b", b"theirs") is True
        assert store.enqueue_many("q", ["a", "b", "c"]) == [True, False, True]
        assert [(j.record.job_id, j.payload) for j in store.queue_jobs("q")] == [
            ("first", b""), ("b", b"theirs"), ("a", b""), ("c", b"")]
        assert head_of(zk_url, "q")["jobs"] == 4
        with other.session("O", 30.0) as s:
            lease = s.claim("named")
            assert lease is not None
            with pytest.raises(InvalidArgument, match="claimed by name"):
                store.enqueue_many("q", ["x", "named", "y"])
        assert store.get("x") is None and store.get("y") is None
        assert head_of(zk_url, "q")["jobs"] == 4
    finally:
        other.close()


# -- the bucketed layout ----------------------------------------------------------------------


def test_claims_walk_the_buckets_in_fifo_order_and_skip_done_ones(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str
) -> None:
    total = 2 * BUCKET_JOBS + 10
    ids = [f"j{i:04d}" for i in range(total)]
    store.enqueue_many("q", ids)
    backend = backend_of(store)
    a = opened("A")
    taken: list[str] = []
    first_bucket = set(ids[:BUCKET_JOBS])
    for _ in range(BUCKET_JOBS + 40):  # until the first bucket is done (bounded)
        if first_bucket <= set(taken):
            break
        lease = a.claim_next("q")
        assert lease is not None
        taken.append(lease.job_id)
        lease.complete(b"")
    assert first_bucket <= set(taken)
    # FIFO-ish: each claim takes one of the oldest QUEUE_SPREAD (8) looking claimable
    for i, job in enumerate(taken):
        assert ids.index(job) < i + 8
    left = [job for job in ids if job not in taken]
    # the first bucket is done: the next look finds it so (open and failed empty), and
    # later ones read only the second bucket (head + one bucket)
    assert [j for j, _ in backend.queue_candidates("q", 5)] == left[:5]
    trips: list[list[str]] = []
    real = backend._wire.reader_read

    def counting(reads: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append([path for _, path in reads])
        return real(reads, *args, **kwargs)

    backend._wire.reader_read = counting  # type: ignore[method-assign]
    got = backend.queue_candidates("q", 5)
    assert [j for j, _ in got] == left[:5]
    assert len(trips[0]) == 7
    assert not [p for trip in trips for p in trip if "/b/0000000000" in p]
    backend._wire.reader_read = real  # type: ignore[method-assign]
    stats = store.queue_stats("q")
    assert (stats.available, stats.held, stats.completed, stats.failed) == (
        len(left), 0, len(taken), 0)
    # a fresh process finds the floor by itself
    fresh = open_store(zk_url, connect_timeout_s=30)
    try:
        assert [j for j, _ in fresh.backend.queue_candidates("q", 3)] == left[:3]
        assert fresh.queue_stats("q") == stats
    finally:
        fresh.close()
    # purge takes the completed jobs off the head's counts
    assert store.purge("q") == len(taken)
    assert head_of(zk_url, "q")["jobs"] == len(left) == total - len(taken)
    assert store.queue_stats("q").completed == 0


def test_many_held_jobs_at_the_head_do_not_hide_newer_ones(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    """The whole first bucket is held: candidates come from the next one."""
    ids = [f"j{i:04d}" for i in range(BUCKET_JOBS + 3)]
    store.enqueue_many("q", ids)
    a = opened("A")
    for start in range(0, BUCKET_JOBS, 100):
        assert all(lease is not None for lease in a.claim_many(ids[start:min(start + 100,
                                                                             BUCKET_JOBS)]))
    got = backend_of(store).queue_candidates("q", 10)
    assert [j for j, _ in got] == ids[BUCKET_JOBS:]
    stats = store.queue_stats("q")
    assert (stats.available, stats.held) == (3, BUCKET_JOBS)


def test_a_failed_job_keeps_its_bucket_open_until_requeued_and_completed(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    ids = [f"j{i:04d}" for i in range(BUCKET_JOBS + 2)]
    store.enqueue_many("q", [EnqueueItem(job, b"", 1) for job in ids])
    a = opened("A")
    first = a.claim("j0000")
    assert first is not None
    first.fail("boom")  # one attempt: FAILED
    for job in ids[1:BUCKET_JOBS]:
        lease = a.claim(job)
        assert lease is not None
        lease.complete(b"")
    assert [j for j, _ in backend_of(store).queue_candidates("q", 5)] == ids[BUCKET_JOBS:]
    stats = store.queue_stats("q")
    assert (stats.available, stats.failed, stats.completed) == (2, 1, BUCKET_JOBS - 1)
    store.requeue("j0000")  # back in the first bucket, which was not taken for done
    assert next(j for j, _ in backend_of(store).queue_candidates("q", 5)) == "j0000"
    again = a.claim_next("q")
    assert again is not None
    assert store.queue_stats("q").failed == 0


# -- queue_stats under concurrent claimers ----------------------------------------------------


def test_queue_stats_stays_consistent_under_four_concurrent_claimers(
    store: LeaseStore, zk_url: str
) -> None:
    total = 600
    store.enqueue_many("q", [f"j{i:04d}" for i in range(total)])
    stop = threading.Event()
    errors: list[BaseException] = []
    done: list[int] = []

    def work(name: str) -> None:
        count = 0
        try:
            with store.session(name, 30.0) as s:
                while not stop.is_set() and count < total:
                    lease = s.claim_next("q")
                    if lease is None:
                        break
                    lease.complete(b"")
                    count += 1
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.append(count)

    workers = [threading.Thread(target=work, args=(f"W{i}",)) for i in range(4)]
    for t in workers:
        t.start()
    seen: list[Any] = []
    give_up = time.monotonic() + 120
    try:
        while any(t.is_alive() for t in workers) and time.monotonic() < give_up:
            stats = store.queue_stats("q")
            seen.append(stats)
            assert stats.available + stats.held + stats.completed + stats.failed == total
            assert 0 <= stats.held <= 4 and stats.failed == 0
            assert min(stats.available, stats.completed) >= 0
    finally:
        stop.set()
        for t in workers:
            t.join(timeout=60)
    assert not errors and sum(done) == total
    completed = [s.completed for s in seen]
    assert completed == sorted(completed)  # never goes back
    assert len(seen) >= 3
    final = store.queue_stats("q")
    assert (final.available, final.held, final.completed, final.failed) == (0, 0, total, 0)


# -- depth ------------------------------------------------------------------------------------


def _claim_latencies(session: Session, queue: str, n: int) -> list[float]:
    """How long each of ``n`` claim_next took (each lease completed after timing)."""
    out: list[float] = []
    for _ in range(n):
        started = time.perf_counter()
        lease = session.claim_next(queue)
        out.append(time.perf_counter() - started)
        assert lease is not None
        lease.complete(b"")
    return out


def test_claim_latency_does_not_grow_with_queue_depth(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    """20,000 jobs (filled with enqueue_many) against 200: the median claim_next
    stays within 3x (generous, for a busy machine; the benchmark carries the
    real goal), and queue_stats stays cheap and exact."""
    store.enqueue_many("shallow", [f"s{i:05d}" for i in range(200)])
    started = time.monotonic()
    deep_ids = [f"d{i:05d}-{'x' * 100}" for i in range(20_000)]
    for start in range(0, len(deep_ids), 2_000):
        store.enqueue_many("deep", deep_ids[start : start + 2_000])
    fill_s = time.monotonic() - started
    a = opened("A")
    _claim_latencies(a, "shallow", 5)  # warm up both
    _claim_latencies(a, "deep", 5)
    shallow = statistics.median(_claim_latencies(a, "shallow", 40))
    deep = statistics.median(_claim_latencies(a, "deep", 40))
    assert deep <= 3 * shallow + 0.005, (deep, shallow, fill_s)
    started = time.monotonic()
    stats = store.queue_stats("deep")
    stats_s = time.monotonic() - started
    assert (stats.available, stats.completed) == (20_000 - 45, 45)
    assert stats_s < 2.0  # one round trip of four reads (O(1)), with a margin


# -- capacity and layout 1 --------------------------------------------------------------------


def test_a_full_queue_refuses_more_before_sending(
    store: LeaseStore, zk_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_queues, "MAX_QUEUE_JOBS", 300)
    assert store.backend.capabilities.max_queue_jobs == 25_000  # (the documented one)
    store.enqueue_many("q", [f"j{i:03d}" for i in range(290)])
    sent = count_multis(store)
    with pytest.raises(QueueFull, match="capacity of 300"):
        store.enqueue_many("q", [f"k{i:03d}" for i in range(20)])
    with pytest.raises(QueueFull):
        store.enqueue_many("q", [f"k{i:03d}" for i in range(11)])
    assert sent == []  # refused before anything was sent
    assert store.enqueue_many("q", [f"k{i:03d}" for i in range(10)]) == [True] * 10
    with pytest.raises(QueueFull):
        store.enqueue("q", "one-more")
    assert store.enqueue("q", "j000") is False  # already queued: no capacity needed
    monkeypatch.setattr(_queues, "MAX_QUEUE_BYTES", 100)
    with pytest.raises(QueueFull, match="payload bytes"):
        store.enqueue("other", "big", b"x" * 101)
    assert store.get("big") is None


def test_a_queue_of_the_layout_before_buckets_is_refused_with_the_upgrade_step(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A queue written by layout 1 (flat open/held lists, empty head): queue operations
    are refused naming the upgrade step; its jobs still complete by name."""
    chroot = chroot_of(zk_url)
    store.get("x")  # the store's znodes exist
    client = raw_client(zk_url)
    member = f"{1:010d}-{encode_job_id('old')}"
    try:
        base = f"{chroot}/queues/legacy"
        client.ensure_path(f"{chroot}/jobs")
        for path in (base, f"{base}/jobs", f"{base}/open", f"{base}/held"):
            client.create(path, b"", makepath=True)
        client.set(base, b"")  # version 1: the last seq issued
        tag = QueueTag("legacy", member, "n0nce")
        client.create(f"{chroot}/jobs/old", b"")
        client.create(f"{chroot}/jobs/old/queue", tag.dump())
        client.create(f"{base}/jobs/{member}", b"payload")
        client.create(f"{base}/open/{member}", b"")
    finally:
        client.stop()
        client.close()
    for call in (lambda: store.enqueue("legacy", "new"),
                 lambda: store.enqueue_many("legacy", ["new"]),
                 lambda: store.backend.queue_candidates("legacy", 5),
                 lambda: store.queue_stats("legacy"),
                 lambda: store.queue_jobs("legacy"),
                 lambda: store.purge("legacy")):
        with pytest.raises(LegacyQueueLayout, match="upgrade step") as refused:
            call()
        assert isinstance(refused.value, UnsupportedOperation)
    assert store.get("new") is None
    with pytest.raises(LegacyQueueLayout, match="deleteall"):  # no in-place upgrade
        store.backend.upgrade_queue("legacy")
    capsys.readouterr()
    assert main(["upgrade-queue", "--backend", zk_url, "legacy"]) == 2
    err = capsys.readouterr().err
    assert "LegacyQueueLayout" in err and "deleteall" in err, err
    store.enqueue("current", "c")
    assert store.backend.upgrade_queue("current") == 0  # served as it is
    assert store.backend.upgrade_queue("unknown") == 0
    assert children(zk_url, "queues") == ["current", "legacy"]  # nothing made
    a = opened("A")
    lease = a.claim("old")  # by name: its tag gives the old paths
    assert lease is not None
    assert children(zk_url, "queues/legacy/held") == [member]
    assert lease.complete(b"done").state is JobState.COMPLETED
    assert children(zk_url, "queues/legacy/open") == []
    assert children(zk_url, "queues/legacy/held") == []


# -- waiting across buckets -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["release-in-second-bucket", "enqueue-into-a-new-bucket"])
def test_a_waiting_claim_next_is_woken_past_the_first_bucket(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str, how: str
) -> None:
    """The first bucket is done, the second (full) is held or done: a waiter on
    another store (its own view of the floor) is woken by a release there, or by an
    enqueue that makes the third bucket."""
    ids = [f"j{i:04d}" for i in range(2 * BUCKET_JOBS)]
    store.enqueue_many("q", ids)
    a = opened("A")
    for start in range(0, BUCKET_JOBS, 100):
        for lease in a.claim_many(ids[start : min(start + 100, BUCKET_JOBS)]):
            assert lease is not None
            lease.complete(b"")
    second = [lease for start in range(BUCKET_JOBS, 2 * BUCKET_JOBS, 100)
              for lease in a.claim_many(ids[start : min(start + 100, 2 * BUCKET_JOBS)])]
    assert all(lease is not None for lease in second)
    if how == "enqueue-into-a-new-bucket":
        for lease in second:
            assert lease is not None
            lease.complete(b"")
    other = open_store(zk_url, connect_timeout_s=30)
    try:
        b = other.session("B", 30.0)
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(b.claim_next("q", wait_s=60)))
        waiter.start()
        subs = backend_of(other)._subs
        poll_until(lambda: subs.subscribers() == 1 and subs.watches() >= 1, 20)
        since = time.monotonic()
        if how == "release-in-second-bucket":
            expected = second[-1]
            assert expected is not None
            expected.release()
            job = expected.job_id
        else:
            job = "fresh"
            store.enqueue("q", job)
        waiter.join(timeout=70)
        assert got and got[0] is not None and got[0].job_id == job
        assert time.monotonic() - since < 10
        got[0].release()
        b.close()
    finally:
        other.close()
