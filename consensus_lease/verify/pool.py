"""The verifier's worker processes: start, pause, kill, restart, stop — by slot.

A *slot* is a place for one worker; a kill or a clock-skew restart puts a fresh process
(named ``w<slot>.<n>``) in the same slot, with the same group id, so a partition that
targets the slot's gid still applies. Processes are started with ``subprocess`` (never
forked) in their own session, so a Ctrl-C on the verifier does not reach them; their
output goes to ``<logs_dir>/<name>.log``. Each process's :class:`WorkerConfig` (with the
run's whole job list) is written to ``<logs_dir>/<name>.config.json`` and only that path
goes on its command line, so the number of jobs is not bounded by the kernel's argument
size limit (``E2BIG``, 128 KiB per argument). That file holds the store URL with its
password, so it is created mode 0600 (never readable by others, not even for a moment).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .interrupts import deferred
from .worker import WorkerConfig

__all__ = ["PausePoint", "WorkerHandle", "WorkerPool"]

_POLL_S = 0.02


@dataclass(frozen=True)
class PausePoint:
    """Where a worker stopped itself (pause at check, see the worker): after a passed
    ``ensure_held()`` on ``job`` at ``generation``, before its ``before`` action
    (``write`` or ``complete``) of step ``step``."""

    job: str
    generation: int
    before: str
    step: int


@dataclass
class WorkerHandle:
    """One worker process.

    Attributes:
        slot: the slot it occupies.
        name: its name in the history.
        proc: the process.
        config: what it was started with.
        gid: its group id (``None``: the verifier's).
        log_path: its stdout and stderr.
        expected_exit: the verifier killed or stopped it (a non-zero exit is no crash).
    """

    slot: int
    name: str
    proc: subprocess.Popen[bytes]
    config: WorkerConfig
    gid: int | None
    log_path: Path
    expected_exit: bool = False


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file ``path`` created mode 0600 (a file left there by an
    earlier run in the same run directory is replaced, not reused with its mode)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)


def _signal(handle: WorkerHandle, signum: signal.Signals) -> bool:
    if handle.proc.poll() is not None:
        return False
    try:
        os.kill(handle.proc.pid, signum)
    except ProcessLookupError:
        return False
    return True


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``R``, ``S``, ``T`` stopped, ...), or
    ``None`` if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


class WorkerPool:
    """Worker processes in ``slots`` slots.

    Args:
        template: the config every worker shares; ``name``, ``history_path`` and ``seed``
            are filled in per process (the seed from ``template.seed`` and the name).
        slots: number of slots (concurrent workers).
        parts_dir: where each worker's history part file goes.
        logs_dir: where each worker's output goes (and its pause-at-check flag file).
        gids: one group id per slot (root only; for partitions), or ``None``.
    """

    def __init__(self, template: WorkerConfig, *, slots: int, parts_dir: Path, logs_dir: Path,
                 gids: Sequence[int] | None = None) -> None:
        if gids is not None and len(gids) != slots:
            raise ValueError("one gid per slot")
        self.template = template
        self.slots = slots
        self.parts_dir = parts_dir
        self.logs_dir = logs_dir
        self.gids = list(gids) if gids is not None else None
        self._current: dict[int, WorkerHandle] = {}
        self._all: list[WorkerHandle] = []
        self._starts: dict[int, int] = {}

    # -- lifecycle -------------------------------------------------------------------

    def start_all(self) -> None:
        for slot in range(self.slots):
            self.start(slot)

    def start(self, slot: int, clock_offset_s: float = 0.0) -> WorkerHandle:
        """Start a process in ``slot`` (which must be empty or dead)."""
        old = self._current.get(slot)
        if old is not None and old.proc.poll() is None:
            raise RuntimeError(f"slot {slot} still has a live worker {old.name}")
        n = self._starts.get(slot, 0)
        self._starts[slot] = n + 1
        name = f"w{slot}" if n == 0 else f"w{slot}.{n}"
        config = replace(
            self.template,
            name=name,
            history_path=str(self.parts_dir / f"{name}.jsonl"),
            seed=random.Random(f"{self.template.seed}:{name}").getrandbits(32),
            clock_offset_s=clock_offset_s,
            pause_flag_path=str(self.logs_dir / f"{name}.pause-at-check"),
        )
        gid = self.gids[slot] if self.gids is not None else None
        config_path = self.logs_dir / f"{name}.config.json"
        _write_private(config_path, config.to_json())
        argv: list[str] = [sys.executable, "-m", "consensus_lease.verify.worker",
                           str(config_path)]
        if gid is not None:
            # --regid sets the real and the effective gid (adding --egid is an error).
            argv = ["setpriv", f"--regid={gid}", "--clear-groups", *argv]
        log_path = self.logs_dir / f"{name}.log"
        # A SIGTERM between the fork and the bookkeeping would leave a worker nobody stops.
        with deferred(), log_path.open("wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True)
            handle = WorkerHandle(slot, name, proc, config, gid, log_path)
            self._current[slot] = handle
            self._all.append(handle)
        return handle

    def handle(self, slot: int) -> WorkerHandle | None:
        return self._current.get(slot)

    def alive(self, slot: int) -> bool:
        handle = self._current.get(slot)
        return handle is not None and handle.proc.poll() is None

    def gid(self, slot: int) -> int | None:
        return self.gids[slot] if self.gids is not None else None

    # -- faults ----------------------------------------------------------------------

    def pause(self, slot: int) -> bool:
        """SIGSTOP the slot's worker; False if there is none alive."""
        handle = self._current.get(slot)
        return handle is not None and _signal(handle, signal.SIGSTOP)

    def resume(self, slot: int) -> None:
        """SIGCONT the slot's worker."""
        handle = self._current.get(slot)
        if handle is not None:
            _signal(handle, signal.SIGCONT)

    def kill(self, slot: int) -> bool:
        """SIGKILL the slot's worker and reap it; False if there was none alive."""
        handle = self._current.get(slot)
        if handle is None or handle.proc.poll() is not None:
            return False
        handle.expected_exit = True
        _signal(handle, signal.SIGKILL)
        handle.proc.wait(timeout=30)
        return True

    def terminate(self, slot: int, timeout_s: float = 10.0) -> None:
        """Ask the slot's worker to stop (SIGTERM, SIGCONT); SIGKILL after ``timeout_s``."""
        handle = self._current.get(slot)
        if handle is None:
            return
        handle.expected_exit = True
        self._disarm(handle)
        _signal(handle, signal.SIGTERM)
        _signal(handle, signal.SIGCONT)
        try:
            handle.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal(handle, signal.SIGKILL)
            handle.proc.wait(timeout=30)

    def restart(self, slot: int, clock_offset_s: float = 0.0, *, graceful: bool = True) -> None:
        """Replace the slot's worker by a fresh process with ``clock_offset_s`` skew."""
        if graceful:
            self.terminate(slot)
        else:
            self.kill(slot)
        self.start(slot, clock_offset_s)

    def arm_pause_at_check(self, slot: int) -> bool:
        """The worker will SIGSTOP itself after its next passed check (it removes
        the flag file when it does). False if there is no live worker in the slot."""
        handle = self._current.get(slot)
        if handle is None or handle.proc.poll() is not None:
            return False
        Path(handle.config.pause_flag_path).touch()
        return True

    def disarm(self, slot: int) -> bool:
        """Undo :meth:`arm_pause_at_check`. False if the worker already consumed the
        arming (it is stopping or stopped at a check)."""
        handle = self._current.get(slot)
        return handle is not None and self._disarm(handle)

    @staticmethod
    def _disarm(handle: WorkerHandle) -> bool:
        try:
            os.unlink(handle.config.pause_flag_path)
        except FileNotFoundError:
            return False
        return True

    def stopped(self, slot: int) -> bool:
        """True if the slot's worker is stopped (SIGSTOP) right now."""
        handle = self._current.get(slot)
        return (handle is not None and handle.proc.poll() is None
                and process_state(handle.proc.pid) in ("T", "t"))

    def pause_points(self, slot: int) -> list[PausePoint]:
        """The pause points the slot's current worker has recorded, oldest first."""
        handle = self._current.get(slot)
        if handle is None:
            return []
        points = []
        try:
            lines = Path(handle.config.history_path).read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        for line in lines:
            if '"pause_point"' not in line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("op") == "pause_point":
                detail = record.get("detail") or {}
                points.append(PausePoint(str(record["job"]), int(record["gen"]),
                                         str(detail.get("before")), int(detail.get("step", -1))))
        return points

    def resume_all(self) -> None:
        """Disarm and SIGCONT every live worker."""
        for handle in self._current.values():
            self._disarm(handle)
            _signal(handle, signal.SIGCONT)

    def resume_stopped(self) -> list[str]:
        """SIGCONT any live worker found stopped; returns their names."""
        names = []
        for slot, handle in self._current.items():
            if self.stopped(slot):
                _signal(handle, signal.SIGCONT)
                names.append(handle.name)
        return names

    # -- the end ---------------------------------------------------------------------

    def all_exited(self) -> bool:
        return all(h.proc.poll() is not None for h in self._current.values())

    def finished(self) -> bool:
        """True once every slot's current worker exited 0 on its own (a worker does when
        it has seen every job completed, or at its ``stop_at``); False while one runs, or
        if one was killed or stopped by the verifier (its replacement may be due)."""
        return bool(self._current) and all(
            h.proc.poll() == 0 and not h.expected_exit for h in self._current.values())

    def stop_all(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (and SIGCONT) every worker; SIGKILL those still alive after
        ``timeout_s``. Their exits count as expected."""
        for handle in self._current.values():
            if handle.proc.poll() is None:
                handle.expected_exit = True
                self._disarm(handle)
                _signal(handle, signal.SIGTERM)
                _signal(handle, signal.SIGCONT)
        deadline = time.monotonic() + timeout_s
        while not self.all_exited() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        for handle in self._current.values():
            if handle.proc.poll() is None:
                _signal(handle, signal.SIGKILL)
                handle.proc.wait(timeout=30)

    def crashed(self) -> bool:
        """True if some worker exited non-zero on its own."""
        return any(h.proc.poll() not in (None, 0) and not h.expected_exit
                   for h in list(self._all))

    def crashes(self) -> list[str]:
        """Workers that exited non-zero on their own: ``"name (exit N): last output"``."""
        found = []
        for handle in list(self._all):
            code = handle.proc.poll()
            if code not in (None, 0) and not handle.expected_exit:
                try:
                    tail = handle.log_path.read_text(errors="replace")[-1500:]
                except OSError:
                    tail = ""
                found.append(f"{handle.name} (exit {code}): {tail.strip()}")
        return found

    def part_files(self) -> list[Path]:
        """Every history part file written by any worker of this pool."""
        return [Path(h.config.history_path) for h in self._all
                if Path(h.config.history_path).exists()]

    def names(self) -> list[str]:
        return [h.name for h in self._all]
