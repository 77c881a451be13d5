"""A full ZooKeeper store survives a member's rejoin by snapshot (issue 25, item 6).

A 3-member ensemble of its own with a small heap (128 MB) and store-wide limits the
rule of ``docs/capacity.md`` lets it keep through rejoins while the writes are small
(``heap ≈ 16 MB + 3.5 x 500 x W + 2.5 x (store_max_jobs x 3 KB + store_max_bytes)``:
3,600 jobs and 1 MiB need ~45 MB), a scaled-down form of the 256 MB measurement of
``benchmarks/zk_heap_resync.py``. Three queues are filled until the store
refuses with ``QueueFull``; a follower is killed, the others write past the leader's
committed log (500 transactions) and it is started again: it rejoins by ``SNAP`` (the
leader's whole tree; ``zookeeper.forceSnapshotSync`` makes the leader choose it over a
``DIFF`` from its transaction log, which it would send for so small a store). Then every
member serves, the rejoined one holds the whole store, and an enqueue still gets
``QueueFull``, not ``OutcomeUnknown``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kazoo.client import KazooClient

from consensus_lease import QueueFull, open_store

pytestmark = pytest.mark.slow

HEAP_MB = 128
STORE_MAX_JOBS = 3_600
STORE_MAX_BYTES = 1_048_576
WRITES = 1_000  # past ZooKeeper's committed log (zookeeper.commitLogCount, 500 at least)
QUEUES = ("q1", "q2", "q3")


def _fill(store: Any) -> dict[str, int]:
    """Fill the queues in turn, 600 jobs a call, until the store refuses one job."""
    counts = dict.fromkeys(QUEUES, 0)
    n = 0
    while True:
        queue = QUEUES[(n // 600) % 3]
        ids = [f"{queue}-{n + i:05d}-".ljust(120, "z") for i in range(600)]
        try:
            counts[queue] += sum(store.enqueue_many(queue, [(job, b"p" * 100) for job in ids]))
        except QueueFull as exc:
            assert "store_max_jobs" in str(exc)
            return counts
        n += 600


def _write_past_committed_log(members: list[Any], path: str) -> None:
    client = KazooClient(hosts=",".join(m.endpoint for m in members), timeout=30)
    client.start(timeout=30)
    try:
        client.ensure_path(path)
        for start in range(0, WRITES, 200):
            for answer in [client.set_async(path, b"%d" % i) for i in range(start, start + 200)]:
                answer.get(timeout=30)
    finally:
        client.stop()
        client.close()


# zookeeper.forceSnapshotSync: the leader sends SNAP, never a DIFF from its txn log (which
# it prefers while that log is under a third of its snapshot: so on a small store)
ENSEMBLE = {"heap_mb": HEAP_MB, "extra_config": {"forceSnapshotSync": "true"}}


@pytest.mark.parametrize("fresh_zookeeper_cluster", [ENSEMBLE], indirect=True)
def test_a_full_store_keeps_every_member_through_a_snapshot_rejoin(
    fresh_zookeeper_cluster: Any, key_prefix: str
) -> None:
    cluster = fresh_zookeeper_cluster
    options = f"?store_max_jobs={STORE_MAX_JOBS}&store_max_bytes={STORE_MAX_BYTES}"
    store = open_store(cluster.url_with_prefix(key_prefix) + options,
                       connect_timeout_s=30, timeout_s=30)
    try:
        counts = _fill(store)
        assert sum(counts.values()) == STORE_MAX_JOBS and min(counts.values()) > 0, counts
        leader = cluster.leader()
        victim = next(m for m in cluster.members if m is not leader)
        syncs = len(cluster.sync_modes(victim))
        cluster.kill(victim)
        _write_past_committed_log([m for m in cluster.members if m is not victim],
                                  f"/{key_prefix}-writes")
        cluster.restart(victim, ready_timeout_s=60)
        assert cluster.sync_modes(victim)[syncs:] == ["SNAP"], cluster.logs(victim, tail=40)
        deadline = time.monotonic() + 30
        while sorted(str(cluster.member_mode(m)) for m in cluster.members) \
                != ["follower", "follower", "leader"]:
            assert time.monotonic() < deadline, [cluster.member_mode(m) for m in cluster.members]
            time.sleep(0.2)  # the poll interval of this deadline loop
        for member in cluster.members:
            assert "OutOfMemoryError" not in cluster.logs(member), member.name
        alone = open_store(f"zk://{victim.endpoint}/{key_prefix}{options}",
                           connect_timeout_s=30, timeout_s=30)
        try:  # the rejoined member has the whole store, and refuses more
            assert {q: alone.queue_stats(q).available for q in QUEUES} == counts
            with pytest.raises(QueueFull, match="store_max_jobs"):
                alone.enqueue("q1", "one-more")
        finally:
            alone.close()
        with pytest.raises(QueueFull, match="store_max_jobs"):
            store.enqueue("q2", "one-more")
        assert store.get("one-more") is None
    finally:
        store.close()
