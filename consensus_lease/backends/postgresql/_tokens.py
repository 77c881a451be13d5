"""Fencing tokens, the store epoch, and noticing that the store's history went back, on
PostgreSQL (the protocol, and what the operator does after a failover or a restore: the
package docstring, :mod:`consensus_lease.backends.postgresql`).

A token is ``epoch * 2**32 + generation`` (:func:`consensus_lease._epoch.compose`), the
epoch read by the claim statement itself (:mod:`._layout_sql`). Here: the epoch's read
and ``bump_epoch``; :func:`regression`, why the server answering is not the one the
store's history is on; :func:`expired`, the refusal after it (``StoreRegressed``) or a
plain ``SessionExpired``; :func:`mark_other_cluster`, at open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._epoch import next_epoch
from ...errors import SessionExpired, StoreRegressed
from ._layout import SYSTEM_ID, TIMELINE, Names

if TYPE_CHECKING:
    import psycopg

    from .driver import PostgresBackend

__all__ = ["bump_epoch", "epoch", "expired", "mark_other_cluster", "regression"]


def epoch(b: PostgresBackend) -> int:
    """``cl_meta.epoch`` (0 without a row)."""
    row = b.client.one(f"SELECT epoch FROM {b.names.meta} WHERE id = 1")
    return 0 if row is None else int(row[0])


def bump_epoch(b: PostgresBackend, above: int | None = None) -> int:
    """Raise ``cl_meta.epoch`` in one transaction that locks the row (see
    :meth:`Backend.bump_epoch`), and record the server answering as the store's (system
    identifier, timeline: the failover check, package docstring). If that server is
    another than the one recorded (a failover or restore since), every session row is
    deleted in the same transaction: the sessions of the history before it are over
    (their jobs free at once), whatever their expiry says; else the session rows of
    another timeline are (none can be alive here).

    Raises:
        InvalidArgument: bad ``above`` or the int64 range; nothing changed.
        BackendUnavailable / OutcomeUnknown (the answer was lost: read ``epoch()``).
    """
    meta, sessions = b.names.meta, b.names.sessions

    def run(c: psycopg.Connection[tuple[Any, ...]]) -> int:
        with c.transaction():
            row = c.execute(
                f"SELECT epoch, system_id = {SYSTEM_ID} AND timeline = {TIMELINE} "
                f"FROM {meta} WHERE id = 1 FOR UPDATE").fetchone()
            new = next_epoch(0 if row is None else int(row[0]), above, b.epoch_shift)
            c.execute(f"UPDATE {meta} SET epoch = %s, system_id = {SYSTEM_ID}, "
                      f"timeline = {TIMELINE} WHERE id = 1", (new,))
            c.execute(f"DELETE FROM {sessions}" + (
                f" WHERE timeline IS DISTINCT FROM {TIMELINE}"
                if row is not None and row[1] else ""))
        return new

    return int(b.client.write(None, run))


def regression(
    system_id: str | None, timeline: str | None, server_system_id: str, server_timeline: str,
    epoch: int, session_timeline: str | None = None,
) -> str | None:
    """Why the server answering is not the one the store's history is on (``cl_meta``'s
    ``system_id`` and ``timeline`` against the server's), or the session (its row's
    ``timeline``; ``None`` without a row) was opened on another timeline: a sentence, or
    ``None`` when neither."""
    if system_id != server_system_id:
        return (f"the server is another PostgreSQL cluster (system identifier "
                f"{server_system_id}) than the one the store was on ({system_id}) at epoch "
                f"{epoch}: restored into another cluster")
    if timeline != server_timeline:
        return (f"the server is on WAL timeline {int(server_timeline, 16)}, the store's "
                f"history on timeline {int(timeline or '0', 16)} (epoch {epoch}): a standby "
                "was promoted (a failover or a planned switchover) or a backup restored")
    if session_timeline != server_timeline and session_timeline is not None:
        return (f"the session was opened on WAL timeline {int(session_timeline, 16)}, the "
                f"server is on timeline {int(server_timeline, 16)}")
    return None


def expired(b: PostgresBackend, session_id: str, job_id: str | None = None,
            generation: int | None = None) -> SessionExpired:
    """Why a statement found the session not alive, read after it: ``StoreRegressed`` if
    the server is not the one ``cl_meta`` names (another timeline: a standby promoted, a
    backup restored; another system identifier: another cluster) or the session was
    opened on another timeline than the server's; else ``SessionExpired``. One read, only
    on this path (never on a statement that applied)."""
    row = b.client.one(b.sql.identity, (session_id,), job_id)
    why = None if row is None else regression(*row)
    if why is None:
        return SessionExpired(f"session {session_id} expired in the store",
                              job_id=job_id, generation=generation)
    return StoreRegressed(
        f"PostgreSQL {b.where}: {why}. The store's history may have gone back (an "
        "asynchronous standby loses what it had not received): every session of it is "
        "over. Stop the workers, run `consensus-lease bump-epoch --backend URL --above "
        "HIGHEST` (the highest token any destination accepted), then start them (docs: "
        "PostgreSQL store, Failover)", job_id=job_id, generation=generation,
    )


def mark_other_cluster(names: Names, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    """At open: if the server is another cluster than the one ``cl_meta`` names (a
    logical dump restored into another cluster, whose timeline may be the same number),
    end every session row (its timeline set to NULL, which no server has): their next
    keepalive or claim, in any process, reports ``StoreRegressed``, as ``open_session``
    does by itself, until ``bump-epoch``."""
    row = conn.execute(
        f"SELECT system_id, {SYSTEM_ID} FROM {names.meta} WHERE id = 1").fetchone()
    if row is not None and row[0] is not None and row[0] != row[1]:
        conn.execute(
            f"UPDATE {names.sessions} SET timeline = NULL WHERE timeline IS NOT NULL")
