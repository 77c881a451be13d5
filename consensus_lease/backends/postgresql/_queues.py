"""Work queues of the PostgreSQL store (the package docstring,
:mod:`consensus_lease.backends.postgresql`, tells how a queue maps onto ``cl_jobs`` and
what its reads cost): the enqueue batch, ``claim_next``'s one statement and its batch
(``claim_next_many``), the fused completion and claim, the reads and ``purge``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._epoch import compose, split
from ...backend import QueuePick, SessionHandle
from ...errors import (
    BackendUnavailable,
    InvalidArgument,
    LeaseError,
    OutcomeUnknown,
    StoreRegressed,
)
from ...record import ClaimResult, EnqueueItem, LeaseRecord, QueuedJob, QueueStats
from . import _jobs, _tokens
from ._layout import NOW, to_record

if TYPE_CHECKING:
    import psycopg

    from .driver import PostgresBackend

__all__ = ["claim_from_queue", "claim_from_queue_many", "complete_and_claim_next", "enqueue",
           "enqueue_many", "purge", "queue_candidates", "queue_jobs", "queue_stats"]

QUEUE_MANY_RUNS = 3
"""Most statements one ``claim_from_queue_many`` call runs: another only while the last one
picked more jobs than it claimed (a re-check lost a race) and fewer than ``n`` were
claimed."""


def enqueue(
    b: PostgresBackend, queue: str, job_id: str, payload: bytes, max_attempts: int | None = None
) -> bool:
    return enqueue_many(b, queue, [EnqueueItem(job_id, payload, max_attempts)])[0]


def enqueue_many(b: PostgresBackend, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
    """Enqueue ``items`` in one transaction (one ``INSERT ... SELECT FROM unnest(...)
    ON CONFLICT DO NOTHING`` per up to :data:`._config.MAX_BATCH_BYTES` of payloads,
    then one check that no id exists outside ``queue``, then, if any job was added, the
    notification: a statement and a round trip each, between ``BEGIN`` and ``COMMIT``).
    A lost answer is settled by reading back: a job found in the queue counts as added.

    Raises:
        InvalidArgument: a job exists outside ``queue``; nothing of the batch is added.
        BackendUnavailable / OutcomeUnknown.
    """
    if not items:
        return []
    n = b.names
    ids = [it.job_id for it in items]
    params = {
        "ids": ids, "payloads": [it.payload for it in items],
        "max": [it.max_attempts for it in items], "queue": queue, "chan": n.channel,
    }
    outside_sql = (f"SELECT job_id FROM {n.jobs} WHERE job_id = ANY(%(ids)s) "
                   "AND queue IS DISTINCT FROM %(queue)s ORDER BY job_id LIMIT 1")

    insert = (f"INSERT INTO {n.jobs} (job_id, generation, queue, payload, seq, "
              "max_attempts) SELECT t.job_id, 0, %(queue)s, t.payload, "
              f"nextval('{n.seq}'), t.max_attempts FROM unnest(%(ids)s::text[], "
              "%(payloads)s::bytea[], %(max)s::integer[]) WITH ORDINALITY "
              "AS t(job_id, payload, max_attempts, ord) ORDER BY t.ord "
              "ON CONFLICT (job_id) DO NOTHING RETURNING job_id")
    # one INSERT per up to MAX_BATCH_BYTES of payloads (one message each, below
    # libpq's 1 GiB), all in the one transaction: still all or nothing
    groups = _jobs.byte_groups(items, lambda it: len(it.payload))
    inserts = [params] if len(groups) == 1 else [
        {**params, "ids": [it.job_id for it in group],
         "payloads": [it.payload for it in group],
         "max": [it.max_attempts for it in group]} for group in groups]

    def run(c: psycopg.Connection[tuple[Any, ...]]) -> set[str]:
        with c.transaction():
            added = {r[0] for one in inserts for r in c.execute(insert, one)}
            outside = c.execute(outside_sql, params).fetchone()
            if outside is not None:
                raise InvalidArgument(
                    f"{outside[0]!r} already exists outside queue {queue!r}",
                    job_id=str(outside[0]))
            if added:
                c.execute("SELECT pg_notify(%s, '')", (n.channel,))
            return added

    def settle() -> set[str]:
        rows = b.client.read(
            f"SELECT job_id FROM {n.jobs} WHERE job_id = ANY(%(ids)s) "
            "AND queue = %(queue)s", params)
        return {r[0] for r in rows}

    added = b.client.write(ids[0], run, settle)
    if added:
        b.wake_subscribers()
    return [i in added for i in ids]


def claim_from_queue(
    b: PostgresBackend, session: SessionHandle, queue: str
) -> tuple[str, ClaimResult | None, bytes] | None:
    """``claim_next``'s one statement (see :meth:`Backend.claim_from_queue`): the oldest
    claimable job nobody is locking right now (``FOR UPDATE SKIP LOCKED``: concurrent
    claimers take different jobs instead of queueing on one row), claimed with a named
    claim's re-check. A lost answer is settled by reading back whether this session now
    holds a job of the queue: none, the statement did not apply (the caller tries
    again); one, ``OutcomeUnknown`` (which job is new cannot be told from the rows).

    Raises:
        StoreRegressed: the server is not the store's any more (failover, restore).
        SessionExpired / BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
    """
    params = {"queue": queue, "sid": session.session_id, "owner": session.owner}

    def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...]:
        row = c.execute(b.sql.claim_from_queue, params).fetchone()
        assert row is not None  # the statement always returns its one row
        return row

    def settle() -> tuple[Any, ...]:
        held = b.client.one(f"SELECT 1 FROM {b.names.jobs} WHERE queue = %(queue)s AND "
                         "session_id = %(sid)s AND completed_at IS NULL LIMIT 1", params)
        if held is not None:  # which one is new cannot be told from the rows
            raise OutcomeUnknown(
                f"claim_next({queue!r}): the answer was lost and session "
                f"{session.session_id} holds a job of the queue, perhaps from this "
                "claim (without a lease here: it is handed back when the session ends)")
        return ("", None, None, None, None, None, True, 0)  # not applied: try again

    row = b.client.write(None, run, settle)
    job_id, local, attempt, epoch, payload, expires_at, alive, dead = row
    if dead:
        b.wake_subscribers()  # waiters on those jobs learn they FAILED
    if local is None and not alive:  # not alive here: why (a failover: StoreRegressed)
        expired = _tokens.expired(b, session.session_id, job_id)
        if job_id is not None or isinstance(expired, StoreRegressed):
            raise expired
    if job_id is None:
        return None
    if local is None:
        return job_id, None, b""
    claim = ClaimResult(compose(int(epoch), int(local), b.epoch_shift),
                        float(expires_at), int(attempt))
    return job_id, claim, bytes(payload or b"")


def claim_from_queue_many(
    b: PostgresBackend, session: SessionHandle, queue: str, n: int
) -> list[QueuePick]:
    """Up to ``n`` (at most ``max_queue_claim_batch``) of the oldest claimable jobs of
    ``queue`` (see :meth:`Backend.claim_from_queue_many`) in **one statement** (one round
    trip, one transaction): :func:`claim_from_queue`'s statement with the pick
    ``ORDER BY seq LIMIT n FOR UPDATE SKIP LOCKED`` (concurrent claimers take different
    jobs; exhausted jobs at the head FAILED in it). When some picked jobs' re-check lost
    a race, the statement runs again for the rest, up to :data:`QUEUE_MANY_RUNS` times.

    A lost answer is settled by reading back whether this session now holds a job of the
    queue other than those this call already claimed: none, the statement did not apply
    and runs once more; one, ``OutcomeUnknown`` (which jobs are new cannot be told from
    the rows; they have no lease here and stay the session's until it ends, then are
    claimable again: never claimed twice). An error of a later run returns the jobs the
    earlier runs claimed instead.

    Raises:
        SessionExpired: the session is not alive in the store; nothing claimed.
        StoreRegressed: the server is not the store's any more (failover, restore).
        BackendUnavailable / OutcomeUnknown: of the first run (see above).
    """
    picks: list[QueuePick] = []
    for _ in range(QUEUE_MANY_RUNS):
        try:
            rows = _claim_many_rows(b, session, queue, n - len(picks), [p[0] for p in picks])
        except BackendUnavailable:
            if not picks:
                raise
            return picks  # the jobs claimed so far are held: hand them over
        alive, dead, picked = rows[0][6:9]
        if dead:
            b.wake_subscribers()  # waiters on those jobs learn they FAILED
        claimed = [r for r in rows if r[0] is not None]
        if not claimed and not alive:  # not alive here: why (a failover: StoreRegressed)
            raise _tokens.expired(b, session.session_id)
        for job_id, local, attempt, epoch, payload, expires_at, *_ in claimed:
            claim = ClaimResult(compose(int(epoch), int(local), b.epoch_shift),
                                float(expires_at), int(attempt))
            picks.append((job_id, claim, bytes(payload or b"")))
        if len(picks) >= n or picked <= len(claimed):
            break
    return picks


def _claim_many_rows(
    b: PostgresBackend, session: SessionHandle, queue: str, n: int, mine: list[str]
) -> list[tuple[Any, ...]]:
    """One run of the statement of :func:`claim_from_queue_many` for ``n`` jobs; ``mine``:
    the jobs of the queue the call already claimed (left out of the read-back)."""
    params = {"queue": queue, "sid": session.session_id, "owner": session.owner, "n": n,
              "mine": mine}

    def run(c: psycopg.Connection[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return c.execute(b.sql.claim_from_queue_many, params).fetchall()

    def settle() -> list[tuple[Any, ...]]:
        if b.client.one(b.sql.held_in_queue, params) is not None:
            raise OutcomeUnknown(
                f"claim_next_many({queue!r}): the answer was lost and session "
                f"{session.session_id} holds a job of the queue, perhaps from this claim "
                "(without a lease here: it is handed back when the session ends)")
        return b.client.write(None, run)  # not applied: once more

    return b.client.write(None, run, settle)


def complete_and_claim_next(
    b: PostgresBackend, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes,
    queue: str,
) -> tuple[LeaseRecord, QueuePick | None]:
    """The completion of :func:`._jobs.complete` and ``claim_next``'s claim
    (:func:`claim_from_queue`: ``FOR UPDATE SKIP LOCKED``, exhausted jobs at the head
    FAILED), gated on the completion, in **one statement** (one round trip, one
    transaction). When the picked job's re-check lost a race, the completion stands
    and :func:`claim_from_queue` is tried (one more round trip each, up to three times).
    A completion that did not apply is read again (:func:`._jobs.refused_completion`).

    A lost answer is settled by reading back: the completion not applied, the
    statement runs once more; applied, the record is returned with no next job (a job
    it may have claimed stays this session's until the session ends: which one cannot
    be told from the rows).

    Raises:
        StaleLeaseError / SessionExpired: the completion was refused; nothing claimed.
        StoreRegressed: the server is not the store's any more; nothing claimed.
        BackendUnavailable / OutcomeUnknown: as :func:`._jobs.complete`.
    """
    epoch, gen = split(claim.generation, b.epoch_shift)
    params = {"job": job_id, "sid": session.session_id, "gen": gen, "epoch": epoch,
              "result": result, "queue": queue, "owner": session.owner}
    lost = ("lost",)

    def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...]:
        row = b.client.cursor(c).execute(
            b.sql.complete_claim_next, params, binary=True).fetchone()
        assert row is not None  # the statement always returns its one row
        return row

    def settle() -> tuple[Any, ...]:
        if b.client.one(b.sql.completed_by_me, params, job_id) is None:
            return b.client.write(job_id, run)  # not applied: once more
        return lost

    row = b.client.write(job_id, run, settle)
    b.wake_subscribers()
    if row is lost:
        record = _jobs.refused_completion(b, session, job_id, claim)
        assert isinstance(record, LeaseRecord)
        return record, None
    _, _, _, _, next_id, local, attempt, next_epoch, payload, expires_at, _, _ = row
    if row[1] is None:  # the completion did not apply (attempt is never NULL)
        refused = _jobs.refused_completion(b, session, job_id, claim)
        if isinstance(refused, LeaseError):
            raise refused
        return refused, b._claim_queue_head(session, queue)  # a repeat: claim alone
    record = _jobs.completed_record(job_id, claim, result, row[0:4])
    if next_id is None:
        return record, None
    if local is None:  # the picked job's re-check lost a race: try the usual way
        try:
            return record, b._claim_queue_head(session, queue)
        except LeaseError:  # the completion stands
            return record, None
    got = ClaimResult(compose(int(next_epoch), int(local), b.epoch_shift),
                      float(expires_at), int(attempt))
    return record, (next_id, got, bytes(payload or b""))


def queue_candidates(b: PostgresBackend, queue: str, limit: int) -> list[tuple[str, bytes]]:
    rows = b.client.read(b.sql.candidates, {"queue": queue, "limit": int(limit)})
    return [(r[0], bytes(r[1] or b"")) for r in rows]


def queue_jobs(b: PostgresBackend, queue: str, limit: int | None = None) -> list[QueuedJob]:
    sql = (b.sql.select.replace(f" FROM {b.names.jobs} j",
                                f", j.payload, j.seq FROM {b.names.jobs} j", 1)
           + " WHERE j.queue = %(queue)s ORDER BY j.seq")
    params: dict[str, Any] = {"queue": queue}
    if limit is not None:
        sql += " LIMIT %(limit)s"
        params["limit"] = int(limit)
    return [
        QueuedJob(queue, to_record(row[:-2], b.epoch_shift), bytes(row[-2] or b""), int(row[-1]))
        for row in b.client.read(sql, params)
    ]


def queue_stats(b: PostgresBackend, queue: str) -> QueueStats:
    """Counts of ``queue``'s jobs by state: one statement, one consistent snapshot (a
    claim committing meanwhile is either counted or not, never half), the server's
    clock read once for it. HELD comes from the queue's open jobs whose session is
    alive (the ``cl_jobs_open_by_queue`` index: O(open jobs)); the other counts from
    one pass over the queue's rows inside the server (O(jobs in the queue), completed ones until
    purged: about 20 ms per 100,000 jobs on a 2-core VM); only the counts travel.
    Bounded by ``timeout_s`` (``BackendUnavailable`` past it)."""
    n = b.names
    open_job = "j.completed_at IS NULL AND j.failed_at IS NULL"
    row = b.client.one(
        f"WITH t AS MATERIALIZED (SELECT {NOW} AS now), "
        "h AS MATERIALIZED (SELECT count(*) AS held, min(s.expires_at) AS oldest "
        f"FROM {n.sessions} s JOIN {n.jobs} j ON j.session_id = s.session_id "
        f"CROSS JOIN t WHERE s.expires_at > t.now AND j.queue = %(queue)s "
        "AND j.closed IS NULL "
        f"AND {open_job}) "
        "SELECT count(*) FILTER (WHERE j.completed_at IS NOT NULL), "
        "count(*) FILTER (WHERE j.completed_at IS NULL AND j.failed_at IS NOT NULL), "
        f"count(*) FILTER (WHERE {open_job}), (SELECT held FROM h), "
        f"(SELECT oldest FROM h) FROM {n.jobs} j WHERE j.queue = %(queue)s",
        {"queue": queue})
    assert row is not None
    held = int(row[3])
    return QueueStats(queue=queue, completed=int(row[0]), failed=int(row[1]),
                      held=held, available=int(row[2]) - held,
                      oldest_held_lease_until=None if row[4] is None else float(row[4]))


def purge(b: PostgresBackend, queue: str) -> int:
    return int(b.client.write(None, lambda c: c.execute(
        f"DELETE FROM {b.names.jobs} WHERE queue = %s AND completed_at IS NOT NULL",
        (queue,)).rowcount, lambda: 0))
