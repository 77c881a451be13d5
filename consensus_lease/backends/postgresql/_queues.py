"""Work queues of the PostgreSQL store (:mod:`consensus_lease.backends.postgresql`): the
enqueue batch, ``claim_next``'s one statement, the reads; and the plumbing the store's
other methods share."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pgerrors

from .._epoch import compose, split
from ..backend import Backend, CompleteItem, QueuePick, SessionHandle
from ..errors import (
    InvalidArgument,
    LeaseError,
    OutcomeUnknown,
    SessionExpired,
    StoreRegressed,
)
from ..record import ClaimResult, EnqueueItem, JobState, LeaseRecord, QueuedJob, QueueStats
from ._pg_schema import NOW
from ._sql_row import record_of_row

if TYPE_CHECKING:
    from ._pg_client import Client
    from ._pg_schema import Names
    from ._pg_sql import Statements

__all__ = ["QueueOps"]


class QueueOps(Backend):
    """The queue methods of :class:`~consensus_lease.backends.postgresql.PostgresBackend`
    (its base class; not a backend by itself)."""

    client: Client
    names: Names
    sql: Statements

    def _expired(self, session_id: str, job_id: str | None = None,
                 generation: int | None = None) -> SessionExpired:
        raise NotImplementedError  # PostgresBackend's

    def _one(self, sql: str, params: Any, job_id: str | None = None) -> tuple[Any, ...] | None:
        rows = self.client.read(sql, params, job_id)
        return rows[0] if rows else None

    def _wait(self, subscribe: Any, timeout_s: float) -> None:
        woken = threading.Event()
        unsubscribe = subscribe(woken.set)
        try:
            woken.wait(max(0.0, timeout_s))
        finally:
            unsubscribe()

    @classmethod
    def _to_record(cls, row: Sequence[Any]) -> LeaseRecord:
        return record_of_row(row, cls.epoch_shift)

    # -- work queues ---------------------------------------------------------------------

    def enqueue(
        self, queue: str, job_id: str, payload: bytes, max_attempts: int | None = None
    ) -> bool:
        return self.enqueue_many(queue, [EnqueueItem(job_id, payload, max_attempts)])[0]

    def enqueue_many(self, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
        """Enqueue ``items`` in one transaction (one ``INSERT ... SELECT FROM unnest(...)
        ON CONFLICT DO NOTHING``, then one check that no id exists outside ``queue``).
        A lost answer is settled by reading back: a job found in the queue counts as
        added.

        Raises:
            InvalidArgument: a job exists outside ``queue``; nothing of the batch is added.
            BackendUnavailable / OutcomeUnknown.
        """
        if not items:
            return []
        n = self.names
        ids = [it.job_id for it in items]
        params = {
            "ids": ids, "payloads": [it.payload for it in items],
            "max": [it.max_attempts for it in items], "queue": queue, "chan": n.channel,
        }
        outside_sql = (f"SELECT job_id FROM {n.jobs} WHERE job_id = ANY(%(ids)s) "
                       "AND queue IS DISTINCT FROM %(queue)s ORDER BY job_id LIMIT 1")

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> set[str]:
            with c.transaction():
                added = {r[0] for r in c.execute(
                    f"INSERT INTO {n.jobs} (job_id, generation, queue, payload, seq, "
                    "max_attempts) SELECT t.job_id, 0, %(queue)s, t.payload, "
                    f"nextval('{n.seq}'), t.max_attempts FROM unnest(%(ids)s::text[], "
                    "%(payloads)s::bytea[], %(max)s::integer[]) WITH ORDINALITY "
                    "AS t(job_id, payload, max_attempts, ord) ORDER BY t.ord "
                    "ON CONFLICT (job_id) DO NOTHING RETURNING job_id", params)}
                outside = c.execute(outside_sql, params).fetchone()
                if outside is not None:
                    raise InvalidArgument(
                        f"{outside[0]!r} already exists outside queue {queue!r}",
                        job_id=str(outside[0]))
                if added:
                    c.execute("SELECT pg_notify(%s, '')", (n.channel,))
                return added

        def settle() -> set[str]:
            rows = self.client.read(
                f"SELECT job_id FROM {n.jobs} WHERE job_id = ANY(%(ids)s) "
                "AND queue = %(queue)s", params)
            return {r[0] for r in rows}

        added = self.client.write(ids[0], run, settle)
        if added:
            self.wake_subscribers()
        return [i in added for i in ids]

    def claim_from_queue(
        self, session: SessionHandle, queue: str
    ) -> tuple[str, ClaimResult | None, bytes] | None:
        """``claim_next``'s one statement (see :meth:`Backend.claim_from_queue`): the oldest
        claimable job nobody is locking right now (``FOR UPDATE SKIP LOCKED``: concurrent
        claimers take different jobs instead of queueing on one row), claimed with a named
        claim's re-check. A lost answer is settled by reading back which job of the queue
        this session now holds.

        Raises:
            StoreRegressed: the server is not the store's any more (failover, restore).
            SessionExpired / BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
        """
        params = {"queue": queue, "sid": session.session_id, "owner": session.owner}

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...]:
            row = c.execute(self.sql.claim_from_queue, params).fetchone()
            assert row is not None  # the statement always returns its one row
            return row

        def settle() -> tuple[Any, ...]:
            held = self._one(f"SELECT 1 FROM {self.names.jobs} WHERE queue = %(queue)s AND "
                             "session_id = %(sid)s AND completed_at IS NULL LIMIT 1", params)
            if held is not None:  # which one is new cannot be told from the rows
                raise OutcomeUnknown(
                    f"claim_next({queue!r}): the answer was lost and session "
                    f"{session.session_id} holds a job of the queue, perhaps from this "
                    "claim (without a lease here: it is handed back when the session ends)")
            return ("", None, None, None, None, None, True, 0)  # not applied: try again

        row = self.client.write(None, run, settle)
        job_id, local, attempt, epoch, payload, expires_at, alive, dead = row
        if dead:
            self.wake_subscribers()  # waiters on those jobs learn they FAILED
        if local is None and not alive:  # not alive here: why (a failover: StoreRegressed)
            expired = self._expired(session.session_id, job_id)
            if job_id is not None or isinstance(expired, StoreRegressed):
                raise expired
        if job_id is None:
            return None
        if local is None:
            return job_id, None, b""
        claim = ClaimResult(compose(int(epoch), int(local), self.epoch_shift),
                            float(expires_at), int(attempt))
        return job_id, claim, bytes(payload or b"")

    def _completed_record(self, job_id: str, claim: ClaimResult, result: bytes,
                          row: Sequence[Any]) -> LeaseRecord:
        """The COMPLETED record from what the completion returned (owner, attempt,
        error, max_attempts) and what the caller knows."""
        owner, attempt, error, max_attempts = row
        return LeaseRecord(
            job_id=job_id, owner=owner, lease_until=None, generation=claim.generation,
            state=JobState.COMPLETED, result=bytes(result), attempt=int(attempt),
            error=error, not_before=None,
            max_attempts=None if max_attempts is None else int(max_attempts), value=None,
        )

    def _reject(self, session: SessionHandle, job_id: str, generation: int) -> LeaseError:
        raise NotImplementedError  # PostgresBackend's

    def _refused_completion(self, session: SessionHandle, job_id: str,
                            claim: ClaimResult) -> LeaseRecord | LeaseError:
        """A completion that did not apply: this session's earlier completion at this
        generation (a repeat: its record), else why not (``complete``'s rule)."""
        epoch, gen = split(claim.generation, self.epoch_shift)
        params = {"job": job_id, "sid": session.session_id, "gen": gen, "epoch": epoch}
        if self._one(self.sql.completed_by_me, params, job_id) is None:
            return self._reject(session, job_id, claim.generation)
        record = self.get(job_id)
        assert record is not None
        return record

    def complete_many(
        self, session: SessionHandle, items: Sequence[CompleteItem]
    ) -> list[LeaseRecord | LeaseError]:
        """Every item's completion (the compare and write of :meth:`complete`) in **one
        statement** (one round trip, one transaction; at most ``max_complete_batch``
        items; the rows locked in job-id order): each item its own outcome. A batch that
        meets a row locked by an open ``lease.transaction`` (``lock_timeout``) or a
        deadlock is completed one job at a time by :meth:`complete`. Only refused items
        are read again (a repeat of this session's completion, or why not). A lost
        answer is settled by reading back which items this session completed; none: the
        statement did not apply and runs once more.

        Raises:
            BackendUnavailable / OutcomeUnknown: nothing known to be applied.
        """
        if not items:
            return []
        ids = [it[0] for it in items]
        splits = [split(it[1].generation, self.epoch_shift) for it in items]
        params = {"jobs": ids, "gens": [g for _, g in splits],
                  "epochs": [e for e, _ in splits], "results": [it[2] for it in items],
                  "sid": session.session_id}

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> list[tuple[Any, ...]] | None:
            try:
                return self.client.cursor(c).execute(
                    self.sql.complete_many, params, binary=True).fetchall()
            except (pgerrors.LockNotAvailable, pgerrors.DeadlockDetected):
                return None  # rolled back: one at a time below

        def settle() -> list[tuple[Any, ...]] | None:
            done = {r[0] for r in self.client.read(self.sql.completed_many_by_me, params,
                                                   ids[0])}
            if not done:
                return self.client.write(ids[0], run)  # it was not applied: once more
            return [(j, None, None, None, None, False) for j in ids]  # each read below

        rows = self.client.write(ids[0], run, settle)
        if rows is None:  # a row locked by a lease.transaction, or a deadlock
            return super().complete_many(session, items)
        self.wake_subscribers()
        outcomes: list[LeaseRecord | LeaseError] = []
        for (job_id, claim, result), row in zip(items, rows, strict=True):
            if row[5]:
                outcomes.append(self._completed_record(job_id, claim, result, row[1:5]))
            else:
                outcomes.append(self._refused_completion(session, job_id, claim))
        return outcomes

    def complete_and_claim_next(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes,
        queue: str,
    ) -> tuple[LeaseRecord, QueuePick | None]:
        """The completion of :meth:`complete` and ``claim_next``'s claim
        (:meth:`claim_from_queue`: ``FOR UPDATE SKIP LOCKED``, exhausted jobs at the head
        FAILED), gated on the completion, in **one statement** (one round trip, one
        transaction). When the picked job's re-check lost a race, the completion stands
        and :meth:`claim_from_queue` is tried (one more round trip each, a few times).

        A lost answer is settled by reading back: the completion not applied, the
        statement runs once more; applied, the record is returned with no next job (a job
        it may have claimed stays this session's until the session ends: which one cannot
        be told from the rows).

        Raises:
            StaleLeaseError / SessionExpired: the completion was refused; nothing claimed.
            StoreRegressed: the server is not the store's any more; nothing claimed.
            BackendUnavailable / OutcomeUnknown: as :meth:`complete`.
        """
        epoch, gen = split(claim.generation, self.epoch_shift)
        params = {"job": job_id, "sid": session.session_id, "gen": gen, "epoch": epoch,
                  "result": result, "queue": queue, "owner": session.owner}
        lost = ("lost",)

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...]:
            row = self.client.cursor(c).execute(
                self.sql.complete_claim_next, params, binary=True).fetchone()
            assert row is not None  # the statement always returns its one row
            return row

        def settle() -> tuple[Any, ...]:
            if self._one(self.sql.completed_by_me, params, job_id) is None:
                return self.client.write(job_id, run)  # not applied: once more
            return lost

        row = self.client.write(job_id, run, settle)
        self.wake_subscribers()
        if row is lost:
            record = self._refused_completion(session, job_id, claim)
            assert isinstance(record, LeaseRecord)
            return record, None
        _, _, _, _, next_id, local, attempt, next_epoch, payload, expires_at, _, _ = row
        if row[1] is None:  # the completion did not apply (attempt is never NULL)
            refused = self._refused_completion(session, job_id, claim)
            if isinstance(refused, LeaseError):
                raise refused
            return refused, self._claim_queue_head(session, queue)  # a repeat: claim alone
        record = self._completed_record(job_id, claim, result, row[0:4])
        if next_id is None:
            return record, None
        if local is None:  # the picked job's re-check lost a race: try the usual way
            try:
                return record, self._claim_queue_head(session, queue)
            except LeaseError:  # the completion stands
                return record, None
        got = ClaimResult(compose(int(next_epoch), int(local), self.epoch_shift),
                          float(expires_at), int(attempt))
        return record, (next_id, got, bytes(payload or b""))

    def queue_candidates(self, queue: str, limit: int) -> list[tuple[str, bytes]]:
        rows = self.client.read(self.sql.candidates, {"queue": queue, "limit": int(limit)})
        return [(r[0], bytes(r[1] or b"")) for r in rows]

    def queue_jobs(self, queue: str, limit: int | None = None) -> list[QueuedJob]:
        sql = (self.sql.select.replace(f" FROM {self.names.jobs} j",
                                       f", j.payload, j.seq FROM {self.names.jobs} j", 1)
               + " WHERE j.queue = %(queue)s ORDER BY j.seq")
        params: dict[str, Any] = {"queue": queue}
        if limit is not None:
            sql += " LIMIT %(limit)s"
            params["limit"] = int(limit)
        return [
            QueuedJob(queue, self._to_record(row[:-2]), bytes(row[-2] or b""), int(row[-1]))
            for row in self.client.read(sql, params)
        ]

    def queue_stats(self, queue: str) -> QueueStats:
        """Counts of ``queue``'s jobs by state: one statement, one consistent snapshot (a
        claim committing meanwhile is either counted or not, never half), the server's
        clock read once for it. HELD comes from the queue's open jobs whose session is
        alive (the ``cl_jobs_open_by_queue`` index: O(open jobs)); the other counts from
        one pass over the queue's rows inside the server (O(jobs in the queue), completed ones until
        purged: about 20 ms per 100,000 jobs on a 2-core VM); only the counts travel.
        Bounded by ``timeout_s`` (``BackendUnavailable`` past it)."""
        n = self.names
        open_job = "j.completed_at IS NULL AND j.failed_at IS NULL"
        row = self._one(
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

    def wait_for_queue(self, queue: str, timeout_s: float) -> None:
        self._wait(lambda wake: self.subscribe_queue(queue, wake), timeout_s)

    def purge(self, queue: str) -> int:
        return int(self.client.write(None, lambda c: c.execute(
            f"DELETE FROM {self.names.jobs} WHERE queue = %s AND completed_at IS NOT NULL",
            (queue,)).rowcount, lambda: 0))
