"""The verifier's worker process: ``python -m consensus_lease.verify.worker CONFIG_FILE``.

Started by :class:`consensus_lease.verify.pool.WorkerPool` as a fresh interpreter (never
forked: gRPC and kazoo clients are created here, inside the process). It goes over the
run's jobs in their order (the verifier shuffles them with the run's seed, the same order
for every worker, as in a queue), trying ``session.claim(job)`` on each it does not know
to be completed (``JobCompleted`` tells it); the first job it gets is worked as ``steps``
effects and then completed, and it starts again from the top. So every worker races for
the same next job, and a job whose holder was lost is taken over at the next pass::

    for each step:   ensure_held()  ->  think  ->  write(job, token=generation, "step-k")
                     (sometimes lease.renew())  ->  think
    then:            ensure_held()  ->  complete()

The think time *between* ``ensure_held()`` and the write is the window in which a pause
makes a stale write possible: the check passed, the lease then expires while the process
is stopped, and the write goes out afterwards with the old token. Only the destination's
fence can stop it — which is what the verifier's checker measures.

``SIGTERM`` stops the worker at its next step (it hands back what it holds and closes its
session). A *pause at the next check* is armed by creating the file ``pause_flag_path``:
at the end of the window after its next successful ``ensure_held()`` — just before the
write (or the completion) — the worker removes the file (whoever removes it first wins,
so arming and disarming cannot race), records a ``pause_point`` and SIGSTOPs itself; the
nemesis then decides exactly how long it stays stopped there.

Every operation goes to the worker's own history part file (see
:mod:`consensus_lease.verify.history`). Loops are bounded by the config's ``stop_at``
(wall-clock time of this machine) and ``max_passes``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any

from ..clock import SkewedClock
from ..errors import (
    BackendUnavailable,
    ClaimTimeout,
    FenceRejected,
    JobCompleted,
    LeaseError,
    LeaseLost,
    LeaseSuspended,
)
from ..lease import Lease
from ..observe import Observer
from ..session import Session
from ..states import LeaseState, SessionState
from ..store import LeaseStore, open_store
from .destination import LockSetMode, open_destination, read_value, write_value
from .history import HistoryWriter, outcome_of

__all__ = ["LockSetWorker", "WorkerConfig", "main"]

WRITE_ATTEMPTS = 3
"""A write that fails with BackendUnavailable is retried with the same idempotency key."""
SUSPENDED_CHECKS = 20
"""``ensure_held()`` is retried this many times (TTL/10 apart) while the session is
SUSPENDED before the job is given up."""


@dataclass
class WorkerConfig:
    """Everything a worker process needs (a JSON file named on its command line).

    Attributes:
        name: the worker's name in the history (``w3``, ``w3.1`` for a replacement).
        store_url: the lease store.
        destination: file path (SqliteFence) or SQLAlchemy URL (SqlFence).
        enforce_tokens: ``False`` for the unfenced control run.
        jobs: the run's job ids, in the order every worker tries them.
        seed: seeds this worker's think times and renew choices.
        ttl_s: session TTL requested, seconds.
        steps: effects per job.
        think_s: each think time is uniform in [0, think_s] seconds.
        renew_probability: chance of an explicit ``lease.renew()`` after a step.
        clock_offset_s: injected clock skew (seconds) of the session's clock.
        history_path: this worker's history part file.
        stop_at: wall-clock time (``time.time()``) at which the worker stops.
        pause_flag_path: the file whose existence arms a pause at the next check.
        idle_s: wait after a pass that claimed nothing, seconds.
        max_passes: bound on passes over the job list.
        open_timeout_s: how long opening the store is retried while it is unavailable,
            seconds.
        workload: ``jobs`` (this module's loop) or ``lock-set`` (:class:`LockSetWorker`:
            the one job in ``jobs`` claimed over and over, a set read and written back).
        mode: lock-set only: ``fenced`` or ``write-only`` (see
            :data:`~consensus_lease.verify.destination.LOCK_SET_MODES`).
        queue: jobs workload: empty (this module's loop, claiming by job id) or the work
            queue the verifier enqueued ``jobs`` in, worked by the worker runner
            (:class:`~consensus_lease.verify.queue_worker.QueueWorker`).
        prefetch / complete_batch / complete_flush_s: with ``queue``, the runner's knobs
            (:class:`consensus_lease.worker.WorkerConfig`).
    """

    name: str
    store_url: str
    destination: str
    jobs: list[str]
    history_path: str
    stop_at: float
    seed: int = 0
    enforce_tokens: bool = True
    ttl_s: float = 1.0
    steps: int = 3
    think_s: float = 0.1
    renew_probability: float = 0.3
    clock_offset_s: float = 0.0
    pause_flag_path: str = ""
    idle_s: float = 0.1
    max_passes: int = 100_000
    open_timeout_s: float = 60.0
    workload: str = "jobs"
    mode: str = "fenced"
    queue: str = ""
    prefetch: int = 0
    complete_batch: int = 1
    complete_flush_s: float = 0.01

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        return cls(**json.loads(text))


class Worker:
    """One worker process's loop (see the module docstring)."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.rec = HistoryWriter(config.history_path, config.name)
        self.stop = threading.Event()
        clock = SkewedClock(config.clock_offset_s) if config.clock_offset_s else None
        self.store = self._open_store(clock)
        self.destination = open_destination(
            config.destination, enforce_tokens=config.enforce_tokens, create_tables=False
        )
        self.session: Session | None = None
        self.sessions_opened = 0
        self.completed: set[str] = set()

    def _open_store(self, clock: SkewedClock | None) -> LeaseStore:
        """``open_store``, retried (one ``open_store`` operation per attempt) while the
        store is unavailable — a replacement worker may start while a member is down or
        the machine is overloaded — for at most ``open_timeout_s``.

        Raises:
            BackendUnavailable: still unavailable then (the worker exits: a crash).
        """
        give_up = time.monotonic() + self.config.open_timeout_s
        for attempt in itertools.count(1):
            index = self.rec.invoke("open_store", attempt=attempt)
            try:
                store = open_store(self.config.store_url, clock=clock,
                                   observer=self._observer())
            except BackendUnavailable as error:
                self.rec.ret(index, outcome_of(error), error=str(error))
                if time.monotonic() >= give_up:
                    raise
                time.sleep(min(1.0, max(0.0, give_up - time.monotonic())))
                continue
            self.rec.ret(index, "ok")
            return store
        raise AssertionError("unreachable")  # pragma: no cover

    def _observer(self) -> Observer | None:
        """The store's observer: none here (this loop records its own operations)."""
        return None

    # -- signals ---------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        def on_term(_signum: int, _frame: FrameType | None) -> None:
            self.stop.set()

        signal.signal(signal.SIGTERM, on_term)

    def _pause_point(self, lease: Lease, before: str, step: int, **detail: Any) -> None:
        """If armed, stop this whole process right here (after a passed check, before
        the action it guarded); ``detail`` goes to the ``pause_point`` event."""
        if not self.config.pause_flag_path:
            return
        try:
            os.unlink(self.config.pause_flag_path)  # consume the arming, atomically
        except FileNotFoundError:
            return
        self.rec.event("pause_point", job=lease.job_id, generation=lease.generation,
                       before=before, step=step, pid=os.getpid(), **detail)
        # Thread-directed, so it is delivered to this thread before pthread_kill returns:
        # with os.kill another thread could take it and this one would run on for a moment.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)

    # -- the loop --------------------------------------------------------------------

    def should_stop(self) -> bool:
        return self.stop.is_set() or time.time() >= self.config.stop_at

    def run(self) -> int:
        """Work until every job is completed, ``stop_at``, SIGTERM or ``max_passes``."""
        c = self.config
        self.rec.event("worker_start", pid=os.getpid(), clock_offset_s=c.clock_offset_s,
                       enforce_tokens=c.enforce_tokens)
        try:
            for _ in range(c.max_passes):
                pending = [j for j in c.jobs if j not in self.completed]
                if not pending or self.should_stop():
                    break
                # Work the first job that can be claimed, then start again from the top:
                # a job whose holder was lost is found at the next pass.
                worked = False
                for job in pending:
                    if self.should_stop():
                        break
                    if self._try_job(job):
                        worked = True
                        break
                if not worked:
                    self.stop.wait(c.idle_s)
        finally:
            self._close_session()
            self.rec.event("worker_exit", completed_seen=len(self.completed),
                           stopped=self.stop.is_set())
            self.store.close()
            self.destination.close()
            self.rec.close()
        return 0

    def _think(self) -> None:
        self.stop.wait(self.rng.uniform(0.0, self.config.think_s))

    # -- sessions --------------------------------------------------------------------

    def _ensure_session(self) -> Session | None:
        if self.session is not None and self.session.state in (
            SessionState.LOST, SessionState.CLOSED
        ):
            self._close_session()
        if self.session is not None:
            return self.session
        self.sessions_opened += 1
        index = self.rec.invoke("open_session", attempt=self.sessions_opened)
        try:
            session = self.store.session(
                owner=f"{self.config.name}#{self.sessions_opened}", ttl_s=self.config.ttl_s
            )
        except LeaseError as error:
            self.rec.ret(index, outcome_of(error), error=str(error))
            self.stop.wait(self.config.idle_s)
            return None

        def on_lost(lost: Session, reason: LeaseLost) -> None:
            self.rec.event("session_lost", session=lost.session_id, reason=str(reason))

        session.on_lost(on_lost)
        self.rec.ret(index, "ok", session=session.session_id,
                     granted_ttl_s=session.granted_ttl_s)
        self.session = session
        return session

    def _close_session(self) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        index = self.rec.invoke("close_session", session=session.session_id)
        try:
            session.close()
        except LeaseError as error:
            self.rec.ret(index, outcome_of(error), error=str(error))
            return
        self.rec.ret(index, "ok")

    # -- one job ---------------------------------------------------------------------

    def _try_job(self, job: str) -> bool:
        """Try to claim ``job`` and work it; True if it was claimed."""
        session = self._ensure_session()
        if session is None:
            return False
        index = self.rec.invoke("claim", job=job)
        try:
            lease = session.claim(job)
        except JobCompleted as error:
            self.rec.ret(index, "completed_before", generation=error.generation)
            self.completed.add(job)
            return False
        except LeaseError as error:
            self.rec.ret(index, outcome_of(error), error=str(error))
            if isinstance(error, LeaseLost):
                self._close_session()
            return False
        if lease is None:
            self.rec.ret(index, "held")
            return False
        self.rec.ret(index, "claimed", generation=lease.generation)
        self._work(lease)
        return True

    def _work(self, lease: Lease) -> None:
        c = self.config
        for step in range(c.steps):
            if self.should_stop() or not self._check(lease, "write", step):
                self._abandon(lease)
                return
            self._think()  # the window between the check and the effect ...
            self._pause_point(lease, "write", step)  # ... which a pause can stretch
            if self._write(lease, step) not in ("accepted", "duplicate"):
                self._abandon(lease)
                return
            if self.rng.random() < c.renew_probability and not self._renew(lease):
                self._abandon(lease)
                return
            self._think()
        if self.should_stop() or not self._check(lease, "complete", c.steps):
            self._abandon(lease)
            return
        self._pause_point(lease, "complete", c.steps)
        index = self.rec.invoke("complete", job=lease.job_id, generation=lease.generation)
        try:
            lease.complete(c.name.encode())
        except LeaseError as error:
            self.rec.ret(index, outcome_of(error), error=str(error))
            self._abandon(lease)
            return
        self.rec.ret(index, "ok")
        self.completed.add(lease.job_id)

    def _check(self, lease: Lease, before: str, step: int) -> bool:
        """``ensure_held()``, recorded; waits out a SUSPENDED session (bounded)."""
        for _ in range(SUSPENDED_CHECKS):
            index = self.rec.invoke("check", job=lease.job_id, generation=lease.generation,
                                    before=before, step=step)
            try:
                lease.ensure_held()
            except LeaseSuspended as error:
                self.rec.ret(index, "suspended", error=str(error))
                if self.stop.wait(self.config.ttl_s / 10):
                    return False
                continue
            except LeaseError as error:
                self.rec.ret(index, outcome_of(error), error=str(error))
                return False
            self.rec.ret(index, "ok", remaining_s=round(lease.remaining_s(), 4))
            return True
        return False

    def _write(self, lease: Lease, step: int) -> str:
        effect_id = f"step-{step}"
        payload = json.dumps({"worker": self.config.name, "step": step}).encode()
        outcome = "unavailable"
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            index = self.rec.invoke("write", job=lease.job_id, generation=lease.generation,
                                    effect_id=effect_id, attempt=attempt)
            try:
                result = self.destination.apply(lease.job_id, lease.generation, effect_id,
                                                payload)
            except FenceRejected as error:
                self.rec.ret(index, "fence_rejected", highest_seen=error.highest_seen)
                return "fence_rejected"
            except BackendUnavailable as error:
                self.rec.ret(index, outcome_of(error), error=str(error))
                outcome = "unavailable"
                if self.stop.wait(0.05 * attempt):
                    break
                continue
            self.rec.ret(index, result.value)
            return result.value
        return outcome

    def _renew(self, lease: Lease) -> bool:
        index = self.rec.invoke("renew", job=lease.job_id, generation=lease.generation)
        try:
            lease.renew()
        except (BackendUnavailable, LeaseSuspended) as error:  # not a loss: the deadline decides
            self.rec.ret(index, outcome_of(error), error=str(error))
            return True
        except LeaseError as error:
            self.rec.ret(index, outcome_of(error), error=str(error))
            return False
        self.rec.ret(index, "ok")
        return True

    def _abandon(self, lease: Lease) -> None:
        """Stop working ``lease``: hand it back if still held; drop a lost session.

        A SUSPENDED lease may come back HELD (and then stay held by this session with
        nobody working it), so wait, bounded by the lease's own deadline, until it is
        HELD again (then release it) or LOST."""
        give_up = time.monotonic() + max(0.0, lease.remaining_s()) + 1.0
        while lease.state is LeaseState.SUSPENDED and time.monotonic() < give_up:
            if self.stop.wait(self.config.ttl_s / 10):
                break
        if lease.state is LeaseState.HELD:
            index = self.rec.invoke("release", job=lease.job_id, generation=lease.generation)
            try:
                lease.release()
            except LeaseError as error:
                self.rec.ret(index, outcome_of(error), error=str(error))
            else:
                self.rec.ret(index, "ok")
        if self.session is not None and self.session.state in (
            SessionState.LOST, SessionState.CLOSED
        ):
            self._close_session()


class LockSetWorker(Worker):
    """Jepsen's lock-set client (:mod:`consensus_lease.verify.lockset`): until stopped,
    claim the run's one job (waiting up to 2 TTL), read the set at the destination, add
    this worker's next item (``<name>-<n>``), think ``think_s``, write the set back and
    release. Recorded as ``claim``, ``read``, ``write`` (the item in its detail; an
    ``accepted`` write is an acknowledged update) and ``release`` operations. It never
    calls ``ensure_held()`` between the read and the write-back: a pause can land
    anywhere, and only the destination stands between a late write-back and the set."""

    def run(self) -> int:
        c = self.config
        job = c.jobs[0]
        self.rec.event("worker_start", pid=os.getpid(), clock_offset_s=c.clock_offset_s,
                       enforce_tokens=c.enforce_tokens, workload=c.workload, mode=c.mode)
        items = 0
        try:
            while not self.should_stop():
                session = self._ensure_session()
                if session is None:
                    continue
                index = self.rec.invoke("claim", job=job)
                try:
                    lease = session.claim(job, wait_s=2 * c.ttl_s)
                except ClaimTimeout as error:
                    self.rec.ret(index, "timeout", error=str(error))
                    continue
                except LeaseError as error:
                    self.rec.ret(index, outcome_of(error), error=str(error))
                    if isinstance(error, LeaseLost):
                        self._close_session()
                    continue
                self.rec.ret(index, "claimed", generation=lease.generation)
                items += 1
                self._read_modify_write(lease, f"{c.name}-{items}")
                self._release(lease)
        finally:
            self._close_session()
            self.rec.event("worker_exit", items=items, stopped=self.stop.is_set())
            self.store.close()
            self.destination.close()
            self.rec.close()
        return 0

    def _read_modify_write(self, lease: Lease, item: str) -> None:
        mode: LockSetMode = "write-only" if self.config.mode == "write-only" else "fenced"
        job, token = lease.job_id, lease.generation
        index = self.rec.invoke("read", job=job, generation=token, mode=mode)
        try:
            value, read = read_value(self.destination, mode, job, token)
        except LeaseError as error:
            self.rec.ret(index, outcome_of(error), error=str(error))
            return
        members = set(json.loads(value)) if value else set()
        self.rec.ret(index, "ok", size=len(members))
        self.stop.wait(self.config.think_s)  # the work between the read and the write-back
        index = self.rec.invoke("write", job=job, generation=token, item=item, mode=mode)
        try:
            write_value(self.destination, mode, job, token, read, item,
                        json.dumps(sorted(members | {item})).encode())
        except FenceRejected as error:
            self.rec.ret(index, "fence_rejected", highest_seen=error.highest_seen)
            return
        except LeaseError as error:
            self.rec.ret(index, outcome_of(error), error=str(error))
            return
        self.rec.ret(index, "accepted")

    def _release(self, lease: Lease) -> None:
        index = self.rec.invoke("release", job=lease.job_id, generation=lease.generation)
        try:
            lease.release()
        except LeaseError as error:
            self.rec.ret(index, outcome_of(error), error=str(error))
            if isinstance(error, LeaseLost):
                self._close_session()
            return
        self.rec.ret(index, "ok")


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``argv[0]`` is the path of a file holding the config as JSON (see
    :class:`WorkerConfig`; the job list can be too long for a command line)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m consensus_lease.verify.worker CONFIG_FILE", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as file:
        config = WorkerConfig.from_json(file.read())
    worker: Worker
    if config.workload == "lock-set":
        worker = LockSetWorker(config)
    elif config.queue:
        from .queue_worker import QueueWorker  # it imports this module

        worker = QueueWorker(config)
    else:
        worker = Worker(config)
    worker.install_signal_handlers()
    return worker.run()


if __name__ == "__main__":
    raise SystemExit(main())
