"""Test kit for consensus_lease and for services built on it.

* :mod:`consensus_lease.testing.conformance` — ``BackendConformance``, the suite every
  backend passes; subclass it to test your own backend (needs pytest).
* :mod:`consensus_lease.testing.workers` — workers as OS processes you can pause, resume,
  kill or cut off the network.
* :mod:`consensus_lease.testing.cluster` and the pytest plugin
  (:mod:`consensus_lease.testing.pytest_plugin`, loaded automatically when the package is
  installed) — real 3-member etcd and ZooKeeper clusters in containers, with faults.

This package does not import pytest or Docker clients until you use the parts needing them.
"""

from .workers import WorkerError, WorkerProcess

__all__ = ["WorkerError", "WorkerProcess"]
