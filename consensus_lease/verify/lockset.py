"""Jepsen's lock-set workload as a ``verify`` mode: a set read and written back under the lease.

``consensus-lease verify --workload lock-set`` (or :func:`run_lockset`): ``workers``
processes (default 5) share one job. Each loops: claim it (TTL ``ttl_s``, default 2 s),
read the set at the destination, add its next item, think ``think_s``, write the set back,
release (:class:`~consensus_lease.verify.worker.LockSetWorker`). Every ``pause_every_s``
seconds (default 5) the nemesis SIGSTOPs a worker for ``pause_min_s``-``pause_max_s``
seconds (default 3-5: past its TTL, so the job is taken over if it held it), then
SIGCONTs it — a random worker (Jepsen's choice) or, with ``pause_target="holder"``, the
one the store shows holding the job. After ``duration_s`` (default 90) the workers are
stopped and the destination's final set is read. An item is *acknowledged* once its
write-back returned accepted; an acknowledged item missing from the final set is a
**lost update**.

Two modes (:data:`~consensus_lease.verify.destination.LOCK_SET_MODES`): ``fenced``
reads with ``read_fenced`` and writes back with ``write_fenced``, and must lose nothing;
``write-only`` is the control: the set read unfenced, only the write fenced (``apply``
with the token). A paused holder's write-back can then land after the new holder's read
and be dropped by that holder's write-back: the model checker's ``write-only-fenced``
mutation (docs/model.md) finds this in 15 steps; on real stores the window (a late write
between a newer holder's read and its first write-back) is narrow, so the control loses
an update in some runs only.

The verdict (:attr:`LockSetResult.exit_status`), as for the job workload: 0 PASS —
nothing lost and at least one takeover (a job claimed while its previous holder had not
released it: a pause outlasted a holder's lease, so a late write-back was possible);
1 FAIL — an acknowledged update lost (in ``write-only`` mode the expected result: the
report says so); 2 INCONCLUSIVE — nothing lost but a worker crashed or no takeover
happened (the run proved nothing).
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from ..errors import InvalidArgument, LeaseError
from ..record import JobState
from .destination import LOCK_SET_MODES, LockSetMode, final_value
from .history import Op, read_parts, write_history
from .interrupts import interruptible
from .kit import KitCluster
from .nemesis import FAULTS, MAX_FAULTS, Active, Fault, Nemesis, NemesisContext, PlannedFault
from .pool import WorkerPool
from .progress import RunStatus, StatusTicker
from .runner import (
    MAX_WORKERS,
    STOP_GRACE_S,
    Progress,
    VerifyConfig,
    Watch,
    _check_int,
    _check_places,
    _check_seconds,
    _CrashWatch,
    _Ends,
    _Run,
    check_run_length,
    no_password,
)
from .worker import WorkerConfig

__all__ = ["PAUSE_TARGETS", "LockSetConfig", "LockSetReport", "LockSetResult", "PauseHolder",
           "account", "run_lockset"]

PAUSE_TARGETS = ("random", "holder")
"""Which worker a pause stops: ``random`` (Jepsen's), or ``holder`` (the one the store
shows holding the job: every pause then forces a takeover)."""

_POLL_S = 0.02


@dataclass
class LockSetConfig:
    """A lock-set run's parameters (defaults: Jepsen's workload).

    Attributes:
        backend: store URL; ``None`` uses ``cluster``.
        cluster: ``sqlite`` (a file in the run directory), ``etcd`` or ``zookeeper`` (a
            3-member cluster started with the container kit), when ``backend`` is ``None``.
        workers: worker processes (1-32).
        ttl_s: session TTL, seconds.
        duration_s: how long the workers run, seconds.
        pause_every_s: a pause starts every this many seconds (the first at this time;
            one that outlasts it delays the next), seconds.
        pause_min_s / pause_max_s: each pause's length is uniform in this range, seconds.
        pause_target: ``random`` or ``holder`` (:data:`PAUSE_TARGETS`).
        mode: ``fenced`` or ``write-only`` (the control).
        seed: derives the pause schedule (targets, lengths).
        think_s: the work between the read and the write-back, seconds.
        destination: SQLAlchemy URL of the destination (default: a SqliteFence file in
            the run directory).
        history: the history file (default ``<run dir>/history.jsonl``).
        run_dir: where the run's files go: a new or empty directory (default: a new
            temporary directory); one holding a run's files already is refused.
    """

    backend: str | None = None
    cluster: str = "sqlite"
    workers: int = 5
    ttl_s: float = 2.0
    duration_s: float = 90.0
    pause_every_s: float = 5.0
    pause_min_s: float = 3.0
    pause_max_s: float = 5.0
    pause_target: str = "random"
    mode: LockSetMode = "fenced"
    seed: int = 1
    think_s: float = 0.02
    destination: str | None = None
    history: str | None = None
    run_dir: str | None = None

    def validate(self) -> None:
        """Check every field; changes nothing.

        Raises:
            InvalidArgument: naming the first bad field: of the wrong type (as
                ``VerifyConfig.validate`` checks them: a bool is no int or number of
                seconds; ``history``, ``run_dir`` a str or path; ``backend``,
                ``destination`` a str or ``None``), out of range, or pauses that could
                never outlast the TTL.
        """
        _check_places(self)
        _check_int("workers", self.workers, 1, MAX_WORKERS)
        _check_int("seed", self.seed)
        for name in ("ttl_s", "pause_every_s", "pause_min_s", "pause_max_s"):
            _check_seconds(name, getattr(self, name), positive=True)
        for name in ("duration_s", "think_s"):
            _check_seconds(name, getattr(self, name))
        check_run_length(self.duration_s, 0.0, self.ttl_s)
        if self.duration_s / self.pause_every_s > MAX_FAULTS + 1:
            raise InvalidArgument(
                f"a pause every {self.pause_every_s} s for {self.duration_s} s is more than "
                f"{MAX_FAULTS} pauses: use a longer pause_every_s or a shorter duration_s")
        if not self.pause_min_s <= self.pause_max_s:
            raise InvalidArgument(f"pause_min_s {self.pause_min_s} is above pause_max_s "
                                  f"{self.pause_max_s}")
        if self.pause_max_s <= self.ttl_s:
            raise InvalidArgument(
                f"pauses of at most {self.pause_max_s} s never outlast the TTL "
                f"({self.ttl_s} s): no job would be taken over and the run could only be "
                "inconclusive; use longer pauses or a shorter TTL")
        if self.pause_target not in PAUSE_TARGETS:
            raise InvalidArgument(f"pause_target must be one of {', '.join(PAUSE_TARGETS)}: "
                                  f"{self.pause_target!r}")
        if self.mode not in LOCK_SET_MODES:
            raise InvalidArgument(f"mode must be one of {', '.join(LOCK_SET_MODES)}: "
                                  f"{self.mode!r}")

    def schedule(self) -> list[PlannedFault]:
        """The pauses: one every ``pause_every_s`` before ``duration_s`` (at most
        :data:`~consensus_lease.verify.nemesis.MAX_FAULTS`, as for the job workload), each of a
        seeded length in [``pause_min_s``, ``pause_max_s``] on a seeded slot (the slot is
        ignored by ``holder`` pauses). A pure function of the config."""
        rng = random.Random(self.seed)
        kind = "pause" if self.pause_target == "random" else PauseHolder.name
        out: list[PlannedFault] = []
        k = 1
        while k * self.pause_every_s < self.duration_s and len(out) < MAX_FAULTS:
            out.append(PlannedFault(round(k * self.pause_every_s, 3), kind,
                                    rng.randrange(self.workers),
                                    round(rng.uniform(self.pause_min_s, self.pause_max_s), 3)))
            k += 1
        return out

    def as_verify_config(self) -> VerifyConfig:
        """The job workload's config the shared machinery (store, destination, worker
        pool, clean-up) is opened with: one job, no quiet period."""
        return VerifyConfig(backend=self.backend, cluster=self.cluster, workers=self.workers,
                            jobs=1, steps=1, ttl_s=self.ttl_s, duration_s=self.duration_s,
                            quiet_s=0.0, seed=self.seed, faults=("pause",),
                            history=self.history, destination=self.destination,
                            think_s=self.think_s, run_dir=self.run_dir)


class PauseHolder:
    """The ``pause-holder`` fault: SIGSTOP the worker the store shows holding the job.

    Args:
        holder: returns the slot of the worker holding the job now, or ``None``.
    """

    name: ClassVar[str] = "pause-holder"
    hold_ttl: ClassVar[tuple[float, float]] = (1.5, 2.5)
    targets_member: ClassVar[bool] = False
    needs_cluster: ClassVar[bool] = False

    def __init__(self, holder: Callable[[], int | None]) -> None:
        self.holder = holder

    def inject(self, ctx: NemesisContext, planned: PlannedFault) -> Active | None:
        """Waits up to 2 TTL for a holder; ``None`` (skipped) if none was seen."""
        give_up = time.monotonic() + 2 * ctx.ttl_s
        while time.monotonic() < give_up and not ctx.stop.is_set():
            slot = self.holder()
            if slot is not None and ctx.workers.pause(slot):
                return Active(f"SIGSTOP the holder, worker slot {slot}, for "
                              f"{planned.hold_s:.2f} s",
                              heal=functools.partial(ctx.workers.resume, slot))
            time.sleep(_POLL_S * 5)
        return None


def slot_of(owner: str | None) -> int | None:
    """``"w3#2"`` (a lock-set session's owner label) -> 3; ``None`` if it is not one."""
    if not owner or not owner.startswith("w"):
        return None
    name = owner[1:].split("#", 1)[0].split(".", 1)[0]
    return int(name) if name.isdigit() else None


@dataclass
class LockSetReport:
    """What the history and the final set show (:func:`account`).

    Attributes:
        acknowledged: items whose write-back returned accepted.
        in_final_set: acknowledged items in the final set.
        lost: acknowledged items missing from it (sorted; each one a lost update).
        unacknowledged_in_set: items in the final set whose write-back never returned
            accepted (cut short, or unknown): not acknowledged, so not counted.
        pauses: pauses injected and healed.
        takeovers: claims whose previous holder (the next lower generation) never
            released successfully: its lease expired, a late write-back was possible.
        claims: successful claims.
        reads_refused / writes_refused: fenced reads / write-backs the fence refused
            (``FenceRejected``: a newer holder had read or written).
        leases_lost: releases that found the lease lost (its session expired or the job
            taken over).
        outcomes: every operation's outcome, ``"op:outcome" -> count``.
    """

    acknowledged: int
    in_final_set: int
    lost: list[str]
    unacknowledged_in_set: int
    pauses: int
    takeovers: int
    claims: int
    reads_refused: int
    writes_refused: int
    leases_lost: int
    outcomes: dict[str, int] = field(default_factory=dict)


def account(ops: Iterable[Op], final: Iterable[str]) -> LockSetReport:
    """The lost-update accounting of a lock-set run: a pure function of its history
    (the workers' ``claim`` / ``read`` / ``write`` / ``release`` operations, the nemesis's
    ``fault`` operations) and the items of the final set."""
    ops = list(ops)
    final_set = set(final)
    acked = {str(o.detail.get("item")) for o in ops
             if o.op == "write" and o.outcome == "accepted"}
    claims = sorted((o.generation, o.process) for o in ops
                    if o.op == "claim" and o.outcome == "claimed" and o.generation is not None)
    released = {o.generation for o in ops if o.op == "release" and o.outcome == "ok"}
    takeovers = sum(1 for (prev, _), _cur in itertools.pairwise(claims) if prev not in released)
    outcomes = Counter(f"{o.op}:{o.outcome}" for o in ops
                       if o.op in ("claim", "read", "write", "release", "fault"))
    return LockSetReport(
        acknowledged=len(acked), in_final_set=len(acked & final_set),
        lost=sorted(acked - final_set), unacknowledged_in_set=len(final_set - acked),
        pauses=sum(1 for o in ops if o.op == "fault" and o.outcome in ("healed", "heal_error")),
        takeovers=takeovers, claims=len(claims),
        reads_refused=outcomes["read:fence_rejected"],
        writes_refused=outcomes["write:fence_rejected"],
        leases_lost=sum(n for k, n in outcomes.items()
                        if k.startswith("release:") and k != "release:ok"),
        outcomes=dict(sorted(outcomes.items())),
    )


@dataclass
class LockSetResult:
    """A lock-set run's result.

    Attributes:
        config: what was run.
        report: the accounting (:class:`LockSetReport`).
        history_path / run_dir: the run's history and files.
        store_url / destination: where leases and the set lived.
        elapsed_s: wall time of the whole run, seconds.
        worker_crashes: workers that died on their own (``name (exit N): output``).
    """

    config: LockSetConfig
    report: LockSetReport
    history_path: Path
    run_dir: Path
    store_url: str
    destination: str
    elapsed_s: float
    worker_crashes: list[str] = field(default_factory=list)

    @property
    def control(self) -> bool:
        """The write-only-fenced control (a loss is its expected result)."""
        return self.config.mode == "write-only"

    @property
    def inconclusive(self) -> list[str]:
        """Why a run without a lost update proves nothing (empty: it does)."""
        reasons = [f"{len(self.worker_crashes)} worker(s) crashed"] if self.worker_crashes else []
        if self.report.takeovers == 0:
            reasons.append(
                f"no takeover: none of the {self.report.pauses} pause(s) stopped a worker "
                "while it held the job, so no late write-back met the destination; run "
                "longer, or pause the holder (--pause-target holder)")
        return reasons

    @property
    def exit_status(self) -> int:
        """1: an acknowledged update lost (whatever else); 2: inconclusive; 0: PASS."""
        if self.report.lost:
            return 1
        return 2 if self.inconclusive else 0


def run_lockset(config: LockSetConfig, progress: Progress | None = None, *,
                cluster: KitCluster | None = None, watch: Watch | None = None) -> LockSetResult:
    """Run the lock-set workload once (the module docstring).

    Args:
        config: the run's parameters.
        progress: called with one line of text per phase.
        cluster: a running cluster to use (``KitCluster.adopt(...)``) instead of
            ``config.cluster``/``config.backend``; left running afterwards.
        watch: called with a :class:`~consensus_lease.verify.progress.RunStatus` about
            four times a second while the workers run (from another thread).

    Returns:
        The result; ``result.exit_status`` is 0 only with no lost update in a run that
        saw at least one takeover.

    Raises:
        InvalidArgument: bad configuration, a ``run_dir`` that already holds a run's
            files (nothing is changed), or a TTL outside the store's range.
        UnsupportedBackend / UnsupportedOperation / BackendUnavailable: the store or the
            destination cannot be used (a store of one process only cannot be shared by
            worker processes).
        Interrupted: SIGINT or SIGTERM stopped the run: every pause healed and every
            worker ended first; no result.
    """
    config.validate()
    with interruptible():
        run = _LockSetRun(config, progress or (lambda _message: None), watch, cluster)
        try:
            return run.execute_lockset()
        finally:
            run.close()


class _LockSetRun(_Run):
    """The job workload's run (store, destination, pool, progress, clean-up) with the
    lock-set's job, workers, pauses and accounting."""

    def __init__(self, config: LockSetConfig, say: Progress, watch: Watch | None,
                 cluster: KitCluster | None) -> None:
        super().__init__(config.as_verify_config(), say, watch, cluster)
        self.lockset = config
        self.jobs = [f"v{self.run_id}-lockset"]
        self.think_s = config.think_s

    def execute_lockset(self) -> LockSetResult:
        ends = self._open()
        self.schedule = self.lockset.schedule()
        self._record_run(ends)
        pool = self._start_workers(ends)
        ticker = StatusTicker(self._status, self.watch) if self.watch else None
        if ticker is not None:
            ticker.start()
        try:
            self._pauses(pool, ends)
        finally:
            if ticker is not None:
                ticker.stop()
        self.say("stopping the workers; reading the final set")
        pool.stop_all(STOP_GRACE_S)
        return self._account(pool, ends)

    def _record_run(self, ends: _Ends) -> None:
        config = self.lockset
        self.recorder.event(
            "run", run_id=self.run_id, workload="lock-set", jobs=self.jobs,
            store=no_password(ends.store_url), destination=no_password(ends.destination_spec),
            config={**asdict(config), "backend": no_password(config.backend),
                    "destination": no_password(config.destination)},
            schedule=[asdict(p) for p in self.schedule])

    def _start_workers(self, ends: _Ends) -> WorkerPool:
        config = self.lockset
        template = WorkerConfig(
            name="", store_url=ends.store_url, destination=ends.destination_spec,
            jobs=self.jobs, history_path="", seed=config.seed, ttl_s=config.ttl_s,
            think_s=config.think_s, idle_s=min(0.2, config.ttl_s / 5),
            stop_at=time.time() + config.duration_s + STOP_GRACE_S + 120.0,  # a bound only
            workload="lock-set", mode=config.mode,
        )
        self.pool = pool = WorkerPool(template, slots=config.workers,
                                      parts_dir=self.parts_dir, logs_dir=self.logs_dir)
        self.say(f"lock-set ({config.mode}): {config.workers} workers on one job, TTL "
                 f"{config.ttl_s} s; {len(self.schedule)} pauses of {config.pause_min_s}-"
                 f"{config.pause_max_s} s ({config.pause_target} worker) every "
                 f"{config.pause_every_s} s over {config.duration_s} s")
        pool.start_all()
        return pool

    def _status(self) -> RunStatus:
        return replace(super()._status(), acknowledged=self.tally.acknowledged)

    def _holder(self, ends: _Ends) -> Callable[[], int | None]:
        def holder() -> int | None:
            try:
                record = ends.store.get(self.jobs[0])
            except LeaseError:
                return None
            if record is None or record.state is not JobState.HELD:
                return None  # (the owner of a released job is its last holder)
            return slot_of(record.owner)

        return holder

    def _pauses(self, pool: WorkerPool, ends: _Ends) -> None:
        """The pause schedule, then the rest of ``duration_s``; every pause healed."""
        ctx = NemesisContext(workers=pool, ttl_s=self.lockset.ttl_s,
                             overtaken=lambda _point: False, cluster=self.cluster)
        faults: dict[str, Fault] = {**FAULTS, PauseHolder.name: PauseHolder(self._holder(ends))}
        self.nemesis = Nemesis(ctx, self.nemesis_rec, faults)
        start = time.monotonic()
        self.phase = ("faults", start, self.lockset.duration_s)
        crashed = _CrashWatch(pool, ctx.stop)
        crashed.start()
        try:
            self.nemesis.run(self.schedule, self.lockset.duration_s)
            ctx.wait(self.lockset.duration_s - (time.monotonic() - start))
        finally:
            crashed.stop()
        self.say(f"{self.nemesis.injected} pauses injected and healed in "
                 f"{time.monotonic() - start:.1f} s")

    def _account(self, pool: WorkerPool, ends: _Ends) -> LockSetResult:
        self.recorder.close()
        self.nemesis_rec.close()
        parts = [self.parts_dir / "verifier.jsonl", self.parts_dir / "nemesis.jsonl",
                 *pool.part_files()]
        ops = read_parts(parts)
        history_path = write_history(ops, self.config.history or self.run_dir / "history.jsonl")
        value = final_value(ends.destination, self.lockset.mode, self.jobs[0])
        final = [str(item) for item in json.loads(value)] if value else []
        return LockSetResult(
            config=self.lockset, report=account(ops, final), history_path=history_path,
            run_dir=self.run_dir, store_url=ends.store_url, destination=ends.destination_spec,
            elapsed_s=time.monotonic() - self.started, worker_crashes=pool.crashes())


def lost_items_text(lost: Sequence[str], limit: int = 10) -> str:
    """``w1-7, w3-2 (and 4 more)``."""
    shown = ", ".join(lost[:limit])
    return shown + (f" (and {len(lost) - limit} more)" if len(lost) > limit else "")
