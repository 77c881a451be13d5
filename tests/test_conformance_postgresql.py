"""The conformance suite on a real PostgreSQL server (``postgresql://`` store).

PostgreSQL comes from ``CONSENSUS_LEASE_POSTGRES_URL`` (``eval "$(bash
scripts/start-postgres.sh)"`` starts one on loopback and exports it; ``make test`` does).
Without it these tests are skipped with that reason — except under ``CI=true``, where they
fail. Each test gets its own schema, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from consensus_lease import LeaseStore, open_store
from consensus_lease.testing.conformance import BackendConformance

POSTGRES_ENV = "CONSENSUS_LEASE_POSTGRES_URL"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def postgres_base_url() -> str:
    """``postgresql://...`` of the test server; skip (fail under CI=true) without one."""
    url = os.environ.get(POSTGRES_ENV, "").strip()
    if not url:
        reason = (
            f"{POSTGRES_ENV} is not set: run `eval \"$(bash scripts/start-postgres.sh)\"` "
            "to start PostgreSQL on 127.0.0.1 and export it"
        )
        if _in_ci():
            pytest.fail(f"{reason} (CI=true: PostgreSQL tests must run)", pytrace=False)
        pytest.skip(reason)
    scheme, rest = url.split("://", 1)
    return f"postgresql://{rest}" if scheme.startswith("postgresql") else url


def drop_schema(base: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore[arg-type]


class TestPostgresConformance(BackendConformance):
    short_ttl_s = 0.5

    @pytest.fixture(autouse=True)
    def _schema(self) -> Iterator[None]:
        base = postgres_base_url()
        schema = f"t{uuid.uuid4().hex[:12]}"
        self.url = f"{base}?schema={schema}"
        yield
        drop_schema(base, schema)

    def open_store_for_test(self) -> LeaseStore:
        return open_store(self.url)

    def process_url(self, store: LeaseStore) -> str | None:
        return self.url
