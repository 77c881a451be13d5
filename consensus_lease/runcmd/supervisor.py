"""The runner side of ``consensus-lease run``: start the deadline guard (which starts the
command), pass every renewed deadline on to it, and stop the command when the lease is
lost.

Two processes enforce the deadline, so that either one suffices:

* the guard (:mod:`consensus_lease.runcmd.guard`) kills the command's process group on
  its own schedule, computed from the last deadline the runner passed on. It is not
  paused with the runner, so a SIGSTOPped runner's command still dies in time.
* the runner, on every turn of its loop and first of all after resuming from a pause,
  SIGKILLs the group itself once the last deadline it passed on is within
  ``kill_margin_s``, in case the guard itself was stopped or killed.

The runner only ever passes on a deadline it read from a HELD lease: a successful renewal
moves the session's deadline to ``send time + granted TTL - margin``, which the store has
promised to honour; a lease that is LOST, SUSPENDED or past its deadline passes on
nothing, so the guard's schedule runs out.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from ..errors import InvalidArgument
from ..lease import Lease
from ..states import LeaseState

__all__ = ["Budget", "GuardProcess", "Outcome", "Wakeup", "forwarded_signals", "supervise"]

GUARD_SCRIPT = str(Path(__file__).with_name("guard.py"))

KILL_MARGIN_FRACTION, KILL_MARGIN_MAX_S = 0.05, 0.25
GRACE_FRACTION, GRACE_MAX_S = 0.25, 10.0
POLL_FRACTION, POLL_MAX_S = 0.05, 0.25
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True, slots=True)
class Budget:
    """How the time before the lease's local deadline is spent once renewals stop.

    With granted TTL ``T`` and the session's safety margin ``m`` (10% of ``T`` by
    default), the local deadline ``D`` is the send time of the last successful renewal
    + ``T`` - ``m``; the store keeps the lease at least until it *received* that renewal
    + ``T``, so ``D`` comes at least ``m`` before any other runner can claim the job.
    Renewals go out every ``T/3``. If none arrives::

        D - kill_margin_s - grace_s   SIGTERM to the command's process group
        D - kill_margin_s             SIGKILL to the group
        D                             the runner's session is LOST
        D + m or later                the store may hand the job to another runner

    Attributes:
        grace_s: seconds from SIGTERM to SIGKILL (default ``T/4``, at most 10 s).
        kill_margin_s: SIGKILL is sent this long before ``D``, for the guard's wake-up on
            a busy machine and the kernel's delivery (``T/20``, at most 0.25 s).
        poll_s: how often the runner passes a renewed deadline on to the guard (``T/20``,
            at most 0.25 s).
    """

    grace_s: float
    kill_margin_s: float
    poll_s: float

    @classmethod
    def for_session(
        cls, granted_ttl_s: float, safety_margin_s: float, grace_s: float | None = None
    ) -> Budget:
        """The budget for a session's granted TTL and safety margin (seconds).

        A renewal sent on time leaves ``2T/3 - m`` before ``D``; the guard hears of it up
        to ``poll_s`` later, and the round trip needs time too. So the SIGTERM must not
        come earlier than ``T/2 - m - poll_s`` before ``D`` (``T/6`` left for the round
        trip), else a healthy lease would stop its command.

        Raises:
            InvalidArgument: ``grace_s`` is not a number > 0, or is longer than
                ``T/2 - m - kill_margin_s - poll_s`` (the message gives the limit).
        """
        ttl = granted_ttl_s
        kill_margin = min(KILL_MARGIN_MAX_S, ttl * KILL_MARGIN_FRACTION)
        poll = min(POLL_MAX_S, ttl * POLL_FRACTION)
        limit = ttl / 2 - safety_margin_s - kill_margin - poll
        grace = min(GRACE_MAX_S, ttl * GRACE_FRACTION) if grace_s is None else grace_s
        if not grace > 0:
            raise InvalidArgument(f"grace_s must be > 0, got {grace_s!r}")
        if grace > limit:
            raise InvalidArgument(
                f"grace of {grace:g} s is too long for a granted TTL of {ttl:g} s: at most "
                f"{max(limit, 0):.3g} s (TTL/2 - safety margin {safety_margin_s:g} s - kill "
                f"margin {kill_margin:g} s - poll {poll:g} s); use a longer --ttl-s"
            )
        return cls(grace_s=grace, kill_margin_s=kill_margin, poll_s=poll)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How the command ended.

    Attributes:
        status: shell-style exit status: the command's exit code, ``128 + N`` if it was
            killed by signal ``N``, 126 (not executable) or 127 (not found) if it could
            not be started; ``None`` if the guard failed and the status is unknown.
        stopped: ``None`` if it ended by itself; else why it was stopped: ``deadline``
            (no renewal in time), ``lost`` (the session was lost), ``term`` (the runner
            got a signal), ``eof`` (the guard lost the runner), ``guard-failed``.
        detail: the reason it could not be started, else ``""``.
    """

    status: int | None
    stopped: str | None = None
    detail: str = ""


class Wakeup:
    """A self-pipe the runner's loop waits on; set from a signal handler or from the
    session's loss callback (another thread). The first reason set wins."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self.reason: str | None = None
        self.signum: int | None = None

    def fileno(self) -> int:
        return self._read_fd

    def set(self, reason: str, signum: int | None = None) -> None:
        if self.reason is None:
            self.reason, self.signum = reason, signum
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"x")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._read_fd, 4096)

    def close(self) -> None:
        os.close(self._read_fd)
        os.close(self._write_fd)


@contextlib.contextmanager
def forwarded_signals(wake: Wakeup) -> Iterator[None]:
    """While inside, SIGINT, SIGTERM and SIGHUP to the runner set ``wake`` (reason
    ``term``) instead of ending it, so that the command is stopped and the lease handed
    back. Outside the main thread, signals are left alone."""
    previous: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int | None] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        wake.set("term", signum)

    try:
        for sig in FORWARDED_SIGNALS:
            previous[sig] = signal.signal(sig, handler)
    except ValueError:
        pass  # not the main thread
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class GuardProcess:
    """The runner's end of the guard: start it, talk to it, read the command's fate.

    Args:
        command: the command and its arguments.
        env: the command's environment (the guard runs with it too, isolated: ``-I``).
        deadline: the lease's local deadline (monotonic seconds).
        budget: the kill schedule.

    Raises:
        OSError: the guard could not be started (nothing runs).
    """

    def __init__(
        self, command: Sequence[str], env: Mapping[str, str], deadline: float, budget: Budget
    ) -> None:
        cmd_read, self._cmd_write = os.pipe()
        self._status_read, status_write = os.pipe()
        argv = [sys.executable, "-I", GUARD_SCRIPT, str(cmd_read), str(status_write),
                repr(deadline), repr(budget.kill_margin_s), repr(budget.grace_s), "--",
                *command]
        try:
            self.process = subprocess.Popen(argv, env=dict(env), start_new_session=True,
                                            pass_fds=(cmd_read, status_write))
        except OSError:
            os.close(self._cmd_write)
            os.close(self._status_read)
            raise
        finally:
            os.close(cmd_read)
            os.close(status_write)
        os.set_blocking(self._cmd_write, False)
        self.deadline = deadline
        self.child_pid: int | None = None
        self.outcome: Outcome | None = None
        self._killed = False  # by kill_group: the guard may not know why its command died
        self._buffer = b""

    def send(self, line: str) -> None:
        """Send one line; dropped if the guard is not reading (its schedule stands)."""
        with contextlib.suppress(OSError):
            os.write(self._cmd_write, line.encode("ascii") + b"\n")

    def extend(self, deadline: float) -> None:
        self.deadline = deadline
        self.send(f"deadline {deadline!r}")

    def kill_group(self) -> None:
        """SIGKILL the command's process group now, unless it already exited."""
        if self.child_pid is not None and self.outcome is None:
            self._killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child_pid, signal.SIGKILL)

    def wait(self, timeout_s: float, wake: Wakeup) -> Outcome | None:
        """Wait up to ``timeout_s`` for news from the guard (or ``wake``); return the
        command's outcome once it ended."""
        ready, _, _ = select.select([self._status_read, wake.fileno()], [], [], timeout_s)
        if wake.fileno() in ready:
            wake.drain()
        if self._status_read in ready:
            data = os.read(self._status_read, 4096)
            if not data:  # the guard died without reporting the exit
                self.kill_group()
                self.outcome = Outcome(status=None, stopped="guard-failed")
            self._buffer += data
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                self._read_line(line.decode("utf-8", "replace"))
        return self.outcome

    def _read_line(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "pid":
            self.child_pid = int(rest)
        elif word == "spawn-error":
            code, _, detail = rest.partition(" ")
            self.outcome = Outcome(status=int(code), detail=detail)
        elif word == "exit":
            code, _, why = rest.partition(" ")
            returncode = int(code)
            status = returncode if returncode >= 0 else 128 - returncode
            if why == "none":
                why = "deadline" if self._killed else ""
            self.outcome = Outcome(status=status, stopped=why or None)

    def close(self) -> None:
        """Tell the guard to finish (it reaps the command) and wait for it; a guard that
        does not finish within 5 s is killed. A command still running (the runner is
        giving up on an error) is SIGKILLed first."""
        self.kill_group()
        self.send("bye")
        os.close(self._cmd_write)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._status_read)


def supervise(lease: Lease, guard: GuardProcess, budget: Budget, wake: Wakeup) -> Outcome:
    """Watch ``lease`` until the command ends; return how it ended.

    Each turn: past the last deadline passed on minus ``kill_margin_s``, SIGKILL the
    group (first, so a runner resuming from a pause acts before anything else); if the
    lease was lost or ``wake`` was set, tell the guard to stop the command; else pass on a
    renewed deadline. Then wait for the guard, at most ``poll_s``.
    """
    stopping = False
    while True:
        until_kill = guard.deadline - budget.kill_margin_s - time.monotonic()
        if until_kill <= 0:
            guard.kill_group()
        if not stopping:
            deadline = lease.deadline  # read before the state: it only moves while HELD
            state = lease.state
            why = wake.reason or ("lost" if state is LeaseState.LOST else None)
            if why is not None:
                guard.send(why)
                stopping = True
            elif state is LeaseState.HELD and deadline > guard.deadline:
                guard.extend(deadline)
        timeout = budget.poll_s if until_kill <= 0 else min(budget.poll_s, until_kill)
        outcome = guard.wait(timeout, wake)
        if outcome is not None:
            return outcome
