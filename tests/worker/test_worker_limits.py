"""Values the worker and the core must refuse with ``InvalidArgument`` rather than a raw
``OverflowError`` deep in a claim: a wait longer than a thread can wait, a retry delay
given as an int too large for a float; and async ``complete_many`` given a deque."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from consensus_lease import InvalidArgument, RetryPolicy, open_store
from consensus_lease.aio import AsyncLeaseStore
from consensus_lease.worker import WorkerConfig


def test_a_claim_wait_longer_than_a_thread_can_wait_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="claim_wait_s must be at most"):
        WorkerConfig(queue="q", claim_wait_s=1e12)
    with open_store("memory://") as store, store.session("A", ttl_s=10) as session:
        with pytest.raises(InvalidArgument, match="wait_s must be at most"):
            session.claim_next("q", wait_s=1e12)
        with pytest.raises(InvalidArgument, match="wait_s must be at most"):
            session.claim("job", wait_s=1e12)


@pytest.mark.parametrize("field", ["initial_s", "max_s"])
def test_a_retry_delay_too_large_for_a_float_is_refused(field: str) -> None:
    # refused with the real limit, the int shown by its size
    with pytest.raises(InvalidArgument,
                       match=rf"RetryPolicy\.{field} must be at most 31622400 s .*int of 1329 bits"):
        RetryPolicy(**{field: 10**400})  # type: ignore[arg-type]


def test_async_complete_many_takes_any_sequence_like_the_sync_call() -> None:
    async def main() -> None:
        async with await AsyncLeaseStore.open("memory://") as store:
            async with store.session("A", ttl_s=10) as a:
                lease = await a.claim("job")
                assert lease is not None
                with pytest.raises(InvalidArgument, match=r"^item 1: .*, got int$"):
                    await a.complete_many(deque([lease, 3]))  # type: ignore[list-item]
                out = await a.complete_many(deque([lease]))
                assert [record.job_id for record in out] == ["job"]  # type: ignore[union-attr]

    asyncio.run(asyncio.wait_for(main(), 60))
