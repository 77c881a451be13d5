"""The PostgreSQL store behind a real PgBouncer 1.18 (``pgbouncer_local``).

Transaction pooling works when the store is told (``pooling=transaction``: nothing
prepared, timeouts set per transaction, LISTEN only on a direct ``listen_url``), and is
refused at open, naming the option, when it is not: PgBouncer's default config refuses
the ``options`` startup parameter, and ``ignore_startup_parameters = options`` drops it.
Session pooling works with ``pooling=session``. Needs ``CONSENSUS_LEASE_POSTGRES_URL``
and the pgbouncer binary (skipped without, failed under ``CI=true``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pgbouncer_local import pgbouncer
from psycopg.conninfo import conninfo_to_dict

from consensus_lease import LeaseStore, open_store
from consensus_lease.backends.postgresql import PostgresBackend
from consensus_lease.errors import BackendUnavailable, ClaimTimeout, InvalidArgument
from consensus_lease.testing.conformance import poll_until
from consensus_lease.testing.postgresql import fresh_schema, postgres_url


@pytest.fixture
def base() -> str:
    return postgres_url()


@pytest.fixture
def schema(base: str) -> Iterator[str]:
    with fresh_schema(base) as name:
        yield name


def _schema_exists(base: str, schema: str) -> bool:
    with psycopg.connect(base, autocommit=True) as conn:
        return conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone() != (None,)


def backend_of(store: LeaseStore) -> PostgresBackend:
    assert isinstance(store.backend, PostgresBackend)
    return store.backend


@pytest.mark.parametrize("ignore", ["", "options"], ids=["default-config", "ignore-options"])
def test_transaction_pooling_without_the_option_is_refused_at_open(
    base: str, schema: str, ignore: str
) -> None:
    """Default config: PgBouncer refuses ``options`` (was BackendUnavailable). With
    ``ignore_startup_parameters = options`` the store's timeouts are dropped (it opened and
    ran with both at 0): refused, naming transaction pooling and the option, and nothing
    is created."""
    with pgbouncer(base, ignore_startup_parameters=ignore) as url:
        with pytest.raises(InvalidArgument) as info:
            open_store(f"{url}?schema={schema}")
    text = str(info.value)
    assert "transaction pooling" in text and "pooling=transaction" in text, text
    assert "PgBouncer" in text
    assert not _schema_exists(base, schema)


def test_options_with_a_pooler_are_refused_before_connecting() -> None:
    with pytest.raises(InvalidArgument, match="options cannot be used with pooling"):
        open_store("postgresql://u:p@127.0.0.1:1/db?pooling=transaction&options=-c%20x%3D1")
    with pytest.raises(InvalidArgument, match="pooling"):
        open_store("postgresql://u:p@127.0.0.1:1/db?pooling=statement")


def _server_connections(url: str, count: int) -> list[tuple[Any, ...]]:
    """What each of PgBouncer's ``count`` server connections carries: ``count`` client
    transactions held open at once take one server connection each."""
    conns = [psycopg.connect(url, prepare_threshold=None) for _ in range(count)]
    try:
        return [c.execute(
            "SELECT pg_backend_pid(), current_setting('statement_timeout'), "
            "current_setting('lock_timeout'), (SELECT count(*) FROM pg_prepared_statements), "
            "(SELECT count(*) FROM pg_listening_channels())").fetchone() or () for c in conns]
    finally:
        for c in conns:
            c.close()


def test_transaction_pooling_runs_every_job_once_and_leaves_nothing_on_the_server(
    base: str, schema: str
) -> None:
    """8 workers (each its own store, pool 2) through PgBouncer with 3 server
    connections: 300 queued jobs, then 16 enqueued while every worker waits (the
    fallback poll at 30 s, the wait 25 s: only the direct listener's NOTIFY can wake them
    in time). Every
    job done exactly once, no error; afterwards no server connection has a prepared
    statement, a LISTEN or the store's timeouts."""
    workers, first, later = 8, 300, 16
    with pgbouncer(base, pool_size=3) as url:
        stores = [open_store(url, schema=schema, pooling="transaction", listen_url=base,
                             pool_size=2, poll_interval_s=30.0) for _ in range(workers)]
        try:
            stores[0].enqueue_many("q", [(f"a{i}", b"") for i in range(first)])
            done: Counter[str] = Counter()
            errors: list[BaseException] = []
            waiting = threading.Semaphore(0)
            lock = threading.Lock()
            stop = threading.Event()

            def work(store: LeaseStore) -> None:
                try:
                    with store.session("w", ttl_s=30.0) as session:
                        while not stop.is_set():
                            lease = session.claim_next("q")
                            if lease is None:
                                waiting.release()
                                try:
                                    lease = session.claim_next("q", wait_s=25.0)
                                except ClaimTimeout:
                                    continue
                            lease.complete(b"ok")
                            with lock:
                                done[lease.job_id] += 1
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=work, args=(s,)) for s in stores]
            for t in threads:
                t.start()
            poll_until(lambda: len(done) == first or bool(errors), 120.0)
            for _ in range(workers):  # every worker has found the queue empty
                assert waiting.acquire(timeout=30.0)
            enqueued = time.monotonic()
            stores[1].enqueue_many("q", [(f"b{i}", b"") for i in range(later)])
            poll_until(lambda: len(done) == first + later or bool(errors), 60.0)
            woken_in = time.monotonic() - enqueued
            stop.set()  # one last job each ends the waiting workers
            stores[1].enqueue_many("q", [(f"z{i}", b"") for i in range(workers)])
            for t in threads:
                t.join(30.0)
            assert not errors, errors[:3]
            assert not any(t.is_alive() for t in threads)
            assert len(done) == first + later + workers and set(done.values()) == {1}
            assert woken_in < 20.0, "woken by NOTIFY (the poll is at 30 s, the wait 25 s)"
        finally:
            for s in stores:
                s.close()
        for _pid, timeout, lock_timeout, prepared, listening in _server_connections(url, 3):
            assert (timeout, lock_timeout, prepared, listening) == ("0", "0", 0, 0)


def test_transaction_pooling_without_listen_url_polls_and_keeps_its_timeouts(
    base: str, schema: str
) -> None:
    """No LISTEN (it would stay on a pooled server connection): a waiting claim is woken
    by the poll. The timeouts hold per statement: a statement longer than ``timeout_s``
    is cancelled, and the settings are the store's inside every statement."""
    with pgbouncer(base, pool_size=2) as url:
        store = open_store(url, schema=schema, pooling="transaction", poll_interval_s=0.1,
                           timeout_s=1.0)
        try:
            b = backend_of(store)
            assert b.client.read("SELECT current_setting('statement_timeout'), "
                                 "current_setting('lock_timeout')") == [("1s", "500ms")]
            with pytest.raises(BackendUnavailable, match="ran out of time"):
                b.client.read("SELECT pg_sleep(3)")
            holder = store.session("holder", ttl_s=30.0)
            waiter = store.session("waiter", ttl_s=30.0)
            lease = holder.claim("job")
            assert lease is not None
            got: dict[str, Any] = {}
            thread = threading.Thread(target=lambda: got.update(
                lease=waiter.claim("job", wait_s=20.0)))
            thread.start()
            poll_until(lambda: len(b._subscriptions()) > 0, 10.0)
            lease.release()
            thread.join(20.0)
            assert got["lease"].generation == 2
            assert b._listener is None
            holder.close()
            waiter.close()
        finally:
            store.close()
        for row in _server_connections(url, 2):
            assert row[1:] == ("0", "0", 0, 0)


def test_lease_transaction_through_transaction_pooling(base: str, schema: str) -> None:
    """``lease.transaction`` runs in the caller's transaction (one server connection for
    its length); its statements are never prepared, so a caller's connection with
    psycopg's default ``prepare_threshold`` runs it more than 5 times without error."""
    with pgbouncer(base, pool_size=2) as url:
        store = open_store(url, schema=schema, pooling="transaction")
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f'CREATE TABLE "{schema}".effects (job text, gen bigint)')
                with store.session("w", ttl_s=30.0) as session:
                    for i in range(8):
                        lease = session.claim(f"job{i}")
                        assert lease is not None
                        with lease.transaction(conn) as tx:
                            assert tx.once("charge")  # its INSERT is not prepared either
                            conn.execute(f'INSERT INTO "{schema}".effects VALUES '
                                         f"('job{i}', {lease.generation})")
                        lease.complete(b"")
                rows = conn.execute(f'SELECT count(*) FROM "{schema}".effects').fetchone()
                assert rows == (8,)
        finally:
            store.close()


def test_session_pooling_works_with_its_option(base: str, schema: str) -> None:
    """``pooling=session`` with PgBouncer's default config (which refuses ``options``):
    the timeouts are set on each connection, LISTEN works (a waiting claim of another
    store is woken with the poll at 30 s)."""
    with pgbouncer(base, pool_mode="session", pool_size=6) as url:
        holder_store = open_store(url, schema=schema, pooling="session", pool_size=2)
        waiter_store = open_store(url, schema=schema, pooling="session", pool_size=2,
                                  poll_interval_s=30.0)
        try:
            assert backend_of(holder_store).client.read(
                "SELECT current_setting('statement_timeout')") == [("5s",)]
            holder = holder_store.session("holder", ttl_s=30.0)
            lease = holder.claim("job")
            assert lease is not None
            waiter = waiter_store.session("waiter", ttl_s=30.0)
            got: dict[str, Any] = {}
            thread = threading.Thread(target=lambda: got.update(
                lease=waiter.claim("job", wait_s=20.0), at=time.monotonic()))
            thread.start()
            poll_until(lambda: len(backend_of(waiter_store)._subscriptions()) > 0, 10.0)
            released = time.monotonic()
            lease.release()
            thread.join(25.0)
            assert got["lease"].generation == 2
            assert got["at"] - released < 15.0, "woken by NOTIFY, not by the 30 s poll"
        finally:
            waiter_store.close()
            holder_store.close()


def test_a_listen_url_to_another_database_is_refused(base: str, schema: str) -> None:
    other = base.rsplit("/", 1)[0] + "/postgres"
    with pytest.raises(InvalidArgument, match="listen_url does not reach"):
        open_store(base, schema=schema, pooling="transaction", listen_url=other)


def test_session_pooling_against_a_transaction_pooler_runs_no_wrong_statement(
    base: str, schema: str
) -> None:
    """``pooling=session`` pointed at PgBouncer in *transaction* mode (a misconfigured
    mode): 4 threads of one store (pool 4) over 2 server connections, 40 claim+complete
    cycles each, finish with no error. Before, psycopg prepared each statement on the
    server after 5 runs and ran it by name on whichever server connection PgBouncer gave
    next (``bind message supplies 3 parameters, but prepared statement "_pg3_0" requires
    5`` as BackendUnavailable; with matching counts another statement under that name).
    ``pooling=session`` prepares nothing on the server either."""
    threads_n, cycles = 4, 40
    with pgbouncer(base, pool_mode="transaction", pool_size=2) as url:
        store = open_store(url, schema=schema, pooling="session", pool_size=threads_n)
        try:
            errors: list[BaseException] = []
            done: list[int] = []
            lock = threading.Lock()

            def work(n: int) -> None:
                try:
                    with store.session(f"w{n}", ttl_s=30.0) as session:
                        for i in range(cycles):
                            lease = session.claim(f"job-{n}-{i}")
                            assert lease is not None
                            lease.complete(b"ok")
                            with lock:
                                done.append(lease.generation)
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=work, args=(n,)) for n in range(threads_n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120.0)
            assert not errors, errors[:3]
            assert not any(t.is_alive() for t in threads)
            assert len(done) == threads_n * cycles and set(done) == {1}
        finally:
            store.close()


def test_a_listen_url_without_credentials_takes_the_store_urls(
    base: str, schema: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``listen_url`` with host, port and database only takes the user and password of
    the store's URL (was AuthenticationFailed: libpq's defaults); its listener wakes a
    waiting claim (the poll at 30 s, the wait 20 s)."""
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))  # no ~/.pgpass either
    for name in ("PGPASSWORD", "PGUSER"):
        monkeypatch.delenv(name, raising=False)
    parts = conninfo_to_dict(base)
    listen = f"postgresql://{parts['host']}:{parts['port']}/{parts['dbname']}"
    store = open_store(base, schema=schema, pooling="transaction", listen_url=listen,
                       poll_interval_s=30.0)
    try:
        holder = store.session("holder", ttl_s=30.0)
        lease = holder.claim("job")
        assert lease is not None
        waiter = store.session("waiter", ttl_s=30.0)
        got: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: got.update(
            lease=waiter.claim("job", wait_s=20.0)))
        thread.start()
        poll_until(lambda: len(backend_of(store)._subscriptions()) > 0, 10.0)
        lease.release()
        thread.join(25.0)
        assert got["lease"].generation == 2
        holder.close()
        waiter.close()
    finally:
        store.close()
