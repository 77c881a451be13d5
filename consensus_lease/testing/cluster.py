"""Real 3-member etcd clusters and ZooKeeper ensembles in containers, with faults.

::

    with EtcdCluster() as cluster:                # members on 127.0.0.11-13:2379
        store = open_store(cluster.url_with_prefix("t1"))
        cluster.kill(cluster.leader())
        with cluster.isolate(cluster.members[0]):   # iptables, healed on exit
            ...

This module gathers the kit's public names; each lives in a module of its own:

* :mod:`consensus_lease.testing._cluster_base` — :class:`Cluster`, :class:`Member`,
  the errors, :class:`KitCapabilities` (which faults the images allow), and what every store
  shares: loopback slots (layout in its docstring),
  member containers, waits with deadlines, member and network faults.
* :mod:`consensus_lease.testing.etcd_cluster` — :class:`EtcdCluster`.
* :mod:`consensus_lease.testing.zookeeper_cluster` — :class:`ZooKeeperCluster`.
* :mod:`consensus_lease.testing._containers` — :func:`reap_stale` and
  :func:`leftovers`: the kit's containers found by their labels.
"""

from __future__ import annotations

from consensus_lease.testing._cluster_base import (
    Cluster,
    ClusterError,
    ClusterTimeout,
    FaultUnsupported,
    KitCapabilities,
    Member,
    MemberState,
)
from consensus_lease.testing._containers import leftovers, reap_stale
from consensus_lease.testing.etcd_cluster import EtcdCluster
from consensus_lease.testing.zookeeper_cluster import ZooKeeperCluster, four_letter_word

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterTimeout",
    "EtcdCluster",
    "FaultUnsupported",
    "KitCapabilities",
    "Member",
    "MemberState",
    "ZooKeeperCluster",
    "four_letter_word",
    "leftovers",
    "reap_stale",
]
