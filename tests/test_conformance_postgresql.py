"""The conformance suite on a real PostgreSQL server (``postgresql://`` store).

PostgreSQL comes from ``CONSENSUS_LEASE_POSTGRES_URL`` (``eval "$(bash
scripts/start-postgres.sh)"`` starts one on loopback and exports it; ``make test`` does).
Without it these tests are skipped with that reason — except under ``CI=true``, where they
fail. Each test gets its own schema, dropped afterwards.

The regression case (``regress``) makes ``cl_meta`` and the session rows name another
WAL timeline than the server's, which is what the store sees after a standby was
promoted (the real failover is ``tests/backends/test_postgresql_failover.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from consensus_lease import LeaseStore, open_store
from consensus_lease.testing.conformance import BackendConformance
from consensus_lease.testing.conformance_transactions import EffectTarget
from consensus_lease.testing.postgresql import fresh_schema, postgres_url


class TestPostgresConformance(BackendConformance):
    short_ttl_s = 0.5

    @pytest.fixture(autouse=True)
    def _schema(self) -> Iterator[None]:
        base = postgres_url()
        with fresh_schema(base) as schema:
            self.url = f"{base}?schema={schema}"
            self.base, self.schema = base, schema
            yield

    def regress(self, store: LeaseStore, between: Callable[[], None]) -> None:
        between()
        with psycopg.connect(self.base, autocommit=True, connect_timeout=5) as conn:
            for table in ("cl_meta", "cl_sessions"):  # as written before a promotion
                conn.execute(f'UPDATE "{self.schema}".{table} SET timeline = %s', ("0000FFFF",))

    def open_store_for_test(self) -> LeaseStore:
        return open_store(self.url)

    def process_url(self, store: LeaseStore) -> str | None:
        return self.url

    def effect_target(self, store: LeaseStore) -> EffectTarget | None:
        return EffectTarget("psycopg", self.base, f'"{self.schema}".charges')
