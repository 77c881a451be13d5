"""The shared fault suite on a real 3-member etcd cluster in containers."""

from __future__ import annotations

from typing import Any

import pytest

from consensus_lease.testing.faultsuite import ClusterFaultSuite


class TestEtcdClusterFaults(ClusterFaultSuite):
    ttl_s = 2.0  # etcd grants at least 1.5 x its election timeout (1 s in the kit)
    leader_ttl_s = 6.0

    @pytest.fixture
    def cluster(self, etcd_cluster: Any) -> Any:
        return etcd_cluster
