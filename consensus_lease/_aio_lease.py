"""The asyncio view of a lease (:class:`AsyncLease`, which :mod:`consensus_lease.aio`
hands out) and the flag its waits await (:class:`Wake`), below the asyncio sessions and
the asyncio elections (:mod:`consensus_lease._aio_election`), which build on both.

As everywhere in :mod:`consensus_lease.aio`, nothing is re-implemented: each round trip
is the synchronous :class:`~consensus_lease.Lease` method run on the store's pool
(``AsyncLeaseStore.workers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from .errors import InvalidArgument, LeaseLost
from .lease import Lease
from .record import ClaimResult, LeaseRecord
from .states import LeaseState
from .transaction import LeaseTransaction

if TYPE_CHECKING:
    from .aio import AsyncSession

__all__ = ["AsyncLease", "Wake"]

T = TypeVar("T")


class Wake:
    """A flag set from any thread (a subscription callback, ``session.close()``) and
    awaited on the event loop. Setting it again before :meth:`clear` costs nothing."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()
        self._lock = threading.Lock()
        self._scheduled = False

    def __call__(self) -> None:
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._event.set)

    def clear(self) -> None:
        with self._lock:
            self._scheduled = False
        self._event.clear()

    async def wait(self, timeout_s: float | None) -> None:
        """Until set, or ``timeout_s`` seconds passed (``None``: no limit)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._event.wait()


class AsyncLease:
    """An asyncio view of a :class:`~consensus_lease.Lease`: the same attributes, and
    coroutines for its round trips (same arguments and errors).

    Attributes:
        sync: the underlying :class:`~consensus_lease.Lease`.
        session: the :class:`AsyncSession` it was claimed from.
    """

    def __init__(self, lease: Lease, session: AsyncSession) -> None:
        self.sync = lease
        self.session = session

    @property
    def job_id(self) -> str:
        return self.sync.job_id

    @property
    def generation(self) -> int:
        """The fencing token (see :attr:`Lease.generation`)."""
        return self.sync.generation

    @property
    def fencing_token(self) -> int:
        return self.sync.fencing_token

    @property
    def attempt(self) -> int:
        """See :attr:`Lease.attempt`."""
        return self.sync.attempt

    @property
    def payload(self) -> bytes | None:
        """The queue payload, for leases from ``claim_next``; ``None`` otherwise."""
        return self.sync.payload

    @property
    def queue(self) -> str | None:
        """The work queue, for leases from ``claim_next``; ``None`` otherwise."""
        return self.sync.queue

    @property
    def owner(self) -> str:
        return self.sync.owner

    @property
    def claim_result(self) -> ClaimResult:
        return self.sync.claim_result

    @property
    def granted_ttl_s(self) -> float:
        return self.sync.granted_ttl_s

    @property
    def deadline(self) -> float:
        """See :attr:`Lease.deadline` (monotonic seconds)."""
        return self.sync.deadline

    @property
    def state(self) -> LeaseState:
        return self.sync.state

    @property
    def lost_reason(self) -> LeaseLost | None:
        return self.sync.lost_reason

    def remaining_s(self) -> float:
        return self.sync.remaining_s()

    def ensure_held(self) -> None:
        """Local check, no I/O: see :meth:`Lease.ensure_held`."""
        self.sync.ensure_held()

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self.session.store.workers.run(fn)

    async def renew(self) -> None:
        """See :meth:`Lease.renew` (same errors)."""
        await self._run(self.sync.renew)

    async def complete(self, result: bytes = b"") -> LeaseRecord:
        """See :meth:`Lease.complete` (same errors)."""
        return await self._run(partial(self.sync.complete, result))

    async def release(self) -> None:
        """See :meth:`Lease.release` (same errors)."""
        await self._run(self.sync.release)

    async def complete_and_claim_next(
        self, result: bytes = b"", queue: str | None = None
    ) -> tuple[LeaseRecord, AsyncLease | None]:
        """See :meth:`Lease.complete_and_claim_next` (same arguments and errors). If the
        caller is cancelled while the request runs, the completion still lands and a
        lease it claimed is released off the loop."""
        workers = self.session.store.workers

        def orphan(done: tuple[LeaseRecord, Lease | None]) -> None:
            workers.release_later(done[1])

        record, lease = await workers.limited(
            partial(self.sync.complete_and_claim_next, result, queue), orphan)
        return record, None if lease is None else AsyncLease(lease, self.session)

    async def fail(
        self, error: str | BaseException, retry_in_s: float | None = None
    ) -> LeaseRecord:
        """See :meth:`Lease.fail` (same arguments and errors)."""
        return await self._run(partial(self.sync.fail, error, retry_in_s))

    async def run_in_transaction(
        self, conn: object, block: Callable[[LeaseTransaction], T], *,
        lock_timeout_s: float | None = None,
    ) -> T:
        """asyncio's :meth:`Lease.transaction`: run ``block(tx)`` inside
        ``with lease.transaction(conn, lock_timeout_s=...) as tx:`` on one of the store's
        threads, and return what it returns::

            def charge(tx: LeaseTransaction) -> bool:
                if not tx.once("charge"):   # a generation of this job already did it
                    return False
                conn.execute("INSERT INTO charges VALUES (%s, %s)", (job_id, amount))
                return True

            charged = await lease.run_in_transaction(conn, charge)

        ``conn`` is the same *synchronous* connection as for :meth:`Lease.transaction`
        (``psycopg.Connection``, ``sqlite3.Connection``) and ``block`` a plain function:
        the transaction's statements block, so they run on the thread, never on the event
        loop. There is no ``async with lease.transaction(...)``: that would run them on
        the loop. Use ``conn`` from one task at a time (one connection per task, or a pool).
        Guarantees (per generation, and per job with ``tx.once``), errors and the lease's
        state after each are those of :meth:`Lease.transaction`; an exception from
        ``block`` rolls the transaction back and is raised here.

        Cancelling the awaiting task does not stop ``block``: it runs to its end on the
        thread, and the transaction commits (or rolls back) there; the cancellation is
        raised at once (read the effects back if you must know).

        Raises:
            InvalidArgument: ``block`` is not a plain callable (an ``async def`` would
                never run inside the transaction: checked before anything is sent), or it
                returned an awaitable (the transaction is rolled back); still held.
            LeaseError: what :meth:`Lease.transaction` raises (``UnsupportedOperation``,
                ``InvalidArgument``, ``StaleLeaseError`` / ``SessionExpired``,
                ``BackendUnavailable`` ...), with the same state of the lease after it.
            Exception: what ``block`` raises, after the rollback.
        """
        if not callable(block) or inspect.iscoroutinefunction(block):
            raise InvalidArgument(
                f"run_in_transaction(conn, block): block must be a plain function "
                f"block(tx) -> result, run on a thread inside the transaction, not {block!r}"
                " (an async def would never run there)",
                job_id=self.job_id, generation=self.generation,
            )

        def run() -> T:
            with self.sync.transaction(conn, lock_timeout_s=lock_timeout_s) as tx:
                result = block(tx)
                if inspect.isawaitable(result):  # rolled back: nothing of it ran
                    if inspect.iscoroutine(result):
                        result.close()
                    raise InvalidArgument(
                        "run_in_transaction: block returned an awaitable; it must do its "
                        "statements itself (a plain function); rolled back",
                        job_id=self.job_id, generation=self.generation,
                    )
                return result

        return await self._run(run)

    @asynccontextmanager
    async def guard(self) -> AsyncIterator[AsyncLease]:
        """Run the body only while the lease is held; cancel it if the lease is lost.

        Raises:
            LeaseLost: on entry if already lost, or when the lease was lost while the
                body ran — the store refused it, or its session was lost or closed, or its
                store closed (the body was cancelled; the lease is LOST).
            LeaseSuspended: on entry if the session is suspended.
        """
        self.sync.ensure_held()
        task = asyncio.current_task()
        assert task is not None, "guard() must run inside a task"
        loop = asyncio.get_running_loop()
        fired: list[LeaseLost] = []

        def on_lost(_lease: Lease, reason: LeaseLost) -> None:
            if not fired:
                fired.append(reason)
                loop.call_soon_threadsafe(task.cancel)

        # The lease's own loss: the store refused it, its session was lost or closed, or
        # its store was closed (not its completion or release by the body itself).
        unregister = self.sync.on_lost(on_lost)
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
        await self._run(partial(self.sync.__exit__, exc_type, exc, tb))
