"""The shared fault suite on a real 3-member ZooKeeper ensemble in containers."""

from __future__ import annotations

from typing import Any

import pytest

from consensus_lease.testing.faultsuite import ClusterFaultSuite


class TestZooKeeperClusterFaults(ClusterFaultSuite):
    ttl_s = 2.0  # the kit's tickTime is 250 ms: sessions of 0.5-60 s are granted
    leader_ttl_s = 6.0

    @pytest.fixture
    def cluster(self, zookeeper_cluster: Any) -> Any:
        return zookeeper_cluster
