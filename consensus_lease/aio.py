"""asyncio API over the same protocol core.

Nothing here re-implements the protocol: each store round trip is the synchronous method
of :class:`~consensus_lease.Session` / :class:`~consensus_lease.Lease` run on a worker
thread, so the checks, deadlines and error translation are exactly those of the sync API.
What asyncio adds is waiting without threads, and delivering lease loss as
**cancellation**::

    async with await open_store("etcd://127.0.0.1:2379/jobs") as store:
        async with store.session(ttl_s=10) as session:
            lease = await session.claim("invoice-42", wait_s=30)
            async with lease.guard():           # cancelled if the lease is lost
                await do_the_work(token=lease.generation)
                await lease.complete(b"done")

Threads. Round trips run on a pool of ``threads`` threads that the
:class:`AsyncLeaseStore` owns (``open_store(url, threads=8)``; never the event loop's
default executor; ended by ``close()``). Every other keyword of :func:`open_store` is the
store's, as in :func:`consensus_lease.open_store`: ``pool_size`` is the PostgreSQL store's
connection pool there too, and a store without such an option refuses it.

A *waiting* claim holds none of the threads while it waits: it subscribes to the job or
queue (:meth:`Backend.subscribe_job`) and awaits a future that the subscription's
callback, the session's end or the deadline completes; only its claim attempts run on the
pool, one at a time per waiting claim. Claim attempts use at most ``threads - 2`` (at
least 1) threads at once, so ``renew``, ``complete``, ``release`` and ``fail`` never queue
behind claims, however many claims wait (two threads stay theirs, one with
``threads=2``; they share them with each other and the store's reads); and the re-tries of
woken waiting claims use at most half of the claim threads, so a new claim does not queue
behind them. Thousands of waiting claims
cost no thread and do not delay lease operations.

Loss. If the session is lost while the body of ``guard()`` runs (the store expired it,
or the local deadline passed without renewal), the body is cancelled at its next
``await`` and ``guard()`` raises :class:`~consensus_lease.LeaseLost` instead of
``CancelledError``, so a worker cannot keep producing effects by forgetting to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Never, TypeVar

from ._aio_election import AsyncLeadership, AsyncLeaderWatch
from ._aio_lease import AsyncLease, Wake
from ._callbacks import check_callback, run_callback
from ._election import election_key
from ._subscriptions import Unsubscribe
from ._waiting import Subscribe, check_usable, closing_aware
from .backend import Capabilities
from .clock import Clock
from .election import LeaderRecord
from .errors import ClaimTimeout, InvalidArgument, LeaseError, LeaseLost, StoreClosed
from .lease import Lease
from .observe import Observer
from .record import EnqueueItem, LeaseRecord, QueuedJob, QueueStats
from .retry import RetryPolicy
from .session import Session
from .states import SessionState
from .store import DEFAULT_TTL_S, LeaseStore
from .store import open_store as open_sync_store
from .validation import check_election_name, check_job_id, check_queue_name, check_wait

__all__ = [
    "DEFAULT_THREADS",
    "RESERVED_THREADS",
    "AsyncLeaderWatch",
    "AsyncLeadership",
    "AsyncLease",
    "AsyncLeaseStore",
    "AsyncSession",
    "open_store",
]

T = TypeVar("T")
LeaseT = TypeVar("LeaseT", bound=Lease)

DEFAULT_THREADS = 8
"""Threads of an :class:`AsyncLeaseStore`'s pool unless ``threads`` says otherwise."""

RESERVED_THREADS = 2
"""Threads of the pool that claim attempts never use: kept for lease operations."""

MAX_THREADS = 1024
"""Most threads an :class:`AsyncLeaseStore`'s pool may have."""


def check_threads(threads: object) -> int:
    """``threads`` as an int from 2 to :data:`MAX_THREADS`, else ``InvalidArgument``."""
    if isinstance(threads, bool) or not isinstance(threads, int) or not (
        2 <= threads <= MAX_THREADS
    ):
        raise InvalidArgument(
            f"threads (the asyncio adapter's thread pool) must be an int from 2 to "
            f"{MAX_THREADS}, not {threads!r}"
        )
    return threads


def _named_for_threads(exc: InvalidArgument, options: dict[str, object]) -> InvalidArgument:
    """``exc``, or, when the store refused ``pool_size`` as unknown, ``exc`` with a hint:
    the asyncio adapter's thread pool is ``threads``, not ``pool_size``."""
    text = str(exc)
    if "pool_size" not in options or not text.startswith("unknown") or "pool_size" not in text:
        return exc
    return InvalidArgument(
        f"{text} (pool_size is a store option: the PostgreSQL connection pool; the asyncio "
        "adapter's thread pool is threads=)"
    )


def _unknown_arguments(unknown: Mapping[str, object]) -> InvalidArgument:
    """The refusal of ``AsyncLeaseStore(store, **unknown)``; ``pool_size`` gets the hint
    of :func:`_named_for_threads`."""
    names = ", ".join(sorted(unknown))
    text = f"unknown argument(s) of AsyncLeaseStore: {names} (it takes store and threads=)"
    if "pool_size" in unknown:
        text += (" (pool_size is a store option: the PostgreSQL connection pool, given to "
                 "open_store when the store is opened; the asyncio adapter's thread pool "
                 "is threads=)")
    return InvalidArgument(text)


# -- the pool ------------------------------------------------------------------------


def _release_quietly(lease: Lease) -> None:
    with contextlib.suppress(LeaseError):
        lease.release()  # best effort: if it fails, the TTL frees the job


class Workers:
    """An :class:`AsyncLeaseStore`'s threads, and the limit on claim attempts."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._executor = ThreadPoolExecutor(size, thread_name_prefix="consensus-lease-aio")
        claim_slots = max(1, size - RESERVED_THREADS)
        self._claim_slots = asyncio.Semaphore(claim_slots)
        self._retry_slots = asyncio.Semaphore(max(1, claim_slots // 2))
        self._shut = False

    def _submit(self, fn: Callable[[], T]) -> Future[T]:
        if self._shut:
            raise StoreClosed("this AsyncLeaseStore is closed; open a new one")
        return self._executor.submit(contextvars.copy_context().run, fn)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run one round trip (a lease operation, a read ...) on the pool."""
        return await asyncio.wrap_future(self._submit(fn))

    async def retry(self, fn: Callable[[], T], orphan: Callable[[T], None]) -> T:
        """As :meth:`limited`, for a waiting claim's re-try: at most half the claim
        slots re-try at once, so that new claims never queue behind a crowd of woken
        waiters (a store without change notification wakes them all at every poll)."""
        async with self._retry_slots:
            return await self.limited(fn, orphan)

    async def limited(self, fn: Callable[[], T], orphan: Callable[[T], None]) -> T:
        """Run a claim step on one of the claim slots. The slot stays taken until the
        thread is done, also when the caller is cancelled first: then ``orphan`` gets,
        on the pool's thread, what the thread still returns (a claim cannot be stopped
        mid-request)."""
        await self._claim_slots.acquire()
        try:
            future = self._submit(fn)
            result = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            loop = asyncio.get_running_loop()
            future.add_done_callback(partial(self._late, loop, orphan))
            raise
        except BaseException:
            self._claim_slots.release()
            raise
        self._claim_slots.release()
        return result

    def _late(self, loop: asyncio.AbstractEventLoop, orphan: Callable[[T], None],
              done: Future[T]) -> None:
        """A claim step whose caller was cancelled ended: free its slot, hand over what
        it obtained."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: no slot to free
            loop.call_soon_threadsafe(self._claim_slots.release)
        if not done.cancelled() and done.exception() is None:
            orphan(done.result())

    def release_later(self, lease: Lease | None) -> None:
        """Release a lease nobody received, off the event loop."""
        if lease is None:
            return
        try:
            self._executor.submit(_release_quietly, lease)
        except RuntimeError:  # the pool is shut down: one short-lived thread instead
            threading.Thread(target=_release_quietly, args=(lease,), daemon=True).start()

    def shutdown(self) -> None:
        """Refuse new work; idle threads end (running round trips finish first)."""
        self._shut = True
        self._executor.shutdown(wait=False)


async def _wait_and_claim(
    session: AsyncSession, subscribe: Subscribe, attempt: Callable[[], LeaseT | None],
    wait_s: float, timed_out: Callable[[], ClaimTimeout],
) -> LeaseT:
    """The steps of :func:`consensus_lease._waiting.wait_and_claim` on the event loop:
    try; subscribe; then try again each time the subscription (or the session's end)
    wakes us, one attempt at a time, until ``wait_s`` seconds passed."""
    workers, sync = session.store.workers, session.sync
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + wait_s
    attempt = closing_aware(sync, attempt)
    check_usable(sync)
    lease = await workers.limited(attempt, workers.release_later)
    if lease is not None:
        return lease
    if loop.time() >= give_up_at:
        raise timed_out()
    wake = Wake(loop)
    remove = sync.waiters.add(wake)
    try:
        unsubscribe: Unsubscribe = await workers.limited(partial(subscribe, wake), _call)
        try:
            while True:
                wake.clear()
                check_usable(sync)
                lease = await workers.retry(attempt, workers.release_later)
                if lease is not None:
                    return lease
                left = give_up_at - loop.time()
                if left <= 0:
                    raise timed_out()
                await wake.wait(left)
        finally:
            unsubscribe()
    finally:
        remove()


def _call(fn: Callable[[], None]) -> None:
    fn()


# -- sessions ------------------------------------------------------------------------

AsyncLossCallback = Callable[["AsyncSession", LeaseLost], object]
"""``callback(session, reason)``, run on the event loop when the session is lost."""


def _sync_items(items: object, call: str) -> Any:
    """The items of a batch ending (``AsyncSession.complete_many`` ...: leases, or
    tuples whose first element is a lease) with each :class:`AsyncLease` replaced by its
    sync lease (also leading a tuple or list of a shape the call refuses, so the sync
    call's refusal names its job); a sync :class:`Lease` is ``InvalidArgument`` naming
    its index. Anything else is passed on as it is, for the sync call to name (checked
    before anything is sent)."""
    if (isinstance(items, (str, bytes, bytearray, memoryview))
            or not isinstance(items, Sequence)):
        return items
    out: list[Any] = []
    for index, item in enumerate(items):
        given: Any = item  # checked here: the type says what is meant, not what came
        # a tuple or list led by a lease, of any length: the sync call names its shape
        # and the lease in it
        whole = isinstance(given, (tuple, list)) and len(given) > 0
        lease = given[0] if whole else given
        if isinstance(lease, AsyncLease):
            if not whole:
                out.append(lease.sync)
            else:  # a list stays one, for the sync call to name
                out.append([lease.sync, *given[1:]] if isinstance(given, list)
                           else (lease.sync, *given[1:]))
            continue
        if isinstance(lease, Lease):  # a sync lease: its async twin is the caller's
            raise InvalidArgument(
                f"item {index}: lease on {lease.job_id!r}: AsyncSession.{call}() takes "
                f"AsyncLease objects, got a {type(lease).__name__} (pass the AsyncLease "
                "the claim returned)", job_id=lease.job_id, generation=lease.generation)
        # not a lease: the sync call names it by its index and shape (nothing sent)
        out.extend(list(items)[index:])
        break
    return out


class AsyncSession:
    """An asyncio view of a :class:`~consensus_lease.Session`.

    Attributes:
        sync: the underlying :class:`~consensus_lease.Session`.
        store: the :class:`AsyncLeaseStore` whose pool runs its round trips.
    """

    def __init__(self, session: Session, store: AsyncLeaseStore) -> None:
        self.sync = session
        self.store = store

    @property
    def session_id(self) -> str:
        return self.sync.session_id

    @property
    def owner(self) -> str:
        return self.sync.owner

    @property
    def granted_ttl_s(self) -> float:
        return self.sync.granted_ttl_s

    @property
    def safety_margin_s(self) -> float:
        return self.sync.safety_margin_s

    @property
    def deadline(self) -> float:
        return self.sync.deadline

    @property
    def state(self) -> SessionState:
        return self.sync.state

    @property
    def lost_reason(self) -> LeaseLost | None:
        return self.sync.lost_reason

    def remaining_s(self) -> float:
        return self.sync.remaining_s()

    def ensure_alive(self) -> None:
        """Local check, no I/O: see :meth:`Session.ensure_alive`."""
        self.sync.ensure_alive()

    def leases(self) -> list[AsyncLease]:
        """The leases this session holds now."""
        return [AsyncLease(lease, self) for lease in self.sync.leases()]

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"

    def on_lost(self, callback: AsyncLossCallback) -> Callable[[], None]:
        """Register ``callback(session, reason)``, run once on the running event loop
        when the session is lost (soon, if it already is). Call from a coroutine.

        An exception from the callback is logged at ERROR on
        ``consensus_lease.callbacks`` (on stderr when logging is not configured) and
        counted (``Observer.callback_failed``).

        Returns:
            A function that unregisters it.

        Raises:
            InvalidArgument: not a callable, an ``async def`` (called, never
                awaited, it would never run: see :mod:`consensus_lease.aio`), or one that
                cannot be called with two
                positional arguments (its signature); nothing registered.
        """
        check_callback(callback, 2, "AsyncSession.on_lost", "callback(session, reason)")
        loop = asyncio.get_running_loop()
        sync = self.sync

        def relay(_session: Session, reason: LeaseLost) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(partial(
                    run_callback, callback, (self, reason), "AsyncSession.on_lost",
                    sync.observer, sync.backend.scheme, session_id=sync.session_id))

        return self.sync.on_lost(relay)

    async def claim(self, job_id: str, *, wait_s: float | None = None) -> AsyncLease | None:
        """See :meth:`Session.claim` (same arguments and errors). Waiting holds no
        thread; ``close()`` ends it at once with ``LeaseLost``.

        If this coroutine is cancelled while a claim attempt is running on its thread,
        a lease the attempt obtains afterwards is released at once: nobody holds a job
        that no caller received."""
        check_job_id(job_id)
        attempt = partial(self.sync.claim, job_id)
        workers = self.store.workers
        if wait_s is None:
            lease = await workers.limited(attempt, workers.release_later)
        else:
            wait = check_wait(wait_s)
            lease = await _wait_and_claim(
                self, partial(self.sync.backend.subscribe_job, job_id), attempt, wait,
                lambda: ClaimTimeout(f"{job_id!r} still held after waiting {wait} s",
                                     job_id=job_id),
            )
        return None if lease is None else AsyncLease(lease, self)

    async def claim_next(self, queue: str, *, wait_s: float | None = None) -> AsyncLease | None:
        """See :meth:`Session.claim_next`; waiting and cancellation as for :meth:`claim`.

        Raises:
            ClaimTimeout: ``wait_s`` passed with no job of ``queue`` claimable.
            LeaseError: the other errors of :meth:`Session.claim_next`.
        """
        check_queue_name(queue)
        attempt = partial(self.sync.claim_next, queue)
        workers = self.store.workers
        if wait_s is None:
            lease = await workers.limited(attempt, workers.release_later)
        else:
            wait = check_wait(wait_s)
            lease = await _wait_and_claim(
                self, partial(self.sync.backend.subscribe_queue, queue), attempt, wait,
                lambda: ClaimTimeout(f"no job of queue {queue!r} became claimable in {wait} s"),
            )
        return None if lease is None else AsyncLease(lease, self)

    async def claim_next_many(self, queue: str, n: int) -> list[AsyncLease]:
        """See :meth:`Session.claim_next_many` (same arguments, answers and errors; no
        waiting). Runs on one of the pool's claim threads; if this coroutine is cancelled
        while the claim runs, the leases it obtains afterwards are released at once:
        nobody holds a job that no caller received."""
        workers = self.store.workers

        def orphans(leases: list[Lease]) -> None:
            for lease in leases:
                workers.release_later(lease)

        leases = await workers.limited(partial(self.sync.claim_next_many, queue, n), orphans)
        return [AsyncLease(lease, self) for lease in leases]

    async def campaign(
        self, name: str, value: bytes = b"", *, wait_s: float | None = None
    ) -> AsyncLeadership | None:
        """See :meth:`Session.campaign` (same arguments and errors); waiting holds no
        thread, and cancellation is as for :meth:`claim` (a leadership obtained by an
        attempt whose caller was cancelled is resigned at once). Use ``guard()`` on the
        result: its body is cancelled if the leadership is lost."""
        check_election_name(name)
        attempt = partial(self.sync.campaign, name, value)
        workers = self.store.workers
        if wait_s is None:
            leadership = await workers.limited(attempt, workers.release_later)
        else:
            wait = check_wait(wait_s)
            leadership = await _wait_and_claim(
                self, partial(self.sync.backend.subscribe_job, election_key(name)), attempt,
                wait, lambda: ClaimTimeout(
                    f"election {name!r} still led by another after waiting {wait} s",
                    job_id=election_key(name)),
            )
        return None if leadership is None else AsyncLeadership(leadership, self)

    async def claim_many(self, job_ids: Sequence[str]) -> list[AsyncLease | None]:
        """See :meth:`Session.claim_many`; cancellation as for :meth:`claim`."""
        workers = self.store.workers

        def orphans(leases: list[Lease | None]) -> None:
            for lease in leases:
                workers.release_later(lease)

        leases = await workers.limited(partial(self.sync.claim_many, job_ids), orphans)
        return [None if lease is None else AsyncLease(lease, self) for lease in leases]

    async def complete_many(
        self, leases: Sequence[AsyncLease | tuple[AsyncLease, bytes]]
    ) -> list[LeaseRecord | LeaseError]:
        """See :meth:`Session.complete_many` (same answers and errors), for this
        session's :class:`AsyncLease` objects."""
        items = _sync_items(leases, "complete_many")
        return await self.store.workers.run(partial(self.sync.complete_many, items))

    async def release_many(self, leases: Sequence[AsyncLease]) -> list[LeaseError | None]:
        """See :meth:`Session.release_many` (same answers and errors), for this
        session's :class:`AsyncLease` objects."""
        items = _sync_items(leases, "release_many")
        return await self.store.workers.run(partial(self.sync.release_many, items))

    async def fail_many(
        self, items: Sequence[tuple[AsyncLease, str | BaseException]
                              | tuple[AsyncLease, str | BaseException, float | None]],
    ) -> list[LeaseRecord | LeaseError]:
        """See :meth:`Session.fail_many` (same answers and errors), for this session's
        :class:`AsyncLease` objects."""
        synced = _sync_items(items, "fail_many")
        return await self.store.workers.run(partial(self.sync.fail_many, synced))

    async def keepalive(self) -> float:
        """See :meth:`Session.keepalive`."""
        return await self.store.workers.run(self.sync.keepalive)

    async def wait_lost(self) -> LeaseLost | None:
        """Wait, holding no thread, until the session is lost or closed; return the
        reason it was lost (``None`` if it was closed)."""
        wake = Wake(asyncio.get_running_loop())
        remove = self.sync.waiters.add(wake)
        unregister = self.sync.on_lost(lambda _session, _reason: wake())
        try:
            while True:
                wake.clear()
                if self.sync.state in (SessionState.LOST, SessionState.CLOSED) or \
                        self.sync.waiters.closed:
                    return self.sync.lost_reason
                await wake.wait(None)
        finally:
            unregister()
            remove()

    async def close(self) -> None:
        """See :meth:`Session.close`. Waiting claims of this session end at once with
        ``LeaseLost``."""
        self.sync.waiters.close()
        await self.store.workers.run(self.sync.close)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _SessionOpener:
    """``store.session(...)`` is both awaitable and an async context manager."""

    def __init__(self, store: AsyncLeaseStore, opener: Callable[[], Session]) -> None:
        self._store = store
        self._opener = opener
        self._session: AsyncSession | None = None

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self._open().__await__()

    async def _open(self) -> AsyncSession:
        return AsyncSession(await self._store.workers.run(self._opener), self._store)

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._open()
        return self._session

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()


# -- the store -----------------------------------------------------------------------


class AsyncLeaseStore:
    """An asyncio view of a :class:`~consensus_lease.LeaseStore`, with the thread pool
    that runs its round trips (see the module docstring).

    Args:
        store: the synchronous store.
        threads: threads of the pool (int, 2 to 1024; default
            :data:`DEFAULT_THREADS`); claim attempts use at most ``threads - 2`` of
            them at once (at least 1).

    Raises:
        InvalidArgument: bad ``threads``, or any other keyword argument (``pool_size``
            is a store option, given when the store is opened: the message says so);
            nothing is started.

    Attributes:
        sync: the underlying :class:`~consensus_lease.LeaseStore`.
    """

    def __init__(self, store: LeaseStore, *, threads: int = DEFAULT_THREADS,
                 **unknown: Never) -> None:
        if unknown:  # type checkers refuse them already (Never); say so at run time too
            raise _unknown_arguments(unknown)
        self._setup(store, Workers(check_threads(threads)))

    def _setup(self, store: LeaseStore, workers: Workers) -> None:
        self.sync = store
        self._workers = workers
        self._closed = False

    @classmethod
    async def open(
        cls, url: str, *, threads: int = DEFAULT_THREADS, clock: Clock | None = None,
        observer: Observer | None = None, retry: RetryPolicy | None = None,
        **options: object,
    ) -> AsyncLeaseStore:
        """See :func:`open_store`."""
        workers = Workers(check_threads(threads))
        try:
            store = await workers.run(partial(
                open_sync_store, url, clock=clock, observer=observer, retry=retry, **options))
        except InvalidArgument as exc:
            workers.shutdown()
            named = _named_for_threads(exc, options)
            if named is exc:
                raise
            raise named from exc
        except BaseException:
            workers.shutdown()
            raise
        opened = cls.__new__(cls)
        opened._setup(store, workers)
        return opened

    @property
    def capabilities(self) -> Capabilities:
        return self.sync.capabilities

    @property
    def threads(self) -> int:
        """Threads of this store's pool."""
        return self._workers.size

    @property
    def workers(self) -> Workers:
        """This store's thread pool, where every round trip of the store, its sessions
        and their leases runs: ``await store.workers.run(fn)`` runs ``fn`` on one of its
        threads (see the module docstring)."""
        return self._workers

    @property
    def closed(self) -> bool:
        """``True`` once this store or the :class:`LeaseStore` under it (``.sync``) was
        closed: then every call raises :class:`~consensus_lease.errors.StoreClosed`. A
        read of local state, no round trip."""
        return self._closed or self.sync.closed

    def session(
        self, owner: str | None = None, ttl_s: float = DEFAULT_TTL_S, *,
        safety_margin_s: float | None = None, keepalive: bool = True,
        clock: Clock | None = None,
    ) -> _SessionOpener:
        """``await store.session(...)`` or ``async with store.session(...) as s``; the
        arguments and errors of :meth:`LeaseStore.session`."""
        return _SessionOpener(self, partial(
            self.sync.session, owner, ttl_s, safety_margin_s=safety_margin_s,
            keepalive=keepalive, clock=clock))

    def set_retry_policy(self, queue: str, policy: RetryPolicy) -> None:
        """See :meth:`LeaseStore.set_retry_policy` (local: no I/O)."""
        self.sync.set_retry_policy(queue, policy)

    async def get(self, job_id: str) -> LeaseRecord | None:
        """See :meth:`LeaseStore.get`."""
        return await self._workers.run(partial(self.sync.get, job_id))

    async def records(self, limit: int | None = None) -> list[LeaseRecord]:
        """See :meth:`LeaseStore.records`."""
        return await self._workers.run(partial(self.sync.records, limit))

    async def leader(self, name: str) -> LeaderRecord | None:
        """See :meth:`LeaseStore.leader`."""
        return await self._workers.run(partial(self.sync.leader, name))

    def watch_leader(self, name: str, *, timeout_s: float | None = None) -> AsyncLeaderWatch:
        """See :meth:`LeaseStore.watch_leader`: the same changes, as an async iterator that
        waits holding no thread::

            async with store.watch_leader("scheduler", timeout_s=60) as leaders:
                async for leader in leaders:
                    ...

        Raises:
            InvalidArgument / UnsupportedOperation / StoreClosed: at once.
        """
        return AsyncLeaderWatch(self, name, timeout_s)

    async def enqueue(
        self, queue: str, job_id: str, payload: bytes = b"", *, max_attempts: int | None = None
    ) -> bool:
        """See :meth:`LeaseStore.enqueue`."""
        return await self._workers.run(
            partial(self.sync.enqueue, queue, job_id, payload, max_attempts=max_attempts))

    async def enqueue_many(
        self, queue: str, items: Iterable[EnqueueItem | tuple[str, bytes] | str]
    ) -> list[bool]:
        """See :meth:`LeaseStore.enqueue_many`."""
        return await self._workers.run(partial(self.sync.enqueue_many, queue, list(items)))

    async def requeue(self, job_id: str) -> LeaseRecord:
        """See :meth:`LeaseStore.requeue`."""
        return await self._workers.run(partial(self.sync.requeue, job_id))

    async def queue_jobs(self, queue: str, limit: int | None = None) -> list[QueuedJob]:
        """See :meth:`LeaseStore.queue_jobs`."""
        return await self._workers.run(partial(self.sync.queue_jobs, queue, limit))

    async def queue_stats(self, queue: str) -> QueueStats:
        """See :meth:`LeaseStore.queue_stats`."""
        return await self._workers.run(partial(self.sync.queue_stats, queue))

    async def purge(self, queue: str) -> int:
        """See :meth:`LeaseStore.purge`."""
        return await self._workers.run(partial(self.sync.purge, queue))

    async def epoch(self) -> int:
        """See :meth:`LeaseStore.epoch`."""
        return await self._workers.run(self.sync.epoch)

    async def bump_epoch(self, above: int | None = None) -> int:
        """See :meth:`LeaseStore.bump_epoch`."""
        return await self._workers.run(partial(self.sync.bump_epoch, above))

    async def close(self) -> None:
        """Close the store (see :meth:`LeaseStore.close`: every session's waiting claims
        end with ``LeaseLost``), then end the pool. Later calls raise ``StoreClosed``.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._workers.run(self.sync.close)
        finally:
            self._workers.shutdown()

    async def __aenter__(self) -> AsyncLeaseStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_store(
    url: str, *, threads: int = DEFAULT_THREADS, clock: Clock | None = None,
    observer: Observer | None = None, retry: RetryPolicy | None = None, **options: object,
) -> AsyncLeaseStore:
    """Open a lease store for asyncio: :func:`consensus_lease.open_store` (same URL,
    options and errors), run on the new store's own pool.

    Args:
        threads: threads of the store's pool (int, 2 to 1024, default 8). Round trips
            run there; claim attempts use at most ``threads - 2`` of them at once (at
            least 1), so lease operations never queue behind claims. Waiting claims hold
            none.
        **options: the store's options, exactly those of
            :func:`consensus_lease.open_store` (``pool_size`` is the PostgreSQL store's
            connection pool here too); every one reaches the store, which refuses those
            it does not know.

    Raises:
        InvalidArgument: bad ``threads``; an option the store does not know (for
            ``pool_size`` the message names ``threads``); and as
            :func:`consensus_lease.open_store`.
    """
    return await AsyncLeaseStore.open(url, threads=threads, clock=clock,
                                      observer=observer, retry=retry, **options)
