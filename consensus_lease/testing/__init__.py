"""Test kit for consensus_lease and for services built on it.

* :class:`FakeClock` (time moves only when you :meth:`~FakeClock.advance` it) and
  :class:`SkewedClock` (the system clock off by a fixed offset) — clocks to inject with
  ``open_store(url, clock=...)`` or ``store.session(..., clock=...)``; defined in
  :mod:`consensus_lease.clock`.
* :mod:`consensus_lease.testing.conformance` — ``BackendConformance``, the suite every
  backend passes; subclass it to test your own backend (needs pytest).
* :mod:`consensus_lease.testing.workers` — workers as OS processes you can pause, resume,
  kill or cut off the network.
* :mod:`consensus_lease.testing.postgresql` — the test PostgreSQL server's URL (skip
  without one, fail under ``CI=true``) and a fresh schema per store.
* :mod:`consensus_lease.testing.cluster` and the pytest plugin
  (:mod:`consensus_lease.testing.pytest_plugin`, loaded automatically when the package is
  installed) — real 3-member etcd and ZooKeeper clusters in containers, with faults.

This package does not import pytest or Docker clients until you use the parts needing them.
"""

from ..clock import FakeClock, SkewedClock
from .workers import WorkerError, WorkerProcess

__all__ = ["FakeClock", "SkewedClock", "WorkerError", "WorkerProcess"]
