"""In-process store: the reference implementation of the backend contract, and the fake
for unit tests.

``open_store("memory://")`` makes a new, empty store each time (no hidden global state):
share the returned :class:`~consensus_lease.LeaseStore` between threads to race them.
Its store clock is injectable (``open_store("memory://", store_clock=FakeClock())``) so a
test can expire a session by advancing time instead of sleeping. One lock makes every
operation atomic, as one etcd transaction or ZooKeeper multi would be.

Tokens are ``epoch * 2**32 + generation`` (``epoch_shift`` 32): ``generation`` +1 per
claim of the job, ``epoch`` the store's epoch when the claim was made (0 until
``bump_epoch``). A memory store has no history to regress: it never raises
``StoreRegressed``.

Elections (``capabilities.elections``): an election key
(:func:`consensus_lease._election.election_key`) is a job like any other in the job table,
left out of ``records()``; its leader's value (``set_value``) lives with the hold and is
dropped when the hold ends. Subscribers of an election key are woken after every change
of it (claim, value, release, expiry).

Queues: each queue keeps its open jobs (neither COMPLETED nor FAILED) in ``seq`` order
and its counts of jobs, COMPLETED and FAILED ones, updated by the operation that changes
them; so ``queue_candidates`` skips only held jobs and jobs in a retry delay at the head,
and ``queue_stats`` costs O(jobs with a holder recorded), whatever the depth.
``enqueue_many`` adds up to ``max_enqueue_batch`` (1,000,000) jobs under the one lock,
atomically. Capacity (``capabilities.max_queue_jobs`` is ``None``): no limit is enforced;
a queue is bounded by the process's memory (about 1 KB per job plus its payload).
``complete_many`` (up to ``max_complete_batch``, 1,000,000) and
``complete_and_claim_next`` (``fused_claim_next``) run under the one lock: one atomic step,
and so do ``claim_from_queue_many`` (up to ``max_queue_claim_batch``, 1,000,000 jobs),
``release_many`` and ``fail_many`` (up to ``max_end_batch``, 1,000,000).

Options (keyword arguments of ``open_store``; anything else is ``InvalidArgument``, see
:mod:`consensus_lease.options`):

=============  ===========================  ==========================================
option         default                      meaning
=============  ===========================  ==========================================
store_clock    the system clock             a :class:`~consensus_lease.Clock`; its
                                            ``time()`` is the store's time
=============  ===========================  ==========================================
"""

from __future__ import annotations

import bisect
import itertools
import threading
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from .._election import ChangeTracker, is_election_key
from .._epoch import compose, next_epoch, split
from ..backend import (
    Backend,
    Capabilities,
    CompleteItem,
    FailItem,
    QueuePick,
    ReleaseItem,
    SessionHandle,
    StateListener,
)
from ..clock import Clock, SystemClock
from ..errors import (
    InvalidArgument,
    JobCompleted,
    JobFailed,
    LeaseError,
    LeaseLost,
    SessionExpired,
    StaleLeaseError,
)
from ..options import Option, OptionTable
from ..record import ClaimResult, EnqueueItem, JobState, LeaseRecord, QueuedJob, QueueStats

__all__ = ["MemoryBackend"]

OPTIONS = OptionTable(
    "memory://",
    [
        Option("store_clock", "object", None, "the store's clock (keyword argument only)",
               instance_of=Clock),
    ],
)
"""The options of ``memory://`` (see the module docstring)."""


@dataclass
class _Session:
    owner: str
    ttl_s: float
    expires_at: float


@dataclass
class _Job:
    generation: int = 0
    epoch: int = 0  # the store's epoch at the current or last claim
    session_id: str | None = None
    owner: str | None = None
    completed_by: str | None = None
    result: bytes | None = None
    queue: str | None = None
    payload: bytes = b""
    seq: int = 0
    attempt: int = 0
    attempt_base: int = 0
    max_attempts: int | None = None
    error: str | None = None
    not_before: float | None = None
    failed: bool = False
    value: bytes | None = None  # the leader's value, for an election key

    @property
    def completed(self) -> bool:
        return self.completed_by is not None

    def exhausted(self) -> bool:
        """Every attempt of the current budget was made."""
        return self.max_attempts is not None and (
            self.attempt - self.attempt_base >= self.max_attempts
        )


@dataclass
class _Queue:
    """One queue's index (kept under the backend's lock by every operation on its jobs).

    Attributes:
        ids: every job id of the queue, in ``seq`` (enqueue) order.
        open: ``(seq, job_id)`` of the jobs neither COMPLETED nor FAILED, sorted.
        holding: open jobs whose holder is recorded (alive or expired session).
        completed / failed: how many jobs are COMPLETED / FAILED.
    """

    ids: dict[str, None] = field(default_factory=dict)
    open: list[tuple[int, str]] = field(default_factory=list)
    holding: set[str] = field(default_factory=set)
    completed: int = 0
    failed: int = 0

    def close(self, job_id: str, job: _Job) -> None:
        """The open job ended (COMPLETED or FAILED)."""
        del self.open[bisect.bisect_left(self.open, (job.seq, job_id))]
        self.holding.discard(job_id)


class MemoryBackend(Backend):
    """A store in this process's memory. See the module docstring."""

    scheme = "memory"
    capabilities = Capabilities(
        cross_process=False,
        store_watch=True,
        consecutive_generations=True,
        min_ttl_s=0.001,
        max_ttl_s=7 * 24 * 3600.0,
        max_batch_claim=1024,
        queues=True,
        max_payload_bytes=16 * 1024 * 1024,
        description="in-process memory (tests; one process only)",
        epoch=True,
        elections=True,
        max_enqueue_batch=1_000_000,
        max_queue_jobs=None,
        max_complete_batch=1_000_000,
        fused_claim_next=True,
        max_queue_claim_batch=1_000_000,
        max_end_batch=1_000_000,
    )
    poll_interval_s = 0.02

    def __init__(self, store_clock: Clock | None = None) -> None:
        self._clock: Clock = store_clock or SystemClock()
        self._cond = threading.Condition()
        self._sessions: dict[str, _Session] = {}
        self._jobs: dict[str, _Job] = {}
        self._queues: dict[str, _Queue] = {}
        self._seq = itertools.count(1)
        self._epoch = 0
        self._elections = ChangeTracker()

    @classmethod
    def from_url(cls, url: str, options: Mapping[str, object]) -> MemoryBackend:
        rest = url.split("://", 1)[1].split("?", 1)[0]
        if rest.strip("/"):
            raise InvalidArgument(f"memory:// takes no host or path, got {url!r}")
        clock = OPTIONS.parse(options).value("store_clock")
        assert clock is None or isinstance(clock, Clock)
        return cls(clock)

    # -- helpers (call with the lock held) -----------------------------------------

    def _changed(self) -> None:
        """The store changed: wake ``wait_for_*`` and the subscription poller."""
        self._cond.notify_all()
        self.wake_subscribers()

    def _now(self) -> float:
        return self._clock.time()

    def _alive(self, session_id: str | None) -> bool:
        if session_id is None:
            return False
        sess = self._sessions.get(session_id)
        return sess is not None and sess.expires_at > self._now()

    def _require_alive(
        self, session: SessionHandle, job_id: str | None = None, generation: int | None = None
    ) -> None:
        if not self._alive(session.session_id):
            raise SessionExpired(
                f"session {session.session_id} expired in the store",
                job_id=job_id,
                generation=generation,
            )

    def _token(self, job: _Job) -> int:
        """The job's current or last token: its claim's epoch folded into its generation."""
        return compose(job.epoch, job.generation, self.epoch_shift)

    def _holds(self, session: SessionHandle, job_id: str, generation: int) -> _Job:
        """The job if ``session`` holds it at ``generation``. Otherwise ``SessionExpired``
        while the job is still at that generation with no other holder (the session's
        end, by expiry or ``close_session``, is the reason), else ``StaleLeaseError``
        (see :meth:`Backend.complete <consensus_lease.backend.Backend.complete>`)."""
        job = self._jobs.get(job_id)
        epoch, local = split(generation, self.epoch_shift)
        if (job is not None and (job.epoch, job.generation) == (epoch, local)
                and not job.completed and job.session_id in (session.session_id, None)):
            self._require_alive(session, job_id, generation)
            if job.session_id == session.session_id:
                return job
        current = None if job is None else self._token(job)
        raise StaleLeaseError(
            f"{job_id!r} is not held by session {session.session_id} at generation "
            f"{generation} (store has generation {current})",
            job_id=job_id,
            generation=generation,
            current_generation=current,
        )

    def _record(self, job_id: str, job: _Job) -> LeaseRecord:
        if job.completed:
            state = JobState.COMPLETED
        elif job.failed:
            state = JobState.FAILED
        elif self._alive(job.session_id):
            state = JobState.HELD
        else:
            state = JobState.AVAILABLE
        sess = self._sessions.get(job.session_id or "")
        return LeaseRecord(
            job_id=job_id,
            owner=job.owner,
            lease_until=sess.expires_at if sess is not None and state is JobState.HELD else None,
            generation=self._token(job),
            state=state,
            result=job.result,
            attempt=job.attempt,
            error=job.error,
            not_before=job.not_before if state is JobState.AVAILABLE else None,
            max_attempts=job.max_attempts,
            value=job.value if state is JobState.HELD else None,
        )

    def _hold(self, job_id: str, job: _Job, session_id: str | None) -> None:
        """Record the job's holder (``None``: nobody), keeping its queue's index."""
        job.session_id = session_id
        if job.queue is not None:
            holding = self._queues[job.queue].holding
            if session_id is None:
                holding.discard(job_id)
            else:
                holding.add(job_id)

    def _end(self, job_id: str, job: _Job) -> None:
        """The job just became COMPLETED or FAILED: out of its queue's open jobs."""
        if job.queue is not None:
            queue = self._queues[job.queue]
            queue.close(job_id, job)
            if job.completed:
                queue.completed += 1
            else:
                queue.failed += 1

    def _waiting(self, job: _Job) -> bool:
        """A retry delay is still running."""
        return job.not_before is not None and job.not_before > self._now()

    def _refuse_final(self, job_id: str, job: _Job) -> None:
        if job.completed:
            raise JobCompleted(
                f"{job_id!r} was completed at generation {self._token(job)}",
                job_id=job_id,
                generation=self._token(job),
            )
        if job.failed:
            raise JobFailed(
                f"{job_id!r} FAILED after {job.attempt} attempt(s): {job.error}",
                job_id=job_id, generation=self._token(job), attempt=job.attempt,
                error=job.error,
            )

    # -- sessions ------------------------------------------------------------------

    def open_session(
        self, owner: str, ttl_s: float, on_event: StateListener | None = None
    ) -> SessionHandle:
        session_id = uuid.uuid4().hex
        with self._cond:
            self._sessions[session_id] = _Session(owner, ttl_s, self._now() + ttl_s)
        return SessionHandle(session_id, owner, ttl_s)

    def keepalive(self, session: SessionHandle) -> float:
        with self._cond:
            self._require_alive(session)
            sess = self._sessions[session.session_id]
            sess.expires_at = self._now() + sess.ttl_s
            return sess.ttl_s

    def close_session(self, session: SessionHandle) -> None:
        with self._cond:
            self._sessions.pop(session.session_id, None)
            for job_id, job in self._jobs.items():
                if job.session_id == session.session_id:
                    self._hold(job_id, job, None)
                    job.value = None
            self._changed()

    def expire_session(self, session_id: str) -> None:
        """Test hook: make the store expire a session now, as its TTL running out would."""
        with self._cond:
            if session_id in self._sessions:
                self._sessions[session_id].expires_at = self._now()
            self._changed()

    # -- jobs ----------------------------------------------------------------------

    def claim(self, session: SessionHandle, job_id: str) -> ClaimResult | None:
        with self._cond:
            self._require_alive(session, job_id)
            job = self._jobs.setdefault(job_id, _Job())
            self._refuse_final(job_id, job)
            if self._alive(job.session_id) or self._waiting(job):
                return None
            if job.exhausted():
                job.failed = True
                self._hold(job_id, job, None)
                self._end(job_id, job)
                job.error = job.error or (
                    f"attempts exhausted: attempt {job.attempt} ended without completion"
                )
                self._refuse_final(job_id, job)
            job.generation += 1
            job.epoch = self._epoch
            job.attempt += 1
            job.not_before = None
            self._hold(job_id, job, session.session_id)
            job.owner = session.owner
            job.value = None
            if is_election_key(job_id):
                self._changed()  # observers of the election learn the new leader
            expires = self._sessions[session.session_id].expires_at
            return ClaimResult(self._token(job), expires, job.attempt)

    def renew(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> float:
        generation = claim.generation
        with self._cond:
            job = self._holds(session, job_id, generation)
            del job
            return self.keepalive(session)

    def complete(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes
    ) -> LeaseRecord:
        generation = claim.generation
        with self._cond:
            job = self._jobs.get(job_id)
            if (
                job is not None
                and job.completed_by == session.session_id
                and self._token(job) == generation
            ):
                return self._record(job_id, job)  # a retry of our own completion
            job = self._holds(session, job_id, generation)
            job.completed_by = session.session_id
            self._hold(job_id, job, None)
            self._end(job_id, job)
            job.value = None
            job.result = result
            self._changed()
            return self._record(job_id, job)

    def complete_many(
        self, session: SessionHandle, items: Sequence[CompleteItem]
    ) -> list[LeaseRecord | LeaseError]:
        """Every item under the one lock (one atomic step); each its own outcome."""
        outcomes: list[LeaseRecord | LeaseError] = []
        with self._cond:
            for job_id, claim, result in items:
                try:
                    outcomes.append(self.complete(session, job_id, claim, result))
                except LeaseLost as exc:
                    outcomes.append(exc)
        return outcomes

    def complete_and_claim_next(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes,
        queue: str,
    ) -> tuple[LeaseRecord, QueuePick | None]:
        """The completion and the claim of the oldest claimable job of ``queue``, under
        the one lock (one atomic step)."""
        with self._cond:
            record = self.complete(session, job_id, claim, result)
            while True:
                head = self._claimable(queue, 1)
                if not head:
                    return record, None
                next_id, job = head[0]
                try:
                    got = self.claim(session, next_id)
                except JobFailed:  # its attempts ran out: FAILED now, off the open list
                    continue
                if got is not None:
                    return record, (next_id, got, job.payload)
                return record, None  # cannot happen under the lock; no guessing

    def claim_from_queue_many(
        self, session: SessionHandle, queue: str, n: int
    ) -> list[QueuePick]:
        """Up to ``n`` of the oldest claimable jobs of ``queue``, each claimed by
        :meth:`claim`, under the one lock (one atomic step); a job whose attempts ran
        out on the way becomes FAILED and the walk goes on."""
        picks: list[QueuePick] = []
        with self._cond:
            self._require_alive(session)
            while len(picks) < n:
                head = self._claimable(queue, n - len(picks))
                if not head:
                    break
                failed = 0
                for next_id, job in head:
                    try:
                        got = self.claim(session, next_id)
                    except JobFailed:  # its attempts ran out: FAILED now, off the open list
                        failed += 1
                        continue
                    if got is not None:  # always, under the lock
                        picks.append((next_id, got, job.payload))
                if not failed:
                    break  # each of head was claimed: n reached, or nothing more there
        return picks

    def release(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> None:
        generation = claim.generation
        with self._cond:
            job = self._holds(session, job_id, generation)
            self._hold(job_id, job, None)
            job.value = None
            job.owner = None
            self._changed()

    def release_many(
        self, session: SessionHandle, items: Sequence[ReleaseItem]
    ) -> list[LeaseError | None]:
        """Every item by :meth:`release` under the one lock (one atomic step); each its
        own outcome."""
        with self._cond:
            return Backend.release_many(self, session, items)

    def fail_many(
        self, session: SessionHandle, items: Sequence[FailItem]
    ) -> list[LeaseRecord | LeaseError]:
        """Every item by :meth:`fail` under the one lock (one atomic step); each its own
        outcome."""
        with self._cond:
            return Backend.fail_many(self, session, items)

    def set_value(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, value: bytes
    ) -> None:
        with self._cond:
            job = self._holds(session, job_id, claim.generation)
            job.value = value
            self._changed()

    def fail(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, error: str,
        retry_in_s: float,
    ) -> LeaseRecord:
        with self._cond:
            job = self._holds(session, job_id, claim.generation)
            self._hold(job_id, job, None)
            job.value = None
            job.error = error
            if job.exhausted():
                job.failed = True
                self._end(job_id, job)
            else:
                job.not_before = self._now() + retry_in_s if retry_in_s > 0 else None
            self._changed()
            return self._record(job_id, job)

    def requeue(self, job_id: str) -> LeaseRecord:
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None or not job.failed:
                state = "unknown" if job is None else self._record(job_id, job).state.value
                raise InvalidArgument(
                    f"only a FAILED job can be requeued; {job_id!r} is {state}", job_id=job_id
                )
            job.failed = False
            if job.queue is not None:
                queue = self._queues[job.queue]
                queue.failed -= 1
                bisect.insort(queue.open, (job.seq, job_id))
            job.attempt_base = job.attempt
            job.not_before = None
            self._changed()
            return self._record(job_id, job)

    # -- work queues ---------------------------------------------------------------

    def enqueue(
        self, queue: str, job_id: str, payload: bytes, max_attempts: int | None = None
    ) -> bool:
        return self.enqueue_many(queue, [EnqueueItem(job_id, payload, max_attempts)])[0]

    def enqueue_many(self, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
        """Enqueue ``items`` under the one lock (see :meth:`Backend.enqueue_many`):
        all new jobs are added, or none.

        Raises:
            InvalidArgument: a job exists outside ``queue``; nothing was added.
        """
        with self._cond:
            for item in items:
                job = self._jobs.get(item.job_id)
                if job is not None and job.queue != queue:
                    raise InvalidArgument(
                        f"{item.job_id!r} already exists outside queue {queue!r}",
                        job_id=item.job_id)
            added = [item.job_id not in self._jobs for item in items]
            index = self._queues.setdefault(queue, _Queue())
            for item, new in zip(items, added, strict=True):
                if new:
                    seq = next(self._seq)
                    self._jobs[item.job_id] = _Job(queue=queue, payload=item.payload, seq=seq,
                                                   max_attempts=item.max_attempts)
                    index.ids[item.job_id] = None
                    index.open.append((seq, item.job_id))  # the highest seq yet: sorted
            if any(added):
                self._changed()
            return added

    def _queued(self, queue: str) -> list[tuple[str, _Job]]:
        """Every job of ``queue``, in enqueue order."""
        index = self._queues.get(queue)
        return [] if index is None else [(j, self._jobs[j]) for j in index.ids]

    def _open(self, queue: str) -> list[tuple[str, _Job]]:
        """The jobs of ``queue`` neither COMPLETED nor FAILED, in enqueue order."""
        index = self._queues.get(queue)
        return [] if index is None else [(j, self._jobs[j]) for _, j in index.open]

    def _claimable(self, queue: str, limit: int) -> list[tuple[str, _Job]]:
        """Up to ``limit`` open jobs of ``queue`` that a claim would take, oldest first:
        walks the open jobs, skipping held ones and those in a retry delay."""
        index = self._queues.get(queue)
        found: list[tuple[str, _Job]] = []
        for _, job_id in [] if index is None else index.open:
            if len(found) >= limit:
                break
            job = self._jobs[job_id]
            if not self._blocked(job):
                found.append((job_id, job))
        return found

    def queue_candidates(self, queue: str, limit: int) -> list[tuple[str, bytes]]:
        with self._cond:
            return [(j, job.payload) for j, job in self._claimable(queue, limit)]

    def queue_jobs(self, queue: str, limit: int | None = None) -> list[QueuedJob]:
        with self._cond:
            return [
                QueuedJob(queue, self._record(j, job), job.payload, job.seq)
                for j, job in self._queued(queue)[:limit]
            ]

    def queue_stats(self, queue: str) -> QueueStats:
        """Counts kept by every operation, and the held jobs among those with a holder
        recorded: O(jobs with a holder), under the lock (one snapshot)."""
        with self._cond:
            index = self._queues.get(queue) or _Queue()
            ends = [
                self._sessions[job.session_id].expires_at
                for job in (self._jobs[j] for j in index.holding)
                if self._alive(job.session_id) and job.session_id is not None
            ]
            return QueueStats(
                queue=queue, available=len(index.open) - len(ends), held=len(ends),
                completed=index.completed, failed=index.failed,
                oldest_held_lease_until=min(ends) if ends else None,
            )

    def wait_for_queue(self, queue: str, timeout_s: float) -> None:
        with self._cond:
            wait = timeout_s
            index = self._queues.get(queue) or _Queue()
            expiries = [
                self._sessions[sid].expires_at - self._now()
                for sid in (self._jobs[j].session_id for j in index.holding)
                if sid in self._sessions
            ]
            expiries += [
                job.not_before - self._now()
                for _, job in self._open(queue)
                if job.not_before is not None
            ]
            if expiries:
                wait = min(wait, max(min(expiries), 0.001))
            if not isinstance(self._clock, SystemClock):
                wait = min(wait, 0.01)
            self._cond.wait(wait)

    def purge(self, queue: str) -> int:
        with self._cond:
            doomed = [j for j, job in self._queued(queue) if job.completed]
            index = self._queues.get(queue)
            for j in doomed:
                del self._jobs[j]
                if index is not None:
                    del index.ids[j]
                    index.completed -= 1
            return len(doomed)

    def get(self, job_id: str) -> LeaseRecord | None:
        with self._cond:
            job = self._jobs.get(job_id)
            return None if job is None else self._record(job_id, job)

    def records(self, limit: int | None = None) -> list[LeaseRecord]:
        with self._cond:
            ids = sorted(j for j in self._jobs if not is_election_key(j))[:limit]
            return [self._record(j, self._jobs[j]) for j in ids]

    def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        with self._cond:
            job = self._jobs.get(job_id)
            wait = timeout_s
            if job is not None and job.session_id in self._sessions:
                until_expiry = self._sessions[job.session_id].expires_at - self._now()
                wait = min(wait, max(until_expiry, 0.001))
            if job is not None and job.not_before is not None:
                wait = min(wait, max(job.not_before - self._now(), 0.001))
            if not isinstance(self._clock, SystemClock):
                wait = min(wait, 0.01)  # an injected clock can jump: look again soon
            self._cond.wait(wait)

    # -- subscriptions: the default poller, told exactly what is claimable ---------------

    def claimable_hint(
        self, job_ids: Sequence[str], queues: Sequence[str]
    ) -> tuple[Collection[str], Collection[str]] | None:
        """Jobs not held by a live session and in no retry delay (or completed or
        FAILED: their waiters must learn it), election keys that changed since the last
        poll (a hold that ends, expiry included, is a change: an election has no other
        way of becoming claimable), and queues with a claimable job. Polled every
        ``poll_interval_s`` (expiries and retry delays end without a change) and at once
        after every change."""
        with self._cond:
            elections = {j: self._election_state(j) for j in job_ids if is_election_key(j)}
            jobs = {j for j in job_ids
                    if j not in elections and not self._blocked(self._jobs.get(j))}
            ready = [q for q in queues if self._claimable(q, 1)]
        return jobs | self._elections.changed(elections), ready

    def _election_state(self, key: str) -> tuple[object, ...] | None:
        """What changes with an election's leader or value (call with the lock held)."""
        job = self._jobs.get(key)
        if job is None:
            return None
        return (job.epoch, job.generation, self._alive(job.session_id), job.value)

    def _blocked(self, job: _Job | None) -> bool:
        """A claim would find the job held or in its retry delay."""
        return job is not None and not (job.completed or job.failed) and (
            self._alive(job.session_id) or self._waiting(job))

    def store_time(self) -> float | None:
        return self._now()

    # -- the store epoch -----------------------------------------------------------

    def epoch(self) -> int:
        with self._cond:
            return self._epoch

    def bump_epoch(self, above: int | None = None) -> int:
        with self._cond:
            self._epoch = next_epoch(self._epoch, above, self.epoch_shift)
            return self._epoch

    def close(self) -> None:
        with self._cond:
            self._sessions.clear()
            self._changed()
        self.close_subscriptions()
