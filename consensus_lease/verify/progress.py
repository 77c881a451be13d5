"""Progress of a run while it runs: a status snapshot, a ticker, a terminal progress bar.

:func:`~consensus_lease.verify.runner.run_verify` takes ``watch``, a callable it gives a
:class:`RunStatus` about four times a second during the fault and quiet periods (from a
:class:`StatusTicker` thread). The command passes a :class:`ProgressBar` (rich) when its
standard output is a terminal, and a :class:`StatusLines` otherwise (the same figures as
one line every 30 s, for logs). Claims, completions, fence rejections and the violations
visible so far are counted from the workers' history part files as they grow
(:class:`HistoryTally`), so watching asks the store nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

__all__ = ["HistoryTally", "ProgressBar", "RunStatus", "StatusLines", "StatusTicker",
           "counts_text"]

TICK_S = 0.25

PHASES = {"faults": "fault period", "quiet": "quiet period"}


@dataclass(frozen=True)
class RunStatus:
    """A run at one moment.

    Attributes:
        phase: ``faults`` (the fault period) or ``quiet`` (the quiet period after it).
        elapsed_s: seconds since the phase began.
        total_s: the phase's length, seconds (the quiet period's longest).
        faults_injected: faults injected so far.
        faults_planned: faults in the schedule (not all of them may start in time).
        completions: successful ``complete()`` calls so far.
        jobs: jobs in the run (each needs at least one claim: the run's least claims).
        claims: successful claims so far (a job taken over counts again).
        violations_seen: violations visible in the histories so far (see
            :class:`HistoryTally`); a lower bound — the checker's verdict at the end,
            which also reads the destination, is the one that counts.
        fenced: stale writes the destination's fence rejected so far.
        run_elapsed_s: seconds since the run began (both phases).
        acknowledged: the lock-set workload's acknowledged updates so far (write-backs
            accepted), shown instead of the completions; ``None`` for the job workload.
    """

    phase: str
    elapsed_s: float
    total_s: float
    faults_injected: int
    faults_planned: int
    completions: int
    jobs: int
    claims: int = 0
    violations_seen: int = 0
    fenced: int = 0
    run_elapsed_s: float = 0.0
    acknowledged: int | None = None


@dataclass
class _Write:
    """An accepted write: when it was invoked and returned, its generation, and whether
    it is known to be stale."""

    invoked: float
    returned: float
    generation: int
    stale: bool = False


@dataclass
class _Job:
    writes: list[_Write] = field(default_factory=list)
    claimed: set[int] = field(default_factory=set)
    completed: set[int] = field(default_factory=set)
    stale: int = 0

    def violations(self) -> int:
        after = sum(1 for g in self.claimed if self.completed and g > min(self.completed))
        return self.stale + max(0, len(self.completed) - 1) + after


class HistoryTally:
    """Counts claims, completions, fence rejections and visible violations in history
    part files as they grow.

    Each call to :meth:`update` reads only what was appended since the last one (whole
    lines only), so it is cheap to call every tick. Violations *seen* are those the
    histories alone prove, whatever order the parts are read in: an accepted write
    invoked after a higher generation's write on the same job had returned accepted (a
    stale effect), a job completed by two generations, a claim above the completing
    generation. Not thread-safe: one caller.

    Attributes:
        claims / completions / fenced: successful claims, successful completions,
            writes (and the lock-set's fenced reads) refused by the fence, so far.
        acknowledged: writes accepted so far (the lock-set's acknowledged updates).
        violations: violations seen so far.
    """

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}
        self._open: dict[tuple[str, int], dict[str, Any]] = {}
        self._jobs: dict[str, _Job] = {}
        self.claims = self.completions = self.fenced = self.violations = 0
        self.acknowledged = 0

    @property
    def count(self) -> int:
        """Completions so far."""
        return self.completions

    @property
    def jobs_completed(self) -> int:
        """Distinct jobs with a successful completion so far (a completion the store
        accepted: the job is completed for good)."""
        return sum(1 for job in self._jobs.values() if job.completed)

    def update(self, paths: Iterable[Path]) -> int:
        """Read what ``paths`` gained; returns the completions counted so far."""
        for path in paths:
            try:
                with path.open("rb") as file:
                    file.seek(self._offsets.get(path, 0))
                    data = file.read()
            except OSError:
                continue
            whole = data[: data.rfind(b"\n") + 1]
            self._offsets[path] = self._offsets.get(path, 0) + len(whole)
            for line in whole.splitlines():
                self._line(line)
        return self.completions

    def _line(self, line: bytes) -> None:
        try:
            record = json.loads(line)
            key = (str(record["p"]), int(record["i"]))
            event, t = record["ev"], float(record["t"])
        except (ValueError, KeyError, TypeError):
            return
        if event == "invoke":
            if record.get("op") in ("claim", "read", "write", "complete"):
                self._open[key] = record
            return
        invoked = self._open.pop(key, None)
        if event != "return" or invoked is None:
            return
        op, outcome, job_id = invoked["op"], record.get("outcome"), invoked.get("job")
        generation = record.get("gen") if record.get("gen") is not None else invoked.get("gen")
        if not isinstance(job_id, str) or not isinstance(generation, int):
            return
        job = self._jobs.setdefault(job_id, _Job())
        before = job.violations()
        if op == "claim" and outcome == "claimed":
            self.claims += 1
            job.claimed.add(generation)
        elif op == "complete" and outcome == "ok":
            self.completions += 1
            job.completed.add(generation)
        elif op in ("read", "write") and outcome == "fence_rejected":
            self.fenced += 1
        elif op == "write" and outcome == "accepted":
            self.acknowledged += 1
            mine = _Write(float(invoked["t"]), t, generation)
            mine.stale = any(_stale(mine, other) for other in job.writes)
            job.stale += mine.stale
            for other in job.writes:  # its part may have been read after this one's
                if not other.stale and _stale(other, mine):
                    other.stale = True
                    job.stale += 1
            job.writes.append(mine)
        self.violations += job.violations() - before


def _stale(late: _Write, early: _Write) -> bool:
    """``late`` was invoked after ``early`` returned, with a lower generation."""
    return late.invoked > early.returned and late.generation < early.generation


class StatusTicker:
    """Calls ``watch(status())`` every ``interval_s`` from a daemon thread, and once
    more when stopped. An exception from either ends the ticking (the run goes on).

    Use as a context manager, or :meth:`start` / :meth:`stop`.
    """

    def __init__(self, status: Callable[[], RunStatus], watch: Callable[[RunStatus], None],
                 interval_s: float = TICK_S) -> None:
        self._status = status
        self._watch = watch
        self._interval_s = interval_s
        self._done = threading.Event()
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="verify-progress", daemon=True)

    def _tick(self) -> None:
        if self._failed:
            return
        try:
            self._watch(self._status())
        except Exception:
            self._failed = True

    def _run(self) -> None:
        while not self._done.wait(self._interval_s):
            self._tick()

    def start(self) -> StatusTicker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        self._tick()

    def __enter__(self) -> StatusTicker:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


def counts_text(status: RunStatus) -> str:
    """``faults 4/7  claims 45  completed 41/100  violations seen 0  fenced 2  elapsed
    0:01:05`` (the bar's and the log line's figures)."""
    minutes, seconds = divmod(int(status.run_elapsed_s), 60)
    hours, minutes = divmod(minutes, 60)
    done = (f"completed {status.completions}/{status.jobs}" if status.acknowledged is None
            else f"acknowledged {status.acknowledged}")
    return (f"faults {status.faults_injected}/{status.faults_planned}  claims {status.claims}"
            f"  {done}  violations seen "
            f"{status.violations_seen}  fenced {status.fenced}  elapsed "
            f"{hours}:{minutes:02d}:{seconds:02d}")


def _clock(status: RunStatus) -> str:
    return f"{status.elapsed_s:5.1f} / {status.total_s:.1f} s"


class ProgressBar:
    """A rich progress bar for :class:`RunStatus` updates (a ``watch`` callable)::

        fault period ━━━━━━━━━━━━━━━━━━━━━  12.3 / 20.0 s  faults 4/7  claims 45
        completed 41/100  violations seen 0  fenced 2  elapsed 0:00:14

    (one line on a wide enough terminal). The bar is the phase's time; the claims and
    completions are the run's (a run needs at least ``jobs`` claims). Use it as a context
    manager around the run; it removes itself at the end (the summary follows). Lines
    printed on the same console go above it.

    Args:
        console: the console to draw on (a terminal).
    """

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(),
            TextColumn("{task.fields[clock]}"), TextColumn("{task.fields[counts]}"),
            console=console, transient=True, auto_refresh=False,
        )
        self._task: TaskID | None = None

    def __call__(self, status: RunStatus) -> None:
        description = PHASES.get(status.phase, status.phase)
        total = max(status.total_s, 1e-9)
        done = min(status.elapsed_s, total)
        clock, counts = _clock(status), counts_text(status)
        if self._task is None:
            self._task = self._progress.add_task(description, total=total, clock=clock,
                                                 counts=counts)
        self._progress.update(self._task, description=description, total=total,
                              completed=done, clock=clock, counts=counts,
                              refresh=True)  # redrawn at each status, not on a timer

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._progress.stop()


class StatusLines:
    """A ``watch`` for a log (standard output not a terminal): one line of
    :class:`RunStatus` every ``every_s`` seconds, the first after ``every_s``::

        progress: fault period 30.2 / 600.0 s  faults 4/40  claims 1234  completed
        1200/10000  violations seen 0  fenced 3  elapsed 0:00:41

    Args:
        say: prints one line (e.g. the command's dimmed console line).
        every_s: seconds between lines.
        clock: a monotonic clock (seconds), for tests.
    """

    def __init__(self, say: Callable[[str], None], every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._say = say
        self._every_s = every_s
        self._clock = clock
        self._last = clock()

    def __call__(self, status: RunStatus) -> None:
        now = self._clock()
        if now - self._last < self._every_s:
            return
        self._last = now
        self._say(f"progress: {PHASES.get(status.phase, status.phase)} {_clock(status).strip()}"
                  f"  {counts_text(status)}")
