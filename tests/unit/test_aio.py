"""The asyncio API: same core, loss delivered as cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from consensus_lease import JobState, LeaseLost
from consensus_lease.aio import AsyncLeaseStore


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/a.db"


def test_claim_complete_and_context_managers(url: str) -> None:
    async def main() -> None:
        async with await AsyncLeaseStore.open(url) as store:
            async with store.session("A", ttl_s=10) as a, store.session("B", ttl_s=10) as b:
                lease = await a.claim("job", wait_s=1)
                assert lease is not None and lease.generation >= 1
                assert await b.claim("job") is None
                async with lease.guard():
                    await lease.complete(b"done")
                record = await store.get("job")
                assert record is not None and record.state is JobState.COMPLETED

    asyncio.run(asyncio.wait_for(main(), 60))


def test_lost_lease_cancels_the_guarded_work(url: str) -> None:
    async def main() -> None:
        store = await AsyncLeaseStore.open(url)
        session = await store.session("A", ttl_s=0.5, keepalive=False)
        lease = await session.claim("job")
        assert lease is not None
        reached_end = False
        with pytest.raises(LeaseLost):
            async with lease.guard():
                await asyncio.sleep(30)  # work that never checks the lease
                reached_end = True
        assert not reached_end
        with pytest.raises(LeaseLost):
            lease.ensure_held()
        await session.close()
        await store.close()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_unrelated_cancellation_is_not_turned_into_loss(url: str) -> None:
    async def main() -> None:
        store = await AsyncLeaseStore.open(url)
        async with store.session("A", ttl_s=10) as session:
            lease = await session.claim("job")
            assert lease is not None

            async def work() -> None:
                async with lease.guard():
                    await asyncio.sleep(30)

            task = asyncio.create_task(work())
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            lease.ensure_held()
        await store.close()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_cancelled_waiting_claim_does_not_leak_a_lease(url: str) -> None:
    from consensus_lease.testing.conformance import poll_until

    async def main() -> None:
        store = await AsyncLeaseStore.open(url)
        async with store.session("A", ttl_s=10) as a, store.session("B", ttl_s=10) as b:
            held = await b.claim("k")
            assert held is not None
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(a.claim("k", wait_s=5), timeout=0.2)
            await held.release()  # the abandoned claim's thread now gets it ...
            # ... and hands it straight back: nobody holds a job no caller received.
            def handed_back() -> bool:
                record = store.sync.get("k")
                assert record is not None
                return (record.generation > held.generation  # the orphan claim happened
                        and record.state is JobState.AVAILABLE and not a.sync.leases())

            await asyncio.to_thread(poll_until, handed_back, 10)
            again = await b.claim("k")
            assert again is not None
        await store.close()

    asyncio.run(asyncio.wait_for(main(), 30))
