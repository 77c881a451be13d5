"""Noticing, from a running process, that a SQLite store went back in time.

A SQLite store has no server whose history could be compared, so the driver keeps three
marks and checks them on every keepalive (and every applied claim):

* the store's **identity**: a random id written into ``cl_meta`` when the file is
  created. A file deleted and created afresh, or another store's file copied in, has a
  different one;
* the **claim count**: ``cl_meta.claims``, +1 in every applied claim's statement (a
  trigger), which itself refuses to claim where the count is below the last one this
  process saw. A copy taken before claims this process saw (or made) has a lower count;
* **this file**: the path's device and inode. A file moved into place (``mv``, most
  copy tools writing a new file then renaming) leaves this process's connection on the
  old, unlinked file, which nobody else sees any more;

and, per session, the row's **expiry floor**: a session row that disappears although
its last known expiry plus the 60 s after which other processes delete expired rows has
not passed yet cannot have been deleted by anyone: the file was restored from before the
session was opened.

Any of these makes the driver raise :class:`~consensus_lease.errors.StoreRegressed` for
every session of the store object (each one's next keepalive, and any claim, ends it),
until the store's epoch is raised above what it was then (``consensus-lease
bump-epoch``): from then on it trusts the file as it is. A file replaced under the
process stays regressed for good: the process must open the store again.

A process that notices writes the **regression marker** into the store (the one-row
table ``cl_regressed``: the store epoch when noticed, and why; made on first use), so
that a process opening the store afterwards refuses to open sessions too
(``open_session`` raises ``StoreRegressed`` while the marker's epoch is at least the
store's): one rule for every store object, until ``bump-epoch`` raises the epoch above
the marker's. A file replaced under the process gets no marker (this process's
connection is on the old file).

What this cannot see: a copy restored in place that has the same identity, at least as
many claims as this process saw, and every session row this process relies on (a copy
taken moments ago, with no claim since); a process started after the restore before
any process noticed (it has seen nothing to compare with). Neither case is safe without
``bump-epoch``: the runbook (README: "Restoring a store") says to stop the workers,
restore, bump, restart.
"""

from __future__ import annotations

import os
from typing import Any

from ...errors import BackendUnavailable, StoreRegressed

__all__ = ["MARKER_CHECK", "MARKER_EXISTS", "MARKER_TABLE", "MARKER_WRITE", "SESSION_GC_S",
           "History", "marker_error"]

MARKER_TABLE = ("CREATE TABLE IF NOT EXISTS cl_regressed (id INTEGER PRIMARY KEY "
                "CHECK (id = 1), epoch INTEGER NOT NULL, why TEXT NOT NULL)")
"""The regression marker's table (made by the first process that notices)."""
MARKER_WRITE = ("INSERT OR REPLACE INTO cl_regressed (id, epoch, why) SELECT 1, epoch, ? "
                "FROM cl_meta WHERE id = 1 AND epoch <= ?")
"""The marker at the store's epoch, unless the epoch was raised since it was noticed."""
MARKER_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'cl_regressed'"
MARKER_CHECK = ("SELECT r.why FROM cl_regressed r JOIN cl_meta m ON m.id = 1 "
                "WHERE r.id = 1 AND r.epoch >= m.epoch")
"""Why the store is regressed now, by its marker (no row: it is not; run only where
:data:`MARKER_EXISTS` found the table)."""

SESSION_GC_S = 60.0
"""Seconds after its expiry after which ``open_session`` deletes a session's row."""


class History:
    """The marks of one open SQLite store (see the module docstring). Not thread-safe:
    the driver calls it with its own lock held, inside its transactions.

    Args:
        path: the database file as given to ``sqlite3.connect`` (``":memory:"``: no file).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._abspath = None if path in ("", ":memory:") else os.path.abspath(path)
        self.identity = ""
        self.claims_seen = 0
        self._file: tuple[int, int] | None = None
        self._floors: dict[str, float] = {}
        self._regressed: tuple[str, int] | None = None  # (why, the store's epoch then)
        self._marked = False  # the marker of this regression is written

    @property
    def regressed(self) -> bool:
        """A regression was seen and no epoch bump since."""
        return self._regressed is not None

    def to_mark(self) -> tuple[str, int] | None:
        """``(why, the store's epoch then)`` of a regression whose marker is not written
        yet (and can be: not a file replaced); the caller writes it, then
        :meth:`marked`."""
        if self._regressed is None or self._marked or self._regressed[1] < 0:
            return None
        return self._regressed

    def marked(self) -> None:
        self._marked = True

    def baseline(self, identity: str, claims: int) -> None:
        """Take the marks of the store as it is now (at open)."""
        self.identity, self.claims_seen = identity, claims
        self._file = self._file_id()

    def note_session(self, session_id: str, expires_at: float) -> None:
        """The session's row was seen with this expiry (store clock, seconds)."""
        self._floors[session_id] = expires_at

    def forget_session(self, session_id: str) -> None:
        """The session was closed or expired: its row may go."""
        self._floors.pop(session_id, None)

    def check(self, row: tuple[Any, ...] | None, session_id: str | None) -> None:
        """Compare the store with the marks.

        Args:
            row: ``(identity, claims, epoch, now, session expires_at)`` read from the
                store in the current transaction (``None``: no ``cl_meta`` row).
            session_id: the session whose row must be there (``None``: none).

        Raises:
            StoreRegressed: the store went back, now or earlier (until a bump).
        """
        if self._regressed is not None:
            self._recover(row)
        why = self._row_changed(row, session_id)
        if why is not None:
            self._regressed = (why, -1 if row is None else int(row[2]))
            raise self._error()
        assert row is not None
        self.claims_seen = int(row[1])

    def claimed(self, identity: str, claims: int, epoch: int) -> None:
        """A claim was applied and raised the claim count to ``claims``.

        Raises:
            StoreRegressed: the store went back (the caller rolls the claim back).
        """
        why = self._row_changed((identity, claims - 1, epoch, 0.0, None), None)
        if why is not None:
            self._regressed = (why, epoch)
            raise self._error()
        self.claims_seen = claims

    def check_file(self) -> None:
        """Raise StoreRegressed if the path no longer names the file this store opened:
        this connection is on a file nobody else sees (whatever it writes is lost).
        Called before each session-level transaction (a stat, no I/O on the database).

        Raises:
            StoreRegressed: the file was replaced or deleted (for good: open it again).
            BackendUnavailable: the file's status cannot be read.
        """
        why = self._file_changed()
        if why is not None:
            self._regressed = (why, -1)
            raise self._error()

    # -- helpers ------------------------------------------------------------------------

    def _recover(self, row: tuple[Any, ...] | None) -> None:
        """Trust the store again if its epoch was raised since the regression; else raise."""
        assert self._regressed is not None
        if row is None or self._file_changed() is not None or int(row[2]) <= self._regressed[1]:
            raise self._error()
        self._regressed = None
        self._marked = False
        self._floors.clear()
        self.identity, self.claims_seen = str(row[0]), int(row[1])

    def _row_changed(self, row: tuple[Any, ...] | None, session_id: str | None) -> str | None:
        """Why ``row`` (see :meth:`check`) shows a store that went back, or ``None``."""
        if row is None or row[0] != self.identity:
            return ("its identity changed: the file was deleted and created again, or "
                    "another store's file was copied in")
        if int(row[1]) < self.claims_seen:
            return (f"its claim count went back from {self.claims_seen} to {row[1]}: it "
                    "was restored from an older copy")
        floor = None if session_id is None else self._floors.get(session_id)
        if row[4] is not None or floor is None or float(row[3]) > floor + SESSION_GC_S:
            return None
        return (f"session {session_id}'s row is gone although it cannot have expired "
                f"{SESSION_GC_S:g} s ago: the file was restored from a copy older than "
                "the session")

    def _file_changed(self) -> str | None:
        if self._abspath is None or self._file is None:
            return None
        now = self._file_id()
        if now == self._file:
            return None
        what = "deleted" if now is None else "replaced by another file"
        return (f"the file {self._abspath!r} was {what} while this process had it open; "
                "open the store again (restart the worker) after bump-epoch")

    def _file_id(self) -> tuple[int, int] | None:
        """The path's (device, inode), or ``None`` if it does not exist."""
        if self._abspath is None:
            return None
        try:
            status = os.stat(self._abspath)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise BackendUnavailable(f"cannot stat SQLite database {self.path!r}: {exc}") \
                from exc
        return status.st_dev, status.st_ino

    def _error(self) -> StoreRegressed:
        return marker_error(self.path, "" if self._regressed is None else self._regressed[0])


def marker_error(path: str, why: str) -> StoreRegressed:
    """The error of a store that went back, ``why`` said."""
    return StoreRegressed(
        f"SQLite store {path!r} went back: {why}. Every session of it is over: "
        "stop the workers, run `consensus-lease bump-epoch --backend URL --above "
        "HIGHEST` (the highest token any destination accepted), then start them "
        "(README: Restoring a store)"
    )
