"""The deadline guard of ``consensus-lease run``: starts the command and kills its process
group when the lease's local deadline comes, unless the runner reports a later one.

Why a process of its own: the runner holds the lease, and a runner that is paused
(SIGSTOP, a frozen VM, swap) can neither renew the lease nor kill anything. The store
then expires the lease and another runner starts the command elsewhere, while this
runner's command would still be running. The guard is not paused with the runner (it
runs in a session and process group of its own), knows the deadline in advance, and
needs nobody's permission to act on it: a runner that stops talking only makes the kill
come sooner. The guard is the command's parent, so it knows the command's process group
before the command runs a single instruction. (``prctl(PR_SET_PDEATHSIG)`` would not do:
a stopped runner is not dead.)

It is started by :mod:`consensus_lease.runcmd.supervisor` as a script::

    python -I guard.py CMD_FD STATUS_FD DEADLINE KILL_MARGIN_S GRACE_S -- COMMAND...

and imports only the standard library (never consensus_lease), so it starts quickly and
does not share the runner's threads or state. Times are ``time.monotonic()`` seconds:
CLOCK_MONOTONIC, one clock for every process of the machine.

Schedule: SIGTERM to the group at ``deadline - KILL_MARGIN_S - GRACE_S`` and SIGKILL at
``deadline - KILL_MARGIN_S``; when told to stop (lease lost, runner interrupted or gone),
SIGTERM at once and SIGKILL ``GRACE_S`` later, never after ``deadline - KILL_MARGIN_S``.
When the command's first process exits, whatever is left of its group gets SIGKILL: no
part of the command outlives the run. The exited process is not reaped until the runner
says ``bye``, so its process group id cannot be reused by an unrelated process while the
runner may still signal it.

Protocol, ASCII lines:

runner -> guard (CMD_FD)
    ``deadline T``   the lease's local deadline moved to T (only ever later)
    ``lost``         the lease is lost: stop the command
    ``term``         the runner was asked to stop (SIGINT/SIGTERM/SIGHUP): stop the command
    ``bye``          the runner has the exit status: reap the command and exit
    end of file      the runner is gone: stop the command (after its exit: as ``bye``)

guard -> runner (STATUS_FD)
    ``pid P``                 the command runs as process P, leader of process group P
    ``spawn-error C TEXT``    it could not be started (C = 126 not executable, 127 not found)
    ``exit R WHY``            its first process exited with R (``subprocess`` returncode:
                              negative = killed by that signal); WHY is ``none`` if the
                              guard never signalled it, else ``deadline``, ``lost``,
                              ``term`` or ``eof``: why the guard stopped it
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time

__all__ = ["Schedule", "main"]


class Schedule:
    """When to signal the command's process group (pure: the caller passes the times).

    Args:
        deadline: the lease's local deadline (monotonic seconds).
        kill_margin_s: SIGKILL is sent this long before the deadline.
        grace_s: seconds between SIGTERM and SIGKILL.
    """

    def __init__(self, deadline: float, kill_margin_s: float, grace_s: float) -> None:
        self.deadline = deadline
        self.kill_margin_s = kill_margin_s
        self.grace_s = grace_s
        self.reason: str | None = None
        """Why the command is being stopped (``deadline``, ``lost``, ``term``, ``eof``),
        or ``None`` while it may run on."""
        self.term_at = deadline - kill_margin_s - grace_s
        self.term_sent = False
        self.kill_sent = False

    @property
    def kill_at(self) -> float:
        return min(self.term_at + self.grace_s, self.deadline - self.kill_margin_s)

    def extend(self, deadline: float) -> None:
        """The lease was renewed: move the deadline later (never earlier). Ignored once
        stopping has begun: a SIGTERM cannot be taken back."""
        if self.reason is None and deadline > self.deadline:
            self.deadline = deadline
            self.term_at = deadline - self.kill_margin_s - self.grace_s

    def stop(self, now: float, reason: str) -> None:
        """Stop the command: SIGTERM at ``now``, SIGKILL after the grace period (at the
        latest ``kill_margin_s`` before the deadline)."""
        if self.reason is None:
            self.reason = reason
            self.term_at = min(now, self.term_at)

    def due(self, now: float) -> list[signal.Signals]:
        """The signals to send at ``now`` (each is returned once)."""
        out: list[signal.Signals] = []
        if not self.term_sent and now >= self.term_at:
            self.term_sent = True
            out.append(signal.SIGTERM)
        if not self.kill_sent and now >= self.kill_at:
            self.kill_sent = True
            out.append(signal.SIGKILL)
        if out and self.reason is None:
            self.reason = "deadline"
        return out

    def next_at(self) -> float | None:
        """When :meth:`due` next has something to send; ``None`` once both were sent."""
        pending = [at for at, sent in ((self.term_at, self.term_sent),
                                       (self.kill_at, self.kill_sent)) if not sent]
        return min(pending) if pending else None


class _Lines:
    """Complete lines from a pipe (``None`` at end of file)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""

    def read(self) -> list[str] | None:
        try:
            data = os.read(self.fd, 4096)
        except OSError:
            data = b""
        if not data:
            return None
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line.decode("ascii", "replace") for line in lines]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group is gone
        os.killpg(pgid, sig)


def _exit_fd(pid: int) -> int:
    """A file descriptor that becomes readable when ``pid`` exits (without reaping it)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3: a thread waits instead
        read_fd, write_fd = os.pipe()

        def wait() -> None:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            os.write(write_fd, b"x")

        threading.Thread(target=wait, daemon=True).start()
        return read_fd


def _returncode(pid: int) -> int:
    """The exit of ``pid``, as ``subprocess`` reports it, leaving the process unreaped."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    if info is None:  # pragma: no cover - only with WNOHANG
        return -int(signal.SIGKILL)
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def _apply(line: str, schedule: Schedule) -> None:
    word, _, rest = line.partition(" ")
    if word == "deadline":
        try:
            deadline = float(rest)
        except ValueError:
            deadline = math.nan
        if math.isfinite(deadline):
            schedule.extend(deadline)
        else:
            schedule.stop(time.monotonic(), "lost")  # garbled: be safe
    elif word in ("lost", "term"):
        schedule.stop(time.monotonic(), word)


def _supervise(pid: int, commands: _Lines, schedule: Schedule) -> int:
    """Carry out the schedule until the command's first process exits; return its code."""
    exit_fd = _exit_fd(pid)
    cmd_fd = commands.fd
    runner_gone = False
    while True:
        for sig in schedule.due(time.monotonic()):
            _signal_group(pid, sig)
        next_at = schedule.next_at()
        timeout = None if next_at is None else max(0.0, next_at - time.monotonic())
        fds = [exit_fd] if runner_gone else [exit_fd, cmd_fd]
        ready, _, _ = select.select(fds, [], [], timeout)
        if exit_fd in ready:
            returncode = _returncode(pid)
            _signal_group(pid, signal.SIGKILL)  # what is left of the group
            os.close(exit_fd)
            return returncode
        if cmd_fd in ready:
            lines = commands.read()
            if lines is None:
                runner_gone = True
                schedule.stop(time.monotonic(), "eof")
            for line in lines or ():
                _apply(line, schedule)


def _wait_for_bye(commands: _Lines) -> None:
    while (lines := commands.read()) is not None:
        if "bye" in lines:
            return


def _send(status_fd: int, line: str) -> None:
    with contextlib.suppress(OSError):  # the runner is gone: CMD_FD's end of file tells
        os.write(status_fd, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))


def main(argv: list[str]) -> int:
    """Run the guard (see the module docstring for ``argv``). Returns 0, or 2 when
    ``argv`` is malformed."""
    try:
        cmd_fd, status_fd = int(argv[0]), int(argv[1])
        schedule = Schedule(float(argv[2]), float(argv[3]), float(argv[4]))
        if argv[5] != "--" or len(argv) < 7:
            raise ValueError("no command")
    except (IndexError, ValueError) as exc:
        print(f"consensus-lease guard: bad arguments: {exc}", file=sys.stderr)
        return 2
    command = argv[6:]
    try:
        child = subprocess.Popen(command, start_new_session=True)
    except OSError as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        _send(status_fd, f"spawn-error {code} {exc}")
        return 0
    _send(status_fd, f"pid {child.pid}")
    commands = _Lines(cmd_fd)
    returncode = _supervise(child.pid, commands, schedule)
    _send(status_fd, f"exit {returncode} {schedule.reason or 'none'}")
    _wait_for_bye(commands)
    child.wait()  # reaped only now: until here the process group id stays reserved
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
