"""The deadline guard of `consensus-lease run`: its schedule (pure) and the guard process
on its own, with no store: it must kill the command's group before the deadline it knows,
whatever the runner does."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hb_child import proc_state  # tests/cli, on sys.path as the test's own directory

from consensus_lease import open_store
from consensus_lease.errors import InvalidArgument
from consensus_lease.runcmd.guard import Schedule
from consensus_lease.runcmd.supervisor import Budget, GuardProcess, Outcome, Wakeup, supervise
from consensus_lease.testing.conformance import poll_until

HB = str(Path(__file__).with_name("hb_child.py"))

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="needs POSIX process groups and /proc (Linux)")


# -- the schedule ----------------------------------------------------------------------


def test_schedule_terms_then_kills_before_the_deadline() -> None:
    s = Schedule(deadline=100.0, kill_margin_s=0.5, grace_s=2.0)
    assert s.next_at() == 97.5
    assert s.due(97.4) == []
    assert s.due(97.5) == [signal.SIGTERM] and s.reason == "deadline"
    assert s.next_at() == 99.5
    assert s.due(99.4) == []
    assert s.due(99.5) == [signal.SIGKILL]
    assert s.next_at() is None and s.due(200.0) == []


def test_schedule_extension_moves_both_signals_but_never_back() -> None:
    s = Schedule(deadline=100.0, kill_margin_s=0.5, grace_s=2.0)
    s.extend(110.0)
    s.extend(105.0)  # an older deadline changes nothing
    assert s.deadline == 110.0 and s.next_at() == 107.5
    assert s.due(100.0) == []


def test_schedule_stop_terms_now_and_kills_after_grace_or_by_the_deadline() -> None:
    s = Schedule(deadline=100.0, kill_margin_s=0.5, grace_s=2.0)
    s.stop(50.0, "lost")
    assert s.due(50.0) == [signal.SIGTERM] and s.reason == "lost"
    assert s.kill_at == 52.0
    s.extend(200.0)  # once stopping, a renewal cannot take the SIGTERM back
    assert s.kill_at == 52.0
    late = Schedule(deadline=100.0, kill_margin_s=0.5, grace_s=2.0)
    late.stop(99.0, "term")
    assert late.due(99.0) == [signal.SIGTERM]
    assert late.kill_at == 99.5  # the deadline bounds the grace


def test_budget_defaults_and_limits() -> None:
    b = Budget.for_session(2.0, 0.2)
    assert (b.grace_s, b.kill_margin_s, b.poll_s) == (0.5, 0.1, 0.1)
    big = Budget.for_session(100.0, 10.0)
    assert (big.grace_s, big.kill_margin_s, big.poll_s) == (10.0, 0.25, 0.25)
    with pytest.raises(InvalidArgument, match="too long"):
        Budget.for_session(2.0, 0.2, grace_s=1.0)
    with pytest.raises(InvalidArgument):
        Budget.for_session(2.0, 0.2, grace_s=0.0)


# -- the guard process -----------------------------------------------------------------


def lines(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line]


def last_heartbeat_mono(path: Path) -> float:
    return max(float(w[2]) for w in lines(path) if w[0] in ("hb", "start"))


def wait_outcome(guard: GuardProcess, wake: Wakeup, timeout_s: float = 30.0) -> Outcome:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        outcome = guard.wait(0.1, wake)
        if outcome is not None:
            return outcome
    raise AssertionError("the command did not end")


@pytest.fixture()
def wake() -> Iterator[Wakeup]:
    w = Wakeup()
    yield w
    w.close()


def test_guard_kills_the_group_before_the_deadline_without_the_runner(
    tmp_path: Path, wake: Wakeup
) -> None:
    """Nobody extends the deadline: a command that ignores SIGTERM, and its grandchild,
    are SIGKILLed before the deadline."""
    out, grandchild = tmp_path / "c", tmp_path / "g"
    budget = Budget(grace_s=0.3, kill_margin_s=0.3, poll_s=0.1)
    deadline = time.monotonic() + 4.0
    guard = GuardProcess([sys.executable, HB, str(out), "--ignore-term", "--grandchild",
                          str(grandchild), "--max-s", "30"], os.environ, deadline, budget)
    try:
        poll_until(lambda: lines(out) and lines(grandchild), 30)
        outcome = wait_outcome(guard, wake)
    finally:
        guard.close()
    assert outcome == Outcome(status=128 + signal.SIGKILL, stopped="deadline")
    assert last_heartbeat_mono(out) < deadline
    # The grandchild (same group) was killed with it: no heartbeat after the deadline.
    grandchild_pid = int(lines(grandchild)[0][3])
    poll_until(lambda: proc_state(grandchild_pid) in ("gone", "Z"), 10)
    assert last_heartbeat_mono(grandchild) < deadline


def test_guard_keeps_the_command_while_the_deadline_is_extended(
    tmp_path: Path, wake: Wakeup
) -> None:
    out, stop = tmp_path / "c", tmp_path / "stop"
    budget = Budget(grace_s=0.3, kill_margin_s=0.3, poll_s=0.1)
    first_deadline = time.monotonic() + 2.5
    guard = GuardProcess([sys.executable, HB, str(out), "--until", str(stop), "--max-s", "30"],
                         os.environ, first_deadline, budget)
    try:
        poll_until(lambda: lines(out), 30)
        while time.monotonic() < first_deadline + 1.0:
            guard.extend(time.monotonic() + 2.0)
            assert guard.wait(0.1, wake) is None
        stop.touch()
        outcome = wait_outcome(guard, wake)
    finally:
        guard.close()
    assert outcome == Outcome(status=0, stopped=None)
    assert lines(out)[-1] == ["end"]


def test_guard_stops_the_command_at_once_when_told_the_lease_is_lost(
    tmp_path: Path, wake: Wakeup
) -> None:
    out = tmp_path / "c"
    budget = Budget(grace_s=0.5, kill_margin_s=0.3, poll_s=0.1)
    guard = GuardProcess([sys.executable, HB, str(out), "--max-s", "30"], os.environ,
                         time.monotonic() + 60.0, budget)
    try:
        poll_until(lambda: lines(out), 30)
        told = time.monotonic()
        guard.send("lost")
        outcome = wait_outcome(guard, wake)
    finally:
        guard.close()
    assert outcome == Outcome(status=128 + signal.SIGTERM, stopped="lost")
    assert last_heartbeat_mono(out) < told + 5.0  # not the 60 s deadline


def test_guard_reports_a_command_that_cannot_start(wake: Wakeup) -> None:
    guard = GuardProcess(["/nonexistent/command"], os.environ, time.monotonic() + 60.0,
                         Budget(grace_s=0.5, kill_margin_s=0.3, poll_s=0.1))
    try:
        outcome = wait_outcome(guard, wake)
    finally:
        guard.close()
    assert outcome.status == 127 and "No such file" in outcome.detail


def test_the_runner_kills_the_group_itself_when_the_guard_is_stopped(
    tmp_path: Path, wake: Wakeup
) -> None:
    """The other half of the guarantee: with the guard SIGSTOPped, the runner's own loop
    SIGKILLs the group before the lease's local deadline (no renewals: keepalive off)."""
    out = tmp_path / "c"
    with open_store("memory://") as store, \
            store.session("runner", ttl_s=3.0, keepalive=False) as session:
        lease = session.claim("j")
        assert lease is not None
        budget = Budget.for_session(session.granted_ttl_s, session.safety_margin_s)
        guard = GuardProcess([sys.executable, HB, str(out), "--ignore-term", "--max-s", "30"],
                             os.environ, lease.deadline, budget)
        try:
            poll_until(lambda: lines(out), 30)
            pid = int(lines(out)[0][3])
            os.kill(guard.process.pid, signal.SIGSTOP)

            def resume_guard_once_the_command_is_dead() -> None:
                poll_until(lambda: proc_state(pid) in ("gone", "Z"), 30)
                os.kill(guard.process.pid, signal.SIGCONT)

            waiter = threading.Thread(target=resume_guard_once_the_command_is_dead)
            waiter.start()
            outcome = supervise(lease, guard, budget, wake)
            waiter.join()
        finally:
            os.kill(guard.process.pid, signal.SIGCONT)
            guard.close()
    assert outcome == Outcome(status=128 + signal.SIGKILL, stopped="deadline")
    assert last_heartbeat_mono(out) < lease.deadline
