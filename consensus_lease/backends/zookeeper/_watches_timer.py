"""One thread that runs every timed call of a backend's subscriptions: the ends of retry
delays, re-checks, and re-arming after a failure (ZooKeeper has no timer event).

A heap of ``(monotonic time, function)``; the thread starts with the first call
scheduled and ends after :data:`IDLE_EXIT_S` with nothing left, so a process that is not
waiting keeps no thread for it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["IDLE_EXIT_S", "WakeTimer"]

log = logging.getLogger("consensus_lease.backends.zookeeper")

IDLE_EXIT_S = 1.0
"""The timer thread ends after this many seconds with nothing scheduled."""


class WakeTimer:
    """One thread that calls scheduled functions at their time (``time.monotonic()``), for
    every subscription of one backend. Started when something is scheduled; ends after
    :data:`IDLE_EXIT_S` with nothing left; ``close`` drops what is left and stops it.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (which must not block long) at monotonic time ``when``."""
        with self._cond:
            if self._closed:
                return
            heapq.heappush(self._heap, (when, next(self._seq), fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def __len__(self) -> int:
        """How many calls are scheduled (stale ones included)."""
        with self._cond:
            return len(self._heap)

    def close(self) -> None:
        """Drop every scheduled call and stop the thread. Idempotent."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()

    def _next_due(self) -> list[Callable[[], None]] | None:
        """Wait for the calls now due; ``None``: closed, or idle for IDLE_EXIT_S."""
        idle_since: float | None = None
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                if not self._heap:
                    idle_since = idle_since or now
                    if now - idle_since >= IDLE_EXIT_S:
                        break
                    self._cond.wait(IDLE_EXIT_S - (now - idle_since))
                    continue
                idle_since = None
                if self._heap[0][0] > now:
                    self._cond.wait(self._heap[0][0] - now)
                    continue
                due = []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
                return due
            self._thread = None
            return None

    def _run(self) -> None:
        while (due := self._next_due()) is not None:
            _call_all(due)


def _call_all(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        try:
            call()
        except Exception:
            log.exception("a timed subscription call raised")
