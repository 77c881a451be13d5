"""consensus_lease: expiring job leases with fencing tokens on etcd, ZooKeeper and SQLite.

::

    from consensus_lease import open_store

    with open_store("sqlite:///var/lib/jobs.db") as store, store.session(ttl_s=10) as session:
        with session.claim("invoice-42", wait_s=30) as lease:
            lease.ensure_held()                         # before every effect
            destination.write(..., token=lease.generation)
            lease.complete(b"done")

A lease is temporary ownership, not exactly-once: destinations must fence effects with
the generation (see :mod:`consensus_lease.fencing`).
"""

from .backend import Backend, Capabilities, SessionEvent, SessionHandle
from .clock import Clock, FakeClock, SkewedClock, SystemClock
from .errors import (
    AuthenticationFailed,
    BackendUnavailable,
    ClaimTimeout,
    FenceRejected,
    InvalidArgument,
    JobCompleted,
    LeaseError,
    LeaseLost,
    LeaseNotHeld,
    LeaseSuspended,
    OutcomeUnknown,
    SessionExpired,
    StaleLeaseError,
    StoreClosed,
    UnsupportedBackend,
    UnsupportedOperation,
)
from .lease import Lease
from .record import ClaimResult, JobState, LeaseRecord, QueuedJob, QueueStats
from .session import Session
from .states import LeaseState, SessionState
from .store import DEFAULT_TTL_S, LeaseStore, open_store

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TTL_S",
    "AuthenticationFailed",
    "Backend",
    "BackendUnavailable",
    "Capabilities",
    "ClaimResult",
    "ClaimTimeout",
    "Clock",
    "FakeClock",
    "FenceRejected",
    "InvalidArgument",
    "JobCompleted",
    "JobState",
    "Lease",
    "LeaseError",
    "LeaseLost",
    "LeaseNotHeld",
    "LeaseRecord",
    "LeaseState",
    "LeaseStore",
    "LeaseSuspended",
    "OutcomeUnknown",
    "QueueStats",
    "QueuedJob",
    "Session",
    "SessionEvent",
    "SessionExpired",
    "SessionHandle",
    "SessionState",
    "SkewedClock",
    "StaleLeaseError",
    "StoreClosed",
    "SystemClock",
    "UnsupportedBackend",
    "UnsupportedOperation",
    "open_store",
]

import logging as _logging

_logging.getLogger("consensus_lease").addHandler(_logging.NullHandler())
