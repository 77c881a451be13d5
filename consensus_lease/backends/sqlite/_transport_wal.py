"""Keeping a SQLite store's write-ahead log bounded, and saying so when a reader stops it.

In WAL mode (https://www.sqlite.org/wal.html) every commit appends its pages to the
``-wal`` file beside the database; a *checkpoint* copies them into the database, and the
next writer starts the WAL from its beginning again once every page is copied and no
reader still reads an older snapshot from it. SQLite checkpoints by itself (PASSIVE,
after a commit that takes the WAL past 1000 pages, about 4 MiB), but it never makes the
file smaller: a WAL that once grew stays that size until the last connection to the
database closes. And a checkpoint cannot copy past the snapshot of the oldest open read
transaction: while one stays open (a ``BEGIN; SELECT ...`` left open in a ``sqlite3``
shell, a long report, a backup reading the file) every commit since it began stays in
the WAL, which grows with each claim and completion (about 16 KB per claim+complete
cycle) and makes reads slower, however the checkpoints are run.

So a store keeps the WAL under ``limit_bytes`` (``wal_limit_bytes``, default 16 MiB):

* ``PRAGMA journal_size_limit`` on the store's connection: a writer that restarts the
  WAL from its beginning truncates a larger file to ``limit_bytes``
  (https://www.sqlite.org/pragma.html#pragma_journal_size_limit).
* :class:`WalGuard`, one thread per store object, off the claim/complete path: every
  ``interval_s`` (``wal_interval_s``, 1 s) it reads the ``-wal`` file's size
  (``os.stat``, no statement). Above ``limit_bytes`` it checkpoints on a connection of
  its own: PASSIVE first, which copies what readers allow without blocking writers; then,
  only if that copied every page, TRUNCATE, which takes the write lock for the few pages
  committed since and empties the file. Its busy timeout is 0: it never waits for a
  lock, so it never holds up a claim (https://www.sqlite.org/c3ref/wal_checkpoint_v2.html).
* When the WAL is still above ``limit_bytes`` after a checkpoint on two checks in a row,
  and committed pages were left uncopied (a reader holds an old snapshot; a large write
  transaction still open is not that), a WARNING on the ``consensus_lease`` logger names
  the WAL's size and what to do (on stderr when logging is not configured:
  :func:`consensus_lease._visible.log_visible`), at most once per :data:`WARN_EVERY_S`
  while it lasts,
  and an INFO line once it is back under the bound.

Each check reports ``(wal_bytes, blocked)`` to ``report`` (the driver passes it on to the
store's observer: :meth:`consensus_lease.observe.Observer.wal_measured`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from urllib.parse import quote

from ..._visible import log_visible

__all__ = ["DEFAULT_LIMIT_BYTES", "WARN_EVERY_S", "WalGuard", "wal_bytes"]

log = logging.getLogger("consensus_lease")

DEFAULT_LIMIT_BYTES = 16 * 1024 * 1024
"""The default bound of the ``-wal`` file (``wal_limit_bytes``): four times what SQLite's
own checkpoints let it reach (1000 pages of 4 KiB)."""

WARN_EVERY_S = 60.0
"""Seconds between two warnings while checkpoints stay blocked."""

_MB = 1024 * 1024


def wal_bytes(path: str) -> int:
    """The size of ``path``'s ``-wal`` file in bytes (0 if there is none)."""
    try:
        return os.stat(path + "-wal").st_size
    except FileNotFoundError:
        return 0


class WalGuard:
    """The WAL checks of one SQLite store object (see the module docstring).

    Args:
        path: the database file (never ``":memory:"``).
        limit_bytes: the WAL's bound, bytes (int > 0).
        interval_s: seconds between two checks.
        report: called from the guard's thread after each check with the WAL's size in
            bytes and whether checkpoints are blocked; must be fast. Its exceptions are
            logged and ignored.
    """

    def __init__(
        self, path: str, *, limit_bytes: int, interval_s: float,
        report: Callable[[int, bool], None],
    ) -> None:
        self.path = path
        self.limit_bytes = limit_bytes
        self.interval_s = interval_s
        self.checks = 0  # checks so far (for tests and measurements)
        self.checkpoints = 0  # checkpoints run (each a PASSIVE, maybe then a TRUNCATE)
        self._report = report
        self._db: sqlite3.Connection | None = None
        self._over = 0  # checks in a row that left the WAL above the bound
        self._blocked_since: float | None = None
        self._warned_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="consensus-lease-sqlite-wal")

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the thread (it closes its connection); idempotent, does not wait."""
        self._stop.set()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    self.check()
                except Exception:  # the guard must outlive any one failed check
                    log.exception("SQLite WAL check of %s failed", self.path)
        finally:
            if self._db is not None:
                self._db.close()

    def check(self) -> tuple[int, bool]:
        """One check (see the module docstring): the WAL's size after it, in bytes, and
        whether a reader blocks checkpoints (two checks in a row left the WAL above the
        bound with committed pages a checkpoint could not copy)."""
        self.checks += 1
        size = wal_bytes(self.path)
        held_back: bool | None = False
        if size > self.limit_bytes:
            held_back = self._checkpoint()
            size = wal_bytes(self.path)
        if size <= self.limit_bytes or held_back is False:
            self._over = 0  # under the bound, or over it only for a writer's transaction
        elif held_back:
            self._over += 1
        blocked = self._over >= 2
        self._tell(size, blocked)
        try:
            self._report(size, blocked)
        except Exception:
            log.exception("SQLite WAL report of %s failed", self.path)
        return size, blocked

    def _checkpoint(self) -> bool | None:
        """PASSIVE, then TRUNCATE if PASSIVE copied every page; never waits for a lock.
        Whether committed pages were left uncopied, which only a reader's older snapshot
        causes (``None``: not known, e.g. another connection was checkpointing). A WAL
        that stays large with every committed page copied is a write transaction still
        open (a large ``enqueue_many``), not a reader: the TRUNCATE then waits for the
        next check."""
        try:
            db = self._connection()
            self.checkpoints += 1
            _, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if frames < 0 or copied < 0:
                return None
            if copied < frames:
                return True
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return False
        except sqlite3.Error as exc:  # the file went away, ...: the next check retries
            log.debug("SQLite WAL checkpoint of %s failed", self.path,
                      extra={"error": repr(exc)})
            return None

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            # mode=rw: a file deleted meanwhile is not created again; timeout=0: no
            # busy handler, so a checkpoint never waits for (and so never holds up) a lock
            self._db = sqlite3.connect(f"file:{quote(os.path.abspath(self.path))}?mode=rw",
                                       uri=True, timeout=0, isolation_level=None)
        return self._db

    def _tell(self, size: int, blocked: bool) -> None:
        """The warning while blocked (rate-limited), the all-clear after it."""
        now = time.monotonic()
        if not blocked:
            if self._blocked_since is not None and self._warned_at is not None:
                log.info(
                    "SQLite WAL of %s is back under its bound: %.1f MiB (wal_limit_bytes "
                    "%.1f MiB) after checkpoints were blocked for %.0f s", self.path,
                    size / _MB, self.limit_bytes / _MB, now - self._blocked_since,
                    extra={"wal_bytes": size, "path": self.path})
            self._blocked_since = self._warned_at = None
            return
        if self._blocked_since is None:
            self._blocked_since = now
        if self._warned_at is not None and now - self._warned_at < WARN_EVERY_S:
            return
        self._warned_at = now
        log_visible(
            log, logging.WARNING,
            "SQLite WAL of %s is %.1f MiB, above its bound (wal_limit_bytes %.1f MiB), and "
            "checkpoints cannot shrink it: a read transaction open on the file (in any "
            "process: a sqlite3 shell, a report, a backup, a BEGIN without COMMIT) keeps "
            "every commit since it began in the WAL, which grows by about 16 KB per claim "
            "and completion and slows the store down. End that transaction (COMMIT or "
            "ROLLBACK, or stop its process) and keep read transactions on the store short: "
            "the WAL shrinks back at the next check after it ends", self.path, size / _MB,
            self.limit_bytes / _MB, extra={"wal_bytes": size, "path": self.path})
