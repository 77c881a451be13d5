"""Claims of the SQLite driver: ``claim`` and ``claim_many``, by the one claim statement
(:data:`CLAIM_SQL`), and the rule that tells why a claim was refused. Part of
:mod:`._jobs`; the protocol is told in the package docstring
(:mod:`consensus_lease.backends.sqlite`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._election import is_election_key
from ..._epoch import compose, split
from ...errors import JobCompleted, JobFailed, LeaseError, SessionExpired
from ...record import ClaimResult
from . import _tokens, _transport
from ._layout import ALIVE, EXHAUSTED, NOW, alive

if TYPE_CHECKING:
    import sqlite3

    from ...backend import SessionHandle
    from .driver import SqliteBackend

CLAIM_SQL = (
    "INSERT OR IGNORE INTO cl_jobs (job_id, generation, owner, session_id, attempt, epoch) "
    "VALUES (?, (SELECT 1 FROM cl_meta m WHERE m.id = 1 AND m.identity = ? "
    f"AND m.claims >= ? AND {ALIVE}), ?, ?, 1, (SELECT epoch FROM cl_meta WHERE id = 1)) "
    "ON CONFLICT (job_id) DO UPDATE SET generation = cl_jobs.generation + 1, "
    "attempt = cl_jobs.attempt + 1, not_before = NULL, epoch = excluded.epoch, "
    "owner = excluded.owner, session_id = excluded.session_id, value = NULL "
    "WHERE excluded.generation IS NOT NULL "
    "AND cl_jobs.completed_at IS NULL AND cl_jobs.failed_at IS NULL "
    f"AND NOT {EXHAUSTED} "
    f"AND (cl_jobs.not_before IS NULL OR cl_jobs.not_before <= {NOW}) "
    "AND NOT EXISTS (SELECT 1 FROM cl_sessions s "
    f"WHERE s.session_id = cl_jobs.session_id AND s.expires_at > {NOW})"
)
"""The claim: insert the job's row, or take it over if claimable (not completed, FAILED,
out of attempts, in a retry delay, nor held by a live session), with the store's epoch
and only if the claiming session is alive and ``cl_meta`` still has the identity and at
least the claim count this process saw (bind job id, identity, claims seen, session id,
owner, session id). Those store conditions make the new row's ``generation`` 1, or
``NULL`` if any fails: a ``NULL`` row is never inserted (``generation`` is ``NOT NULL``
and ``OR IGNORE`` skips the row; the table's only other constraints are ``NOT NULL``
ones, met by every claim, and the primary key, which the upsert handles) and never
takes a row over (``excluded.generation IS NOT NULL`` in the upsert's ``WHERE``). A
``VALUES`` row, not ``INSERT ... SELECT ... WHERE``: SQLite copies a ``SELECT``'s rows
through a temporary B-tree when the table has triggers (about 18,000 instructions per
claim). It changes one row iff it applied. The count goes +1 by trigger
(:data:`CLAIM_TRIGGERS`). No ``RETURNING`` (see :data:`COMPLETED_CAPTURE`): the row as
the claim wrote it (generation, attempt, epoch, the session's expiry) and the count
after it are handed over by :data:`CLAIM_CAPTURES`."""

CLAIMED_READ = (
    "SELECT j.job_id, j.generation, j.attempt, j.epoch, s.expires_at, m.claims "
    "FROM cl_jobs j JOIN cl_sessions s ON s.session_id = j.session_id "
    "JOIN cl_meta m ON m.id = 1 WHERE j.job_id = ? AND j.session_id = ?"
)
"""What a claim wrote, read back if :data:`CLAIM_CAPTURES` did not hand it over."""


def claim(backend: SqliteBackend, session: SessionHandle, job_id: str) -> ClaimResult | None:
    """Claim ``job_id`` (see :meth:`Backend.claim`); the token carries the store's
    epoch, read in the claim statement itself.

    A claim that applies is one statement (its own transaction), after an ``os.stat``
    of the file: :data:`CLAIM_SQL`, whose ``WHERE`` checks that the session is alive and
    the store is the one this process saw (identity, claim count not below the last
    seen); it raises the claim count by trigger, and the new count and the row are
    handed over by :data:`~._layout.CLAIM_CAPTURES`. Only a claim it refuses takes the
    diagnosing ``BEGIN IMMEDIATE`` transaction, which tries once more and tells why.

    Raises:
        StoreRegressed: the store went back (:mod:`._tokens_history`); nothing claimed.
        JobCompleted / JobFailed / SessionExpired / BackendUnavailable.
    """
    claimed = claim_alone(backend, session, job_id)
    if claimed is None:
        with backend._transport.transaction(job_id, check_file=True) as db:
            _claim_checks(backend, db, session, job_id)
            claimed = claim_one(backend, db, session, job_id)
            refused = None if claimed else why_unclaimable(backend, db, job_id)  # after COMMIT
            if claimed is not None:
                _tokens.note_claims(backend, db)
        if refused is not None:
            raise refused
    if claimed is not None and is_election_key(job_id):
        backend.wake_subscribers()  # this process's observers learn the new leader now
    return claimed


def claim_many(
    backend: SqliteBackend, session: SessionHandle, job_ids: Sequence[str]
) -> list[ClaimResult | None]:
    """Claim each of ``job_ids`` (at most ``capabilities.max_batch_claim``) in one
    ``BEGIN IMMEDIATE`` transaction, each by the statement :func:`claim` runs: same
    generation, attempt, epoch and exhausted-budget rules; a completed or FAILED job
    yields ``None`` (a job whose attempts are used up is marked FAILED, as by
    ``claim``).

    Raises:
        StoreRegressed: the store went back; nothing of the batch is claimed.
        SessionExpired / BackendUnavailable: nothing of the batch is claimed.
    """
    if not job_ids:
        return []
    with backend._transport.transaction(job_ids[0], check_file=True) as db:
        _claim_checks(backend, db, session, job_ids[0])
        results: list[ClaimResult | None] = []
        for job_id in job_ids:
            claimed = claim_one(backend, db, session, job_id)
            if claimed is None:
                why_unclaimable(backend, db, job_id)  # marks a used-up job FAILED, as claim does
            results.append(claimed)
        if any(r is not None for r in results):
            _tokens.note_claims(backend, db)
    if any(r is not None and is_election_key(j) for j, r in zip(job_ids, results, strict=True)):
        backend.wake_subscribers()
    return results


def claim_alone(
    backend: SqliteBackend, session: SessionHandle, job_id: str
) -> ClaimResult | None:
    """The first step of :func:`claim` alone: the claim statement as its own
    transaction; ``None`` if it applied nothing (nothing changed: the caller decides
    what to do next, e.g. a transaction that tells why).

    Raises:
        BackendUnavailable.
    """
    return backend._transport.run(_claim_alone, job_id, backend, session, job_id)


def _claim_alone(
    db: sqlite3.Connection, backend: SqliteBackend, session: SessionHandle, job_id: str
) -> ClaimResult | None:
    """The claim statement as a transaction of its own (the turn held); ``None`` if it
    applied nothing (or cannot be used: a regressed store)."""
    history = backend._history
    history.check_file()
    if history.regressed:
        return None
    claimed = _run_claim(backend, db, session, job_id)
    if claimed is None:
        return None
    result, count = claimed
    # the WHERE compared identity and count: this notes the count, never raises
    history.claimed(history.identity, count, split(result.generation, backend.epoch_shift)[0])
    return result


def _run_claim(
    backend: SqliteBackend, db: sqlite3.Connection, session: SessionHandle, job_id: str
) -> tuple[ClaimResult, int] | None:
    """Run :data:`CLAIM_SQL` (the turn held): ``None`` if it applied nothing, else
    the claim as the statement wrote it and the claim count after it."""
    claimed, counted = backend._claimed, backend._counted
    claimed.clear()
    counted.clear()
    try:
        applied = db.execute(CLAIM_SQL, claim_params(backend, session, job_id)).rowcount == 1
        row = claimed[-1] if claimed else None
        count = counted[-1] if counted else None
    finally:
        claimed.clear()
        counted.clear()
    if not applied:
        return None
    if row is None or row[0] != job_id or count is None:
        # not handed over (the triggers always run): read back what was claimed
        row = db.execute(CLAIMED_READ, (job_id, session.session_id)).fetchone()
        if row is None:
            raise _transport.broken(f"the claim of {job_id!r} applied but its row "
                                    "is no longer this session's")
        count = row[5]
    return _to_claim(row[1:5], backend.epoch_shift), int(count)


def _claim_checks(
    backend: SqliteBackend, db: sqlite3.Connection, session: SessionHandle, job_id: str
) -> None:
    """Before a claim, in its transaction: StoreRegressed if the store went back and
    was not bumped since, SessionExpired if the session is not alive in the store."""
    _tokens.check_history(backend, db, None)
    if not alive(db, session.session_id):
        raise SessionExpired(
            f"session {session.session_id} expired in the store", job_id=job_id
        )


def claim_params(
    backend: SqliteBackend, session: SessionHandle, job_id: str
) -> tuple[Any, ...]:
    """The parameters of :data:`CLAIM_SQL` for this claim."""
    history = backend._history
    return (job_id, history.identity, history.claims_seen,
            session.session_id, session.owner, session.session_id)


def claim_one(
    backend: SqliteBackend, db: sqlite3.Connection, session: SessionHandle, job_id: str
) -> ClaimResult | None:
    """The claim statement in a transaction (the claim count is read after it, by
    :func:`._tokens.note_claims`)."""
    claimed = _run_claim(backend, db, session, job_id)
    return None if claimed is None else claimed[0]


def _to_claim(row: tuple[Any, ...], epoch_shift: int) -> ClaimResult:
    """``row`` is ``(generation, attempt, epoch, the session's expires_at)``."""
    token = compose(int(row[2]), int(row[0]), epoch_shift)
    return ClaimResult(token, float(row[3]), int(row[1]))


def why_unclaimable(
    backend: SqliteBackend, db: sqlite3.Connection, job_id: str
) -> LeaseError | None:
    """After a claim did not apply: JobCompleted / JobFailed if that is why (else
    ``None``); moves a job whose attempts are used up, and which nobody holds, to
    FAILED first."""
    db.execute(
        f"UPDATE cl_jobs SET failed_at = {NOW}, session_id = NULL, error = coalesce(error, "
        "'attempts exhausted: attempt ' || attempt || ' ended without completion') "
        f"WHERE job_id = ? AND completed_at IS NULL AND failed_at IS NULL AND {EXHAUSTED} "
        "AND NOT EXISTS (SELECT 1 FROM cl_sessions s "
        f"WHERE s.session_id = cl_jobs.session_id AND s.expires_at > {NOW})",
        (job_id,),
    )
    row = db.execute(
        "SELECT generation, completed_at, failed_at, attempt, error, epoch FROM cl_jobs "
        "WHERE job_id = ?", (job_id,),
    ).fetchone()
    if row is None:
        return None
    local, completed_at, failed_at, attempt, error, epoch = row
    generation = compose(int(epoch), int(local), backend.epoch_shift)
    if completed_at is not None:
        return JobCompleted(
            f"{job_id!r} was completed at generation {generation}",
            job_id=job_id, generation=int(generation),
        )
    if failed_at is not None:
        return JobFailed(
            f"{job_id!r} FAILED after {attempt} attempt(s): {error}",
            job_id=job_id, generation=int(generation), attempt=int(attempt), error=error,
        )
    return None
