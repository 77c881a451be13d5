"""consensus_lease: expiring job leases with fencing tokens on etcd, ZooKeeper, PostgreSQL
and SQLite.

::

    from consensus_lease import SqliteFence, open_store

    fence = SqliteFence("/var/lib/effects.db")
    with open_store("sqlite:////var/lib/jobs.db") as store, store.session(ttl_s=10) as session:
        with session.claim("invoice-42", wait_s=30) as lease:
            lease.ensure_held()                         # before every effect
            fence.apply("invoice-42", lease.generation, "charge")
            lease.complete(b"done")

(``sqlite:////abs/path.db`` is an absolute path, ``sqlite:///rel.db`` a relative one.)

A lease is temporary ownership, not exactly-once: destinations must fence effects with
the generation (see :mod:`consensus_lease.fencing`).

Leader election is a lease on a name that is never completed: ``session.campaign(name)``
returns a :class:`Leadership` whose generation is the fencing token; ``store.leader(name)``
and ``store.watch_leader(name)`` read and follow it (see :mod:`consensus_lease.election`).

This namespace is the user API: the store, sessions, leases, leaderships, records, states, every
error, clocks, the :class:`Observer` base and the fences. ``SqlFence`` and
``FenceRetryable`` need SQLAlchemy (``pip install consensus_lease[sql]``) and are
imported on first use. The driver interface for writing a backend is in
:mod:`consensus_lease.backend`; test doubles (``FakeClock``, ``SkewedClock``, worker
processes, the conformance suite) are in :mod:`consensus_lease.testing`.
"""

import logging as _logging
from importlib.util import find_spec as _find_spec
from typing import TYPE_CHECKING

from .clock import Clock, SystemClock
from .election import LeaderRecord, Leadership
from .errors import (
    AuthenticationFailed,
    BackendUnavailable,
    ClaimTimeout,
    FenceRejected,
    InvalidArgument,
    JobCompleted,
    JobFailed,
    LeaseError,
    LeaseLost,
    LeaseNotHeld,
    LeaseSuspended,
    OutcomeUnknown,
    QueueFull,
    SessionExpired,
    StaleLeaseError,
    StoreClosed,
    StoreInherited,
    StoreRegressed,
    TokenSpaceExhausted,
    UnsupportedBackend,
    UnsupportedOperation,
)
from .fencing import Effect, Fence, FenceOutcome, SqliteFence
from .leader_watch import LeaderWatch
from .lease import Lease
from .observe import Observer
from .record import EnqueueItem, JobState, LeaseRecord, QueuedJob, QueueStats
from .retry import RetryPolicy
from .session import Session
from .states import LeaseState, SessionState
from .store import DEFAULT_TTL_S, LeaseStore, open_store
from .transaction import LeaseTransaction

if TYPE_CHECKING:
    from .fencing_sql import FenceRetryable, SqlFence

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TTL_S",
    "AuthenticationFailed",
    "BackendUnavailable",
    "ClaimTimeout",
    "Clock",
    "Effect",
    "EnqueueItem",
    "Fence",
    "FenceOutcome",
    "FenceRejected",
    "FenceRetryable",
    "InvalidArgument",
    "JobCompleted",
    "JobFailed",
    "JobState",
    "LeaderRecord",
    "LeaderWatch",
    "Leadership",
    "Lease",
    "LeaseError",
    "LeaseLost",
    "LeaseNotHeld",
    "LeaseRecord",
    "LeaseState",
    "LeaseStore",
    "LeaseSuspended",
    "LeaseTransaction",
    "Observer",
    "OutcomeUnknown",
    "QueueFull",
    "QueueStats",
    "QueuedJob",
    "RetryPolicy",
    "Session",
    "SessionExpired",
    "SessionState",
    "SqlFence",
    "SqliteFence",
    "StaleLeaseError",
    "StoreClosed",
    "StoreInherited",
    "StoreRegressed",
    "SystemClock",
    "TokenSpaceExhausted",
    "UnsupportedBackend",
    "UnsupportedOperation",
    "open_store",
]

_SQL_NAMES = ("FenceRetryable", "SqlFence")
"""Exported from :mod:`consensus_lease.fencing_sql` on first access (needs SQLAlchemy)."""

# Hidden from mypy, which sees the imports under TYPE_CHECKING above: it would apply the
# removals unconditionally, and a module __getattr__ would make it accept any name.
if not TYPE_CHECKING:
    if _find_spec("sqlalchemy") is None:
        # Listed only where importable, so ``from consensus_lease import *`` works without
        # the extra; naming them still raises the ImportError below, which says what to do.
        __all__.remove("FenceRetryable")
        __all__.remove("SqlFence")

    def __getattr__(name: str) -> object:
        if name not in _SQL_NAMES:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        try:
            from . import fencing_sql
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.partition(".")[0] != "sqlalchemy":
                raise
            raise ImportError(
                f"consensus_lease.{name} needs SQLAlchemy, an optional extra: "
                "pip install consensus_lease[sql]"
            ) from exc
        value = getattr(fencing_sql, name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))


_logging.getLogger("consensus_lease").addHandler(_logging.NullHandler())
