"""Waking a process's waiting claims soon after another process changed a SQLite store.

SQLite cannot notify another process. What it offers cheaply is ``PRAGMA data_version``
(https://www.sqlite.org/pragma.html#pragma_data_version): a number that differs between
two reads on one connection iff another connection committed a change in between. Read
on a connection of its own, it costs no table read and no write lock: in WAL mode it
looks at the shared-memory WAL index (https://www.sqlite.org/wal.html).

While claims of this process wait, one thread (:class:`ChangeWatch`) reads it on an
adaptive schedule: ``min_interval_s`` after a change (more changes tend to follow), then
twice as long after every read that saw none, up to ``max_interval_s``, which bounds the
delay before a change is noticed when the store was quiet. On a change it calls
``on_change`` (the driver's ``wake_subscribers``: the subscription poller then asks which
waiting claims may proceed and wakes those). Under a constant stream of changes the
interval grows as well, so the poller is poked at most every ``max_interval_s``.
Expiries and retry delays change nothing in the file: the poller's own interval covers
them. The thread starts with the first waiting claim and ends :data:`IDLE_EXIT_S` after
the last one.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable

from .._subscriptions import IDLE_EXIT_S

__all__ = ["ChangeWatch"]

log = logging.getLogger("consensus_lease")

READY_WAIT_S = 1.0
"""How long :meth:`ChangeWatch.ensure` waits for a new thread's first read (the baseline
later changes are compared with); past it, the poller's interval still covers waiters."""


class ChangeWatch:
    """The ``data_version`` reader of one SQLite store object (see the module docstring).

    Args:
        path: the database file (never ``":memory:"``: no other connection sees it).
        on_change: called from the watch thread after each change seen; must not block.
        active: whether any claim waits (the thread ends when none did for a while).
        min_interval_s / max_interval_s: the adaptive schedule's bounds (seconds > 0).
        busy_timeout_s: the connection's busy timeout (a read waits for a WAL recovery).
    """

    def __init__(
        self, path: str, on_change: Callable[[], None], active: Callable[[], bool], *,
        min_interval_s: float, max_interval_s: float, busy_timeout_s: float,
    ) -> None:
        self.path = path
        self.min_interval_s = min(min_interval_s, max_interval_s)
        self.max_interval_s = max_interval_s
        self.busy_timeout_s = busy_timeout_s
        self.reads = 0  # data_version reads so far (for tests and measurements)
        self._on_change = on_change
        self._active = active
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._touched = time.monotonic()
        self._stop = threading.Event()

    def ensure(self) -> None:
        """Make sure the thread runs and has its baseline before the caller subscribes,
        so that a change after the caller's next claim attempt is seen."""
        with self._lock:
            self._touched = time.monotonic()
            if self._stop.is_set():
                return
            if self._thread is not None and self._pid == os.getpid():
                return
            self._pid = os.getpid()
            ready = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True,
                                            name="consensus-lease-sqlite-watch")
            self._thread.start()
        ready.wait(READY_WAIT_S)

    def close(self) -> None:
        """Stop the thread (it closes its connection); idempotent, does not wait."""
        self._stop.set()

    def _run(self, ready: threading.Event) -> None:
        try:
            db = sqlite3.connect(self.path, timeout=self.busy_timeout_s,
                                 isolation_level=None)
        except sqlite3.Error as exc:
            log.debug("change watch cannot open the store", extra={"error": repr(exc)})
            self._exit()
            ready.set()
            return
        try:
            self._watch(db, ready)
        finally:
            db.close()

    def _watch(self, db: sqlite3.Connection, ready: threading.Event) -> None:
        last = self._version(db)
        ready.set()
        interval, quiet = self.min_interval_s, True
        while True:
            time.sleep(interval)  # cheaper than Event.wait; close() is seen within it
            if self._stop.is_set():
                return
            if self._active():
                self._touched = time.monotonic()
            elif self._idle_exit():
                return
            now = self._version(db)
            changed = now is None or now != last
            last = now
            if changed:
                self._on_change()
            interval = (self.min_interval_s if changed and quiet
                        else min(interval * 2, self.max_interval_s))
            quiet = not changed

    def _version(self, db: sqlite3.Connection) -> int | None:
        """The connection's data_version, or ``None`` if it could not be read (counted
        as a change: the poller then asks the store itself)."""
        self.reads += 1
        try:
            return int(db.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error as exc:
            log.debug("change watch read failed", extra={"error": repr(exc)})
            return None

    def _idle_exit(self) -> bool:
        """End the thread if no claim waited for :data:`IDLE_EXIT_S` (a later
        :meth:`ensure` starts another)."""
        with self._lock:
            if time.monotonic() - self._touched < IDLE_EXIT_S:
                return False
            self._thread = None
            return True

    def _exit(self) -> None:
        with self._lock:
            self._thread = None
