"""The conformance suite on the etcd backend.

Twice: on a local 3-member cluster of ``etcd`` subprocesses (always; fast raft timing, so
etcd grants 1 s leases), and on the containerised kit cluster (``etcd_cluster``; marked
``containers`` by the plugin, skipped without a Docker engine except in CI). Each test
gets a fresh key prefix on the shared cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from etcd_local import LocalEtcd, local_members

from consensus_lease import LeaseStore, open_store
from consensus_lease.testing.conformance import BackendConformance


@pytest.fixture(scope="module")
def local_etcd() -> Iterator[LocalEtcd]:
    yield from local_members(size=3, base=10)


class TestEtcdConformance(BackendConformance):
    url: str
    short_ttl_s = 1.0  # the local members' raft timing makes etcd's minimum TTL 1 s

    @pytest.fixture(autouse=True)
    def _fresh_prefix(self, local_etcd: LocalEtcd) -> None:
        self.url = local_etcd.url_with_prefix(f"conformance-{uuid.uuid4().hex[:12]}")

    def open_store_for_test(self) -> LeaseStore:
        return open_store(self.url)

    def process_url(self, store: LeaseStore) -> str | None:
        return self.url


class TestEtcdConformanceContainers(BackendConformance):
    url: str
    short_ttl_s = 2.0  # the kit runs etcd's default raft timing: minimum lease TTL 2 s

    @pytest.fixture(autouse=True)
    def _fresh_prefix(self, etcd_cluster: object, key_prefix: str) -> None:
        self.url = etcd_cluster.url_with_prefix(key_prefix)  # type: ignore[attr-defined]

    def open_store_for_test(self) -> LeaseStore:
        return open_store(self.url)

    def process_url(self, store: LeaseStore) -> str | None:
        return self.url
