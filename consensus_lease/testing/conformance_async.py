"""The waiting part of the conformance suite: waiting claims hold no thread, never delay
lease operations, and end at once when their session (or process) ends.

Mixed into :class:`~consensus_lease.testing.conformance.BackendConformance`, so every
backend runs it; it uses that class's hooks (``open``, ``process_url``, fixtures). A
backend without change notification passes through the default subscription poller of
:class:`~consensus_lease.backend.Backend` (slower to wake, still correct).
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from ..aio import AsyncLeaseStore, AsyncSession
from ..errors import LeaseLost, StoreClosed
from ..session import Session
from ..store import LeaseStore

__all__ = ["AsyncConformance"]

WAITERS = 1000
"""Waiting claims of the scale test, all in one process."""

HELD_JOBS = 20
"""Jobs held elsewhere that those claims wait for (plus one queue whose jobs are all held)."""

SAMPLES = 15
"""Timed renew and complete calls, with and without the waiting claims."""

MAX_THREADS = 64
CLOSE_RETURNS_WITHIN_S = 1.0
SIGINT_EXITS_WITHIN_S = 2.0

_SIGINT_SCRIPT = """
import asyncio, signal, sys
from consensus_lease.aio import open_store

# A test run started in the background of a non-interactive shell (``cmd &``) passes
# SIGINT on ignored, and Python then installs no KeyboardInterrupt handler: put it back.
signal.signal(signal.SIGINT, signal.default_int_handler)

async def main():
    async with await open_store(sys.argv[1]) as store:
        async with store.session("holder", 30.0) as holder, \\
                store.session("waiter", 30.0) as waiter:
            assert await holder.claim(sys.argv[2]) is not None
            waits = [asyncio.create_task(waiter.claim(sys.argv[2], wait_s=30))]
            if store.capabilities.queues:
                waits.append(asyncio.create_task(waiter.claim_next(sys.argv[3], wait_s=30)))
            while len(waiter.sync.waiters) < len(waits):
                await asyncio.sleep(0.01)
            print("waiting", flush=True)
            await asyncio.gather(*waits)

asyncio.run(main())
"""


async def _poll(predicate: Callable[[], bool], timeout_s: float) -> None:
    """Until ``predicate()`` is true, checking every 20 ms for at most ``timeout_s``."""
    give_up = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= give_up:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.02)


def _poll_sync(predicate: Callable[[], bool], timeout_s: float) -> None:
    """As :func:`_poll`, blocking."""
    give_up = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= give_up:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.02)


async def _lease_latencies(session: AsyncSession, prefix: str) -> tuple[float, float]:
    """Median seconds of ``renew()`` and of ``complete()`` over :data:`SAMPLES` fresh
    jobs claimed by ``session``."""
    renews: list[float] = []
    completes: list[float] = []
    for i in range(SAMPLES):
        lease = await session.claim(f"{prefix}-{i}")
        assert lease is not None
        started = time.perf_counter()
        await lease.renew()
        renewed = time.perf_counter()
        await lease.complete(b"")
        renews.append(renewed - started)
        completes.append(time.perf_counter() - renewed)
    return statistics.median(renews), statistics.median(completes)


def _within(loaded: float, baseline: float) -> bool:
    """``loaded`` is no worse than 3x ``baseline`` (or baseline + 0.25 s for fast stores
    on a busy machine)."""
    return loaded <= max(3 * baseline, baseline + 0.25)


class AsyncConformance:
    """Waiting claims at scale, and their end on close and on SIGINT, on every backend."""

    open: Any
    process_url: Any
    short_ttl_s: float
    long_ttl_s: float

    # -- scale -----------------------------------------------------------------------

    def test_thousand_waiting_claims_do_not_delay_lease_operations(
        self, store: LeaseStore
    ) -> None:
        """1,000 tasks of one process wait in claim/claim_next on held jobs; meanwhile
        another session's renew() and complete() stay within 3x their latency without
        waiters, and the process runs fewer than 64 threads. Closing the waiting session
        then ends all 1,000."""
        asyncio.run(asyncio.wait_for(self._thousand_waiters(store), 60))

    async def _thousand_waiters(self, store: LeaseStore) -> None:
        astore = AsyncLeaseStore(store)
        holder = await astore.session("holder", self.long_ttl_s)
        held = [f"held-{i}" for i in range(HELD_JOBS)]
        assert all(lease is not None for lease in await holder.claim_many(held))
        queues = store.capabilities.queues
        if queues:
            await astore.enqueue("busy", "busy-0")
            assert await holder.claim_next("busy") is not None
        worker = await astore.session("worker", self.long_ttl_s)
        base_renew, base_complete = await _lease_latencies(worker, "base")
        waiters = await astore.session("waiters", self.long_ttl_s)
        tasks = [asyncio.create_task(
            waiters.claim_next("busy", wait_s=30) if queues and i % 2
            else waiters.claim(held[i % HELD_JOBS], wait_s=30)) for i in range(WAITERS)]
        await _poll(lambda: len(waiters.sync.waiters) == WAITERS, 30)
        threads = threading.active_count()
        renew, complete = await _lease_latencies(worker, "loaded")
        threads = max(threads, threading.active_count())
        assert not any(t.done() for t in tasks)
        await waiters.close()
        ended = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
        assert all(isinstance(e, LeaseLost) for e in ended), {type(e) for e in ended}
        assert threads < MAX_THREADS, f"{threads} threads"
        assert _within(renew, base_renew), (renew, base_renew)
        assert _within(complete, base_complete), (complete, base_complete)
        await worker.close()
        await holder.close()

    # -- closing a session ends its waiting claims -----------------------------------

    def _held_job_and_queue(self, store: LeaseStore) -> tuple[Session, str, str | None]:
        holder = self.open(store, "holder")
        assert holder.claim("wanted") is not None
        if not store.capabilities.queues:
            return holder, "wanted", None
        store.enqueue("wanted-q", "wanted-q-0")
        assert holder.claim_next("wanted-q") is not None
        return holder, "wanted", "wanted-q"

    @staticmethod
    def _waits(job: str, queue: str | None) -> list[Callable[[Session], object]]:
        """A sync claim and claim_next, each waiting 30 s for what the holder holds."""
        waits: list[Callable[[Session], object]] = [lambda s: s.claim(job, wait_s=30)]
        if queue is not None:
            waits.append(lambda s: s.claim_next(queue, wait_s=30))
        return waits

    def _end_while_waiting(self, waiter: Session, wait: Callable[[Session], object],
                           end: Callable[[], None],
                           error: type[BaseException] = LeaseLost) -> None:
        """Start ``wait(waiter)`` in a thread; once it waits, call ``end``: the claim
        must raise ``error`` (LeaseLost; StoreClosed when the store was closed) within
        1 s."""
        ended: list[tuple[float, BaseException | None]] = []

        def run() -> None:
            try:
                wait(waiter)
                ended.append((time.monotonic(), None))
            except BaseException as exc:
                ended.append((time.monotonic(), exc))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        _poll_sync(lambda: len(waiter.waiters) == 1, 30)
        ended_at = time.monotonic()
        end()
        thread.join(30)
        assert ended and isinstance(ended[0][1], error), ended
        assert ended[0][0] - ended_at <= CLOSE_RETURNS_WITHIN_S

    def test_close_ends_a_waiting_claim_at_once(self, store: LeaseStore) -> None:
        """session.close() from another thread: each sync waiting claim (claim and
        claim_next) raises LeaseLost within 1 s."""
        _holder, job, queue = self._held_job_and_queue(store)
        for wait in self._waits(job, queue):
            waiter = self.open(store, "waiter")
            self._end_while_waiting(waiter, wait, waiter.close)

    def test_store_close_ends_a_waiting_claim_at_once(self, store: LeaseStore) -> None:
        """store.close() ends a sync waiting claim of one of its sessions within 1 s, with
        StoreClosed. The job waits out a retry delay, so closing the other sessions frees
        nothing."""
        lease = self.open(store, "holder").claim("delayed")
        assert lease is not None
        lease.fail("later", retry_in_s=600)
        self._end_while_waiting(self.open(store, "waiter"), self._waits("delayed", None)[0],
                                store.close, StoreClosed)

    def test_async_close_ends_a_waiting_claim_at_once(self, store: LeaseStore) -> None:
        """As above, for asyncio: await session.close() ends claim and claim_next
        waiting in other tasks within 1 s."""
        _holder, job, queue = self._held_job_and_queue(store)

        async def main() -> None:
            astore = AsyncLeaseStore(store)
            waits: list[Callable[[AsyncSession], Coroutine[Any, Any, object]]] = [
                lambda s: s.claim(job, wait_s=30)]
            if queue is not None:
                waits.append(lambda s: s.claim_next(queue, wait_s=30))
            for wait in waits:
                waiter = await astore.session("waiter", self.long_ttl_s)
                task = asyncio.create_task(wait(waiter))
                await _poll(lambda w=waiter: len(w.sync.waiters) == 1,  # type: ignore[misc]
                            30)
                closed_at = time.monotonic()
                closing = asyncio.create_task(waiter.close())
                with pytest.raises(LeaseLost):
                    await asyncio.wait_for(task, 30)
                assert time.monotonic() - closed_at <= CLOSE_RETURNS_WITHIN_S
                await closing

        asyncio.run(asyncio.wait_for(main(), 60))

    # -- SIGINT ----------------------------------------------------------------------

    def test_sigint_ends_an_asyncio_worker_waiting_to_claim(self, store: LeaseStore) -> None:
        """An asyncio worker process blocked in claim and claim_next(wait_s=30) exits
        within 2 s of SIGINT (no thread is stuck in a wait)."""
        url = self.process_url(store)
        if url is None:
            assert not store.capabilities.cross_process
            url = f"{store.backend.scheme}://"  # the worker's own, in-process store
        tag = uuid.uuid4().hex[:8]
        proc = subprocess.Popen(
            [sys.executable, "-c", _SIGINT_SCRIPT, url, f"sigint-{tag}", f"sigint-q-{tag}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "waiting", proc.stderr.read() if proc.stderr else line
            sent_at = time.monotonic()
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
            assert time.monotonic() - sent_at <= SIGINT_EXITS_WITHIN_S
        finally:
            proc.kill()
            proc.communicate(timeout=30)
