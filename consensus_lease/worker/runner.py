"""``run_worker``: the worker loop every user would otherwise write by hand."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext

from ..backend import Capabilities
from ..errors import InvalidArgument, UnsupportedOperation
from ..observe import Observer
from ..retry import RetryPolicy
from ..store import DEFAULT_TTL_S, LeaseStore, backend_class, open_store
from ..validation import check_ttl
from .config import Mode, WorkerConfig
from .control import StopControl, signal_handlers
from .handler import Handler, check_handler, load_handler
from .processes import check_picklable, run_processes
from .stats import WorkerStats
from .threads import run_threads

__all__ = ["run_in_threads", "run_worker"]


def run_worker(
    store: str | LeaseStore,
    queue: str,
    handler: Handler | str,
    *,
    concurrency: int = 1,
    mode: Mode = "thread",
    ttl_s: float = DEFAULT_TTL_S,
    owner: str | None = None,
    retry: RetryPolicy | None = None,
    grace_s: float = 30.0,
    until_empty: bool = False,
    claim_wait_s: float = 1.0,
    fused_claim: bool = True,
    prefetch: int = 0,
    complete_batch: int = 1,
    complete_flush_s: float = 0.01,
    observer: Observer | None = None,
    stop_event: threading.Event | None = None,
    handle_signals: bool = False,
) -> WorkerStats:
    """Claim jobs of ``queue`` and run ``handler`` on each until told to stop.

    Each of ``concurrency`` slots (a thread, or with ``mode="process"`` a process of its
    own) opens its own session, claims with ``claim_next(queue, wait_s=claim_wait_s)``,
    checks ``lease.ensure_held()``, calls ``handler(lease, payload)`` and settles the job:
    completed with the bytes returned (with ``fused_claim``, by
    ``lease.complete_and_claim_next``, whose next lease is the slot's next job); failed
    with the retry policy's delay if it raised (or the delay of a
    :class:`~consensus_lease.worker.Retry` it raised; after the job's last attempt the
    store makes it FAILED); nothing if the lease was lost (logged and
    counted). A lost session is replaced by a new one, logged and counted, never hidden.
    See :mod:`consensus_lease.worker` for the whole contract.

    Stopping: when ``stop_event`` is set (or, with ``handle_signals``, on SIGTERM or
    SIGINT) the worker stops claiming, lets jobs in flight finish within ``grace_s``, then
    releases what is still held and returns. A second request skips the grace period.

    Args:
        store: a store URL, or an open :class:`~consensus_lease.LeaseStore` (thread mode
            only; it is not closed).
        queue: the work queue's name.
        handler: ``handler(lease, payload) -> bytes | None``, plain or ``async def``; or
            ``"package.module:function"``. In process mode it must be importable by name.
        concurrency: slots (int, 1 to 1024).
        mode: ``"thread"`` (slots are threads of this process) or ``"process"`` (one
            single-threaded worker process per slot, started with ``spawn``).
        ttl_s: each session's requested TTL, seconds, within the store's range
            (``capabilities.min_ttl_s`` to ``max_ttl_s``; checked once the store is open,
            before any slot starts).
        owner: label of the sessions (``OWNER/slot``); default ``host:pid:random``.
        retry: the queue's :class:`~consensus_lease.RetryPolicy` in this worker (the
            delays of failed attempts; ``max_attempts`` is recorded per job by
            ``enqueue``, so it must be set where jobs are enqueued).
        grace_s: seconds jobs in flight get to finish after a stop request (float >= 0).
        until_empty: return once the queue has nothing available (jobs waiting out a
            retry delay count as available), nothing held; FAILED jobs do not count.
            An idle slot then makes a non-waiting claim and reads the queue's counts
            before each waiting claim, so a drained queue ends it at once (not after a
            ``claim_wait_s`` wait).
        claim_wait_s: how long one ``claim_next`` waits (seconds > 0); also the longest
            delay before a stop request is noticed by an idle slot.
        fused_claim: complete each job with ``lease.complete_and_claim_next`` and work
            the lease it returns next (no ``claim_next`` of its own: one store round trip
            per job on every store, ``capabilities.fused_claim_next``: on etcd plus a
            candidate scan per 32 jobs, on ZooKeeper a listing per 16 or so), the same
            fencing as
            ``complete``. ``False``: ``complete``, then ``claim_next`` (the sequence
            before this option). A slot that is stopping always uses ``complete``.
            Not used with ``complete_batch`` > 1.
        prefetch: leases each slot claims ahead of the job it works (int, 0 to 256),
            on a thread beside the slot's, while its handler runs: one non-waiting
            ``claim_next_many`` for the free room where the store batches queue claims
            (``capabilities.max_queue_claim_batch`` > 1: every bundled store), refilled at
            half of ``prefetch``; else one non-waiting ``claim_next`` per free place.
            They are held (renewed with the session) until worked; one lost first is
            dropped, never worked (``prefetch_dropped``); a stop still works them,
            within ``grace_s`` (a release would use up an attempt of a job that never
            ran), and releases those left when it ends. A completion is fused only when
            no prefetched lease is ready. 0 (the default): none.
        complete_batch: most completions a slot sends in one ``session.complete_many``
            (int, 1 to 10,000; the store's ``capabilities.max_complete_batch`` caps it,
            16 where the store sends one completion per item). 1 (the default): each job
            is completed at once, as ``fused_claim`` says. Above 1, a finished job's
            completion is queued and sent when the batch is full, after
            ``complete_flush_s``, before half the time its lease had left has passed,
            before the slot waits for a job, and at a stop; each item is fenced and has
            its own outcome. A crash loses queued completions: those jobs run again
            after the session's TTL.
        complete_flush_s: longest wait of a queued completion, seconds (0 to 60; the
            default 0.01).
        observer: metrics observer for a store opened from a URL (thread mode).
        stop_event: set it to stop the worker (the library caller's way).
        handle_signals: install SIGTERM/SIGINT handlers (the command does; only from the
            main thread).

    Returns:
        The counts of what was done, with ``stopped_by``.

    Raises:
        InvalidArgument: a bad argument (nothing started, nothing created: a ``ttl_s``
            outside the range the URL's backend class declares is refused before the
            store is opened; in process mode the handler is imported here first, so a
            module that cannot be imported is refused before any process starts).
        UnsupportedBackend / UnsupportedOperation: no such store, or it has no queues.
        BackendUnavailable: the store cannot be opened.
    """
    config = WorkerConfig(queue=queue, concurrency=concurrency, mode=mode, ttl_s=ttl_s,
                          owner=owner, retry=retry, grace_s=grace_s, until_empty=until_empty,
                          claim_wait_s=claim_wait_s, fused_claim=fused_claim,
                          prefetch=prefetch, complete_batch=complete_batch,
                          complete_flush_s=complete_flush_s)
    target = handler if isinstance(handler, str) else check_handler(handler)
    if stop_event is not None and not isinstance(stop_event, threading.Event):
        raise InvalidArgument(f"stop_event must be a threading.Event, not {stop_event!r}")
    control = StopControl(stop_event)
    signals: AbstractContextManager[None] = (
        signal_handlers(control) if handle_signals else nullcontext())
    if isinstance(store, str):
        _check_ttl_before_opening(store, config)
    if mode == "process":
        if not isinstance(store, str):
            raise InvalidArgument("mode='process' needs a store URL, not a LeaseStore")
        if observer is not None:
            raise InvalidArgument("mode='process' takes no observer (each process would "
                                  "need its own); pass it in thread mode")
        # Imported here too (each process imports it again): a module that cannot be
        # imported is the one error it is, before the store is opened or a process
        # spawned; and a handler object must be sendable to the processes.
        if isinstance(target, str):
            load_handler(target)
        check_picklable(target)
    with signals:
        if mode == "thread":
            function = load_handler(target) if isinstance(target, str) else target
            return run_in_threads(store, config, function, control, observer)
        assert isinstance(store, str)  # checked above
        with open_store(store) as checked:
            _check_store(checked, config)
            if not checked.capabilities.cross_process:
                raise InvalidArgument(
                    f"mode='process' needs a store other processes can open; {store!r} "
                    f"lives inside one process (use thread mode, or sqlite/postgresql/etcd/zk)"
                )
        return run_processes(store, config, target, control)


def run_in_threads(store: str | LeaseStore, config: WorkerConfig, handler: Handler,
                   control: StopControl, observer: Observer | None,
                   prefix: str = "") -> WorkerStats:
    """Thread mode: open the store if given a URL, check it, run the slots."""
    if isinstance(store, LeaseStore):
        if observer is not None:
            raise InvalidArgument("observer is for a store opened from a URL; give it to "
                                  "open_store instead")
        _check_store(store, config)
        return run_threads(store, config, handler, control, prefix)
    if not isinstance(store, str):
        raise InvalidArgument(f"store must be a URL or a LeaseStore, not {store!r}")
    with open_store(store, observer=observer) as opened:
        _check_store(opened, config)
        return run_threads(opened, config, handler, control, prefix)


def _check_ttl_before_opening(url: str, config: WorkerConfig) -> None:
    """The TTL against the range the URL's backend class declares (its
    ``capabilities``, known without connecting), before the store is opened: a TTL out
    of range creates nothing (no SQLite file). A backend whose capabilities are known
    only once open is checked by :func:`_check_store`.

    Raises:
        UnsupportedBackend: no backend serves ``url`` (as ``open_store`` would say).
        InvalidArgument: ``config.ttl_s`` is outside the range.
    """
    caps = getattr(backend_class(url), "capabilities", None)
    if isinstance(caps, Capabilities):
        check_ttl(config.ttl_s, min_s=caps.min_ttl_s, max_s=caps.max_ttl_s)


def _check_store(store: LeaseStore, config: WorkerConfig) -> None:
    """Fail before starting, not in every slot: queues, TTL range, retry policy."""
    caps = store.capabilities
    if not caps.queues:
        raise UnsupportedOperation(f"the {store.backend.scheme} backend has no work queues")
    check_ttl(config.ttl_s, min_s=caps.min_ttl_s, max_s=caps.max_ttl_s)
    if config.retry is not None:
        store.set_retry_policy(config.queue, config.retry)
