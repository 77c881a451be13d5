"""The worker pool with a run's worth of jobs: a worker's config (the whole job list)
goes in a file, not on its command line, so a 20,000-job run starts workers (the kernel
refuses a single argument over 128 KiB)."""

from __future__ import annotations

import time
from pathlib import Path

from consensus_lease.verify.destination import open_destination
from consensus_lease.verify.history import read_parts
from consensus_lease.verify.pool import WorkerPool
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
