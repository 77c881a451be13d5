"""The SQLite driver's connection to its file: opening it, this process's turn on it
(threads, then SQLite's busy timeout, within one ``busy_timeout_s``), its transactions,
and the translation of ``sqlite3``'s exceptions into :mod:`consensus_lease.errors`.

The only module family of the driver (with :mod:`._transport_wal` and
:mod:`._transport_txn`) that names ``sqlite3``'s exceptions: the other modules run their
statements through :class:`Transport`, whose failures arrive as ``BackendUnavailable``.
What the transactions are for is told in the package docstring
(:mod:`consensus_lease.backends.sqlite`).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote

from ...errors import BackendUnavailable, InvalidArgument, StoreRegressed

if TYPE_CHECKING:
    from ._tokens_history import History

__all__ = ["Transport", "attempt", "broken", "connect", "not_a_store_unless"]

T = TypeVar("T")
P = ParamSpec("P")


def connect(path: str, busy_timeout_s: float, create: bool) -> sqlite3.Connection:
    """Open the file; without ``create`` only if it exists (``mode=rw``: SQLite
    itself refuses to create it, so a file deleted meanwhile is not made either)."""
    target, uri = path, False
    if not create:
        if not os.path.isfile(path):
            raise InvalidArgument(
                f"no SQLite store at {path!r} ({os.path.abspath(path)}): the file does "
                f"not exist and create=false; check the URL (sqlite:////abs/path.db, "
                f"sqlite:///relative.db), or open it with create=true"
            )
        target, uri = f"file:{quote(os.path.abspath(path))}?mode=rw", True
    try:
        return sqlite3.connect(target, timeout=busy_timeout_s, isolation_level=None,
                               check_same_thread=False, uri=uri)
    except sqlite3.Error as exc:
        raise BackendUnavailable(f"cannot open SQLite database {path!r}: {exc}") from exc


@contextmanager
def not_a_store_unless(create: bool, path: str) -> Iterator[None]:
    """A ``sqlite3.DatabaseError`` in the block (reading what the file holds): raised as
    it is with ``create`` (the caller's :meth:`Transport.translate` makes it
    ``BackendUnavailable``), else ``InvalidArgument``: the file is no store."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if create:
            raise
        raise InvalidArgument(
            f"{path!r} is not a consensus_lease store ({exc}) and create=false; "
            f"nothing was changed"
        ) from exc


def broken(message: str) -> Exception:
    """The error of a file that contradicts what a statement just did (raised where a
    ``sqlite3`` error would be, and translated the same way: ``BackendUnavailable``)."""
    return sqlite3.DatabaseError(message)


def attempt(call: Callable[[], T]) -> T | sqlite3.Error:
    """``call()``, or the ``sqlite3`` error it raised, returned (for the threads that
    log a failure and carry on: the change watch)."""
    try:
        return call()
    except sqlite3.Error as exc:
        return exc


class Transport:
    """The store object's one connection to the file and this process's turn on it.

    Args:
        path: the database file, or ``":memory:"``.
        busy_timeout_s: the budget of one operation's wait for the file.
        create: create the file if missing.
        history: the store's marks (:mod:`._tokens_history`): a transaction with
            ``check_file`` first checks the file is the one opened.

    Raises:
        InvalidArgument: ``create`` is false and there is no file.
        BackendUnavailable: the file cannot be opened.
    """

    def __init__(self, path: str, busy_timeout_s: float, create: bool,
                 history: History) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self.history = history
        self.lock = threading.Lock()
        self.on_regressed: Callable[[], None] = lambda: None
        """Called with the turn held, outside a transaction, after a transaction ended
        by ``StoreRegressed`` (the driver writes the regression marker)."""
        self.db = connect(path, busy_timeout_s, create)
        self.busy_ms = int(busy_timeout_s * 1000)  # the connection's busy_timeout now

    def unavailable(self, exc: sqlite3.DatabaseError, job_id: str | None) -> BackendUnavailable:
        """``exc`` as the ``BackendUnavailable`` an operation raises."""
        what = "unavailable" if isinstance(exc, sqlite3.OperationalError) else "unusable"
        return BackendUnavailable(f"SQLite database {self.path!r} {what}: {exc}", job_id=job_id)

    @contextmanager
    def translate(self, job_id: str | None = None) -> Iterator[None]:
        """``sqlite3`` errors in the block raised as :meth:`unavailable`."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise self.unavailable(exc, job_id) from exc

    def acquire(self, job_id: str | None) -> None:
        """This process's turn on the connection, within one ``busy_timeout_s`` budget:
        waiting for the other threads of this process, then (SQLite's busy timeout, set
        to what is left) for other processes' locks. The caller releases ``lock``."""
        full_ms = int(self.busy_timeout_s * 1000)
        if self.lock.acquire(blocking=False):  # no other thread: the whole budget
            left_ms = full_ms
        else:
            deadline = time.monotonic() + self.busy_timeout_s
            if not self.lock.acquire(timeout=self.busy_timeout_s):
                raise BackendUnavailable(
                    f"SQLite database {self.path!r}: other threads of this process kept it "
                    f"busy for busy_timeout_s ({self.busy_timeout_s:g} s)", job_id=job_id,
                )
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
        if abs(left_ms - self.busy_ms) > 50:  # waited for a thread: less is left
            try:
                self.db.execute(f"PRAGMA busy_timeout = {left_ms}")
            except sqlite3.DatabaseError as exc:
                self.lock.release()
                raise self.unavailable(exc, job_id) from exc
            self.busy_ms = left_ms

    @contextmanager
    def turn(self, job_id: str | None = None) -> Iterator[None]:
        """:meth:`acquire` for a ``with`` block (sqlite3 errors in it translated)."""
        self.acquire(job_id)
        try:
            with self.translate(job_id):
                yield
        finally:
            self.lock.release()

    @contextmanager
    def transaction(
        self, job_id: str | None = None, *, check_file: bool = False
    ) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: takes the write lock up front, so the
        compare and the write below cannot interleave with another process. With
        ``check_file``, first StoreRegressed if the path now names another file."""
        with self.turn(job_id), self.translate(job_id):
            if check_file:
                self.history.check_file()
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except StoreRegressed:
                self.db.execute("ROLLBACK")
                self.on_regressed()
                raise
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def best_effort(self, *statements: tuple[str, tuple[Any, ...]]) -> sqlite3.Error | None:
        """``statements`` in one ``BEGIN IMMEDIATE`` transaction (the turn held, outside
        a transaction); the ``sqlite3`` error that stopped it, returned (rolled back)."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self.db.execute(sql, params)
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            return exc
        return None

    def read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One reading statement (its own read transaction: one snapshot of the file)."""
        with self.turn(), self.translate():
            return self.db.execute(sql, params).fetchall()

    def write(
        self, sql: str, params: tuple[Any, ...], job_id: str | None = None
    ) -> list[tuple[Any, ...]]:
        """One writing statement as its own transaction (SQLite's autocommit: the write
        lock is taken when it starts, waiting up to the busy timeout, and it commits when
        it has returned every row). For a compare-and-write whose ``WHERE`` is the whole
        check: no ``BEGIN``/``COMMIT`` statements. Never inside :meth:`transaction`."""
        self.acquire(job_id)  # no context managers on the hot path: each costs µs
        try:
            return self.db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self.unavailable(exc, job_id) from exc
        finally:
            self.lock.release()

    def run(
        self, step: Callable[Concatenate[sqlite3.Connection, P], T], job_id: str | None,
        *args: P.args, **kwargs: P.kwargs,
    ) -> T:
        """``step(db, *args)`` on this process's turn, outside a transaction (each of its
        statements its own, as :meth:`write`'s), its ``sqlite3`` errors translated; no
        context managers (the hot path)."""
        self.acquire(job_id)
        try:
            return step(self.db, *args, **kwargs)
        except sqlite3.DatabaseError as exc:
            raise self.unavailable(exc, job_id) from exc
        finally:
            self.lock.release()

    def close(self) -> None:
        """Close the connection (after the turn of any thread still on it)."""
        with self.lock:
            with suppress(sqlite3.Error):  # a broken handle: nothing left to release
                self.db.close()
