"""The asyncio API: same core, loss delivered as cancellation."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from consensus_lease import (
    InvalidArgument,
    JobState,
    LeaseLost,
    LeaseState,
    RetryPolicy,
    SessionState,
    StoreClosed,
    open_store,
)
from consensus_lease.aio import AsyncLease, AsyncLeaseStore, AsyncSession
from consensus_lease.aio import open_store as aio_open_store
from consensus_lease.backend import SessionHandle
from consensus_lease.record import ClaimResult


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


def test_closed_says_whether_the_store_or_the_sync_store_under_it_was_closed(
        url: str) -> None:
    async def main() -> None:
        store = await AsyncLeaseStore.open(url)
        assert not store.closed
        await store.close()
        assert store.closed and store.sync.closed
        other = await AsyncLeaseStore.open(url)
        other.sync.close()  # closed beneath it: its calls raise StoreClosed, so it says so
        assert other.closed
        with pytest.raises(StoreClosed):
            await other.get("j")
        await other.close()

    asyncio.run(asyncio.wait_for(main(), 20))


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
                    await asyncio.sleep(30)  # work that only a cancel ends

            task = asyncio.create_task(work())
            await asyncio.sleep(0)  # one loop turn: the task enters its guard
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            lease.ensure_held()
        await store.close()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_cancelled_waiting_claim_stops_waiting(url: str) -> None:
    """A waiting claim holds no thread: cancelling it unsubscribes, and a later release
    leaves the job free (nothing claims it behind the caller's back)."""
    async def main() -> None:
        store = await AsyncLeaseStore.open(url)
        async with store.session("A", ttl_s=10) as a, store.session("B", ttl_s=10) as b:
            held = await b.claim("k")
            assert held is not None
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(a.claim("k", wait_s=5), timeout=0.2)
            assert len(a.sync.waiters) == 0
            await held.release()
            record = await store.get("k")
            assert record is not None and record.state is JobState.AVAILABLE
            assert record.generation == held.generation and not a.sync.leases()
            again = await b.claim("k")
            assert again is not None
        await store.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_cancelled_claim_hands_back_a_lease_it_obtains_late(url: str) -> None:
    """The claim attempt was already on its thread when the caller was cancelled: the
    lease it still obtains is released at once."""
    from consensus_lease.testing.conformance import poll_until

    async def main() -> None:
        store = await AsyncLeaseStore.open(url)
        backend = store.sync.backend
        gate, entered = threading.Event(), threading.Event()
        real_claim = backend.claim

        def slow_claim(handle: SessionHandle, job_id: str) -> ClaimResult | None:
            entered.set()
            gate.wait(10)
            return real_claim(handle, job_id)

        async with store.session("A", ttl_s=10) as a:
            backend.claim = slow_claim  # type: ignore[method-assign]
            task = asyncio.create_task(a.claim("k", wait_s=5))
            await asyncio.to_thread(entered.wait, 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            gate.set()

            def handed_back() -> bool:
                record = store.sync.get("k")
                return (record is not None and record.generation == 1
                        and record.state is JobState.AVAILABLE and not a.sync.leases())

            await asyncio.to_thread(poll_until, handed_back, 10)
            backend.claim = real_claim  # type: ignore[method-assign]
        await store.close()

    asyncio.run(asyncio.wait_for(main(), 30))


class _NoDefaultExecutor(ThreadPoolExecutor):
    def submit(self, *args: object, **kwargs: object) -> Future[object]:
        raise AssertionError("the loop's default executor was used")


def test_round_trips_run_on_the_stores_own_pool(url: str) -> None:
    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(_NoDefaultExecutor(1))
        store = await aio_open_store(url, threads=3)
        assert store.threads == 3
        async with store.session("A", ttl_s=10) as a:
            lease = await a.claim("job", wait_s=1)
            assert lease is not None
            names = {t.name for t in threading.enumerate()}
            assert any(n.startswith("consensus-lease-aio") for n in names)
            await lease.renew()
            await lease.complete(b"x")
            await store.enqueue("q", "qjob", b"p", max_attempts=2)
            assert [j.record.job_id for j in await store.queue_jobs("q")] == ["qjob"]
            assert (await store.queue_stats("q")).available == 1
            assert await store.records(1)
        await store.close()
        with pytest.raises(StoreClosed):
            await store.get("job")

    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("bad", [0, 1, 2.5, True, "8", 4096])
def test_bad_threads_is_rejected(bad: object) -> None:
    async def main() -> None:
        with pytest.raises(InvalidArgument, match="threads"):
            await aio_open_store("memory://", threads=bad)  # type: ignore[arg-type]

    asyncio.run(main())
    with pytest.raises(InvalidArgument, match="threads"):
        AsyncLeaseStore(open_store("memory://"), threads=bad)  # type: ignore[arg-type]


def test_async_lease_store_refuses_pool_size_naming_threads() -> None:
    """The wrapper of an opened store: ``pool_size`` (or any other keyword) is refused
    with the hint of ``aio.open_store``, not a raw TypeError, and starts nothing."""
    with open_store("memory://") as store:
        with pytest.raises(InvalidArgument, match=r"unknown .*pool_size.*threads=") as info:
            AsyncLeaseStore(store, pool_size=3)  # type: ignore[arg-type]
        assert "the asyncio adapter's thread pool is threads=" in str(info.value)
        with pytest.raises(InvalidArgument, match=r"unknown .*colour") as info:
            AsyncLeaseStore(store, colour="blue")  # type: ignore[arg-type]
        assert "pool_size" not in str(info.value)


def test_pool_size_is_the_stores_option_never_the_thread_pool(url: str) -> None:
    """``pool_size`` means the PostgreSQL connection pool in both APIs: aio hands it to
    the store like every other option (it used to size the thread pool and never reach
    the store); a store without it refuses it, and the message names ``threads``."""
    async def main() -> None:
        with pytest.raises(InvalidArgument, match=r"unknown .*pool_size.*threads=") as info:
            await aio_open_store(url, pool_size=4)
        assert "the asyncio adapter's thread pool is threads=" in str(info.value)
        with pytest.raises(InvalidArgument, match=r"unknown .*colour"):
            await aio_open_store(url, colour="blue")

    asyncio.run(asyncio.wait_for(main(), 30))
    with pytest.raises(InvalidArgument, match=r"unknown .*pool_size") as info:
        open_store(url, pool_size=4)
    assert "threads" not in str(info.value)  # the sync API has no thread pool to name
    with pytest.raises(InvalidArgument, match=r"unknown .*threads"):
        open_store(url, threads=4)  # nor a threads option


def test_async_parity_with_the_sync_api(url: str) -> None:
    async def main() -> None:
        async with await aio_open_store(url) as store:
            assert store.capabilities.queues
            store.set_retry_policy("q", RetryPolicy(max_attempts=2, initial_s=0.0))
            assert await store.enqueue("q", "j1", b"payload")
            async with store.session("A", ttl_s=10) as a:
                assert a.state is SessionState.ACTIVE and a.lost_reason is None
                assert a.granted_ttl_s == 10 and a.remaining_s() > 0
                lease = await a.claim_next("q", wait_s=1)
                assert lease is not None and isinstance(lease, AsyncLease)
                assert (lease.payload, lease.attempt, lease.queue) == (b"payload", 1, "q")
                assert lease.state is LeaseState.HELD and lease.lost_reason is None
                assert lease.session is a and [x.job_id for x in a.leases()] == ["j1"]
                record = await lease.fail("boom", retry_in_s=0)
                assert record.state is JobState.AVAILABLE and record.error == "boom"
                lease = await a.claim_next("q", wait_s=5)
                assert lease is not None and lease.attempt == 2
                record = await lease.fail(RuntimeError("again"))
                assert record.state is JobState.FAILED
                requeued = await store.requeue("j1")
                assert requeued.state is JobState.AVAILABLE
                many = await a.claim_many(["m1", "m2"])
                assert [m is not None for m in many] == [True, True]
                assert await a.keepalive() > 0
            assert a.state is SessionState.CLOSED
            assert await store.purge("q") == 0

    asyncio.run(asyncio.wait_for(main(), 30))


def test_wait_lost_and_on_lost_hold_no_thread(url: str) -> None:
    async def main() -> None:
        store = await AsyncLeaseStore.open(url)
        loop = asyncio.get_running_loop()
        session = await store.session("A", ttl_s=0.3, keepalive=False)
        seen: list[tuple[AsyncSession, LeaseLost, bool]] = []

        def on_lost(s: AsyncSession, reason: LeaseLost) -> None:
            seen.append((s, reason, asyncio.get_running_loop() is loop))

        session.on_lost(on_lost)
        reason = await asyncio.wait_for(session.wait_lost(), 10)
        assert isinstance(reason, LeaseLost) and session.state is SessionState.LOST
        give_up = loop.time() + 5
        while not seen and loop.time() < give_up:  # the callback comes through the loop
            await asyncio.sleep(0.01)  # poll interval inside a deadline loop
        assert seen and seen[0][0] is session and seen[0][2]
        other = await store.session("B", ttl_s=10)
        waiting = asyncio.create_task(other.wait_lost())
        await asyncio.sleep(0)  # one loop turn: the task is waiting
        await other.close()
        assert await asyncio.wait_for(waiting, 5) is None
        await store.close()

    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("end", ["session.close", "store.close"])
def test_closing_cancels_the_guarded_work(url: str, end: str) -> None:
    """The guarded body is cancelled (LeaseLost) when the lease ends because its session
    or its store is closed, not only when the store expires it (found by a newcomer)."""
    async def main() -> None:
        store = await AsyncLeaseStore.open(url)
        session = await store.session("A", ttl_s=30)
        lease = await session.claim("g", wait_s=1)
        ran: list[int] = []

        async def body() -> None:
            async with lease.guard():
                for i in range(300):  # 30 s unless cancelled
                    ran.append(i)
                    await asyncio.sleep(0.1)  # the guarded work: real time passes

        task = asyncio.create_task(body())
        while not ran:
            await asyncio.sleep(0.01)  # poll until the body runs
        await (session.close() if end == "session.close" else store.close())
        with pytest.raises(LeaseLost):
            await asyncio.wait_for(task, 5)
        assert len(ran) < 100 and lease.state is LeaseState.LOST
        await store.close()

    asyncio.run(main())


def test_completing_inside_the_guard_does_not_cancel_it(url: str) -> None:
    async def main() -> None:
        async with await AsyncLeaseStore.open(url) as store:
            async with store.session("A", ttl_s=30) as session:
                lease = await session.claim("done", wait_s=1)
                async with lease.guard():
                    await lease.complete(b"ok")
                    await asyncio.sleep(0.05)  # the body goes on after completing
                assert lease.state is LeaseState.COMPLETED

    asyncio.run(main())


@pytest.mark.parametrize("bad", [None, "job", 3, b"job", bytearray(b"job"), memoryview(b"job")])
def test_complete_many_refuses_a_non_sequence_as_the_sync_call_does(url: str,
                                                                     bad: object) -> None:
    async def main() -> None:
        async with await AsyncLeaseStore.open(url) as store:
            async with store.session("A", ttl_s=10) as a:
                lease = await a.claim("job")
                assert lease is not None
                with pytest.raises(InvalidArgument, match="sequence of leases"):
                    await a.complete_many(bad)  # type: ignore[arg-type]
                record = await store.get("job")
                assert record is not None and record.state is JobState.HELD

    asyncio.run(asyncio.wait_for(main(), 60))


def test_complete_many_refuses_a_sync_lease_naming_its_index(url: str) -> None:
    """The async call takes the AsyncLease objects its claims returned: a sync Lease (the
    one under an AsyncLease, or another) is refused before anything is sent."""
    async def main() -> None:
        async with await AsyncLeaseStore.open(url) as store:
            async with store.session("A", ttl_s=10) as a:
                first, second = await a.claim("one"), await a.claim("two")
                assert first is not None and second is not None
                with pytest.raises(InvalidArgument, match=r"^item 1: lease on 'two': AsyncSession.complete_many\(\) takes AsyncLease objects, got a Lease"):
                    await a.complete_many([first, second.sync])
                for job in ("one", "two"):
                    record = await store.get(job)
                    assert record is not None and record.state is JobState.HELD

    asyncio.run(asyncio.wait_for(main(), 60))



@pytest.mark.parametrize(("bad", "message"), [
    ([3], "^item 0: .*, got int$"), ([None], "^item 0: .*, got NoneType$"),
    ("ONE_TUPLE", "^item 0: lease on 'job': .*, got a 1-tuple$"),
    ("LEASE_THEN_3_TUPLE", "^item 1: lease on 'job': .*, got a 3-tuple$"),
    ("INT_THEN_SYNC", "^item 0: .*, got int$"),
])
def test_complete_many_names_a_malformed_item_as_the_sync_call_does(
        url: str, bad: Any, message: str) -> None:
    async def main() -> None:
        async with await AsyncLeaseStore.open(url) as store:
            async with store.session("A", ttl_s=10) as a:
                lease = await a.claim("job")
                assert lease is not None
                made = {"ONE_TUPLE": [(lease,)], "LEASE_THEN_3_TUPLE": [lease, (lease, b"", 1)],
                        "INT_THEN_SYNC": [3, lease.sync]}
                with pytest.raises(InvalidArgument, match=message):
                    await a.complete_many(made[bad] if isinstance(bad, str) else bad)
                record = await store.get("job")
                assert record is not None and record.state is JobState.HELD

    asyncio.run(asyncio.wait_for(main(), 60))
