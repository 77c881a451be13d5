"""The conformance suite on a real PostgreSQL server (``postgresql://`` store).

PostgreSQL comes from ``CONSENSUS_LEASE_POSTGRES_URL`` (``eval "$(bash
scripts/start-postgres.sh)"`` starts one on loopback and exports it; ``make test`` does).
Without it these tests are skipped with that reason — except under ``CI=true``, where they
fail. Each test gets its own schema, dropped afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from consensus_lease import LeaseStore, open_store
from consensus_lease.testing.conformance import BackendConformance
from consensus_lease.testing.postgresql import fresh_schema, postgres_url


class TestPostgresConformance(BackendConformance):
    short_ttl_s = 0.5

    @pytest.fixture(autouse=True)
    def _schema(self) -> Iterator[None]:
        base = postgres_url()
        with fresh_schema(base) as schema:
            self.url = f"{base}?schema={schema}"
            yield

    def open_store_for_test(self) -> LeaseStore:
        return open_store(self.url)

    def process_url(self, store: LeaseStore) -> str | None:
        return self.url
