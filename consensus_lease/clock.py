"""Clocks used for *local* deadlines and waiting only.

Ownership is never decided by these: the store decides with its own time (etcd lease TTL,
ZooKeeper session expiry, the SQLite database clock). A worker uses its clock to stop
producing effects *before* the store could hand its job to someone else, which needs a
clock that only moves forward at a steady rate: ``time.monotonic``.

Tests inject :class:`FakeClock` to make time pass without sleeping, or
:class:`SkewedClock` to show that an hour of wall-clock skew changes nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "SkewedClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """What the library needs from a clock."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch, for logs and display only."""
        ...

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Block until ``event`` is set or ``timeout_s`` of this clock's time passed.

        Returns ``event.is_set()``.
        """
        ...


class SystemClock:
    """The real clocks: ``time.monotonic`` and ``time.time``."""

    # time.monotonic itself, not a method calling it: the clock is read several times per
    # lease operation, and this is one Python call fewer on each of those paths
    monotonic = staticmethod(time.monotonic)

    def time(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(max(0.0, timeout_s))


class SkewedClock(SystemClock):
    """The system clock read with a fixed offset on both the wall and monotonic clocks,
    as on a worker whose clock is wrong by ``offset_s`` seconds (e.g. ±3600)."""

    def __init__(self, offset_s: float) -> None:
        self.offset_s = float(offset_s)

    def monotonic(self) -> float:
        return time.monotonic() + self.offset_s

    def time(self) -> float:
        return time.time() + self.offset_s


class FakeClock:
    """A clock that moves only when :meth:`advance` is called. Thread-safe.

    ``wait`` returns as soon as the event is set or enough fake time has been advanced.
    """

    def __init__(self, start_s: float = 1_000.0, wall_start_s: float = 1_700_000_000.0) -> None:
        self._now = float(start_s)
        self._wall_offset = float(wall_start_s) - float(start_s)
        self._cond = threading.Condition()

    def monotonic(self) -> float:
        with self._cond:
            return self._now

    def time(self) -> float:
        with self._cond:
            return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and wake every waiter."""
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        with self._cond:
            self._now += seconds
            self._cond.notify_all()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        with self._cond:
            target = self._now + max(0.0, timeout_s)
            # Poll the event at a short real-time interval: Event has no hook to wake us.
            while not event.is_set() and self._now < target:
                self._cond.wait(0.005)
        return event.is_set()
