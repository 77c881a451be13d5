"""One worker slot: a thread with its own session, claiming and working one job at a time.

Each slot owns one session (so a lost session costs one job in flight, never the whole
process's), opens a new one when it is found LOST (counted and logged, never hidden), and
loops: ``claim_next(queue, wait_s=claim_wait_s)`` -> ``lease.ensure_held()`` -> handler ->
``complete`` / ``fail`` (see :mod:`.handler` for the contract). Every log line is on the
``consensus_lease.worker`` logger with ``slot``, ``job_id``, ``generation`` and ``attempt``
as record attributes.

With ``WorkerConfig.fused_claim`` (the default) a job the handler finished is completed
with ``lease.complete_and_claim_next(result, queue)``: the lease it returns is the next job
this slot works, without a ``claim_next`` of its own (one store round trip per job where
the store fuses the two, ``capabilities.fused_claim_next``); when it returns none the slot
falls back to the waiting ``claim_next``. The completion is fenced exactly as
``complete``'s: a refused one claims nothing. A slot told to stop completes with plain
``complete`` (it claims nothing it would not run), and a next lease obtained as the stop
came is worked, as a claimed one is, within the grace period (a release would use up an
attempt of a job that never ran). An ``OutcomeUnknown`` of the fused call closes the
session: the store may have claimed a next job for it that this process never saw, which
closing hands back at once instead of leaving it held until the worker stops.

With ``prefetch`` or ``complete_batch`` > 1 the slot has a :class:`~.feeder.Feeder`: its
next job is the oldest prefetched lease still held (a completion is fused only when none
is ready); with ``complete_batch`` > 1 a finished job's completion is queued (never
fused), and the queue is sent before every waiting claim and before the session is
replaced or closed. A stopping slot still works the prefetched leases it holds (those
of a prefetch claim in flight too), within the grace period: releasing a job that never
ran would use up one of its attempts. A session on which a prefetch claim's outcome was
unknown is closed (and replaced) when the slot next claims by itself, once it has worked
the leases ready; until then its completions claim nothing more.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from ..errors import (
    BackendUnavailable,
    ClaimTimeout,
    InvalidArgument,
    JobCompleted,
    JobFailed,
    LeaseLost,
    LeaseSuspended,
    OutcomeUnknown,
    StoreRegressed,
)
from ..lease import Lease
from ..record import JobState, LeaseRecord
from ..session import Session
from ..states import LeaseState, SessionState
from ..store import LeaseStore
from .config import WorkerConfig
from .control import BACKOFF_S, SETTLE_ATTEMPTS, StopControl
from .feeder import Feeder, log_lost
from .handler import HandlerCall, Retry
from .stats import WorkerStats

__all__ = ["Slot"]

log = logging.getLogger("consensus_lease.worker")

T = TypeVar("T")

_STILL_HELD = (LeaseState.HELD, LeaseState.SUSPENDED)


class Slot:
    """One worker thread's loop (see the module docstring). ``run`` is the thread's
    target; :meth:`abandon` is called by the runner, from its own thread, when the grace
    period ends with this slot still working."""

    def __init__(self, name: str, store: LeaseStore, config: WorkerConfig,
                 call: HandlerCall, control: StopControl) -> None:
        self.name = name
        self.store = store
        self.config = config
        self.call = call
        self.control = control
        self.stats = WorkerStats()
        self._lock = threading.Lock()
        self._session: Session | None = None
        self._current: Lease | None = None
        self._next: Lease | None = None  # claimed by the last completion, not yet worked
        self._abandoned = False
        self._store_errors = 0
        self._feeder: Feeder | None = None
        self._feeder_counted = False
        if config.pipelined:
            self._feeder = Feeder(name, config, store.capabilities, control,
                                  self._current_session, self._fields)

    def run(self) -> None:
        """Claim and work jobs until the worker stops."""
        if self._feeder is not None:
            self._feeder.start()
        try:
            while True:
                try:
                    lease = self._take_next()
                    if lease is None and self.control.stopping and self._feeder is not None:
                        self._feeder.settle()  # a prefetch in flight: its lease is worked
                        lease = self._take_next()
                    if lease is None:
                        if self.control.stopping:
                            break
                        lease = self._claim()
                    if lease is not None:
                        self._work(lease)
                except StoreRegressed as exc:  # an operator must act: never retried away
                    self.stats.errors += 1
                    log.error("the store's history went back (restored or wiped): stopping "
                              "this worker; run consensus-lease bump-epoch before restarting",
                              extra={"slot": self.name, "error": str(exc)})
                    self.control.request(f"store regressed: {exc}")
                except Exception:  # a bug below the handler: say so, start afresh
                    self.stats.errors += 1
                    log.exception("unexpected error in a worker slot; opening a new "
                                  "session", extra={"slot": self.name})
                    self._close_session()
                    self.control.wait(BACKOFF_S[-1])
        finally:
            self._close_feeder()
            self.call.close()
            self._close_session()

    def abandon(self) -> None:
        """The grace period is over: hand back the job in flight (if any) and end the
        session. The handler keeps running in its thread; whatever it does next is
        refused (its lease is released, the session closed)."""
        with self._lock:
            lease, self._current = self._current, None
            self._abandoned = True
        self._close_feeder()
        if lease is not None:
            self.stats.released += 1
            log.warning("grace period over: releasing the job in flight",
                        extra=self._fields(lease))
            try:
                lease.release()
            except (LeaseLost, BackendUnavailable) as exc:
                log.warning("releasing failed; the session's end or TTL hands it back",
                            extra={**self._fields(lease), "error": repr(exc)})
        self._close_session()

    def _close_feeder(self) -> None:
        """Send the pending completions, release the prefetched leases, and add the
        feeder's counts to this slot's (once)."""
        if self._feeder is None:
            return
        self._feeder.close()
        with self._lock:
            counted, self._feeder_counted = self._feeder_counted, True
        if not counted:
            self.stats.add(self._feeder.stats)

    # -- the session -------------------------------------------------------------------

    def _current_session(self) -> Session | None:
        with self._lock:
            return self._session

    def _open_session(self) -> Session | None:
        """This slot's session: a new one if there is none or it was lost."""
        with self._lock:
            session = self._session
        if session is not None and session.state is SessionState.LOST:
            self.stats.sessions_lost += 1
            log.warning("session lost; opening a new one", extra={
                "slot": self.name, "session_id": session.session_id,
                "reason": str(session.lost_reason)})
            self._close_session()
            session = None
        if session is None:
            try:
                session = self.store.session(self._owner(), self.config.ttl_s)
            except BackendUnavailable as exc:
                self._store_error("opening a session", exc)
                return None
            with self._lock:
                self._session = session
            log.info("session opened", extra={"slot": self.name, "owner": session.owner,
                                              "session_id": session.session_id})
        return session

    def _owner(self) -> str | None:
        """``None`` (the store's default, ``host:pid:random``) or ``OWNER/slot``."""
        return None if self.config.owner is None else f"{self.config.owner}/{self.name}"

    def _close_session(self) -> None:
        """End the session (handing back what it holds, a next lease included), after
        sending the completions pending on it."""
        if self._feeder is not None:
            self._feeder.flush(final=True)
        with self._lock:
            session, self._session = self._session, None
            self._next = None
        if session is not None:
            session.close()

    # -- claiming ------------------------------------------------------------------------

    def _take_next(self) -> Lease | None:
        """The lease the last completion claimed (``complete_and_claim_next``), if any,
        else the oldest prefetched one still held."""
        with self._lock:
            lease, self._next = self._next, None
        if lease is None and self._feeder is not None:
            lease = self._feeder.take()
        return lease

    def _claim(self) -> Lease | None:
        feeder = self._feeder
        session = self._current_session()
        if session is not None and feeder is not None and feeder.tainted(session):
            # a prefetch claim's outcome was unknown: jobs may be held by this session
            # with no lease here; closing it hands them back (after the pending
            # completions are sent)
            log.warning("a prefetch claim's outcome was unknown: closing the session, "
                        "which hands back jobs the store may have claimed for it",
                        extra={"slot": self.name, "session_id": session.session_id})
            self._close_session()
        session = self._open_session()
        if session is None:
            return None
        try:
            if feeder is None:
                lease = self._claim_alone(session)
            else:
                lease = self._claim_beside(feeder, session)
            if lease is None:  # until_empty: a non-waiting claim found the queue drained
                self.control.request("drained")
                return None
        except ClaimTimeout:
            self._store_errors = 0
            if self.config.until_empty and self._drained():
                self.control.request("drained")
            return None
        except LeaseSuspended:
            self.control.wait(max(0.05, session.granted_ttl_s / 10))
            return None
        except LeaseLost:
            return None  # the session is lost: the next _open_session replaces it
        except (JobCompleted, JobFailed):
            self.stats.skipped += 1
            return None
        except BackendUnavailable as exc:
            self._store_error("claiming", exc)
            return None
        self._store_errors = 0
        return lease

    def _claim_alone(self, session: Session) -> Lease | None:
        """``claim_next`` without a feeder. With ``until_empty`` a non-waiting claim
        comes first, and ``None`` when it found nothing and the queue is drained: the
        slot ends at once rather than after a ``claim_wait_s`` wait."""
        if self.config.until_empty:
            lease = session.claim_next(self.config.queue)
            if lease is not None or self._drained():
                return lease
        return session.claim_next(self.config.queue, wait_s=self.config.claim_wait_s)

    def _claim_beside(self, feeder: Feeder, session: Session) -> Lease | None:
        """``claim_next`` with a feeder: first a non-waiting claim (with the free
        prefetch room, where the store batches claims: :meth:`Feeder.claim_for_slot`);
        pending completions are sent before waiting (never held while blocked), and
        nothing is prefetched during the wait. ``None`` (``until_empty`` only): the
        non-waiting claim found nothing, and with the completions sent the queue is
        drained."""
        if feeder.pending or feeder.claim_batch > 1 or self.config.until_empty:
            lease = feeder.claim_for_slot(session)
            if lease is not None:
                return lease
            feeder.flush()
            if self.config.until_empty and self._drained():
                return None
        feeder.waiting(True)
        try:
            return session.claim_next(self.config.queue, wait_s=self.config.claim_wait_s)
        finally:
            feeder.waiting(False)

    def _drained(self) -> bool:
        """Nothing available (retry delays running count as available), nothing held:
        nothing more will come unless someone enqueues. FAILED jobs do not count."""
        try:
            stats = self.store.queue_stats(self.config.queue)
        except BackendUnavailable as exc:
            self._store_error("reading the queue's counts", exc)
            return False
        return stats.available == 0 and stats.held == 0

    def _store_error(self, what: str, exc: BackendUnavailable) -> None:
        wait = BACKOFF_S[min(self._store_errors, len(BACKOFF_S) - 1)]
        self._store_errors += 1
        log.warning("store unavailable while %s; retrying in %.1f s", what, wait,
                    extra={"slot": self.name, "error": repr(exc)})
        self.control.wait(wait)

    # -- working a job -------------------------------------------------------------------

    def _work(self, lease: Lease) -> None:
        """Run the handler on ``lease`` and settle its job, also when the stop came as it
        was claimed (or prefetched): releasing it would use up an attempt of a job that
        never ran (one with ``max_attempts=1`` would become FAILED); the grace period
        bounds the stop."""
        self.stats.claimed += 1
        with self._lock:
            self._current = lease
        outcome: bytes | Exception
        try:
            lease.ensure_held()
            if log.isEnabledFor(logging.INFO):  # per job: no fields built when not logged
                log.info("job started", extra=self._fields(lease))
            outcome = self.call(lease, b"" if lease.payload is None else lease.payload)
        except Exception as exc:
            outcome = exc
        except (SystemExit, KeyboardInterrupt) as exc:  # from the handler, not a signal to
            # this worker (those are handled by StopControl): a failed attempt, not a way
            # to end the worker silently with exit status 0
            outcome = RuntimeError(f"the handler raised {type(exc).__name__}({exc})")
            log.error("handler raised %s; treated as a failed attempt", type(exc).__name__,
                      extra=self._fields(lease))
        with self._lock:
            abandoned = self._abandoned
            self._current = None
        state = lease.state  # once: each read checks the local deadline
        if abandoned:
            log.warning("handler returned after the grace period; its job was released",
                        extra=self._fields(lease))
        elif isinstance(outcome, LeaseLost):
            self._handler_failed(lease, outcome)
        elif state in (LeaseState.RELEASED, LeaseState.FAILED):
            # the handler called lease.release() or lease.fail() itself (then returned or
            # raised): the store has that ending; completing or failing it again would be
            # refused
            self.stats.skipped += 1
            log.info("the handler ended its lease itself (%s); nothing more to settle",
                     state.value, extra=self._fields(lease))
        elif isinstance(outcome, Exception):
            self._handler_failed(lease, outcome)
        else:
            self._complete(lease, outcome, state)

    def _complete(self, lease: Lease, result: bytes, state: LeaseState) -> None:
        if state is LeaseState.COMPLETED:  # the handler completed it itself
            self.stats.completed += 1
            return
        if self._feeder is not None and self._feeder.batching:
            try:
                self._feeder.put(lease, result)
            except InvalidArgument as exc:  # the result is too large for the store
                self._handler_failed(lease, exc)
            return
        unknown = False

        def complete() -> tuple[LeaseRecord, Lease | None]:
            # chosen at each try: a stop that came meanwhile claims nothing more, and
            # neither does a slot with a prefetched lease ready (its next job)
            nonlocal unknown
            feeder = self._feeder
            if (not self.config.fused_claim or self.control.stopping
                    or (feeder is not None and (feeder.ready
                                                or feeder.tainted(lease.session)))):
                return lease.complete(result), None
            try:
                return lease.complete_and_claim_next(result, self.config.queue)
            except OutcomeUnknown:
                unknown = True
                raise

        try:
            done, answer = self._settle(lease, "complete", complete)
        except InvalidArgument as exc:  # the result is too large for the store
            self._handler_failed(lease, exc)
            return
        if done:
            self.stats.completed += 1
            if log.isEnabledFor(logging.INFO):
                log.info("job completed", extra=self._fields(lease))
            claimed = None if answer is None else answer[1]
            if claimed is not None:
                self.stats.fused_claims += 1
                with self._lock:
                    self._next = claimed
        elif unknown:
            # the store may have claimed a next job for this session that this process
            # never saw: closing the session hands it back now (else it stays held, the
            # session alive, until the worker stops); the next claim opens a new one
            log.warning("completion outcome unknown: closing the session, which hands "
                        "back a next job the store may have claimed for it",
                        extra=self._fields(lease))
            self._close_session()

    def _handler_failed(self, lease: Lease, exc: Exception) -> None:
        if isinstance(exc, LeaseLost) and lease.state not in _STILL_HELD:
            self._lost(lease, exc)
            return
        if isinstance(exc, Retry):
            error, delay = exc.error, exc.delay_s
            log.info("handler asked for a retry in %.3f s", delay, extra=self._fields(lease))
        else:
            error, delay = exc, None
            log.warning("handler raised", exc_info=exc, extra=self._fields(lease))
        done, record = self._settle(lease, "fail", lambda: lease.fail(error, delay))
        if not done or record is None:
            return
        if record.state is JobState.FAILED:
            self.stats.dead_lettered += 1
            log.error("job FAILED: no attempts left (dead letter; store.requeue to retry)",
                      extra={**self._fields(lease), "error": record.error})
        else:
            self.stats.retried += 1
            log.info("job will be retried", extra={**self._fields(lease),
                                                   "not_before": record.not_before})

    def _settle(self, lease: Lease, what: str, op: Callable[[], T]) -> tuple[bool, T | None]:
        """Run ``op`` (complete / fail / release); ``(True, its answer)`` if the store
        applied it. Retries what the store did not answer; a lost lease or a race is
        logged and counted, never raised. ``InvalidArgument`` propagates (nothing was
        sent)."""
        for attempt in range(1, SETTLE_ATTEMPTS + 1):
            try:
                return True, op()
            except (LeaseLost, OutcomeUnknown) as exc:  # OutcomeUnknown: treated as lost
                self._lost(lease, exc, handler_returned=what == "complete")
                return False, None
            except (JobCompleted, JobFailed) as exc:
                self.stats.skipped += 1
                log.info("job settled elsewhere", extra={**self._fields(lease),
                                                         "error": repr(exc)})
                return False, None
            except BackendUnavailable as exc:
                log.warning("store unavailable during %s (try %d of %d)", what, attempt,
                            SETTLE_ATTEMPTS, extra={**self._fields(lease), "error": repr(exc)})
                self.control.wait_hurry(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
        log.error("giving up on %s; closing the session so the job is handed back", what,
                  extra=self._fields(lease))
        self._close_session()
        return False, None

    def _lost(self, lease: Lease, exc: Exception, *, handler_returned: bool = False) -> None:
        self.stats.leases_lost += 1
        log_lost(self._fields(lease), exc, handler_returned=handler_returned)

    def _fields(self, lease: Lease) -> dict[str, object]:
        return {"slot": self.name, "job_id": lease.job_id, "generation": lease.generation,
                "attempt": lease.attempt, "queue": self.config.queue}

