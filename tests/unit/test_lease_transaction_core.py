"""``lease.transaction()`` in the core, on the memory backend with a scripted
``lock_in``: the store's refusal at the start of the block takes the same path as
through ``renew()`` (issue 26), and :class:`LeaseTransaction` checks its input."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from consensus_lease import (
    InvalidArgument,
    LeaseLost,
    LeaseState,
    LeaseStore,
    SessionExpired,
    SessionState,
    StaleLeaseError,
    UnsupportedOperation,
)
from consensus_lease.backend import OnceCheck, SessionHandle
from consensus_lease.backends.memory import MemoryBackend
from consensus_lease.record import ClaimResult
from consensus_lease.testing import FakeClock


class TransactionalMemory(MemoryBackend):
    """Memory, declaring transactions; ``lock_in`` raises ``refuse`` when set, else
    yields a once-check over a dict (a stand-in for the store's ``cl_effects``)."""

    capabilities = dataclasses.replace(MemoryBackend.capabilities, transactions=True)

    def __init__(self, store_clock: Any = None) -> None:
        super().__init__(store_clock)
        self.refuse: Exception | None = None
        self.effects: dict[tuple[str, str], int] = {}

    @contextmanager
    def _locked(self, job_id: str, generation: int) -> Iterator[OnceCheck]:
        if self.refuse is not None:
            raise self.refuse
        pending: dict[tuple[str, str], int] = {}

        def once(effect_id: str) -> bool:
            key = (job_id, effect_id)
            if key in self.effects or key in pending:
                return False
            pending[key] = generation
            return True

        yield once
        self.effects.update(pending)  # committed

    def lock_in(self, session: SessionHandle, job_id: str, claim: ClaimResult, conn: object,
                lock_timeout_s: float | None) -> Any:
        return self._locked(job_id, claim.generation)


@pytest.fixture
def backend() -> TransactionalMemory:
    return TransactionalMemory(store_clock=FakeClock())


@pytest.fixture
def store(backend: TransactionalMemory) -> Iterator[LeaseStore]:
    s = LeaseStore(backend, clock=FakeClock())
    yield s
    s.close()


def test_stale_refusal_in_transaction_leaves_the_state_renew_leaves(
    store: LeaseStore, backend: TransactionalMemory
) -> None:
    session = store.session("A", ttl_s=5.0)
    lease = session.claim("j")
    assert lease is not None
    backend.refuse = StaleLeaseError("taken over", job_id="j", generation=lease.generation)
    with pytest.raises(StaleLeaseError):
        with lease.transaction(object()):
            pytest.fail("the block must not run")
    assert lease.state is LeaseState.LOST
    assert lease not in session.leases()       # was: kept, and claim("j") refused
    assert session.state is SessionState.ACTIVE
    again = session.claim("j")                 # no "this session already holds 'j'"
    assert again is None or again.generation > lease.generation


def test_session_expired_in_transaction_loses_the_session_as_renew_does(
    store: LeaseStore, backend: TransactionalMemory
) -> None:
    session = store.session("A", ttl_s=5.0)
    lease = session.claim("j")
    other = session.claim("k")
    assert lease is not None and other is not None
    backend.refuse = SessionExpired("expired", job_id="j", generation=lease.generation)
    with pytest.raises(SessionExpired):
        with lease.transaction(object()):
            pytest.fail("the block must not run")
    assert session.state is SessionState.LOST  # was: ACTIVE
    assert lease.state is LeaseState.LOST and other.state is LeaseState.LOST
    assert session.leases() == []


def test_once_is_true_once_per_job_across_generations(
    store: LeaseStore, backend: TransactionalMemory
) -> None:
    session = store.session("A", ttl_s=5.0)
    first = session.claim("j")
    assert first is not None
    with first.transaction(object()) as tx:
        assert (tx.job_id, tx.generation) == ("j", first.generation)
        assert tx.once("charge") is True
        assert tx.once("charge") is False    # recorded earlier in this block
    first.release()
    second = session.claim("j")
    assert second is not None and second.generation > first.generation
    with second.transaction(object()) as tx:
        assert tx.once("charge") is False    # committed by generation 1
        assert tx.once("receipt") is True
    with pytest.raises(InvalidArgument, match="has ended"):
        tx.once("late")
    assert backend.effects == {("j", "charge"): first.generation,
                               ("j", "receipt"): second.generation}


@pytest.mark.parametrize("bad", ["", "x" * 257, "a\x00b", "\ud800", 7, None])
def test_a_bad_effect_id_is_invalid_and_records_nothing(
    store: LeaseStore, backend: TransactionalMemory, bad: Any
) -> None:
    session = store.session("A", ttl_s=5.0)
    lease = session.claim("j")
    assert lease is not None
    with lease.transaction(object()) as tx:
        with pytest.raises(InvalidArgument, match="effect_id"):
            tx.once(bad)
        assert tx.once("ok") is True
        assert tx.once("x" * 256) is True  # the fences' limit: one effect id fits both
    assert list(backend.effects) == [("j", "ok"), ("j", "x" * 256)]
    assert lease.state is LeaseState.HELD


def test_a_store_without_transactions_says_so_before_any_check() -> None:
    with LeaseStore(MemoryBackend()) as store:
        session = store.session("A", ttl_s=5.0)
        lease = session.claim("j")
        assert lease is not None
        assert store.capabilities.transactions is False
        with pytest.raises(UnsupportedOperation, match="one database"):
            with lease.transaction(object()):
                pass
        lease.release()
        with pytest.raises(UnsupportedOperation):  # not LeaseLost: the feature is absent
            with lease.transaction(object()):
                pass
        assert not isinstance(UnsupportedOperation("x"), LeaseLost)


def test_run_in_transaction_refuses_an_async_block(
    store: LeaseStore, backend: TransactionalMemory
) -> None:
    import asyncio

    from consensus_lease.aio import AsyncLeaseStore

    async def block(tx: Any) -> bool:  # would never run inside the transaction
        return tx.once("charge")  # type: ignore[no-any-return]

    async def main() -> None:
        astore = AsyncLeaseStore(store)
        session = await astore.session("A", 5.0)
        lease = await session.claim("j")
        assert lease is not None
        with pytest.raises(InvalidArgument, match="plain function"):
            await lease.run_in_transaction(object(), block)
        with pytest.raises(InvalidArgument, match="awaitable"):
            await lease.run_in_transaction(object(), lambda tx: block(tx))
        assert await lease.run_in_transaction(object(), lambda tx: tx.once("x")) is True
        assert lease.state is LeaseState.HELD
        await session.close()
        astore.workers.shutdown()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert backend.effects == {("j", "x"): 1}  # the refused blocks recorded nothing


def test_the_deadline_message_prints_seconds_as_written() -> None:
    """ttl 3 s x the default margin fraction 0.1 is 0.30000000000000004 as a float; the
    message says 0.3 (issue 31)."""
    clock = FakeClock()
    with LeaseStore(MemoryBackend(store_clock=clock), clock=clock) as store:
        session = store.session("A", ttl_s=3.0, keepalive=False)
        lease = session.claim("j")
        assert lease is not None
        clock.advance(5.0)
        with pytest.raises(LeaseLost) as lost:
            lease.ensure_held()
        assert "granted TTL 3 s, margin 0.3 s" in str(lost.value), str(lost.value)
