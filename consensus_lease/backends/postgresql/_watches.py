"""Waiting on the PostgreSQL store: ``LISTEN/NOTIFY`` and the poll (which statements
notify, and why a completion does not: the package docstring,
:mod:`consensus_lease.backends.postgresql`). Here: the one listener connection per
process (:class:`~._transport.Listener`), started on the first subscription; the
subscriptions; :func:`claimable_hint`, the poller's read (two with election keys); and
closing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from ..._election import is_election_key
from ..._subscriptions import Unsubscribe, WakeCallback
from ...backend import Backend
from ...errors import InvalidArgument
from ._layout import NOW
from ._transport import Listener

if TYPE_CHECKING:
    from .driver import PostgresBackend

__all__ = ["check_listen_target", "claimable_hint", "close", "subscribe_job",
           "subscribe_queue", "wait_for_change", "wait_for_queue"]


def _wait(subscribe: Callable[[WakeCallback], Unsubscribe], timeout_s: float) -> None:
    woken = threading.Event()
    unsubscribe = subscribe(woken.set)
    try:
        woken.wait(max(0.0, timeout_s))
    finally:
        unsubscribe()


def wait_for_change(b: PostgresBackend, job_id: str, timeout_s: float) -> None:
    _wait(lambda wake: b.subscribe_job(job_id, wake), timeout_s)


def wait_for_queue(b: PostgresBackend, queue: str, timeout_s: float) -> None:
    _wait(lambda wake: b.subscribe_queue(queue, wake), timeout_s)


def check_listen_target(b: PostgresBackend) -> None:
    """At open: refuse a ``listen_url`` that does not reach this store's database (its
    notifications would never come), with the connection's own error if it cannot
    connect.

    Raises:
        InvalidArgument / AuthenticationFailed / BackendUnavailable.
    """
    row = b.client.listener_one(f"SELECT identity FROM {b.names.meta} WHERE id = 1")
    if row is None or row[0] != b.identity:
        raise InvalidArgument(
            f"PostgreSQL option listen_url does not reach the database of "
            f"{b.where} (no store with its identity in schema "
            f"{b.names.schema!r} there): it must be a direct connection to the "
            "same database"
        )


def _ensure_listener(b: PostgresBackend) -> None:
    """Start the LISTEN connection on first use; wait (bounded) until it listens so
    that a change right after the caller subscribed is not missed (if it cannot, the
    poll interval covers it)."""
    if b._listener is not None or b._closed or not b.listens:
        return
    with b._listener_lock:
        if b._listener is None and not b._closed:
            b._listener = Listener(b.client, b.names.listen, b.wake_subscribers)
    b._listener.wait_ready(b.client.connect_timeout_s)


def subscribe_job(b: PostgresBackend, job_id: str, callback: WakeCallback) -> Unsubscribe:
    _ensure_listener(b)
    return Backend.subscribe_job(b, job_id, callback)


def subscribe_queue(b: PostgresBackend, queue: str, callback: WakeCallback) -> Unsubscribe:
    _ensure_listener(b)
    return Backend.subscribe_queue(b, queue, callback)


def claimable_hint(
    b: PostgresBackend, job_ids: Sequence[str], queues: Sequence[str]
) -> tuple[Collection[str], Collection[str]] | None:
    """One read for every waiting claim of this process (two with election keys):
    the subscribed jobs not held by a live session nor in a retry delay (completed and
    FAILED ones included), the election keys whose holder, liveness or value changed
    since the last poll, and the queues with a claimable job. Server clock."""
    n = b.names
    rows = b.client.read(
        f"SELECT 'j', j.job_id FROM {n.jobs} j WHERE j.job_id = ANY(%(ids)s) "
        "AND j.completed_at IS NULL AND j.failed_at IS NULL "
        f"AND ((j.not_before IS NOT NULL AND j.not_before > {NOW}) OR {b.sql.alive_j}) "
        f"UNION ALL SELECT 'q', q FROM unnest(%(queues)s::text[]) q WHERE EXISTS "
        f"(SELECT 1 FROM {n.jobs} j WHERE j.queue = q AND j.closed IS NULL "
        "AND j.completed_at IS NULL "
        f"AND j.failed_at IS NULL AND (j.not_before IS NULL OR j.not_before <= {NOW}) "
        f"AND NOT {b.sql.alive_j})",
        {"ids": list(job_ids), "queues": list(queues)},
    )
    blocked = {r[1] for r in rows if r[0] == "j"}
    ready = [r[1] for r in rows if r[0] == "q"]
    keys = [j for j in job_ids if is_election_key(j)]
    states: dict[str, tuple[Any, ...] | None] = dict.fromkeys(keys)
    if keys:
        for row in b.client.read(
            f"SELECT j.job_id, j.epoch, j.generation, j.session_id, j.value, "
            f"{b.sql.alive_j} FROM {n.jobs} j WHERE j.job_id = ANY(%s)", (keys,),
        ):
            states[row[0]] = tuple(row[1:])
    changed = b._elections.changed(states)
    return [j for j in job_ids if j in changed
            or (j not in states and j not in blocked)], ready


def close(b: PostgresBackend) -> None:
    """End the listener, the subscriptions, then the pool."""
    b._closed = True
    with b._listener_lock:
        listener, b._listener = b._listener, None
    if listener is not None:
        listener.close()
    b.close_subscriptions()
    b.client.close()
