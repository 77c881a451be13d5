"""``consensus-lease worker`` as a process: graceful stop on SIGTERM/SIGINT within the
grace period, exit statuses, settings from the environment."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from worker_kit import wait_for

from consensus_lease import JobState, open_store

MARGIN_S = 10.0
"""Slack for a busy 2-core machine on top of what the worker promises."""


def _enqueue(url: str, *jobs: str) -> None:
    with open_store(url) as store:
        for job in jobs:
            store.enqueue("q", job, b"")


def _record(url: str, job: str) -> Any:
    with open_store(url) as store:
        return store.get(job)


@pytest.mark.slow
@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_sigterm_lets_the_job_in_flight_finish(tmp_path: Path, worker_command: Any,
                                               processes: bool) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    _enqueue(url, "slow", "next")
    grace_s = 20.0
    worker = worker_command(
        "--backend", url, "--queue", "q", "--ttl-s", "2", "--grace-s", str(grace_s),
        *(["--processes", "--concurrency", "2"] if processes else []),
        "worker_handlers:wait_for_go")
    started = wait_for(lambda: sorted(tmp_path.glob("started-*")), 60, "a job started")
    job = started[0].name.removeprefix("started-")
    worker.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    # The stop is under way (the worker says so) before the handler may finish.
    wait_for(lambda: "reason=SIGTERM" in worker.log(), 30, "the worker noticed SIGTERM")
    (tmp_path / "go").touch()
    status = worker.wait(timeout_s=grace_s + MARGIN_S)
    assert time.monotonic() - signalled < grace_s + MARGIN_S
    assert status == 0, worker.log()[-3000:]
    record = _record(url, job)
    assert record.state is JobState.COMPLETED and record.result == b"finished"
    summary = worker.summary()
    assert summary["stopped_by"] == "SIGTERM" and summary["errors"] == "0"
    if not processes:  # one slot: the other job was never claimed after the stop
        other = _record(url, "next" if job == "slow" else "slow")
        assert other.state is JobState.AVAILABLE and other.attempt == 0


@pytest.mark.slow
def test_sigint_releases_what_outlives_the_grace_period(tmp_path: Path,
                                                        worker_command: Any) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    _enqueue(url, "stuck")
    grace_s = 1.0
    worker = worker_command("--backend", url, "--queue", "q", "--ttl-s", "30",
                            "--grace-s", str(grace_s), "worker_handlers:wait_for_go")
    wait_for((tmp_path / "started-stuck").exists, 60, "the job started")
    worker.proc.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    status = worker.wait(timeout_s=grace_s + MARGIN_S)
    elapsed = time.monotonic() - signalled
    assert status == 130, worker.log()[-3000:]
    assert grace_s * 0.9 <= elapsed < grace_s + MARGIN_S
    # Released (claimable at once), not completed, and not left to the 30 s TTL.
    record = _record(url, "stuck")
    assert record.state is JobState.AVAILABLE, record
    summary = worker.summary()
    assert summary["released"] == "1" and summary["completed"] == "0"


def test_unimportable_handler_exits_1(tmp_path: Path, worker_command: Any) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    worker = worker_command("--backend", url, "--queue", "q", "no_such_module:handler")
    assert worker.wait(timeout_s=60) == 1
    assert "cannot import" in worker.output()


@pytest.mark.parametrize(("source", "raised"), [
    ('raise RuntimeError("boom")\n', "RuntimeError: boom"),
    ("def handler(:\n", "SyntaxError: "),
], ids=["raises", "syntax"])
def test_a_handler_module_that_fails_as_it_is_imported_exits_1_with_one_error(
        tmp_path: Path, worker_command: Any, source: str, raised: str) -> None:
    """As a module that is not found: one error naming the module and what its import
    raised (type and message), no traceback, the exit status of a bad handler."""
    (tmp_path / "failing_handler.py").write_text(source)
    url = f"sqlite:///{tmp_path}/store.db"
    worker = worker_command("--backend", url, "--queue", "q", "failing_handler:handler")
    assert worker.wait(timeout_s=60) == 1
    output = worker.output()
    assert ("cannot import the handler's module 'failing_handler': importing it raised "
            f"{raised}") in output, output
    assert "Traceback" not in worker.log(), worker.log()


def test_settings_come_from_the_environment(tmp_path: Path, worker_command: Any) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    _enqueue(url, "a", "b")
    worker = worker_command(env={
        "CONSENSUS_LEASE_URL": url, "CONSENSUS_LEASE_QUEUE": "q",
        "CONSENSUS_LEASE_HANDLER": "worker_handlers:fenced_steps",
        "CONSENSUS_LEASE_UNTIL_EMPTY": "yes", "CONSENSUS_LEASE_CONCURRENCY": "2",
        "CONSENSUS_LEASE_TTL_S": "5"})
    assert worker.wait(timeout_s=60) == 0, worker.log()[-3000:]
    assert worker.summary()["completed"] == "2"
    assert _record(url, "a").state is JobState.COMPLETED


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--backend", "memory://", "x:y"], {}, "--queue (or CONSENSUS_LEASE_QUEUE)"),
    (["--backend", "memory://", "--queue", "q", "x:y"], {"CONSENSUS_LEASE_TTL_S": "-1"},
     "CONSENSUS_LEASE_TTL_S"),
    (["--backend", "memory://", "--queue", "q", "x:y"],
     {"CONSENSUS_LEASE_PROCESSES": "maybe"}, "not a boolean"),
    # Ranges that run_worker checks (it used to exit 1 for them; the flag is named).
    (["--backend", "memory://", "--queue", "q", "--concurrency", "2000", "x:y"], {},
     "argument --concurrency: concurrency must be an int from 1 to 1024"),
])
def test_bad_settings_exit_2(tmp_path: Path, worker_command: Any, args: list[str],
                             env: dict[str, str], message: str) -> None:
    worker = worker_command(*args, env=env)
    assert worker.wait(timeout_s=60) == 2
    assert message in worker.output() + worker.log()  # argparse's own errors: stderr


def test_bad_flag_exits_2(tmp_path: Path, worker_command: Any) -> None:
    worker = worker_command("--backend", "memory://", "--queue", "q", "--concurrency", "0",
                            "x:y")
    assert worker.wait(timeout_s=60) == 2
    assert "must be >= 1" in worker.log()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:  # a port nobody serves now, on loopback only
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_metrics_port_serves_the_workers_metrics(tmp_path: Path, worker_command: Any) -> None:
    """--metrics-port: the store's counters on http://127.0.0.1:PORT/metrics, at 0 before
    the first event and counting claims once a job runs."""
    import urllib.request

    pytest.importorskip("prometheus_client")  # the [metrics] extra (installed for tests)
    url = f"sqlite:///{tmp_path}/store.db"
    _enqueue(url, "job")
    port = _free_port()
    worker = worker_command("--backend", url, "--queue", "q", "--metrics-port", str(port),
                            "worker_handlers:wait_for_go")

    def scrape() -> str | None:
        try:
            direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with direct.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            return None  # not serving yet

    wait_for(lambda: sorted(tmp_path.glob("started-*")), 60, "the job started")
    text = wait_for(scrape, 60, "the metrics endpoint answered")
    assert 'consensus_lease_claims_total{store="sqlite"} 1.0' in text, text[:2000]
    assert 'consensus_lease_losses_total{scope="lease",store="sqlite"} 0.0' in text
    (tmp_path / "go").touch()
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(timeout_s=60) == 0, worker.log()[-3000:]


def test_metrics_port_refused_with_processes(tmp_path: Path, worker_command: Any) -> None:
    worker = worker_command("--backend", f"sqlite:///{tmp_path}/s.db", "--queue", "q",
                            "--processes", "--metrics-port", "9", "x:y")
    assert worker.wait(timeout_s=60) == 2
    assert "--metrics-port" in worker.output()


@pytest.mark.parametrize("processes", [
    pytest.param(False, id="threads"),
    pytest.param(True, id="processes", marks=pytest.mark.slow),  # spawns 2 interpreters
])
def test_prefetch_and_batched_completion_from_the_command(tmp_path: Path, worker_command: Any,
                                                          processes: bool) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    jobs = [f"job-{i}" for i in range(40)]
    _enqueue(url, *jobs)
    worker = worker_command(
        "--backend", url, "--queue", "q", "--until-empty", "--claim-wait-s", "0.1",
        "--concurrency", "2", *(["--processes"] if processes else []),
        "--prefetch", "2", "--complete-batch", "8", "--complete-flush-s", "0.5",
        "worker_handlers:fenced_steps")
    assert worker.wait(timeout_s=60) == 0, worker.log()[-3000:]
    summary = worker.summary()
    assert summary["completed"] == summary["batched_completions"] == "40", summary
    assert 0 < int(summary["complete_batches"]) < 40, summary
    assert summary["errors"] == summary["leases_lost"] == "0", summary
    assert all(_record(url, job).state is JobState.COMPLETED for job in jobs)


@pytest.mark.parametrize("text", ["-1", "0", "nan"])
def test_a_ttl_flag_names_its_own_range(text: str) -> None:
    # --ttl-s refuses 0 too, so its message says "> 0" (it said ">= 0" for -1).
    from consensus_lease.errors import InvalidArgument
    from consensus_lease.worker.config import parse_positive_seconds

    with pytest.raises(InvalidArgument, match="> 0 of seconds"):
        parse_positive_seconds(text)
