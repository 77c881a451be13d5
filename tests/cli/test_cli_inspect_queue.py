"""``consensus-lease inspect --queue Q --state S`` on the SQLite store: bounded by
``--limit`` (jobs read from the queue and listed), with the queue's counts in full and a
line saying how many jobs were not listed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from consensus_lease import open_store
from consensus_lease.backends.sqlite import SqliteBackend
from consensus_lease.cli import main
from consensus_lease.record import EnqueueItem

DEPTH = 40
FAILED = 3


@pytest.fixture()
def url(tmp_path: Path) -> str:
    """A queue ``deep`` of DEPTH jobs: FAILED dead letters first, the rest available."""
    url = f"sqlite:///{tmp_path}/leases.db"
    with open_store(url) as store:
        store.enqueue_many("deep", [EnqueueItem(f"job-{i:03d}", b"p", max_attempts=1)
                                    for i in range(DEPTH)])
        with store.session("worker") as session:
            for i in range(FAILED):
                lease = session.claim(f"job-{i:03d}")
                assert lease is not None
                lease.fail("boom", retry_in_s=0)
    return url


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """The ``limit`` of every ``queue_jobs`` read the command makes."""
    seen: list[int | None] = []
    original = SqliteBackend.queue_jobs

    def spy(self: SqliteBackend, queue: str, limit: int | None = None) -> Any:
        seen.append(limit)
        return original(self, queue, limit)

    monkeypatch.setattr(SqliteBackend, "queue_jobs", spy)
    return seen


def test_listing_a_queue_reads_at_most_limit_jobs_and_says_what_is_left(
    url: str, reads: list[int | None], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["inspect", "--backend", url, "--queue", "deep", "--state", "available",
                 "--limit", "10"]) == 0
    out = capsys.readouterr().out
    assert reads == [10]
    counts = next(line for line in out.splitlines() if "deep" in line and "│" in line)
    # queue, available, held, completed, failed: in full, not only what was read
    assert [c.strip() for c in counts.split("│")[1:6]] == [
        "deep", str(DEPTH - FAILED), "0", "0", str(FAILED)]
    listed = [line for line in out.splitlines() if "job-" in line and "│" in line]
    assert len(listed) == 10 - FAILED  # the oldest 10 read, FAILED of them not available
    assert all("available" in line for line in listed)
    left = DEPTH - FAILED - len(listed)
    assert f"{left} more available job(s) of queue 'deep' not listed" in " ".join(out.split())


def test_json_stays_one_array_and_the_note_goes_to_stderr(
    url: str, reads: list[int | None], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["inspect", "--backend", url, "--json", "--queue", "deep", "--state",
                 "failed", "--state", "available", "--limit", "5"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [r["job_id"] for r in rows] == [f"job-{i:03d}" for i in range(5)]
    assert {r["queue"] for r in rows} == {"deep"}
    assert reads == [5]
    assert captured.err.strip() == (
        f"{DEPTH - 5} more failed/available job(s) of queue 'deep' not listed (only its "
        "oldest 5 jobs were read; --limit 5: raise it to see more)")


def test_everything_listed_says_nothing_more(
    url: str, reads: list[int | None], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["inspect", "--backend", url, "--json", "--queue", "deep", "--state",
                 "failed"]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)) == FAILED and captured.err == ""
    assert reads == [1000]  # the default --limit


def test_job_ids_with_a_queue_are_refused(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """JOB ids and --queue ask two different questions: refused (usage error), rather
    than the ids being ignored."""
    assert main(["inspect", "--backend", url, "--queue", "deep", "--state", "failed",
                 "job-000"]) == 2
    assert "not both" in capsys.readouterr().err


def test_a_queue_named_twice_is_shown_once(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--backend", url, "--queue", "deep", "--queue", "deep",
                 "--state", "failed", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(r["job_id"] for r in listed) == [f"job-{i:03d}" for i in range(FAILED)]
