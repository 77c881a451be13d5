"""A worker session: the unit of liveness, owning one store-side session and its keepalive.

Many job leases live under one session, so renewal traffic grows with workers, not with
jobs: the background keepalive sends one request per ``granted TTL / 3`` whatever the
number of leases held (etcd: one LeaseKeepAlive; ZooKeeper: the session's own pings plus
one sync; SQLite: one UPDATE of the session row). The ZooKeeper backend also ends a
session whose keepalive/renew has not succeeded for one granted TTL, so
``keepalive=False`` behaves the same on every store.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TypeVar

from .backend import Backend, SessionEvent, SessionHandle
from .clock import Clock
from .errors import (
    BackendUnavailable,
    ClaimTimeout,
    InvalidArgument,
    JobCompleted,
    LeaseError,
    LeaseLost,
    LeaseSuspended,
    SessionExpired,
)
from .lease import Lease
from .observe import Observer, safe_call
from .record import ClaimResult
from .states import SessionState
from .validation import check_job_id, check_wait

__all__ = ["LossCallback", "Session"]

T = TypeVar("T")

log = logging.getLogger("consensus_lease")

LossCallback = Callable[["Session", LeaseLost], None]
"""``callback(session, reason)``, called once when the session is lost."""

KEEPALIVE_FRACTION = 1 / 3
"""A keepalive is sent every ``granted TTL * KEEPALIVE_FRACTION`` seconds."""

QUEUE_CANDIDATES = 32
"""How many claimable-looking jobs ``claim_next`` asks the store for at a time."""

QUEUE_SPREAD = 8
"""``claim_next`` starts at a random one of the oldest this-many candidates."""

QUEUE_RETRIES = 3
"""Immediate re-reads when every candidate was taken by others before waiting."""

DEFAULT_MARGIN_FRACTION = 0.1
"""Default safety margin: this fraction of the granted TTL is taken off the local deadline
to cover clock-rate drift between worker and store and scheduling delay."""


class Session:
    """A worker's session with the store; claim jobs from it.

    Create one with :meth:`consensus_lease.LeaseStore.session`. Use it as a context
    manager: closing it hands every held job back to the store.

    Loss is never swallowed: when the store reports the session expired, or the local
    deadline passes with no successful renewal, the session becomes LOST, every lease it
    holds becomes LOST, :attr:`lost` is set and each registered callback runs once.

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
    ) -> None:
        self.backend = backend
        self.observer = observer
        self.handle = handle
        self.clock = clock
        ttl = handle.granted_ttl_s
        margin = ttl * DEFAULT_MARGIN_FRACTION if safety_margin_s is None else safety_margin_s
        if not 0 <= margin < ttl:
            raise InvalidArgument(
                f"safety_margin_s={margin} must be >= 0 and below the granted TTL {ttl} s"
            )
        self.safety_margin_s = margin
        self._lock = threading.RLock()
        self._deadline = send_time + ttl - margin
        self._state = SessionState.ACTIVE
        self._lost_reason: LeaseLost | None = None
        self._leases: dict[str, Lease] = {}
        self._callbacks: list[LossCallback] = []
        self.lost = threading.Event()
        """Set once the session is LOST."""
        self._stop = threading.Event()
        self._deadline_moved = threading.Event()
        self._threads: list[threading.Thread] = []
        if keepalive:
            self._start_thread(self._keepalive_loop, "keepalive")
        self._start_thread(self._watchdog_loop, "deadline")

    def _start_thread(self, target: Callable[[], None], what: str) -> None:
        thread = threading.Thread(
            target=target, name=f"consensus-lease-{what}-{self.session_id}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    # -- introspection --------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self.handle.session_id

    @property
    def owner(self) -> str:
        return self.handle.owner

    @property
    def granted_ttl_s(self) -> float:
        return self.handle.granted_ttl_s

    @property
    def deadline(self) -> float:
        """Monotonic time after which the session must be assumed lost."""
        with self._lock:
            return self._deadline

    def remaining_s(self) -> float:
        """Seconds left before :attr:`deadline` (negative once passed)."""
        return self.deadline - self.clock.monotonic()

    @property
    def state(self) -> SessionState:
        with self._lock:
            state = self._state
        if state in (SessionState.ACTIVE, SessionState.SUSPENDED) and self.remaining_s() <= 0:
            self._mark_lost(self._deadline_passed())
            return SessionState.LOST
        return state

    @property
    def lost_reason(self) -> LeaseLost | None:
        with self._lock:
            return self._lost_reason

    def leases(self) -> list[Lease]:
        """The leases this session currently holds (claimed, not completed/released)."""
        with self._lock:
            return list(self._leases.values())

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
        """
        state = self.state
        if state is SessionState.ACTIVE:
            return
        if state is SessionState.SUSPENDED:
            raise LeaseSuspended(f"session {self.session_id} is suspended")
        if state is SessionState.CLOSED:
            raise LeaseLost(f"session {self.session_id} is closed")
        reason = self.lost_reason
        if isinstance(reason, SessionExpired):
            raise SessionExpired(str(reason)) from reason
        raise LeaseLost(f"session {self.session_id} is lost: {reason}") from reason

    def on_lost(self, callback: LossCallback) -> Callable[[], None]:
        """Register ``callback(session, reason)``, called once, from the thread that
        detects the loss, when the session is lost. Called at once if already lost.
        Exceptions from callbacks are logged, not raised into the keepalive thread.

        Returns:
            A function that unregisters the callback (a no-op once it ran).
        """
        if not callable(callback):
            raise InvalidArgument(f"on_lost needs a callable, not {callback!r}")
        with self._lock:
            reason = self._lost_reason
            if reason is None:
                self._callbacks.append(callback)
                return lambda: self._remove_callback(callback)
        self._run_callback(callback, reason)
        return lambda: None

    def _remove_callback(self, callback: LossCallback) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    # -- claiming --------------------------------------------------------------------

    def claim(self, job_id: str, *, wait_s: float | None = None) -> Lease | None:
        """Claim ``job_id``: atomically in the store, only if it is unowned or its
        holder's session expired, and it is not completed. Each claim gets a generation
        strictly greater than every earlier one for the job (the fencing token).

        Args:
            job_id: non-empty str, at most 256 UTF-8 bytes, no NUL.
            wait_s: ``None`` tries once and returns ``None`` if the job is held. A number
                (seconds, >= 0) waits up to that long, woken by the store where it can
                watch (etcd, ZooKeeper), and raises ``ClaimTimeout`` instead of returning
                ``None`` — so ``with session.claim(job, wait_s=10) as lease:`` never runs
                its body without the lease.

        Returns:
            A HELD :class:`Lease`, or ``None`` (only when ``wait_s`` is ``None``).

        Raises:
            InvalidArgument: bad job id or wait, or this session already holds the job.
            JobCompleted: the job is completed; it is never claimed again.
            ClaimTimeout: ``wait_s`` passed with the job still held elsewhere.
            LeaseLost / SessionExpired: this session is lost; open a new one.
            LeaseSuspended: this session is suspended; nothing was sent.
            BackendUnavailable / OutcomeUnknown: the store could not be asked, or a claim
                may have been applied and reading back could not tell.
        """
        check_job_id(job_id)
        wait = None if wait_s is None else check_wait(wait_s)
        with self._lock:
            held = self._leases.get(job_id)
        if held is not None:
            raise InvalidArgument(
                f"this session already holds {job_id!r} at generation {held.generation}",
                job_id=job_id,
                generation=held.generation,
            )
        give_up_at = None if wait is None else self.clock.monotonic() + wait
        while True:
            self.ensure_alive()
            result = self._call(lambda: self.backend.claim(self.handle, job_id))
            if result is not None:
                return self._adopt(job_id, result)
            if give_up_at is None:
                return None
            left = give_up_at - self.clock.monotonic()
            if left <= 0:
                raise ClaimTimeout(f"{job_id!r} still held after waiting {wait} s", job_id=job_id)
            self.backend.wait_for_change(job_id, left)

    def claim_next(self, queue: str, *, wait_s: float | None = None) -> Lease | None:
        """Claim any claimable job of the work queue ``queue`` (enqueued with
        :meth:`LeaseStore.enqueue`): unowned, released or expired, never completed. The
        claim is the same atomic store operation as :meth:`claim`, with the same fencing
        guarantees; the returned lease carries the job's ``payload``.

        Fairness: candidates are taken oldest-enqueued first, and each claimer starts at
        a random one of the oldest few, so concurrent workers do not all collide on the
        head of the queue and a worker that claims in a tight loop gets no more than its
        share of what the store offers it. Waiting is woken by the store (etcd and
        ZooKeeper watches; SQLite polls).

        Args:
            queue: the queue's name (the rules of job ids). An unknown or empty queue
                simply has nothing to claim.
            wait_s: as for :meth:`claim`: ``None`` tries once; a number waits and raises
                ``ClaimTimeout``.

        Raises:
            UnsupportedOperation: the backend has no work queues (``capabilities.queues``).
            ClaimTimeout, InvalidArgument, LeaseLost, LeaseSuspended, BackendUnavailable,
            OutcomeUnknown: as for :meth:`claim`.
        """
        check_job_id(queue)
        wait = None if wait_s is None else check_wait(wait_s)
        self._require_queues()
        give_up_at = None if wait is None else self.clock.monotonic() + wait
        races = 0
        while True:
            self.ensure_alive()
            candidates = self.backend.queue_candidates(queue, QUEUE_CANDIDATES)
            with self._lock:
                candidates = [c for c in candidates if c[0] not in self._leases]
            if candidates:
                start = random.randrange(min(len(candidates), QUEUE_SPREAD))
                for job_id, payload in candidates[start:] + candidates[:start]:
                    try:
                        result = self._call(lambda j=job_id: self.backend.claim(self.handle, j))  # type: ignore[misc]
                    except JobCompleted:
                        break  # the list is stale: read a fresh one rather than walk it
                    if result is not None:
                        return self._adopt(job_id, result, payload)
                races += 1
                if races < QUEUE_RETRIES:
                    continue  # every candidate was taken meanwhile: look again at once
            races = 0
            if give_up_at is None:
                return None
            left = give_up_at - self.clock.monotonic()
            if left <= 0:
                raise ClaimTimeout(f"no job of queue {queue!r} became claimable in {wait} s")
            self.backend.wait_for_queue(queue, left)

    def _require_queues(self) -> None:
        if not self.backend.capabilities.queues:
            from .errors import UnsupportedOperation

            raise UnsupportedOperation(f"the {self.backend.scheme} backend has no work queues")

    def claim_many(self, job_ids: Sequence[str]) -> list[Lease | None]:
        """Try to claim each of ``job_ids`` (no waiting); in as few store round trips as
        the backend allows (``capabilities.max_batch_claim`` per trip). Element ``i`` is
        a Lease or ``None`` (held elsewhere, or completed).

        Raises:
            InvalidArgument: a bad or duplicate id, or one this session already holds.
            LeaseLost / LeaseSuspended / BackendUnavailable / OutcomeUnknown: as ``claim``.
        """
        if isinstance(job_ids, (str, bytes)) or not isinstance(job_ids, Sequence):
            raise InvalidArgument(
                f"job_ids must be a sequence of job ids, not {type(job_ids).__name__}"
            )
        ids = [check_job_id(j) for j in job_ids]
        if len(set(ids)) != len(ids):
            raise InvalidArgument("job_ids contains duplicates")
        with self._lock:
            already = [j for j in ids if j in self._leases]
        if already:
            raise InvalidArgument(f"this session already holds {already[0]!r}", job_id=already[0])
        out: list[Lease | None] = []
        step = max(1, self.backend.capabilities.max_batch_claim)
        for start in range(0, len(ids), step):
            chunk = ids[start : start + step]
            self.ensure_alive()
            results = self._call(lambda c=chunk: self.backend.claim_many(self.handle, c))  # type: ignore[misc]
            for job_id, result in zip(chunk, results, strict=True):
                out.append(None if result is None else self._adopt(job_id, result))
        return out

    def _adopt(self, job_id: str, result: ClaimResult, payload: bytes | None = None) -> Lease:
        lease = Lease(self, job_id, result, payload)
        generation = result.generation
        with self._lock:
            self._leases[job_id] = lease
        log.info(
            "claimed",
            extra={"job_id": job_id, "generation": generation, "owner": self.owner},
        )
        safe_call(self.observer, "claimed", self.backend.scheme, job_id, generation, self.owner)
        return lease

    def _call(self, fn: Callable[[], T]) -> T:
        """Run a store call; a SessionExpired from the store loses the whole session."""
        try:
            return fn()
        except SessionExpired as exc:
            self._mark_lost(exc)
            raise

    # -- renewal ---------------------------------------------------------------------

    def keepalive(self) -> float:
        """Renew the session now, in one round trip; return the granted TTL.

        The background thread does this every ``granted TTL / 3`` unless the session was
        opened with ``keepalive=False``, in which case the worker must call it.

        Raises:
            SessionExpired: the store no longer has the session; it is LOST.
            LeaseLost: the session was already lost or closed.
            BackendUnavailable: no answer; the session stays usable until its deadline.
        """
        self.ensure_alive_or_suspended()
        send = self.clock.monotonic()
        ttl = self._call(lambda: self.backend.keepalive(self.handle))
        self._renewed(send, ttl)
        return ttl

    def ensure_alive_or_suspended(self) -> None:
        if self.state in (SessionState.LOST, SessionState.CLOSED):
            self.ensure_alive()

    def _renewed(self, send_time: float, granted_ttl_s: float) -> None:
        now = self.clock.monotonic()
        with self._lock:
            if self._state is not SessionState.ACTIVE:
                return
            headroom = self._deadline - now
            self.handle.granted_ttl_s = granted_ttl_s
            new_deadline = send_time + granted_ttl_s - self.safety_margin_s
            if new_deadline > self._deadline and send_time < self._deadline:
                self._deadline = new_deadline
        self._deadline_moved.set()
        safe_call(self.observer, "renewed", self.backend.scheme, now - send_time, headroom)

    def _keepalive_loop(self) -> None:
        last_send = self.clock.monotonic()
        retry_s = None
        while not self._stop.is_set():
            interval = self.granted_ttl_s * KEEPALIVE_FRACTION
            next_at = last_send + (interval if retry_s is None else retry_s)
            if self.clock.wait(self._stop, next_at - self.clock.monotonic()):
                return
            if self.state in (SessionState.LOST, SessionState.CLOSED):
                return
            if self.state is SessionState.SUSPENDED:
                last_send, retry_s = self.clock.monotonic(), min(interval, 0.2)
                continue
            last_send = self.clock.monotonic()
            try:
                self._renewed(last_send, self._call(lambda: self.backend.keepalive(self.handle)))
                retry_s = None
            except SessionExpired:
                return  # _call marked the session lost
            except BackendUnavailable as exc:
                # Keep trying, faster, until the watchdog declares the deadline passed.
                retry_s = max(0.05, min(interval / 3, self.remaining_s() / 4))
                log.warning(
                    "keepalive failed, retrying",
                    extra={"session_id": self.session_id, "error": str(exc)},
                )
            except Exception as exc:  # a driver bug: do not pretend the lease is safe
                self._mark_lost(LeaseLost(f"keepalive failed unexpectedly: {exc!r}"))
                log.exception("keepalive crashed", extra={"session_id": self.session_id})
                return

    def _watchdog_loop(self) -> None:
        while not self._stop.is_set():
            self._deadline_moved.clear()
            left = self.remaining_s()
            if left <= 0:
                if self.state is not SessionState.CLOSED:
                    self._mark_lost(self._deadline_passed())
                return
            if self.clock.wait(self._stop, left):
                return

    def _deadline_passed(self) -> LeaseLost:
        return LeaseLost(
            f"session {self.session_id}: local deadline passed without a successful renewal "
            f"(granted TTL {self.granted_ttl_s} s, margin {self.safety_margin_s} s)"
        )

    # -- state changes ---------------------------------------------------------------

    def _on_backend_event(self, event: SessionEvent) -> None:
        """Listener given to the backend; must not block."""
        if event is SessionEvent.EXPIRED:
            self._mark_lost(SessionExpired(f"session {self.session_id} expired in the store"))
        elif event is SessionEvent.SUSPENDED:
            with self._lock:
                if self._state is SessionState.ACTIVE:
                    self._state = SessionState.SUSPENDED
                    log.warning("session suspended", extra={"session_id": self.session_id})
        elif event is SessionEvent.RECONNECTED:
            threading.Thread(
                target=self._reconfirm, name=f"consensus-lease-reconfirm-{self.session_id}",
                daemon=True,
            ).start()

    def _reconfirm(self) -> None:
        """After a reconnect, re-confirm every lease in the store before resuming."""
        with self._lock:
            if self._state is not SessionState.SUSPENDED:
                return
            leases = list(self._leases.values())
        try:
            send = self.clock.monotonic()
            ttl = self.backend.keepalive(self.handle)
            for lease in leases:
                try:
                    self.backend.renew(self.handle, lease.job_id, lease.claim_result)
                except LeaseLost as exc:
                    if isinstance(exc, SessionExpired):
                        raise
                    lease._mark_lost(exc)
                    self._forget(lease)
        except SessionExpired as exc:
            self._mark_lost(exc)
            return
        except LeaseError as exc:
            log.warning("re-confirming leases failed", extra={"error": str(exc)})
            return  # still SUSPENDED; the deadline decides
        with self._lock:
            if self._state is SessionState.SUSPENDED:
                self._state = SessionState.ACTIVE
        self._renewed(send, ttl)

    def _lease_failed(self, lease: Lease, exc: LeaseError) -> None:
        self._forget(lease)
        if isinstance(exc, SessionExpired):
            self._mark_lost(exc)

    def _forget(self, lease: Lease) -> None:
        with self._lock:
            if self._leases.get(lease.job_id) is lease:
                del self._leases[lease.job_id]

    def _mark_lost(self, reason: LeaseLost) -> None:
        with self._lock:
            if self._state in (SessionState.LOST, SessionState.CLOSED):
                return
            self._state = SessionState.LOST
            self._lost_reason = reason
            leases = list(self._leases.values())
            self._leases.clear()
            callbacks = list(self._callbacks)
            self._callbacks.clear()
        for lease in leases:
            lease._mark_lost(reason)
        self.lost.set()
        safe_call(self.observer, "lost", self.backend.scheme, None, None, str(reason))
        self._stop.set()
        threading.Thread(
            target=self._end_store_session, daemon=True,
            name=f"consensus-lease-end-{self.session_id}",
        ).start()
        log.error(
            "session lost",
            extra={"session_id": self.session_id, "owner": self.owner, "reason": str(reason)},
        )
        for callback in callbacks:
            self._run_callback(callback, reason)

    def _end_store_session(self) -> None:
        """End the store-side session of a LOST session (best effort): a store that keeps
        sessions alive by itself (ZooKeeper: kazoo pings) would otherwise keep its jobs."""
        try:
            self.backend.close_session(self.handle)
        except BackendUnavailable as exc:
            log.warning(
                "ending the lost session in the store failed; the store expires it",
                extra={"session_id": self.session_id, "error": str(exc)},
            )

    def _run_callback(self, callback: LossCallback, reason: LeaseLost) -> None:
        try:
            callback(self, reason)
        except Exception:
            log.exception("on_lost callback raised", extra={"session_id": self.session_id})

    # -- closing ---------------------------------------------------------------------

    def close(self) -> None:
        """Stop renewing and end the session in the store, handing back every job it
        holds (claimable at once). Idempotent. If the store cannot be reached, the jobs
        become claimable when the store expires the session's TTL.
        """
        with self._lock:
            already = self._state is SessionState.CLOSED
            was_lost = self._state is SessionState.LOST
            if not was_lost:
                self._state = SessionState.CLOSED
            leases = list(self._leases.values())
            self._leases.clear()
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        if already:
            return
        for lease in leases:
            lease._mark_lost(LeaseLost("session closed", job_id=lease.job_id))
        try:
            self.backend.close_session(self.handle)
        except BackendUnavailable as exc:
            log.warning(
                "closing session failed; the store will expire it after its TTL",
                extra={"session_id": self.session_id, "error": str(exc)},
            )

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
