"""The looped defaults of ``Backend.complete_many`` and ``Backend.complete_and_claim_next``
(for stores that cannot do them in one round trip) keep the rules of the native ones:
the completion conformance cases on a memory store stripped of its native versions."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from consensus_lease import LeaseStore
from consensus_lease.backend import Backend
from consensus_lease.backends.memory import MemoryBackend
from consensus_lease.errors import BackendUnavailable
from consensus_lease.record import JobState
from consensus_lease.session import Session
from consensus_lease.states import LeaseState
from consensus_lease.testing.conformance_completion import CompletionConformance


class LoopedMemory(MemoryBackend):
    """A memory store that completes one job per call, as a store without batching."""

    capabilities = dataclasses.replace(
        MemoryBackend.capabilities, max_complete_batch=1, fused_claim_next=False)
    complete_many = Backend.complete_many  # type: ignore[assignment]
    complete_and_claim_next = Backend.complete_and_claim_next  # type: ignore[assignment]


class TestLoopedDefaults(CompletionConformance):
    @pytest.fixture
    def store(self) -> Iterator[LeaseStore]:
        store = LeaseStore(LoopedMemory())
        try:
            yield store
        finally:
            store.close()

    @pytest.fixture
    def sessions(self) -> Iterator[list[Session]]:
        opened: list[Session] = []
        self._opened = opened
        yield opened
        for session in opened:
            session.close()

    def open(self, store: LeaseStore, owner: str, ttl_s: float = 30.0, **kw: Any) -> Session:
        session = store.session(owner, ttl_s, **kw)
        self._opened.append(session)
        return session

    def expire(self, store: LeaseStore, session: Session) -> None:
        store.backend.expire_session(session.session_id)  # type: ignore[attr-defined]


def test_looped_fused_claim_failing_after_the_completion_returns_no_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The completion committed, then the claim found the store unreachable: the record
    is returned with no lease (the job stays claimable), nothing raised."""
    store = LeaseStore(LoopedMemory())
    try:
        store.enqueue_many("q", ["a", "b"])
        session = store.session("W", 30.0)
        lease = session.claim("a")
        assert lease is not None

        def unreachable(*args: object) -> None:
            raise BackendUnavailable("store unreachable")

        monkeypatch.setattr(store.backend, "queue_candidates", unreachable)
        record, nxt = lease.complete_and_claim_next(b"r", queue="q")
        assert nxt is None and record.state is JobState.COMPLETED
        assert lease.state is LeaseState.COMPLETED
        waiting = store.get("b")
        assert waiting is not None and waiting.state is JobState.AVAILABLE
    finally:
        store.close()
