"""The renewal scheduler shared by the sessions of one store: keepalives and deadlines.

A session used to renew on a keepalive thread of its own and watch its deadline on a
second one: 2,000 sessions in one process were 4,000 threads, and on a busy host the
process, not the store, became the queue (answered renewals' p99 4.7 s, most sessions
lost). Here the sessions of one store share

* one **scheduler** thread: a heap of the sessions' next keepalive times. A session that
  is due is handed to the runners; its next time is computed from that keepalive's
  outcome (:meth:`Liveness.keepalive_step`), so one session never has two keepalives in
  flight, and a session's schedule is exactly what its own thread would have kept;
* **runners**: daemon threads that make the keepalive calls, started when every runner
  is busy and a session is due, up to :data:`MAX_RUNNERS`. A driver that can pipeline
  keepalives (etcd: many requests on one stream, ``Backend.keepalive_batch``) is handed
  the sessions due together in one call, and each session's answer is handled as it
  comes; others get one session per call. A slow or failing keepalive
  occupies one runner and delays nobody else's (each call is bounded by its driver's
  per-call budget); a healthy store needs a handful of runners for thousands of
  sessions. (Not :class:`concurrent.futures.ThreadPoolExecutor`: its threads are joined
  at interpreter exit, which would make a process wait for keepalives it no longer
  needs.)
* one **watchdog** thread: a heap of the sessions' local deadlines. A deadline only ever
  moves later, so an entry found early is pushed back with the session's current
  deadline; one found passed makes the session LOST. Each loss (its listeners, the
  user's callbacks) runs on a thread of its own, so a slow callback delays no other
  session's loss. Reading a session's state never depends on this thread: once the deadline has
  passed, :attr:`Liveness.state` is LOST on its own.

Threads end when there is nothing left for them (no session, or a runner idle for 5 s)
and start again with the next session, so a store whose sessions are closed keeps none.

Sharing threads is not sharing failure: every session keeps its own deadline, its own
retry delays and its own errors; nothing here ends a session but its own deadline or its
own keepalive's answer.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING

from .clock import Clock
from .errors import StoreClosed

if TYPE_CHECKING:  # the renewer drives Liveness objects, which are given one
    from ._liveness import Liveness

__all__ = ["COALESCE_S", "MAX_RUNNERS", "Renewer", "on_renewer_thread"]

log = logging.getLogger("consensus_lease")

MAX_RUNNERS = 64
"""Most keepalive calls of one store in flight at once. A call is bounded by its
driver's budget (etcd: two thirds of the granted TTL, at most ``timeout_s``); more
sessions than this due at once wait their turn in due order."""


COALESCE_S = 0.05
"""For a driver that pipelines keepalives (``Backend.keepalive_batch`` > 1), sessions due
within this many seconds are renewed together: a renewal sent up to 50 ms early only
moves that session's deadline 50 ms less far (the deadline counts from the send)."""


_local = threading.local()


def on_renewer_thread() -> bool:
    """Whether this thread is a keepalive runner (shared by the store's sessions):
    whatever would block it, a user's loss callback above all, must go elsewhere."""
    return bool(getattr(_local, "runner", False))


class Renewer:
    """Keepalive scheduler, runners and deadline watchdog for the sessions of one store
    that use one clock. Threads start with the first session and end at :meth:`close`.

    Thread-safe. Not fork-safe, like the sessions it serves: in a fork's child its
    threads do not exist (a child's sessions are refused before they get here).
    """

    def __init__(self, clock: Clock, *, max_runners: int = MAX_RUNNERS,
                 idle_s: float = 5.0) -> None:
        self.clock = clock
        self._max_runners = max_runners
        self._idle_s = idle_s  # a runner with nothing to do this long ends
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._due: list[tuple[float, int, Liveness]] = []  # next keepalive times
        self._deadlines: list[tuple[float, int, Liveness]] = []
        self._ready: deque[Liveness] = deque()  # due, waiting for a runner
        self._members: set[Liveness] = set()  # sessions not yet over
        self._runners = 0
        self._idle = 0
        self._work = threading.Condition(self._lock)
        self._wake_scheduler = threading.Event()
        self._wake_watchdog = threading.Event()
        self._stop = threading.Event()
        self._scheduling = False  # the scheduler thread runs
        self._watching = False  # the watchdog thread runs
        self._scheduler_until = float("inf")
        self._watchdog_until = float("inf")

    # -- sessions -------------------------------------------------------------------------

    def add(self, liveness: Liveness, *, keepalive: bool) -> None:
        """Watch ``liveness``'s deadline, and renew it unless ``keepalive`` is false."""
        with self._lock:
            if self._stop.is_set():
                raise StoreClosed("the store was closed while this session was opened")
            if not self._watching:
                self._watching = True
                self._thread(self._watchdog_loop, "deadlines")
            if keepalive and not self._scheduling:
                self._scheduling = True
                self._thread(self._scheduler_loop, "keepalives")
            self._members.add(liveness)
            deadline = liveness.deadline
            heapq.heappush(self._deadlines, (deadline, next(self._seq), liveness))
            wake_watchdog = deadline < self._watchdog_until
            wake_scheduler = False
            if keepalive:
                due = liveness.keepalive_due()
                if due is not None:
                    heapq.heappush(self._due, (due, next(self._seq), liveness))
                    wake_scheduler = due < self._scheduler_until
        if wake_watchdog:
            self._wake_watchdog.set()
        if wake_scheduler:
            self._wake_scheduler.set()

    def discard(self, liveness: Liveness) -> None:
        """``liveness`` is over (closed or lost): once no session is left, the threads
        end (and start again with the next :meth:`add`)."""
        with self._lock:
            self._members.discard(liveness)
            if self._members:
                return
            self._due.clear()
            self._deadlines.clear()
        self._wake_scheduler.set()
        self._wake_watchdog.set()

    def close(self) -> None:
        """Stop every thread (a runner in a keepalive call ends after it). Idempotent."""
        with self._lock:
            self._stop.set()
            self._due.clear()
            self._deadlines.clear()
            self._ready.clear()
            self._members.clear()
            self._work.notify_all()
        self._wake_scheduler.set()
        self._wake_watchdog.set()

    @property
    def runners(self) -> int:
        """Runner threads started (for tests and metrics)."""
        with self._lock:
            return self._runners

    def _thread(self, target: object, what: str) -> None:
        thread = threading.Thread(target=target, name=f"consensus-lease-{what}",  # type: ignore[arg-type]
                                  daemon=True)
        thread.start()

    # -- keepalives -----------------------------------------------------------------------

    def _scheduler_loop(self) -> None:
        clock = self.clock
        while not self._stop.is_set():
            now = clock.monotonic()
            with self._lock:
                while self._due and self._due[0][0] <= now + (
                        COALESCE_S if self._due[0][2].backend.keepalive_batch > 1 else 0.0):
                    _, _, liveness = heapq.heappop(self._due)
                    self._ready.append(liveness)
                if self._ready:
                    self._dispatch()
                if not self._due and not self._ready and self._idle == self._runners:
                    self._scheduling = False  # no session to renew: add() starts it again
                    self._scheduler_until = float("inf")
                    return
                until = self._due[0][0] if self._due else float("inf")
                self._scheduler_until = until
                self._wake_scheduler.clear()
            clock.wait(self._wake_scheduler, min(until - clock.monotonic(), 3600.0))

    def _dispatch(self) -> None:
        """Hand ready sessions to idle runners, starting runners as needed (lock held)."""
        batch = max(1, self._ready[0].backend.keepalive_batch)
        want = -(-len(self._ready) // batch) - self._idle  # runners needed, rounded up
        while want > 0 and self._runners < self._max_runners:
            self._runners += 1
            self._idle += 1
            want -= 1
            self._thread(self._runner_loop, "keepalive")
        self._work.notify(len(self._ready))

    def _runner_loop(self) -> None:
        _local.runner = True
        while True:
            with self._lock:
                while not self._ready and not self._stop.is_set():
                    if not self._work.wait(self._idle_s) and not self._ready:
                        break  # idle: end (the scheduler starts another when needed)
                if self._stop.is_set() or not self._ready:
                    self._runners -= 1
                    self._idle -= 1
                    return
                batch = [self._ready.popleft()]
                backend = batch[0].backend
                while (len(batch) < backend.keepalive_batch and self._ready
                       and self._ready[0].backend is backend):
                    batch.append(self._ready.popleft())
                self._idle -= 1
            if len(batch) == 1:
                self._step(batch[0])
            else:
                self._step_many(batch)
            with self._lock:
                self._idle += 1

    def _step(self, liveness: Liveness) -> None:
        try:
            liveness.keepalive_step()
        except Exception:  # a bug here must not end the runner or other sessions
            log.exception("keepalive step crashed",
                          extra={"session_id": liveness.handle.session_id})
        self._reschedule(liveness)

    def _step_many(self, batch: list[Liveness]) -> None:
        """The keepalives of ``batch`` (one backend) sent together: each session's
        outcome is handled, and the session rescheduled, as its own answer comes."""
        sending = [liveness for liveness in batch if liveness.keepalive_begin()]
        for liveness in batch:
            if liveness not in sending:
                self._reschedule(liveness)
        if not sending:
            return
        ended = [False] * len(sending)
        send = self.clock.monotonic()

        def on_result(i: int, result: float | Exception) -> None:
            ended[i] = True
            liveness = sending[i]
            try:
                liveness.keepalive_end(send, result)
            except Exception:
                log.exception("keepalive step crashed",
                              extra={"session_id": liveness.handle.session_id})
            self._reschedule(liveness)

        try:
            batch[0].backend.keepalive_many([liveness.handle for liveness in sending],
                                            on_result)
        except Exception as exc:  # a driver bug: each session still gets an outcome
            log.exception("keepalive_many crashed")
            for i, done in enumerate(ended):
                if not done:
                    on_result(i, exc)

    def _reschedule(self, liveness: Liveness) -> None:
        due = liveness.keepalive_due()
        with self._lock:
            if due is None or self._stop.is_set():
                return
            heapq.heappush(self._due, (due, next(self._seq), liveness))
            if not self._scheduling:  # it ended while this call was in flight
                self._scheduling = True
                self._thread(self._scheduler_loop, "keepalives")
            wake = due < self._scheduler_until
        if wake:
            self._wake_scheduler.set()

    # -- deadlines ------------------------------------------------------------------------

    def _watchdog_loop(self) -> None:
        clock = self.clock
        while not self._stop.is_set():
            now = clock.monotonic()
            passed: list[Liveness] = []
            with self._lock:
                while self._deadlines and self._deadlines[0][0] <= now:
                    _, _, liveness = heapq.heappop(self._deadlines)
                    if liveness.ended():
                        continue
                    deadline = liveness.deadline
                    if deadline > now:  # renewed since: look again then
                        heapq.heappush(self._deadlines, (deadline, next(self._seq), liveness))
                    else:
                        passed.append(liveness)
                if not self._deadlines:
                    self._watching = False  # no session left: add() starts it again
                    self._watchdog_until = float("inf")
                    stop = True
                else:
                    stop = False
                until = self._deadlines[0][0] if self._deadlines else float("inf")
                self._watchdog_until = until
                self._wake_watchdog.clear()
            for liveness in passed:  # one thread each: a slow callback delays no other
                threading.Thread(target=_lose, args=(liveness,), daemon=True,
                                 name="consensus-lease-deadline-passed").start()
            if stop:
                return
            clock.wait(self._wake_watchdog, min(until - clock.monotonic(), 3600.0))


def _lose(liveness: Liveness) -> None:
    try:
        liveness.deadline_check()
    except Exception:  # a listener's failure is logged by mark_lost; this is a bug
        log.exception("marking a session lost failed",
                      extra={"session_id": liveness.handle.session_id})
