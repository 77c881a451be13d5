"""A PostgreSQL server for tests: the URL from the environment, and a schema per test.

``eval "$(bash scripts/start-postgres.sh)"`` starts a throw-away server on 127.0.0.1 and
exports ``CONSENSUS_LEASE_POSTGRES_URL`` (``make test`` does it). Without that variable
:func:`postgres_url` skips the calling test with the reason — except under ``CI=true``,
where it fails it: PostgreSQL tests must run in CI.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["POSTGRES_ENV", "fresh_schema", "postgres_url"]

POSTGRES_ENV = "CONSENSUS_LEASE_POSTGRES_URL"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def postgres_url() -> str:
    """``postgresql://user:password@host:port/dbname`` of the test server (a SQLAlchemy
    ``postgresql+psycopg://`` URL in the variable is turned into a libpq one). Skips the
    test without a server (fails it under ``CI=true``). Needs pytest."""
    import pytest

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


@contextmanager
def fresh_schema(base_url: str) -> Iterator[str]:
    """A new schema name (``t`` + 12 hex digits) for one store, dropped (``CASCADE``) on
    exit."""
    import psycopg

    schema = f"t{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        with psycopg.connect(base_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
