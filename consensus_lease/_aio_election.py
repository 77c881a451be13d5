"""Leader election for asyncio: the leadership (:class:`AsyncLeadership`) and the
leader watch (:class:`AsyncLeaderWatch`) that :mod:`consensus_lease.aio` hands out.

As everywhere in :mod:`consensus_lease.aio`, nothing is re-implemented: round trips are
the synchronous methods run on the store's pool, and the watch decides what to report
with the same :class:`~consensus_lease.leader_watch.LeaderChanges` as ``store.watch_leader``.
Waiting for a change holds no thread: the subscription's callback completes a future.
"""

from __future__ import annotations

import asyncio
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING

from ._aio_lease import AsyncLease, Wake
from ._election import election_key
from .election import LeaderRecord, Leadership, require_elections
from .errors import StoreClosed
from .leader_watch import LeaderChanges
from .validation import check_election_name, check_wait

if TYPE_CHECKING:
    from ._subscriptions import Unsubscribe
    from .aio import AsyncLeaseStore, AsyncSession

__all__ = ["AsyncLeaderWatch", "AsyncLeadership"]


class AsyncLeadership(AsyncLease):
    """An asyncio view of a :class:`~consensus_lease.Leadership` (what
    ``AsyncSession.campaign`` returns): the attributes and round trips of
    :class:`~consensus_lease.aio.AsyncLease` — ``guard()`` cancels its body when the
    leadership is lost — plus :attr:`name`, :attr:`value`, :meth:`resign` and
    :meth:`proclaim`. ``complete`` and ``fail`` raise ``InvalidArgument``.

    Attributes:
        sync: the underlying :class:`~consensus_lease.Leadership`.
    """

    sync: Leadership

    def __init__(self, leadership: Leadership, session: AsyncSession) -> None:
        super().__init__(leadership, session)
        self.sync = leadership

    @property
    def name(self) -> str:
        """The election's name."""
        return self.sync.name

    @property
    def value(self) -> bytes:
        """The value this leader announced (see :attr:`Leadership.value`)."""
        return self.sync.value

    async def resign(self) -> None:
        """See :meth:`Leadership.resign` (same errors)."""
        await self._run(self.sync.resign)

    async def proclaim(self, value: bytes) -> None:
        """See :meth:`Leadership.proclaim` (same errors)."""
        await self._run(partial(self.sync.proclaim, value))

    async def __aenter__(self) -> AsyncLeadership:
        return self


class AsyncLeaderWatch:
    """What ``AsyncLeaseStore.watch_leader(name)`` returns: an async iterator of the leader
    now (:class:`~consensus_lease.LeaderRecord` or ``None``) and then of each change,
    exactly as :class:`~consensus_lease.LeaderWatch` (same ends: ``timeout_s``,
    :meth:`aclose` or :meth:`close`, the store's close). An async context manager.

    Raises (from ``__anext__``):
        BackendUnavailable: a read failed; the watch stays usable.
    """

    def __init__(self, store: AsyncLeaseStore, name: str, timeout_s: float | None) -> None:
        store.sync.check_open()
        check_election_name(name)
        require_elections(store.sync.backend)
        self._store = store
        self._name = name
        self._timeout_s = None if timeout_s is None else check_wait(timeout_s, "timeout_s")
        self._give_up: float | None = None
        self._changes = LeaderChanges()
        self._wake: Wake | None = None
        self._undo: list[Unsubscribe] = []
        self._closed = False

    def __aiter__(self) -> AsyncLeaderWatch:
        return self

    async def _start(self) -> Wake:
        """Subscribe (on the pool: a store may read once to start its watch)."""
        loop = asyncio.get_running_loop()
        self._wake = wake = Wake(loop)
        if self._timeout_s is not None:
            self._give_up = loop.time() + self._timeout_s
        self._undo.append(self._store.sync.watchers.add(wake))
        backend = self._store.sync.backend
        unsubscribe = await self._store.workers.run(
            partial(backend.subscribe_job, election_key(self._name), wake))
        if self._closed:  # closed while subscribing
            unsubscribe()
        else:
            self._undo.append(unsubscribe)
        return wake

    async def __anext__(self) -> LeaderRecord | None:
        wake = self._wake or await self._start()
        loop = asyncio.get_running_loop()
        while True:
            if self._closed or self._store.sync.closed:
                self.close()
                raise StopAsyncIteration
            wake.clear()
            try:
                record = await self._store.workers.run(
                    partial(self._store.sync.leader, self._name))
            except StoreClosed:
                self.close()
                raise StopAsyncIteration from None
            if self._changes.accept(record):
                return record
            left = None if self._give_up is None else self._give_up - loop.time()
            if left is not None and left <= 0:
                self.close()
                raise StopAsyncIteration
            await wake.wait(left)

    def close(self) -> None:
        """Stop watching: cancel the subscription; the iteration ends (a waiting
        ``__anext__`` returns at once). Idempotent; any thread."""
        if self._closed:
            return
        self._closed = True
        undo, self._undo = self._undo, []
        for step in undo:
            step()
        if self._wake is not None:
            self._wake()

    async def aclose(self) -> None:
        """As :meth:`close`."""
        self.close()

    async def __aenter__(self) -> AsyncLeaderWatch:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

