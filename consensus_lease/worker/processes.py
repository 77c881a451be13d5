"""Running a worker's slots as processes: one single-threaded worker per process.

Processes are started with multiprocessing's ``spawn`` method (a fresh interpreter, never
``fork``: gRPC and kazoo clients are not fork-safe, and each process opens its own store
connection). The parent only supervises; it holds no store connection while they run:

* a stop request (SIGTERM/SIGINT to the parent, the caller's ``stop_event``) is passed on
  as SIGTERM to every process, which stops gracefully (``grace_s``); a second request
  passes on a second SIGTERM (skip the grace period). A process still running
  ``grace_s`` + :data:`EXIT_MARGIN_S` after the request is SIGKILLed (counted as an
  error; the store's TTL hands its job back). Worker processes ignore SIGINT: a Ctrl-C in
  a terminal reaches the whole process group, and the parent decides;
* a process killed by a signal the parent did not send (OOM killer, an operator's
  SIGKILL) is replaced (``restarts``; at most :data:`RESTARTS_PER_SLOT` per slot);
* a process that cannot run (status 1: the store cannot be opened, the handler cannot
  be imported; or any other non-zero status) stops the whole worker
  (``stopped_by="error"``);
* a worker process whose parent dies stops as if sent SIGTERM.

Each process sends its :class:`WorkerStats` back when it exits; a killed process's
counts are lost.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
from contextlib import suppress
from multiprocessing.process import BaseProcess
from typing import Any

from ..errors import InvalidArgument, LeaseError
from .config import WorkerConfig
from .control import StopControl, signal_handlers
from .handler import Handler, load_handler
from .logs import configure_logging
from .stats import WorkerStats

__all__ = ["check_picklable", "run_processes"]

log = logging.getLogger("consensus_lease.worker")

EXIT_MARGIN_S = 5.0
"""Seconds a worker process gets after its grace period to release and exit."""
RESTARTS_PER_SLOT = 5
"""A slot whose process was killed this many times is not replaced again."""
POLL_S = 0.2
"""Longest wait between looks at the stop request (process exits wake the parent)."""


class _Supervisor:
    """Starts, replaces and stops the worker processes; sums their counts."""

    def __init__(self, url: str, config: WorkerConfig, handler: Handler | str,
                 control: StopControl, log_level: int) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.results: Any = self.ctx.SimpleQueue()
        self.args = (url, config, handler, log_level)
        self.config = config
        self.control = control
        self.procs: dict[int, BaseProcess] = {}
        self.restarts: dict[int, int] = {}
        self.stats = WorkerStats()
        self.signalled = 0  # SIGTERMs passed on to every process
        self.kill_at: float | None = None

    def start(self, slot: int) -> None:
        proc = self.ctx.Process(target=_child_main, args=(slot, *self.args, self.results),
                                name=f"consensus-lease-worker-{slot}", daemon=True)
        proc.start()
        self.procs[slot] = proc
        log.info("worker process started", extra={"slot": slot, "pid": proc.pid})

    def run(self) -> WorkerStats:
        for slot in range(self.config.concurrency):
            self.start(slot)
        while self.procs:
            self._pass_on_stop()
            multiprocessing.connection.wait([p.sentinel for p in self.procs.values()],
                                            timeout=POLL_S)
            for slot, proc in list(self.procs.items()):
                if proc.exitcode is not None:
                    del self.procs[slot]
                    self._exited(slot, proc)
        while not self.results.empty():
            self.stats.add(self.results.get())
        self.stats.stopped_by = self.control.reason or (
            "drained" if self.config.until_empty else None)
        return self.stats

    def _pass_on_stop(self) -> None:
        wanted = 2 if self.control.hurried else 1 if self.control.stopping else 0
        while self.signalled < wanted:
            self.signalled += 1
            for proc in self.procs.values():
                _signal(proc, signal.SIGTERM)
            if self.kill_at is None:
                self.kill_at = time.monotonic() + self.config.grace_s + EXIT_MARGIN_S
        if self.kill_at is not None and time.monotonic() > self.kill_at:
            for slot, proc in self.procs.items():
                if proc.exitcode is None:
                    log.error("worker process did not exit in time; killing it",
                              extra={"slot": slot, "pid": proc.pid})
                    _signal(proc, signal.SIGKILL)
                    self.stats.errors += 1
            self.kill_at = float("inf")

    def _exited(self, slot: int, proc: BaseProcess) -> None:
        code = proc.exitcode
        fields = {"slot": slot, "pid": proc.pid, "exitcode": code}
        if code == 0 or (code is not None and code < 0 and self.signalled):
            log.info("worker process exited", extra=fields)
        elif code is not None and code < 0 and self.restarts.get(slot, 0) < RESTARTS_PER_SLOT:
            self.restarts[slot] = self.restarts.get(slot, 0) + 1
            self.stats.restarts += 1
            log.error("worker process killed by %s; starting a new one",
                      signal.Signals(-code).name, extra=fields)
            self.start(slot)
        else:
            self.stats.errors += 1
            log.error("worker process failed; stopping the worker", extra=fields)
            self.control.request("error")


def run_processes(url: str, config: WorkerConfig, handler: Handler | str,
                  control: StopControl) -> WorkerStats:
    """Run ``config.concurrency`` worker processes (see the module docstring).

    Raises:
        InvalidArgument: ``handler`` cannot be sent to another process (a lambda, a
            nested function): pass a module-level function or a ``"module:function"``.
    """
    check_picklable(handler)
    level = logging.getLogger("consensus_lease.worker").getEffectiveLevel()
    return _Supervisor(url, config, handler, control, level).run()


def check_picklable(handler: Handler | str) -> None:
    """Refuse a handler that cannot be sent to a worker process.

    Raises:
        InvalidArgument: ``handler`` cannot be pickled (a lambda, a nested function).
    """
    if not isinstance(handler, str):
        try:
            pickle.dumps(handler)
        except Exception as exc:
            raise InvalidArgument(
                "mode='process' needs a handler importable by name (a module-level "
                f"function, or 'package.module:function'); this one is not: {exc}"
            ) from exc


def _signal(proc: BaseProcess, signum: signal.Signals) -> None:
    if proc.pid is not None and proc.exitcode is None:
        with suppress(ProcessLookupError):  # it exited meanwhile
            os.kill(proc.pid, signum)


def _child_main(slot: int, url: str, config: WorkerConfig, handler: Handler | str,
                log_level: int, results: Any) -> None:
    """A worker process: one slot in its main thread's care; SIGTERM stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(log_level)
    from .runner import run_in_threads

    control = StopControl()
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_watch_parent, args=(parent, control), daemon=True,
                         name="consensus-lease-worker-parent-watch").start()
    try:
        with signal_handlers(control, (signal.SIGTERM,)):
            function = load_handler(handler) if isinstance(handler, str) else handler
            stats = run_in_threads(url, config.single(), function, control, None, f"{slot}.")
    except LeaseError as exc:
        log.error("worker process cannot run: %s", exc, extra={"slot": slot})
        sys.exit(1)
    results.put(stats)  # its errors count in the parent's sum; the exit status says
    sys.exit(0)         # only whether the process could run at all


def _watch_parent(parent: BaseProcess, control: StopControl) -> None:
    """A worker process whose parent died (SIGKILL, OOM) stops as if sent SIGTERM."""
    parent.join()
    control.request("parent exited")
