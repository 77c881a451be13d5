"""A queue purge longer than one request budget, shared by the etcd and ZooKeeper tests:
each purge step has its own deadline, so the call as a whole may outlast ``timeout_s``."""

from __future__ import annotations

import time

from consensus_lease import open_store


def drain_then_purge_with_a_tight_budget(url: str, tight_url: str, n: int, batch: int) -> float:
    """Enqueue ``n`` jobs into queue ``wide`` of ``url``, claim and complete them all in
    batches of ``batch``, then purge the queue through ``tight_url`` (the same store, a
    small ``timeout_s``): every job is purged (``purge`` returns ``n``) and the queue's
    completed count is 0 after. Returns the purge's duration in seconds."""
    with open_store(url) as store:
        store.enqueue_many("wide", [f"w{i:05d}" for i in range(n)])
        with store.session("A", ttl_s=30) as a:
            done = 0
            while done < n:
                leases = a.claim_next_many("wide", batch)
                assert leases
                assert all(not isinstance(r, Exception) for r in a.complete_many(leases))
                done += len(leases)
    with open_store(tight_url) as tight:
        started = time.monotonic()
        assert tight.purge("wide") == n
        took = time.monotonic() - started
    with open_store(url) as store:
        assert store.queue_stats("wide").completed == 0
    return took
