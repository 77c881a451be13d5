"""`consensus-lease elect` on the SQLite store: the leader runs the command with its
fencing token, the others do not (or wait and take over when it resigns), and a leader
paused past its TTL has its command killed before the next leader's command starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from consensus_lease import open_store
from consensus_lease.cli import main
from consensus_lease.runcmd.command import EXIT_LEASE_LOST, EXIT_NOT_ACQUIRED, EXIT_USAGE
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
    return max(float(w[1]) for w in lines(path) if w[0] in ("hb", "start"))


def elector(url: str, name: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "consensus_lease.cli", "elect", name, "--backend", url, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def child(out: Path, *args: str) -> list[str]:
    return ["--", sys.executable, HB, str(out), *args]


def leader_owner(url: str, name: str) -> str | None:
    with open_store(url) as store:
        leader = store.leader(name)
    return None if leader is None else leader.owner


def test_the_leader_runs_the_command_with_its_token_then_resigns(
    url: str, tmp_path: Path
) -> None:
    env_file = tmp_path / "env"
    status = main(["elect", "sched", "--backend", url, "--value", "host-a:80", "--", "sh",
                   "-c", f"env | grep ^CONSENSUS_LEASE_ | sort > {env_file}; exit 3"])
    assert status == 3
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert env["CONSENSUS_LEASE_TOKEN"] == "1"
    assert env["CONSENSUS_LEASE_ELECTION"] == "sched"
    assert env["CONSENSUS_LEASE_VALUE"] == "host-a:80"
    assert env["CONSENSUS_LEASE_OWNER"]
    assert "CONSENSUS_LEASE_JOB_ID" not in env
    with open_store(url) as store:
        assert store.leader("sched") is None  # resigned
        assert store.records() == []  # an election is no job
    assert main(["elect", "sched", "--backend", url, "--", "true"]) == 0


def test_options_may_come_before_the_name_and_the_command_keeps_its_dashes(
    url: str, tmp_path: Path
) -> None:
    out = tmp_path / "args"
    status = main(["elect", "--backend", url, "sched", "--", "sh", "-c",
                   f'echo "$@" > {out}', "sh", "--backend", "--", "x"])
    assert status == 0
    assert out.read_text().split() == ["--backend", "--", "x"]


def test_not_the_leader_exits_75_without_running(url: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with open_store(url) as store, store.session("holder") as session:
        assert session.campaign("sched") is not None
        assert main(["elect", "sched", "--backend", url, "--", "touch", str(marker)]) == (
            EXIT_NOT_ACQUIRED)
        assert main(["elect", "sched", "--backend", url, "--wait-s", "0.3", "--", "touch",
                     str(marker)]) == EXIT_NOT_ACQUIRED
    assert not marker.exists()


@pytest.mark.parametrize("args", [
    ["sched"],                                                    # no command
    ["sched", "--"],                                              # empty command
    ["", "--", "true"],                                           # bad name
    ["x" * 254, "--", "true"],                                    # name too long
    ["sched", "--ttl-s", "1", "--grace-s", "5", "--", "true"],    # grace > TTL allows
])
def test_usage_errors_exit_64(url: str, args: list[str]) -> None:
    assert main(["elect", "--backend", url, *args]) == EXIT_USAGE


def test_a_waiting_candidate_takes_over_when_the_leader_s_command_ends(
    url: str, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    first, second = tmp_path / "a", tmp_path / "b"
    r1 = elector(url, "svc", "--ttl-s", "5", *child(first, "--until", str(go), "--max-s", "50"))
    r2 = None
    try:
        poll_until(lambda: lines(first), 30)
        r2 = elector(url, "svc", "--ttl-s", "5", "--wait-s", "40",
                     *child(second, "--max-s", "0"))
        poll_until(lambda: leader_owner(url, "svc") is not None, 30)
        assert r2.poll() is None and not lines(second)  # waits: one leader at a time
    finally:
        go.touch()
    _, err1 = r1.communicate(timeout=45)
    assert r1.returncode == 0, err1
    assert r2 is not None
    _, err2 = r2.communicate(timeout=45)
    assert r2.returncode == 0, err2
    assert int(started(second)["token"]) > int(started(first)["token"])
    assert float(started(second)["wall"]) > last_beat(first)


def test_a_paused_leader_s_command_is_dead_before_the_next_leader_s_starts(
    url: str, tmp_path: Path
) -> None:
    c1, c2 = tmp_path / "c1", tmp_path / "c2"
    r1 = elector(url, "svc", "--ttl-s", "2", *child(c1, "--ignore-term", "--max-s", "50"))
    r2 = None
    try:
        poll_until(lambda: lines(c1), 30)
        r2 = elector(url, "svc", "--ttl-s", "2", "--wait-s", "40",
                     *child(c2, "--max-s", "0", "--check-dead", str(c1)))
        os.kill(r1.pid, signal.SIGSTOP)
        _, err2 = r2.communicate(timeout=50)
        assert r2.returncode == 0, err2
    finally:
        os.kill(r1.pid, signal.SIGCONT)
        if r2 is not None and r2.poll() is None:
            r2.kill()
    _, err1 = r1.communicate(timeout=30)
    assert r1.returncode == EXIT_LEASE_LOST, err1
    assert "leadership of 'svc'" in err1 and "lost" in err1
    second = started(c2)
    assert last_beat(c1) < float(second["wall"])
    peers = {w[1]: w[2] for w in lines(c2) if w[0] == "peer"}
    assert set(peers.values()) <= {"gone", "Z"}, peers
    assert int(second["token"]) > int(started(c1)["token"])


def test_sigterm_to_the_leader_stops_the_command_and_resigns(
    url: str, tmp_path: Path
) -> None:
    out = tmp_path / "c"
    r = elector(url, "svc", "--ttl-s", "10", *child(out, "--max-s", "50"))
    poll_until(lambda: lines(out), 30)
    r.send_signal(signal.SIGTERM)
    _, err = r.communicate(timeout=30)
    assert r.returncode == 128 + signal.SIGTERM, err
    assert leader_owner(url, "svc") is None
    assert lines(out)[-1][0] != "end"
