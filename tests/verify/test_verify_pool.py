"""The worker pool with a run's worth of jobs, and a run stopped by a signal.

* a worker's config (the whole job list) goes in a file, not on its command line: a
  20,000-job run starts workers (the kernel refuses a single argument over 128 KiB);
* SIGTERM or SIGINT on ``consensus-lease verify`` while the nemesis holds a worker
  stopped: the run thaws and ends every worker it started before it exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from consensus_lease.verify.destination import open_destination
from consensus_lease.verify.history import read_parts
from consensus_lease.verify.pool import WorkerPool, process_state
from consensus_lease.verify.worker import WorkerConfig

ARG_LIMIT = 131_072
"""Linux's MAX_ARG_STRLEN: the longest single command-line argument."""


def test_a_twenty_thousand_job_config_starts_workers(tmp_path: Path) -> None:
    jobs = [f"v1-abcdef-j{i:05d}" for i in range(20_000)]
    open_destination(str(tmp_path / "destination.db")).close()  # the verifier creates it
    template = WorkerConfig(name="", store_url=f"sqlite:///{tmp_path / 'store.db'}",
                            destination=str(tmp_path / "destination.db"), jobs=jobs,
                            history_path="", seed=3,
                            stop_at=time.time())  # starts, sees the time is up, exits
    assert len(template.to_json()) > 3 * ARG_LIMIT
    (tmp_path / "parts").mkdir()
    (tmp_path / "logs").mkdir()
    pool = WorkerPool(template, slots=2, parts_dir=tmp_path / "parts", logs_dir=tmp_path / "logs")
    pool.start_all()
    handles = [pool.handle(slot) for slot in range(2)]
    try:
        for handle in handles:
            assert handle is not None
            args = handle.proc.args
            assert isinstance(args, list)
            assert max(len(str(a)) for a in args) < 4096  # the config is not in argv
            assert handle.proc.wait(timeout=120) == 0, handle.log_path.read_text()
            sent = WorkerConfig.from_json(Path(args[-1]).read_text(encoding="utf-8"))
            assert sent.jobs == jobs and sent.name == handle.name
    finally:
        pool.stop_all(timeout_s=5)
    ops = read_parts(pool.part_files())
    assert {o.process for o in ops if o.op == "worker_start"} == {"w0", "w1"}
    assert all(o.detail["completed_seen"] == 0 for o in ops if o.op == "worker_exit")


def _children(pid: int) -> set[int]:
    """Processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.add(int(entry.name))
    return found


def _is_worker(pid: int) -> bool:
    try:
        return b"consensus_lease.verify.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _live(pid: int) -> bool:
    """Still there and not a zombie (an exited child not yet reaped)."""
    return process_state(pid) not in (None, "Z", "X")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_run_thaws_and_ends_every_worker(tmp_path: Path, signum: int) -> None:
    """The nemesis holds a worker stopped (SIGSTOP for 1.5-3 TTL, TTL 2 s); the verifier
    gets ``signum``. Before this, SIGTERM ended the verifier at once: its workers (own
    session, long ``stop_at``) lived on, the paused one stopped for good."""
    verifier = subprocess.Popen(
        [sys.executable, "-m", "consensus_lease.verify", "--workers", "3", "--jobs", "400",
         "--steps", "3", "--ttl-s", "2", "--duration-s", "120", "--quiet-s", "5",
         "--faults", "pause", "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        stopped: set[int] = set()
        while not stopped and time.monotonic() < deadline and verifier.poll() is None:
            workers |= {p for p in _children(verifier.pid) if _is_worker(p)}
            stopped = {p for p in workers if process_state(p) in ("T", "t")}
            time.sleep(0.01)  # poll interval of a deadline loop
        assert stopped, f"no worker was seen stopped (verifier exit {verifier.poll()})"
        verifier.send_signal(signum)
        out, _ = verifier.communicate(timeout=90)
        deadline = time.monotonic() + 30
        while any(_live(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)  # poll interval of a deadline loop
        left = {p: process_state(p) for p in workers if _live(p)}
        assert not left, f"workers left behind (pid: state): {left}\n{out}"
        assert verifier.returncode == 128 + signum, out
        assert f"interrupted by {signal.Signals(signum).name}" in out, out
    finally:
        if verifier.poll() is None:
            verifier.kill()
            verifier.wait(timeout=30)
        for pid in workers:  # what the run before this fix left: ours to end
            if _live(pid) and _is_worker(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_worker_retries_opening_an_unavailable_store(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A replacement worker can start while a member is down (or the machine is
    overloaded): opening the store is retried (bounded) instead of crashing the worker
    — which made a whole etcd run INCONCLUSIVE."""
    from consensus_lease.errors import BackendUnavailable
    from consensus_lease.verify import worker as worker_module

    real_open, calls = worker_module.open_store, []

    def flaky_open(url: str, **options: object) -> object:
        calls.append(url)
        if len(calls) <= 2:
            raise BackendUnavailable("no answer after 4 attempt(s)")
        return real_open(url, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(worker_module, "open_store", flaky_open)
    open_destination(str(tmp_path / "destination.db")).close()
    config = WorkerConfig(name="w0", store_url=f"sqlite:///{tmp_path / 'store.db'}",
                          destination=str(tmp_path / "destination.db"), jobs=["j"],
                          history_path=str(tmp_path / "w0.jsonl"), stop_at=time.time())
    worker = worker_module.Worker(config)
    assert worker.run() == 0 and len(calls) == 3
    opens = [o.outcome for o in read_parts([tmp_path / "w0.jsonl"]) if o.op == "open_store"]
    assert opens == ["unavailable", "unavailable", "ok"]

    calls.clear()
    config.open_timeout_s, config.history_path = 0.0, str(tmp_path / "w1.jsonl")
    with pytest.raises(BackendUnavailable):
        worker_module.Worker(config)
    assert len(calls) == 1
