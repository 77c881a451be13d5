"""The lease record a store keeps per job, as callers see it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["ClaimResult", "EnqueueItem", "JobState", "LeaseRecord", "QueueStats", "QueuedJob"]


class JobState(enum.Enum):
    """Where a job stands in the store."""

    AVAILABLE = "available"
    """Unowned: never claimed, released, or its holder's session expired."""
    HELD = "held"
    """A live session holds it at ``generation``."""
    COMPLETED = "completed"
    """Completed at ``generation``; never claimed again."""
    FAILED = "failed"
    """Dead letter: its attempts ran out (``max_attempts``). Never claimed again until
    ``store.requeue(job_id)``; ``error`` holds the last recorded failure."""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A snapshot of one job's lease record, read from the store.

    Attributes:
        job_id: the job's id, exactly as given to ``claim``.
        owner: the owner label of the current or last holder, or ``None`` if never held
            or released (ZooKeeper: still the last holder after a release, since clearing
            it would bump the job znode's version, which is the generation).
        lease_until: when the holder's lease ends, in seconds since the epoch on the
            *store's* clock (SQLite, PostgreSQL: the database clock), or estimated (etcd:
            this machine's wall clock + the lease's remaining TTL in whole seconds as the
            store reports it; ZooKeeper: ``None``, the ensemble does not expose session
            deadlines). For display only: ownership is decided by the store.
        generation: the fencing token of the current or last claim; 0 if never claimed.
        state: AVAILABLE, HELD, COMPLETED or FAILED.
        result: the completion result (bytes) once COMPLETED, else ``None``.
        attempt: how many times the job was claimed (0: never); the current or last
            holder's attempt number.
        error: the last error recorded by ``lease.fail()`` (or why the job FAILED), else
            ``None``.
        not_before: while a failed attempt's retry delay runs, the time (seconds since
            the epoch; the clock as for ``lease_until``) before which the job is not
            claimable, where the store can express it; else ``None``.
        max_attempts: the job's attempt limit from ``enqueue``, or ``None`` (unlimited).
        value: for an election key, the value the current leader set
            (``Backend.set_value``) while HELD; ``None`` otherwise (never set, or the
            hold ended).
    """

    job_id: str
    owner: str | None
    lease_until: float | None
    generation: int
    state: JobState
    result: bytes | None = None
    attempt: int = 0
    error: str | None = None
    not_before: float | None = None
    max_attempts: int | None = None
    value: bytes | None = None


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """What a backend returns for a successful claim, and hands back to the backend
    with every later operation on that claim.

    Like etcd's ``Mutex`` (key + revision) or redis-py's ``Lock`` (token), the claim is
    carried by its holder, not looked up in a per-session table: the core's
    :class:`~consensus_lease.Lease` stores this object and passes it to the backend's
    ``renew``, ``complete`` and ``release``.

    Attributes:
        generation: the new fencing token, strictly greater than every earlier one for
            this job.
        lease_until: as in :class:`LeaseRecord`.
        attempt: this claim's attempt number (1 for the job's first claim, +1 per claim).
        handle: the backend's opaque per-claim state (etcd: the exact owner-key value
            written and the job's queue as the claim read it; ZooKeeper: the owner znode
            the claim created). ``None`` means "not known to this process": the backend
            then checks ownership by the session alone, which is slower but equally
            safe. Not compared by ``==``.
    """

    generation: int
    lease_until: float | None = None
    attempt: int = 0
    handle: object = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A job of a work queue, as the store has it.

    Attributes:
        queue: the queue's name.
        record: the job's lease record.
        payload: the bytes given to ``enqueue``.
        seq: enqueue order within the store (FIFO key); only the order means anything.
    """

    queue: str
    record: LeaseRecord
    payload: bytes
    seq: int


@dataclass(frozen=True, slots=True)
class EnqueueItem:
    """One job for :meth:`~consensus_lease.LeaseStore.enqueue_many`.

    Attributes:
        job_id: the job (same rules as ``enqueue``).
        payload: bytes, at most ``capabilities.max_payload_bytes``.
        max_attempts: the job's attempt limit (int >= 1); ``None`` takes the queue's
            :class:`~consensus_lease.RetryPolicy`.
    """

    job_id: str
    payload: bytes = b""
    max_attempts: int | None = None


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts of a work queue's jobs by state, as
    ``QueueStats(queue, available, held, completed, oldest_held_lease_until, failed)``
    (the order of the fields, positional and printed).

    Attributes:
        queue: the queue's name.
        available / held / completed / failed: job counts.
        oldest_held_lease_until: the earliest ``lease_until`` among held jobs (seconds
            since the epoch; the clock as for ``LeaseRecord.lease_until``), or ``None``.
    """

    queue: str
    available: int
    held: int
    completed: int
    oldest_held_lease_until: float | None
    failed: int = 0
