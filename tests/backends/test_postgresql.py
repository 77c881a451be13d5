"""What is particular to the PostgreSQL store: the race a claim must wait out, the
wake-up by LISTEN/NOTIFY, SKIP LOCKED, errors, the schema's version, a broken connection.

The behaviour every backend shares is in the conformance suite
(``tests/test_conformance_postgresql.py``). Needs ``CONSENSUS_LEASE_POSTGRES_URL``
(skipped without it, failed under ``CI=true``). Nothing sleeps to synchronise: waits poll
with deadlines.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from consensus_lease import EnqueueItem, JobState, LeaseStore, open_store
from consensus_lease.backends.postgresql import PostgresBackend
from consensus_lease.backends.postgresql._config import OPTIONS, libpq_params
from consensus_lease.backends.postgresql._layout import SCHEMA_VERSION
from consensus_lease.errors import (
    AuthenticationFailed,
    BackendUnavailable,
    InvalidArgument,
    JobCompleted,
    JobFailed,
    OutcomeUnknown,
    SessionExpired,
    StaleLeaseError,
    StoreRegressed,
)
from consensus_lease.record import ClaimResult
from consensus_lease.states import SessionState
from consensus_lease.testing.conformance import poll_until
from consensus_lease.testing.postgresql import fresh_schema, postgres_url


@pytest.fixture
def base() -> str:
    return postgres_url()


@pytest.fixture
def url(base: str) -> Iterator[str]:
    with fresh_schema(base) as schema:
        yield f"{base}?schema={schema}"


@pytest.fixture
def store(url: str) -> Iterator[LeaseStore]:
    s = open_store(url)
    yield s
    s.close()


def backend_of(store: LeaseStore) -> PostgresBackend:
    assert isinstance(store.backend, PostgresBackend)
    return store.backend


def terminate_pooled_connection(backend: PostgresBackend, base: str) -> None:
    """Have the server end the connection the store's one-connection pool holds, from
    a side connection: the store's next statement meets a dead connection."""
    pid = backend.client.read("SELECT pg_backend_pid()")[0][0]
    with psycopg.connect(base, autocommit=True) as side:
        side.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_claim_waits_for_a_keepalive_in_flight_and_then_refuses(store: LeaseStore, base: str) -> None:
    """The holder's session is expired by the clock, but a keepalive that found it alive
    is not committed yet: the claim must wait for it and then see the new expiry."""
    b = backend_of(store)
    holder = b.open_session("A", 0.2)
    other = b.open_session("B", 30.0)
    assert b.claim(holder, "job") is not None
    poll_until(lambda: b.get("job").state.value == "available", 5.0)  # type: ignore[union-attr]
    with psycopg.connect(base) as side:  # not autocommit: the "keepalive" stays open
        side.execute(
            f"UPDATE {b.names.sessions} SET expires_at = "
            "extract(epoch FROM clock_timestamp()) + 30 WHERE session_id = %s",
            (holder.session_id,),
        )
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.update(r=b.claim(other, "job")))
        thread.start()
        thread.join(0.5)
        assert thread.is_alive(), "the claim must wait for the uncommitted keepalive"
        side.commit()
    thread.join(10.0)
    assert not thread.is_alive()
    assert result["r"] is None, "the renewed holder keeps the job"
    assert b.get("job").owner == "A"  # type: ignore[union-attr]


def test_a_release_wakes_a_waiting_claim_of_another_process_by_notify(url: str) -> None:
    """With the fallback poll at 30 s only the notification can wake the waiter in time."""
    waiter_store = open_store(url, poll_interval_s=30.0)
    holder_store = open_store(url)
    try:
        holder = holder_store.session("holder", ttl_s=30.0)
        lease = holder.claim("job")
        assert lease is not None
        waiter = waiter_store.session("waiter", ttl_s=30.0)
        got: dict[str, Any] = {}

        def wait() -> None:
            got["lease"] = waiter.claim("job", wait_s=20.0)
            got["at"] = time.monotonic()

        thread = threading.Thread(target=wait)
        thread.start()
        poll_until(lambda: len(backend_of(waiter_store)._subscriptions()) > 0, 5.0)
        released = time.monotonic()
        lease.release()
        thread.join(15.0)
        assert got["lease"].generation == 2
        assert got["at"] - released < 3.0  # a busy 2-core machine; the poll would take 30 s
    finally:
        waiter_store.close()
        holder_store.close()


def test_claim_next_skips_a_locked_job(store: LeaseStore, base: str) -> None:
    """A job row locked by another transaction (a claim in flight, a lease.transaction)
    is skipped, not waited for: claim_next takes the next job at once."""
    b = backend_of(store)
    store.enqueue_many("q", ["first", "second"])
    session = store.session("w", ttl_s=30.0)
    with psycopg.connect(base) as side:
        side.execute(f"SELECT 1 FROM {b.names.jobs} WHERE job_id = 'first' FOR UPDATE")
        started = time.monotonic()
        lease = session.claim_next("q")
        assert lease is not None and lease.job_id == "second"
        assert time.monotonic() - started < 3.0
        side.rollback()
    nxt = session.claim_next("q")
    assert nxt is not None and nxt.job_id == "first"


def test_enqueue_many_is_one_transaction(store: LeaseStore) -> None:
    store.enqueue("other", "taken")
    with pytest.raises(InvalidArgument, match="outside queue"):
        store.enqueue_many("q", ["a", "taken", "b"])
    assert store.queue_jobs("q") == []
    assert store.enqueue_many("q", ["a", "b"]) == [True, True]
    assert store.enqueue_many("q", ["b", "c"]) == [False, True]
    assert [j.record.job_id for j in store.queue_jobs("q")] == ["a", "b", "c"]
    stats = store.queue_stats("q")
    assert (stats.available, stats.held, stats.completed, stats.failed) == (3, 0, 0, 0)


def test_a_broken_connection_before_a_claim_is_settled_by_reading_back(url: str, base: str) -> None:
    s = open_store(url, pool_size=1)
    try:
        b = backend_of(s)
        session = s.session("w", ttl_s=30.0)
        terminate_pooled_connection(b, base)
        lease = session.claim("job")  # the pooled connection is dead: read back, retry
        assert lease is not None and lease.generation == 1
        lease.complete(b"ok")
        assert s.get("job").result == b"ok"  # type: ignore[union-attr]
    finally:
        s.close()


def test_a_broken_hot_connection_is_settled_and_replaced(url: str, base: str) -> None:
    """The connection kept out of the pool for the hot path (pool_size >= 2) breaks between
    two statements: the claim reads back and retries on a pooled one, and a new hot
    connection serves the next statements."""
    s = open_store(url, pool_size=2)
    try:
        b = backend_of(s)
        session = s.session("w", ttl_s=30.0)
        first = session.claim("warm")
        assert first is not None
        first.complete(b"")
        hot = b.client._hot
        assert hot is not None, "a call with the hot connection free keeps it"
        with psycopg.connect(base, autocommit=True) as side:
            side.execute("SELECT pg_terminate_backend(%s)", (hot.info.backend_pid,))
        lease = session.claim("job")
        assert lease is not None and lease.generation == 1
        assert lease.complete(b"ok").result == b"ok"
        assert b.client._hot is not None and b.client._hot is not hot
        assert s.get("job").result == b"ok"  # type: ignore[union-attr]
    finally:
        s.close()


def test_with_one_pooled_connection_the_keepalive_is_not_starved(url: str) -> None:
    """pool_size=1: no connection is kept out of the pool, so the keepalive thread gets
    the only one between the caller's statements and the session outlives 2 x TTL."""
    s = open_store(url, pool_size=1)
    try:
        session = s.session("w", ttl_s=1.0)
        lease = session.claim("job")
        assert lease is not None
        assert backend_of(s).client._hot is None
        until = time.monotonic() + 2 * session.granted_ttl_s
        while time.monotonic() < until:
            assert s.get("job").state is JobState.HELD  # type: ignore[union-attr]
            time.sleep(session.granted_ttl_s / 10)  # real time must pass: 2 x TTL of use
        lease.renew()
        lease.complete(b"")
    finally:
        s.close()


def test_unreachable_server_is_backend_unavailable() -> None:
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as info:
        open_store("postgresql://u:p@127.0.0.1:1/db", connect_timeout_s=2.0)
    assert not isinstance(info.value, AuthenticationFailed)
    assert time.monotonic() - started < 10.0


def test_wrong_password_is_authentication_failed(base: str) -> None:
    scheme, rest = base.split("://", 1)
    userinfo, host = rest.split("@", 1)
    user = userinfo.split(":", 1)[0]
    with pytest.raises(AuthenticationFailed):
        open_store(f"{scheme}://{user}:not-the-password@{host}")


def test_missing_password_is_authentication_failed(
    base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheme, rest = base.split("://", 1)
    userinfo, host = rest.split("@", 1)
    user = userinfo.split(":", 1)[0]
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))  # no ~/.pgpass either
    monkeypatch.delenv("PGPASSWORD", raising=False)
    with pytest.raises(AuthenticationFailed, match="no password supplied"):
        open_store(f"{scheme}://{user}@{host}", connect_timeout_s=2.0)


def test_a_missing_database_is_invalid_argument_naming_it(base: str) -> None:
    head, _ = base.rsplit("/", 1)
    with pytest.raises(InvalidArgument, match="'nodb_cl_test' does not exist") as info:
        open_store(f"{head}/nodb_cl_test", connect_timeout_s=2.0)
    assert not isinstance(info.value, BackendUnavailable)
    with psycopg.connect(base, autocommit=True) as side:
        row = side.execute("SELECT 1 FROM pg_database WHERE datname = 'nodb_cl_test'").fetchone()
    assert row is None


@pytest.mark.parametrize("bad", ["pg_catalog", "information_schema", "pg_toast", "pg_x"])
def test_postgresql_own_schemas_are_refused_before_connecting(bad: str) -> None:
    # an unreachable server: a refusal that sent anything would be BackendUnavailable
    with pytest.raises(InvalidArgument, match="PostgreSQL's own"):
        open_store(f"postgresql://u:p@127.0.0.1:1/db?schema={bad}", connect_timeout_s=2.0)


@pytest.mark.parametrize("bad", ["Upper", "1x", "x-y", 'x"', "a" * 49])
def test_bad_schema_name_is_refused(base: str, bad: str) -> None:
    with pytest.raises(InvalidArgument, match="schema"):
        open_store(base, schema=bad)


def test_unknown_option_is_refused_listing_the_accepted_ones(base: str) -> None:
    with pytest.raises(InvalidArgument, match="unknown PostgreSQL option") as info:
        open_store(f"{base}?ssl_mode=disable")
    for name in ("sslmode", "host", "ca_file", "schema"):
        assert name in str(info.value)
    with pytest.raises(InvalidArgument, match="connect_timeout_s"):
        open_store(f"{base}?connect_timeout=3")


def _server_setting(store: LeaseStore, sql: str) -> Any:
    rows = backend_of(store).client.read(sql)
    return rows[0][0]


def test_libpq_parameters_in_the_query_string_reach_libpq(url: str) -> None:
    # host/port as parameters, sslmode, application_name and options of the user's own
    with open_store(f"{url}&host=127.0.0.1&sslmode=disable&application_name=cl-test"
                    "&options=-c%20work_mem%3D5MB&keepalives_idle=7") as store:
        assert _server_setting(store, "SELECT current_setting('application_name')") == "cl-test"
        assert _server_setting(store, "SELECT current_setting('work_mem')") == "5MB"
        # the store's own timeouts are still applied after the user's options
        assert _server_setting(store, "SELECT current_setting('lock_timeout')") != "0"
        assert backend_of(store).client.kwargs.get("keepalives_idle") is None  # libpq's 7
        assert "keepalives_idle='7'" in backend_of(store).client.conninfo \
            or "keepalives_idle=7" in backend_of(store).client.conninfo


def test_sslmode_require_is_passed_to_libpq(url: str) -> None:
    # the test server has no TLS: libpq itself refuses, which shows the option reached it
    with pytest.raises(BackendUnavailable, match="SSL"):
        open_store(f"{url}&sslmode=require", connect_timeout_s=2.0)


def test_shared_tls_names_map_to_libpq(url: str, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    parsed = OPTIONS.parse({"ca_file": str(ca), "user": "u", "password": "p"})
    assert libpq_params(parsed) == {"sslrootcert": str(ca), "sslmode": "verify-full",
                                    "user": "u", "password": "p"}
    with pytest.raises(InvalidArgument, match="same setting"):
        libpq_params(OPTIONS.parse({"ca_file": str(ca), "sslrootcert": str(ca)}))
    with pytest.raises(InvalidArgument, match="no such file"):
        open_store(f"{url}&ca_file={tmp_path / 'missing.pem'}")
    with pytest.raises(InvalidArgument, match="sslmode"):
        open_store(f"{url}&sslmode=sometimes")


def test_user_and_password_options_override_the_url(base: str) -> None:
    scheme, rest = base.split("://", 1)
    userinfo, host = rest.split("@", 1)
    user, password = userinfo.split(":", 1)
    with pytest.raises(AuthenticationFailed):
        open_store(base, password="not-the-password", connect_timeout_s=2.0)
    open_store(f"{scheme}://nobody:wrong@{host}", user=user, password=password,
               connect_timeout_s=2.0).close()


def test_create_false_on_a_missing_store_creates_nothing(url: str, base: str) -> None:
    with pytest.raises(InvalidArgument, match="create=false"):
        open_store(url, create=False)
    schema = url.rsplit("=", 1)[1]
    with psycopg.connect(base, autocommit=True) as side:
        row = side.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    assert row is None


def test_schema_is_versioned_and_a_newer_one_is_refused(store: LeaseStore, url: str, base: str) -> None:
    b = backend_of(store)
    with psycopg.connect(base, autocommit=True) as side:
        version = side.execute(f"SELECT schema_version FROM {b.names.meta}").fetchone()
        assert version == (SCHEMA_VERSION,)
        side.execute(f"UPDATE {b.names.meta} SET schema_version = 99")
    with pytest.raises(InvalidArgument, match="newer consensus_lease"):
        open_store(url)


def _has_index(base: str, schema: str, name: str) -> bool:
    with psycopg.connect(base, autocommit=True) as side:
        row = side.execute("SELECT 1 FROM pg_indexes WHERE schemaname = %s AND indexname = %s",
                           (schema, name)).fetchone()
    return row is not None


def test_a_version_1_store_is_migrated_on_open(store: LeaseStore, url: str, base: str) -> None:
    """Version 1 had no index of exhausted jobs: opening it adds the index, records the
    new version, and keeps the jobs."""
    b = backend_of(store)
    store.enqueue("q", "kept")
    with psycopg.connect(base, autocommit=True) as side:
        side.execute(f"DROP INDEX {b.names.s}.cl_jobs_exhausted_by_queue")
        side.execute(f"UPDATE {b.names.meta} SET schema_version = 1")
    assert not _has_index(base, b.names.schema, "cl_jobs_exhausted_by_queue")
    reopened = open_store(url)
    try:
        assert _has_index(base, b.names.schema, "cl_jobs_exhausted_by_queue")
        with psycopg.connect(base, autocommit=True) as side:
            version = side.execute(f"SELECT schema_version FROM {b.names.meta}").fetchone()
        assert version == (SCHEMA_VERSION,) == (5,)
        assert reopened.queue_stats("q").available == 1
    finally:
        reopened.close()


def test_a_version_2_store_is_migrated_on_open(store: LeaseStore, url: str, base: str) -> None:
    """Version 2 had no ``closed`` column and indexed session_id and the open jobs by
    completed_at/failed_at: opening it adds and fills the column, replaces the indexes,
    and every job keeps its state (the open queue job is the one claim_next finds)."""
    b = backend_of(store)
    worker = store.session("w", ttl_s=30.0)
    store.enqueue_many("q", ["open", "done", EnqueueItem("failed", b"", 1)])
    done = worker.claim("done")
    failed = worker.claim("failed")
    named = worker.claim("named")
    assert done is not None and failed is not None and named is not None
    done.complete(b"d")
    failed.fail("no", retry_in_s=0)
    named.complete(b"n")
    held = worker.claim("held")
    assert held is not None
    s = b.names.s
    with psycopg.connect(base, autocommit=True) as side:
        side.execute(f"ALTER TABLE {s}.cl_jobs DROP COLUMN closed")  # and its indexes
        side.execute(f"CREATE INDEX cl_jobs_by_session ON {s}.cl_jobs (session_id) "
                     "WHERE session_id IS NOT NULL")
        side.execute(f"CREATE INDEX cl_jobs_open_by_queue ON {s}.cl_jobs (queue, seq) "
                     "WHERE queue IS NOT NULL AND completed_at IS NULL AND failed_at IS NULL")
        side.execute(f"UPDATE {b.names.meta} SET schema_version = 2")
    reopened = open_store(url)
    try:
        assert not _has_index(base, b.names.schema, "cl_jobs_by_session")
        assert _has_index(base, b.names.schema, "cl_jobs_exhausted_by_queue")
        with psycopg.connect(base, autocommit=True) as side:
            version = side.execute(f"SELECT schema_version FROM {b.names.meta}").fetchone()
            closed = dict(side.execute(f"SELECT job_id, closed FROM {s}.cl_jobs").fetchall())
        assert version == (SCHEMA_VERSION,)
        assert closed == {"open": None, "done": True, "failed": True, "named": True,
                          "held": True}
        stats = reopened.queue_stats("q")
        assert (stats.available, stats.held, stats.completed, stats.failed) == (1, 0, 1, 1)
        other = reopened.session("o", ttl_s=30.0)
        lease = other.claim_next("q")
        assert lease is not None and lease.job_id == "open"
        assert other.claim("held") is None  # still held by "w"
        held.complete(b"h")
    finally:
        reopened.close()


def test_a_version_3_store_is_migrated_on_open(store: LeaseStore, url: str, base: str) -> None:
    """Version 3 did not record the server: opening it records this one (system
    identifier, timeline) and gives the open sessions its timeline, so a lease held
    across the migration keeps working."""
    b = backend_of(store)
    worker = store.session("w", ttl_s=30.0, keepalive=False)
    held = worker.claim("held")
    assert held is not None
    s = b.names.s
    with psycopg.connect(base, autocommit=True) as side:
        side.execute(f"ALTER TABLE {s}.cl_meta DROP COLUMN system_id, DROP COLUMN timeline")
        side.execute(f"ALTER TABLE {s}.cl_sessions DROP COLUMN timeline")
        side.execute(f"UPDATE {b.names.meta} SET schema_version = 3")
    reopened = open_store(url)
    try:
        with psycopg.connect(base, autocommit=True) as side:
            meta = side.execute(
                f"SELECT schema_version, system_id = (SELECT system_identifier::text FROM "
                "pg_control_system()), timeline = substr(pg_walfile_name(pg_current_wal_lsn()), "
                f"1, 8) FROM {b.names.meta}").fetchone()
        assert meta == (SCHEMA_VERSION, True, True) == (5, True, True)
        worker.keepalive()
        held.complete(b"h")
        assert reopened.session("o", ttl_s=30.0).claim("new") is not None
    finally:
        reopened.close()


def test_a_store_restored_into_another_cluster_is_regressed_until_bump(
    store: LeaseStore, url: str, base: str
) -> None:
    """cl_meta names another cluster (as a logical dump restored into this one would,
    with the same timeline number): opening the store ends every session row, so the
    running holder's keepalive is StoreRegressed, as is opening a session; bump-epoch
    records this server and tokens go above every earlier one."""
    b = backend_of(store)
    worker = store.session("w", ttl_s=30.0, keepalive=False)
    held = worker.claim("job")
    assert held is not None
    with psycopg.connect(base, autocommit=True) as side:
        side.execute(f"UPDATE {b.names.meta} SET system_id = '1'")
    worker.keepalive()  # nothing noticed it yet: the session row is as it was
    reopened = open_store(url)
    try:
        with pytest.raises(StoreRegressed, match="another PostgreSQL cluster"):
            worker.keepalive()
        with pytest.raises(StoreRegressed):
            held.ensure_held()
        with pytest.raises(StoreRegressed):
            reopened.session("o", ttl_s=30.0)
        reopened.bump_epoch()
        after = reopened.session("o", ttl_s=30.0).claim("job")  # the old session is gone
        assert after is not None and after.generation > held.generation
    finally:
        reopened.close()


def test_completing_a_named_job_is_a_hot_update(store: LeaseStore, base: str) -> None:
    """The completion of a named job changes no indexed column (index predicates
    included): PostgreSQL updates the row in place of its page, writing no index entry
    (pg_stat_get_xact_tuples_hot_updated in the completing transaction)."""
    b = backend_of(store)
    session = store.session("w", ttl_s=30.0)
    lease = session.claim("named")
    assert lease is not None
    epoch, gen = divmod(lease.generation, 2 ** b.epoch_shift)
    params = {"job": "named", "sid": session.handle.session_id, "gen": gen, "epoch": epoch,
              "result": b"r"}
    with psycopg.connect(base) as side:
        assert side.execute(b.sql.complete, params).fetchone() is not None
        hot = side.execute("SELECT pg_stat_get_xact_tuples_hot_updated(%s::regclass)",
                           (f"{b.names.s}.cl_jobs",)).fetchone()
        side.commit()
    assert hot == (1,)
    record = store.get("named")
    assert record is not None and record.state is JobState.COMPLETED and record.result == b"r"


def test_a_session_row_collected_long_after_its_expiry_frees_its_jobs(
    store: LeaseStore, base: str
) -> None:
    """Opening a session deletes the rows of sessions expired over SESSION_GC_S ago even
    while their jobs still name them (no job row is read or written): such a job is
    free, and the next claim takes it at the next generation."""
    b = backend_of(store)
    gone = b.open_session("gone", 30.0)
    first = b.claim(gone, "job")
    assert first is not None
    with psycopg.connect(base, autocommit=True) as side:
        side.execute(f"UPDATE {b.names.sessions} SET expires_at = expires_at - 1000 "
                     "WHERE session_id = %s", (gone.session_id,))
    later = store.session("later", ttl_s=30.0)  # collects the expired row
    with psycopg.connect(base, autocommit=True) as side:
        rows = side.execute(f"SELECT 1 FROM {b.names.sessions} WHERE session_id = %s",
                            (gone.session_id,)).fetchall()
        job_session = side.execute(f"SELECT session_id FROM {b.names.jobs}").fetchone()
    assert rows == [] and job_session == (gone.session_id,)
    record = store.get("job")
    assert record is not None and record.state is JobState.AVAILABLE
    lease = later.claim("job")
    assert lease is not None and lease.generation == first.generation + 1


def test_claim_next_reads_only_exhausted_jobs_to_fail_them(store: LeaseStore, base: str) -> None:
    """``claim_next`` (and ``claim_next_many``) fails the exhausted jobs at the queue's
    head through the partial index, not by reading every open job: the plan of its
    statement on a queue of 2,000 open jobs uses ``cl_jobs_exhausted_by_queue``."""
    b = backend_of(store)
    for start in range(0, 2000, 1000):
        store.enqueue_many("deep", [f"d{i:05d}" for i in range(start, start + 1000)])
    with psycopg.connect(base, autocommit=True) as side:
        side.execute(f"ANALYZE {b.names.jobs}")
        for sql in (b.sql.claim_from_queue, b.sql.claim_from_queue_many):
            plan = "\n".join(r[0] for r in side.execute(
                "EXPLAIN " + sql, {"queue": "deep", "sid": "nobody", "owner": "nobody",
                                   "n": 100, "mine": []}).fetchall())
            assert "cl_jobs_exhausted_by_queue" in plan


def _listener_pids(base: str, channel: str) -> set[int]:
    with psycopg.connect(base, autocommit=True) as side:
        rows = side.execute(
            "SELECT pid FROM pg_stat_activity WHERE query = %s AND pid <> pg_backend_pid()",
            (f'LISTEN "{channel}"',),
        ).fetchall()
    return {int(r[0]) for r in rows}


def test_the_listener_reconnects_and_wakes_again(url: str, base: str) -> None:
    waiter_store = open_store(url, poll_interval_s=30.0)
    holder_store = open_store(url)
    try:
        channel = backend_of(waiter_store).names.channel
        holder = holder_store.session("holder", ttl_s=30.0)
        lease = holder.claim("job")
        assert lease is not None
        waiter = waiter_store.session("waiter", ttl_s=30.0)
        got: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: got.update(lease=waiter.claim("job", wait_s=25.0)))
        thread.start()
        first = poll_until(lambda: _listener_pids(base, channel), 5.0)
        with psycopg.connect(base, autocommit=True) as side:
            for pid in first:
                side.execute("SELECT pg_terminate_backend(%s)", (pid,))
        poll_until(lambda: _listener_pids(base, channel) - first, 10.0)  # listening again
        released = time.monotonic()
        lease.release()
        thread.join(20.0)
        assert got["lease"].generation == 2
        assert time.monotonic() - released < 5.0  # not the 30 s poll
    finally:
        waiter_store.close()
        holder_store.close()


def test_without_a_server_url_the_tests_skip_but_fail_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONSENSUS_LEASE_POSTGRES_URL", raising=False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        postgres_url()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception):
        postgres_url()


def test_admin_commands_open_only_an_existing_store(url: str, base: str) -> None:
    from consensus_lease.admin import open_existing_store

    with pytest.raises(InvalidArgument, match="create=false"):
        open_existing_store(url)
    schema = url.rsplit("=", 1)[1]
    with psycopg.connect(base, autocommit=True) as side:
        assert side.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                            (schema,)).fetchone() is None
    open_store(url).close()
    open_existing_store(url).close()


@pytest.mark.parametrize("bad", ["postgresql://u:secret@127.0.0.1:abc/db", "postgresql://"])
def test_malformed_url_is_invalid_argument_without_the_password(bad: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        open_store(bad, connect_timeout_s=2.0)
    assert "secret" not in str(info.value)


def _count_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the first word of every statement psycopg executes from now on."""
    sent: list[str] = []
    real = psycopg.Cursor.execute

    def execute(self: Any, query: Any, *a: Any, **k: Any) -> Any:
        sent.append(str(query).split(None, 1)[0])
        return real(self, query, *a, **k)

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    return sent


def test_claim_many_is_one_statement_with_the_rules_of_claim(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """128 jobs (new, released, delayed, completed, held elsewhere, used up) in one
    statement: each claimed one gets its own generation and attempt, the others None, the
    used-up one FAILED."""
    b = backend_of(store)
    assert b.capabilities.max_batch_claim >= 128
    other = store.session("other", ttl_s=30.0)
    store.enqueue_many("q", [EnqueueItem("used", b"", 1)])
    setup = {j: other.claim(j) for j in ("released", "delayed", "done", "held", "used")}
    for job_id in ("released", "used"):
        setup[job_id].release()  # type: ignore[union-attr]
    setup["delayed"].fail("later", retry_in_s=60.0)  # type: ignore[union-attr]
    setup["done"].complete(b"r")  # type: ignore[union-attr]
    session = store.session("w", ttl_s=30.0)
    ids = [*(f"n-{i:03d}" for i in range(122)), "released", "delayed", "done", "held", "used",
           "n-last"]
    sent = _count_statements(monkeypatch)
    leases = session.claim_many(ids)
    assert sent == ["WITH"]
    got = dict(zip(ids, leases, strict=True))
    assert all(got[j] is None for j in ("delayed", "done", "held", "used"))
    released = got["released"]
    assert released is not None and released.attempt == 2
    assert released.generation > setup["released"].generation  # type: ignore[union-attr]
    fresh = [got[j] for j in ids if j.startswith("n-")]
    assert all(lease is not None and lease.attempt == 1 for lease in fresh)
    records = {j: store.get(j) for j in ids}
    assert records["used"].state is JobState.FAILED  # type: ignore[union-attr]
    assert records["done"].state is JobState.COMPLETED  # type: ignore[union-attr]
    assert records["held"].owner == "other"  # type: ignore[union-attr]
    assert sum(r.state is JobState.HELD and r.owner == "w"  # type: ignore[union-attr]
               for r in records.values()) == 124


def test_claim_many_leaves_every_row_as_single_claims_leave_it(store: LeaseStore) -> None:
    """Each situation twice (prefix ``m-`` and ``s-``): ``claim_many`` of the ``m-`` jobs
    and one ``claim`` per ``s-`` job answer alike and leave the rows alike, down to the
    attempt, the owner and why a used-up job FAILED (a used-up job held by a live session
    stays held; one whose holder expired, or that nobody holds, is FAILED)."""
    b = backend_of(store)
    other, dead, me = (b.open_session(o, 30.0) for o in ("other", "dead", "w"))
    kinds = ["new", "released", "delayed", "done", "held", "dead-holder", "used",
             "used-held", "used-dead", "failed"]
    budget = {"used", "used-held", "used-dead", "failed"}
    for p in ("m-", "s-"):
        store.enqueue_many("q", [EnqueueItem(p + k, b"", 1 if k in budget else None)
                                 for k in kinds if k != "new"])
        got = {k: b.claim(dead if "dead" in k else other, p + k) for k in kinds[1:]}
        for k in ("released", "used"):
            b.release(other, p + k, got[k])  # type: ignore[arg-type]
        b.fail(other, p + "delayed", got["delayed"], "later", 60.0)  # type: ignore[arg-type]
        b.fail(other, p + "failed", got["failed"], "boom", 0.0)  # type: ignore[arg-type]
        b.complete(other, p + "done", got["done"], b"r")  # type: ignore[arg-type]
    b.expire_session(dead.session_id)
    many = dict(zip(kinds, b.claim_many(me, ["m-" + k for k in kinds]), strict=True))
    single: dict[str, object] = {}
    for k in kinds:
        try:
            single[k] = b.claim(me, "s-" + k)
        except (JobCompleted, JobFailed):
            single[k] = None
    assert {k for k, c in many.items() if c is not None} == {"new", "released", "dead-holder"}
    for k in kinds:
        m, one = many[k], single[k]
        assert (m is None) == (one is None), k
        if m is not None and isinstance(one, ClaimResult):
            assert m.attempt == one.attempt and m.generation == one.generation, k
        mr, sr = store.get("m-" + k), store.get("s-" + k)
        assert mr is not None and sr is not None
        assert (mr.state, mr.owner, mr.attempt, mr.error, mr.generation, mr.not_before is None) \
            == (sr.state, sr.owner, sr.attempt, sr.error, sr.generation, sr.not_before is None), k
    assert store.get("m-used-held").state is JobState.HELD  # type: ignore[union-attr]
    for k in ("used", "used-dead"):
        record = store.get("m-" + k)
        assert record is not None and record.state is JobState.FAILED
        assert record.error == "attempts exhausted: attempt 1 ended without completion"


def test_claim_many_of_an_expired_session_claims_nothing(store: LeaseStore) -> None:
    b = backend_of(store)
    handle = b.open_session("w", 30.0)
    b.expire_session(handle.session_id)
    with pytest.raises(SessionExpired):
        b.claim_many(handle, ["a", "b"])
    assert store.get("a") is None and store.get("b") is None


def test_claim_many_with_a_locked_row_falls_back_to_one_claim_per_job(
    store: LeaseStore, base: str
) -> None:
    """A job row locked by another transaction (a lease.transaction): the statement waits
    ``lock_timeout`` and is rolled back; the jobs are then claimed one by one, the locked
    one answered None as a single claim does."""
    b = backend_of(store)
    first = store.session("o", ttl_s=30.0).claim("locked")
    assert first is not None
    first.release()
    session = store.session("w", ttl_s=30.0)
    with psycopg.connect(base) as side:
        side.execute(f"SELECT 1 FROM {b.names.jobs} WHERE job_id = 'locked' FOR UPDATE")
        leases = session.claim_many(["a", "locked", "b"])
        side.rollback()
    assert leases[1] is None and leases[0] is not None and leases[2] is not None
    assert {lease.job_id for lease in session.leases()} == {"a", "b"}


def test_a_broken_connection_during_claim_many_is_settled_by_reading_back(
    url: str, base: str
) -> None:
    s = open_store(url, pool_size=1)
    try:
        b = backend_of(s)
        session = s.session("w", ttl_s=30.0)
        terminate_pooled_connection(b, base)
        leases = session.claim_many(["a", "b"])
        assert [lease.generation if lease else None for lease in leases] == [1, 1]
    finally:
        s.close()


_PARAM = re.compile(r"%\((\w+)\)[sb]")
_PARAM_TYPES = {
    "job": "text", "owner": "text", "sid": "text", "gen": "int8", "epoch": "int8",
    "result": "bytea", "chan": "text", "jobs": "text[]", "queue": "text", "limit": "int8",
    "n": "int8", "mine": "text[]", "gens": "int8[]", "epochs": "int8[]",
    "results": "bytea[]", "errors": "text[]", "retries": "float8[]",
}


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_on_a_never_analysed_store_the_hot_statements_use_the_keys(
    store: LeaseStore, base: str, mode: str
) -> None:
    """A new store has no statistics (nothing analysed yet): the planner must still find
    each job and session by its key and a queue's head by its index, in the plan psycopg
    prepares (generic) and in the first runs' (custom): no scan of every row, no hashed
    subplan (one scan of every session row). The batch endings find and lock each
    item's row by the primary key (no join of the items with a scan of the jobs), and so
    do their read-backs."""
    b = backend_of(store)
    session = store.session("w", ttl_s=30.0)
    values = {"job": "j", "owner": "w", "sid": session.session_id, "gen": 1, "epoch": 0,
              "result": b"", "chan": b.names.channel, "jobs": ["a", "b"], "queue": "q",
              "limit": 5, "n": 100, "mine": ["a"], "gens": [1, 1], "epochs": [0, 0],
              "results": [b"", b""], "errors": ["e", "e"], "retries": [0.0, 1.0]}
    with psycopg.connect(base, autocommit=True, cursor_factory=psycopg.ClientCursor) as c:
        assert c.execute(
            "SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = %s AND "
            "(last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)", (b.names.schema,)
        ).fetchone() == (0,)
        c.execute(f"SET plan_cache_mode = {mode}")
        plans = {}
        for name in ("claim", "complete", "claim_from_queue", "claim_from_queue_many",
                     "claim_many", "refusal", "complete_many", "release_many", "fail_many",
                     "held_many", "completed_many_by_me"):
            order: list[str] = []

            def number(m: re.Match[str], order: list[str] = order) -> str:
                if m.group(1) not in order:
                    order.append(m.group(1))
                return f"${order.index(m.group(1)) + 1}"

            sql = _PARAM.sub(number, getattr(b.sql, name))
            c.execute(f"PREPARE p_{name} ({', '.join(_PARAM_TYPES[k] for k in order)}) "
                      f"AS {sql}")
            args = ", ".join(f"%s::{_PARAM_TYPES[k]}" for k in order)
            plans[name] = "\n".join(r[0] for r in c.execute(
                f"EXPLAIN (COSTS OFF) EXECUTE p_{name}({args})", [values[k] for k in order]))
    for name, plan in plans.items():
        assert "Seq Scan" not in plan and "hashed" not in plan, f"{name}:\n{plan}"
    assert "Index Scan using cl_jobs_pkey" in plans["complete"]
    assert "Index Scan using cl_sessions_pkey" in plans["claim"]
    assert "Index Scan using cl_jobs_open_by_queue" in plans["claim_from_queue"]
    assert "Index Scan using cl_jobs_open_by_queue" in plans["claim_from_queue_many"]
    for name in ("complete_many", "release_many", "fail_many"):
        assert "Index Scan using cl_jobs_pkey" in plans[name], f"{name}:\n{plans[name]}"
        assert "Conflict Arbiter Indexes: cl_jobs_pkey" in plans[name], plans[name]
    for name in ("held_many", "completed_many_by_me"):  # their lost answers' read-backs
        assert "Index Scan using cl_jobs_pkey" in plans[name], f"{name}:\n{plans[name]}"


@pytest.mark.parametrize("op", ["complete_many", "release_many", "fail_many"])
def test_a_batch_ending_of_a_job_with_no_row_is_refused_and_inserts_nothing(
    store: LeaseStore, op: str
) -> None:
    """The batch endings propose each item as a row of ``INSERT ... ON CONFLICT DO
    UPDATE``: an item whose job has no row is refused like a lone call's, and no row is
    made for it; the other items apply."""
    b = backend_of(store)
    session = b.open_session("w", 30.0)
    held = b.claim(session, "held")
    assert held is not None
    ghost = ClaimResult(held.generation, held.lease_until, 1)
    extra: tuple[Any, ...] = {"complete_many": (b"r",), "release_many": (),
                              "fail_many": ("boom", 0.0)}[op]
    outcomes = getattr(b, op)(session, [("ghost", ghost, *extra), ("held", held, *extra)])
    assert isinstance(outcomes[0], StaleLeaseError)
    assert outcomes[0].current_generation is None
    assert not isinstance(outcomes[1], Exception)
    assert b.get("ghost") is None
    record = b.get("held")
    assert record is not None and record.generation == held.generation
    assert record.state is {"complete_many": JobState.COMPLETED, "release_many":
                            JobState.AVAILABLE, "fail_many": JobState.AVAILABLE}[op]


def test_the_postgres_scheme_is_libpqs_other_spelling(url: str) -> None:
    """``postgres://`` (libpq takes it; Heroku and many .env files give it) opens the same
    store as ``postgresql://``."""
    assert url.startswith("postgresql://")
    with open_store(url) as canonical, open_store("postgres://" + url[len("postgresql://"):]) as alias:
        assert alias.backend.scheme == "postgresql"
        lease = alias.session("A", 10.0).claim("spelled")
        assert lease is not None
        record = canonical.get("spelled")
        assert record is not None and record.generation == lease.generation
        lease.complete()


def test_claim_next_many_lost_answer_is_settled_by_reading_back(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer of ``claim_next_many``'s statement is lost (the connection broke after
    it was sent). Not applied: the read-back finds no job of the queue held by the
    session and the statement runs once more (the jobs are claimed once). Applied: the
    read-back finds the session holding a job of the queue and raises ``OutcomeUnknown``;
    the job stays the session's (never claimed by anyone else meanwhile) until the
    session ends, then it is claimable again."""
    b = backend_of(store)
    store.enqueue_many("lost", ["l1", "l2", "l3"])
    session = store.session("W", 30.0)
    write = b.client.write
    applied = [False]

    def lossy(job_id: str | None, run: Any, settle: Any = None) -> Any:
        if settle is None or not run.__qualname__.startswith("_claim_many_rows."):
            return write(job_id, run, settle)
        if applied[0]:
            write(job_id, run)  # committed, then the answer is lost
        return settle()

    monkeypatch.setattr(b.client, "write", lossy)
    leases = session.claim_next_many("lost", 2)
    assert [lease.job_id for lease in leases] == ["l1", "l2"]
    assert all(lease.generation == 1 for lease in leases)
    applied[0] = True
    with pytest.raises(OutcomeUnknown):
        session.claim_next_many("lost", 1)
    assert session.state is SessionState.ACTIVE and len(session.leases()) == 2
    record = store.get("l3")
    assert record is not None and record.state is JobState.HELD and record.owner == "W"
    monkeypatch.undo()
    other = store.session("O", 30.0)
    assert other.claim_next_many("lost", 3) == []
    session.close()
    again = other.claim_next_many("lost", 3)
    assert sorted(lease.job_id for lease in again) == ["l1", "l2", "l3"]
    other.close()
