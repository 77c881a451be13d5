"""Jobs of the SQLite driver: renew, complete, release and fail (one or a batch), requeue
and ``set_value`` of a held job, each an ``UPDATE`` whose ``WHERE`` is the owner +
generation compare; reading records; and :func:`refusal`, the one rule that turns a
compare the store refused into the error raised. Claims are :mod:`._jobs_claim`; the
protocol is told in the package docstring (:mod:`consensus_lease.backends.sqlite`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._election import ELECTION_PREFIX
from ..._epoch import compose, split
from ...errors import LeaseError, SessionExpired, StaleLeaseError
from ...record import ClaimResult, LeaseRecord
from .._sql_row import requeued
from ._layout import ALIVE, EXHAUSTED, NOT_ELECTION, NOW, SELECT_RECORD, alive, get_in, to_record

if TYPE_CHECKING:
    import sqlite3

    from ...backend import CompleteItem, FailItem, ReleaseItem, SessionHandle
    from .driver import SqliteBackend

COMPLETE_SQL = (
    f"UPDATE cl_jobs SET completed_at = {NOW}, completed_session = session_id, "
    "result = ?, session_id = NULL, value = NULL "
    "WHERE job_id = ? AND session_id = ? AND generation = ? AND epoch = ? "
    f"AND completed_at IS NULL AND {ALIVE}"
)
"""The complete: the owner + generation compare and the write in one statement (bind
result, job id, session id, generation, epoch, session id). No ``RETURNING``: what the
record needs from the row is handed over by :data:`COMPLETED_CAPTURE`."""


RELEASE_SQL = (
    "UPDATE cl_jobs SET session_id = NULL, owner = NULL, value = NULL "
    "WHERE job_id = ? AND session_id = ? AND generation = ? AND epoch = ? "
    f"AND completed_at IS NULL AND {ALIVE} RETURNING 1"
)
"""The release: the owner + generation compare and the end of the hold in one
statement (bind job id, session id, generation, epoch, session id)."""

FAIL_SQL = (
    f"UPDATE cl_jobs SET session_id = NULL, value = NULL, error = ?, "
    f"failed_at = CASE WHEN {EXHAUSTED} THEN {NOW} END, "
    f"not_before = CASE WHEN NOT {EXHAUSTED} AND ? > 0 THEN {NOW} + ? END "
    "WHERE job_id = ? AND session_id = ? AND generation = ? AND epoch = ? "
    f"AND completed_at IS NULL AND {ALIVE} RETURNING 1"
)
"""The fail: the compare and the write (FAILED if the attempts are used up, else a retry
delay on the database's clock) in one statement (bind error, retry_in_s twice, job id,
session id, generation, epoch, session id)."""

REPEATED = (
    "SELECT 1 FROM cl_jobs WHERE job_id = ? AND generation = ? AND epoch = ? "
    "AND completed_session = ?"
)
"""A refused complete's job was completed by this session at this generation already
(bind job id, generation, epoch, session id): the repeat is answered, not refused."""


def refusal(
    backend: SqliteBackend, db: sqlite3.Connection, session: SessionHandle, job_id: str,
    generation: int,
) -> LeaseError:
    """Explain why an owner+generation compare failed (inside the same transaction):
    ``SessionExpired`` while the job is still at ``generation`` with no other holder
    and the session is over (expired, or closed: ``close_session`` clears a queued
    job's holder), else ``StaleLeaseError`` (see
    :meth:`consensus_lease.backend.Backend.complete`)."""
    row = db.execute(
        "SELECT generation, session_id, completed_at, epoch FROM cl_jobs WHERE job_id = ?",
        (job_id,),
    ).fetchone()
    current = None if row is None else compose(int(row[3]), int(row[0]), backend.epoch_shift)
    if (
        row is not None
        and current == generation
        and row[1] in (session.session_id, None)
        and row[2] is None
        and not alive(db, session.session_id)
    ):
        return SessionExpired(
                f"session {session.session_id} expired in the store",
                job_id=job_id,
                generation=generation,
            )
    what = "completed" if row is not None and row[2] is not None else "held or released"
    return StaleLeaseError(
        f"{job_id!r} is not held by session {session.session_id} at generation "
        f"{generation}: the store has generation {current} ({what})",
        job_id=job_id,
        generation=generation,
        current_generation=current,
    )


def renew(
    backend: SqliteBackend, session: SessionHandle, job_id: str, claim: ClaimResult
) -> float:
    """Extend the session iff it holds ``job_id`` at the claim's generation: one
    ``UPDATE`` of the session's row, its own transaction (see :meth:`Backend.renew`);
    only a refused one takes a ``BEGIN IMMEDIATE`` transaction to tell why.

    Raises:
        StaleLeaseError / SessionExpired / BackendUnavailable.
    """
    generation = claim.generation
    epoch, local = split(generation, backend.epoch_shift)
    rows = backend._transport.write(
        f"UPDATE cl_sessions SET expires_at = {NOW} + ttl_s "
        f"WHERE session_id = ? AND expires_at > {NOW} AND EXISTS (SELECT 1 FROM cl_jobs j "
        "WHERE j.job_id = ? AND j.session_id = ? AND j.generation = ? AND j.epoch = ? "
        "AND j.completed_at IS NULL) RETURNING ttl_s",
        (session.session_id, job_id, session.session_id, local, epoch), job_id,
    )
    if not rows:
        with backend._transport.transaction(job_id) as db:
            raise refusal(backend, db, session, job_id, generation)
    return float(rows[0][0])


def complete(
    backend: SqliteBackend, session: SessionHandle, job_id: str, claim: ClaimResult,
    result: bytes,
) -> LeaseRecord:
    """Complete the job (see :meth:`Backend.complete`): one ``UPDATE`` (its own
    transaction) whose ``WHERE`` makes the owner + generation compare; the record is
    the row that statement wrote, handed over by :data:`~._layout.COMPLETED_CAPTURE`
    (read back by a second statement only if it was not). Only a refused one reads back,
    in a ``BEGIN IMMEDIATE`` transaction, whether this session completed it already
    (idempotent) or why not.

    Raises:
        StaleLeaseError / SessionExpired / BackendUnavailable.
    """
    epoch, local = split(claim.generation, backend.epoch_shift)
    applied, row = backend._transport.run(_complete_alone, job_id, backend, session, job_id,
                                          local, epoch, result)
    if row is not None and row[0] == job_id:
        _, owner, completed_at, failed_at, attempt, error, max_attempts = row
        record = to_record((job_id, owner, None, local, completed_at, result, 0, failed_at,
                            attempt, error, None, max_attempts, epoch, None),
                           backend.epoch_shift)
    elif applied:  # completed, but its row was not handed over: read it back
        found = get(backend, job_id)
        assert found is not None
        record = found
    else:
        with backend._transport.transaction(job_id) as db:
            again = db.execute(REPEATED, (job_id, local, epoch, session.session_id)).fetchone()
            if again is None:
                raise refusal(backend, db, session, job_id, claim.generation)
            found = get_in(db, job_id, backend.epoch_shift)
        assert found is not None
        record = found
    backend.wake_subscribers()
    return record


def _complete_alone(
    db: sqlite3.Connection, backend: SqliteBackend, session: SessionHandle, job_id: str,
    local: int, epoch: int, result: bytes,
) -> tuple[bool, tuple[Any, ...] | None]:
    """:data:`COMPLETE_SQL` as a transaction of its own (the turn held): whether it
    applied, and the row the trigger handed over (``None``: not handed over)."""
    captured = backend._completed
    try:
        captured.clear()
        applied = db.execute(
            COMPLETE_SQL,
            (result, job_id, session.session_id, local, epoch, session.session_id),
        ).rowcount == 1
        return applied, captured[0] if applied and len(captured) == 1 else None
    finally:
        captured.clear()


def complete_in(
    backend: SqliteBackend, db: sqlite3.Connection, session: SessionHandle, job_id: str,
    claim: ClaimResult, result: bytes,
) -> LeaseRecord | LeaseError:
    """:data:`COMPLETE_SQL` for one job inside an open transaction: the COMPLETED
    record (also for a repeat of this session's completion), or the refusal
    :meth:`Backend.complete` would raise, returned."""
    epoch, local = split(claim.generation, backend.epoch_shift)
    try:
        applied = db.execute(
            COMPLETE_SQL,
            (result, job_id, session.session_id, local, epoch, session.session_id),
        ).rowcount == 1
    finally:
        backend._completed.clear()  # the row handed over is read back below instead
    if not applied:
        again = db.execute(REPEATED, (job_id, local, epoch, session.session_id)).fetchone()
        if again is None:
            return refusal(backend, db, session, job_id, claim.generation)
    found = get_in(db, job_id, backend.epoch_shift)
    assert found is not None
    if isinstance(result, bytes) and found.result is not result and found.result == result:
        # the caller's bytes, not the copy read back: a batch of large results keeps
        # one copy of each, not two
        found = dataclasses.replace(found, result=result)
    return found


def complete_many(
    backend: SqliteBackend, session: SessionHandle, items: Sequence[CompleteItem]
) -> list[LeaseRecord | LeaseError]:
    """Every item by the statement :func:`complete` runs, in one ``BEGIN
    IMMEDIATE`` transaction (at most ``max_complete_batch`` items): each its own
    outcome, all committed at once.

    Raises:
        BackendUnavailable: nothing of the batch applied (the transaction rolled back).
    """
    if not items:
        return []
    with backend._transport.transaction(items[0][0]) as db:
        outcomes = [complete_in(backend, db, session, job_id, claim, result)
                    for job_id, claim, result in items]
    backend.wake_subscribers()
    return outcomes


def release(
    backend: SqliteBackend, session: SessionHandle, job_id: str, claim: ClaimResult
) -> None:
    """Release the job: :data:`RELEASE_SQL` (its own transaction), whose ``WHERE`` makes
    the owner + generation compare; only a refused one takes a ``BEGIN IMMEDIATE``
    transaction to tell why.

    Raises:
        StaleLeaseError / SessionExpired / BackendUnavailable.
    """
    generation = claim.generation
    epoch, local = split(generation, backend.epoch_shift)
    rows = backend._transport.write(
        RELEASE_SQL, (job_id, session.session_id, local, epoch, session.session_id), job_id)
    if not rows:
        with backend._transport.transaction(job_id) as db:
            raise refusal(backend, db, session, job_id, generation)
    backend.wake_subscribers()


def release_many(
    backend: SqliteBackend, session: SessionHandle, items: Sequence[ReleaseItem]
) -> list[LeaseError | None]:
    """Every item by :data:`RELEASE_SQL`, in one ``BEGIN IMMEDIATE`` transaction (at
    most ``max_end_batch`` items): each its own outcome (``None``: released; a refusal
    explained by :func:`refusal` in the same transaction), all committed at once.

    Raises:
        BackendUnavailable: nothing of the batch applied (the transaction rolled back).
    """
    if not items:
        return []
    outcomes: list[LeaseError | None] = []
    with backend._transport.transaction(items[0][0]) as db:
        for job_id, claim in items:
            epoch, local = split(claim.generation, backend.epoch_shift)
            row = db.execute(RELEASE_SQL, (job_id, session.session_id, local, epoch,
                                           session.session_id)).fetchone()
            outcomes.append(None if row is not None else
                            refusal(backend, db, session, job_id, claim.generation))
    backend.wake_subscribers()
    return outcomes


def set_value(
    backend: SqliteBackend, session: SessionHandle, job_id: str, claim: ClaimResult,
    value: bytes,
) -> None:
    """Write an election leader's value (see :meth:`Backend.set_value`): one ``BEGIN
    IMMEDIATE`` transaction, an ``UPDATE`` whose ``WHERE`` makes the owner + generation
    compare of ``release`` (and, if refused, the read of why).

    Raises:
        StaleLeaseError / SessionExpired / BackendUnavailable.
    """
    epoch, local = split(claim.generation, backend.epoch_shift)
    with backend._transport.transaction(job_id) as db:
        row = db.execute(
            "UPDATE cl_jobs SET value = ? "
            "WHERE job_id = ? AND session_id = ? AND generation = ? AND epoch = ? "
            f"AND completed_at IS NULL AND {ALIVE} RETURNING 1",
            (value, job_id, session.session_id, local, epoch, session.session_id),
        ).fetchone()
        if row is None:
            raise refusal(backend, db, session, job_id, claim.generation)
    backend.wake_subscribers()


def fail(
    backend: SqliteBackend, session: SessionHandle, job_id: str, claim: ClaimResult,
    error: str, retry_in_s: float,
) -> LeaseRecord:
    """End the attempt as failed (see :meth:`Backend.fail`) in one ``BEGIN IMMEDIATE``
    transaction: :data:`FAIL_SQL`, then the record read back.

    Raises:
        StaleLeaseError / SessionExpired / BackendUnavailable.
    """
    with backend._transport.transaction(job_id) as db:
        outcome = fail_in(backend, db, session, (job_id, claim, error, retry_in_s))
    if isinstance(outcome, LeaseError):
        raise outcome
    backend.wake_subscribers()
    return outcome


def fail_in(
    backend: SqliteBackend, db: sqlite3.Connection, session: SessionHandle, item: FailItem
) -> LeaseRecord | LeaseError:
    """:data:`FAIL_SQL` for one job inside an open transaction: the record after it, or
    the refusal :meth:`Backend.fail` would raise (:func:`refusal`), returned."""
    job_id, claim, error, retry_in_s = item
    epoch, local = split(claim.generation, backend.epoch_shift)
    row = db.execute(FAIL_SQL, (error, retry_in_s, retry_in_s, job_id, session.session_id,
                                local, epoch, session.session_id)).fetchone()
    if row is None:
        return refusal(backend, db, session, job_id, claim.generation)
    record = get_in(db, job_id, backend.epoch_shift)
    assert record is not None
    return record


def fail_many(
    backend: SqliteBackend, session: SessionHandle, items: Sequence[FailItem]
) -> list[LeaseRecord | LeaseError]:
    """Every item by :func:`fail_in`, in one ``BEGIN IMMEDIATE`` transaction (at most
    ``max_end_batch`` items): each its own outcome, all committed at once.

    Raises:
        BackendUnavailable: nothing of the batch applied (the transaction rolled back).
    """
    if not items:
        return []
    with backend._transport.transaction(items[0][0]) as db:
        outcomes = [fail_in(backend, db, session, item) for item in items]
    backend.wake_subscribers()
    return outcomes


def requeue(backend: SqliteBackend, job_id: str) -> LeaseRecord:
    """A FAILED job made claimable again, with its attempts counted afresh (one ``BEGIN
    IMMEDIATE`` transaction: the ``UPDATE``, then the record read back).

    Raises:
        InvalidArgument: the job is not FAILED; nothing changed.
        BackendUnavailable.
    """
    with backend._transport.transaction(job_id) as db:
        row = db.execute(
            "UPDATE cl_jobs SET failed_at = NULL, not_before = NULL, attempt_base = attempt "
            "WHERE job_id = ? AND failed_at IS NOT NULL RETURNING 1",
            (job_id,),
        ).fetchone()
        record = get_in(db, job_id, backend.epoch_shift)
    record = requeued(job_id, row, record)
    backend.wake_subscribers()
    return record


def get(backend: SqliteBackend, job_id: str) -> LeaseRecord | None:
    """``job_id``'s record, one statement."""
    rows = backend._transport.read(SELECT_RECORD + " WHERE j.job_id = ?", (job_id,))
    return to_record(rows[0], backend.epoch_shift) if rows else None


def records(backend: SqliteBackend, limit: int | None = None) -> list[LeaseRecord]:
    """Every job's record (not the election keys'), by job id, one statement."""
    sql = SELECT_RECORD + f" WHERE {NOT_ELECTION} ORDER BY j.job_id"
    params: tuple[Any, ...] = (ELECTION_PREFIX,)
    if limit is not None:
        sql += " LIMIT ?"
        params = (ELECTION_PREFIX, int(limit))
    return [to_record(r, backend.epoch_shift) for r in backend._transport.read(sql, params)]
