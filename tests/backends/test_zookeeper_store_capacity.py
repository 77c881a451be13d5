"""The ZooKeeper store-wide capacity (issue 25, item 6): jobs and payload bytes of every
queue and named job of one store together, against ``store_max_jobs`` and
``store_max_bytes``, checked before an enqueue multi is sent (``QueueFull`` naming the
limit and its option; nothing enqueued). On a real server with lowered limits, so it is
quick; the heap a limit protects is measured and documented in ``docs/capacity.md``.

Runs on the 3-member container ensemble unless ``CONSENSUS_LEASE_ZK=local`` (see
``zk_local.py``).
"""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

import time

import pytest
from zk_local import zk_target, zk_url  # noqa: F401  (fixtures)

from consensus_lease import InvalidArgument, QueueFull, open_store
from consensus_lease.backends.zookeeper import _config
from consensus_lease.backends.zookeeper._queues import ENQUEUE_MULTI_BYTES
from consensus_lease.backends.zookeeper._queues_capacity import heap_needed_mb


def test_the_default_limits_are_the_documented_ones() -> None:
    config = _config.parse_url("zk://127.0.0.1/x", {})
    assert (config.store_max_jobs, config.store_max_bytes) == (30_000, 16 * 1024 * 1024)
    with pytest.raises(InvalidArgument, match="store_max_jobs"):
        _config.parse_url("zk://127.0.0.1/x", {"store_max_jobs": 0})
    # the server's numChildren of {chroot}/jobs is a 32-bit int: a limit above it is none
    for bad in (2**31, 10_000_000_000):
        with pytest.raises(InvalidArgument, match=r"store_max_jobs must be in \[1, 2147483647\]"):
            _config.parse_url("zk://127.0.0.1/x", {"store_max_jobs": bad})
    config = _config.parse_url("zk://127.0.0.1/x", {"store_max_jobs": 2**31 - 1})
    assert config.store_max_jobs == 2**31 - 1


def test_jobs_of_every_queue_and_named_job_count_against_store_max_jobs(zk_url: str) -> None:
    store = open_store(zk_url, connect_timeout_s=30, store_max_jobs=300)
    other = open_store(zk_url, connect_timeout_s=30, store_max_jobs=300)  # another client
    try:
        for queue in ("q1", "q2"):  # two queues of 100 jobs
            added = store.enqueue_many(queue, [(f"{queue}-{i}", b"p") for i in range(100)])
            assert added == [True] * 100
        with store.session("named", 30.0) as worker:  # and 50 jobs claimed by name
            for i in range(50):
                worker.claim(f"named-{i}").complete(b"done")
        # 250 jobs: 60 more would pass 300, in a third queue (each queue is far from full)
        with pytest.raises(QueueFull, match=r"store_max_jobs") as refused:
            store.enqueue_many("q3", [(f"q3-{i}", b"p") for i in range(60)])
        assert "store-wide limit of 300" in str(refused.value)
        heap = heap_needed_mb(300, _config.DEFAULT_STORE_MAX_BYTES, ENQUEUE_MULTI_BYTES)
        assert f"heap: ≈ {heap:.0f} MB each for these limits" in str(refused.value)
        assert store.get("q3-0") is None and store.queue_stats("q3").available == 0
        # exactly up to the limit is fine, from another client too
        assert other.enqueue_many("q3", [(f"q3-{i}", b"p") for i in range(50)]) == [True] * 50
        for s in (store, other):  # full: from either client, whichever queue
            with pytest.raises(QueueFull, match="store_max_jobs"):
                s.enqueue("q1", "one-more")
        assert store.get("one-more") is None
        assert store.enqueue("q3", "q3-0") is False  # already queued: no room needed
        # completed jobs purged: room again
        with store.session("drain", 30.0) as worker:
            for _ in range(5):
                lease = worker.claim_next("q1")
                assert lease is not None
                lease.complete(b"")
        assert store.purge("q1") == 5
        assert other.enqueue_many("q2", [(f"more-{i}", b"") for i in range(5)]) == [True] * 5
        with pytest.raises(QueueFull, match="store_max_jobs"):
            other.enqueue("q2", "too-many")
    finally:
        store.close()
        other.close()


def test_payload_bytes_of_every_queue_count_against_store_max_bytes(zk_url: str) -> None:
    store = open_store(zk_url, connect_timeout_s=30, store_max_bytes=10_000)
    try:
        assert store.enqueue_many("a", [(f"a-{i}", b"x" * 1_000) for i in range(5)]) \
            == [True] * 5
        assert store.enqueue("b", "b-0", b"y" * 4_000) is True
        with pytest.raises(QueueFull, match=r"store-wide limit of 10000 \(option store_max_bytes"):
            store.enqueue("c", "c-0", b"z" * 1_001)
        assert store.get("c-0") is None
        other = open_store(zk_url, connect_timeout_s=30, store_max_bytes=10_000)
        try:  # a client that has cached nothing sums the queue heads itself
            with pytest.raises(QueueFull, match="store_max_bytes"):
                other.enqueue("d", "d-0", b"z" * 1_001)
            assert other.enqueue("d", "d-0", b"z" * 1_000) is True  # exactly the limit
        finally:
            other.close()
        with pytest.raises(QueueFull, match="store_max_bytes"):
            store.enqueue("a", "a-more", b"!")
    finally:
        store.close()


def test_a_large_queue_listing_is_paced_by_progress_and_leaves_slots_free(
    zk_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 25, item 7: a 5,000-job ``queue_jobs`` on a loaded ensemble failed after
    ``timeout_s`` with "not connected (or 100 requests already unanswered)": its 20,000
    reads took longer than the call's one deadline, holding every request slot of the
    shared client meanwhile. Now at most ``READ_WINDOW`` of them are in flight, and each
    answer is due ``timeout_s`` after the previous one."""
    from consensus_lease.backends.zookeeper import _transport_gate, _transport_paged

    setup = open_store(zk_url, connect_timeout_s=30, timeout_s=60)
    try:
        jobs = 2_500
        for start in range(0, jobs, 500):
            setup.enqueue_many("big", [(f"big-{i:05d}", b"p" * 10)
                                       for i in range(start, start + 500)])
    finally:
        setup.close()
    store = open_store(zk_url, connect_timeout_s=30, timeout_s=1.0)
    most = [0]
    real_start = _transport_gate.Gate.start

    def start(self: _transport_gate.Gate, begin: object, deadline: float) -> object:
        most[0] = max(most[0], self.in_flight() + 1)
        return real_start(self, begin, deadline)  # type: ignore[arg-type]

    monkeypatch.setattr(_transport_gate.Gate, "start", start)
    try:
        begun = time.monotonic()
        listed = store.queue_jobs("big")
        took_s = time.monotonic() - begun
        assert [job.record.job_id for job in listed] == [f"big-{i:05d}" for i in range(jobs)]
        assert most[0] <= _transport_paged.READ_WINDOW < _transport_gate.IN_FLIGHT, most[0]
        print(f"listed {jobs} jobs (4 reads each) in {took_s:.2f} s with timeout_s=1")
    finally:
        store.close()


def test_a_rotated_queue_head_still_counts_against_store_max_bytes(
        zk_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue whose head was rotated (its node then only says where the head is, see
    ``docs/stores/zookeeper.md`` "32-bit counters") keeps counting its payload bytes:
    counted as 0 it would let the store pass ``store_max_bytes``."""
    from consensus_lease.backends.zookeeper import _queues

    monkeypatch.setattr(_queues, "HEAD_VERSION_CEILING", 3)  # rotate after 3 head writes
    store = open_store(zk_url, connect_timeout_s=30, store_max_bytes=10_000)
    try:
        for i in range(8):  # 8 enqueue multis: the head is rotated twice on the way
            assert store.enqueue("r", f"r-{i}", b"x" * 1_000) is True
        other = open_store(zk_url, connect_timeout_s=30, store_max_bytes=10_000)
        try:  # nothing cached: it sums the heads itself, following the rotated one
            with pytest.raises(QueueFull, match="store_max_bytes"):
                other.enqueue("s", "s-0", b"z" * 2_001)
            assert other.enqueue("s", "s-0", b"z" * 2_000) is True
        finally:
            other.close()
    finally:
        store.close()
