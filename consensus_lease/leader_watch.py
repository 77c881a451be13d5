"""Following an election's leader: ``store.watch_leader(name)`` and its asyncio twin.

A watch subscribes to the election's key (:meth:`Backend.subscribe_job`, which for an
election key wakes after every claim, value and end of a hold), then reads the leader
after each wake: subscribe first, read after, so no change between the two is missed. A
read is reported only if it differs from the last one reported (another leader, another
generation or value, or nobody) and is not older: :class:`LeaderChanges` never goes back
to a generation below one already reported, nor back to a leader that was reported gone.
Reads can coalesce changes that come faster than they do (a leader that resigned and a
successor that claimed between two reads show as the successor alone), never reorder them.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import TYPE_CHECKING

from ._election import election_key
from .election import LeaderRecord
from .errors import StoreClosed

if TYPE_CHECKING:
    from .store import LeaseStore

__all__ = ["LeaderChanges", "LeaderWatch"]

FOREVER_S = 3600.0
"""A wait without a timeout waits in steps of this many seconds."""


def _same(a: LeaderRecord | None, b: LeaderRecord | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.owner, a.generation, a.value) == (b.owner, b.generation, b.value)


class LeaderChanges:
    """Which reads of an election a leader watch reports: the first one, then each that
    differs from the last reported and is not older than it."""

    def __init__(self) -> None:
        self._started = False
        self._last: LeaderRecord | None = None
        self._floor = -1  # generations <= this are over (or older than one reported)

    def accept(self, record: LeaderRecord | None) -> bool:
        """Whether to report ``record``; if so, it becomes the last reported."""
        if record is not None and record.generation <= self._floor:
            return False
        if self._started and _same(record, self._last):
            return False
        if record is None and self._last is not None:
            self._floor = self._last.generation  # that leader is gone for good
        elif record is not None:
            self._floor = record.generation - 1  # same generation: a new value only
        self._started, self._last = True, record
        return True


class LeaderWatch:
    """The iterator ``store.watch_leader(name)`` returns: the leader now (a
    :class:`~consensus_lease.LeaderRecord`, or ``None`` when nobody leads), then each
    change. Ends (``StopIteration``) when ``timeout_s`` passed, when :meth:`close` is
    called (from any thread; a blocked ``next()`` returns at once), or when the store is
    closed. A context manager (closes on exit). A read that fails raises from ``next()``
    (``BackendUnavailable``); the watch stays usable.
    """

    def __init__(self, store: LeaseStore, name: str, timeout_s: float | None) -> None:
        self._store = store
        self._name = name
        self._clock = store.clock
        self._give_up = None if timeout_s is None else self._clock.monotonic() + timeout_s
        self._wake = threading.Event()
        self._changes = LeaderChanges()
        self._closed = False
        self._lock = threading.Lock()
        self._remove = store.watchers.add(self._wake.set)
        try:
            self._unsubscribe = store.backend.subscribe_job(election_key(name), self._wake.set)
        except BaseException:
            self._remove()
            raise

    def __iter__(self) -> LeaderWatch:
        return self

    def __next__(self) -> LeaderRecord | None:
        while True:
            if self._closed or self._store.closed:
                self.close()
                raise StopIteration
            self._wake.clear()
            try:
                record = self._store.leader(self._name)
            except StoreClosed:
                self.close()
                raise StopIteration from None
            if self._changes.accept(record):
                return record
            left = FOREVER_S if self._give_up is None else self._give_up - self._clock.monotonic()
            if left <= 0:
                self.close()
                raise StopIteration
            self._clock.wait(self._wake, min(left, FOREVER_S))

    def close(self) -> None:
        """Stop watching: cancel the subscription; the iteration ends. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._unsubscribe()
        self._remove()
        self._wake.set()

    def __enter__(self) -> LeaderWatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
