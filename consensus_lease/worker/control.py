"""Stopping a worker: the request (from a signal, a caller's event, or the queue
running dry), its reason, and the second request that skips the grace period."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from ..errors import InvalidArgument

__all__ = ["BACKOFF_S", "SETTLE_ATTEMPTS", "StopControl", "signal_handlers"]

SETTLE_ATTEMPTS = 5
"""Tries of a completion, failure or release that the store did not answer, before the
slot gives up (a slot closes its session, which hands the job back, or lets the TTL do
so)."""
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
"""Waits after consecutive store errors (the last one repeats)."""

EXTERNAL_POLL_S = 0.1
"""How often a caller's ``stop_event`` is looked at while waiting (threading.Event has no
hook to wake another waiter)."""


class StopControl:
    """Shared by a worker's slots: whether to stop, why, and whether to hurry.

    Args:
        external: a caller's ``threading.Event``; setting it requests a stop.
    """

    def __init__(self, external: threading.Event | None = None) -> None:
        self._external = external
        self._stop = threading.Event()
        self._hurry = threading.Event()
        self._lock = threading.Lock()
        self.reason: str | None = None
        self.requested_at: float | None = None
        """``time.monotonic()`` of the first stop request."""

    def request(self, reason: str) -> None:
        """Stop claiming; let jobs in flight finish within the grace period."""
        with self._lock:
            if self.reason is None:
                self.reason = reason
                self.requested_at = time.monotonic()
        self._stop.set()

    def hurry(self, reason: str) -> None:
        """Stop now: skip (the rest of) the grace period."""
        self.request(reason)
        self._hurry.set()

    @property
    def stopping(self) -> bool:
        if (not self._stop.is_set() and self._external is not None
                and self._external.is_set()):
            self.request("stop_event")
        return self._stop.is_set()

    @property
    def hurried(self) -> bool:
        return self._hurry.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s`` seconds, less if a stop is requested; returns
        :attr:`stopping`."""
        give_up = time.monotonic() + timeout_s
        while not self.stopping:
            left = give_up - time.monotonic()
            if left <= 0:
                return False
            self._stop.wait(left if self._external is None else min(left, EXTERNAL_POLL_S))
        return True

    def wait_hurry(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s`` seconds, less if told to hurry; returns
        :attr:`hurried`."""
        return self._hurry.wait(max(0.0, timeout_s))


@contextmanager
def signal_handlers(
    control: StopControl, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
) -> Iterator[None]:
    """Make ``signals`` request a graceful stop of ``control`` (a second one: hurry),
    restoring the previous handlers on exit.

    Raises:
        InvalidArgument: not called from the main thread (Python delivers signals there
            only); library callers pass a ``stop_event`` instead.
    """
    if threading.current_thread() is not threading.main_thread():
        raise InvalidArgument("signal handlers can only be installed from the main thread; "
                              "pass stop_event instead")

    def on_signal(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if control.stopping:
            control.hurry(name)
        else:
            control.request(name)

    previous = {s: signal.signal(s, on_signal) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
