"""Connections of the PostgreSQL store: the pool, the error translation, the listener.

The only module of the driver (with :mod:`._transport_txn`, the caller's connection of
``lease.transaction``) that handles psycopg's and psycopg_pool's exceptions: the others
get library errors, :class:`SentMaybe` (read back) or the value :func:`unless_locked`
returns for a row lock not granted. The protocol is told in the package docstring
(:mod:`consensus_lease.backends.postgresql`).

* :class:`Client` owns a ``psycopg_pool.ConnectionPool`` of autocommit connections (each
  statement its own transaction, unless a caller opens one) and translates every psycopg
  error into a :mod:`consensus_lease.errors` type (:func:`translate`). With ``pool_size`` >= 2, one
  of the pool's connections is kept out of it as the *hot* connection: a :meth:`~Client.call`
  that finds it free uses it (and one reused cursor) without the pool's checkout and
  return, about a quarter of the Python calls of a claim+complete cycle; a call that finds
  it busy takes a pooled one. (With ``pool_size`` 1 the only connection stays in the pool:
  the keepalive, which takes pooled connections, must never wait for an idle hot one.)
* :class:`Listener` keeps one more connection that ``LISTEN``\\ s on the store's channel and
  calls a callback on every notification; the backend pokes its subscription poller with
  it, so a waiting claim is woken when a statement that notifies commits (a release, a
  failure, an enqueue ...; not a completion: the package docstring). When the
  listener's connection breaks it reconnects (bounded back-off); meanwhile the poller's
  own interval is the fallback.
* Connection poolers (:data:`._config.POOLING`): with ``pooling=none`` the store's
  ``statement_timeout`` and ``lock_timeout`` travel in the libpq ``options`` startup
  parameter, and :meth:`Client.check_settings` refuses a connection on which they did not
  take effect (a pooler that dropped them). ``pooling=session`` sends no ``options``,
  sets them with ``set_config`` on each new connection (each is a server session of its
  own) and prepares nothing on the server (``prepare_threshold=None``): should the pooler
  really be in transaction mode, a statement prepared on one server connection would be
  run by name on another (a different statement of the same name, or an error), while
  an unprepared one is the same statement wherever it runs. ``pooling=transaction``
  keeps no state on a server connection from one transaction to the next: no server-side
  prepared statement (``prepare_threshold=None``),
  and every statement is sent in one pipeline with a ``set_config(..., true)`` of both
  settings before it, ended by one Sync: one transaction, one round trip
  (:func:`per_transaction_cursor`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Literal, Self, TypeVar, overload

import psycopg
import psycopg_pool
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict

from ...errors import (
    AuthenticationFailed,
    BackendUnavailable,
    InvalidArgument,
    LeaseError,
    OutcomeUnknown,
)
from ._config import POOLING, check_conninfo

__all__ = ["Client", "Listener", "SentMaybe", "per_transaction_cursor", "translate",
           "unless_locked"]

log = logging.getLogger("consensus_lease")

T = TypeVar("T")

_IDLE = int(psycopg.pq.TransactionStatus.IDLE)
"""Compared with ``conn.pgconn.transaction_status`` (an int): ``conn.info`` builds a
``ConnectionInfo`` and an enum on every read, twice per cycle on the hot path."""

_AUTH_STATES = frozenset({"28000", "28P01"})
_AUTH_WORDS = ("password authentication failed", "authentication failed",
               "no pg_hba.conf entry", "no password supplied", "role \"")
_NO_DATABASE = re.compile(r'database "(.*)" does not exist')

POOLER_HINT = (
    "behind PgBouncer in transaction pooling mode (pool_mode = transaction) open the store "
    "with pooling=transaction (and listen_url= a direct connection for LISTEN, or waiting "
    "claims poll every poll_interval_s); in session pooling mode with pooling=session"
)
"""What a refusal of a pooler names (:func:`translate`, :meth:`Client.check_settings`)."""


_SET_SQL = ("SELECT set_config('statement_timeout', '{statement_timeout}', {local}), "
            "set_config('lock_timeout', '{lock_timeout}', {local})")
"""The store's timeouts (milliseconds) as one statement: ``local`` ``true`` for the current
transaction only (``pooling=transaction``), ``false`` for the session (``session``)."""


def per_transaction_cursor(
    statement_timeout_ms: int, lock_timeout_ms: int
) -> type[psycopg.Cursor[tuple[Any, ...]]]:
    """The cursor class of ``pooling=transaction`` connections: each :meth:`execute` sends
    ``set_config(..., true)`` of both timeouts and then the statement in one pipeline
    ended by one Sync, so that PostgreSQL runs them as one transaction (an implicit one
    ends at the Sync, https://www.postgresql.org/docs/15/protocol-flow.html#PROTOCOL-FLOW-
    PIPELINING) and PgBouncer hands both to the same server connection, which it takes
    back at the Sync's ReadyForQuery: the settings never outlive the statement's
    transaction (inside an explicit transaction they last until its end). One round trip:
    the results are read after the Sync. Never prepared (``prepare=False``): a prepared
    statement would stay on a server connection that other clients then use."""
    settings = _SET_SQL.format(statement_timeout=statement_timeout_ms,
                               lock_timeout=lock_timeout_ms, local="true")

    class PerTransactionCursor(psycopg.Cursor[tuple[Any, ...]]):
        def execute(
            self, query: Any, params: Any = None, *, prepare: bool | None = None,
            binary: bool | None = None,
        ) -> Self:
            conn = self.connection
            with conn.pipeline():
                psycopg.Cursor(conn).execute(settings, prepare=False)
                super().execute(query, params, prepare=False, binary=binary)
            return self

    return PerTransactionCursor


@overload
def unless_locked(
    cursor: psycopg.Cursor[tuple[Any, ...]], sql: str, params: Any, locked: T, *,
    fetch_all: Literal[False] = False, deadlock: bool = False, binary: bool | None = None,
    prepare: bool | None = None,
) -> tuple[Any, ...] | T | None: ...


@overload
def unless_locked(
    cursor: psycopg.Cursor[tuple[Any, ...]], sql: str, params: Any, locked: T, *,
    fetch_all: Literal[True], deadlock: bool = False, binary: bool | None = None,
    prepare: bool | None = None,
) -> list[tuple[Any, ...]] | T: ...


def unless_locked(
    cursor: psycopg.Cursor[tuple[Any, ...]], sql: str, params: Any, locked: T, *,
    fetch_all: bool = False, deadlock: bool = False, binary: bool | None = None,
    prepare: bool | None = None,
) -> list[tuple[Any, ...]] | tuple[Any, ...] | T | None:
    """Run ``sql`` on ``cursor`` and return its first row (its rows with ``fetch_all``),
    or ``locked`` if a row lock was not granted within ``lock_timeout`` (a row locked by
    an open ``lease.transaction``) or, with ``deadlock``, PostgreSQL broke a deadlock:
    the statement was rolled back (in autocommit, nothing of it applied)."""
    try:
        cur = cursor.execute(sql, params, prepare=prepare, binary=binary)
        return cur.fetchall() if fetch_all else cur.fetchone()
    except pgerrors.LockNotAvailable:
        return locked
    except pgerrors.DeadlockDetected:
        if deadlock:
            return locked
        raise


class SentMaybe(Exception):
    """Internal: the connection broke after a write was sent; the caller reads back."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def translate(exc: BaseException, where: str, job_id: str | None = None) -> LeaseError:
    """The library error for a psycopg / pool error (never raises it): credentials
    refused or missing (``no password supplied``) are :class:`AuthenticationFailed`, a
    database that does not exist :class:`InvalidArgument`, anything else
    :class:`BackendUnavailable`."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    state = getattr(exc, "sqlstate", None)
    if "unsupported startup parameter: options" in str(exc):
        return InvalidArgument(
            f"{where}: a connection pooler refused the libpq startup parameter 'options' "
            "(PgBouncer does by default), in which the store sends its statement_timeout "
            f"and lock_timeout: {POOLER_HINT}", job_id=job_id,
        )
    if state in _AUTH_STATES or (
        isinstance(exc, psycopg.OperationalError) and state is None
        and any(w in str(exc) for w in _AUTH_WORDS[:4])
    ):
        return AuthenticationFailed(f"{where}: {text}", job_id=job_id)
    missing = _NO_DATABASE.search(str(exc))
    if missing is not None and (state == "3D000" or (
            isinstance(exc, psycopg.OperationalError) and state is None)):
        return InvalidArgument(
            f"{where}: the database {missing.group(1)!r} does not exist on the server "
            "(the store creates its schema and tables, never the database: create it, or "
            "fix the URL's database name)", job_id=job_id,
        )
    if isinstance(exc, pgerrors.InvalidPassword | pgerrors.InvalidAuthorizationSpecification):
        return AuthenticationFailed(f"{where}: {text}", job_id=job_id)
    if isinstance(exc, pgerrors.QueryCanceled):
        return BackendUnavailable(f"{where}: the statement ran out of time ({text})",
                                  job_id=job_id)
    if isinstance(exc, pgerrors.LockNotAvailable):
        hint = "" if job_id is None else (
            "; if a transaction of this process (a lease.transaction block nested in an "
            "outer transaction, or a psycopg transaction not yet committed) touched this "
            "job's row, commit it first"
        )
        return BackendUnavailable(f"{where}: a lock was not granted in time ({text}){hint}",
                                  job_id=job_id)
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return BackendUnavailable(f"{where}: no connection within the timeout ({text})",
                                  job_id=job_id)
    return BackendUnavailable(f"{where}: {text}", job_id=job_id)


class Client:
    """The pool and the statement helpers of one store.

    Args:
        conninfo: a libpq connection string or ``postgresql://`` URI (no query options of
            ours in it). The libpq parameters it sets win over the defaults here
            (keepalives, ``application_name``); its ``options`` are kept, followed by the
            store's ``statement_timeout`` and ``lock_timeout``.
        connect_timeout_s: seconds to open a connection.
        timeout_s: seconds one statement may run (``statement_timeout``) and one TCP send
            may stay unacknowledged (``tcp_user_timeout``); also how long a caller waits
            for a pooled connection.
        pool_size: most connections the pool opens.
        pooling: one of :data:`._config.POOLING` (the module docstring).
        listen_conninfo: where the :class:`Listener` connects (a direct connection to the
            same database); ``None``: ``conninfo``.

    Raises:
        InvalidArgument: a malformed connection string, or one holding a NUL or a
            character UTF-8 cannot encode (nothing is sent); ``options`` with ``pooling``
            other than ``none`` (a pooler does not pass it on).
    """

    def __init__(
        self, conninfo: str, *, connect_timeout_s: float, timeout_s: float, pool_size: int,
        where: str, pooling: str = "none", listen_conninfo: str | None = None,
    ) -> None:
        self.where = where
        self.timeout_s = timeout_s
        self.conninfo = conninfo
        ms = max(1, int(timeout_s * 1000))
        check_conninfo(conninfo)  # libpq would stop at a NUL: the rest silently dropped
        try:
            given = conninfo_to_dict(conninfo)
        except (psycopg.ProgrammingError, ValueError) as exc:
            raise InvalidArgument(f"malformed PostgreSQL connection string "
                                  f"({type(exc).__name__})") from None
        if pooling not in POOLING:
            raise InvalidArgument(f"PostgreSQL option pooling must be one of "
                                  f"{', '.join(POOLING)}, not {pooling!r}")
        if pooling != "none" and given.get("options"):
            raise InvalidArgument(
                f"PostgreSQL option options cannot be used with pooling={pooling}: a pooler "
                "does not pass the startup parameter on (PgBouncer refuses or drops it); "
                "set server parameters per role or database (ALTER ROLE ... SET) instead"
            )
        self.pooling = pooling
        lock_ms = self.lock_wait_ms(timeout_s)
        self.settings = {"statement_timeout": ms, "lock_timeout": lock_ms}
        ours = f"-c statement_timeout={ms} -c lock_timeout={lock_ms}"
        defaults: dict[str, Any] = {
            "tcp_user_timeout": ms,
            "keepalives": 1,
            "keepalives_idle": max(1, int(timeout_s)),
            "keepalives_interval": 1,
            "keepalives_count": 3,
            "application_name": "consensus_lease",
        }
        self.kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(2, round(connect_timeout_s)),
            **{k: v for k, v in defaults.items() if k not in given},
        }
        self.listen_conninfo = conninfo if listen_conninfo is None else listen_conninfo
        self.listen_kwargs = dict(self.kwargs)
        if pooling == "none":
            # the store's timeouts last: a later -c wins over the user's own options
            self.kwargs["options"] = f"{given['options']} {ours}" if given.get("options") \
                else ours
        else:
            # Nothing prepared on the server behind any pooler: with session pooling too,
            # so that a pooler really in transaction mode (a misconfigured pool_mode) can
            # never run a prepared statement by name on another client's server
            # connection (another statement of the same name, or a parameter-count error).
            self.kwargs["prepare_threshold"] = None
            if pooling == "transaction":
                self.kwargs["cursor_factory"] = per_transaction_cursor(ms, lock_ms)
        self.connect_timeout_s = connect_timeout_s
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[tuple[Any, ...]]] | None = None
        self._pool_size = pool_size
        self._hot: psycopg.Connection[tuple[Any, ...]] | None = None
        self._hot_since = 0.0
        self._hot_cur: psycopg.Cursor[tuple[Any, ...]] | None = None
        self._hot_lock = threading.Lock()
        self._hot_ok = pool_size >= 2

    HOT_LIFETIME_S = 60.0
    """Seconds after which the hot connection goes back to the pool (which then applies
    its ``max_lifetime`` to it) and another is taken."""

    @staticmethod
    def lock_wait_ms(timeout_s: float) -> int:
        """``lock_timeout`` of the store's connections: at most 1 s, at most half of
        ``timeout_s``. A claim that waited this long for a job row locked by an open
        ``lease.transaction`` reports the job as not claimable (and a waiting claim tries
        again) instead of running into ``statement_timeout``."""
        return max(1, int(min(1.0, timeout_s / 2) * 1000))

    def connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        """A new connection outside the pool.

        Raises:
            AuthenticationFailed / BackendUnavailable.
        """
        try:
            conn = psycopg.connect(self.conninfo, **self.kwargs)
        except (psycopg.Error, OSError) as exc:
            raise translate(exc, f"cannot connect to PostgreSQL {self.where}") from exc
        try:
            self._configure(conn)
        except psycopg.Error as exc:
            conn.close()
            raise translate(exc, f"cannot connect to PostgreSQL {self.where}") from exc
        return conn

    def connect_listener(self) -> psycopg.Connection[tuple[Any, ...]]:
        """A new connection for the :class:`Listener`: to ``listen_conninfo``, without the
        store's statement settings (it runs ``LISTEN`` and waits).

        Raises:
            AuthenticationFailed / BackendUnavailable / InvalidArgument (see
            :func:`translate`).
        """
        try:
            return psycopg.connect(self.listen_conninfo, **self.listen_kwargs)
        except (psycopg.Error, OSError) as exc:
            raise translate(exc, f"cannot connect the listener of PostgreSQL "
                                 f"{self.where}") from exc

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """``pooling=session``: set the store's timeouts on a new connection (its own
        server session until it closes; PgBouncer resets it for the next client)."""
        if self.pooling == "session":
            conn.execute(_SET_SQL.format(local="false", **self.settings))

    def check_settings(self, conn: psycopg.Connection[Any]) -> None:
        """Refuse a connection on which the store's ``statement_timeout`` and
        ``lock_timeout`` are not in effect: a pooler between the store and the server
        dropped them (PgBouncer with ``ignore_startup_parameters = options``).

        Raises:
            InvalidArgument: naming transaction pooling and the ``pooling`` option.
            psycopg.Error: from the read (the caller translates it).
        """
        row = conn.execute(
            "SELECT (SELECT setting FROM pg_settings WHERE name = 'statement_timeout'), "
            "(SELECT setting FROM pg_settings WHERE name = 'lock_timeout')"
        ).fetchone()
        asked = (str(self.settings["statement_timeout"]), str(self.settings["lock_timeout"]))
        if row is None or tuple(row) != asked:
            got = ("?", "?") if row is None else row
            raise InvalidArgument(
                f"PostgreSQL {self.where}: the server runs with statement_timeout="
                f"{got[0]} ms and lock_timeout={got[1]} ms where the store asked for "
                f"{asked[0]} ms and {asked[1]} ms in the libpq startup parameter "
                "'options': a connection pooler dropped it (PgBouncer with "
                f"ignore_startup_parameters = options); {POOLER_HINT}"
            )

    def open_pool(self) -> None:
        """Start the pool (its first connection is opened within ``connect_timeout_s``).

        Raises:
            BackendUnavailable.
        """
        pool: psycopg_pool.ConnectionPool[psycopg.Connection[tuple[Any, ...]]] = (
            psycopg_pool.ConnectionPool(
                self.conninfo, kwargs=self.kwargs, min_size=1, max_size=self._pool_size,
                timeout=self.timeout_s, open=False, name=f"consensus-lease-{self.where}",
                configure=self._configure if self.pooling == "session" else None,
                reconnect_timeout=max(self.connect_timeout_s, 1.0) * 4,
            )
        )
        try:
            pool.open(wait=True, timeout=self.connect_timeout_s)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            with suppress(Exception):
                pool.close(timeout=0)
            raise translate(exc, f"cannot connect to PostgreSQL {self.where}") from exc
        self._pool = pool

    @contextmanager
    def conn(self, job_id: str | None = None) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        """A pooled autocommit connection. Errors inside are translated: a broken
        connection after a statement was sent becomes :class:`SentMaybe` (the caller
        reads back), everything else a library error."""
        pool = self._pool
        if pool is None:
            raise BackendUnavailable(f"PostgreSQL store {self.where} is closed", job_id=job_id)
        try:
            cm = pool.connection()
            conn = cm.__enter__()
        except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            raise translate(exc, f"PostgreSQL {self.where} unavailable", job_id) from exc
        try:
            yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            cm.__exit__(type(exc), exc, exc.__traceback__)
            if conn.closed or conn.broken:
                raise SentMaybe(exc) from exc
            raise translate(exc, f"PostgreSQL {self.where}", job_id) from exc
        except psycopg.Error as exc:
            cm.__exit__(type(exc), exc, exc.__traceback__)
            raise translate(exc, f"PostgreSQL {self.where}", job_id) from exc
        except BaseException as exc:
            cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        else:
            cm.__exit__(None, None, None)

    def call(self, job_id: str | None,
             run: Callable[[psycopg.Connection[tuple[Any, ...]]], T]) -> T:
        """``run(conn)`` on the hot connection if it is free, else on a pooled one, with
        the error translation of :meth:`conn` (``SentMaybe`` for a connection that
        broke). The hot path: no context-manager layers, no pool checkout when the hot
        connection is free (one thread at a time holds ``_hot_lock``)."""
        pool = self._pool
        if pool is None:
            raise BackendUnavailable(f"PostgreSQL store {self.where} is closed", job_id=job_id)
        hot = self._hot_ok and self._hot_lock.acquire(blocking=False)
        try:
            conn = self._hot if hot else None
            if conn is None:
                try:
                    conn = pool.getconn()
                except (psycopg.Error, psycopg_pool.PoolTimeout,
                        psycopg_pool.PoolClosed) as exc:
                    raise translate(exc, f"PostgreSQL {self.where} unavailable",
                                    job_id) from exc
                if hot:
                    self._hot_since = time.monotonic()
            try:
                return run(conn)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if conn.closed or conn.broken:
                    raise SentMaybe(exc) from exc
                raise translate(exc, f"PostgreSQL {self.where}", job_id) from exc
            except psycopg.Error as exc:
                raise translate(exc, f"PostgreSQL {self.where}", job_id) from exc
            finally:
                self._give_back(pool, conn, hot)
        finally:
            if hot:
                self._hot_lock.release()

    def _give_back(
        self, pool: psycopg_pool.ConnectionPool[psycopg.Connection[tuple[Any, ...]]],
        conn: psycopg.Connection[tuple[Any, ...]], hot: bool,
    ) -> None:
        """Keep ``conn`` as the hot connection (the caller holds ``_hot_lock``) if it is
        healthy, idle, young enough and the store still open; else return it to ``pool``
        (a broken one is discarded, an open transaction rolled back)."""
        if (hot and self._pool is not None and not conn.broken
                and conn.pgconn.transaction_status == _IDLE
                and time.monotonic() - self._hot_since < self.HOT_LIFETIME_S):
            self._hot = conn
            return
        if hot:
            self._hot = self._hot_cur = None
        pool.putconn(conn)

    def cursor(self, conn: psycopg.Connection[tuple[Any, ...]]) -> psycopg.Cursor[tuple[Any, ...]]:
        """A cursor on ``conn`` (inside :meth:`call`'s ``run``): the hot connection's is
        made once and reused (psycopg's ``Connection.execute`` makes one per statement)."""
        if conn is not self._hot:
            return conn.cursor()
        cur = self._hot_cur
        if cur is None:
            cur = self._hot_cur = conn.cursor()
        return cur

    def read(self, sql: str, params: Any = None, job_id: str | None = None) \
            -> list[tuple[Any, ...]]:
        """One read statement; a broken connection is retried once on another.

        Raises:
            BackendUnavailable.
        """
        for attempt in (1, 2):
            try:
                return self.call(job_id, lambda c: c.execute(sql, params).fetchall())
            except SentMaybe as exc:
                if attempt == 2:
                    raise translate(exc.cause, f"PostgreSQL {self.where}", job_id) from exc
        raise AssertionError("unreachable")

    def one(self, sql: str, params: Any = None, job_id: str | None = None) \
            -> tuple[Any, ...] | None:
        """The first row of :meth:`read` (``None``: no row)."""
        rows = self.read(sql, params, job_id)
        return rows[0] if rows else None

    def one_pooled(self, sql: str, params: Any = None) -> tuple[Any, ...] | None:
        """The first row of one idempotent statement (a keepalive) on a pooled connection,
        never the hot one; a broken connection is retried once on another.

        Raises:
            BackendUnavailable.
        """
        for attempt in (1, 2):
            try:
                with self.conn() as c:
                    return c.execute(sql, params).fetchone()
            except SentMaybe as exc:  # idempotent: once more on another connection
                if attempt == 2:
                    raise translate(exc.cause, f"PostgreSQL {self.where}") from exc
        raise AssertionError("unreachable")

    def on_own_connection(self, run: Callable[[psycopg.Connection[tuple[Any, ...]]], T],
                          what: str) -> T:
        """``run(conn)`` on a new connection outside the pool (:meth:`connect`), closed
        after it; a psycopg error is translated (``PostgreSQL <store>: <what>``).

        Raises:
            AuthenticationFailed / BackendUnavailable / InvalidArgument / what ``run``
            raises.
        """
        conn = self.connect()
        try:
            return run(conn)
        except psycopg.Error as exc:
            raise translate(exc, f"PostgreSQL {self.where}: {what}") from exc
        finally:
            conn.close()

    def listener_one(self, sql: str) -> tuple[Any, ...] | None:
        """The first row of ``sql`` on a new connection of the listener's
        (:meth:`connect_listener`), closed after it; ``None`` also when the statement
        fails there (no such table: another database).

        Raises:
            AuthenticationFailed / BackendUnavailable / InvalidArgument: cannot connect.
        """
        conn = self.connect_listener()
        try:
            return conn.execute(sql).fetchone()
        except psycopg.Error:
            return None
        finally:
            conn.close()

    def write(
        self, job_id: str | None, run: Callable[[psycopg.Connection[tuple[Any, ...]]], T],
        settle: Callable[[], T] | None = None,
    ) -> T:
        """Run a write; if the connection broke after it was sent, return ``settle()``
        (which reads back, on another connection, whether it was applied) or raise
        ``OutcomeUnknown`` without one.

        Raises:
            OutcomeUnknown / BackendUnavailable / what ``run`` and ``settle`` raise.
        """
        try:
            return self.call(job_id, run)
        except SentMaybe as exc:
            if settle is None:
                raise OutcomeUnknown(
                    f"PostgreSQL {self.where}: the connection broke after the request was "
                    f"sent; it may or may not have been applied ({exc})", job_id=job_id,
                ) from exc.cause
            try:
                return settle()
            except SentMaybe as again:
                raise OutcomeUnknown(
                    f"PostgreSQL {self.where}: the connection broke after the request was "
                    f"sent and reading back failed too ({again})", job_id=job_id,
                ) from again.cause

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        got = self._hot_lock.acquire(timeout=self.timeout_s)  # a call in flight ends first
        try:
            hot, self._hot, self._hot_cur = self._hot, None, None
            if hot is not None:
                with suppress(Exception):
                    pool.putconn(hot)
        finally:
            if got:
                self._hot_lock.release()
        with suppress(Exception):
            pool.close(timeout=1.0)


class Listener:
    """One connection that LISTENs on ``channel`` and calls ``on_notify()`` for every
    notification (and once after each reconnect, since notifications sent while it was
    away are lost). Runs a daemon thread; :meth:`close` stops it.

    Args:
        client: opens its connection.
        listen_sql: the ``LISTEN "channel"`` statement.
        on_notify: called from the listener thread; must not block.
    """

    RETRY_S = (0.05, 0.2, 1.0, 2.0)

    def __init__(self, client: Client, listen_sql: str, on_notify: Callable[[], None]) -> None:
        self._client = client
        self._listen_sql = listen_sql
        self._on_notify = on_notify
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._thread = threading.Thread(target=self._run, name="consensus-lease-pg-listen",
                                        daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until LISTEN is in place (or ``timeout_s``); ``False`` if not."""
        return self._ready.wait(timeout_s)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                conn = self._client.connect_listener()
            except LeaseError as exc:
                log.debug("postgresql listener cannot connect", extra={"error": repr(exc)})
                failures += 1
                self._stop.wait(self.RETRY_S[min(failures, len(self.RETRY_S)) - 1])
                continue
            self._conn = conn
            try:
                conn.execute(self._listen_sql)
                self._ready.set()
                failures = 0
                self._on_notify()  # what happened while we were not listening
                while not self._stop.is_set():
                    for _ in conn.notifies(timeout=0.5, stop_after=64):
                        self._on_notify()
            except (psycopg.Error, OSError) as exc:
                if not self._stop.is_set():
                    log.debug("postgresql listener lost", extra={"error": repr(exc)})
                self._ready.clear()
                failures += 1
                self._stop.wait(self.RETRY_S[min(failures, len(self.RETRY_S)) - 1])
            finally:
                with suppress(Exception):
                    conn.close()
                self._conn = None

    def close(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)
