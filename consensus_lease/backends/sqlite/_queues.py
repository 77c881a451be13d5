"""Work queues of the SQLite driver: enqueue (one or a batch), the oldest claimable jobs
(``queue_candidates``, through the partial index ``cl_jobs_open``), the batched claim of
the oldest ones, the fused completion and claim of the next job, counts, listing and
purge. The protocol, costs and capacity
are told in the package docstring (:mod:`consensus_lease.backends.sqlite`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import InvalidArgument, SessionExpired
from ...record import EnqueueItem, LeaseRecord, QueuedJob, QueueStats
from . import _jobs, _jobs_claim, _tokens, _transport
from ._layout import EXHAUSTED, HINT_CHUNK, NOW, SELECT_RECORD, alive, to_record

if TYPE_CHECKING:
    import sqlite3

    from ...backend import QueuePick, SessionHandle
    from ...record import ClaimResult
    from .driver import SqliteBackend

INSERT_JOB = (
    "INSERT INTO cl_jobs (job_id, generation, queue, payload, seq, max_attempts) "
    "VALUES (?, 0, ?, ?, ?, ?)"
)
"""A new queue job, never claimed (generation 0): bind job id, queue, payload, seq,
max_attempts."""

CANDIDATES = (
    "SELECT j.job_id, j.payload FROM cl_jobs j INDEXED BY cl_jobs_open WHERE j.queue = ? "
    "AND j.completed_at IS NULL AND j.failed_at IS NULL "
    f"AND (j.not_before IS NULL OR j.not_before <= {NOW}) "
    "AND NOT EXISTS (SELECT 1 FROM cl_sessions s "
    f"WHERE s.session_id = j.session_id AND s.expires_at > {NOW}) "
    "ORDER BY j.seq LIMIT ?"
)
"""The oldest claimable jobs of a queue, in ``seq`` order (bind queue, limit): open,
past any retry delay, not held by a live session."""

_FREE = (
    "completed_at IS NULL AND failed_at IS NULL "
    f"AND (not_before IS NULL OR not_before <= {NOW}) "
    "AND NOT EXISTS (SELECT 1 FROM cl_sessions s "
    f"WHERE s.session_id = cl_jobs.session_id AND s.expires_at > {NOW})"
)

PICKABLE = (
    "SELECT job_id, payload, seq FROM cl_jobs INDEXED BY cl_jobs_open WHERE queue = ? "
    f"AND {_FREE} AND NOT {EXHAUSTED} ORDER BY seq LIMIT ?"
)
"""The oldest jobs of a queue that the claim statement takes (bind queue, limit): the
rows of :data:`CANDIDATES` whose attempts are not used up, with their ``seq``."""

FAIL_EXHAUSTED = (
    f"UPDATE cl_jobs INDEXED BY cl_jobs_open SET failed_at = {NOW}, session_id = NULL, "
    "error = coalesce(error, 'attempts exhausted: attempt ' || attempt || "
    "' ended without completion') "
    f"WHERE queue = ? AND seq < ? AND {_FREE} AND {EXHAUSTED}"
)
"""FAILED, in one statement, every job of :data:`CANDIDATES` of a queue whose attempts
are used up and whose ``seq`` is below a bound (bind queue, bound): what
:func:`._jobs_claim.why_unclaimable` writes for one such job after its refused claim,
the same columns and error text; ``cl_queue_counts`` moves by its trigger, per row."""


def enqueue(
    backend: SqliteBackend, queue: str, job_id: str, payload: bytes,
    max_attempts: int | None = None,
) -> bool:
    """Add the job to ``queue`` unless it is there (one ``BEGIN IMMEDIATE`` transaction).

    Raises:
        InvalidArgument: the job exists outside ``queue``.
        BackendUnavailable.
    """
    with backend._transport.transaction(job_id) as db:
        row = db.execute("SELECT queue FROM cl_jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is not None:
            if row[0] != queue:
                raise InvalidArgument(
                    f"{job_id!r} already exists outside queue {queue!r}", job_id=job_id
                )
            return False
        seq = db.execute(
            "INSERT INTO cl_seq VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET last = last + 1 "
            "RETURNING last"
        ).fetchone()[0]
        db.execute(INSERT_JOB, (job_id, queue, payload, seq, max_attempts))
    backend.wake_subscribers()
    return True


def enqueue_many(backend: SqliteBackend, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
    """Enqueue ``items`` (see :meth:`Backend.enqueue_many`) in one ``BEGIN IMMEDIATE``
    transaction: one lookup of the ids already present per :data:`~._layout.HINT_CHUNK`
    of them, one ``seq`` reservation, one ``executemany`` insert. Atomic: all new jobs
    are added, or (on any error) none.

    Raises:
        InvalidArgument: a job exists outside ``queue``; nothing was added.
        BackendUnavailable.
    """
    if not items:
        return []
    ids = [item.job_id for item in items]
    with backend._transport.transaction(ids[0]) as db:
        present: dict[str, str | None] = {}
        for start in range(0, len(ids), HINT_CHUNK):
            chunk = ids[start : start + HINT_CHUNK]
            present.update(db.execute(
                f"SELECT job_id, queue FROM cl_jobs WHERE job_id IN "
                f"({', '.join('?' * len(chunk))})", chunk).fetchall())
        for job_id, where in present.items():
            if where != queue:
                raise InvalidArgument(
                    f"{job_id!r} already exists outside queue {queue!r}; nothing of "
                    f"this chunk was enqueued", job_id=job_id)
        new = [item for item in items if item.job_id not in present]
        if new:
            last = int(db.execute(
                "INSERT INTO cl_seq VALUES (1, ?) ON CONFLICT (id) DO UPDATE "
                "SET last = last + excluded.last RETURNING last", (len(new),)
            ).fetchone()[0])
            db.executemany(
                INSERT_JOB,
                [(item.job_id, queue, item.payload, last - len(new) + 1 + i,
                  item.max_attempts) for i, item in enumerate(new)],
            )
    if new:
        backend.wake_subscribers()
    return [job_id not in present for job_id in ids]


def queue_stats(backend: SqliteBackend, queue: str) -> QueueStats:
    """Counts of ``queue``'s jobs by state in one statement (one snapshot of the
    file): the totals from ``cl_queue_counts`` (kept by triggers in every statement
    that adds, ends or deletes a job), the held jobs by walking the live sessions'
    jobs (``cl_jobs_by_session``). Cost O(session rows + jobs the live ones hold), not
    O(queue depth). ``available`` includes jobs waiting out a retry delay.

    Raises:
        BackendUnavailable.
    """
    row = backend._transport.read(
        "SELECT coalesce(c.jobs, 0), coalesce(c.completed, 0), coalesce(c.failed, 0), "
        "h.held, h.until FROM (SELECT count(*) AS held, min(s.expires_at) AS until "
        "FROM cl_sessions s CROSS JOIN cl_jobs j INDEXED BY cl_jobs_by_session "
        "ON j.session_id = s.session_id "
        f"WHERE s.expires_at > {NOW} AND j.queue = ? AND j.completed_at IS NULL "
        "AND j.failed_at IS NULL) h LEFT JOIN cl_queue_counts c ON c.queue = ?",
        (queue, queue),
    )[0]
    jobs, completed, failed, held = (int(v) for v in row[:4])
    until = row[4]
    return QueueStats(
        queue=queue, available=jobs - completed - failed - held, held=held,
        completed=completed, failed=failed,
        oldest_held_lease_until=None if until is None else float(until),
    )


def queue_candidates(backend: SqliteBackend, queue: str, limit: int) -> list[tuple[str, bytes]]:
    """The oldest ``limit`` claimable jobs of ``queue`` (one statement)."""
    rows = backend._transport.read(CANDIDATES, (queue, int(limit)))
    return [(r[0], bytes(r[1] or b"")) for r in rows]


def queue_jobs(backend: SqliteBackend, queue: str, limit: int | None = None) -> list[QueuedJob]:
    """``queue``'s jobs in ``seq`` order with their payloads (one statement)."""
    sql = (
        SELECT_RECORD.replace(" FROM cl_jobs j", ", j.payload, j.seq FROM cl_jobs j")
        + " WHERE j.queue = ? ORDER BY j.seq"
    )
    params: tuple[Any, ...] = (queue,)
    if limit is not None:
        sql += " LIMIT ?"
        params = (queue, int(limit))
    return [
        QueuedJob(queue, to_record(row[:-2], backend.epoch_shift), bytes(row[-2] or b""),
                  int(row[-1]))
        for row in backend._transport.read(sql, params)
    ]


def wait_for_queue(backend: SqliteBackend, queue: str, timeout_s: float) -> None:
    """Sleep one poll interval (SQLite cannot notify another process)."""
    time.sleep(max(0.0, min(timeout_s, backend.poll_interval_s)))


def purge(backend: SqliteBackend, queue: str) -> int:
    """Delete ``queue``'s COMPLETED jobs (one ``BEGIN IMMEDIATE`` transaction)."""
    with backend._transport.transaction() as db:
        return int(db.execute(
            "DELETE FROM cl_jobs WHERE queue = ? AND completed_at IS NOT NULL", (queue,)
        ).rowcount)


HEAD = (
    f"SELECT j.job_id, j.payload, {EXHAUSTED} FROM cl_jobs j INDEXED BY cl_jobs_open "
    "WHERE j.queue = ? AND j.completed_at IS NULL AND j.failed_at IS NULL "
    f"AND (j.not_before IS NULL OR j.not_before <= {NOW}) "
    "AND NOT EXISTS (SELECT 1 FROM cl_sessions s "
    f"WHERE s.session_id = j.session_id AND s.expires_at > {NOW}) "
    "ORDER BY j.seq LIMIT 8"
)
"""The oldest 8 claimable-looking jobs of a queue (:data:`CANDIDATES`), each with
whether its attempts are used up (bind queue): what ``claim_next`` reads first."""


def claim_from_queue(
    backend: SqliteBackend, session: SessionHandle, queue: str
) -> QueuePick | None:
    """``claim_next``'s pick and claim (see :meth:`Backend.claim_from_queue`); never a
    lost race, ``None`` only if no job of ``queue`` was claimable.

    The common case costs what a named claim does plus one read: :data:`HEAD` (no
    lock), then the claim statement alone (:func:`._jobs_claim.claim_alone`, its own
    transaction) on a random one of those 8 jobs, so that claimers of several processes
    do not all collide on the oldest. If one of them has its attempts used up, or that
    claim applied nothing (another claimer was first), the pick is
    :func:`claim_from_queue_many` for one job instead: one ``BEGIN IMMEDIATE``
    transaction, the oldest claimable job, every exhausted job ahead of it FAILED.

    Raises:
        SessionExpired / StoreRegressed / BackendUnavailable: as
            :func:`claim_from_queue_many`; nothing changed.
    """
    head = backend._transport.read(HEAD, (queue,))
    if not head:
        return None
    if not any(row[2] for row in head):
        job_id, payload, _spent = head[random.randrange(len(head))]
        got = _jobs_claim.claim_alone(backend, session, job_id)
        if got is not None:
            return job_id, got, bytes(payload or b"")
    picks = claim_from_queue_many(backend, session, queue, 1)
    return picks[0] if picks else None


def claim_from_queue_many(
    backend: SqliteBackend, session: SessionHandle, queue: str, n: int
) -> list[QueuePick]:
    """Claim up to ``n`` (at most ``max_queue_claim_batch``) of the oldest claimable
    jobs of ``queue`` (see :meth:`Backend.claim_from_queue_many`) in one ``BEGIN
    IMMEDIATE`` transaction: the write lock is held from the first read, so the jobs
    read (:func:`_pick_in`) are exactly what the claims take, and each is claimed by the
    statement :func:`._jobs_claim.claim` runs (its generation, attempt, epoch and
    exhausted-budget rules). The jobs whose attempts are used up ahead of the last job
    claimed (all of them, if fewer than ``n`` were claimable) become FAILED in the same
    transaction, however many there are. The transaction commits or not (the file is
    local: no answer can be lost after a commit).

    Raises:
        SessionExpired: the session is not alive in the store; nothing changed.
        StoreRegressed: the store went back; nothing changed.
        BackendUnavailable: nothing applied.
    """
    with backend._transport.transaction(None, check_file=True) as db:
        _tokens.check_history(backend, db, None)
        if not alive(db, session.session_id):
            raise SessionExpired(f"session {session.session_id} expired in the store")
        picks, failed = _pick_in(backend, db, session, queue, n)
    if failed:
        backend.wake_subscribers()  # waiters on the FAILED jobs learn it
    return picks


def _pick_in(
    backend: SqliteBackend, db: sqlite3.Connection, session: SessionHandle, queue: str,
    n: int,
) -> tuple[list[QueuePick], int]:
    """In the caller's ``BEGIN IMMEDIATE`` transaction (the session checked alive): the
    oldest ``n`` jobs of ``queue`` the claim statement takes (:data:`PICKABLE`), FAILED
    the exhausted ones ahead of the last of them (:data:`FAIL_EXHAUSTED`, one
    statement; every exhausted claimable-looking one if fewer than ``n`` were found), and
    the claims. Returns the picks and how many jobs became FAILED.

    Two statements and one claim per pick, whatever the number of exhausted jobs; the
    read and the ``UPDATE`` walk the exhausted jobs in ``cl_jobs_open`` (each FAILED job
    leaves that index, so each is walked by one such transaction only): measured with
    10,000 of them ahead of one claimable job, about 50-60 ms of write lock on a busy
    2-core machine (~5 us per job), then as fast as with none."""
    rows = db.execute(PICKABLE, (queue, n)).fetchall()
    bound = rows[-1][2] if len(rows) == n else None
    failed = int(db.execute(
        FAIL_EXHAUSTED, (queue, bound if bound is not None else 2**63 - 1)).rowcount)
    picks: list[QueuePick] = []
    for job_id, payload, _seq in rows:
        got = _jobs_claim.claim_one(backend, db, session, job_id)
        if got is None:  # cannot happen with the write lock held: no guessing
            raise _transport.broken(f"{job_id!r} was read claimable and its claim "
                                    "refused in the same transaction")
        picks.append((job_id, got, bytes(payload or b"")))
    if picks:
        _tokens.note_claims(backend, db)
    return picks, failed


def complete_and_claim_next(
    backend: SqliteBackend, session: SessionHandle, job_id: str, claim: ClaimResult,
    result: bytes, queue: str,
) -> tuple[LeaseRecord, QueuePick | None]:
    """The completion of :func:`._jobs.complete` and the claim of the oldest claimable
    job of ``queue`` (the statement :func:`._jobs_claim.claim` runs, with its
    generation, attempt, epoch and exhausted-budget rules; the exhausted jobs ahead of
    it become FAILED, as in :func:`claim_from_queue_many`), in one ``BEGIN IMMEDIATE``
    transaction: a refused completion rolls everything back; no claimable job leaves the
    completion alone.

    Raises:
        StaleLeaseError / SessionExpired: the completion was refused; nothing changed.
        StoreRegressed: the store went back; nothing changed.
        BackendUnavailable: nothing applied.
    """
    picked: QueuePick | None = None
    with backend._transport.transaction(job_id, check_file=True) as db:
        record = _jobs.complete_in(backend, db, session, job_id, claim, result)
        if not isinstance(record, LeaseRecord):
            raise record
        _tokens.check_history(backend, db, None)
        if alive(db, session.session_id):
            picks, _failed = _pick_in(backend, db, session, queue, 1)
            picked = picks[0] if picks else None
    backend.wake_subscribers()
    return record, picked
