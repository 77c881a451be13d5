"""Transactional fencing: ``lease.transaction(conn)`` on the PostgreSQL store.

The acceptance test stops worker A (a real process) with SIGSTOP inside its effect
transaction, past its TTL; B claims (waiting); A resumes and commits. What the design
guarantees (:mod:`consensus_lease.backends.postgresql`): A's row lock keeps every claim of
the job from succeeding until A's transaction ends, so A's commit succeeds and B's claim
happens strictly after it — B gets generation 2 and sees A's row, and A can do nothing
more under generation 1.

Needs ``CONSENSUS_LEASE_POSTGRES_URL`` (skipped without it, failed under ``CI=true``).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from consensus_lease import LeaseStore, open_store
from consensus_lease.errors import (
    BackendUnavailable,
    InvalidArgument,
    LeaseLost,
    UnsupportedOperation,
)
from consensus_lease.record import JobState
from consensus_lease.testing.conformance import poll_until
from consensus_lease.testing.postgresql import fresh_schema, postgres_url

WORKER_A = r"""
import json, sys, psycopg
from consensus_lease import open_store
from consensus_lease.errors import LeaseLost
url, base, schema = sys.argv[1:4]
def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n"); sys.stdout.flush()
store = open_store(url)
session = store.session("A", ttl_s=1.0)
lease = session.claim("job")
conn = psycopg.connect(base)
try:
    with lease.transaction(conn):
        conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s, %s, %s)',
                     ("job", lease.generation, "A"))
        say(step="written", generation=lease.generation)
        sys.stdin.readline()   # the test stops us here, past the TTL, then lets us go on
    say(step="committed")
except Exception as exc:
    say(step="commit-failed", error=type(exc).__name__)
for what, call in (("transaction", lambda: lease.transaction(conn).__enter__()),
                   ("complete", lambda: lease.complete(b"A"))):
    try:
        call()
        say(step=what, lost=False)
    except Exception as exc:
        say(step=what, lost=isinstance(exc, LeaseLost), error=type(exc).__name__)
conn.close()
store.close()
"""


@pytest.fixture
def base() -> str:
    return postgres_url()


@pytest.fixture
def schema(base: str) -> Iterator[str]:
    with fresh_schema(base) as name:
        yield name


@pytest.fixture
def store(base: str, schema: str) -> Iterator[LeaseStore]:
    s = open_store(f"{base}?schema={schema}", timeout_s=30.0)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".effects (job text, generation bigint, who text)')
    yield s
    s.close()


def effects(base: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(base, autocommit=True) as conn:
        return conn.execute(f'SELECT job, generation, who FROM "{schema}".effects '
                            "ORDER BY generation").fetchall()


def test_paused_holder_commits_before_the_takeover_and_the_new_holder_sees_it(
    store: LeaseStore, base: str, schema: str
) -> None:
    url = f"{base}?schema={schema}"
    a = subprocess.Popen([sys.executable, "-c", WORKER_A, url, base, schema],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={**os.environ})
    assert a.stdin is not None and a.stdout is not None
    try:
        assert json.loads(a.stdout.readline()) == {"step": "written", "generation": 1}
        os.kill(a.pid, signal.SIGSTOP)
        # A's session runs out on the server's clock while A is stopped mid-transaction.
        poll_until(lambda: store.get("job").state is JobState.AVAILABLE, 15.0)  # type: ignore[union-attr]
        b = store.session("B", ttl_s=30.0)
        claimed: dict[str, Any] = {}

        def claim() -> None:
            claimed["lease"] = b.claim("job", wait_s=30.0)
            claimed["rows"] = effects(base, schema)

        thread = threading.Thread(target=claim)
        thread.start()
        thread.join(2.5)  # past the store's lock_timeout (1 s): B keeps waiting
        assert thread.is_alive(), "B's claim must wait for A's open transaction"
        assert b.claim("job") is None  # without waiting: not claimable while A's block is open
        assert effects(base, schema) == []  # A's row is not committed yet
        a.stdin.write("go\n")
        a.stdin.flush()
        os.kill(a.pid, signal.SIGCONT)
        assert json.loads(a.stdout.readline()) == {"step": "committed"}
        thread.join(20.0)
        assert not thread.is_alive()
        lease = claimed["lease"]
        assert lease is not None and lease.generation == 2
        assert claimed["rows"] == [("job", 1, "A")]  # B's claim came after A's commit
        # A can do nothing more under generation 1: its lease is lost locally and in
        # the store.
        for step in ("transaction", "complete"):
            said = json.loads(a.stdout.readline())
            assert (said["step"], said["lost"]) == (step, True), said
        with psycopg.connect(base) as conn:
            with lease.transaction(conn):
                conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s, %s, %s)',
                             ("job", lease.generation, "B"))
        lease.complete(b"B")
        assert effects(base, schema) == [("job", 1, "A"), ("job", 2, "B")]
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
        a.wait(10.0)


def test_a_lease_lost_before_the_block_commits_nothing(
    store: LeaseStore, base: str, schema: str
) -> None:
    a = store.session("A", ttl_s=30.0)
    lease = a.claim("job")
    assert lease is not None
    store.backend.expire_session(a.session_id)  # type: ignore[attr-defined]
    b = store.session("B", ttl_s=30.0)
    assert b.claim("job") is not None
    with psycopg.connect(base) as conn:
        with pytest.raises(LeaseLost):
            with lease.transaction(conn):
                conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s, %s, %s)',
                             ("job", lease.generation, "A"))
        conn.commit()
    assert effects(base, schema) == []
    assert lease.state.value == "lost"


def test_an_error_in_the_block_rolls_back_and_keeps_the_lease(
    store: LeaseStore, base: str, schema: str
) -> None:
    lease = store.session("A", ttl_s=30.0).claim("job")
    assert lease is not None
    with psycopg.connect(base) as conn:
        with pytest.raises(ZeroDivisionError):
            with lease.transaction(conn):
                conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s, %s, %s)',
                             ("job", lease.generation, "A"))
                raise ZeroDivisionError
    assert effects(base, schema) == []
    lease.ensure_held()


def test_lock_timeout_bounds_the_wait_for_the_row(
    store: LeaseStore, base: str, schema: str
) -> None:
    lease = store.session("A", ttl_s=30.0).claim("job")
    assert lease is not None
    with psycopg.connect(base) as side, psycopg.connect(base) as conn:
        side.execute(f'SELECT 1 FROM "{schema}".cl_jobs WHERE job_id = %s FOR UPDATE', ("job",))
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="lock"):
            with lease.transaction(conn, lock_timeout_s=0.2):
                pytest.fail("the block must not run without the lock")
        assert time.monotonic() - started < 5.0
        side.rollback()
    lease.ensure_held()  # nothing was decided: still held


def test_refuses_a_connection_to_another_database_or_store(
    store: LeaseStore, base: str, schema: str
) -> None:
    lease = store.session("A", ttl_s=30.0).claim("job")
    assert lease is not None
    other_db = base.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(other_db) as conn:
        with pytest.raises(InvalidArgument, match="no consensus_lease store"):
            with lease.transaction(conn):
                pass
    with fresh_schema(base) as other_schema:
        other = open_store(f"{base}?schema={other_schema}")
        other.close()
        with psycopg.connect(base) as conn, conn.transaction(force_rollback=True):
            conn.execute(f'ALTER SCHEMA "{schema}" RENAME TO "{schema}_x"')
            conn.execute(f'ALTER SCHEMA "{other_schema}" RENAME TO "{schema}"')
            with pytest.raises(InvalidArgument, match="another consensus_lease store"):
                with lease.transaction(conn):
                    pass
    with sqlite3.connect(":memory:") as not_pg:
        with pytest.raises(InvalidArgument, match="psycopg"):
            with lease.transaction(not_pg):
                pass
    lease.ensure_held()


def test_refuses_a_store_without_transactions_and_a_foreign_connection(
    tmp_path: Path, base: str
) -> None:
    with open_store("memory://") as s:  # no database of the caller's: the capability says so
        assert not s.capabilities.transactions
        lease = s.session("A", ttl_s=30.0).claim("job")
        assert lease is not None
        with psycopg.connect(base) as conn:
            with pytest.raises(UnsupportedOperation, match="one database"):
                with lease.transaction(conn):
                    pass
        lease.ensure_held()
    with open_store(f"sqlite:///{tmp_path / 'l.db'}") as s:  # a psycopg connection to SQLite
        lease = s.session("A", ttl_s=30.0).claim("job")
        assert lease is not None
        with psycopg.connect(base) as conn:
            with pytest.raises(InvalidArgument, match=r"sqlite3\.Connection"):
                with lease.transaction(conn):
                    pass
        lease.ensure_held()


def test_a_version_4_store_gets_the_effect_records_on_open(
    store: LeaseStore, base: str, schema: str
) -> None:
    with psycopg.connect(base, autocommit=True) as side:
        side.execute(f'DROP TABLE "{schema}".cl_effects')
        side.execute(f'UPDATE "{schema}".cl_meta SET schema_version = 4')
    with open_store(f"{base}?schema={schema}") as reopened:
        lease = reopened.session("A", ttl_s=30.0).claim("job")
        assert lease is not None
        with psycopg.connect(base, autocommit=True) as conn:
            with lease.transaction(conn) as tx:
                assert tx.once("charge") is True
            with lease.transaction(conn) as tx:
                assert tx.once("charge") is False
        lease.complete()
    with psycopg.connect(base, autocommit=True) as side:
        assert side.execute(f'SELECT schema_version FROM "{schema}".cl_meta').fetchone() == (5,)


def test_bad_lock_timeout_is_invalid(store: LeaseStore, base: str) -> None:
    lease = store.session("A", ttl_s=30.0).claim("job")
    assert lease is not None
    with psycopg.connect(base) as conn:
        with pytest.raises(InvalidArgument):
            with lease.transaction(conn, lock_timeout_s=-1):
                pass


def test_refuses_an_implicit_transaction_that_the_block_could_not_commit(
    store: LeaseStore, base: str, schema: str
) -> None:
    lease = store.session("A", ttl_s=30.0).claim("job")
    assert lease is not None
    with psycopg.connect(base) as conn:  # not autocommit: psycopg begins at a statement
        conn.execute("SELECT 1")
        with pytest.raises(InvalidArgument, match="already has a transaction open"):
            with lease.transaction(conn):
                pytest.fail("the block must not run")
        # nothing was locked: the lease ends at once (it would wait on its own lock)
        conn.commit()
        with lease.transaction(conn):
            conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s, %s, %s)',
                         ("job", lease.generation, "A"))
        assert effects(base, schema) == [("job", lease.generation, "A")]  # committed
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        with pytest.raises(InvalidArgument, match="aborted"):
            with lease.transaction(conn):
                pytest.fail("the block must not run")
        conn.rollback()
    started = time.monotonic()
    lease.complete(b"done")
    assert time.monotonic() - started < 5.0


def test_nesting_inside_an_explicit_transaction_commits_with_it(
    store: LeaseStore, base: str, schema: str
) -> None:
    lease = store.session("A", ttl_s=30.0).claim("job")
    assert lease is not None
    with psycopg.connect(base) as conn:
        assert hasattr(conn, "_num_transactions"), "psycopg changed: see backends/postgresql/_transport_txn.py"
        with conn.transaction():
            conn.execute("SELECT 1")
            with lease.transaction(conn):
                conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s, %s, %s)',
                             ("job", lease.generation, "A"))
            assert effects(base, schema) == []  # the outer block has not ended
        assert effects(base, schema) == [("job", lease.generation, "A")]
    lease.complete(b"done")


def test_a_lock_timeout_of_complete_names_an_open_transaction_as_the_cause(
    base: str, schema: str
) -> None:
    with open_store(f"{base}?schema={schema}", timeout_s=1.0) as s:
        lease = s.session("A", ttl_s=30.0).claim("job")
        assert lease is not None
        with psycopg.connect(base) as conn, conn.transaction(force_rollback=True):
            with lease.transaction(conn):
                pass  # the outer block still holds the row lock
            with pytest.raises(BackendUnavailable, match="commit it first"):
                lease.complete(b"done")
        lease.complete(b"done")
