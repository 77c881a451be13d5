"""Worker sessions of the SQLite driver: a row of ``cl_sessions`` whose ``expires_at`` is
on the database's clock (the package docstring, :mod:`consensus_lease.backends.sqlite`,
tells the protocol). Opening and keeping one alive first checks that the store did not
go back (:mod:`._tokens`).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from ...backend import SessionHandle
from ...errors import SessionExpired
from . import _tokens
from ._layout import NOW
from ._tokens_history import MARKER_CHECK, MARKER_EXISTS, SESSION_GC_S, marker_error

if TYPE_CHECKING:
    from .driver import SqliteBackend


def open_session(backend: SqliteBackend, owner: str, ttl_s: float) -> SessionHandle:
    """A new session row, in one ``BEGIN IMMEDIATE`` transaction that first checks the
    store's history and its regression marker, and drops the rows of sessions expired
    more than :data:`~._tokens_history.SESSION_GC_S` ago.

    Raises:
        StoreRegressed: the store went back (noticed here, or marked by another process).
        BackendUnavailable.
    """
    session_id = uuid.uuid4().hex
    with backend._transport.transaction(check_file=True) as db:
        _tokens.check_history(backend, db, None)
        exists = db.execute(MARKER_EXISTS).fetchone() is not None
        marker = db.execute(MARKER_CHECK).fetchone() if exists else None
        if marker is not None:  # another process noticed; no bump since
            raise marker_error(backend.path, str(marker[0]))
        # Sessions expired a minute ago hold nothing any more: drop their rows.
        db.execute(f"DELETE FROM cl_sessions WHERE expires_at < {NOW} - {SESSION_GC_S}")
        expires_at = db.execute(
            f"INSERT INTO cl_sessions VALUES (?, ?, ?, {NOW} + ?) RETURNING expires_at",
            (session_id, owner, ttl_s, ttl_s),
        ).fetchone()[0]
        backend._history.note_session(session_id, float(expires_at))
    return SessionHandle(session_id, owner, ttl_s)


def keepalive(backend: SqliteBackend, session: SessionHandle) -> float:
    """Extend the session (see :meth:`Backend.keepalive`): one ``BEGIN IMMEDIATE``
    transaction, the history check's read (:mod:`._tokens_history`) and one ``UPDATE``
    of the session's row, however many jobs it holds.

    Raises:
        StoreRegressed: the file was restored from an older copy, replaced or wiped.
        SessionExpired / BackendUnavailable.
    """
    sid = session.session_id
    with backend._transport.transaction(check_file=True) as db:
        _tokens.check_history(backend, db, sid)
        row = db.execute(
            f"UPDATE cl_sessions SET expires_at = {NOW} + ttl_s "
            f"WHERE session_id = ? AND expires_at > {NOW} RETURNING ttl_s, expires_at",
            (sid,),
        ).fetchone()
        if row is None:
            backend._history.forget_session(sid)
        else:
            backend._history.note_session(sid, float(row[1]))
    if row is None:
        raise SessionExpired(f"session {sid} expired in the store")
    return float(row[0])


def close_session(backend: SqliteBackend, session: SessionHandle) -> None:
    """Delete the session's row and free its queue jobs, in one ``BEGIN IMMEDIATE``
    transaction."""
    with backend._transport.lock:
        backend._history.forget_session(session.session_id)
    with backend._transport.transaction() as db:
        db.execute("DELETE FROM cl_sessions WHERE session_id = ?", (session.session_id,))
        # Its other jobs (and election keys) keep the id of a session that is no more,
        # as an expired session's do: no index to find them by (PARTIAL_INDEXES).
        db.execute(
            "UPDATE cl_jobs SET session_id = NULL, value = NULL WHERE session_id = ? "
            "AND queue IS NOT NULL", (session.session_id,),
        )
    backend.wake_subscribers()


def expire_session(backend: SqliteBackend, session_id: str) -> None:
    """Test hook: make the store expire a session now, as its TTL running out would."""
    with backend._transport.transaction() as db:
        db.execute(
            f"UPDATE cl_sessions SET expires_at = {NOW} - 0.001 WHERE session_id = ?",
            (session_id,),
        )
    backend.wake_subscribers()


def store_time(backend: SqliteBackend) -> float:
    """The database clock now, seconds since the epoch (one statement)."""
    return float(backend._transport.read(f"SELECT {NOW}")[0][0])
