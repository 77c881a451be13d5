"""The narrow interface every store driver implements.

The protocol core (:mod:`consensus_lease.session`, :mod:`consensus_lease.lease`) is written
once against this interface and knows nothing of etcd, ZooKeeper or SQL. A driver decides
each per-job method in *one* atomic operation of its store in which the store itself makes
the ownership comparison (reads before it, or a keepalive beside it, may add round trips:
each driver's docstrings say which); the core adds local deadlines, keepalive, waiting and
input checks.

Drivers are found through the ``consensus_lease.backends`` entry-point group, keyed by URL
scheme (see :func:`consensus_lease.open_store`). A driver:

* receives only validated input (job ids, TTLs, timeouts are checked by the core);
* raises only :mod:`consensus_lease.errors` types, translating its client's exceptions
  with ``raise ... from``;
* resolves an ambiguous outcome (timeout after the store may have committed) by reading
  back, never by re-sending blindly; it raises :class:`~consensus_lease.errors.OutcomeUnknown`
  only when reading back cannot settle it;
* declares what it cannot do in :class:`Capabilities` instead of pretending.

The in-memory driver (:mod:`consensus_lease.backends.memory`) is the reference
implementation and the test fake.
"""

from __future__ import annotations

import abc
import enum
import random
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import ClassVar

from ._subscriptions import Poller, Unsubscribe, WakeCallback
from .errors import LeaseError, SessionExpired, UnsupportedOperation
from .observe import Observer
from .record import ClaimResult, EnqueueItem, JobState, LeaseRecord, QueuedJob, QueueStats

__all__ = [
    "Backend",
    "Capabilities",
    "CompleteItem",
    "FailItem",
    "OnceCheck",
    "QueuePick",
    "ReleaseItem",
    "SessionEvent",
    "SessionHandle",
    "StateListener",
    "Unsubscribe",
    "WakeCallback",
]

_POLLER_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can and cannot do. The conformance suite checks each claim.

    Attributes:
        cross_process: several OS processes (and machines, for servers) share the store.
        store_watch: waiting claims are woken by the store (etcd watch, ZooKeeper
            watch); ``False`` means they poll (see :meth:`Backend.subscribe_job`).
        consecutive_generations: each claim adds exactly 1 to the generation (within
            one store epoch). ``False`` (etcd: the token is a revision) still guarantees
            strictly increasing tokens.
        min_ttl_s / max_ttl_s: the range of TTLs accepted by ``open_session``.
        max_batch_claim: most claims one round trip can carry; 1 means no batching.
        queues: implements the work-queue methods (``enqueue`` ...).
        max_payload_bytes: largest queue payload the store accepts in one request
            (etcd's request size limit, ZooKeeper's jute.maxbuffer), checked before
            sending.
        description: one line for ``inspect`` and benchmarks.
        epoch: the store keeps an epoch folded into every token (``epoch``,
            ``bump_epoch``: tokens that keep increasing across a restore of the store)
            and notices a store whose history went back (``StoreRegressed``) where it
            can. ``False``: both raise ``UnsupportedOperation``.
        max_enqueue_batch: most jobs one :meth:`Backend.enqueue_many` round trip
            carries (etcd's ops per txn, ZooKeeper's multi within jute.maxbuffer); larger
            batches are split into atomic chunks of this size. 1 means no batching.
        max_queue_jobs: most jobs (any state, until purged) one queue may hold, enforced
            with ``QueueFull`` before the server is endangered; ``None``: bounded only by
            the store's disk.
        elections: accepts election keys (:mod:`consensus_lease._election`) in every
            per-job method, keeps them out of ``records()`` and queues, and implements
            :meth:`Backend.set_value`. ``False``: ``session.campaign`` and
            ``store.leader``/``watch_leader`` raise ``UnsupportedOperation``.
        regression_refusal: the store can notice that its history went back
            (``StoreRegressed``: restored from an older backup, wiped, a lagging standby
            promoted) and then refuses every session and claim, of the store object
            that noticed and of every one opened on the store afterwards, until
            ``bump_epoch``. ``False`` (memory: no history to go back): it never raises
            ``StoreRegressed``.
        transactions: the store is a database the caller can write to, and
            :meth:`Backend.lock_in` (``lease.transaction(conn)``, with its once-per-job
            effect records ``tx.once(effect_id)``) works on a connection of the caller's
            to it (PostgreSQL: a psycopg 3 connection; SQLite: a ``sqlite3``
            connection to the same file). ``False``: ``lease.transaction`` raises
            ``UnsupportedOperation``.
        max_complete_batch: most completions one :meth:`Backend.complete_many` call
            takes; the session splits longer lists. SQLite and PostgreSQL decide them in
            one transaction; ZooKeeper in one multi per up to 160 KB of results (the
            items of a multi that applies nothing are then completed one by one); etcd
            in one transaction per up to 1 MiB of results, a nested transaction with its
            own compares per item. 1 means no batching: the default
            :meth:`Backend.complete_many` sends one :meth:`Backend.complete` per item.
        fused_claim_next: :meth:`Backend.complete_and_claim_next` completes a job and
            claims the next one of a queue in one atomic store operation (one round
            trip in the common case: etcd adds a read-only candidate scan per 32 jobs,
            and claims again after its transaction when the candidate it nested was
            taken meanwhile; ZooKeeper: one multi of the completion and the claim of a
            job read ahead, the completion sent alone when that job was taken
            meanwhile). ``False``: the default sends a completion, then claims (two or
            more round trips; a claim that fails after the completion committed returns
            no next job).
        max_queue_claim_batch: most jobs one :meth:`Backend.claim_from_queue_many` call
            claims from a queue; ``Session.claim_next_many`` splits a larger ``n`` into
            calls of this size. Memory decides a call under its lock, SQLite in one
            ``BEGIN IMMEDIATE`` transaction, PostgreSQL in one statement (``FOR UPDATE
            SKIP LOCKED ... LIMIT n``), etcd in one transaction of nested claims after
            a read-only candidate scan, ZooKeeper in one claim multi (after one listing
            and one read of the candidates). 1 means no batching: the default
            :meth:`Backend.claim_from_queue_many` claims one job after the other, a
            round trip (or more) each.
        max_end_batch: most leases one :meth:`Backend.release_many` or
            :meth:`Backend.fail_many` call ends; the session splits longer lists. A field
            of its own, not ``max_complete_batch``. Memory decides a call under its
            lock, SQLite in one ``BEGIN IMMEDIATE`` transaction, PostgreSQL in one
            statement, etcd in one transaction of nested release or fail transactions
            (each with its own compares) per 100 items, ZooKeeper in one multi per up to
            128 items and 160 KB of error texts (the items of a multi that applies
            nothing are then ended one by one). 1 means no batching: the defaults send
            one :meth:`Backend.release` / :meth:`Backend.fail` per item.
    """

    cross_process: bool
    store_watch: bool
    consecutive_generations: bool
    min_ttl_s: float
    max_ttl_s: float
    max_batch_claim: int = 1
    queues: bool = False
    max_payload_bytes: int = 0
    description: str = ""
    epoch: bool = False
    elections: bool = False
    max_enqueue_batch: int = 1
    max_queue_jobs: int | None = None
    regression_refusal: bool = False
    transactions: bool = False
    max_complete_batch: int = 1
    fused_claim_next: bool = False
    max_queue_claim_batch: int = 1
    max_end_batch: int = 1


CompleteItem = tuple[str, ClaimResult, bytes]
"""One completion of :meth:`Backend.complete_many`: ``(job_id, claim, result)``, the
arguments :meth:`Backend.complete` takes for it."""

ReleaseItem = tuple[str, ClaimResult]
"""One release of :meth:`Backend.release_many`: ``(job_id, claim)``, the arguments
:meth:`Backend.release` takes for it."""

FailItem = tuple[str, ClaimResult, str, float]
"""One failure of :meth:`Backend.fail_many`: ``(job_id, claim, error, retry_in_s)``, the
arguments :meth:`Backend.fail` takes for it (``retry_in_s``: seconds >= 0 of store
time)."""

QueuePick = tuple[str, ClaimResult, bytes]
"""A job claimed from a queue: ``(job_id, claim, payload)``."""


class SessionEvent(enum.Enum):
    """Connection events a backend reports for a session (see ``StateListener``)."""

    SUSPENDED = "suspended"
    """Connection to the store lost; the session may still be alive in the store."""
    RECONNECTED = "reconnected"
    """Connection back and the store says the session is still alive. The core then
    re-confirms every lease before treating it as held again."""
    EXPIRED = "expired"
    """The store says the session expired. Final."""
    REGRESSED = "regressed"
    """The store's history went back (restored from an older backup, or wiped): the
    session is over, lost with ``StoreRegressed``. Final."""


OnceCheck = Callable[[str], bool]
"""What :meth:`Backend.lock_in`'s context manager yields: ``once(effect_id)`` records
``effect_id`` for the job in the caller's open transaction and returns ``True`` iff no
committed transaction (nor this one) recorded it before for this job, at any
generation. Raises ``BackendUnavailable`` if the database fails the statement (the
transaction is then unusable: the block should end with the error)."""

StateListener = Callable[[SessionEvent], None]
"""Called by a backend, from any thread, when a session's connection state changes.
Must not block."""


class SessionHandle:
    """A backend's live session: the store-side unit of liveness.

    Backends subclass this to carry their own state (etcd lease id, kazoo client, ...).

    Attributes:
        session_id: the store's id for the session, as text.
        owner: the owner label every claim of this session records.
        granted_ttl_s: the TTL the store granted (etcd may raise a small TTL; ZooKeeper
            clamps the session timeout to 2-20 x tickTime). The local deadline uses this.
        expiry: set by the backend before it reports ``SessionEvent.EXPIRED`` when it
            knows more than "expired" (``StoreRegressed``): the core loses the session
            with this error. ``None`` otherwise.
    """

    expiry: SessionExpired | None = None

    def __init__(self, session_id: str, owner: str, granted_ttl_s: float) -> None:
        self.session_id = session_id
        self.owner = owner
        self.granted_ttl_s = granted_ttl_s

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(session_id={self.session_id!r}, owner={self.owner!r}, "
            f"granted_ttl_s={self.granted_ttl_s})"
        )


class Backend(abc.ABC):
    """A store driver. Thread-safe: the core calls it from user threads and from the
    store's keepalive runners (:mod:`consensus_lease._renewer`) at once."""

    scheme: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    observer: Observer | None = None
    """Where the driver reports measurements of the store itself (SQLite's WAL size):
    set by the :class:`~consensus_lease.LeaseStore` given this driver and an observer."""

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str, options: Mapping[str, object]) -> Backend:
        """Build a driver from a store URL and its options (the URL's query string merged
        with keyword arguments of ``open_store``; keyword arguments win). Unknown options
        are an error.

        Raises:
            UnsupportedBackend / InvalidArgument: malformed URL or unknown option.
            BackendUnavailable: the store cannot be reached. The built-in drivers
                connect here (etcd and ZooKeeper within ``connect_timeout_s``), so that
                ``open_store`` reports an unreachable store; a driver that cannot should
                say so in its docstring.
        """

    # -- sessions -------------------------------------------------------------------

    @abc.abstractmethod
    def open_session(
        self, owner: str, ttl_s: float, on_event: StateListener | None = None
    ) -> SessionHandle:
        """Create a session with a TTL on the store's clock.

        Raises:
            BackendUnavailable: the store could not be reached; no session exists.
        """

    @abc.abstractmethod
    def keepalive(self, session: SessionHandle) -> float:
        """Extend the session by its TTL in one round trip; return the TTL granted.

        The caller timestamps the *send* of this request; a success means the session was
        alive when the store received it.

        Raises:
            SessionExpired: the store no longer has the session. Final.
            BackendUnavailable: no answer; the session may still be alive.
        """

    keepalive_batch: ClassVar[int] = 1
    """How many sessions' keepalives :meth:`keepalive_many` sends at once; 1 (the
    default): one after another, so the core hands it one session at a time, and one
    slow keepalive never delays the sending of another's."""

    def keepalive_many(
        self, sessions: Sequence[SessionHandle],
        on_result: Callable[[int, float | Exception], None],
    ) -> None:
        """:meth:`keepalive` for each of ``sessions`` (at most :attr:`keepalive_batch`),
        sent at once by a driver that can (etcd pipelines them on its streams), else
        one after another. ``on_result(i, ttl_or_error)`` is called for each as it ends,
        with the TTL granted or the exception its keepalive raised (``SessionExpired``,
        ``BackendUnavailable``, ...), never raised from here. Every session's request is
        sent after this call began: the caller's send time is before all of them."""
        for i, session in enumerate(sessions):
            try:
                ttl = self.keepalive(session)
            except Exception as exc:  # the session's own result, as keepalive() says
                on_result(i, exc)
                continue
            on_result(i, ttl)

    @abc.abstractmethod
    def close_session(self, session: SessionHandle) -> None:
        """End the session in the store; every job it holds becomes claimable at once.

        Best effort when the store is unreachable (the TTL then ends it). Idempotent.
        """

    # -- per-job operations: each decided by one atomic compare in the store ----------

    @abc.abstractmethod
    def claim(self, session: SessionHandle, job_id: str) -> ClaimResult | None:
        """Claim ``job_id`` for ``session`` if it is unowned or its holder's session
        expired, it is not completed or FAILED, and no retry delay (``fail``) is running.
        Returns the new generation and attempt, or ``None`` if a live session holds it
        (including this one) or its retry delay has not passed on the store's clock.

        If the job has a ``max_attempts`` and that many attempts were already made since
        the last requeue (the last one ended without completion: its lease expired or it
        was released), the job becomes FAILED in the same atomic step instead.

        Raises:
            JobCompleted: the job has a completion record (its generation attached).
            JobFailed: the job is FAILED (now or before).
            SessionExpired: ``session`` is gone in the store.
            BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
        """

    def claim_many(
        self, session: SessionHandle, job_ids: Sequence[str]
    ) -> list[ClaimResult | None]:
        """Claim several jobs; element ``i`` answers ``job_ids[i]`` as :meth:`claim`
        would, except that a completed or FAILED job yields ``None``. Drivers whose store can do
        it in one round trip override this (see ``Capabilities.max_batch_claim``)."""
        results: list[ClaimResult | None] = []
        from .errors import JobCompleted, JobFailed

        for job_id in job_ids:
            try:
                results.append(self.claim(session, job_id))
            except (JobCompleted, JobFailed):
                results.append(None)
        return results

    @abc.abstractmethod
    def renew(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> float:
        """Confirm in the store that ``session`` still holds ``job_id`` at
        ``claim.generation`` and extend the session's TTL; return the TTL granted.

        ``claim`` is what :meth:`claim` returned (or a ``ClaimResult`` with ``handle``
        ``None`` for a claim this process did not make); the same holds for
        :meth:`complete` and :meth:`release`.

        Raises:
            StaleLeaseError: owner or generation no longer match (or job completed).
            SessionExpired: the session is over (expired or closed) and no newer
                generation exists (the rule in :meth:`complete`).
            BackendUnavailable: see :mod:`consensus_lease.errors`.
        """

    @abc.abstractmethod
    def complete(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes
    ) -> LeaseRecord:
        """Record completion iff ``session`` holds ``job_id`` at ``claim.generation``; the
        owner hold ends in the same atomic step. Returns the COMPLETED record.

        A repeat of a completion this session already made at this generation returns
        the existing record without applying anything again.

        Which error a refused call raises (the same rule for :meth:`renew`,
        :meth:`release`, :meth:`fail` and :meth:`set_value`; the conformance suite holds
        every store to it): if the session is over in the store -- expired, or ended by
        :meth:`close_session` (``Session.close()``) in this or another process -- and the
        job is still at ``claim.generation`` with no other holder and not completed,
        ``SessionExpired``: the end of the session is why it is not held, and nothing of
        this session can be held again (open a new one). If another session has claimed
        the job since (a newer generation) or it was completed, ``StaleLeaseError`` with
        ``current_generation``: the newer holder is the reason, and the store reports it.
        Both are ``LeaseLost``. The two cases are told apart by the store's own record,
        never by what this process believes about its session.

        Raises:
            StaleLeaseError: not held at that generation (another holder, released,
                or completed by someone else).
            SessionExpired: the session is over and the job still at that generation
                (above).
            BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
        """

    def complete_many(
        self, session: SessionHandle, items: Sequence[CompleteItem]
    ) -> list[LeaseRecord | LeaseError]:
        """:meth:`complete` for each of ``items`` (distinct job ids, at most
        ``capabilities.max_complete_batch``), each checked for owner and generation by
        the store in the same atomic operation that records it. Element ``i`` is the
        COMPLETED record of ``items[i]``, or the error :meth:`complete` would raise for it
        (``StaleLeaseError`` / ``SessionExpired``, by the rule in :meth:`complete`): a
        refused item fails alone, the others commit. A repeat of a completion this
        session made at this generation is its existing record, as in :meth:`complete`.

        Drivers that batch (``max_complete_batch`` > 1) decide many items per atomic
        store operation and round trip (see ``Capabilities.max_complete_batch``), and
        settle a lost answer by reading back, as :meth:`complete` does; this default
        sends one :meth:`complete` per item, and an item whose request fails is answered
        with that error (``BackendUnavailable`` / ``OutcomeUnknown``) without stopping
        the others.

        Raises:
            BackendUnavailable: (SQL drivers) nothing of the list was applied.
            OutcomeUnknown: (SQL drivers) the list may or may not have been applied and
                reading back could not tell. (ZooKeeper raises neither: the items of a
                multi that failed are completed one by one, each with its own outcome.)
            SessionExpired: the session is gone and no item could be decided otherwise.
        """
        outcomes: list[LeaseRecord | LeaseError] = []
        for job_id, claim, result in items:
            try:
                outcomes.append(self.complete(session, job_id, claim, result))
            except LeaseError as exc:  # that item's own outcome, as the docstring says
                outcomes.append(exc)
        return outcomes

    def complete_and_claim_next(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes,
        queue: str,
    ) -> tuple[LeaseRecord, QueuePick | None]:
        """:meth:`complete` ``job_id``, then claim the oldest claimable job of ``queue``
        for ``session`` (the rules of :meth:`claim`; exhausted jobs found on the way
        become FAILED). Returns the COMPLETED record and ``(job_id, claim, payload)`` of
        the job claimed, or ``None`` when no job of ``queue`` was claimable: the
        completion commits either way. A refused completion claims nothing.

        Drivers with ``capabilities.fused_claim_next`` do both in one atomic store
        operation (one round trip), and settle a lost answer by reading back. This
        default sends :meth:`complete`, then claims as ``Session.claim_next`` does without
        waiting (:meth:`claim_from_queue` where the driver has it, else
        :meth:`queue_candidates` and :meth:`claim`); once the completion committed, an
        error of the claim is not raised: the call returns no next job.

        Raises:
            StaleLeaseError / SessionExpired: the completion was refused, as in
                :meth:`complete`; nothing was claimed.
            BackendUnavailable / OutcomeUnknown: as :meth:`complete`; nothing was claimed.
            UnsupportedOperation: the backend has no work queues.
        """
        if not self.capabilities.queues:
            raise UnsupportedOperation(f"the {self.scheme} backend has no work queues")
        record = self.complete(session, job_id, claim, result)
        try:
            return record, self._claim_queue_head(session, queue)
        except LeaseError:  # the completion stands; the caller may claim again
            return record, None

    def _claim_queue_head(self, session: SessionHandle, queue: str) -> QueuePick | None:
        """The looped claim of the defaults of :meth:`complete_and_claim_next` and
        :meth:`claim_from_queue_many` (once per job): a few tries of the oldest
        claimable jobs (from a random one of the oldest 8, as ``claim_next``), ``None``
        if none was taken. The candidates are read again as long as a read's walk found
        jobs COMPLETED or FAILED (never tried again by this call): any number of
        exhausted jobs at the head is walked past, one claim round trip each."""
        if type(self).claim_from_queue is not Backend.claim_from_queue:
            for _ in range(3):
                picked = self.claim_from_queue(session, queue)
                if picked is None:
                    return None
                picked_id, picked_claim, payload = picked
                if picked_claim is not None:
                    return picked_id, picked_claim, payload
            return None
        ended: set[str] = set()
        while True:
            known = len(ended)
            picked = self._claim_candidates(session, queue, ended)
            if picked is not None or len(ended) == known:
                return picked

    def _claim_candidates(
        self, session: SessionHandle, queue: str, ended: set[str]
    ) -> QueuePick | None:
        """One read of :meth:`queue_candidates` for :meth:`_claim_queue_head`, walked from
        a random one of the oldest 8 (so that workers completing at once do not all
        collide on the head of the queue), skipping and adding to ``ended`` the jobs
        found COMPLETED or FAILED."""
        from .errors import JobCompleted, JobFailed

        candidates = [c for c in self.queue_candidates(queue, 32) if c[0] not in ended]
        start = random.randrange(min(len(candidates), 8)) if candidates else 0
        for candidate_id, payload in candidates[start:] + candidates[:start]:
            try:
                got = self.claim(session, candidate_id)
            except (JobCompleted, JobFailed):
                ended.add(candidate_id)
                continue
            if got is not None:
                return candidate_id, got, payload
        return None

    @abc.abstractmethod
    def release(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> None:
        """End the hold iff ``session`` holds ``job_id`` at ``claim.generation``; the job is
        claimable at once.

        Raises:
            StaleLeaseError / SessionExpired: not held; which one as in :meth:`complete`.
            BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
        """

    @abc.abstractmethod
    def fail(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, error: str,
        retry_in_s: float,
    ) -> LeaseRecord:
        """End the hold iff ``session`` holds ``job_id`` at ``claim.generation`` and record
        ``error``, in one atomic step. If the job has a ``max_attempts`` and this was
        attempt ``max_attempts`` (counted since the last requeue) or later, the job
        becomes FAILED; otherwise it is AVAILABLE but not claimable before ``retry_in_s``
        seconds (>= 0) of *store* time have passed. Returns the record after it.

        Raises:
            StaleLeaseError / SessionExpired / BackendUnavailable / OutcomeUnknown: as
                :meth:`release`.
        """

    def release_many(
        self, session: SessionHandle, items: Sequence[ReleaseItem]
    ) -> list[LeaseError | None]:
        """:meth:`release` for each of ``items`` (distinct job ids, at most
        ``capabilities.max_end_batch``), each checked for owner and generation by the
        store in the same atomic operation that ends its hold. Element ``i`` is ``None``
        (``items[i]`` released: claimable at once) or the error :meth:`release` would
        raise for it (``StaleLeaseError`` / ``SessionExpired``, by the rule in
        :meth:`complete`): a refused item fails alone, the others are released.

        Drivers that batch (``max_end_batch`` > 1) decide all the items in one atomic
        store operation and round trip, and settle a lost answer by reading back, as
        :meth:`release` does; this default sends one :meth:`release` per item, and an
        item whose request fails is answered with that error (``BackendUnavailable`` /
        ``OutcomeUnknown``) without stopping the others.

        Raises:
            BackendUnavailable: (batching drivers) nothing of the list was applied.
            OutcomeUnknown: (batching drivers) the list may or may not have been applied
                and reading back could not tell. (ZooKeeper raises neither: a multi that
                failed is followed by each of its items alone, and one whose answer
                could not be read back answers each of its items ``OutcomeUnknown``.)
        """
        outcomes: list[LeaseError | None] = []
        for job_id, claim in items:
            try:
                self.release(session, job_id, claim)
            except LeaseError as exc:  # that item's own outcome, as the docstring says
                outcomes.append(exc)
                continue
            outcomes.append(None)
        return outcomes

    def fail_many(
        self, session: SessionHandle, items: Sequence[FailItem]
    ) -> list[LeaseRecord | LeaseError]:
        """:meth:`fail` for each of ``items`` (distinct job ids, at most
        ``capabilities.max_end_batch``), each checked for owner and generation by the
        store in the same atomic operation that ends its hold and records its error.
        Element ``i`` is the record after ``items[i]``'s failure, as :meth:`fail`
        returns it (AVAILABLE with ``not_before`` after its own ``retry_in_s`` of store
        time, or FAILED when its attempts are used up), or the error :meth:`fail` would
        raise for it: a refused item fails alone, the others apply.

        Drivers that batch (``max_end_batch`` > 1) decide all the items in one atomic
        store operation and round trip, and settle a lost answer by reading back, as
        :meth:`fail` does; this default sends one :meth:`fail` per item, each request's
        error its item's answer, as :meth:`release_many`'s.

        Raises:
            BackendUnavailable / OutcomeUnknown: as :meth:`release_many`.
        """
        outcomes: list[LeaseRecord | LeaseError] = []
        for job_id, claim, error, retry_in_s in items:
            try:
                outcomes.append(self.fail(session, job_id, claim, error, retry_in_s))
            except LeaseError as exc:  # that item's own outcome, as the docstring says
                outcomes.append(exc)
        return outcomes

    def set_value(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, value: bytes
    ) -> None:
        """Store ``value`` with the current hold iff ``session`` holds ``job_id`` at
        ``claim.generation`` (the ownership compare of :meth:`renew`, in the same atomic
        store operation as the write; one round trip for a claim this process made, etcd
        and ZooKeeper read first for one without its handle; a lost answer is settled by
        reading back). ``get(job_id).value`` returns it while the hold lasts; the hold's
        end (release, expiry, the next claim) clears it. Used by elections
        (``Capabilities.elections``) for the leader's value; ``job_id`` is an election
        key.

        Raises:
            StaleLeaseError / SessionExpired: not held at that generation; which one as in
                :meth:`complete`.
            BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
            UnsupportedOperation: the backend has no elections (the default).
        """
        raise UnsupportedOperation(f"the {self.scheme} backend has no leader elections")

    def lock_in(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, conn: object,
        lock_timeout_s: float | None,
    ) -> AbstractContextManager[OnceCheck]:
        """Transactional fencing (:meth:`consensus_lease.Lease.transaction`): a context
        manager that runs a transaction on ``conn`` (a connection to the store's own
        database) in which ``job_id`` stays held at ``claim.generation`` until it ends:
        entering it begins the transaction and checks (and locks) the hold, its exit
        commits (rolls back on an error). It yields the transaction's :data:`OnceCheck`,
        whose records live in the store's database and commit with the transaction.

        Raises:
            UnsupportedOperation: the store is not a database the caller can write to
                (the default; ``postgresql`` and ``sqlite`` implement it, and declare
                ``Capabilities.transactions``).
            StaleLeaseError / SessionExpired: (entering) not held at that generation.
        """
        raise UnsupportedOperation(
            f"lease.transaction() needs the lease and the effect in one database: the "
            f"{self.scheme} store cannot lock a lease inside your transaction (use a "
            f"postgresql:// store, or fence the effect: consensus_lease.fencing)"
        )

    @abc.abstractmethod
    def requeue(self, job_id: str) -> LeaseRecord:
        """FAILED -> AVAILABLE at once, with a fresh budget of ``max_attempts`` attempts
        (``attempt`` keeps counting; ``error`` is kept). Returns the record after it.

        Raises:
            InvalidArgument: the job is unknown or not FAILED; nothing changed.
            BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
        """

    # -- reading and waiting --------------------------------------------------------

    @abc.abstractmethod
    def get(self, job_id: str) -> LeaseRecord | None:
        """The job's record, or ``None`` if the store has never seen it."""

    @abc.abstractmethod
    def records(self, limit: int | None = None) -> list[LeaseRecord]:
        """Every job record (at most ``limit``), ordered by job id, for inspection.
        Election keys (:func:`consensus_lease._election.is_election_key`) are no jobs and
        never listed."""

    @abc.abstractmethod
    def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        """Block until ``job_id`` may have become claimable (its holder released,
        completed or expired, or its retry delay passed), or ``timeout_s`` passed.
        Spurious returns are allowed; the caller always re-tries the claim.

        For synchronous users and tests: the core waits through :meth:`subscribe_job`."""

    # -- subscriptions: how waiting claims are woken --------------------------------------

    poll_interval_s: float = 0.05
    """Seconds between two polls of the default subscription poller (drivers may set
    their own, per instance)."""

    _poller: Poller | None = None

    def subscribe_job(self, job_id: str, callback: WakeCallback) -> Unsubscribe:
        """Call ``callback()`` at least once after ``job_id`` may have become claimable:
        its holder released, completed, failed or expired, or its retry delay ended (and
        also when it was completed or FAILED, so that a waiting claim learns it). Spurious
        calls are allowed; the caller re-tries the claim after each one. The callback is
        called from any thread and must not block.

        The subscription is in place when this returns: callers subscribe, then claim,
        then wait, so a change between their claim and their wait is never missed (a job
        already claimable may be reported at once, or not at all).

        For an election key (:func:`consensus_lease._election.is_election_key`, backends
        with ``Capabilities.elections``) the callback is called after *every* change of
        the key, not only when it may have become claimable: also after each claim (a new
        leader) and each :meth:`set_value` (a new value). ``store.watch_leader(name)`` relies
        on it to report each leader; an extra call is harmless, a missed one is a bug.

        Returns:
            A function that cancels the subscription: idempotent, never blocks long.

        The default is one shared polling thread per backend (:mod:`._subscriptions`),
        which calls every callback each :attr:`poll_interval_s` unless
        :meth:`claimable_hint` narrows it down. Drivers with change notification (etcd
        watches, ZooKeeper watches) override this and :meth:`subscribe_queue`.
        """
        return self._subscriptions().subscribe_job(job_id, callback)

    def subscribe_queue(self, queue: str, callback: WakeCallback) -> Unsubscribe:
        """As :meth:`subscribe_job`, for any job of ``queue``: called at least once after
        one may have become claimable (enqueued, released, completed-with-others-waiting,
        expired, retry delay ended, requeued)."""
        return self._subscriptions().subscribe_queue(queue, callback)

    def claimable_hint(
        self, job_ids: Sequence[str], queues: Sequence[str]
    ) -> tuple[Collection[str], Collection[str]] | None:
        """For the default poller: which of the subscribed ``job_ids`` may be claimable,
        completed or FAILED now, and which of ``queues`` may have a claimable job — a
        superset is fine — in one cheap read; or ``None`` (the default) when the store
        cannot tell cheaply, which wakes every subscriber at every poll.

        Raises:
            BackendUnavailable: the poll wakes every subscriber instead.
        """
        return None

    def wake_subscribers(self) -> None:
        """Drivers call this after changing the store themselves (release, complete,
        fail, enqueue ...) so the default poller polls now, not at its next interval."""
        poller = self._poller
        if poller is not None:
            poller.poke()

    def close_subscriptions(self) -> None:
        """Stop the default poller and call every subscriber once (their claims then
        find the backend closed). Drivers call it from :meth:`close`; idempotent."""
        poller = self._poller
        if poller is not None:
            poller.close()

    def _subscriptions(self) -> Poller:
        poller = self._poller
        if poller is None:
            with _POLLER_LOCK:
                poller = self._poller
                if poller is None:
                    poller = Poller(f"consensus-lease-poll-{self.scheme}",
                                    self.poll_interval_s, self.claimable_hint)
                    self._poller = poller
        return poller

    # -- work queues (Capabilities.queues) ----------------------------------------------

    def enqueue(
        self, queue: str, job_id: str, payload: bytes, max_attempts: int | None = None
    ) -> bool:
        """Add ``job_id`` to ``queue`` with ``payload`` and its attempt limit
        (``None``: unlimited) if the store has never seen the job; return ``True`` if
        added, ``False`` if it is already in this queue (payload and limit unchanged).
        Atomic.

        Raises:
            InvalidArgument: the job exists outside this queue.
            BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
        """
        raise UnsupportedOperation(f"the {self.scheme} backend has no work queues")

    def enqueue_many(self, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
        """Enqueue ``items`` (distinct job ids, already checked, at most
        ``capabilities.max_enqueue_batch`` of them) in one atomic step where the store can:
        element ``i`` is what :meth:`enqueue` would return for ``items[i]``.
        ``max_attempts`` is already resolved (``None``: unlimited).

        Raises:
            InvalidArgument: a job exists outside this queue (nothing of the batch is
                added where the store batches atomically).
            QueueFull: the queue would exceed ``capabilities.max_queue_jobs``.
            BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
        """
        return [self.enqueue(queue, it.job_id, it.payload, it.max_attempts) for it in items]

    def queue_candidates(self, queue: str, limit: int) -> list[tuple[str, bytes]]:
        """Up to ``limit`` ``(job_id, payload)`` of ``queue`` that looked claimable
        (not held by a live session, not completed or FAILED, no retry delay running),
        oldest enqueued first. A hint only:
        the claim itself decides."""
        raise UnsupportedOperation(f"the {self.scheme} backend has no work queues")

    def queue_candidates_after_wake(self, queue: str, limit: int) -> list[tuple[str, bytes]]:
        """:meth:`queue_candidates` for a waiting ``claim_next`` once it is subscribed to
        ``queue`` (:meth:`subscribe_queue`): the try right after subscribing and each one
        its subscription wakes. Its view may be as old as what the subscription has seen,
        without what makes :meth:`queue_candidates` see every write completed before the
        call (ZooKeeper's ``sync``): a change it misses calls the subscription, which
        wakes the claim to look again. Same answer otherwise. The default:
        :meth:`queue_candidates`."""
        return self.queue_candidates(queue, limit)

    def claim_from_queue(
        self, session: SessionHandle, queue: str
    ) -> tuple[str, ClaimResult | None, bytes] | None:
        """Pick and claim the oldest claimable job of ``queue`` in one atomic store
        operation, skipping jobs other claimers are taking at that moment (PostgreSQL:
        ``FOR UPDATE SKIP LOCKED``). Returns ``(job_id, claim, payload)``; ``claim`` is
        ``None`` when the picked job's claim lost a race (try again); ``None`` when no job
        looked claimable. Exhausted jobs found on the way become FAILED.

        :meth:`Session.claim_next <consensus_lease.Session.claim_next>` uses it when a
        driver overrides it, else reads :meth:`queue_candidates` and claims them one by one.

        Raises:
            SessionExpired / BackendUnavailable / OutcomeUnknown: see
                :mod:`consensus_lease.errors`.
            UnsupportedOperation: the default.
        """
        raise UnsupportedOperation(f"the {self.scheme} backend has no one-step queue claim")

    def claim_from_queue_many(
        self, session: SessionHandle, queue: str, n: int
    ) -> list[QueuePick]:
        """Claim up to ``n`` (an int >= 1, checked by the core; at most
        ``capabilities.max_queue_claim_batch`` where that is above 1) of the oldest
        claimable jobs of ``queue`` for ``session``, each by the rules of :meth:`claim`:
        the store records owner and a generation above every earlier one of the job
        (the fencing token), its clock decides expiry and retry delays, and a job whose
        ``max_attempts`` are used up becomes FAILED instead (and is not returned).
        Jobs held by a live session are skipped, and so are jobs other claimers are
        taking at that moment (PostgreSQL: ``FOR UPDATE SKIP LOCKED``).

        Returns:
            ``(job_id, claim, payload)`` of each job claimed: distinct jobs, oldest
            enqueued first where the store orders them; fewer than ``n`` when fewer
            were claimable (or others took some meanwhile), ``[]`` when none was.

        Drivers with ``capabilities.max_queue_claim_batch`` > 1 decide the call in one
        atomic store operation (one round trip) and settle a lost answer by reading
        back, never by re-sending blindly (PostgreSQL: see its driver). This default
        claims one job after the other as ``claim_next`` does without waiting
        (:meth:`claim_from_queue` where the driver has it, else :meth:`queue_candidates`
        and :meth:`claim`, from a random one of the oldest 8 candidates, so not strictly
        oldest first: two round trips or more per job), each claim settling its own
        lost answer. An error after some jobs were claimed ends the call with those
        (the error is not raised, but ``SessionExpired``: the session's end takes them).

        Raises:
            SessionExpired: the session is gone in the store; nothing is held
                (``StoreRegressed``: the store went back).
            BackendUnavailable / OutcomeUnknown: before any job was claimed; see
                :mod:`consensus_lease.errors` (``OutcomeUnknown``: a claim may have been
                made without a lease here; it stays the session's until the session
                ends, and then its job is claimable again).
            TokenSpaceExhausted: (ZooKeeper) as :meth:`claim`, before any job was
                claimed.
            UnsupportedOperation: the backend has no work queues.
        """
        if not self.capabilities.queues:
            raise UnsupportedOperation(f"the {self.scheme} backend has no work queues")
        picks: list[QueuePick] = []
        try:
            while len(picks) < n:
                picked = self._claim_queue_head(session, queue)
                if picked is None:
                    break
                picks.append(picked)
        except SessionExpired:
            raise
        except LeaseError:  # the jobs claimed so far are held: hand them over
            if not picks:
                raise
        return picks

    def queue_jobs(self, queue: str, limit: int | None = None) -> list[QueuedJob]:
        """Every job of ``queue`` (at most ``limit``), oldest enqueued first; an unknown
        queue is empty."""
        raise UnsupportedOperation(f"the {self.scheme} backend has no work queues")

    def queue_stats(self, queue: str) -> QueueStats:
        """Counts of ``queue``'s jobs by state. This default reads every job
        (:meth:`queue_jobs`); drivers override it with maintained counters or bounded
        reads and document their cost and consistency."""
        jobs = self.queue_jobs(queue)
        held = [j.record for j in jobs if j.record.state is JobState.HELD]
        ends = [r.lease_until for r in held if r.lease_until is not None]
        return QueueStats(
            queue=queue,
            available=sum(j.record.state is JobState.AVAILABLE for j in jobs),
            held=len(held),
            completed=sum(j.record.state is JobState.COMPLETED for j in jobs),
            failed=sum(j.record.state is JobState.FAILED for j in jobs),
            oldest_held_lease_until=min(ends) if ends else None,
        )

    def wait_for_queue(self, queue: str, timeout_s: float) -> None:
        """Block until a job of ``queue`` may have become claimable (enqueued, released,
        expired, retry delay passed) or ``timeout_s`` passed. Spurious returns are allowed.

        For synchronous users and tests: the core waits through :meth:`subscribe_queue`."""
        raise UnsupportedOperation(f"the {self.scheme} backend has no work queues")

    def purge(self, queue: str) -> int:
        """Delete the records of ``queue``'s COMPLETED jobs; return how many. Held and
        available jobs are untouched."""
        raise UnsupportedOperation(f"the {self.scheme} backend has no work queues")

    def upgrade_queue(self, queue: str) -> int:
        """Bring ``queue``, written by an earlier consensus_lease, to this version's queue
        layout in place, for a store whose queues need an operator step for that; return
        how many open jobs were rewritten (0: nothing to do). Run it with the queue's
        workers and producers stopped. ``consensus-lease upgrade-queue`` calls it.

        The default is for a store that needs no such step: it upgrades its layout itself
        when opened (SQLite, PostgreSQL) or keeps nothing between processes (memory). A
        driver whose stores refuse queues of an earlier layout overrides it: etcd rewrites
        the queue; ZooKeeper raises an error giving the manual steps.

        Raises:
            UnsupportedOperation: the default: the store has no upgrade step (nothing to
                do; nothing was read or changed).
            BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
        """
        raise UnsupportedOperation(
            f"the {self.scheme} store upgrades its queues itself when opened: nothing to do")

    # -- the store epoch (tokens that survive a restore) ---------------------------------

    epoch_shift: ClassVar[int] = 32
    """Tokens are ``epoch * 2**epoch_shift + local`` where ``local`` is the store's own
    counter (SQLite/memory generation, etcd create_revision, ZooKeeper version); epoch 0
    (never bumped) leaves every token as the native counter."""

    def epoch(self) -> int:
        """The store's epoch now (0 if never bumped).

        Raises:
            BackendUnavailable: see :mod:`consensus_lease.errors`.
        """
        raise UnsupportedOperation(f"the {self.scheme} backend has no store epoch")

    def bump_epoch(self, above: int | None = None) -> int:
        """Atomically set the epoch to ``max(epoch + 1, above // 2**epoch_shift + 1)`` and
        return it: every token handed out afterwards exceeds every token handed out
        before, and ``above``. For use after restoring the store from a backup, while no
        worker runs.

        Raises:
            InvalidArgument: ``above`` < 0, or the epoch would leave the int64 token range.
            BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
        """
        raise UnsupportedOperation(f"the {self.scheme} backend has no store epoch")

    def store_time(self) -> float | None:
        """The store's clock now (seconds since the epoch), for display, or ``None`` if
        the store does not expose one (etcd, ZooKeeper)."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release client resources. Sessions still open are closed best-effort."""
