"""A worker session: the unit of liveness, owning one store-side session.

Many job leases live under one session, so renewal traffic grows with workers, not with
jobs: one keepalive every ``granted TTL / 3`` whatever the number of leases held (each
backend's docstring says what that request is). The session is composed of two parts, one
concept each: :mod:`._liveness` (deadline, state and keepalive schedule, run on threads
shared by the store's sessions, :mod:`._renewer`; the same for every backend) and
:mod:`._holdings` (the leases held and the one path every lease operation takes).
Claiming from a work queue is in :mod:`._queue_claim`.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import overload

from . import _campaign, _queue_claim
from ._callbacks import check_callback, run_callback
from ._callsite import caller_enters_with
from ._fork import abandon
from ._holdings import Holdings, item_error
from ._liveness import EventRelay, Liveness
from ._renewer import Renewer
from ._waiting import Waiters, wait_and_claim
from .backend import Backend, SessionEvent, SessionHandle
from .clock import Clock
from .election import Leadership
from .errors import (
    ClaimTimeout,
    InvalidArgument,
    LeaseError,
    LeaseLost,
    SessionExpired,
    StoreRegressed,
)
from .lease import Lease, check_not_ended, checked_completion, checked_failure
from .observe import Observer
from .record import LeaseRecord
from .retry import RetryPolicies
from .states import SessionState
from .validation import check_job_id, check_wait

__all__ = ["LossCallback", "Session"]

log = logging.getLogger("consensus_lease")

LossCallback = Callable[["Session", LeaseLost], None]
"""``callback(session, reason)``, called once when the session is lost."""


class Session:
    """A worker's session with the store; claim jobs from it.

    Create one with :meth:`consensus_lease.LeaseStore.session`. Use it as a context
    manager: closing it hands every held job back to the store.

    Loss is never swallowed: when the store reports the session expired, or the local
    deadline passes with no successful renewal, the session becomes LOST, every lease it
    holds becomes LOST, :attr:`lost` is set and each registered callback runs once.

    Once its store is closed, every method but :meth:`close` raises ``StoreClosed``; in
    a child made by ``fork()``, ``StoreInherited`` (there :meth:`close` only forgets the
    session, which stays the parent's).

    Attributes:
        backend (Backend): the driver.
        handle (SessionHandle): the driver's session.
        clock (Clock): used for the local deadline and waiting only.
    """

    def __init__(
        self,
        backend: Backend,
        handle: SessionHandle,
        *,
        clock: Clock,
        send_time: float,
        safety_margin_s: float | None = None,
        keepalive: bool = True,
        observer: Observer | None = None,
        events: EventRelay | None = None,
        retry: RetryPolicies | None = None,
        renewer: Renewer | None = None,
    ) -> None:
        self.backend = backend
        self.observer = observer
        self.handle = handle
        self.clock = clock
        self._liveness = Liveness(
            backend, handle, clock=clock, send_time=send_time,
            safety_margin_s=safety_margin_s, observer=observer,
        )
        self._holdings = Holdings(self._liveness, retry or RetryPolicies())
        self._waiters = Waiters()
        self._liveness.on_loss(lambda _reason: self._waiters.wake_all())
        self.lost = self._liveness.lost
        """Set once the session is LOST."""
        self._liveness.start(renewer, keepalive=keepalive)
        if events is not None:
            events.bind(self._on_backend_event)

    # -- introspection --------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self.handle.session_id

    @property
    def waiters(self) -> Waiters:
        """The wake-ups of this session's waiting claims (``wait_s=``, sync and
        asyncio), which closing or losing the session wakes. The claims register
        themselves (:mod:`consensus_lease._waiting`, :mod:`consensus_lease.aio`); read
        ``len(session.waiters)``, how many wait now, and leave the rest to them."""
        return self._waiters

    @property
    def owner(self) -> str:
        return self.handle.owner

    @property
    def granted_ttl_s(self) -> float:
        """The TTL the store granted, in seconds (updated by each renewal)."""
        return self._liveness.granted_ttl_s

    @property
    def safety_margin_s(self) -> float:
        """Seconds taken off the local deadline (see ``LeaseStore.session``)."""
        return self._liveness.safety_margin_s

    @property
    def deadline(self) -> float:
        """Monotonic time after which the session must be assumed lost."""
        return self._liveness.deadline

    def remaining_s(self) -> float:
        """Seconds left before :attr:`deadline` (negative once passed)."""
        return self._liveness.remaining_s()

    @property
    def state(self) -> SessionState:
        return self._liveness.state

    @property
    def lost_reason(self) -> LeaseLost | None:
        return self._liveness.lost_reason

    def leases(self) -> list[Lease]:
        """The leases this session currently holds (claimed, not completed/released)."""
        return self._holdings.leases()

    def __repr__(self) -> str:
        return (
            f"Session(session_id={self.session_id!r}, owner={self.owner!r}, "
            f"granted_ttl_s={self.granted_ttl_s}, state={self.state.value})"
        )

    def ensure_alive(self) -> None:
        """Raise unless the session may be used.

        Raises:
            LeaseLost (or SessionExpired): LOST or CLOSED, or past the local deadline.
            LeaseSuspended: SUSPENDED.
            StoreClosed / StoreInherited: the store was closed / this is a fork's child.
        """
        self._liveness.ensure_alive()

    def on_lost(self, callback: LossCallback) -> Callable[[], None]:
        """Register ``callback(session, reason)``, called once, from the thread that
        detects the loss, when the session is lost. Called at once if already lost.
        An exception from the callback is not raised into the keepalive thread: it is
        logged at ERROR on ``consensus_lease.callbacks`` (on stderr when logging is not
        configured) and counted (``Observer.callback_failed``).

        Returns:
            A function that unregisters the callback (a no-op once it ran).

        Raises:
            InvalidArgument: not a callable, an ``async def`` (called, never
                awaited, it would never run: see :mod:`consensus_lease.aio`), or one that
                cannot be called with two
                positional arguments (its signature); nothing registered.
            StoreClosed / StoreInherited: the store was closed / this is a fork's child.
        """
        self._liveness.check_usable()
        check_callback(callback, 2, "Session.on_lost", "callback(session, reason)")

        def listener(reason: LeaseLost) -> None:
            self._run_callback(callback, reason)

        reason = self._liveness.on_loss(listener)
        if reason is None:
            return lambda: self._liveness.remove_listener(listener)
        self._run_callback(callback, reason)
        return lambda: None

    def _run_callback(self, callback: LossCallback, reason: LeaseLost) -> None:
        run_callback(callback, (self, reason), "Session.on_lost", self.observer,
                     self.backend.scheme, session_id=self.session_id)

    # -- claiming --------------------------------------------------------------------

    @overload
    def claim(self, job_id: str, *, wait_s: None = None) -> Lease | None: ...

    @overload
    def claim(self, job_id: str, *, wait_s: float) -> Lease: ...

    def claim(self, job_id: str, *, wait_s: float | None = None) -> Lease | None:
        """Claim ``job_id``: atomically in the store, only if it is unowned or its
        holder's session expired, it is neither completed nor FAILED, and no retry delay
        runs. Each claim gets a generation
        strictly greater than every earlier one for the job (the fencing token).

        Two forms (the type checker knows which returns what)::

            lease = session.claim(job)                  # Lease | None: try once
            if lease is None: ...                       # held elsewhere

            with session.claim(job, wait_s=10) as lease:    # Lease, or ClaimTimeout
                ...

        ``with session.claim(job) as lease:`` (no ``wait_s``) cannot hand ``None`` to
        the ``with``: when the job is held it raises ``ClaimTimeout`` saying so, as
        ``wait_s=0`` would (on CPython, where the call site shows the ``with``; elsewhere
        ``None`` is returned and the ``with`` raises ``TypeError``).

        Args:
            job_id: non-empty str, at most 256 UTF-8 bytes, no NUL.
            wait_s: ``None`` tries once and returns ``None`` if the job is held (or its
                retry delay after a failed attempt has not passed yet). A number
                (seconds, >= 0) waits up to that long, woken by the store where it can
                (etcd and ZooKeeper watches, PostgreSQL's ``LISTEN``; SQLite polls), and
                raises ``ClaimTimeout`` instead of returning
                ``None`` — so ``with session.claim(job, wait_s=10) as lease:`` never runs
                its body without the lease. The wait holds no store request open
                (:meth:`Backend.subscribe_job`); closing the session ends it at once
                with ``LeaseLost``.

        Returns:
            A HELD :class:`Lease`, or ``None`` (only when ``wait_s`` is ``None``).

        Raises:
            InvalidArgument: bad job id or wait, or this session already holds the job.
            JobCompleted: the job is completed; it is never claimed again.
            JobFailed: the job is FAILED (its attempts ran out, possibly just now); it is
                not claimed again until ``store.requeue(job_id)``.
            ClaimTimeout: ``wait_s`` passed with the job still held elsewhere (or, see
                above, the job is held and the call is the ``with`` statement's).
            LeaseLost / SessionExpired: this session is lost or closed (also while the
                claim waited); open a new one.
            LeaseSuspended: this session is suspended; nothing was sent.
            BackendUnavailable / OutcomeUnknown: the store could not be asked, or a claim
                may have been applied and reading back could not tell.
            StoreClosed / StoreInherited: the store was closed / this is a fork's child.
        """
        self._liveness.check_usable()
        check_job_id(job_id)
        wait = None if wait_s is None else check_wait(wait_s)
        self._holdings.check_not_held([job_id])
        if wait is None:
            self.ensure_alive()
            lease = self._claim_once(job_id)
            if lease is None and caller_enters_with(inspect.currentframe()):
                raise ClaimTimeout(
                    f"{job_id!r} is held elsewhere, and claim() without wait_s does not "
                    f"wait: `with session.claim(job_id, wait_s=...)` waits (wait_s=0: "
                    f"not at all); or test `lease = session.claim(job_id)` for None",
                    job_id=job_id,
                )
            return lease
        return wait_and_claim(
            self, lambda wake: self.backend.subscribe_job(job_id, wake),
            lambda: self._claim_once(job_id), wait,
            lambda: ClaimTimeout(f"{job_id!r} still held after waiting {wait} s",
                                 job_id=job_id),
        )

    def _claim_once(self, job_id: str) -> Lease | None:
        """One claim round trip: the lease, or ``None`` if the job is held."""
        def once() -> Lease | None:
            result = self._liveness.call(lambda: self.backend.claim(self.handle, job_id))
            return None if result is None else self._holdings.adopt(self, job_id, result)

        return self._holdings.timed_claim("claim", job_id, once)

    @overload
    def claim_next(self, queue: str, *, wait_s: None = None) -> Lease | None: ...

    @overload
    def claim_next(self, queue: str, *, wait_s: float) -> Lease: ...

    def claim_next(self, queue: str, *, wait_s: float | None = None) -> Lease | None:
        """Claim any claimable job of the work queue ``queue`` (enqueued with
        :meth:`LeaseStore.enqueue`): unowned, released or expired, neither completed nor
        FAILED, no retry delay running. The
        claim is the same atomic store operation as :meth:`claim`, with the same fencing
        guarantees; the returned lease carries the job's ``payload``.

        Fairness: candidates are taken oldest-enqueued first, and each claimer starts at
        a random one of the oldest few, so concurrent workers do not all collide on the
        head of the queue and a worker that claims in a tight loop gets no more than its
        share of what the store offers it. Waiting is woken by the store (etcd and
        ZooKeeper watches, PostgreSQL's ``LISTEN``; SQLite polls).

        Args:
            queue: the queue's name (the rules of job ids). An unknown or empty queue
                simply has nothing to claim.
            wait_s: as for :meth:`claim`: ``None`` tries once; a number waits and raises
                ``ClaimTimeout``. As there, ``with session.claim_next(queue)`` raises
                ``ClaimTimeout`` instead of handing ``None`` to the ``with``.

        Raises:
            UnsupportedOperation: the backend has no work queues (``capabilities.queues``).
            ClaimTimeout / InvalidArgument / LeaseLost / LeaseSuspended: as for :meth:`claim`.
            BackendUnavailable / OutcomeUnknown / StoreClosed / StoreInherited: as for
                :meth:`claim`.
        """
        self._liveness.check_usable()
        lease = _queue_claim.claim_next(self, self._holdings, queue, wait_s)
        if lease is None and caller_enters_with(inspect.currentframe()):
            raise ClaimTimeout(
                f"no job of queue {queue!r} is claimable now, and claim_next() without "
                f"wait_s does not wait: `with session.claim_next(queue, wait_s=...)` waits; "
                f"or test `lease = session.claim_next(queue)` for None"
            )
        return lease

    def claim_next_many(self, queue: str, n: int) -> list[Lease]:
        """Claim up to ``n`` of the oldest claimable jobs of the work queue ``queue``
        (the jobs :meth:`claim_next` would take: unowned, released or expired, neither
        completed nor FAILED, no retry delay running on the store's clock), without
        waiting, in as few store round trips as the store allows. Each job is claimed
        by the rules of :meth:`claim`: its own generation, strictly greater than every
        earlier one of the job (the fencing token), its attempt counted; a job whose
        ``max_attempts`` ran out is made FAILED on the way instead, and not returned.
        Jobs held by a live session (this one included) are skipped, and so are jobs
        other claimers are taking at that moment (PostgreSQL: ``FOR UPDATE SKIP
        LOCKED``), so concurrent callers get different jobs.

        Round trips: up to ``capabilities.max_queue_claim_batch`` jobs per call of the
        driver, each call one atomic store operation: PostgreSQL one statement per
        1,000 jobs (a re-run for the rest, at most twice, when a concurrent claimer won
        a race for a picked job), SQLite one ``BEGIN IMMEDIATE`` transaction per 1,000,
        memory one step under its lock, etcd one transaction of nested claims per 100
        jobs after :meth:`claim_next`'s read-only candidate scan (two more per job with
        an attempt limit), ZooKeeper one claim multi per 128 (after a listing and a read
        of the candidates; a candidate taken meanwhile is dropped and the rest sent
        again). Where it is 1 (a third-party driver without its own) the jobs are
        claimed one after the other as :meth:`claim_next` claims them: a read of the
        candidates and a claim per job (more on collisions).

        Args:
            queue: the queue's name (the rules of job ids). An unknown or empty queue
                simply has nothing to claim.
            n: int >= 1 (not a ``bool``): the most jobs to claim.

        Returns:
            HELD :class:`Lease` objects of distinct jobs, registered with this session
            as :meth:`claim_next`'s are (each with its ``payload``; each renews,
            completes, releases and fails on its own), oldest enqueued first where the
            store orders them (SQLite, PostgreSQL, memory); fewer than ``n`` when fewer
            were claimable, ``[]`` when none was. A session closed (or lost) by another
            thread while the call was in flight hands its leases back LOST, not HELD:
            check ``lease.state`` (or call ``ensure_held()``) before acting on one. The
            store's observer gets one ``claim_next`` operation per lease (``empty`` when
            none was claimed), so claim counts and rates stay right.

        Raises:
            InvalidArgument: bad queue name, or ``n`` not an int >= 1; nothing sent.
            UnsupportedOperation: the backend has no work queues (``capabilities.queues``).
            LeaseLost / SessionExpired: the session is over (also found by the store):
                nothing is held, the leases of earlier calls of a split ``n`` included
                (they are LOST with the session).
            LeaseSuspended / BackendUnavailable: before any job was claimed; nothing is
                held. Once a call of a split ``n`` claimed jobs, a later call's error
                ends the claim with the leases obtained so far (returned, held).
            OutcomeUnknown: the store's answer was lost and reading back could not tell
                whether jobs were claimed (PostgreSQL: this session holds some job of the
                queue); as for ``BackendUnavailable``. Jobs it may have claimed have no
                lease here: they are never claimed twice, and become claimable again
                when this session ends (close, or expiry).
            StoreClosed / StoreInherited: the store was closed / this is a fork's child.
        """
        self._liveness.check_usable()
        return _queue_claim.claim_next_many(self, self._holdings, queue, n)

    @overload
    def campaign(self, name: str, value: bytes = b"", *, wait_s: None = None
                 ) -> Leadership | None: ...

    @overload
    def campaign(self, name: str, value: bytes = b"", *, wait_s: float) -> Leadership: ...

    def campaign(
        self, name: str, value: bytes = b"", *, wait_s: float | None = None
    ) -> Leadership | None:
        """Become the leader of the election ``name``, announcing ``value``.

        The claim of the election (the same atomic store operation as :meth:`claim`, on
        a key no job id can take), then the write of ``value`` compared with owner and
        generation; if the value cannot be written, the claim is handed back. The
        leadership's :attr:`~Leadership.generation` is strictly greater than every
        earlier leader's of this election: the fencing token. Candidates are not
        queued: when the leader resigns or expires, any waiting candidate may win.

        Two forms, as for :meth:`claim`::

            leadership = session.campaign("scheduler")            # try once, or None
            with session.campaign("scheduler", b"me:8080", wait_s=60) as leadership:
                ...                                                # or ClaimTimeout

        Args:
            name: the election's name: non-empty str, at most 253 UTF-8 bytes, no NUL.
                Elections and jobs never collide, whatever their names.
            value: bytes the leader announces (``store.leader(name).value``), at most
                ``capabilities.max_payload_bytes``; change it with ``proclaim``.
            wait_s: ``None`` tries once and returns ``None`` if another session leads; a
                number (seconds, >= 0) waits up to that long, woken by the store, and
                raises ``ClaimTimeout``. ``with session.campaign(name)`` (no ``wait_s``)
                raises ``ClaimTimeout`` instead of handing ``None`` to the ``with``.

        Returns:
            A HELD :class:`~consensus_lease.Leadership`, or ``None`` (only without
            ``wait_s``).

        Raises:
            UnsupportedOperation: the backend has no elections (``capabilities.elections``).
            InvalidArgument: bad name, value or wait, or this session already leads it.
            ClaimTimeout: ``wait_s`` passed with another session leading.
            LeaseLost / SessionExpired / LeaseSuspended / BackendUnavailable: as for
                :meth:`claim`. With these and the three below, a claim made before the
                value failed was handed back; if even that failed, this session keeps it
                until it closes, and its next campaign for ``name`` resumes it (writing
                the value) instead of waiting for itself.
            OutcomeUnknown / StoreClosed / StoreInherited: as for :meth:`claim`, and as
                above.
        """
        self._liveness.check_usable()
        leadership = _campaign.campaign(self, self._holdings, name, value, wait_s)
        if leadership is None and caller_enters_with(inspect.currentframe()):
            raise ClaimTimeout(
                f"election {name!r} is led by another session, and campaign() without "
                f"wait_s does not wait: `with session.campaign(name, wait_s=...)` waits; or "
                f"test `leadership = session.campaign(name)` for None"
            )
        return leadership

    def claim_many(self, job_ids: Sequence[str]) -> list[Lease | None]:
        """Try to claim each of ``job_ids`` (no waiting); in as few store round trips as
        the backend allows (``capabilities.max_batch_claim`` per trip). Element ``i`` is
        a Lease or ``None`` (held elsewhere, in a retry delay, completed or FAILED).

        Raises:
            InvalidArgument: a bad or duplicate id, or one this session already holds.
            LeaseLost / LeaseSuspended / BackendUnavailable: as ``claim``.
            OutcomeUnknown / StoreClosed / StoreInherited: as ``claim``.
        """
        self._liveness.check_usable()
        if isinstance(job_ids, (str, bytes)) or not isinstance(job_ids, Sequence):
            raise InvalidArgument(
                f"job_ids must be a sequence of job ids, not {type(job_ids).__name__}"
            )
        ids = [check_job_id(j) for j in job_ids]
        if len(set(ids)) != len(ids):
            raise InvalidArgument("job_ids contains duplicates")
        self._holdings.check_not_held(ids)
        out: list[Lease | None] = []
        step = max(1, self.backend.capabilities.max_batch_claim)
        for start in range(0, len(ids), step):
            chunk = ids[start : start + step]
            self.ensure_alive()
            results = self._liveness.call(lambda c=chunk: self.backend.claim_many(self.handle, c))  # type: ignore[misc]
            for job_id, result in zip(chunk, results, strict=True):
                out.append(None if result is None else self._holdings.adopt(self, job_id, result))
        return out

    def complete_many(
        self, leases: Sequence[Lease | tuple[Lease, bytes]]
    ) -> list[LeaseRecord | LeaseError]:
        """Complete several leases of this session, each as :meth:`Lease.complete` would
        (owner and generation compared by the store in the operation that records it),
        in as few round trips as the store allows: up to
        ``capabilities.max_complete_batch`` completions per call of the driver, decided
        together (one SQL transaction; memory: its lock; ZooKeeper: one multi per up to
        160 KB of results, whose items are completed one by one if it applies nothing;
        etcd: one transaction per up to 100, a nested transaction per lease; see
        ``Capabilities.max_complete_batch``). Where ``max_complete_batch`` is 1 it sends
        one completion per lease.

        Each lease has its own outcome: a stale one is refused while the others commit.

        Args:
            leases: HELD (or LOST: the store decides, as for ``complete``) leases of this
                session, each alone (result ``b""``) or as ``(lease, result)`` with
                ``result`` bytes (the limits of ``complete``).

        Returns:
            Element ``i`` answers ``leases[i]``: its COMPLETED :class:`LeaseRecord`, or
            the error ``complete`` would have raised for it, returned, not raised, with
            the lease left as that error leaves it: ``StaleLeaseError`` (LOST),
            ``SessionExpired`` (LOST, with every lease of the session),
            ``OutcomeUnknown`` (treated as LOST: read ``store.get``),
            ``BackendUnavailable`` (nothing applied for it: still held until its
            deadline, may be completed again). Each returned error is that item's own
            (of the type the store's answer had), its message led by ``item I: `` and
            naming the job, with the item's ``job_id``, on every store (a refusal of a
            whole round trip too: one error per item, not one shared).

        Raises:
            InvalidArgument: ``leases`` is empty or not a sequence, a result is not bytes
                or too large, a lease is of another session or listed twice, or was
                already completed, released or failed by this process (each named by
                its item's index and job: ``item 2: lease on 'j': ...``); nothing sent,
                every lease as it was.
            StoreClosed / StoreInherited: the store was closed / this is a fork's child;
                nothing sent (also: the store closed during the call, whose remaining
                leases were not sent).
        """
        pairs = []
        for index, (lease, rest) in enumerate(self._listed(
                leases, "complete_many", "leases or (lease, result) pairs", (1, 2))):
            try:
                pairs.append((lease, checked_completion(lease, rest[0] if rest else b"",
                                                        "complete_many")))
            except InvalidArgument as exc:
                raise item_error(index, lease, exc) from None
        return self._holdings.complete_many(pairs)

    def release_many(self, leases: Sequence[Lease]) -> list[LeaseError | None]:
        """Release several leases of this session, each as :meth:`Lease.release` would
        (owner and generation compared by the store in the operation that ends the
        hold; the job claimable at once, at a higher generation), in as few round trips
        as the store allows: up to ``capabilities.max_end_batch`` leases per call of the
        driver, decided together (memory: its lock; SQLite: one transaction;
        PostgreSQL: one statement; etcd: one transaction of nested ones; ZooKeeper:
        one multi). Where ``max_end_batch`` is 1 it sends one release per lease.

        Each lease has its own outcome: a stale one is refused while the others are
        released.

        Args:
            leases: HELD (or LOST: the store decides, as for ``release``) leases of this
                session.

        Returns:
            Element ``i`` answers ``leases[i]``: ``None`` (released: the lease is
            RELEASED), or the error ``release`` would have raised for it, returned, not
            raised, with the lease left as that error leaves it: ``StaleLeaseError``
            (LOST), ``SessionExpired`` (LOST, with every lease of the session),
            ``OutcomeUnknown`` (treated as LOST: read ``store.get``),
            ``BackendUnavailable`` (nothing applied for it: still held until its
            deadline, may be released again). Each error names its item, as in
            :meth:`complete_many`.

        Raises:
            InvalidArgument: ``leases`` is empty or not a sequence, an item is not a
                lease of this session, a lease is listed twice, or was already
                completed, released or failed by this process (unlike a repeated
                ``release()``, which does nothing); each named by its item's index
                and job; nothing sent, every lease as it was.
            StoreClosed / StoreInherited: as for :meth:`complete_many`.
        """
        listed = self._listed(leases, "release_many", "leases", (1,))
        for index, (lease, _) in enumerate(listed):
            try:
                check_not_ended(lease, "release_many")
            except InvalidArgument as exc:
                raise item_error(index, lease, exc) from None
        return self._holdings.release_many([lease for lease, _ in listed])

    def fail_many(
        self, items: Sequence[tuple[Lease, str | BaseException]
                              | tuple[Lease, str | BaseException, float | None]],
    ) -> list[LeaseRecord | LeaseError]:
        """Fail several leases of this session, each as :meth:`Lease.fail` would (owner
        and generation compared by the store in the operation that ends the hold and
        records the error; FAILED if that was the job's last attempt, else claimable
        again once its retry delay of *store* time has passed), in as few round trips
        as the store allows: up to ``capabilities.max_end_batch`` per call of the
        driver, decided together (as :meth:`release_many`). Where ``max_end_batch`` is 1
        it sends one failure per lease.

        Each lease has its own outcome: a stale one is refused while the others apply.

        Args:
            items: ``(lease, error)`` or ``(lease, error, retry_in_s)``: a HELD (or
                LOST) lease of this session; ``error`` text or an exception, and
                ``retry_in_s`` seconds (float >= 0) or ``None``, as
                :meth:`Lease.fail` takes them (``None`` or left out: the delay of the
                lease's queue's retry policy for its attempt; the store-wide default
                policy for a lease claimed by name, whose ``queue`` is ``None``).

        Returns:
            Element ``i`` answers ``items[i]``: the job's record after the failure
            (AVAILABLE with ``not_before``, or FAILED; the lease is FAILED), or the
            error ``fail`` would have raised for it, returned, not raised, with the
            lease left as that error leaves it (as in :meth:`release_many`), naming
            its item (as in :meth:`complete_many`).

        Raises:
            InvalidArgument: ``items`` is empty or not a sequence, an item is not such
                a tuple with a lease of this session, a lease is listed twice, an
                ``error`` or ``retry_in_s`` is bad, or a lease was already completed,
                released or failed by this process; each named by its item's index and
                job (``item 1: lease on 'j': retry_in_s must be >= 0, ...``); nothing
                sent, every lease as it was.
            StoreClosed / StoreInherited: as for :meth:`complete_many`.
        """
        checked = []
        for index, (lease, rest) in enumerate(self._listed(
                items, "fail_many", "(lease, error) or (lease, error, retry_in_s) tuples",
                (2, 3))):
            try:
                text, delay = checked_failure(
                    lease, rest[0], rest[1] if len(rest) > 1 else None, "fail_many")
            except InvalidArgument as exc:
                raise item_error(index, lease, exc) from None
            checked.append((lease, text, delay))
        return self._holdings.fail_many(checked)

    def _listed(self, items: object, call: str, takes: str,
                sizes: tuple[int, ...]) -> list[tuple[Lease, tuple[object, ...]]]:
        """``items`` of a batch ending (``call``) as ``(lease, rest of the item)``: each
        item a lease (where 1 is in ``sizes``) or a tuple of a lease and more whose
        length is in ``sizes``, every lease of this session and listed once; else
        ``InvalidArgument`` naming the item by its index (nothing sent). ``StoreClosed``
        / ``StoreInherited`` first."""
        self._liveness.check_usable()
        if (isinstance(items, (str, bytes, bytearray, memoryview))
                or not isinstance(items, Sequence)):
            raise InvalidArgument(
                f"leases must be a sequence of leases, not {type(items).__name__}")
        if not items:
            raise InvalidArgument(f"{call}() needs at least one lease")
        listed: list[tuple[Lease, tuple[object, ...]]] = []
        seen: set[str] = set()
        for index, item in enumerate(items):
            whole = isinstance(item, tuple) and len(item) in sizes and len(item) > 1
            lease, rest = (item[0], tuple(item[1:])) if whole else (item, ())
            if not isinstance(lease, Lease) or isinstance(lease, Leadership) or (
                    not whole and 1 not in sizes):
                raise _shape_error(index, item, call, takes, sizes)
            if lease.session is not self:
                raise InvalidArgument(
                    f"item {index}: lease on {lease.job_id!r} is held by session "
                    f"{lease.session.session_id}, not {self.session_id}",
                    job_id=lease.job_id, generation=lease.generation)
            if lease.job_id in seen:
                raise InvalidArgument(f"item {index}: {lease.job_id!r} is listed twice",
                                      job_id=lease.job_id, generation=lease.generation)
            seen.add(lease.job_id)
            listed.append((lease, rest))
        return listed

    # -- renewal ---------------------------------------------------------------------

    def keepalive(self) -> float:
        """Renew the session now, in one round trip; return the granted TTL.

        The store's renewal threads do this every ``granted TTL / 3`` unless the session was
        opened with ``keepalive=False``, in which case the worker must call it.

        Raises:
            SessionExpired: the store no longer has the session; it is LOST.
            LeaseLost: the session was already lost or closed.
            BackendUnavailable: no answer; the session stays usable until its deadline.
            StoreClosed / StoreInherited: the store was closed / this is a fork's child.
        """
        self._liveness.check_usable()
        if self.state in (SessionState.LOST, SessionState.CLOSED):
            self.ensure_alive()
        return self._liveness.keepalive()

    # -- store events ----------------------------------------------------------------

    def _on_backend_event(self, event: SessionEvent) -> None:
        """The backend's listener (through the store's relay); must not block."""
        if event is SessionEvent.EXPIRED:
            self._liveness.mark_lost(
                self.handle.expiry
                or SessionExpired(f"session {self.session_id} expired in the store")
            )
        elif event is SessionEvent.REGRESSED:
            self._liveness.mark_lost(StoreRegressed(
                f"session {self.session_id}: the store's history went back (restored from "
                f"an older backup, or wiped); run bump-epoch before restarting workers"
            ))
        elif event is SessionEvent.SUSPENDED:
            self._liveness.suspend()
        elif event is SessionEvent.RECONNECTED:
            threading.Thread(
                target=self._holdings.reconfirm,
                name=f"consensus-lease-reconfirm-{self.session_id}", daemon=True,
            ).start()

    # -- closing ---------------------------------------------------------------------

    def close(self) -> None:
        """Stop renewing and end the session in the store, handing back every job it
        holds (claimable at once). Idempotent. If the store cannot be reached, the jobs
        become claimable when the store expires the session's TTL.

        In a child made by ``fork()`` it only forgets the session: the store-side
        session is the parent's and stays (see ``StoreInherited``).
        """
        self._close(LeaseLost("session closed"))

    def _close_with_store(self) -> None:
        """Close, for ``LeaseStore.close()``: from now on every operation of the session
        and its leases raises ``StoreClosed``."""
        self._liveness.store_closed = True
        self._close(LeaseLost("session closed: its store was closed"))

    def _close(self, reason: LeaseLost) -> None:
        if self._liveness.origin.inherited():
            abandon(self.handle)  # the parent's session: never finalised here
            return
        self._waiters.close()
        if not self._liveness.close():
            return
        self._holdings.lose_all(reason, closing=True)
        self._liveness.end_store_session()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _shape_error(index: int, item: object, call: str, takes: str,
                 sizes: tuple[int, ...]) -> InvalidArgument:
    """The ``InvalidArgument`` of a batch ending's malformed item ``index``, in the form
    of every per-item error: ``item I: `` first, then, where the item is or starts with
    a lease (a tuple or list), ``lease on 'JOB': `` and that lease's ``job_id`` and
    ``generation``; then what the call takes and what the item is (:func:`_shape`)."""
    lease = item if isinstance(item, Lease) else (
        item[0] if isinstance(item, (tuple, list)) and item and isinstance(item[0], Lease)
        else None)
    named = "" if lease is None else f"lease on {lease.job_id!r}: "
    return InvalidArgument(
        f"item {index}: {named}{call}() takes {takes}, got {_shape(item, sizes)}",
        job_id=None if lease is None else lease.job_id,
        generation=None if lease is None else lease.generation)


def _shape(item: object, sizes: tuple[int, ...]) -> str:
    """How an InvalidArgument of a batch ending names a malformed item: its type, or a
    tuple's length (and, for a length the call takes, its elements' types); a list is
    said to be one (the items that carry more than a lease are tuples)."""
    if isinstance(item, list):  # a call that takes tuples (a size over 1) is told so
        return f"a list of {len(item)}" + (" (pass a tuple)" if max(sizes) > 1 else "")
    if not isinstance(item, tuple):
        return type(item).__name__
    names = [type(x).__name__ for x in item]
    if len(item) == 2 and 2 in sizes:
        return f"a pair of {names[0]} and {names[1]}"
    if len(item) > 2 and len(item) in sizes:
        return f"a {len(item)}-tuple of {', '.join(names[:-1])} and {names[-1]}"
    return f"a {len(item)}-tuple"


def close_with_store(session: Session) -> None:
    """For :meth:`LeaseStore.close <consensus_lease.LeaseStore.close>` only (and a
    session opened while it ran): close ``session``, after which every operation of the
    session and its leases raises ``StoreClosed``."""
    session._close_with_store()
