"""A session's liveness: the local deadline, its state, its keepalive schedule.

One implementation for every backend. The deadline is ``send time of the last successful
renewal + granted TTL - safety margin`` on the worker's monotonic clock (never the
receive time: the store started its TTL no earlier than it received the request). A
keepalive is sent every ``granted TTL / 3``, and after a failed renewal retried 50 ms
later, doubling the delay up to a third of that interval and a quarter of the time left
before the deadline (never below 50 ms, never waiting for the next regular tick); the
session is declared LOST the moment the deadline passes, whatever the backend does or
fails to do. The threads that do this are shared by the sessions of a store
(:mod:`._renewer`); what is per session (deadline, retry delays, errors) is here. When
the session is lost, the store-side session is ended as well (best effort, from a
background thread), so that a client library which keeps its connection alive by itself
(kazoo's pings) cannot keep this worker's jobs held after it has given them up.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from ._fork import Origin
from ._renewer import Renewer, on_renewer_thread
from .backend import Backend, SessionEvent, SessionHandle
from .clock import Clock
from .errors import (
    BackendUnavailable,
    InvalidArgument,
    LeaseError,
    LeaseLost,
    LeaseSuspended,
    SessionExpired,
    StoreClosed,
)
from .observe import Observer, notify
from .states import SessionState

__all__ = ["EventRelay", "Liveness"]

T = TypeVar("T")

log = logging.getLogger("consensus_lease")

KEEPALIVE_FRACTION = 1 / 3
"""A keepalive is sent every ``granted TTL * KEEPALIVE_FRACTION`` seconds."""

DEFAULT_MARGIN_FRACTION = 0.1
"""Default safety margin: this fraction of the granted TTL is taken off the local deadline
to cover clock-rate drift between worker and store and scheduling delay."""

FIRST_RETRY_S = 0.05
"""Delay before retrying a failed keepalive; doubled after each further failure, up to a
third of the keepalive interval and a quarter of the time left before the deadline."""

LossListener = Callable[[LeaseLost], None]


class EventRelay:
    """The listener a backend is given when a session is opened. Events that arrive
    before the session object exists are queued and replayed once it is bound."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target: Callable[[SessionEvent], None] | None = None
        self._early: list[SessionEvent] = []

    def __call__(self, event: SessionEvent) -> None:
        with self._lock:
            target = self._target
            if target is None:
                self._early.append(event)
                return
        target(event)

    def bind(self, target: Callable[[SessionEvent], None]) -> None:
        with self._lock:
            self._target = target
            early, self._early = self._early, []
        for event in early:
            target(event)


class Liveness:
    """Deadline and state of one session, and the threads that keep it alive.

    Thread-safe. ``call`` is the one path by which the core makes a store call on the
    session's behalf: a ``SessionExpired`` from the store loses the whole session.

    Not fork-safe (see :mod:`._fork`): in a fork's child every use raises
    ``StoreInherited``, and nothing here ends the store-side session, which is the
    parent's.
    """

    def __init__(
        self,
        backend: Backend,
        handle: SessionHandle,
        *,
        clock: Clock,
        send_time: float,
        safety_margin_s: float | None,
        observer: Observer | None,
    ) -> None:
        self.backend = backend
        self.handle = handle
        self.clock = clock
        self.observer = observer
        ttl = handle.granted_ttl_s
        margin = ttl * DEFAULT_MARGIN_FRACTION if safety_margin_s is None else safety_margin_s
        if not 0 <= margin < ttl:
            raise InvalidArgument(
                f"safety_margin_s={margin:g} must be >= 0 and below the granted TTL {ttl:g} s"
            )
        self.safety_margin_s = margin
        self._granted_ttl_s = ttl
        self._lock = threading.RLock()
        self._deadline = send_time + ttl - margin
        self._state = SessionState.ACTIVE
        self._lost_reason: LeaseLost | None = None
        self._listeners: list[LossListener] = []
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._renewer: Renewer | None = None
        self._own_renewer = False
        # the keepalive schedule (see keepalive_due / keepalive_step)
        self._last_send = send_time
        self._retry_s: float | None = None
        self._failures = 0  # in a row
        self._step_idle = threading.Event()  # no keepalive_step is running
        self._step_idle.set()
        self._step_thread: threading.Thread | None = None
        self.origin = Origin()
        self.store_closed = False
        """Set (before the session is closed) when its store is closed: every
        operation then raises ``StoreClosed``."""

    def start(self, renewer: Renewer | None, *, keepalive: bool) -> None:
        """Watch the deadline, and renew every granted TTL / 3 unless ``keepalive`` is
        false, on ``renewer``'s threads (shared with other sessions), or on a renewer of
        this session's own if ``None`` (ended with the session)."""
        if renewer is None:
            renewer = Renewer(self.clock)
            self._own_renewer = True
        self._renewer = renewer
        self._last_send = self.clock.monotonic()
        renewer.add(self, keepalive=keepalive)

    # -- reading ---------------------------------------------------------------------

    @property
    def granted_ttl_s(self) -> float:
        with self._lock:
            return self._granted_ttl_s

    @property
    def deadline(self) -> float:
        with self._lock:
            return self._deadline

    def remaining_s(self) -> float:
        return self.deadline - self.clock.monotonic()

    @property
    def state(self) -> SessionState:
        if self.origin.inherited():
            return self._state  # as at the fork; no lock (see check_usable)
        with self._lock:
            state = self._state
        if state in (SessionState.ACTIVE, SessionState.SUSPENDED) and self.remaining_s() <= 0:
            self.mark_lost(self._deadline_passed())
            return SessionState.LOST
        return state

    @property
    def lost_reason(self) -> LeaseLost | None:
        with self._lock:
            return self._lost_reason

    def ended(self) -> bool:
        """LOST or CLOSED (its renewer then drops it)."""
        return self._stop.is_set()

    def check_usable(self) -> None:
        """Raise ``StoreInherited`` in a fork's child, ``StoreClosed`` once the store
        was closed; no lock taken (one held by a parent's thread at the fork would never
        be released in the child)."""
        if self.origin.inherited():  # the message is built only when it is raised
            self.origin.check(f"session {self.handle.session_id}")
        if self.store_closed:
            raise StoreClosed(
                f"the store of session {self.handle.session_id} was closed; open a new one"
            )

    def ensure_alive(self) -> None:
        """Raise unless the session may be used (see :meth:`Session.ensure_alive`)."""
        self.check_usable()
        state = self.state
        if state is SessionState.ACTIVE:
            return
        sid = self.handle.session_id
        if state is SessionState.SUSPENDED:
            raise LeaseSuspended(f"session {sid} is suspended")
        if state is SessionState.CLOSED:
            raise LeaseLost(f"session {sid} is closed")
        reason = self.lost_reason
        if isinstance(reason, SessionExpired):  # keeps the subclass (StoreRegressed)
            raise type(reason)(str(reason)) from reason
        raise LeaseLost(f"session {sid} is lost: {reason}") from reason

    # -- the one path for store calls ------------------------------------------------

    def call(self, fn: Callable[[], T]) -> T:
        """Run a store call; a ``SessionExpired`` from the store loses the session. Not
        in a fork's child, nor once the store is closed (also while the call ran: its
        error is then ``StoreClosed``)."""
        self.check_usable()
        try:
            return fn()
        except LeaseError as exc:
            if self.store_closed:
                raise StoreClosed(
                    f"the store of session {self.handle.session_id} was closed: {exc}",
                    job_id=exc.job_id, generation=exc.generation,
                ) from exc
            if isinstance(exc, SessionExpired):
                told = self.told_closed(exc)
                if told is not exc:
                    raise told from exc
                self.mark_lost(exc)
            raise

    def told_closed(self, exc: SessionExpired) -> SessionExpired:
        """``exc`` (the store's ``SessionExpired``) said plainly when this process closed
        the session (``Session.close()``) before the call: the store ended its leases
        then. Otherwise ``exc`` itself."""
        if self.state is not SessionState.CLOSED:
            return exc
        told = type(exc)(
            f"session {self.handle.session_id} was closed (Session.close()) before this "
            f"call: its leases ended in the store then (the store said: {exc})",
            job_id=exc.job_id, generation=exc.generation)
        told.__cause__ = exc
        return told

    def keepalive(self, outcome: Callable[[], float] | None = None,
                  send_time: float | None = None) -> float:
        """One keepalive round trip (or the ``outcome`` of one sent at ``send_time``);
        moves the deadline on success. Returns the TTL."""
        send = self.clock.monotonic() if send_time is None else send_time
        ttl = self.call(outcome or (lambda: self.backend.keepalive(self.handle)))
        self.renewed(send, ttl)
        return ttl

    def renewed(self, send_time: float, granted_ttl_s: float) -> None:
        """The store confirmed the session for a request sent at ``send_time``."""
        now = self.clock.monotonic()
        with self._lock:
            if self._state is not SessionState.ACTIVE:
                return
            headroom = self._deadline - now
            self._granted_ttl_s = granted_ttl_s
            new_deadline = send_time + granted_ttl_s - self.safety_margin_s
            if new_deadline > self._deadline and send_time < self._deadline:
                self._deadline = new_deadline
        scheme = self.backend.scheme
        notify(self.observer, lambda o: o.renewed(scheme, now - send_time, headroom))

    # -- state changes ---------------------------------------------------------------

    def suspend(self) -> bool:
        """ACTIVE -> SUSPENDED; returns whether it changed."""
        with self._lock:
            if self._state is not SessionState.ACTIVE:
                return False
            self._state = SessionState.SUSPENDED
        log.warning("session suspended", extra={"session_id": self.handle.session_id})
        return True

    def is_suspended(self) -> bool:
        with self._lock:
            return self._state is SessionState.SUSPENDED

    def resume(self, send_time: float, granted_ttl_s: float) -> None:
        """SUSPENDED -> ACTIVE after every lease was re-confirmed by a request sent at
        ``send_time``."""
        with self._lock:
            if self._state is SessionState.SUSPENDED:
                self._state = SessionState.ACTIVE
        self.renewed(send_time, granted_ttl_s)

    def on_loss(self, listener: LossListener) -> LeaseLost | None:
        """Register ``listener(reason)`` for the loss; returns the reason instead (and
        registers nothing) if the session is already lost."""
        with self._lock:
            if self._lost_reason is None:
                self._listeners.append(listener)
                return None
            return self._lost_reason

    def remove_listener(self, listener: LossListener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def mark_lost(self, reason: LeaseLost) -> bool:
        """Make the session LOST (final), run the loss listeners once (on a thread of
        their own when called from a renewal thread, which other sessions share), stop
        renewing and end the store-side session in the background. False if already over, and in
        a fork's child (whose copy of the deadline stood still: the parent renews)."""
        if self.origin.inherited():
            return False
        with self._lock:
            if self._state in (SessionState.LOST, SessionState.CLOSED):
                return False
            self._state = SessionState.LOST
            self._lost_reason = reason
            listeners, self._listeners = self._listeners, []
        self.lost.set()
        self._stop.set()
        self._release_renewer()
        scheme = self.backend.scheme
        notify(self.observer, lambda o: o.lost(scheme, None, None, str(reason)))
        log.error(
            "session lost",
            extra={"session_id": self.handle.session_id, "owner": self.handle.owner,
                   "reason": str(reason)},
        )
        if on_renewer_thread():  # a keepalive's answer: the runner serves other sessions
            threading.Thread(
                target=self._run_listeners, args=(listeners, reason), daemon=True,
                name=f"consensus-lease-lost-{self.handle.session_id}",
            ).start()
        else:
            self._run_listeners(listeners, reason)
        threading.Thread(
            target=self._end_store_session, daemon=True,
            name=f"consensus-lease-end-{self.handle.session_id}",
        ).start()
        return True

    def _run_listeners(self, listeners: list[LossListener], reason: LeaseLost) -> None:
        for listener in listeners:
            try:
                listener(reason)
            except Exception:
                log.exception("session loss listener raised",
                              extra={"session_id": self.handle.session_id})

    def close(self) -> bool:
        """Make the session CLOSED and stop renewing it; waits (up to 5 s) for a
        keepalive in flight, unless called from within it. Returns False if it was
        already closed."""
        with self._lock:
            already = self._state is SessionState.CLOSED
            if self._state is not SessionState.LOST:
                self._state = SessionState.CLOSED
            self._listeners = []
        self._stop.set()
        if self._step_thread is not threading.current_thread():
            self._step_idle.wait(timeout=5)
        self._release_renewer()
        return not already

    def _release_renewer(self) -> None:
        if self._renewer is None:
            return
        if self._own_renewer:
            self._renewer.close()
        else:
            self._renewer.discard(self)

    def end_store_session(self) -> None:
        """End the session in the store (its jobs become claimable at once); best
        effort: if the store cannot be reached, its TTL ends the session. Never in a
        fork's child: the session is the parent's."""
        if self.origin.inherited():
            return
        try:
            self.backend.close_session(self.handle)
        except BackendUnavailable as exc:
            log.warning(
                "closing session failed; the store will expire it after its TTL",
                extra={"session_id": self.handle.session_id, "error": str(exc)},
            )

    def _end_store_session(self) -> None:
        try:
            self.end_store_session()
        except Exception:  # a driver bug, in a background thread: nobody to raise to
            log.exception("ending a lost session failed",
                          extra={"session_id": self.handle.session_id})

    # -- the keepalive schedule (run by the renewer's threads) --------------------------

    def keepalive_due(self) -> float | None:
        """Monotonic time of the next keepalive; ``None`` once the session is over."""
        if self._stop.is_set():
            return None
        interval = self.granted_ttl_s * KEEPALIVE_FRACTION
        return self._last_send + (interval if self._retry_s is None else self._retry_s)

    def keepalive_step(self) -> None:
        """The keepalive that is due: sent (ACTIVE), skipped for a short while
        (SUSPENDED: the backend's reconnect resumes the session), or nothing (over)."""
        if self.keepalive_begin():
            try:
                interval = self.granted_ttl_s * KEEPALIVE_FRACTION
                self._retry_s = self._keepalive_once(interval, self._failures)
                self._failures = 0 if self._retry_s is None else self._failures + 1
            finally:
                self._step_done()

    def keepalive_begin(self) -> bool:
        """The first half of :meth:`keepalive_step` for a keepalive the caller sends
        with others (``Backend.keepalive_many``): ``True`` if one is to be sent now, and
        then :meth:`keepalive_end` must follow, on the same thread."""
        self._step_idle.clear()  # before the state is read: close() waits for it
        self._step_thread = threading.current_thread()
        state = self.state
        if state in (SessionState.LOST, SessionState.CLOSED) or self._stop.is_set():
            self._step_done()
            return False
        self._last_send = self.clock.monotonic()
        if state is SessionState.SUSPENDED:
            self._retry_s = min(self.granted_ttl_s * KEEPALIVE_FRACTION, 0.2)
            self._step_done()
            return False
        return True

    def keepalive_end(self, send_time: float, result: float | Exception) -> None:
        """The second half: the keepalive sent at ``send_time`` (before the request)
        ended with the TTL granted or an error, handled as :meth:`keepalive_step`
        handles its own."""
        def outcome() -> float:
            if isinstance(result, Exception):
                raise result
            return result

        try:
            interval = self.granted_ttl_s * KEEPALIVE_FRACTION
            self._retry_s = self._keepalive_once(interval, self._failures, outcome, send_time)
            self._failures = 0 if self._retry_s is None else self._failures + 1
        finally:
            self._step_done()

    def _step_done(self) -> None:
        self._step_thread = None
        self._step_idle.set()

    def deadline_check(self) -> None:
        """LOST if the deadline has passed (the renewer's watchdog calls it then)."""
        if self.remaining_s() <= 0 and self.state is not SessionState.CLOSED:
            self.mark_lost(self._deadline_passed())

    def _keepalive_once(self, interval: float, failures: int,
                        outcome: Callable[[], float] | None = None,
                        send_time: float | None = None) -> float | None:
        """One keepalive (or the ``outcome`` of one sent at ``send_time``); returns the
        retry delay after a failure (``failures``: the failures just before this one),
        ``None`` on success."""
        try:
            self.keepalive(outcome, send_time)
            return None
        except SessionExpired:
            return None  # call() marked the session lost; the loop ends
        except StoreClosed:
            return None  # the store is closing the session, which stops this loop
        except BackendUnavailable as exc:
            # Retry soon, then backing off, until the watchdog declares the deadline
            # passed: the store may answer again any moment (a new leader, a reconnect).
            log.warning("keepalive failed, retrying",
                        extra={"session_id": self.handle.session_id, "error": str(exc)})
            cap = max(FIRST_RETRY_S, min(interval / 3, self.remaining_s() / 4))
            return min(cap, FIRST_RETRY_S * (1 << min(failures, 16)))
        except Exception as exc:  # a driver bug: do not pretend the lease is safe
            self.mark_lost(LeaseLost(f"keepalive failed unexpectedly: {exc!r}"))
            log.exception("keepalive crashed", extra={"session_id": self.handle.session_id})
            return None

    def _deadline_passed(self) -> LeaseLost:
        return LeaseLost(
            f"session {self.handle.session_id}: local deadline passed without a successful "
            f"renewal (granted TTL {self.granted_ttl_s:g} s, margin {self.safety_margin_s:g} s)"
        )
