"""The conformance suite on the etcd backend.

Twice: on a local 3-member cluster of ``etcd`` subprocesses (always; fast raft timing, so
etcd grants 1 s leases), and on the containerised kit cluster (``etcd_cluster``; marked
``containers`` by the plugin, skipped without a Docker engine except in CI). Each test
gets a fresh key prefix on the shared cluster.

The regression case (``regress``): on the local cluster a real ``etcdctl snapshot
save`` / ``snapshot restore`` of all three members; on the kit cluster, which the suite
cannot restore, the driver is made to have seen revisions above the cluster's (what it
sees after a restore), as ``test_etcd_epoch`` does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from etcd_local import LocalEtcd, backend_of, local_members, require_local_etcd

from consensus_lease import LeaseStore, open_store
from consensus_lease.backends.etcd._tokens_history import Mark
from consensus_lease.testing.conformance import BackendConformance


@pytest.fixture(scope="module")
def local_etcd() -> Iterator[LocalEtcd]:
    yield from local_members(size=3, base=10)


class TestEtcdConformance(BackendConformance):
    url: str
    short_ttl_s = 1.0  # the local members' raft timing makes etcd's minimum TTL 1 s

    @pytest.fixture(autouse=True)
    def _fresh_prefix(self, local_etcd: LocalEtcd, tmp_path: Path) -> None:
        self.url = local_etcd.url_with_prefix(f"conformance-{uuid.uuid4().hex[:12]}")
        self.cluster, self.tmp_path = local_etcd, tmp_path

    def regress(self, store: LeaseStore, between: Callable[[], None]) -> None:
        require_local_etcd(etcdctl=True)
        snapshot = self.tmp_path / "snapshot.db"
        self.cluster.save_snapshot(self.cluster.members[0], snapshot)
        between()
        self.cluster.restore_snapshot(snapshot)

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

    def regress(self, store: LeaseStore, between: Callable[[], None]) -> None:
        between()
        guard = backend_of(store)._transport.guard
        guard._high += 10_000  # to it, the next answers come from a history gone back
        guard._mark = Mark(guard._era, guard._high)

    def open_store_for_test(self) -> LeaseStore:
        return open_store(self.url)

    def process_url(self, store: LeaseStore) -> str | None:
        return self.url
