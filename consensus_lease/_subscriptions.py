"""The default way a backend wakes waiting claims: one polling thread for them all.

:meth:`Backend.subscribe_job` / :meth:`Backend.subscribe_queue` register a callback; a
backend without change notification hands them to a :class:`Poller`. The poller keeps
every subscription of one backend in one table and runs one thread (started on the first
subscription, gone after :data:`IDLE_EXIT_S` without any), which every ``interval_s``
asks the backend's ``hint`` which subscribed jobs and queues may have become claimable
and calls their callbacks. Without a hint (``None``) it calls every callback at every
interval: spurious wake-ups are allowed, a missed one is not. A driver that changes the
store itself calls :meth:`Poller.poke` so that its own process's waiters do not wait for
the next interval.

Thousands of waiting claims thus cost one thread, and the store sees at most one hint
query per interval (and one after each poke), however many waiters there are.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence

__all__ = ["IDLE_EXIT_S", "Hint", "Poller", "Unsubscribe", "WakeCallback"]

log = logging.getLogger("consensus_lease")

WakeCallback = Callable[[], None]
"""Called, from any thread, when what a subscription watches may have changed. Must not
block."""

Unsubscribe = Callable[[], None]
"""Cancels a subscription. Idempotent; never blocks long."""

Hint = Callable[[Sequence[str], Sequence[str]], tuple[Collection[str], Collection[str]] | None]
"""``hint(job_ids, queues)``: the subscribed jobs and queues that may be claimable now (a
superset is fine), or ``None`` when the store cannot tell cheaply (wake every one)."""

IDLE_EXIT_S = 1.0
"""The polling thread ends after this many seconds without a subscription (a new one
starts it again), so a process that stopped waiting keeps no thread for it."""

_JOB, _QUEUE = "job", "queue"


class Poller:
    """Every subscription of one backend, and the one thread that polls for them.

    Args:
        name: the thread's name.
        interval_s: seconds between two polls (float > 0).
        hint: see :data:`Hint`; ``None`` wakes every subscriber at every poll.
    """

    def __init__(self, name: str, interval_s: float, hint: Hint | None = None) -> None:
        self.name = name
        self.interval_s = interval_s
        self._hint = hint
        self._ids = itertools.count()
        self._reset()

    def _reset(self) -> None:
        """Fresh state (also in a child process after ``fork``: no thread came along)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._subs: dict[tuple[str, str], dict[int, WakeCallback]] = {}
        self._thread: threading.Thread | None = None
        self._kick = threading.Event()
        self._closed = False

    # -- subscribing -------------------------------------------------------------------

    def subscribe_job(self, job_id: str, callback: WakeCallback) -> Unsubscribe:
        """Call ``callback`` when ``job_id`` may have become claimable."""
        return self._subscribe((_JOB, job_id), callback)

    def subscribe_queue(self, queue: str, callback: WakeCallback) -> Unsubscribe:
        """Call ``callback`` when a job of ``queue`` may have become claimable."""
        return self._subscribe((_QUEUE, queue), callback)

    def _subscribe(self, key: tuple[str, str], callback: WakeCallback) -> Unsubscribe:
        if self._pid != os.getpid():
            self._reset()
        token = next(self._ids)
        with self._lock:
            closed = self._closed
            if not closed:
                self._subs.setdefault(key, {})[token] = callback
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self.name,
                                                    daemon=True)
                    self._thread.start()
        if closed:
            callback()  # the backend is closed: the caller finds out when it re-tries
            return _nothing
        return lambda: self._unsubscribe(key, token)

    def _unsubscribe(self, key: tuple[str, str], token: int) -> None:
        with self._lock:
            callbacks = self._subs.get(key)
            if callbacks is not None:
                callbacks.pop(token, None)
                if not callbacks:
                    del self._subs[key]

    def __len__(self) -> int:
        """The number of subscriptions."""
        with self._lock:
            return sum(len(c) for c in self._subs.values())

    # -- waking ------------------------------------------------------------------------

    def poke(self) -> None:
        """Poll now rather than at the next interval (the store just changed)."""
        self._kick.set()

    def close(self) -> None:
        """Stop polling and call every callback once (their claims re-try and find the
        backend closed). Later subscriptions are called back at once. Idempotent."""
        with self._lock:
            self._closed = True
            callbacks = [cb for subs in self._subs.values() for cb in subs.values()]
            self._subs.clear()
        self._kick.set()
        _call_all(callbacks)

    def _run(self) -> None:
        idle_since: float | None = None
        while True:
            self._kick.wait(self.interval_s)
            self._kick.clear()
            with self._lock:
                if self._closed or self._pid != os.getpid():
                    return
                if not self._subs:
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since >= IDLE_EXIT_S:
                        self._thread = None
                        return
                    continue
                idle_since = None
                keys = list(self._subs)
            _call_all(self._due(keys))

    def _due(self, keys: list[tuple[str, str]]) -> list[WakeCallback]:
        """The callbacks to call after one poll of ``keys``."""
        due = set(keys)
        if self._hint is not None:
            jobs = [k for kind, k in keys if kind == _JOB]
            queues = [k for kind, k in keys if kind == _QUEUE]
            try:
                hinted = self._hint(jobs, queues)
            except Exception as exc:  # the store could not say: let every waiter ask
                log.debug("subscription poll failed", extra={"error": repr(exc)})
                hinted = None
            if hinted is not None:
                due = {(_JOB, j) for j in hinted[0]} | {(_QUEUE, q) for q in hinted[1]}
        with self._lock:
            return [cb for key in keys if key in due for cb in self._subs.get(key, {}).values()]


def _nothing() -> None:
    return None


def _call_all(callbacks: list[WakeCallback]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.exception("a subscription callback raised")
