"""Waiting claims of the SQLite driver: the subscriptions (the default poller, which asks
:func:`claimable_hint` which waiters may proceed), and the change watch that wakes them
soon after another process changed the store. What waiting costs and how soon it wakes:
the package docstring (:mod:`consensus_lease.backends.sqlite`).

The change watch. SQLite cannot notify another process. What it offers cheaply is
``PRAGMA data_version`` (https://www.sqlite.org/pragma.html#pragma_data_version): a
number that differs between two reads on one connection iff another connection committed
a change in between. Read on a connection of its own, it costs no table read and no
write lock: in WAL mode it looks at the shared-memory WAL index
(https://www.sqlite.org/wal.html).

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
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from ..._election import is_election_key
from ..._subscriptions import IDLE_EXIT_S
from . import _queues, _transport
from ._layout import ALIVE_J, HINT_CHUNK, NOW

if TYPE_CHECKING:
    from .driver import SqliteBackend

__all__ = ["WATCH_MIN_S", "ChangeWatch", "claimable_hint", "claims_wait", "wait_for_change"]

log = logging.getLogger("consensus_lease")

WATCH_MIN_S = 0.001
"""Seconds between two ``PRAGMA data_version`` reads right after a change was seen (the
schedule then doubles up to ``watch_interval_s``)."""

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
        db = _transport.attempt(lambda: sqlite3.connect(
            self.path, timeout=self.busy_timeout_s, isolation_level=None))
        if not isinstance(db, sqlite3.Connection):
            log.debug("change watch cannot open the store", extra={"error": repr(db)})
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
        version = _transport.attempt(lambda: int(db.execute("PRAGMA data_version").fetchone()[0]))
        if not isinstance(version, int):
            log.debug("change watch read failed", extra={"error": repr(version)})
            return None
        return version

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


# -- the driver's waiting claims ------------------------------------------------------------

def claims_wait(backend: SqliteBackend) -> bool:
    """Whether any claim of this store object waits (the watch runs while one does)."""
    poller = backend._poller
    return poller is not None and len(poller) > 0


def wait_for_change(backend: SqliteBackend, job_id: str, timeout_s: float) -> None:
    """Sleep one poll interval: SQLite cannot notify another process
    (``capabilities.store_watch`` is False)."""
    time.sleep(max(0.0, min(timeout_s, backend.poll_interval_s)))


def claimable_hint(
    backend: SqliteBackend, job_ids: Sequence[str], queues: Sequence[str]
) -> tuple[Collection[str], Collection[str]] | None:
    """Which waiting claims of this process may proceed, at each poll: the subscribed
    jobs that are not held by a live session nor in a retry delay (completed and FAILED
    ones included: their waiters must learn it), the subscribed election keys whose
    holder, liveness or value changed since the last poll (an election becomes
    claimable no other way), and the queues with a claimable job. One read per
    :data:`~._layout.HINT_CHUNK` subscribed jobs, one per subscribed queue, and one per
    :data:`~._layout.HINT_CHUNK` subscribed election keys, however many claims wait on
    each. Expiry and retry delays are compared with the database's clock."""
    blocked: set[str] = set()
    for start in range(0, len(job_ids), HINT_CHUNK):
        chunk = tuple(job_ids[start : start + HINT_CHUNK])
        rows = backend._transport.read(
            f"SELECT j.job_id FROM cl_jobs j WHERE j.job_id IN "
            f"({', '.join('?' * len(chunk))}) "
            "AND j.completed_at IS NULL AND j.failed_at IS NULL "
            f"AND ((j.not_before IS NOT NULL AND j.not_before > {NOW}) "
            "OR EXISTS (SELECT 1 FROM cl_sessions s "
            f"WHERE s.session_id = j.session_id AND s.expires_at > {NOW}))",
            chunk,
        )
        blocked.update(row[0] for row in rows)
    ready = [q for q in queues if _queues.queue_candidates(backend, q, 1)]
    states = _election_states(backend, job_ids)
    changed = backend._elections.changed(states)
    return [j for j in job_ids if j in changed
            or (j not in states and j not in blocked)], ready


def _election_states(
    backend: SqliteBackend, job_ids: Sequence[str]
) -> dict[str, tuple[Any, ...] | None]:
    """Election key -> what changes with its leader or value (``None``: no row)."""
    keys = tuple(j for j in job_ids if is_election_key(j))
    states: dict[str, tuple[Any, ...] | None] = dict.fromkeys(keys)
    for start in range(0, len(keys), HINT_CHUNK):
        chunk = keys[start : start + HINT_CHUNK]
        rows = backend._transport.read(
            f"SELECT j.job_id, j.epoch, j.generation, j.session_id, j.value, {ALIVE_J} "
            f"FROM cl_jobs j WHERE j.job_id IN ({', '.join('?' * len(chunk))})",
            chunk,
        )
        states.update((row[0], tuple(row[1:])) for row in rows)
    return states
