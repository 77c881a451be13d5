"""The states a session and a lease can be in, and what a worker may assume in each.

One model for every backend. How each store's signals map onto it:

* HELD — etcd: keepalive answered within the TTL. ZooKeeper: CONNECTED, session alive.
  SQLite / memory: session row renewed.
* SUSPENDED — ZooKeeper only: SUSPENDED (connection lost, session may still be alive).
  etcd has no such signal: an unanswered keepalive is only a risk until the local deadline.
* LOST — etcd: keepalive TTL <= 0, key gone, or the local deadline passed. ZooKeeper: LOST
  (session expired) or the local deadline passed. SQLite / memory: the session row expired,
  or the local deadline passed.

The local deadline is ``send time of the last successful renewal + granted TTL - safety
margin`` on the worker's monotonic clock. Because the store started its own TTL no earlier
than it received that renewal, a worker that stops at its deadline stops before the store
can hand the job to anyone else (given clock *rates* that differ by less than the margin).
"""

from __future__ import annotations

import enum

__all__ = ["LeaseState", "SessionState"]


class SessionState(enum.Enum):
    """A worker session's state."""

    ACTIVE = "active"
    """The store confirmed the session within its TTL and the local deadline has not
    passed. Leases of the session may be used (each still checks its own state)."""

    SUSPENDED = "suspended"
    """The connection to the store is lost but the session may still be alive. Do not
    assume any lease is valid: ``ensure_held()`` raises ``LeaseSuspended``. The session
    becomes ACTIVE again only after the store re-confirmed every lease, or LOST when the
    local deadline passes or the store reports expiry."""

    LOST = "lost"
    """Final. The session expired in the store or could not be renewed before its local
    deadline. Every lease of the session is LOST; open a new session to work again."""

    CLOSED = "closed"
    """Final. Closed by the worker; its held jobs were handed back to the store."""


class LeaseState(enum.Enum):
    """One claimed job's lease, as the worker holding it sees it."""

    HELD = "held"
    """Claimed and, as far as the worker can prove, still held: effects may be produced
    with the lease's generation as fencing token until ``deadline``."""

    SUSPENDED = "suspended"
    """The session is SUSPENDED: pause effects; the lease may come back."""

    LOST = "lost"
    """Final: expired, reassigned, rejected by the store, or past the local deadline.
    Produce no more effects; late ones must be stopped by the destination's fence."""

    FAILED = "failed"
    """Final: this worker gave the job up with ``fail()``; the store recorded the error
    and decides when (or whether) the job runs again."""

    RELEASED = "released"
    """Final: handed back by this worker; the job is claimable again."""

    COMPLETED = "completed"
    """Final: the store recorded the completion at this generation."""
