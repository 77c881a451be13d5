"""asyncio API over the same protocol core.

Nothing here re-implements the protocol: each coroutine runs the synchronous method of
:class:`~consensus_lease.Session` / :class:`~consensus_lease.Lease` in a worker thread
(``asyncio.to_thread``), so the checks, deadlines and error translation are exactly those
of the sync API. What asyncio adds is delivering lease loss as **cancellation**::

    async with await AsyncLeaseStore.open("etcd://127.0.0.1:2379/jobs") as store:
        async with store.session(ttl_s=10) as session:
            lease = await session.claim("invoice-42", wait_s=30)
            async with lease.guard():           # cancelled if the lease is lost
                await do_the_work(token=lease.generation)
                await lease.complete(b"done")

If the session is lost while the body of ``guard()`` runs (the store expired it, or the
local deadline passed without renewal), the body is cancelled at its next ``await`` and
``guard()`` raises :class:`~consensus_lease.LeaseLost` instead of ``CancelledError``, so a
worker cannot keep producing effects by forgetting to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

from .errors import LeaseError, LeaseLost
from .lease import Lease
from .record import LeaseRecord, QueueStats
from .session import Session
from .states import LeaseState
from .store import LeaseStore, open_store

__all__ = ["AsyncLease", "AsyncLeaseStore", "AsyncSession"]


def _release_quietly(lease: Lease) -> None:
    with contextlib.suppress(LeaseError):
        lease.release()  # best effort: if it fails, the TTL frees the job


async def _in_thread_or_release(claim: Callable[[], Lease | None]) -> Lease | None:
    """Run a claim in a worker thread. If the awaiting task is cancelled first, release
    whatever lease the thread still obtains (a claim cannot be stopped mid-request)."""
    future = asyncio.get_running_loop().run_in_executor(None, claim)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:

        def release_orphan(done: asyncio.Future[Lease | None]) -> None:
            if done.cancelled() or done.exception() is not None:
                return
            orphan = done.result()
            if orphan is not None:  # release off the event loop: it is a store round trip
                threading.Thread(target=_release_quietly, args=(orphan,), daemon=True).start()

        future.add_done_callback(release_orphan)
        raise


class AsyncLease:
    """An asyncio view of a :class:`~consensus_lease.Lease`.

    Attributes:
        sync: the underlying :class:`~consensus_lease.Lease`.
    """

    def __init__(self, lease: Lease) -> None:
        self.sync = lease

    job_id = property(lambda self: self.sync.job_id)
    generation = property(lambda self: self.sync.generation)
    fencing_token = property(lambda self: self.sync.generation)
    owner = property(lambda self: self.sync.owner)
    deadline = property(lambda self: self.sync.deadline)

    @property
    def attempt(self) -> int:
        """See :attr:`Lease.attempt`."""
        return self.sync.attempt

    @property
    def payload(self) -> bytes | None:
        """See :attr:`Lease.payload`."""
        return self.sync.payload

    @property
    def state(self) -> LeaseState:
        return self.sync.state

    def remaining_s(self) -> float:
        return self.sync.remaining_s()

    def ensure_held(self) -> None:
        """Local check, no I/O: see :meth:`Lease.ensure_held`."""
        self.sync.ensure_held()

    async def renew(self) -> None:
        """See :meth:`Lease.renew` (same errors)."""
        await asyncio.to_thread(self.sync.renew)

    async def complete(self, result: bytes = b"") -> LeaseRecord:
        """See :meth:`Lease.complete` (same errors)."""
        return await asyncio.to_thread(self.sync.complete, result)

    async def release(self) -> None:
        """See :meth:`Lease.release` (same errors)."""
        await asyncio.to_thread(self.sync.release)

    async def fail(
        self, error: str | BaseException, retry_in_s: float | None = None
    ) -> LeaseRecord:
        """See :meth:`Lease.fail` (same arguments and errors)."""
        return await asyncio.to_thread(self.sync.fail, error, retry_in_s)

    @asynccontextmanager
    async def guard(self) -> AsyncIterator[AsyncLease]:
        """Run the body only while the lease is held; cancel it if the lease is lost.

        Raises:
            LeaseLost: on entry if already lost, or when the session was lost while the
                body ran (the body was cancelled; the lease is LOST).
            LeaseSuspended: on entry if the session is suspended.
        """
        self.sync.ensure_held()
        task = asyncio.current_task()
        assert task is not None, "guard() must run inside a task"
        loop = asyncio.get_running_loop()
        fired: list[LeaseLost] = []

        def on_lost(_session: Session, reason: LeaseLost) -> None:
            if not fired:
                fired.append(reason)
                loop.call_soon_threadsafe(task.cancel)

        unregister = self.sync.session.on_lost(on_lost)
        try:
            yield self
        except asyncio.CancelledError:
            if fired and task.uncancel() == 0:
                raise LeaseLost(
                    f"lease on {self.job_id!r} generation {self.generation} lost while its "
                    f"work ran: {fired[0]}",
                    job_id=self.job_id,
                    generation=self.generation,
                ) from fired[0]
            raise
        finally:
            unregister()

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """As :meth:`Lease.__exit__`: release unless completed."""
        await asyncio.to_thread(self.sync.__exit__, exc_type, exc, tb)


class AsyncSession:
    """An asyncio view of a :class:`~consensus_lease.Session`."""

    def __init__(self, session: Session) -> None:
        self.sync = session

    session_id = property(lambda self: self.sync.session_id)
    owner = property(lambda self: self.sync.owner)
    granted_ttl_s = property(lambda self: self.sync.granted_ttl_s)

    @property
    def state(self) -> Any:
        return self.sync.state

    async def claim(self, job_id: str, *, wait_s: float | None = None) -> AsyncLease | None:
        """See :meth:`Session.claim` (same arguments and errors).

        If this coroutine is cancelled while the claim is still running in its thread,
        a lease the thread obtains afterwards is released at once: nobody holds a job
        that no caller received."""
        lease = await _in_thread_or_release(lambda: self.sync.claim(job_id, wait_s=wait_s))
        return None if lease is None else AsyncLease(lease)

    async def claim_next(self, queue: str, *, wait_s: float | None = None) -> AsyncLease | None:
        """See :meth:`Session.claim_next`; cancellation as for :meth:`claim`."""
        lease = await _in_thread_or_release(lambda: self.sync.claim_next(queue, wait_s=wait_s))
        return None if lease is None else AsyncLease(lease)

    async def claim_many(self, job_ids: Sequence[str]) -> list[AsyncLease | None]:
        """See :meth:`Session.claim_many`."""
        leases = await asyncio.to_thread(self.sync.claim_many, job_ids)
        return [None if lease is None else AsyncLease(lease) for lease in leases]

    async def keepalive(self) -> float:
        return await asyncio.to_thread(self.sync.keepalive)

    async def wait_lost(self) -> LeaseLost | None:
        """Wait until the session is lost; return the reason (``None`` if closed)."""
        await asyncio.to_thread(self.sync.lost.wait)
        return self.sync.lost_reason

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _SessionOpener:
    """``store.session(...)`` is both awaitable and an async context manager."""

    def __init__(self, store: LeaseStore, kwargs: dict[str, Any]) -> None:
        self._store = store
        self._kwargs = kwargs
        self._session: AsyncSession | None = None

    def __await__(self) -> Any:
        return self._open().__await__()

    async def _open(self) -> AsyncSession:
        return AsyncSession(await asyncio.to_thread(self._store.session, **self._kwargs))

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._open()
        return self._session

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()


class AsyncLeaseStore:
    """An asyncio view of a :class:`~consensus_lease.LeaseStore`."""

    def __init__(self, store: LeaseStore) -> None:
        self.sync = store

    @classmethod
    async def open(cls, url: str, **kwargs: Any) -> AsyncLeaseStore:
        """See :func:`consensus_lease.open_store` (same arguments and errors)."""
        return cls(await asyncio.to_thread(open_store, url, **kwargs))

    def session(self, owner: str | None = None, ttl_s: float | None = None,
                **kwargs: Any) -> _SessionOpener:
        """``await store.session(...)`` or ``async with store.session(...) as s``; the
        arguments of :meth:`LeaseStore.session`."""
        if ttl_s is not None:
            kwargs["ttl_s"] = ttl_s
        return _SessionOpener(self.sync, {"owner": owner, **kwargs})

    async def get(self, job_id: str) -> LeaseRecord | None:
        return await asyncio.to_thread(self.sync.get, job_id)

    async def enqueue(
        self, queue: str, job_id: str, payload: bytes = b"", *, max_attempts: int | None = None
    ) -> bool:
        """See :meth:`LeaseStore.enqueue`."""
        return await asyncio.to_thread(
            lambda: self.sync.enqueue(queue, job_id, payload, max_attempts=max_attempts)
        )

    async def requeue(self, job_id: str) -> LeaseRecord:
        """See :meth:`LeaseStore.requeue`."""
        return await asyncio.to_thread(self.sync.requeue, job_id)

    async def queue_stats(self, queue: str) -> QueueStats:
        return await asyncio.to_thread(self.sync.queue_stats, queue)

    async def purge(self, queue: str) -> int:
        return await asyncio.to_thread(self.sync.purge, queue)

    async def records(self, limit: int | None = None) -> list[LeaseRecord]:
        return await asyncio.to_thread(self.sync.records, limit)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncLeaseStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
