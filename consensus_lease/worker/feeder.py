"""A slot's feeder: leases claimed ahead (``WorkerConfig.prefetch``) and completions sent
in batches (``WorkerConfig.complete_batch`` > 1), on a thread of its own beside the
slot's, so that store round trips overlap the handler's work.

Prefetch: while the slot works a job, the feeder claims up to ``prefetch`` more on the
slot's session, without waiting (renewed by its keepalive like any lease). Where the
store claims many jobs in one round trip (``capabilities.max_queue_claim_batch`` > 1)
it calls ``session.claim_next_many(queue, k)``, ``k`` the free room, once at least
:attr:`Feeder.refill` (half of ``prefetch``, rounded up) is free, so that each round trip
carries many jobs; elsewhere one ``claim_next`` per lease, as soon as one is free. It
claims nothing while the slot is in a waiting claim of its own, once a claim found the
queue empty or brought fewer than asked (until the slot takes its next job), or once a
stop was requested. A claim whose outcome is unknown (``OutcomeUnknown``: the store may
have claimed jobs this process never saw, held until the session ends) ends prefetching
on that session: :meth:`Feeder.tainted` tells the slot to replace it once it has worked
what it holds, which hands those jobs back. The slot takes the leases oldest first; one
no longer HELD (its local deadline passed, its session was lost or closed) is dropped,
never worked (``prefetch_dropped``, logged): the store hands it back. At a stop the slot
still works those it holds (a release would use up an attempt of a job that never ran);
the ones left when the grace period ends are released (``released``). The slot's own
non-waiting claim, with nothing ready, goes through :meth:`Feeder.claim_for_slot`: one
``claim_next_many`` for its next job and the free room, where the store batches.

Batched completion: a finished job's result is checked as ``complete`` checks it and
queued; the queue is sent with ``session.complete_many`` (each item fenced by the store,
each with its own outcome, handled like the slot's single ``complete``: stale or unknown
-> ``leases_lost``, logged; a race with another completion -> ``skipped``; the store did
not answer -> tried again, :data:`SETTLE_ATTEMPTS` times in all) as soon as

* it holds :attr:`Feeder.batch` items (``complete_batch``, capped by the store's
  ``capabilities.max_complete_batch``, or by :data:`LOOP_BATCH_MAX` where the store
  sends one completion per item);
* its oldest item waited ``complete_flush_s``, or half the time its lease had left
  before its local deadline when it was queued (:data:`DEADLINE_SHARE`), whichever is
  shorter: a completion is never held until the deadline, even if renewals stop;
* the slot is about to wait in ``claim_next(wait_s)``, replaces or closes its session,
  or stops.

A crash loses the queued completions: their jobs are run again by another worker once
the store expires the session (at least once, and fenced: the old generation's late
completion would be refused).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..backend import Capabilities
from ..errors import (
    BackendUnavailable,
    InvalidArgument,
    JobCompleted,
    JobFailed,
    LeaseError,
    LeaseLost,
    OutcomeUnknown,
)
from ..lease import Lease, checked_completion
from ..record import LeaseRecord
from ..session import Session
from ..states import LeaseState, SessionState
from .config import WorkerConfig
from .control import BACKOFF_S, SETTLE_ATTEMPTS, StopControl
from .stats import WorkerStats

__all__ = ["DEADLINE_SHARE", "LOOP_BATCH_MAX", "Feeder", "batch_size", "log_lost"]

log = logging.getLogger("consensus_lease.worker")

LOOP_BATCH_MAX = 16
"""Largest batch where the store sends one completion per item
(``capabilities.max_complete_batch`` 1): batching then only moves the round trips off
the slot's thread."""
DEADLINE_SHARE = 0.5
"""A queued completion is sent before this share of the time its lease had left (to its
local deadline, when it was queued) has passed."""
IDLE_WAKE_S = 0.1
"""Longest sleep of an idle feeder: how soon it notices a stop (or a claim to retry)."""
JOIN_S = 5.0
"""How long closing waits for a feeder still in a store call."""

_STILL_HELD = (LeaseState.HELD, LeaseState.SUSPENDED)

Fields = Callable[[Lease], dict[str, object]]


def batch_size(wanted: int, caps: Capabilities) -> int:
    """``complete_batch`` capped by what one store round trip carries."""
    most = caps.max_complete_batch if caps.max_complete_batch > 1 else LOOP_BATCH_MAX
    return max(1, min(wanted, most))


def log_lost(fields: dict[str, object], exc: Exception, *, handler_returned: bool) -> None:
    """The log line of a lease lost before its job was settled (or whose completion's
    outcome is unknown: counted as lost, but the store may have recorded it)."""
    if isinstance(exc, OutcomeUnknown):  # not "not completed": it may well have been
        log.warning("completion outcome unknown: the store may or may not have recorded "
                    "it (read store.get); the lease is treated as lost",
                    extra={**fields, "reason": repr(exc)})
        return
    if handler_returned:  # its effects happened: say so, or the operator assumes not
        log.warning("lease lost after the handler returned; job not completed by this "
                    "worker, but the handler's effects stand (a committed "
                    "lease.transaction block stays committed: the next holder's "
                    "tx.once returns False for it)",
                    extra={**fields, "reason": repr(exc)})
        return
    log.warning("lease lost; job not completed by this worker",
                extra={**fields, "reason": repr(exc)})


@dataclass(slots=True)
class _Pending:
    """A finished job's completion, not sent yet."""

    lease: Lease
    result: bytes
    send_by: float  # time.monotonic()
    tries: int = 0


class Feeder:
    """One slot's prefetched leases and pending completions (see the module docstring).

    The slot calls :meth:`take`, :meth:`put`, :meth:`flush`, :meth:`waiting` and
    :meth:`close`; the feeder's thread (started by :meth:`start`) flushes on time and
    claims ahead. ``stats`` holds the counts of what the feeder settled (under its lock),
    added to the slot's when it closes.
    """

    def __init__(self, name: str, config: WorkerConfig, caps: Capabilities,
                 control: StopControl, session_of: Callable[[], Session | None],
                 fields: Fields) -> None:
        self.name = name
        self.config = config
        self.control = control
        self.batching = config.complete_batch > 1
        self.batch = batch_size(config.complete_batch, caps)
        self.claim_batch = max(1, min(config.prefetch, caps.max_queue_claim_batch))
        self.refill = 1 if self.claim_batch == 1 else (config.prefetch + 1) // 2
        """The free room (leases) at which the feeder claims again."""
        self.stats = WorkerStats()
        self._session_of = session_of
        self._fields = fields
        self._cond = threading.Condition()
        self._flushing = threading.Lock()
        self._pending: list[_Pending] = []
        self._due = math.inf  # the earliest send_by of _pending
        self._retries = 0  # items of _pending sent before, waiting out their backoff
        self._ready: deque[Lease] = deque()
        self._empty = False  # the last prefetch found nothing: wait for the slot to move
        self._slot_waiting = False
        self._retry_at = 0.0
        self._claim_errors = 0
        self._closed = False
        self._claiming = False  # a prefetch claim is in flight
        self._unknown_on: Session | None = None  # a claim's outcome unknown on it
        self._inflight = 0  # leases asked for by claims in flight (the feeder's, the slot's)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"consensus-lease-feeder-{name}")

    def start(self) -> None:
        self._thread.start()

    def _count(self, name: str, n: int = 1) -> None:
        with self._cond:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    # -- the slot's side -----------------------------------------------------------------

    def take(self) -> Lease | None:
        """The oldest prefetched lease still held (those lost meanwhile are dropped)."""
        while True:
            with self._cond:
                self._empty = False
                lease = self._ready.popleft() if self._ready else None
                if self.config.prefetch:
                    self._cond.notify()
            if lease is None or lease.state in _STILL_HELD:
                return lease
            self._count("prefetch_dropped")
            log.warning("prefetched lease lost before its job was started: dropped, not "
                        "worked (the store hands the job back)",
                        extra={**self._fields(lease), "reason": repr(lease.lost_reason)})

    def put(self, lease: Lease, result: bytes) -> None:
        """Queue ``lease``'s completion with ``result``.

        Raises:
            InvalidArgument: the result is not one ``complete`` would send (too large);
                nothing queued.
        """
        data = checked_completion(lease, result, "complete")
        now = time.monotonic()
        send_by = now + min(self.config.complete_flush_s,
                            max(0.0, lease.remaining_s()) * DEADLINE_SHARE)
        with self._cond:
            self._pending.append(_Pending(lease, data, send_by))
            size = len(self._pending)
            if size >= self.batch or send_by < self._due:
                self._due = min(self._due, send_by)
                self._cond.notify()
            late = size >= 2 * self.batch or now >= self._due  # the feeder is behind
        if late:
            self.flush()

    @property
    def ready(self) -> int:
        """Prefetched leases waiting for the slot."""
        with self._cond:
            return len(self._ready)

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def tainted(self, session: Session) -> bool:
        """Whether a prefetch claim's outcome on ``session`` is unknown: jobs may be
        held by it with no lease here, until it ends (the slot replaces it)."""
        with self._cond:
            return self._unknown_on is session

    def waiting(self, flag: bool) -> None:
        """The slot enters (``True``) or leaves a waiting claim: no prefetch meanwhile."""
        with self._cond:
            self._slot_waiting = flag
            if not flag:
                self._empty = False
                self._cond.notify()

    def close(self) -> None:
        """Stop the thread, send what is pending, release the leases not started."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(JOIN_S)
        if self._thread.is_alive():
            log.error("the slot's feeder is still in a store call: its pending "
                      "completions are left to the TTL (their jobs will run again)",
                      extra={"slot": self.name, "pending": self.pending})
            return
        self.flush(final=True)
        self.release_ready()

    # -- sending completions -------------------------------------------------------------

    def flush(self, *, final: bool = False) -> None:
        """Send the pending completions now (those the store did not answer before
        once their backoff is over). ``final``: all of them, and no retry (the session
        is closing); what the store does not answer is left to the TTL."""
        with self._flushing:
            now = time.monotonic()
            with self._cond:
                items, later = self._pending, []
                if self._retries and not final:
                    later = [p for p in items if p.tries and p.send_by > now]
                    items = [p for p in items if not p.tries or p.send_by <= now]
                self._pending, self._retries = later, len(later)
                self._due = min((p.send_by for p in later), default=math.inf)
            retry: list[_Pending] = []
            for session, same in itertools.groupby(items, key=lambda p: p.lease.session):
                group = list(same)
                for start in range(0, len(group), self.batch):
                    retry += self._send(session, group[start:start + self.batch], final)
            if retry:
                with self._cond:
                    self._pending[:0] = retry
                    self._retries += len(retry)
                    self._due = min(self._due, *(p.send_by for p in retry))
                    self._cond.notify()

    def _send(self, session: Session, chunk: list[_Pending], final: bool) -> list[_Pending]:
        """One ``complete_many`` call; returns the items to send again."""
        answers: list[LeaseRecord | LeaseError]
        try:
            answers = session.complete_many([(p.lease, p.result) for p in chunk])
        except InvalidArgument as exc:  # a lease ended meanwhile (by its handler): alone
            if len(chunk) > 1:
                return [r for p in chunk for r in self._send(session, [p], final)]
            answers = [exc]
        except LeaseError as exc:  # StoreClosed / StoreInherited: nothing sent
            answers = [exc] * len(chunk)
        else:
            self._count("complete_batches")
            self._count("batched_completions", len(chunk))
        return [p for p, answer in zip(chunk, answers, strict=True)
                if not self._settled(p, answer, final)]

    def _settled(self, item: _Pending, answer: LeaseRecord | LeaseError, final: bool) -> bool:
        """Count and log one item's outcome; ``False``: send it again later."""
        if isinstance(answer, LeaseRecord):
            self._count("completed")
            if log.isEnabledFor(logging.INFO):  # per job: no fields built when not logged
                log.info("job completed", extra=self._fields(item.lease))
            return True
        fields = self._fields(item.lease)
        if isinstance(answer, (LeaseLost, OutcomeUnknown)):  # unknown: treated as lost
            self._count("leases_lost")
            log_lost(fields, answer, handler_returned=True)
        elif isinstance(answer, (JobCompleted, JobFailed)):
            self._count("skipped")
            log.info("job settled elsewhere", extra={**fields, "error": repr(answer)})
        elif isinstance(answer, BackendUnavailable):
            item.tries += 1
            if not final and item.tries < SETTLE_ATTEMPTS:
                log.warning("store unavailable during complete (try %d of %d)", item.tries,
                            SETTLE_ATTEMPTS, extra={**fields, "error": repr(answer)})
                item.send_by = time.monotonic() + BACKOFF_S[item.tries]
                return False
            self._count("leases_lost")
            log.error("giving up on complete: the store hands the job back after the "
                      "session's TTL and it will run again", extra={**fields,
                                                                   "error": repr(answer)})
        else:
            self._count("errors")
            log.error("completion refused", extra={**fields, "error": repr(answer)})
        return True

    # -- claiming ahead ------------------------------------------------------------------

    def release_ready(self) -> None:
        """Hand back the prefetched leases not started."""
        with self._cond:
            leases = list(self._ready)
            self._ready.clear()
        for lease in leases:
            self._release(lease)

    def _release(self, lease: Lease) -> None:
        if lease.state not in _STILL_HELD:
            self._count("prefetch_dropped")
            return
        try:
            lease.release()
        except LeaseError as exc:
            self._count("prefetch_dropped")
            log.warning("releasing a prefetched lease failed; the session's end or TTL "
                        "hands it back", extra={**self._fields(lease), "error": repr(exc)})
            return
        self._count("released")
        log.info("stopping: handing back a prefetched job", extra=self._fields(lease))

    def settle(self) -> None:
        """Wait (at most :data:`JOIN_S`) until no prefetch claim is in flight, so that a
        stopping slot sees, and works, every lease claimed for it."""
        deadline = time.monotonic() + JOIN_S
        with self._cond:
            while self._claiming and time.monotonic() < deadline:
                self._cond.wait(IDLE_WAKE_S)

    def _prefetch(self) -> None:
        try:
            self._prefetch_one()
        finally:
            with self._cond:
                self._claiming = False
                self._cond.notify_all()

    def _prefetch_one(self) -> None:
        session = self._session_of()
        with self._cond:
            if (session is None or session.state is not SessionState.ACTIVE
                    or session is self._unknown_on):
                self._empty = True  # until the slot's own claim (re)opens the session
                return
            want = min(self.config.prefetch - len(self._ready) - self._inflight,
                       self.claim_batch)
            if want < 1:
                return
            self._claiming = True
            self._inflight += want
        try:
            leases = self._claim_many(session, want)
        except (JobCompleted, JobFailed):
            self._count("skipped")
            return
        except LeaseError as exc:  # lost, suspended, unavailable: the slot's claim copes
            self._claim_failed(exc)
            return
        finally:
            with self._cond:
                self._inflight -= want
        self._keep(leases, want)

    def claim_for_slot(self, session: Session) -> Lease | None:
        """The slot's own non-waiting claim, with nothing ready: where the store claims
        many jobs per round trip, one ``claim_next_many`` for the slot's next job and
        the free prefetch room (kept ready, as a prefetch's); else ``claim_next``.

        Raises:
            what ``claim_next_many`` / ``claim_next`` raise (nothing kept then);
            ``OutcomeUnknown`` also marks ``session`` (:meth:`tainted`).
        """
        with self._cond:
            room = self.config.prefetch - len(self._ready) - self._inflight
            want = 1 + max(0, room) if self.claim_batch > 1 else 1
            self._inflight += want - 1
            self._empty = False  # a fresh look at the queue (the session may be new)
            self._cond.notify()
        try:
            leases = self._claim_many(session, want)
        finally:
            with self._cond:
                self._inflight -= want - 1
        if not leases:
            return None
        self._keep(leases[1:], want - 1)
        return leases[0]

    def _claim_many(self, session: Session, want: int) -> list[Lease]:
        """Up to ``want`` leases, in one round trip where the store batches claims."""
        try:
            if want > 1:
                return session.claim_next_many(self.config.queue, want)
            lease = session.claim_next(self.config.queue)
        except OutcomeUnknown:  # jobs may be held that no lease here knows of
            with self._cond:
                self._unknown_on = session
            raise
        return [] if lease is None else [lease]

    def _keep(self, leases: list[Lease], want: int) -> None:
        """Add claimed leases to the ready ones (oldest first), or release them if the
        feeder closed meanwhile; fewer than ``want``: the queue is (nearly) empty."""
        with self._cond:
            self._claim_errors = 0
            # kept also when the stop came meanwhile: the slot works them (a release
            # would use up an attempt of a job that never ran)
            keep = not self._closed
            if len(leases) < want:
                self._empty = True
            if keep:
                self._ready.extend(leases)
                self.stats.prefetched += len(leases)
                self.stats.prefetch_claims += bool(leases)
        if not keep:
            for lease in leases:
                self._release(lease)

    def _claim_failed(self, exc: LeaseError) -> None:
        with self._cond:
            wait = BACKOFF_S[min(self._claim_errors, len(BACKOFF_S) - 1)]
            self._claim_errors += 1
            self._retry_at = time.monotonic() + wait
        level = logging.WARNING if isinstance(exc, BackendUnavailable) else logging.INFO
        log.log(level, "prefetching failed; trying again in %.1f s", wait,
                extra={"slot": self.name, "error": repr(exc)})

    # -- the feeder's thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            action = self._next_action()
            if action is None:
                return
            try:
                action()
            except Exception:  # a bug: say so, go on
                self._count("errors")
                log.exception("unexpected error in a worker slot's feeder",
                              extra={"slot": self.name})
                with self._cond:
                    self._retry_at = time.monotonic() + BACKOFF_S[-1]

    def _next_action(self) -> Callable[[], None] | None:
        """What to do next (waiting until there is something); ``None``: closed."""
        with self._cond:
            while not self._closed:
                stopping = self.control.stopping
                now = time.monotonic()
                fresh = len(self._pending) - self._retries  # sent as soon as stopping
                if (fresh and (stopping or fresh >= self.batch)) or now >= self._due:
                    return self.flush
                if (self.config.prefetch and not stopping and not self._empty
                        and not self._slot_waiting and now >= self._retry_at
                        and self.config.prefetch - len(self._ready) - self._inflight
                        >= self.refill):
                    return self._prefetch
                self._cond.wait(max(0.0, min(self._due - now, IDLE_WAKE_S)))
            return None
