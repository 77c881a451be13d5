"""Leader election in the core, on the memory backend and fakes built from it: what a
leader watch reports, a backend without elections, and a campaign whose value cannot be
written (the claim is handed back, or resumed by the next campaign)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest

from consensus_lease import (
    BackendUnavailable,
    InvalidArgument,
    LeaderRecord,
    LeaseStore,
    StoreClosed,
    UnsupportedOperation,
)
from consensus_lease._election import election_key
from consensus_lease.aio import AsyncLeaseStore
from consensus_lease.backend import Backend, SessionHandle
from consensus_lease.backends.memory import MemoryBackend
from consensus_lease.leader_watch import LeaderChanges
from consensus_lease.record import ClaimResult


def leader(owner: str, generation: int, value: bytes = b"") -> LeaderRecord:
    return LeaderRecord("e", owner, value, generation, None)


# -- what a leader watch reports --------------------------------------------------------


def test_changes_reports_the_first_read_then_differences_only() -> None:
    changes = LeaderChanges()
    assert changes.accept(None)
    assert not changes.accept(None)
    assert changes.accept(leader("A", 3))
    assert not changes.accept(dataclasses.replace(leader("A", 3), lease_until=5.0))
    assert changes.accept(leader("A", 3, b"v"))  # a new value of the same leader
    assert changes.accept(None)
    assert changes.accept(leader("B", 4))


def test_changes_never_go_back() -> None:
    changes = LeaderChanges()
    assert changes.accept(leader("B", 5))
    assert not changes.accept(leader("A", 4))  # a read older than one reported
    assert changes.accept(None)
    assert not changes.accept(leader("B", 5))  # the leader reported gone
    assert changes.accept(leader("C", 6))


# -- a backend without elections -------------------------------------------------------


class NoElections(MemoryBackend):
    capabilities = dataclasses.replace(MemoryBackend.capabilities, elections=False)

    def set_value(self, session: SessionHandle, job_id: str, claim: ClaimResult,
                  value: bytes) -> None:
        Backend.set_value(self, session, job_id, claim, value)  # the interface's default


def test_a_backend_without_elections_says_so() -> None:
    with LeaseStore(NoElections()) as store, store.session("A") as session:
        for call in (lambda: session.campaign("e"), lambda: store.leader("e"),
                     lambda: store.watch_leader("e")):
            with pytest.raises(UnsupportedOperation, match="no leader elections"):
                call()
        claim = store.backend.claim(session.handle, election_key("e"))
        assert claim is not None
        with pytest.raises(UnsupportedOperation):
            store.backend.set_value(session.handle, election_key("e"), claim, b"v")


# -- a value that cannot be written -----------------------------------------------------


class FlakyValues(MemoryBackend):
    """set_value fails while ``fail_values`` is set; release while ``fail_releases``."""

    fail_values = False
    fail_releases = False

    def set_value(self, session: SessionHandle, job_id: str, claim: ClaimResult,
                  value: bytes) -> None:
        if self.fail_values:
            raise BackendUnavailable("set_value: no answer")
        super().set_value(session, job_id, claim, value)

    def release(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> None:
        if self.fail_releases:
            raise BackendUnavailable("release: no answer")
        super().release(session, job_id, claim)


@pytest.fixture()
def flaky() -> Iterator[tuple[LeaseStore, FlakyValues]]:
    backend = FlakyValues()
    with LeaseStore(backend) as store:
        yield store, backend


def test_a_campaign_whose_value_fails_hands_the_claim_back(
    flaky: tuple[LeaseStore, FlakyValues],
) -> None:
    store, backend = flaky
    a, b = store.session("A"), store.session("B")
    backend.fail_values = True
    with pytest.raises(BackendUnavailable):
        a.campaign("e", b"a")
    assert store.leader("e") is None and a.leases() == []
    backend.fail_values = False
    leadership = b.campaign("e", b"b")
    assert leadership is not None and leadership.value == b"b"


def test_a_claim_that_cannot_be_handed_back_is_resumed_by_the_next_campaign(
    flaky: tuple[LeaseStore, FlakyValues],
) -> None:
    store, backend = flaky
    a = store.session("A")
    backend.fail_values = backend.fail_releases = True
    with pytest.raises(BackendUnavailable):
        a.campaign("e", b"first")
    backend.fail_values = backend.fail_releases = False
    record = store.backend.get(election_key("e"))
    assert record is not None and record.owner == "A" and record.value is None
    leadership = a.campaign("e", b"second", wait_s=1)  # no waiting for itself
    assert leadership.generation == record.generation and leadership.value == b"second"
    assert store.leader("e") == LeaderRecord("e", "A", b"second", record.generation,
                                             record.lease_until)
    with pytest.raises(InvalidArgument, match="already leads"):
        a.campaign("e")


# -- ending a leader watch -------------------------------------------------------------


def test_close_from_another_thread_ends_a_waiting_next() -> None:
    with LeaseStore(MemoryBackend()) as store:
        watch = store.watch_leader("e")
        assert next(watch) is None
        threading.Timer(0.2, watch.close).start()
        started = time.monotonic()
        with pytest.raises(StopIteration):
            next(watch)
        assert time.monotonic() - started < 10


def test_async_watch_leader_ends_on_close_and_on_timeout() -> None:
    async def main() -> None:
        astore = AsyncLeaseStore(LeaseStore(MemoryBackend()))
        try:
            watch = astore.watch_leader("e", timeout_s=30)
            assert await anext(watch) is None
            asyncio.get_running_loop().call_later(0.2, watch.close)
            with pytest.raises(StopAsyncIteration):
                await anext(watch)
            assert [r async for r in astore.watch_leader("e", timeout_s=0.1)] == [None]
        finally:
            await astore.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_watch_leader_after_store_close_is_refused() -> None:
    store = LeaseStore(MemoryBackend())
    store.close()
    with pytest.raises(StoreClosed):
        store.watch_leader("e")
    with pytest.raises(StoreClosed):
        store.leader("e")
