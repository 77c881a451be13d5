"""The conformance suite on the embedded SQLite default.

The regression case (``regress``): a copy of the file taken through SQLite's backup
API, restored in place the same way (``sqlite3 FILE ".restore COPY"``) after the claims
the copy does not have.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from consensus_lease import LeaseStore, open_store
from consensus_lease.testing.conformance import BackendConformance
from consensus_lease.testing.conformance_transactions import EffectTarget


def _copy(source: Path, target: Path) -> None:
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


class TestSqliteConformance(BackendConformance):
    short_ttl_s = 0.5
    regression_ttl_s = 1.5

    @pytest.fixture(autouse=True)
    def _db_path(self, tmp_path: Path) -> None:
        self.path = tmp_path / "leases.db"
        self.url = f"sqlite:///{self.path}"

    def open_store_for_test(self) -> LeaseStore:
        return open_store(self.url)

    def process_url(self, store: LeaseStore) -> str | None:
        return self.url

    def effect_target(self, store: LeaseStore) -> EffectTarget | None:
        return EffectTarget("sqlite3", str(self.path), "charges")

    def regress(self, store: LeaseStore, between: Callable[[], None]) -> None:
        backup = self.path.with_name("backup.db")
        _copy(self.path, backup)
        between()
        _copy(backup, self.path)
