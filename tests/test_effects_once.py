"""Effects once per job across a takeover, with real worker processes (SQLite store and
SqliteFence): a holder SIGKILLed after 2 of 3 once-per-job effects, and a holder paused
(SIGSTOP) mid-job whose late apply arrives after the takeover."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from consensus_lease import FenceOutcome, FenceRejected, SqliteFence, open_store

TTL_S = 1.0
STEPS = ("step-1", "step-2", "step-3")

HOLDER = textwrap.dedent("""
    import sys
    from consensus_lease import FenceRejected, SqliteFence, open_store
    store_url, fence_path, job, done = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    fence = SqliteFence(fence_path)
    store = open_store(store_url)
    session = store.session("old-holder", ttl_s=float(sys.argv[5]))
    lease = session.claim(job)
    for step in ("step-1", "step-2", "step-3")[:done]:
        lease.ensure_held()
        fence.apply(job, lease.generation, step, once_per_job=True)
    print("applied", lease.generation, flush=True)
    sys.stdin.readline()          # held here by the test (killed, or paused then resumed)
    try:
        fence.apply(job, lease.generation, "step-3", once_per_job=True)
        print("late-apply accepted", flush=True)
    except FenceRejected:
        print("late-apply rejected", flush=True)
""")


@pytest.fixture
def paths(tmp_path: Path) -> Iterator[tuple[str, str]]:
    yield f"sqlite:///{tmp_path / 'leases.db'}", str(tmp_path / "effects.db")


def start_holder(store_url: str, fence_path: str, job: str, done: int) -> tuple[
        subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, store_url, fence_path, job, str(done), str(TTL_S)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()  # blocks until the holder applied its steps
    assert line[:1] == ["applied"], proc.stderr.read() if proc.stderr else line
    return proc, int(line[1])


def resume(store_url: str, fence: SqliteFence, job: str, old_token: int) -> list[FenceOutcome]:
    """The next holder: waits for the store to expire the old one, then applies all steps."""
    with open_store(store_url) as store, store.session("next-holder", ttl_s=10.0) as session:
        lease = session.claim(job, wait_s=30.0)
        assert lease.generation > old_token
        outcomes = []
        for step in STEPS:
            lease.ensure_held()
            outcomes.append(fence.apply(job, lease.generation, step, once_per_job=True))
        lease.complete(b"done")
        return outcomes


def test_next_holder_applies_only_what_the_killed_one_did_not(
    paths: tuple[str, str],
) -> None:
    store_url, fence_path = paths
    proc, old_token = start_holder(store_url, fence_path, "invoice-1", done=2)
    proc.kill()
    proc.wait(timeout=30)
    fence = SqliteFence(fence_path)
    outcomes = resume(store_url, fence, "invoice-1", old_token)
    assert outcomes == [FenceOutcome.ALREADY_APPLIED, FenceOutcome.ALREADY_APPLIED,
                        FenceOutcome.ACCEPTED]
    applied = fence.applied("invoice-1")
    assert sorted(applied) == list(STEPS)
    assert [e.token for e in applied.values()] == [old_token, old_token, old_token + 1]
    assert len(fence.effects()) == 3  # each effect exactly once at the destination


def test_paused_holders_late_apply_is_rejected(paths: tuple[str, str]) -> None:
    store_url, fence_path = paths
    proc, old_token = start_holder(store_url, fence_path, "invoice-2", done=1)
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        fence = SqliteFence(fence_path)
        outcomes = resume(store_url, fence, "invoice-2", old_token)
        assert outcomes == [FenceOutcome.ALREADY_APPLIED, FenceOutcome.ACCEPTED,
                            FenceOutcome.ACCEPTED]
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=30)
    assert "late-apply rejected" in out, (out, err)
    assert len(fence.effects()) == 3
    with pytest.raises(FenceRejected):
        fence.apply("invoice-2", old_token, "step-4", once_per_job=True)
