"""Worker sessions of the PostgreSQL store: a row of ``cl_sessions`` each, on the server's
clock (what a session is in the protocol: the package docstring,
:mod:`consensus_lease.backends.postgresql`). Opening, keeping alive, ending; the server's
clock.
"""

from __future__ import annotations

import uuid
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from ...backend import SessionHandle
from ...errors import BackendUnavailable
from . import _tokens
from ._layout import NOW

if TYPE_CHECKING:
    import psycopg

    from .driver import PostgresBackend

__all__ = ["close_session", "expire_session", "keepalive", "open_session", "store_time"]


def open_session(b: PostgresBackend, owner: str, ttl_s: float) -> SessionHandle:
    """Delete the rows of sessions expired for a minute, then insert the session's row:
    two statements on one connection, two round trips. Only on the server ``cl_meta``
    names (else ``StoreRegressed``). A lost answer is ``BackendUnavailable`` (a row made
    then expires by its TTL)."""
    session_id = uuid.uuid4().hex

    def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
        c.execute(b.sql.gc_sessions)
        return c.execute(b.sql.open_session, (session_id, owner, ttl_s, ttl_s)).fetchone()

    def settle() -> tuple[Any, ...] | None:
        raise BackendUnavailable(f"PostgreSQL {b.where}: opening a session got no "
                                 "answer (a session made then expires by its TTL)")

    if b.client.write(None, run, settle) is None:  # not on cl_meta's server
        raise _tokens.expired(b, session_id)
    return SessionHandle(session_id, owner, ttl_s)


def keepalive(b: PostgresBackend, session: SessionHandle) -> float:
    """One ``UPDATE`` of the session's row (one round trip; once more on another
    connection if the first broke), however many jobs it holds; the TTL granted."""
    sid = session.session_id
    row = b.client.one_pooled(b.sql.keepalive, (sid,))
    if row is None:
        raise _tokens.expired(b, sid)
    return float(row[0])


def close_session(b: PostgresBackend, session: SessionHandle) -> None:
    """Delete the session's row (best effort: an unreachable store lets the TTL end it)."""
    n = b.names

    # Deleting the session row frees every job it held (a job whose session row is
    # gone is free: the claim's check): no job row is written, none looked for.
    def run(c: psycopg.Connection[tuple[Any, ...]]) -> None:
        c.execute(f"WITH d AS (DELETE FROM {n.sessions} WHERE session_id = %s "
                  "RETURNING 1) SELECT pg_notify(%s, '')", (session.session_id, n.channel))

    with suppress(BackendUnavailable):  # best effort: the TTL ends it
        b.client.write(None, run, lambda: None)
    b.wake_subscribers()


def expire_session(b: PostgresBackend, session_id: str) -> None:
    """Test hook: make the store expire a session now, as its TTL running out would."""
    b.client.write(None, lambda c: c.execute(
        f"WITH u AS (UPDATE {b.names.sessions} SET expires_at = {NOW} - 0.001 "
        "WHERE session_id = %s RETURNING 1) SELECT pg_notify(%s, '')",
        (session_id, b.names.channel)))
    b.wake_subscribers()


def store_time(b: PostgresBackend) -> float | None:
    """The server's clock now, seconds since the epoch (the clock sessions expire by)."""
    row = b.client.one(f"SELECT {NOW}", None)
    assert row is not None
    return float(row[0])
