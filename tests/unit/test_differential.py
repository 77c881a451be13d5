"""The differential test (consensus_lease.testing.differential) on the memory and SQLite
stores: 200 random sequences each, 0 disagreements with the model (and 200 more with
the batched queue claim among the operations, natively and by the looped default); and
a memory store that accepts a stale complete is caught."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from consensus_lease import open_store
from consensus_lease.backend import Backend, SessionHandle
from consensus_lease.backends.memory import MemoryBackend
from consensus_lease.record import ClaimResult, LeaseRecord
from consensus_lease.testing.differential import run_differential


def test_memory_store_agrees_with_the_model() -> None:
    run_differential(lambda: MemoryBackend.from_url("memory://", {}))


def test_sqlite_store_agrees_with_the_model(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'diff.db'}") as store:  # one file, shared
        run_differential(lambda: store.backend, close=False)


class LoopedQueueMemory(MemoryBackend):
    """A memory store that claims a queue batch with the looped default."""

    capabilities = dataclasses.replace(MemoryBackend.capabilities, max_queue_claim_batch=1)
    claim_from_queue_many = Backend.claim_from_queue_many  # type: ignore[assignment]


@pytest.mark.parametrize("backend", [MemoryBackend, LoopedQueueMemory])
def test_memory_queue_batches_agree_with_the_model(backend: type[MemoryBackend]) -> None:
    run_differential(lambda: backend.from_url("memory://", {}), queue_batches=True)


def test_sqlite_queue_batches_agree_with_the_model(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'diff.db'}") as store:
        run_differential(lambda: store.backend, close=False, queue_batches=True)


class StaleCompleteMemory(MemoryBackend):
    """Wrong on purpose: complete compares the session only, not the generation."""

    def complete(self, session: SessionHandle, job_id: str, claim: ClaimResult,
                 result: bytes) -> LeaseRecord:
        current = self.get(job_id)
        if current is not None and current.generation != claim.generation:
            claim = dataclasses.replace(claim, generation=current.generation)
        return super().complete(session, job_id, claim, result)


def test_a_store_that_accepts_a_stale_complete_is_caught() -> None:
    with pytest.raises(AssertionError, match=r"complete\(.*store OK, model STALE"):
        run_differential(lambda: StaleCompleteMemory.from_url("memory://", {}),
                         shrink=False)
