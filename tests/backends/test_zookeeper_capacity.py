"""The ZooKeeper backend's documented queue capacity (issue 15), on the server it is
documented for: a standalone ZooKeeper with the default 1 MB ``jute.maxbuffer`` and a
256 MB heap (the local server of ``zk_local.py`` runs with ``-Xmx256m``). One queue is
filled to ``capabilities.max_queue_jobs`` with ``enqueue_many`` (120-character ids, as
in the measurement that killed a 512 MB-heap server with the layout before buckets);
the next enqueue is refused with ``QueueFull`` before anything is sent; claims, counts
and a session opened before the fill keep working, and the server stays up.

Always on the local server (its heap is the point), whatever ``CONSENSUS_LEASE_ZK``
says. About a minute on a busy 2-core machine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from zk_local import LocalZooKeeper, available

from consensus_lease import QueueFull, open_store
from consensus_lease.backends.zookeeper import _queues
from consensus_lease.states import SessionState

pytestmark = pytest.mark.slow


@pytest.fixture
def server() -> Iterator[LocalZooKeeper]:
    why = available()
    if why is not None:
        pytest.skip(f"needs a local ZooKeeper server: {why}")
    with LocalZooKeeper(tick_ms=200) as zk:
        yield zk


def test_a_queue_filled_to_capacity_keeps_a_256_mb_server_serving(
    server: LocalZooKeeper,
) -> None:
    store = open_store(server.url("capacity"), connect_timeout_s=30, timeout_s=60)
    try:
        capacity = store.backend.capabilities.max_queue_jobs
        assert capacity == _queues.MAX_QUEUE_JOBS == 25_000
        watcher = store.session("watcher", 10.0)  # must survive the fill
        ids = [f"cap-{i:06d}-".ljust(120, "z") for i in range(capacity)]
        started = time.monotonic()
        for start in range(0, capacity, 5_000):
            chunk = ids[start : start + 5_000]
            added = store.enqueue_many("q", [(job, b"p" * 100) for job in chunk])
            assert added == [True] * len(added)
        fill_s = time.monotonic() - started
        with pytest.raises(QueueFull, match="capacity of 25000"):
            store.enqueue("q", "one-more")
        assert store.get("one-more") is None
        stats = store.queue_stats("q")
        assert (stats.available, stats.held, stats.completed) == (capacity, 0, 0)
        worker = store.session("worker", 10.0)
        latencies = []
        for _ in range(30):
            begun = time.monotonic()
            lease = worker.claim_next("q")
            assert lease is not None
            lease.complete(b"")
            latencies.append(time.monotonic() - begun)
        assert max(latencies) < 5.0, latencies
        begun = time.monotonic()
        stats = store.queue_stats("q")
        assert time.monotonic() - begun < 5.0
        assert (stats.available, stats.completed) == (capacity - 30, 30)
        assert server.proc is not None and server.proc.poll() is None, server.log_tail()
        assert watcher.state is SessionState.ACTIVE and worker.state is SessionState.ACTIVE
        assert "OutOfMemoryError" not in server.log_tail(200)
        assert fill_s < 120, fill_s
        watcher.close()
        worker.close()
    finally:
        store.close()
