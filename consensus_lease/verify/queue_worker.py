"""The verifier's worker with the worker runner (``consensus-lease verify --runner``).

The verifier enqueues the run's jobs in a work queue; each worker process runs
:func:`consensus_lease.worker.run_worker` on it (one slot, with the run's ``prefetch``,
``complete_batch`` and ``complete_flush_s``), and the handler is the steps of
:class:`~consensus_lease.verify.worker.Worker`'s job: per step ``ensure_held()`` ->
think -> (pause point) -> the write with the token -> (sometimes ``renew()``) -> think,
then ``ensure_held()`` -> (pause point) and return the result. The completion is the
runner's: at once (``complete_and_claim_next``), or queued and sent with its batch in
``session.complete_many`` — so a pause before the completion makes the batch carry a
stale item, which the store must refuse while the others commit.

The runner claims (``claim_next``, prefetched leases, fused claims) and completes
itself, so those operations are recorded from the store's
:class:`~consensus_lease.observe.Observer`, as the core reports them: each claim the
store granted (``claim``, outcome ``claimed``), each completion with its outcome (``ok``,
or ``stale``/``lost``: refused by the store; ``unknown``; ``unavailable``), each lost
session (``session_lost``). A handler that cannot go on hands its lease back if it is
still held (``release``), else raises ``LeaseLost``: the runner sends nothing for it.

The runner has threads of its own beside the handler's (the slot's feeder claims ahead
and sends completions while the handler runs), so an armed pause point first lets the
store calls in flight in this process end and holds new ones back
(:class:`StoreGate`, at most :data:`QUIESCE_S`): a process stopped inside a store
transaction would hold the store's locks (SQLite's file lock, PostgreSQL's row locks)
and stall every other worker until it is resumed, so its job could not be taken over.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from ..errors import LeaseLost
from ..lease import Lease
from ..observe import Observer
from ..states import LeaseState
from .history import HistoryWriter
from .worker import Worker, WorkerConfig

__all__ = ["HistoryObserver", "QueueWorker"]

GRACE_S = 5.0
"""The runner's grace period after SIGTERM (the pool waits longer before SIGKILL)."""
QUIESCE_S = 1.0
"""Longest wait of an armed pause point for this process's store calls in flight."""
GATED_CALLS = (
    "open_session", "keepalive", "close_session", "claim", "claim_many", "claim_from_queue",
    "queue_candidates", "renew", "complete", "complete_many", "complete_and_claim_next",
    "release", "fail", "get", "queue_stats", "enqueue", "enqueue_many",
)
"""The backend calls :class:`StoreGate` counts: those that can hold the store's locks
(waiting ones such as ``wait_for_queue`` are left out: they hold none and may last)."""


class StoreGate:
    """Counts this process's calls of ``backend``'s :data:`GATED_CALLS` in flight (by
    wrapping them on the instance); :meth:`closed` holds new ones back and waits until
    none is in flight."""

    def __init__(self, backend: object) -> None:
        self._cond = threading.Condition()
        self._busy = 0
        self._closed = False
        for name in GATED_CALLS:
            method = getattr(backend, name, None)
            if callable(method):
                setattr(backend, name, self._wrap(method))

    def _wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._cond:
                self._cond.wait_for(lambda: not self._closed)
                self._busy += 1
            try:
                return method(*args, **kwargs)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()
        return call

    @contextmanager
    def closed(self, timeout_s: float) -> Iterator[bool]:
        """Hold new calls back for the block, after waiting at most ``timeout_s`` for
        those in flight to end; yields whether none is in flight."""
        with self._cond:
            self._closed = True
            quiet = self._cond.wait_for(lambda: self._busy == 0, timeout_s)
        try:
            yield quiet
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()


class HistoryObserver(Observer):
    """Records the claims, completions and lost sessions the store reports into a
    worker's history (thread-safe: :class:`HistoryWriter` is)."""

    def __init__(self, rec: HistoryWriter) -> None:
        self.rec = rec

    def claimed(self, store: str, job_id: str, generation: int, owner: str) -> None:
        self.rec.event("claim", "claimed", job=job_id, generation=generation, owner=owner)

    def operation(self, store: str, op: str, job_id: str | None, generation: int | None,
                  outcome: str, latency_s: float) -> None:
        if op == "complete":
            self.rec.event("complete", outcome, job=job_id, generation=generation,
                           latency_s=round(latency_s, 6))

    def lost(self, store: str, job_id: str | None, generation: int | None, reason: str) -> None:
        if job_id is None:
            self.rec.event("session_lost", reason=reason)


class QueueWorker(Worker):
    """One worker process driving the worker runner (see the module docstring)."""

    def __init__(self, config: WorkerConfig) -> None:
        super().__init__(config)
        self.gate = StoreGate(self.store.backend)

    def _observer(self) -> Observer:
        return HistoryObserver(self.rec)

    def _pause_point(self, lease: Lease, before: str, step: int, **detail: Any) -> None:
        """The base pause point, taken with no store call of this process in flight
        (see the module docstring); the event says whether there was none
        (``quiesced``)."""
        path = self.config.pause_flag_path
        if not path or not os.path.exists(path):
            return
        with self.gate.closed(QUIESCE_S) as quiet:
            super()._pause_point(lease, before, step, quiesced=quiet, **detail)

    def run(self) -> int:
        """Run the runner until the queue is drained, ``stop_at`` or SIGTERM."""
        from ..worker import run_worker  # the verifier's loop does not need it

        c = self.config
        self.rec.event("worker_start", pid=os.getpid(), clock_offset_s=c.clock_offset_s,
                       enforce_tokens=c.enforce_tokens, runner=True, queue=c.queue,
                       prefetch=c.prefetch, complete_batch=c.complete_batch,
                       complete_flush_s=c.complete_flush_s)
        timer = threading.Timer(max(0.0, c.stop_at - time.time()), self.stop.set)
        timer.daemon = True
        timer.start()
        stats: dict[str, object] = {}
        try:
            result = run_worker(
                self.store, c.queue, self._handle, ttl_s=c.ttl_s, owner=c.name,
                until_empty=True, claim_wait_s=max(0.05, min(1.0, c.ttl_s / 2)),
                grace_s=GRACE_S, prefetch=c.prefetch, complete_batch=c.complete_batch,
                complete_flush_s=c.complete_flush_s, stop_event=self.stop)
            stats = asdict(result)
        finally:
            timer.cancel()
            self.rec.event("worker_exit", stopped=self.stop.is_set(), stats=stats)
            self.store.close()
            self.destination.close()
            self.rec.close()
        return 0

    def _handle(self, lease: Lease, payload: bytes) -> bytes | None:
        """The job's steps; its result (the runner completes it), or ``None`` after
        handing the lease back (the runner settles nothing more)."""
        if not self._steps(lease):
            self._give_up(lease)
            return None
        return self.config.name.encode()

    def _steps(self, lease: Lease) -> bool:
        """Each step's check, write and renewal, then the last check (``False``: one
        failed, or a stop came)."""
        c = self.config
        for step in range(c.steps):
            if self.stop.is_set() or not self._check(lease, "write", step):
                return False
            self._think()  # the window between the check and the effect ...
            self._pause_point(lease, "write", step)  # ... which a pause can stretch
            if self._write(lease, step) not in ("accepted", "duplicate"):
                return False
            if self.rng.random() < c.renew_probability and not self._renew(lease):
                return False
            self._think()
        if self.stop.is_set() or not self._check(lease, "complete", c.steps):
            return False
        self._pause_point(lease, "complete", c.steps)
        return True

    def _give_up(self, lease: Lease) -> None:
        """Hand ``lease`` back if it is (again) held; else it is lost.

        Raises:
            LeaseLost: the lease is not held (the runner counts it, sends nothing)."""
        self._abandon(lease)
        if lease.state is not LeaseState.RELEASED:
            raise LeaseLost(f"lease on {lease.job_id!r} is {lease.state.value}; given up",
                            job_id=lease.job_id, generation=lease.generation)
