"""W10 (queue drain, :mod:`consensus_lease.bench.drain`): every job done exactly once,
the shape of its results, the fencing check, and peers that are not installed.

No timing is asserted: the numbers of a 50-job drain mean nothing.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from consensus_lease.bench import drainpeers, drainreport
from consensus_lease.bench.clusters import sqlite_target
from consensus_lease.bench.config import SMOKE, Target
from consensus_lease.bench.drain import _sides, w10_drain

TINY = dataclasses.replace(SMOKE, w10_jobs=50, w10_rounds=2, w10_wake_samples=2,
                           w10_wake_gap_s=0.02)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SUMMARY_KEYS = {"jobs_s", "enqueue_jobs_s", "client_cpu_us_per_job", "exactly_once",
                "duplicates", "missing"}


@pytest.mark.slow
def test_w10_on_sqlite_drains_every_job_exactly_once(tmp_path: Path) -> None:
    data = w10_drain(sqlite_target(str(tmp_path)), TINY, "t10")
    names = [s["name"] for s in data["sides"]]
    assert names[0] == "ours, 1 worker" and "ours, 2 processes" in names
    assert "raw client, 1 worker" in names
    assert not any(s["side"] in drainpeers.PEERS for s in data["sides"])  # PostgreSQL only
    for side in data["sides"]:
        assert side["summary"].keys() >= SUMMARY_KEYS, side["name"]
        assert side["summary"]["exactly_once"] is True, side["rounds"]
        assert len(side["rounds"]) == TINY.w10_rounds
        for r in side["rounds"]:
            assert r["handled"] == r["distinct"] == TINY.w10_jobs
        assert "server_cpu_us_per_job" not in side["summary"]  # no server on SQLite
    wake = data["sides"][0]["wake"]
    assert wake["samples"] == TINY.w10_wake_samples and wake["p99_ms"] >= wake["p50_ms"]
    fence = data["fencing"]["ours"]
    assert fence["taken_over"] and fence["store_kept_new_holder"]
    assert fence["fenced"] and fence["late_completion"].startswith("refused")

    results = {"backends": {"sqlite": {"workloads": {"w10_drain": {**data, "status": "ok"}}}}}
    table = "\n".join(drainreport.section(results))
    assert "| " + " | ".join(drainreport.HEADER) + " |" in table
    assert table.count("| sqlite |") == len(names)
    assert "| the store (" in table and "n/a: no expiry" in table
    assert drainreport.plot(results, tmp_path / drainreport.PLOT)
    assert (tmp_path / drainreport.PLOT).read_bytes()[:8] == PNG_MAGIC


def test_missing_peers_are_reported_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("pgqueuer", "procrastinate"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    versions = drainpeers.peer_versions()
    assert versions == {"pgqueuer": None, "procrastinate": None}
    target = Target("postgresql", url="postgresql://h/db", raw={"conninfo": "x", "table": "t"})
    assert {s["side"] for s in _sides(target, versions)} == {"ours", "raw-postgresql"}
    data = {"status": "ok", "peers": versions, "server_measured": True, "fencing": {},
            "raw_loop": True, "sides": []}
    lines = drainreport.section({"backends": {"postgresql": {"workloads": {"w10_drain": data}}}})
    assert any("not installed, so not measured: pgqueuer, procrastinate" in x for x in lines)


def test_installed_peers_run_on_postgresql_only() -> None:
    versions: dict[str, str | None] = {"pgqueuer": "1.6.0", "procrastinate": "3.10.0"}
    pg = Target("postgresql", url="postgresql://h/db", raw={"conninfo": "x", "table": "t"})
    kinds = [s["side"] for s in _sides(pg, versions)]
    assert kinds.count("pgqueuer") == kinds.count("procrastinate") == 2
    etcd = [s["side"] for s in _sides(Target("etcd", url="etcd://h:1/p"), versions)]
    assert set(etcd) == {"ours", "raw-etcd"}  # no peer on etcd


def test_ours_throughput_sides_run_the_batched_knobs() -> None:
    """One worker and two processes with prefetch + claim_next_many + complete_batch."""
    sqlite = Target("sqlite", url="sqlite:////tmp/x.db", raw={})
    batched = [s for s in _sides(sqlite, {}) if s.get("knobs")]
    assert [s["processes"] for s in batched] == [1, 2]
    for side in batched:
        assert side["knobs"]["prefetch"] >= 2 * 50 and side["knobs"]["complete_batch"] >= 50


def test_workload_names_w1_and_w10_are_distinct() -> None:
    from consensus_lease.bench.command import _workloads

    assert _workloads("w1,w10") == ("w1_throughput", "w10_drain")
    assert _workloads("w10") == ("w10_drain",)
