"""Benchmarks: every backend next to its raw client and its peers, in one run.

``consensus-lease bench [--backends sqlite,etcd,zookeeper] [--quick] [--out DIR]``
starts a 3-member etcd cluster and ZooKeeper ensemble through the container kit
(:mod:`consensus_lease.testing.cluster`, on loopback slots the test suite does not use)
or takes ``--etcd-url`` / ``--zk-url``, runs the workloads below on each backend, and
writes ``results.json``, ``results.md`` and PNG plots into ``DIR``.

Every headline figure is a *ratio measured in the same run on the same store*, so a
slow or busy machine moves both sides of it:

=====  ========================================================================
W1     claim+complete cycles/s, 1 and 8 worker processes, against the same two
       store operations done with the raw client (:mod:`.raw`)
W2     p50/p99 latency of claim, renew, complete
W3     one worker holding 10 ... 10,000 jobs: renewal requests/s, client CPU,
       client memory per held lease (:mod:`.holding`)
W4     takeover after SIGKILL of the holder, and graceful handover (:mod:`.takeover`)
W5     claim_many of 128 jobs against 128 single claims
W6     acquire+release cycles/s of tooz, kazoo ``Lock``, pyetcd ``Lock`` (:mod:`.peers`)
W7     claim_next+complete p50/p99 and queue_stats time at queue depths 1k ... 1M, and
       enqueue against enqueue_many jobs/s (:mod:`.depth`)
W8     claim+complete cycles/s of one process with 200 asyncio tasks against 8 sync
       worker processes (:mod:`.asyncrate`)
=====  ========================================================================

Modules: :mod:`.config` (sizes, targets), :mod:`.clusters` (where the stores come
from), :mod:`.pool` and :mod:`.cycler` (worker processes), :mod:`.workloads`,
:mod:`.goals`, :mod:`.report`, :mod:`.plots`, :mod:`.runner`, :mod:`.command`.
"""

from __future__ import annotations

__all__: list[str] = []
