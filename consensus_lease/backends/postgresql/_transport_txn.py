"""Transactional fencing on PostgreSQL, :meth:`consensus_lease.Lease.transaction`, on the
caller's psycopg connection (part of :mod:`._transport`: it translates psycopg's errors
there). What it guarantees is told in the package docstring
(:mod:`consensus_lease.backends.postgresql`, Transactional fencing).

``with lease.transaction(conn):`` opens a transaction on *your* psycopg connection and,
as its first statement (after setting ``lock_timeout_s``, if given), locks the lease's
job row. Inside a ``with conn.transaction():`` block of yours it is a savepoint (exactly
as a nested ``conn.transaction()``), and its effects and lock last until *your* block
ends. A transaction psycopg opened implicitly (a statement run on a connection without
``autocommit=True`` and not committed) is refused with ``InvalidArgument``: the block
would be a savepoint of it, commit nothing, and keep the row locked, so a ``complete``
after the block would wait for this very lock. The lock statement::

    SELECT ... FROM cl_jobs j JOIN cl_sessions s ...
    WHERE j.job_id = ... AND j.session_id = <this session> AND j.generation = <g>
      AND j.completed_at IS NULL AND s.expires_at > clock_timestamp()
      AND s.timeline = <the server's WAL timeline>
    FOR SHARE OF j

What it costs:

* One statement (a round trip) at the start of the block after psycopg's ``BEGIN`` (or
  ``SAVEPOINT``), four with ``lock_timeout_s`` (the setting read, set, the lock, the
  setting put back); one per ``tx.once``.
* No claim of the job succeeds while the block is open — also after the holder's TTL
  ran out, for as long as the transaction stays open (bound it with the server's
  ``idle_in_transaction_session_timeout`` if you must). A claim waits for the row lock up
  to the store connections' ``lock_timeout`` (``min(1 s, timeout_s / 2)``) and then
  answers "not claimable" (``None``); ``claim(wait_s=...)`` keeps trying until the block
  ends. Keep these transactions short.
* ``lock_timeout_s`` bounds how long taking the lock may wait (a claim or completion of
  the same job in flight): past it ``BackendUnavailable``, the transaction is rolled back,
  the lease is still held.
* Inside the block, do not end the same lease (``complete``, ``release``, ``fail``): they
  run on the store's own connection and would wait for this block's lock until
  ``timeout_s``. End it after the block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pgerrors

from ..._epoch import compose, split
from ...backend import OnceCheck, SessionHandle
from ...errors import InvalidArgument, OutcomeUnknown, StaleLeaseError
from . import _jobs
from ._layout import NOW, TIMELINE
from ._transport import translate

if TYPE_CHECKING:
    from ...record import ClaimResult
    from .driver import PostgresBackend

__all__ = ["lease_transaction"]


@contextmanager
def lease_transaction(
    backend: PostgresBackend, session: SessionHandle, job_id: str, claim: ClaimResult,
    conn: object, lock_timeout_s: float | None,
) -> Iterator[OnceCheck]:
    """See the module docstring. Yields ``tx.once``'s check.

    Raises:
        InvalidArgument: ``conn`` is not an open synchronous psycopg connection, or not to
            the lease store's database (another database, or another store in it); or
            it has a transaction open that is not a ``with conn.transaction():`` block
            of the caller (psycopg's implicit one: the block would commit nothing), or
            an aborted one. Nothing is sent; the lease is still held.
        StaleLeaseError / SessionExpired: not held at this generation; rolled back.
        BackendUnavailable: the lock was not granted within ``lock_timeout_s`` or the
            server did not answer; rolled back; the lease may still be held.
        OutcomeUnknown: the connection broke while committing: the effects may or may
            not have committed (if they did, before any later claim).
        What the block raises, unchanged (psycopg errors of your own statements too).
    """
    if not isinstance(conn, psycopg.Connection):
        raise InvalidArgument(
            "lease.transaction() needs a synchronous psycopg 3 Connection to the lease "
            f"store's database, not {type(conn).__name__}", job_id=job_id,
        )
    if conn.closed:
        raise InvalidArgument("lease.transaction(): the connection is closed", job_id=job_id)
    _check_open_transaction(conn, job_id)
    n = backend.names
    epoch, local = split(claim.generation, backend.epoch_shift)
    params = {"job": job_id, "sid": session.session_id, "gen": local, "epoch": epoch}
    lock = (
        f"SELECT m.identity, l.job_id IS NOT NULL FROM {n.meta} m LEFT JOIN ("
        f"SELECT j.job_id FROM {n.jobs} j JOIN {n.sessions} s ON s.session_id = j.session_id "
        "WHERE j.job_id = %(job)s AND j.session_id = %(sid)s AND j.generation = %(gen)s "
        f"AND j.epoch = %(epoch)s AND j.completed_at IS NULL AND s.expires_at > {NOW} "
        f"AND s.timeline = {TIMELINE} "
        "FOR SHARE OF j) l ON true WHERE m.id = 1"
    )
    try:
        tx = conn.transaction()
        tx.__enter__()
    except psycopg.Error as exc:
        raise translate(exc, "lease.transaction(): cannot begin", job_id) from exc
    try:
        _lock(conn, lock, params, backend, lock_timeout_s, job_id)
    except BaseException as exc:
        _quietly_exit(tx, exc)
        raise
    try:
        yield _once_check(conn, backend, job_id, claim.generation)
    except BaseException as exc:
        _quietly_exit(tx, exc)
        raise
    try:
        tx.__exit__(None, None, None)
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        if conn.broken or conn.closed:
            raise OutcomeUnknown(
                f"lease.transaction(): the connection broke while committing ({exc}); the "
                "effects may or may not have committed (if they did, before any later "
                "claim of the job)", job_id=job_id, generation=claim.generation,
            ) from exc
        raise


def _once_check(conn: psycopg.Connection[Any], backend: PostgresBackend, job_id: str,
                generation: int) -> OnceCheck:
    """``tx.once`` on ``conn`` (package docstring: once per job)."""
    prepare = False if backend.pooling == "transaction" else None
    insert = (f"INSERT INTO {backend.names.effects} (job_id, effect_id, generation) "
              "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING")

    def once(effect_id: str) -> bool:
        try:
            cursor = conn.execute(insert, (job_id, effect_id, generation), prepare=prepare)
        except psycopg.Error as exc:
            raise translate(exc, f"tx.once({effect_id!r})", job_id) from exc
        return cursor.rowcount == 1

    return once


def _check_open_transaction(conn: psycopg.Connection[Any], job_id: str) -> None:
    """Refuse a connection whose transaction the block could not commit.

    psycopg (without ``autocommit=True``) begins a transaction at a connection's first
    statement and keeps it open until ``commit()``. A block entered then would only be
    a savepoint of it: nothing would commit at the block's end, and the lease's row lock
    would stay taken, so a ``complete``/``release`` after the block would wait for it and
    fail with a lock timeout. Nesting in a transaction the caller opened on purpose with
    ``with conn.transaction():`` is allowed (it commits at that block's end). psycopg has
    no public "inside ``conn.transaction()``" flag: this reads its ``_num_transactions``
    counter (``tests/test_lease_transaction.py`` checks psycopg still has it; if a later
    psycopg drops it, every open transaction is refused, never silently allowed).

    Raises:
        InvalidArgument: an implicit transaction is open, or the transaction is aborted.
    """
    status = conn.info.transaction_status
    if status == psycopg.pq.TransactionStatus.INERROR:
        raise InvalidArgument(
            "lease.transaction(): the connection's transaction is aborted by an earlier "
            "error: roll it back first (conn.rollback())", job_id=job_id,
        )
    if status == psycopg.pq.TransactionStatus.INTRANS \
            and not getattr(conn, "_num_transactions", 0):
        raise InvalidArgument(
            "lease.transaction(): the connection already has a transaction open (psycopg "
            "begins one at the first statement unless autocommit=True), so the block would "
            "be only a savepoint: nothing would commit at its end, and lease.complete() "
            "after it would wait for this transaction's lock on the job's row. Call "
            "conn.commit() (or rollback()) before the block, connect with "
            "autocommit=True, or nest the block on purpose inside "
            "'with conn.transaction():' (it then commits when that block ends)",
            job_id=job_id,
        )


def _lock(
    conn: psycopg.Connection[Any], sql: str, params: dict[str, Any], backend: PostgresBackend,
    lock_timeout_s: float | None, job_id: str,
) -> None:
    """Take the row lock (see the module docstring) or raise."""
    # Behind a transaction pooler nothing is prepared on the caller's connection either:
    # a prepared statement would stay on a server connection other clients then use.
    prepare = False if backend.pooling == "transaction" else None
    try:
        previous = None
        if lock_timeout_s is not None:
            previous = conn.execute("SELECT current_setting('lock_timeout')",
                                    prepare=prepare).fetchone()
            conn.execute("SELECT set_config('lock_timeout', %s, true)",
                         (f"{max(1, int(lock_timeout_s * 1000))}ms",), prepare=prepare)
        row = conn.execute(sql, params, prepare=prepare).fetchone()
        if previous is not None:
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (previous[0],),
                         prepare=prepare)
    except pgerrors.UndefinedTable as exc:
        raise InvalidArgument(
            f"lease.transaction(): the connection's database has no consensus_lease store "
            f"in schema {backend.names.schema!r}: connect to the lease store's database",
            job_id=job_id,
        ) from exc
    except pgerrors.SerializationFailure as exc:
        raise StaleLeaseError(
            f"lease.transaction(): {job_id!r} changed after this transaction's snapshot "
            "(REPEATABLE READ / SERIALIZABLE): it was claimed or ended meanwhile",
            job_id=job_id, generation=_token(params, backend),
        ) from exc
    except psycopg.Error as exc:
        raise translate(exc, "lease.transaction(): locking the lease row", job_id) from exc
    if row is None or row[0] != backend.identity:
        raise InvalidArgument(
            "lease.transaction(): the connection is to another consensus_lease store than "
            f"the lease's (schema {backend.names.schema!r} of another database): effects "
            "and lease must be in the same database", job_id=job_id,
        )
    if not row[1]:
        raise _jobs.refusal(backend, SessionHandle(str(params["sid"]), "", 0.0), job_id,
                            _token(params, backend))


def _token(params: dict[str, Any], backend: PostgresBackend) -> int:
    """The lease's token from the lock statement's parameters."""
    return compose(int(params["epoch"]), int(params["gen"]), backend.epoch_shift)


def _quietly_exit(tx: Any, exc: BaseException) -> None:
    """Roll the transaction (or savepoint) back, keeping ``exc`` the error raised."""
    with suppress(psycopg.Error):  # a broken connection: nothing committed; exc is raised
        tx.__exit__(type(exc), exc, exc.__traceback__)
