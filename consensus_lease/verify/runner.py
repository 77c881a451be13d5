"""One verification run: workers + nemesis + quiet period + checker.

::

    result = run_verify(VerifyConfig(workers=4, jobs=60, duration_s=30, seed=7))
    result.report.ok          # zero violations?
    result.history_path       # the run's JSONL history

Phases, every one bounded in time:

1. set up: the run directory (new or empty: one holding a run's files is refused, see
   :func:`claim_run_dir`), the store (``backend`` URL, or a SQLite file in the run
   directory, or a cluster the verifier starts with the container kit), the destination,
   the jobs (``v<run id>-j000``...), one history part per process;
2. the fault period: ``workers`` worker processes work the jobs while the nemesis runs
   the seed's schedule for ``duration_s``; every fault is healed at its end;
3. the quiet period: no faults; ends when the store shows every job completed, or after
   ``quiet_s``; then the workers are stopped (SIGTERM, SIGKILL after 15 s);
4. the store's final record of each job is added to the history, the parts are merged
   into one history file, and the checker reads it with the destination's effects.

The verdict (``result.exit_status``): 0 PASS — zero violations, and the run was
conclusive: every fault kind asked for was injected, and the fence was tested
(``pause-at-check`` ran and at least one stale write was rejected by the fence or a
stale completion refused by the store); 1 FAIL — violations; 2 INCONCLUSIVE — no
violation, but a worker crashed or the run did not test what it claims
(``result.inconclusive`` says why). A ``duration_s`` too short to schedule every fault
kind once is refused up front (``InvalidArgument``). ``watch`` receives the run's
progress (:mod:`consensus_lease.verify.progress`).
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, overload
from urllib.parse import urlsplit, urlunsplit

from ..backend import Capabilities
from ..errors import BackendUnavailable, InvalidArgument, LeaseError, UnsupportedOperation
from ..record import JobState, LeaseRecord
from ..store import LeaseStore, backend_class, open_store
from ..validation import MAX_WAIT_S
from ..worker.config import WorkerConfig as RunnerConfig
from .checker import Report, check
from .destination import Destination, job_effects, open_destination
from .history import HistoryWriter, read_parts, write_history
from .interrupts import deferred, interruptible
from .kit import KitCluster
from .nemesis import (
    CLUSTER_FAULTS,
    FAULTS,
    WORKER_FAULTS,
    Nemesis,
    NemesisContext,
    PlannedFault,
    coverage_s,
    plan,
)
from .pool import PausePoint, WorkerPool
from .progress import HistoryTally, RunStatus, StatusTicker
from .worker import WorkerConfig

if TYPE_CHECKING:
    from .lockset import LockSetConfig

__all__ = ["DEFAULT_FAULTS", "RUN_FILES", "VerifyConfig", "VerifyResult", "claim_run_dir",
           "run_files", "run_verify"]

log = logging.getLogger("consensus_lease")

DEFAULT_FAULTS = WORKER_FAULTS
RUNNER_DEFAULTS: dict[str, object] = {
    f.name: f.default for f in fields(RunnerConfig)
    if f.name in ("prefetch", "complete_batch", "complete_flush_s")}
"""The worker runner's defaults (``run_worker``'s) of the knobs ``runner`` takes."""
STOP_GRACE_S = 15.0
GID_BASE = 52_000
MAX_WORKERS = 32
MAX_JOBS = 1_000_000
"""Most jobs one run works (each is a row of the history and of the destination)."""
MAX_STEPS = 10_000
"""Most effects per job."""
MAX_RUN_S = 30 * 24 * 3600.0
"""Longest run: ``duration_s`` + ``quiet_s`` + 10 TTLs (the workers' stop time) at most
30 days; each alone is also at most what a thread can wait, but their sum is waited for
at once."""
_POLL_S = 0.2

Progress = Callable[[str], None]
Watch = Callable[[RunStatus], None]


@dataclass
class VerifyConfig:
    """A run's parameters (the ``consensus-lease verify`` options).

    Attributes:
        backend: store URL; ``None`` uses ``cluster``.
        cluster: ``sqlite`` (a file in the run directory), ``etcd`` or ``zookeeper``
            (a 3-member cluster started with the container kit), used when ``backend``
            is ``None``.
        workers: concurrent worker processes (1-32).
        jobs: jobs to complete.
        steps: effects per job.
        ttl_s: session TTL, seconds.
        duration_s: the fault period, seconds.
        quiet_s: the longest quiet period after it, seconds.
        seed: derives the fault schedule and each worker's choices.
        faults: fault names, a tuple or list (see :mod:`consensus_lease.verify.nemesis`).
        history: the history file (default ``<run dir>/history.jsonl``).
        destination: SQLAlchemy URL of the destination (default: a SqliteFence file in
            the run directory).
        unfenced: the destination does not check tokens (the control run).
        think_s: longest think time; ``None`` picks one so the work spans about
            ``duration_s``, at most TTL/3.
        renew_probability: chance of an explicit ``renew()`` after each step.
        run_dir: where the run's files go: a new or empty directory (default: a new
            temporary directory); one holding a run's files already is refused
            (:func:`claim_run_dir`).
        until_done: end the fault period early, as soon as the workers' histories show
            every job completed (or every worker finished on its own): with a
            ``duration_s`` longer than the work takes, every claim is made under faults
            and no time is spent faulting idle workers.
        runner: the jobs are enqueued in a work queue and each worker process drives
            the worker runner (:func:`consensus_lease.worker.run_worker`, one slot)
            instead of claiming them by id; its completions are the runner's (see
            :mod:`~consensus_lease.verify.queue_worker`). The store must have queues.
        prefetch / complete_batch / complete_flush_s: the runner's knobs (only with
            ``runner``; checked as :class:`consensus_lease.worker.WorkerConfig` checks
            them): leases claimed ahead, completions per ``complete_many``, longest
            wait of a queued completion (seconds).
    """

    backend: str | None = None
    cluster: str = "sqlite"
    workers: int = 4
    jobs: int = 100
    steps: int = 3
    ttl_s: float = 1.0
    duration_s: float = 30.0
    quiet_s: float = 20.0
    seed: int = 1
    faults: tuple[str, ...] = DEFAULT_FAULTS
    history: str | None = None
    destination: str | None = None
    unfenced: bool = False
    think_s: float | None = None
    renew_probability: float = 0.3
    run_dir: str | None = None
    until_done: bool = False
    runner: bool = False
    prefetch: int = 0
    complete_batch: int = 1
    complete_flush_s: float = 0.01

    def validate(self, *, cluster_given: bool = False) -> None:
        """Check every field; changes nothing.

        Raises:
            InvalidArgument: naming the first bad field: of the wrong type (a bool is no
                int or number of seconds; ``history``, ``run_dir`` a str or path;
                ``backend``, ``destination`` a str or ``None``; ``faults`` a tuple or
                list of fault names), out of range, or a combination that cannot run.
        """
        self._validate_fields()
        self._validate_runner()
        cluster_faults = [f for f in self.faults if f in CLUSTER_FAULTS]
        if cluster_faults and not cluster_given and (
            self.backend is not None or self.cluster == "sqlite"
        ):
            raise InvalidArgument(
                f"fault(s) {', '.join(cluster_faults)} need a cluster the verifier starts "
                "itself: use --cluster etcd or --cluster zookeeper"
            )
        if "partition" in self.faults and os.geteuid() != 0:
            raise InvalidArgument("the partition fault needs root (iptables, setpriv)")
        self._validate_coverage()

    def _validate_fields(self) -> None:
        """Each field's type and range on its own."""
        _check_places(self)
        _check_int("workers", self.workers, 1, MAX_WORKERS)
        _check_int("jobs", self.jobs, 1, MAX_JOBS)
        _check_int("steps", self.steps, 1, MAX_STEPS)
        _check_int("seed", self.seed)
        _check_seconds("ttl_s", self.ttl_s, positive=True)
        _check_seconds("duration_s", self.duration_s)
        _check_seconds("quiet_s", self.quiet_s)
        if self.think_s is not None:
            _check_seconds("think_s", self.think_s)
        check_run_length(self.duration_s, self.quiet_s, self.ttl_s)
        if (isinstance(self.renew_probability, bool)
                or not isinstance(self.renew_probability, (int, float))
                or not 0 <= self.renew_probability <= 1):
            raise InvalidArgument("renew_probability must be a number from 0 to 1, not "
                                  f"{self.renew_probability!r}")
        for name in ("unfenced", "until_done", "runner"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgument(f"{name} must be a bool, not {getattr(self, name)!r}")
        _check_faults(self.faults)

    def _validate_runner(self) -> None:
        RunnerConfig(queue="verify", prefetch=self.prefetch,  # InvalidArgument naming it
                     complete_batch=self.complete_batch, complete_flush_s=self.complete_flush_s)
        knobs = {"prefetch": self.prefetch, "complete_batch": self.complete_batch,
                 "complete_flush_s": self.complete_flush_s}
        given = [name for name, value in knobs.items() if value != RUNNER_DEFAULTS[name]]
        if given and not self.runner:
            raise InvalidArgument(f"{', '.join(given)}: the worker runner's knobs, only with "
                                  "runner=True (--runner)")

    def _validate_coverage(self) -> None:
        """Every fault kind asked for must fit in the fault period at least once."""
        planned = {p.kind for p in self.schedule()}
        missing = [kind for kind in dict.fromkeys(self.faults) if kind not in planned]
        if missing:
            need_s = coverage_s(self.seed, self.faults, ttl_s=self.ttl_s, slots=self.workers)
            raise InvalidArgument(
                f"--duration-s {self.duration_s} is too short to schedule every fault kind "
                f"once ({', '.join(missing)} would never run, and the run could only be "
                f"inconclusive): with seed {self.seed} and TTL {self.ttl_s} s, use "
                f"--duration-s {math.ceil(need_s)} or more, or fewer --faults"
            )

    def schedule(self) -> list[PlannedFault]:
        """The run's fault schedule (:func:`~consensus_lease.verify.nemesis.plan`)."""
        return plan(self.seed, self.faults, duration_s=self.duration_s, ttl_s=self.ttl_s,
                    slots=self.workers)

    def effective_think_s(self) -> float:
        if self.think_s is not None:
            return self.think_s
        spread = self.duration_s * self.workers / (self.jobs * self.steps)
        return round(min(self.ttl_s / 3, max(0.01, spread)), 4)


def _check_places(config: VerifyConfig | LockSetConfig) -> None:
    """Check the fields a run's config names its places with: ``backend`` and
    ``destination`` (a non-empty str or ``None``), ``history`` and ``run_dir`` (a path or
    ``None``), ``cluster`` (``sqlite``, ``etcd`` or ``zookeeper``).

    Raises:
        InvalidArgument: naming the first bad field.
    """
    for name in ("backend", "destination"):
        _check_optional_text(name, getattr(config, name))
    for name in ("history", "run_dir"):
        _check_optional_path(name, getattr(config, name))
    if config.cluster not in ("sqlite", "etcd", "zookeeper"):
        raise InvalidArgument(f"cluster must be sqlite, etcd or zookeeper: {config.cluster!r}")


def check_run_length(duration_s: float, quiet_s: float, ttl_s: float) -> None:
    """Raises InvalidArgument unless ``duration_s + quiet_s + 10 * ttl_s`` is at most
    :data:`MAX_RUN_S`."""
    total = duration_s + quiet_s + 10 * ttl_s
    if total > MAX_RUN_S:
        raise InvalidArgument(
            f"duration_s + quiet_s + 10 x ttl_s is {total:.6g} s: a run may last at most "
            f"{MAX_RUN_S:.0f} s (30 days)")


def _check_int(name: str, value: object, low: int | None = None,
              high: int | None = None) -> None:
    """Raises InvalidArgument naming ``name`` unless ``value`` is an int (not a bool) in
    ``[low, high]`` (an open end: ``None``)."""
    if (isinstance(value, bool) or not isinstance(value, int)
            or (low is not None and value < low) or (high is not None and value > high)):
        span = ("" if low is None else f" from {low} to {high}" if high is not None
                else f" >= {low}")
        raise InvalidArgument(f"{name} must be an int{span}, not {value!r}")


def _check_seconds(name: str, value: object, *, positive: bool = False) -> None:
    """Raises InvalidArgument naming ``name`` unless ``value`` is a finite number of
    seconds (an int or float, not a bool), >= 0 (> 0 if ``positive``), and at most
    :data:`~consensus_lease.validation.MAX_WAIT_S`: every one of them is waited out by a
    thread somewhere (a think time, a pause, the run), and a longer wait overflows."""
    bound = "> 0" if positive else ">= 0"
    bad = InvalidArgument(f"{name} must be a finite number of seconds {bound}, not {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad
    try:
        number = float(value)
    except OverflowError:
        raise bad from None
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise bad
    if number > MAX_WAIT_S:
        raise InvalidArgument(f"{name} must be at most {MAX_WAIT_S:.0f} s (the longest wait "
                              f"this platform's threads can make), not {value!r}")


def _check_optional_text(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise InvalidArgument(f"{name} must be a non-empty str or None, not {value!r}")


def _check_optional_path(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, (str, os.PathLike))
                              or not os.fspath(value)):
        raise InvalidArgument(f"{name} must be a path (str or os.PathLike) or None, not "
                              f"{value!r}")


def _check_faults(faults: object) -> None:
    if not isinstance(faults, (tuple, list)) or not all(isinstance(f, str) for f in faults):
        raise InvalidArgument(f"faults must be a tuple of fault names, not {faults!r}")
    unknown = [name for name in faults if name not in FAULTS]
    if unknown:
        raise InvalidArgument(f"faults: unknown fault(s) {', '.join(unknown)}; the menu: "
                              f"{', '.join(FAULTS)}")


@dataclass
class VerifyResult:
    """What a run produced.

    Attributes:
        report: the checker's report.
        history_path: the run's history file.
        run_dir: the run's directory (store, destination, parts, worker logs).
        store_url / destination: where leases and effects lived.
        elapsed_s: wall time of the whole run.
        faults_injected: faults the nemesis injected and healed.
        all_completed_at_s: seconds after the fault period began at which the store
            showed every job completed (polled in the quiet period), or ``None``.
        last_completion_s: seconds after the fault period began at which the last
            successful ``complete()`` returned (from the history), or ``None``.
        claims_under_faults: successful claims invoked before the fault period ended
            (the others came in the quiet period, without faults), or ``None``.
        worker_crashes: workers that died on their own (``name (exit N): output``).
        notes: remarks for the reader (e.g. jobs ran out before the faults ended).
    """

    report: Report
    history_path: Path
    run_dir: Path
    store_url: str
    destination: str
    elapsed_s: float
    faults_injected: int
    all_completed_at_s: float | None
    last_completion_s: float | None = None
    claims_under_faults: int | None = None
    worker_crashes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def inconclusive(self) -> list[str]:
        """Why the run proves nothing even without violations (empty: it does): a worker
        crashed, a fault kind asked for never happened, or the fence was never tested
        (``report.inconclusive``)."""
        crashed = ([f"{len(self.worker_crashes)} worker(s) crashed"]
                   if self.worker_crashes else [])
        return crashed + list(self.report.inconclusive)

    @property
    def exit_status(self) -> int:
        """0: zero violations in a conclusive run; 1: violations; 2: inconclusive.

        Violations other than ``not_completed`` always give 1. Then a worker crash gives
        2 (a crash explains unfinished jobs); then ``not_completed`` gives 1; then
        :attr:`inconclusive` (a fault kind asked for never happened, or the fence was
        never tested) gives 2."""
        safety = self.report.total_violations - self.report.violations["not_completed"]
        if safety:
            return 1
        if self.worker_crashes:
            return 2
        if not self.report.ok:
            return 1
        return 2 if self.report.inconclusive else 0


def _all_completed(store: LeaseStore, jobs: list[str]) -> bool:
    for job in jobs:
        try:
            record = store.get(job)
        except LeaseError:
            return False
        if record is None or record.state is not JobState.COMPLETED:
            return False
    return True


def _overtaken(store: LeaseStore, destination: Destination) -> Callable[[PausePoint], bool]:
    """Is the action a worker stopped before now stale? (See ``NemesisContext``.)"""

    def overtaken(point: PausePoint) -> bool:
        try:
            if point.before == "write":
                highest = destination.highest_token(point.job)
                return highest is not None and highest > point.generation
            record = store.get(point.job)
        except LeaseError:
            return False
        return (record is None or record.generation != point.generation
                or record.state is not JobState.HELD)

    return overtaken


def _final_record(store: LeaseStore, job: str, attempts: int = 10) -> LeaseRecord | None:
    """``store.get(job)``, retried (bounded) while the store is unavailable.

    Raises:
        BackendUnavailable: still unavailable after ``attempts`` tries.
    """
    for attempt in range(1, attempts + 1):
        try:
            return store.get(job)
        except BackendUnavailable:
            if attempt == attempts:
                raise
            time.sleep(0.5)
    return None  # pragma: no cover


class _CrashWatch(threading.Thread):
    """Ends the fault period early (sets ``abort``) when a worker crashes: the run is
    inconclusive then, and waiting on would only waste time. With ``until_done`` (the
    number of jobs), also once the histories show every job completed, or every worker
    has finished on its own (``finished`` is set too)."""

    def __init__(self, pool: WorkerPool, abort: threading.Event, *,
                 until_done: int | None = None) -> None:
        super().__init__(name="verify-crash-watch", daemon=True)
        self.pool = pool
        self.abort = abort
        self.until_done = until_done
        self.finished = threading.Event()
        self._done = threading.Event()
        self._tally = HistoryTally()

    def run(self) -> None:
        while not self._done.wait(_POLL_S):
            if self.pool.crashed():
                self.abort.set()
                return
            if self.until_done is not None and self._work_done(self.until_done):
                self.finished.set()
                self.abort.set()
                return

    def _work_done(self, jobs: int) -> bool:
        self._tally.update(self.pool.part_files())
        return self._tally.jobs_completed >= jobs or self.pool.finished()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)


def run_verify(config: VerifyConfig, progress: Progress | None = None, *,
               cluster: KitCluster | None = None, watch: Watch | None = None) -> VerifyResult:
    """Run one verification (see the module docstring).

    Args:
        config: the run's parameters.
        progress: called with one line of text per phase.
        cluster: a running cluster to use and fault (``KitCluster.adopt(...)``) instead
            of ``config.cluster``/``config.backend``; left running afterwards.
        watch: called with a :class:`~consensus_lease.verify.progress.RunStatus` about
            four times a second during the fault and quiet periods (from another
            thread), e.g. a :class:`~consensus_lease.verify.progress.ProgressBar`.

    Returns:
        The result; ``result.exit_status`` is 0 only with zero violations in a
        conclusive run (every fault kind asked for happened, the fence was tested).

    Raises:
        InvalidArgument: bad configuration (including a ``duration_s`` too short to
            schedule every fault kind once, and a ``run_dir`` that already holds a run's
            files: nothing is changed), or a TTL outside the store's range.
        UnsupportedBackend / UnsupportedOperation / BackendUnavailable: the store or the
            destination cannot be used (a store of one process only, such as
            ``memory://``, cannot be shared by worker processes).
        Exception: the container kit's errors when it cannot start the cluster.
        Interrupted: (a ``KeyboardInterrupt``) SIGINT or SIGTERM stopped the run (in the
            main thread, both are handled so while it runs): every fault was healed and
            every worker it started was thawed and ended first; no result.
    """
    config.validate(cluster_given=cluster is not None)
    with interruptible():
        run = _Run(config, progress or (lambda _message: None), watch, cluster)
        try:
            return run.execute()
        finally:
            run.close()


@overload
def no_password(url: str) -> str: ...


@overload
def no_password(url: None) -> None: ...


def no_password(url: str | None) -> str | None:
    """``url`` with the password of its user part (if any) replaced by ``***``: how a
    store or destination URL appears in the report, ``--summary`` and the history."""
    if url is None or "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username or ''}:***@"
    return urlunsplit(parts._replace(netloc=user + parts.netloc.rpartition("@")[2]))


RUN_FILES = ("parts", "logs", "history.jsonl", "store.db", "destination.db")
"""What a run puts in its run directory (besides the SQLite files' ``-wal``, ``-shm`` and
``-journal`` companions): a directory holding any of them already holds a run."""


def run_files(run_dir: Path) -> list[str]:
    """The names of a run's files (:data:`RUN_FILES`) that ``run_dir`` holds, sorted, a
    directory's with a trailing ``/``; ``[]`` if ``run_dir`` does not exist.

    Raises:
        InvalidArgument: ``run_dir`` exists and is not a directory.
    """
    try:
        entries = sorted(run_dir.iterdir())
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise InvalidArgument(f"run_dir (--run-dir) {run_dir} is not a directory") from None
    sqlite = tuple(f"{name}-" for name in ("store.db", "destination.db"))
    return [entry.name + ("/" if entry.is_dir() else "") for entry in entries
            if entry.name in RUN_FILES or entry.name.startswith(sqlite)]


def _refuse_reuse(run_dir: Path, found: list[str]) -> InvalidArgument:
    return InvalidArgument(
        f"run_dir (--run-dir) {run_dir} already holds a run's files ({', '.join(found)}): "
        "a run there would mix the earlier run's history, store and destination into its "
        "own; pass a new or empty directory")


_KIT_SCHEMES = {"etcd": "etcd://", "zookeeper": "zk://"}
"""The store URL scheme of each ``cluster`` the verifier starts with the container kit."""


def _first_missing(path: Path) -> Path | None:
    """The topmost of ``path`` and its parents that does not exist (``None``: it does)."""
    if path.exists() or path.is_symlink():
        return None
    missing = path
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            break
        missing = parent
    return missing


def claim_run_dir(run_dir: Path) -> tuple[Path, Path]:
    """Make ``run_dir`` (created if need be, mode 0700) this run's; returns its ``parts``
    and ``logs`` directories, both new (mode 0700: the workers' config files in ``logs``
    carry the store URL with its password).

    A directory that already holds a run's files (:func:`run_files`) is refused, whatever
    they are: the history parts are paired by ``(process, index)`` and every run uses the
    same process names, so an operation of this run that never returned could take an
    earlier run's result for the same key and hide an unresolved write. ``parts`` is
    created exclusively, so of two runs started at once in the same directory, one is
    refused.

    Raises:
        InvalidArgument: ``run_dir`` holds a run's files (nothing is changed), or is not a
            directory.
    """
    found = run_files(run_dir)
    if found:
        raise _refuse_reuse(run_dir, found)
    try:
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:  # a dangling symlink, or a parent that is not a directory
        raise InvalidArgument(
            f"run_dir (--run-dir) {run_dir} cannot be made a directory: it (or a parent) "
            "exists and is not a directory (a dangling symlink?)") from None
    parts, logs = run_dir / "parts", run_dir / "logs"
    try:
        parts.mkdir(mode=0o700)
    except FileExistsError:  # another run began here since the check
        raise _refuse_reuse(run_dir, run_files(run_dir)) from None
    logs.mkdir(mode=0o700, exist_ok=True)
    return parts, logs


class _Ends(NamedTuple):
    """Where leases and effects live during a run."""

    store: LeaseStore
    destination: Destination
    store_url: str
    destination_spec: str


class _Run:
    """One run's resources and phases (:func:`run_verify`)."""

    def __init__(self, config: VerifyConfig, say: Progress, watch: Watch | None,
                 cluster: KitCluster | None) -> None:
        self.config, self.say, self.watch, self.cluster = config, say, watch, cluster
        self.run_id = f"{config.seed}-{uuid.uuid4().hex[:6]}"
        self.run_dir = Path(config.run_dir or tempfile.mkdtemp(
            prefix=f"consensus-lease-verify-{self.run_id}-"))
        self.made_from = self.run_dir if config.run_dir is None else _first_missing(self.run_dir)
        """The topmost directory this run creates for its run dir (``None``: it existed)."""
        self.parts_dir, self.logs_dir = claim_run_dir(self.run_dir)
        self.set_up = False
        """Whether the store and destination opened; until then a failure leaves no run."""
        self.jobs = [f"v{self.run_id}-j{i:03d}" for i in range(config.jobs)]
        random.Random(config.seed).shuffle(self.jobs)  # the order every worker tries them in
        self.queue = f"v{self.run_id}" if config.runner else ""
        self.think_s = config.effective_think_s()
        self.started = time.monotonic()
        self.pool: WorkerPool | None = None
        self.store: LeaseStore | None = None
        self.destination: Destination | None = None
        self.nemesis: Nemesis | None = None
        self.schedule: list[PlannedFault] = []
        self.faults_until_wall: float | None = None
        self.phase: tuple[str, float, float] = ("faults", time.monotonic(), config.duration_s)
        self.tally = HistoryTally()
        self.recorder = HistoryWriter(self.parts_dir / "verifier.jsonl", "verifier")
        self.nemesis_rec = HistoryWriter(self.parts_dir / "nemesis.jsonl", "nemesis")

    def execute(self) -> VerifyResult:
        ends = self._open()
        self.set_up = True
        self.schedule = self.config.schedule()
        self._record_run(ends)
        pool = self._start_workers(ends)
        ticker = StatusTicker(self._status, self.watch) if self.watch else None
        if ticker is not None:
            ticker.start()
        try:
            faults_from, faults_from_wall = self._fault_period(pool, ends)
            all_completed_at = self._quiet_period(pool, ends.store, faults_from)
        finally:
            if ticker is not None:
                ticker.stop()
        pool.stop_all(STOP_GRACE_S)
        return self._collect(pool, ends, faults_from_wall, all_completed_at)

    def _open(self) -> _Ends:
        """Open the store and the destination; what the backend's class says it refuses
        is refused first, before anything is started or created."""
        config = self.config
        self._check_backend(config.backend or _KIT_SCHEMES.get(config.cluster, "sqlite://"))
        if config.backend is not None:
            store_url = config.backend
        elif self.cluster is not None:
            store_url = self.cluster.url(f"verify-{self.run_id}")
        elif config.cluster == "sqlite":
            store_url = f"sqlite:///{self.run_dir / 'store.db'}"
        else:
            self.say(f"starting a 3-member {config.cluster} cluster (container kit)")
            self.cluster = KitCluster(config.cluster).start()
            store_url = self.cluster.url(f"verify-{self.run_id}")
        destination_spec = config.destination or str(self.run_dir / "destination.db")
        self.destination = destination = open_destination(
            destination_spec, enforce_tokens=not config.unfenced)
        self.store = store = open_store(store_url)
        self._check_capabilities(store.capabilities, store_url)
        if self.queue:
            store.enqueue_many(self.queue, self.jobs)  # in the order workers try them in
        return _Ends(store, destination, store_url, destination_spec)

    def _check_backend(self, url: str) -> None:
        """:meth:`_check_capabilities` with the class-level capabilities of ``url``'s
        backend, before any cluster, store or destination exists."""
        caps = getattr(backend_class(url), "capabilities", None)
        if isinstance(caps, Capabilities):
            self._check_capabilities(caps, url)

    def _check_capabilities(self, caps: Capabilities, store_url: str) -> None:
        config = self.config
        if not caps.cross_process:
            raise UnsupportedOperation(
                f"verify runs workers as separate processes, but {no_password(store_url)!r} is a "
                "store of one process only; use sqlite:///..., postgresql://..., etcd://... "
                "or zk://..."
            )
        if not caps.min_ttl_s <= config.ttl_s <= caps.max_ttl_s:
            raise InvalidArgument(
                f"--ttl-s {config.ttl_s} is outside this store's range "
                f"[{caps.min_ttl_s}, {caps.max_ttl_s}] s"
            )
        if self.queue and not caps.queues:
            raise UnsupportedOperation(
                f"--runner works a queue, and the {store_url.split('://', 1)[0]} backend "
                "has no work queues")

    def _record_run(self, ends: _Ends) -> None:
        config = self.config
        self.recorder.event(
            "run", run_id=self.run_id, jobs=self.jobs, store=no_password(ends.store_url),
            destination=no_password(ends.destination_spec), think_s=self.think_s,
            config={**{k: v for k, v in asdict(config).items() if k != "faults"},
                    "backend": no_password(config.backend),
                    "destination": no_password(config.destination)},
            faults=list(config.faults), schedule=[asdict(p) for p in self.schedule])

    def _start_workers(self, ends: _Ends) -> WorkerPool:
        config = self.config
        gids = None
        if "partition" in config.faults:
            base = GID_BASE + (os.getpid() % 500) * MAX_WORKERS
            gids = [base + slot for slot in range(config.workers)]
        template = WorkerConfig(
            name="", store_url=ends.store_url, destination=ends.destination_spec,
            jobs=self.jobs,
            history_path="", seed=config.seed, enforce_tokens=not config.unfenced,
            ttl_s=config.ttl_s, steps=config.steps, think_s=self.think_s,
            renew_probability=config.renew_probability, idle_s=min(0.2, config.ttl_s / 5),
            # A bound only (the verifier stops them): the last fault may outlast the
            # fault period by its longest hold plus a member restart.
            stop_at=time.time() + config.duration_s + config.quiet_s + 10 * config.ttl_s
            + STOP_GRACE_S + 120.0,
            queue=self.queue, prefetch=config.prefetch, complete_batch=config.complete_batch,
            complete_flush_s=config.complete_flush_s,
        )
        self.pool = pool = WorkerPool(template, slots=config.workers,
                                      parts_dir=self.parts_dir, logs_dir=self.logs_dir,
                                      gids=gids)
        runner = (f" (worker runner on queue {self.queue}: prefetch {config.prefetch}, "
                  f"complete_batch {config.complete_batch}, complete_flush_s "
                  f"{config.complete_flush_s:g})" if self.queue else "")
        self.say(f"{config.workers} workers{runner}, {config.jobs} jobs x {config.steps} "
                 f"steps, TTL "
                 f"{config.ttl_s} s, think <= {self.think_s} s; {len(self.schedule)} faults "
                 f"planned over {config.duration_s} s "
                 f"({', '.join(config.faults) or 'none'})")
        pool.start_all()
        return pool

    def _fault_period(self, pool: WorkerPool, ends: _Ends) -> tuple[float, float]:
        """Run the schedule; returns when it began (monotonic and wall-clock time)."""
        ctx = NemesisContext(workers=pool, ttl_s=self.config.ttl_s,
                             overtaken=_overtaken(ends.store, ends.destination),
                             cluster=self.cluster)
        self.nemesis = Nemesis(ctx, self.nemesis_rec)
        faults_from, faults_from_wall = time.monotonic(), time.time()
        self.phase = ("faults", faults_from, self.config.duration_s)
        watchdog = _CrashWatch(pool, ctx.stop, until_done=len(self.jobs)
                               if self.config.until_done else None)
        watchdog.start()
        try:
            injected = self.nemesis.run(self.schedule, self.config.duration_s)
        finally:
            watchdog.stop()
        self.faults_until_wall = time.time()
        early = (f" after {time.monotonic() - faults_from:.1f} s: every job completed"
                 if watchdog.finished.is_set() else "")
        self.say(f"fault period over{early}: {injected} faults injected and healed; quiet "
                 f"period (at most {self.config.quiet_s} s)")
        return faults_from, faults_from_wall

    def _quiet_period(self, pool: WorkerPool, store: LeaseStore,
                      faults_from: float) -> float | None:
        """Wait for every job to be completed (bounded); returns when they were, in
        seconds after the fault period began, or ``None``."""
        quiet_s = 0.0 if pool.crashed() else self.config.quiet_s
        self.phase = ("quiet", time.monotonic(), quiet_s)
        quiet_until = time.monotonic() + quiet_s
        while True:
            pool.resume_stopped()  # defensive: no worker may stay stopped now
            if _all_completed(store, self.jobs):
                return time.monotonic() - faults_from
            if time.monotonic() >= quiet_until or pool.all_exited():
                return None
            time.sleep(_POLL_S)

    def _status(self) -> RunStatus:
        phase, since, total_s = self.phase
        pool = self.pool
        tally = self.tally
        tally.update(pool.part_files() if pool is not None else [])
        now = time.monotonic()
        return RunStatus(
            phase=phase, elapsed_s=now - since, total_s=total_s,
            faults_injected=self.nemesis.injected if self.nemesis is not None else 0,
            faults_planned=len(self.schedule), completions=tally.completions,
            jobs=len(self.jobs), claims=tally.claims, violations_seen=tally.violations,
            fenced=tally.fenced, run_elapsed_s=now - self.started)

    def _collect(self, pool: WorkerPool, ends: _Ends, faults_from_wall: float,
                 all_completed_at: float | None) -> VerifyResult:
        """The store's final records into the history; merge the parts; check."""
        for job in self.jobs:
            record = _final_record(ends.store, job)
            self.recorder.event(
                "final", job=job, generation=None if record is None else record.generation,
                state="unknown" if record is None else record.state.value,
                owner=None if record is None else record.owner,
            )
        self.recorder.close()
        self.nemesis_rec.close()
        parts = [self.parts_dir / "verifier.jsonl", self.parts_dir / "nemesis.jsonl",
                 *pool.part_files()]
        ops = read_parts(parts)
        history_path = write_history(ops, self.config.history or self.run_dir / "history.jsonl")
        report = check(ops, job_effects(ends.destination, self.jobs), self.jobs)
        completions = [o.t_return for o in ops
                       if o.op == "complete" and o.outcome == "ok" and o.t_return is not None]
        result = VerifyResult(
            report=report, history_path=history_path, run_dir=self.run_dir,
            store_url=ends.store_url, destination=ends.destination_spec,
            elapsed_s=time.monotonic() - self.started,
            faults_injected=self.nemesis.injected if self.nemesis is not None else 0,
            all_completed_at_s=all_completed_at,
            last_completion_s=max(completions) - faults_from_wall if completions else None,
            claims_under_faults=None if self.faults_until_wall is None else sum(
                1 for o in ops if o.op == "claim" and o.outcome == "claimed"
                and o.t_invoke < self.faults_until_wall),
            worker_crashes=pool.crashes(),
        )
        _add_notes(result, self.config)
        return result

    def close(self) -> None:
        """Stop every worker (thawed first), heal, release; a signal waits till the end."""
        with deferred():
            if self.nemesis is not None:
                self.nemesis.ctx.stop.set()
            if self.pool is not None:
                self.pool.stop_all(STOP_GRACE_S)
            self.recorder.close()
            self.nemesis_rec.close()
            if self.store is not None:
                self.store.close()
            if self.destination is not None:
                self.destination.close()
            if self.cluster is not None:
                self.cluster.stop()  # heals its partitions (iptables rules) too
            if not self.set_up:
                self._discard_run_files()

    def _discard_run_files(self) -> None:
        """After a failed setup (no worker started, nothing recorded but the empty
        history parts): remove what this run put in its run directory (``parts``,
        ``logs``, the default SQLite store and destination files, never a store or
        destination the caller named), and the directory if this run made it, so the
        same ``--run-dir`` can be used again once the setup is fixed. Best effort: what
        cannot be removed is logged and left (the next run names it)."""
        config = self.config
        names = ["parts", "logs"]
        if config.backend is None and self.cluster is None and config.cluster == "sqlite":
            names.append("store.db")
        if config.destination is None:
            names.append("destination.db")
        companions = ("", "-wal", "-shm", "-journal")
        for name in names:
            for path in ([self.run_dir / name] if name in ("parts", "logs")
                         else [self.run_dir / f"{name}{end}" for end in companions]):
                try:
                    if path.is_dir():
                        shutil.rmtree(path)
                    else:
                        path.unlink(missing_ok=True)
                except OSError as exc:
                    log.warning("verify: could not remove %s after a failed setup: %s",
                                path, exc)
        if self.made_from is not None:
            made = [self.run_dir, *self.run_dir.parents]
            for directory in made[:made.index(self.made_from) + 1]:
                try:
                    directory.rmdir()
                except OSError:  # not empty (someone's files), or gone: left as it is
                    break


def _add_notes(result: VerifyResult, config: VerifyConfig) -> None:
    done = result.last_completion_s
    all_done = result.report.violations["not_completed"] == 0
    if done is not None and all_done and done < config.duration_s * 0.8 and not config.until_done:
        result.notes.append(
            f"the last job was completed {done:.1f} s into the {config.duration_s} s fault "
            "period: later faults hit idle workers; raise --jobs"
        )
    if result.report.counts["claims"] == 0:
        result.notes.append("no job was ever claimed: is the store reachable?")
    if shutil.which("setpriv") is None and "partition" in config.faults:
        result.notes.append("setpriv not found: workers could not get their own gid")
