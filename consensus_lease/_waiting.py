"""Waiting claims: how ``claim(..., wait_s=)`` and ``claim_next(..., wait_s=)`` wait.

A waiting claim holds no store connection and polls nothing itself. It tries the claim;
if the job is held it subscribes to the job (or queue) through the backend
(:meth:`Backend.subscribe_job`), tries again — a change between the first try and the
subscription is not missed — and then sleeps until the subscription's callback, the
session's end or its deadline wakes it, and tries again. The synchronous loop is here;
:mod:`consensus_lease.aio` runs the same steps on an event loop.

Each session keeps its waiting claims in a :class:`Waiters`: closing (or losing) the
session wakes every one, so a waiting claim returns within milliseconds of
``session.close()`` instead of at the end of its wait.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ._subscriptions import Unsubscribe, WakeCallback
from .errors import ClaimTimeout, LeaseLost, SessionExpired

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Subscribe", "Waiters", "check_usable", "closing_aware", "wait_and_claim"]

T = TypeVar("T")

Subscribe = Callable[[WakeCallback], Unsubscribe]
"""Subscribes a callback to what a waiting claim waits for (a job, a queue)."""


class Waiters:
    """The wake-up callbacks of one session's waiting claims. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: dict[int, WakeCallback] = {}
        self._ids = itertools.count()
        self._closed = False

    @property
    def closed(self) -> bool:
        """The session was closed: waiting claims end with ``LeaseLost``."""
        with self._lock:
            return self._closed

    def __len__(self) -> int:
        with self._lock:
            return len(self._callbacks)

    def add(self, callback: WakeCallback) -> Callable[[], None]:
        """Register ``callback`` until the returned function is called. Called at once
        if the session is already closed."""
        token = next(self._ids)
        with self._lock:
            closed = self._closed
            if not closed:
                self._callbacks[token] = callback
        if closed:
            callback()
        return lambda: self._remove(token)

    def _remove(self, token: int) -> None:
        with self._lock:
            self._callbacks.pop(token, None)

    def wake_all(self) -> None:
        """Wake every waiting claim (they re-check the session and the store)."""
        with self._lock:
            callbacks = list(self._callbacks.values())
        for callback in callbacks:
            callback()

    def close(self) -> None:
        """Mark the session closed and wake every waiting claim. Idempotent."""
        with self._lock:
            self._closed = True
        self.wake_all()


def check_usable(session: Session) -> None:
    """Raise unless a waiting claim of ``session`` may go on (see
    :meth:`Session.ensure_alive`; a session being closed counts as closed)."""
    session.ensure_alive()
    if session.waiters.closed:
        raise LeaseLost(f"session {session.session_id} is closed")


def closing_aware(session: Session, attempt: Callable[[], T]) -> Callable[[], T]:
    """``attempt``, except that the store's ``SessionExpired`` for a session that was
    closed meanwhile is reported as what happened: ``LeaseLost`` (session closed)."""

    def run() -> T:
        try:
            return attempt()
        except SessionExpired as exc:
            if session.waiters.closed:
                raise LeaseLost(f"session {session.session_id} is closed") from exc
            raise

    return run


def wait_and_claim(
    session: Session, subscribe: Subscribe, attempt: Callable[[], T | None], wait_s: float,
    timed_out: Callable[[], ClaimTimeout], again: Callable[[], T | None] | None = None,
) -> T:
    """Run ``attempt`` (one claim, no waiting) until it returns a value, waking on
    ``subscribe``'s callback, on the session's end, or at its deadline; raise
    ``timed_out()`` after ``wait_s`` seconds of the session's clock. ``again``, if
    given, is the attempt made once subscribed (the try right after subscribing and
    each one a wake triggers): it may read the store as of what the subscription has
    seen, since every later change wakes it again (see
    :meth:`Backend.queue_candidates_after_wake
    <consensus_lease.backend.Backend.queue_candidates_after_wake>`)."""
    clock = session.clock
    give_up_at = clock.monotonic() + wait_s
    attempt = closing_aware(session, attempt)
    retry = attempt if again is None else closing_aware(session, again)
    check_usable(session)
    found = attempt()
    if found is not None:
        return found
    if clock.monotonic() >= give_up_at:
        raise timed_out()
    wake = threading.Event()
    remove = session.waiters.add(wake.set)
    try:
        unsubscribe = subscribe(wake.set)
        try:
            while True:
                wake.clear()
                check_usable(session)
                found = retry()
                if found is not None:
                    return found
                left = give_up_at - clock.monotonic()
                if left <= 0:
                    raise timed_out()
                clock.wait(wake, left)
        finally:
            unsubscribe()
    finally:
        remove()
