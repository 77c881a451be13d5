"""``consensus-lease worker`` with 4 worker processes on SQLite, under a SIGKILL and a
SIGSTOP past the TTL: every job completed once, every effect applied once per
(job, step), no stale write accepted."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from worker_handlers import STEPS
from worker_kit import wait_for

from consensus_lease import JobState, LeaseStore, SqliteFence, open_store

JOBS = 200
TTL_S = 2.0


def _owner_pid(owner: str | None) -> int | None:
    """``host:pid:random`` -> pid."""
    if owner is None or owner.count(":") < 2:
        return None
    return int(owner.rsplit(":", 2)[1])


def _held_by_child(store: LeaseStore, parent_pid: int, avoid: set[int]) -> int | None:
    for job in store.queue_jobs("q"):
        pid = _owner_pid(job.record.owner)
        if job.record.state is JobState.HELD and pid not in (None, parent_pid, *avoid):
            return pid
    return None


def _completed(store: LeaseStore) -> int:
    return store.queue_stats("q").completed


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_four_processes_survive_kill_and_pause(tmp_path: Path, worker_command: Any) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    with open_store(url) as store:
        for i in range(JOBS):
            store.enqueue("q", f"job-{i:03}", b"")
        fence = SqliteFence(str(tmp_path / "fence.db"))
        worker = worker_command(
            "--backend", url, "--queue", "q", "--concurrency", "4", "--processes",
            "--ttl-s", str(TTL_S), "--until-empty", "--grace-s", "5",
            "worker_handlers:fenced_steps")
        parent = worker.proc.pid

        # SIGKILL a worker process holding a job, once the run is well under way.
        wait_for(lambda: _completed(store) >= 20, 60, "20 jobs completed")
        killed = wait_for(lambda: _held_by_child(store, parent, set()), 30, "a held job")
        os.kill(killed, signal.SIGKILL)

        # SIGSTOP a worker right after its ensure_held(), until another worker has
        # taken its job over and written with a newer token; then let it go on.
        (tmp_path / "pause").touch()
        paused_file = tmp_path / "paused.json"
        wait_for(paused_file.exists, 30, "a worker paused itself")
        paused = json.loads(paused_file.read_text())
        assert paused["pid"] not in (killed, parent)
        wait_for(lambda: (fence.highest_token(paused["job"]) or 0) > paused["generation"],
                 10 * TTL_S + 20, "the paused worker's job taken over")
        os.kill(paused["pid"], signal.SIGCONT)

        status = worker.wait(timeout_s=90)
        summary = worker.summary()
        assert status == 0, worker.log()[-5000:]
        assert summary["restarts"] == "1" and summary["stopped_by"] == "drained"
        assert int(summary["leases_lost"]) >= 1  # the paused worker's (the killed one's
        assert int(summary["sessions_lost"]) >= 1  # counts died with it)

        # Every job completed exactly once: one completion record, by its last holder.
        records = {j.record.job_id: j.record for j in store.queue_jobs("q")}
        assert len(records) == JOBS
        for record in records.values():
            assert record.state is JobState.COMPLETED, record
            assert record.result == f"gen={record.generation}".encode(), record

        # Every effect exactly once per (job, step); tokens never go back; the paused
        # worker's late write is not among them.
        effects = [e for e in fence.effects() if e.effect_id.startswith("step-")]
        counts = Counter((e.resource, e.effect_id) for e in effects)
        expected = {(job, f"step-{k}") for job in records for k in range(1, STEPS + 1)}
        assert set(counts) == expected
        assert set(counts.values()) == {1}
        assert (paused["job"], paused["generation"], "step-2") not in {
            (e.resource, e.token, e.effect_id) for e in effects}
        for job, record in records.items():
            tokens = [e.token for e in fence.effects(job)]
            assert tokens == sorted(tokens) and tokens[-1] <= record.generation
        assert records[paused["job"]].generation > paused["generation"]
        fence.close()
