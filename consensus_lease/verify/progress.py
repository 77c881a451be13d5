"""Progress of a run while it runs: a status snapshot, a ticker, a terminal progress bar.

:func:`~consensus_lease.verify.runner.run_verify` takes ``watch``, a callable it gives a
:class:`RunStatus` about four times a second during the fault and quiet periods (from a
:class:`StatusTicker` thread). The command passes a :class:`ProgressBar` (rich) when its
standard output is a terminal, and nothing otherwise. Completions are counted from the
workers' history part files as they grow (:class:`CompletionCounter`), so watching asks
the store nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

__all__ = ["CompletionCounter", "ProgressBar", "RunStatus", "StatusTicker"]

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
        jobs: jobs in the run.
    """

    phase: str
    elapsed_s: float
    total_s: float
    faults_injected: int
    faults_planned: int
    completions: int
    jobs: int


class CompletionCounter:
    """Counts successful ``complete`` operations in history part files as they grow.

    Each call to :meth:`update` reads only what was appended since the last one (whole
    lines only), so it is cheap to call every tick. Not thread-safe: one caller.
    """

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}
        self._open_completes: set[tuple[str, int]] = set()
        self.count = 0

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
        return self.count

    def _line(self, line: bytes) -> None:
        try:
            record = json.loads(line)
            key = (str(record["p"]), int(record["i"]))
        except (ValueError, KeyError, TypeError):
            return
        if record.get("ev") == "invoke" and record.get("op") == "complete":
            self._open_completes.add(key)
        elif record.get("ev") == "return" and key in self._open_completes:
            self._open_completes.discard(key)
            self.count += record.get("outcome") == "ok"


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


class ProgressBar:
    """A rich progress bar for :class:`RunStatus` updates (a ``watch`` callable)::

        fault period ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━  12.3 / 20.0 s  faults 4/7  completed 41/100

    Use it as a context manager around the run; it removes itself at the end (the
    summary follows). Lines printed on the same console go above it.

    Args:
        console: the console to draw on (a terminal).
    """

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(),
            TextColumn("{task.fields[clock]}"), TextColumn("faults {task.fields[faults]}"),
            TextColumn("completed {task.fields[done]}"),
            console=console, transient=True, auto_refresh=False,
        )
        self._task: TaskID | None = None

    def __call__(self, status: RunStatus) -> None:
        description = PHASES.get(status.phase, status.phase)
        total = max(status.total_s, 1e-9)
        done = min(status.elapsed_s, total)
        clock = f"{status.elapsed_s:5.1f} / {status.total_s:.1f} s"
        faults = f"{status.faults_injected}/{status.faults_planned}"
        jobs = f"{status.completions}/{status.jobs}"
        if self._task is None:
            self._task = self._progress.add_task(description, total=total, clock=clock,
                                                 faults=faults, done=jobs)
        self._progress.update(self._task, description=description, total=total,
                              completed=done, clock=clock, faults=faults, done=jobs,
                              refresh=True)  # redrawn at each status, not on a timer

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._progress.stop()
