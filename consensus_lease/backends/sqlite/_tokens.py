"""Fencing tokens of the SQLite driver: the store epoch (``cl_meta.epoch``) and
``bump_epoch``, the check that the file did not go back (its marks are kept by
:mod:`._tokens_history`), and the regression marker a process that noticed writes. How
tokens are made: the package docstring (:mod:`consensus_lease.backends.sqlite`).
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from ..._epoch import next_epoch
from ._layout import META_INSERT, NOW
from ._tokens_history import MARKER_TABLE, MARKER_WRITE

if TYPE_CHECKING:
    import sqlite3

    from .driver import SqliteBackend

log = logging.getLogger("consensus_lease.sqlite")

HISTORY_ROW = (
    f"SELECT identity, claims, epoch, {NOW}, "
    "(SELECT expires_at FROM cl_sessions WHERE session_id = ?) FROM cl_meta WHERE id = 1"
)
"""What the regression check compares (see :meth:`._tokens_history.History.check`)."""


def check_history(
    backend: SqliteBackend, db: sqlite3.Connection, session_id: str | None
) -> None:
    """In the caller's transaction: StoreRegressed if the store went back (and was not
    bumped since), ``session_id``'s row (if given) included."""
    backend._history.check(db.execute(HISTORY_ROW, (session_id,)).fetchone(), session_id)


def note_claims(backend: SqliteBackend, db: sqlite3.Connection) -> None:
    """After claims in this transaction (each raised ``cl_meta.claims`` by trigger):
    note the count; StoreRegressed if the store went back (rolls the claims back)."""
    meta = db.execute("SELECT identity, claims, epoch FROM cl_meta WHERE id = 1").fetchone()
    if meta is None:
        backend._history.check(None, None)
    else:
        backend._history.claimed(str(meta[0]), int(meta[1]), int(meta[2]))


def mark_regressed(backend: SqliteBackend) -> None:
    """Write the regression marker (the turn held, outside a transaction) if this
    process noticed a regression and has not written it (:mod:`._tokens_history`).
    Best effort: the refusal here does not depend on it."""
    noticed = backend._history.to_mark()
    if noticed is None:
        return
    why, epoch = noticed
    failure = backend._transport.best_effort((MARKER_TABLE, ()), (MARKER_WRITE, (why, epoch)))
    if failure is not None:
        log.warning("SQLite store %r: writing the regression marker failed (%s); "
                    "processes opened later may not refuse sessions", backend.path, failure)
        return
    backend._history.marked()


def epoch(backend: SqliteBackend) -> int:
    """The store epoch, one statement."""
    rows = backend._transport.read("SELECT epoch FROM cl_meta WHERE id = 1")
    return int(rows[0][0]) if rows else 0


def bump_epoch(backend: SqliteBackend, above: int | None = None) -> int:
    """Raise ``cl_meta.epoch`` in one ``BEGIN IMMEDIATE`` transaction (see
    :meth:`Backend.bump_epoch`); sessions of this store object that saw the store go
    back are trusted again afterwards (new ones may be opened).

    Raises:
        InvalidArgument: bad ``above``, or the epoch would leave the int64 range;
            nothing changed.
        StoreRegressed: the path now names another file than the one this object
            opened: open the store again and bump through it.
        BackendUnavailable.
    """
    with backend._transport.transaction(check_file=True) as db:
        row = db.execute("SELECT epoch FROM cl_meta WHERE id = 1").fetchone()
        new = next_epoch(0 if row is None else int(row[0]), above, backend.epoch_shift)
        if row is None:
            db.execute(META_INSERT, (uuid.uuid4().hex,))
        db.execute("UPDATE cl_meta SET epoch = ? WHERE id = 1", (new,))
    return new
