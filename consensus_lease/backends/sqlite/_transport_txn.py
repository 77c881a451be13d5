"""Transactional fencing on SQLite: :meth:`consensus_lease.Lease.transaction`, on the
caller's own ``sqlite3`` connection (hence part of :mod:`._transport`: its ``sqlite3``
errors are translated here). The package docstring
(:mod:`consensus_lease.backends.sqlite`) places it in the protocol; this is the detail.

When the effect's destination is the store's own file, the effect and the ownership
check can be one SQLite transaction. ``with lease.transaction(conn) as tx:`` runs on
*your* ``sqlite3`` connection to the store's file (any tables of yours in it):

1. ``BEGIN IMMEDIATE``: takes the database's write lock up front (waiting up to
   ``lock_timeout_s``, else the connection's busy timeout), so from here until the
   transaction ends no other connection — no claim, no renewal, no completion, of any
   job — can commit (https://www.sqlite.org/lang_transaction.html);
2. checks the hold in the same transaction, on the database's clock::

       SELECT 1 FROM cl_jobs j JOIN cl_sessions s ON s.session_id = j.session_id
       WHERE j.job_id = ? AND j.session_id = <this session> AND j.generation = <g>
         AND j.epoch = <e> AND j.completed_at IS NULL AND j.failed_at IS NULL
         AND s.expires_at > <now>

   and otherwise rolls back and raises ``StaleLeaseError`` / ``SessionExpired`` (the
   store's own refusal rule, :func:`._jobs.refusal`);
3. runs the block; ``tx.once(effect_id)`` is ``INSERT OR IGNORE INTO cl_effects`` in
   the same transaction (``True`` iff it inserted: the key is ``(job_id, effect_id)``);
4. ``COMMIT`` at the end of the block (``ROLLBACK`` on an error). A block that commits
   or rolls back itself (``conn.commit()`` inside it) is told apart by a savepoint the
   commit ends, and ``InvalidArgument`` says what became of the writes after it: rolled
   back (``sqlite3``'s default mode opened a transaction for them), or already
   committed without the check (``isolation_level=None`` commits each statement).

What it guarantees: the block runs only if this session held the job at this
generation when the write lock was taken, and its effects commit before any later
claim (which needs the write lock): a holder paused past its TTL inside the block that
resumes still commits, and the takeover comes strictly after — it sees the effects and
the ``cl_effects`` records, so ``tx.once`` is ``True`` in exactly one committed
transaction per ``(job_id, effect_id)``.

What it costs: the write lock is the whole store's. While a block is open every write
of every process to the store waits (up to its busy timeout, then
``BackendUnavailable``), the block's own session's keepalive included: keep blocks to
a few milliseconds, never a network call. Do not end the lease inside the block.
Nesting in a transaction of yours is not possible (SQLite has no ``BEGIN`` inside a
transaction): a connection with a transaction open is refused with ``InvalidArgument``.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

from ..._epoch import split
from ...backend import OnceCheck, SessionHandle
from ...errors import BackendUnavailable, InvalidArgument
from . import _jobs
from ._layout import NOW

if TYPE_CHECKING:
    from ...record import ClaimResult
    from .driver import SqliteBackend

__all__ = ["lease_transaction"]

_MARK = "consensus_lease_block"
"""A savepoint taken after the hold check and released before ``COMMIT``: a commit or
rollback inside the block ends it, so the block's own end can tell (``RELEASE`` then
fails) instead of committing writes made after it without the check."""

_HELD = (
    "SELECT 1 FROM cl_jobs j JOIN cl_sessions s ON s.session_id = j.session_id "
    "WHERE j.job_id = ? AND j.session_id = ? AND j.generation = ? AND j.epoch = ? "
    f"AND j.completed_at IS NULL AND j.failed_at IS NULL AND s.expires_at > {NOW}"
)


@contextmanager
def lease_transaction(
    backend: SqliteBackend, session: SessionHandle, job_id: str, claim: ClaimResult,
    conn: object, lock_timeout_s: float | None,
) -> Iterator[OnceCheck]:
    """See the module docstring. Yields ``tx.once``'s check.

    Raises:
        InvalidArgument: ``conn`` is not an open ``sqlite3.Connection`` to the store's
            file, cannot write it (read-only), or has a transaction open (or
            ``autocommit=False``, Python 3.12+); nothing was done; the lease is still
            held.
        StaleLeaseError / SessionExpired: not held at this generation; rolled back.
        BackendUnavailable: the write lock was not granted within ``lock_timeout_s``
            (the busy timeout), or the file failed; rolled back; the lease may still be
            held.
        InvalidArgument: the block committed or rolled back the transaction itself;
            what it wrote after that was rolled back, or with ``isolation_level=None``
            committed unchecked (the message says which); the lease is still held.
        What the block raises, unchanged (``sqlite3`` errors of your own statements too).
    """
    db = _checked(conn, backend, job_id)
    epoch, local = split(claim.generation, backend.epoch_shift)
    _begin(db, lock_timeout_s, backend, job_id)
    try:
        held = db.execute(_HELD,
                          (job_id, session.session_id, local, epoch)).fetchone()
        if held is None:
            raise _jobs.refusal(backend, db, session, job_id, claim.generation)
        db.execute(f"SAVEPOINT {_MARK}")
    except sqlite3.DatabaseError as exc:
        _rollback(db)
        raise backend._transport.unavailable(exc, job_id) from exc
    except BaseException:
        _rollback(db)
        raise
    try:
        yield _once_check(db, backend, job_id, claim.generation)
    except BaseException:
        _rollback(db)
        raise
    try:
        db.execute(f"RELEASE {_MARK}")
    except sqlite3.OperationalError as exc:  # "no such savepoint": the block ended it
        after = ("was rolled back" if db.in_transaction else
                 "was committed statement by statement WITHOUT the hold check "
                 "(isolation_level=None)")
        _rollback(db)
        raise InvalidArgument(
            "lease.transaction(): the block ended the transaction itself (conn.commit() "
            "or conn.rollback() inside it): what it wrote before that was committed (or "
            f"rolled back) under the hold check; what it wrote after {after}. The block "
            "commits at its end: do not commit inside it", job_id=job_id,
            generation=claim.generation,
        ) from exc
    try:
        db.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        _rollback(db)
        raise BackendUnavailable(
            f"lease.transaction(): SQLite could not commit ({exc}); rolled back, nothing "
            "committed", job_id=job_id, generation=claim.generation,
        ) from exc


def _checked(conn: object, backend: SqliteBackend, job_id: str) -> sqlite3.Connection:
    """``conn`` if it is an open connection to the store's file, outside a transaction."""
    if not isinstance(conn, sqlite3.Connection):
        raise InvalidArgument(
            "lease.transaction() on a sqlite:// store needs a sqlite3.Connection to the "
            f"store's file {backend.path!r}, not {type(conn).__name__}", job_id=job_id,
        )
    try:
        in_transaction = conn.in_transaction
        files = conn.execute("PRAGMA database_list").fetchall()
    except sqlite3.ProgrammingError as exc:
        raise InvalidArgument(f"lease.transaction(): {exc}", job_id=job_id) from exc
    except sqlite3.DatabaseError as exc:
        raise backend._transport.unavailable(exc, job_id) from exc
    if in_transaction or getattr(conn, "autocommit", None) is False:
        raise InvalidArgument(
            "lease.transaction(): the connection has a transaction open (another "
            "lease.transaction() block on it, or the one sqlite3 opens before an "
            "INSERT/UPDATE/DELETE unless isolation_level=None): end it first (leave the "
            "block; conn.commit() or rollback()); the block begins and commits its own",
            job_id=job_id,
        )
    main = next((row[2] for row in files if row[1] == "main"), "")
    if not main or not backend.path or backend.path == ":memory:" or not os.path.exists(
            backend.path) or not os.path.samefile(main, backend.path):
        raise InvalidArgument(
            f"lease.transaction(): the connection is to {main or 'an in-memory database'!r}"
            f", not to the lease store's file {backend.path!r}: effects and lease must be "
            "in the same file", job_id=job_id,
        )
    return conn


def _begin(db: sqlite3.Connection, lock_timeout_s: float | None, backend: SqliteBackend,
           job_id: str) -> None:
    """``BEGIN IMMEDIATE``, waiting at most ``lock_timeout_s`` if given."""
    try:
        previous = None
        if lock_timeout_s is not None:
            previous = int(db.execute("PRAGMA busy_timeout").fetchone()[0])
            db.execute(f"PRAGMA busy_timeout = {max(1, int(lock_timeout_s * 1000))}")
        try:
            db.execute("BEGIN IMMEDIATE")
        finally:
            if previous is not None:
                db.execute(f"PRAGMA busy_timeout = {previous}")
        # a read-only connection (mode=ro) begins fine and fails at its first write:
        # a write of no row tells now, before the block runs
        db.execute("UPDATE cl_effects SET generation = generation WHERE 0")
    except sqlite3.DatabaseError as exc:
        _rollback(db)
        if "readonly" in str(exc):  # mode=ro, or a file it may not write: not transient
            raise InvalidArgument(
                f"lease.transaction(): the connection cannot write the store's file "
                f"{backend.path!r} ({exc}): open it read-write; nothing was done",
                job_id=job_id,
            ) from exc
        raise BackendUnavailable(
            f"lease.transaction(): SQLite store {backend.path!r}: the write lock was not "
            f"granted ({exc}); nothing was done", job_id=job_id,
        ) from exc


def _once_check(db: sqlite3.Connection, backend: SqliteBackend, job_id: str,
                generation: int) -> OnceCheck:
    def once(effect_id: str) -> bool:
        try:
            cursor = db.execute(
                "INSERT OR IGNORE INTO cl_effects (job_id, effect_id, generation) "
                "VALUES (?, ?, ?)", (job_id, effect_id, generation))
        except sqlite3.DatabaseError as exc:
            raise backend._transport.unavailable(exc, job_id) from exc
        return cursor.rowcount == 1

    return once


def _rollback(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        with suppress(sqlite3.Error):
            db.execute("ROLLBACK")
