"""The worker-process side of W8: one process, many asyncio tasks, one session.

:class:`AsyncCycler` is a :class:`~consensus_lease.bench.raw.Cycler` (``cycle`` runs one
claim+complete, for warm-up) whose :meth:`AsyncCycler.run` starts ``tasks`` asyncio tasks
that each cycle on their own fresh jobs until the deadline, all through one
:class:`~consensus_lease.aio.AsyncLeaseStore` (its default thread pool) and one session.
The event loop lives as long as the cycler (an :class:`asyncio.Runner`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from ..aio import AsyncLeaseStore, AsyncSession, open_store
from .windows import Windows

__all__ = ["AsyncCycler"]


class AsyncCycler:
    """``tasks`` asyncio tasks cycling ``claim(job)`` + ``complete()`` in one process."""

    def __init__(self, url: str, ttl_s: float, owner: str, tasks: int) -> None:
        self.url, self.ttl_s, self.owner, self.tasks = url, ttl_s, owner, tasks
        self._runner: asyncio.Runner | None = None
        self._store: AsyncLeaseStore | None = None
        self._session: AsyncSession | None = None

    def open(self) -> None:
        self._runner = asyncio.Runner()
        self._runner.run(self._open())

    async def _open(self) -> None:
        self._store = await open_store(self.url)
        self._session = await self._store.session(self.owner, self.ttl_s)

    async def _cycle(self, job_id: str) -> None:
        assert self._session is not None, "open first"
        lease = await self._session.claim(job_id)
        if lease is None:
            raise RuntimeError(f"{job_id!r} was not claimable: the workload is not uncontended")
        await lease.complete(b"")

    def cycle(self, job_id: str) -> None:
        assert self._runner is not None, "open first"
        self._runner.run(self._cycle(job_id))

    def run(self, prefix: str, start_at: float, windows: Windows,
            max_cycles: int) -> dict[str, Any]:
        """Like :func:`.cycler.run_cycles`, with :attr:`tasks` tasks at once; the reply
        also has ``threads`` (the most threads the process had)."""
        assert self._runner is not None, "open first"
        return self._runner.run(self._run(prefix, start_at, windows, max_cycles))

    async def _run(self, prefix: str, start_at: float, windows: Windows,
                   max_cycles: int) -> dict[str, Any]:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        done = [0]
        threads = [threading.active_count()]
        running = [True]

        async def task(k: int) -> None:
            i = 0
            while running[0] and done[0] < max_cycles:
                await self._cycle(f"{prefix}-t{k}-{i}")
                i += 1
                done[0] += 1
                if not windows.record(time.monotonic()):
                    running[0] = False
            threads[0] = max(threads[0], threading.active_count())

        await asyncio.gather(*(task(k) for k in range(self.tasks)))
        return {**windows.as_dict(), "threads": threads[0]}

    def close(self) -> None:
        if self._runner is None:
            return
        try:
            self._runner.run(self._close())
        finally:
            self._runner.close()
            self._runner = None

    async def _close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._store is not None:
            await self._store.close()
            self._store = None
