"""The conformance suite on the in-process reference backend."""

from __future__ import annotations

from consensus_lease import LeaseStore, open_store
from consensus_lease.testing.conformance import BackendConformance


class TestMemoryConformance(BackendConformance):
    short_ttl_s = 0.5

    def open_store_for_test(self) -> LeaseStore:
        return open_store("memory://")
