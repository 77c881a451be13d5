"""`consensus-lease run` on the SQLite store: one runner of many runs the command, the
command gets the fencing token, and a runner paused past its TTL has its command killed
before another runner's command starts."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hb_child import proc_state  # tests/cli, on sys.path as the test's own directory

from consensus_lease import JobState, open_store
from consensus_lease.cli import main
from consensus_lease.runcmd.command import (
    EXIT_LEASE_LOST,
    EXIT_NOT_ACQUIRED,
    EXIT_NOT_RUNNABLE,
    EXIT_USAGE,
)
from consensus_lease.testing.conformance import poll_until

HB = str(Path(__file__).with_name("hb_child.py"))

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="needs POSIX process groups and /proc (Linux)")


@pytest.fixture()
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/leases.db"
    open_store(url).close()  # create the schema before runners race to
    return url


def lines(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line]


def started(path: Path) -> dict[str, str]:
    words = lines(path)[0]
    return dict(zip(("wall", "mono", "pid", "token", "attempt", "job"), words[1:], strict=True))


def last_beat(path: Path) -> float:
    """Wall time of the last line the command wrote (start or heartbeat)."""
    return max(float(w[1]) for w in lines(path) if w[0] in ("hb", "start"))


def runner(url: str, job: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "consensus_lease.cli", "run", "--backend", url, "--job", job,
         *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def child(out: Path, *args: str) -> list[str]:
    return ["--", sys.executable, HB, str(out), *args]


def state(url: str, job: str) -> object:
    with open_store(url) as store:
        record = store.get(job)
    return None if record is None else record.state


# -- one runner, in this process -------------------------------------------------------


def test_the_command_gets_the_lease_in_its_environment_and_its_status_is_passed_on(
    url: str, tmp_path: Path
) -> None:
    env_file = tmp_path / "env"
    status = main(["run", "--backend", url, "--job", "report", "--", "sh", "-c",
                   f"env | grep ^CONSENSUS_LEASE_ | sort > {env_file}; exit 3"])
    assert status == 3
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert env["CONSENSUS_LEASE_TOKEN"] == "1"
    assert env["CONSENSUS_LEASE_JOB_ID"] == "report"
    assert env["CONSENSUS_LEASE_ATTEMPT"] == "1"
    assert env["CONSENSUS_LEASE_OWNER"]
    assert state(url, "report") is JobState.AVAILABLE  # released: may run again
    assert main(["run", "--backend", url, "--job", "report", "--", "true"]) == 0


def test_complete_marks_the_job_completed_and_it_never_runs_again(
    url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    assert main(["run", "--backend", url, "--job", "once", "--complete", "--", "true"]) == 0
    assert state(url, "once") is JobState.COMPLETED
    status = main(["run", "--backend", url, "--job", "once", "--complete", "--", "touch",
                   str(marker)])
    assert status == EXIT_NOT_RUNNABLE and not marker.exists()


def test_complete_does_not_complete_a_failing_command(url: str) -> None:
    assert main(["run", "--backend", url, "--job", "j", "--complete", "--", "false"]) == 1
    assert state(url, "j") is JobState.AVAILABLE


def test_fail_on_error_records_the_failure_and_its_retry_delay(url: str) -> None:
    with open_store(url) as store:
        store.enqueue("nightly", "j", max_attempts=2)
    args = ["run", "--backend", url, "--job", "j", "--fail-on-error", "--retry-in-s", "60",
            "--", "sh", "-c", "exit 5"]
    assert main(args) == 5
    with open_store(url) as store:
        record = store.get("j")
    assert record is not None and record.state is JobState.AVAILABLE
    assert record.attempt == 1 and record.error == "command ended with exit status 5"
    assert record.not_before is not None
    # In its retry delay: not acquired, not run.
    assert main(["run", "--backend", url, "--job", "j", "--", "true"]) == EXIT_NOT_ACQUIRED


def test_fail_on_error_on_the_last_attempt_makes_the_job_failed(url: str) -> None:
    with open_store(url) as store:
        store.enqueue("nightly", "j", max_attempts=1)
    args = ["run", "--backend", url, "--job", "j", "--fail-on-error", "--", "false"]
    assert main(args) == 1
    assert state(url, "j") is JobState.FAILED
    assert main(args) == EXIT_NOT_RUNNABLE


def test_a_command_that_cannot_be_found_exits_127_and_releases(url: str) -> None:
    assert main(["run", "--backend", url, "--job", "j", "--", "/no/such/command"]) == 127
    assert state(url, "j") is JobState.AVAILABLE


@pytest.mark.parametrize("args", [
    ["--job", "j"],                                            # no command
    ["--job", "j", "--retry-in-s", "1", "--", "true"],         # without --fail-on-error
    ["--job", "j", "--ttl-s", "1", "--grace-s", "5", "--", "true"],  # grace > TTL allows
    ["--job", "", "--", "true"],                               # bad job id
])
def test_usage_errors_exit_64(url: str, args: list[str]) -> None:
    assert main(["run", "--backend", url, *args]) == EXIT_USAGE


def test_argparse_usage_errors_exit_64(url: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--backend", url, "--", "true"])  # no --job
    assert exc.value.code == EXIT_USAGE


def test_held_elsewhere_exits_75_without_running(url: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with open_store(url) as store, store.session("holder") as session:
        assert session.claim("j") is not None
        status = main(["run", "--backend", url, "--job", "j", "--wait-s", "0.3", "--",
                       "touch", str(marker)])
    assert status == EXIT_NOT_ACQUIRED and not marker.exists()


# -- several runner processes ----------------------------------------------------------


def test_of_two_runners_exactly_one_runs_the_command(url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    outs = [tmp_path / "a", tmp_path / "b"]
    procs = [runner(url, "cron", "--ttl-s", "5", *child(out, "--until", str(go),
                                                        "--max-s", "50")) for out in outs]
    try:
        loser = poll_until(lambda: next((p for p in procs if p.poll() is not None), None), 45)
        _, err = loser.communicate()
        assert loser.returncode == EXIT_NOT_ACQUIRED, err
        assert "not acquired" in err and "not run" in err
        winner = next(p for p in procs if p is not loser)
        assert winner.poll() is None  # still running its command: that is why it won
    finally:
        go.touch()
    _, err = winner.communicate(timeout=45)
    assert winner.returncode == 0, err
    assert [out.exists() for out in outs].count(True) == 1


def test_a_paused_runner_s_command_is_dead_before_the_next_one_starts(
    url: str, tmp_path: Path
) -> None:
    """Runner 1 (TTL 2 s) runs a command that ignores SIGTERM and has a grandchild; it is
    SIGSTOPped. Its guard kills the whole group before the lease's local deadline, so by
    the time runner 2 gets the lease and starts its command, the first one is gone."""
    c1, g1, c2 = tmp_path / "c1", tmp_path / "g1", tmp_path / "c2"
    r1 = runner(url, "cron", "--ttl-s", "2",
                *child(c1, "--ignore-term", "--grandchild", str(g1), "--max-s", "50"))
    r2 = None
    try:
        poll_until(lambda: lines(c1) and lines(g1), 30)
        r2 = runner(url, "cron", "--ttl-s", "2", "--wait-s", "40", "--complete",
                    *child(c2, "--max-s", "0", "--check-dead", str(c1), str(g1)))
        os.kill(r1.pid, signal.SIGSTOP)
        _, err2 = r2.communicate(timeout=50)
        assert r2.returncode == 0, err2
    finally:
        os.kill(r1.pid, signal.SIGCONT)
        if r2 is not None and r2.poll() is None:
            r2.kill()
    _, err1 = r1.communicate(timeout=30)
    assert r1.returncode == EXIT_LEASE_LOST, err1
    assert "lost" in err1

    second = started(c2)
    assert last_beat(c1) < float(second["wall"])
    assert last_beat(g1) < float(second["wall"])
    assert lines(c1)[-1][0] != "end"  # killed, did not finish
    peers = {w[1]: w[2] for w in lines(c2) if w[0] == "peer"}
    assert set(peers.values()) <= {"gone", "Z"}, peers  # dead when command 2 started
    assert int(second["token"]) > int(started(c1)["token"])
    with open_store(url) as store:
        record = store.get("cron")
    assert record is not None and record.state is JobState.COMPLETED
    assert record.generation == int(second["token"])


def test_a_session_lost_in_the_store_stops_the_command_and_exits_76(
    url: str, tmp_path: Path
) -> None:
    out = tmp_path / "c"
    r = runner(url, "j", "--ttl-s", "6", *child(out, "--max-s", "50"))
    try:
        poll_until(lambda: lines(out), 30)
        with open_store(url) as store:
            record = store.get("j")
            assert record is not None
            with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
                (session_id,) = db.execute(
                    "SELECT session_id FROM cl_sessions WHERE owner = ?", (record.owner,)
                ).fetchone()
            store.backend.expire_session(session_id)  # type: ignore[attr-defined]
        _, err = r.communicate(timeout=30)
    finally:
        if r.poll() is None:
            r.kill()
    assert r.returncode == EXIT_LEASE_LOST, err
    assert "the session was lost" in err


def test_a_killed_runner_s_command_dies_with_it(url: str, tmp_path: Path) -> None:
    """The guard sees the runner's end of the pipe close and stops the command at once,
    long before the lease's 30 s deadline."""
    out = tmp_path / "c"
    r = runner(url, "j", "--ttl-s", "30", *child(out, "--max-s", "50"))
    poll_until(lambda: lines(out), 30)
    pid = int(started(out)["pid"])
    killed_at = time.monotonic()
    r.kill()
    r.communicate(timeout=30)
    poll_until(lambda: proc_state(pid) in ("gone", "Z"), 15)
    # The lease's own schedule would not stop it before ~9 s (TTL 30, renewals every 10 s).
    assert time.monotonic() - killed_at < 5.0


def test_sigterm_to_the_runner_stops_the_command_and_releases(
    url: str, tmp_path: Path
) -> None:
    out = tmp_path / "c"
    r = runner(url, "j", "--ttl-s", "10", *child(out, "--max-s", "50"))
    poll_until(lambda: lines(out), 30)
    r.send_signal(signal.SIGTERM)
    _, err = r.communicate(timeout=30)
    assert r.returncode == 128 + signal.SIGTERM, err
    assert state(url, "j") is JobState.AVAILABLE
    assert lines(out)[-1][0] != "end"
