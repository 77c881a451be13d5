"""The conformance suite on the embedded SQLite default."""

from __future__ import annotations

from pathlib import Path

import pytest

from consensus_lease import LeaseStore, open_store
from consensus_lease.testing.conformance import BackendConformance


class TestSqliteConformance(BackendConformance):
    short_ttl_s = 0.5

    @pytest.fixture(autouse=True)
    def _db_path(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path}/leases.db"

    def open_store_for_test(self) -> LeaseStore:
        return open_store(self.url)

    def process_url(self, store: LeaseStore) -> str | None:
        return self.url
