"""W10 (queue drain, :mod:`consensus_lease.bench.drain`): every job done exactly once,
the shape of its results, the fencing check, and peers that are not installed.

No timing is asserted: the numbers of a 50-job drain mean nothing.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from consensus_lease.bench import drainpeers, drainreport
from consensus_lease.bench.clusters import sqlite_target
from consensus_lease.bench.config import SMOKE, Target
from consensus_lease.bench.drain import _sides, w10_drain
from consensus_lease.bench.goals import Goal, evaluate

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
    sides = _sides(pg, versions)
    kinds = [s["side"] for s in sides]
    assert kinds.count("pgqueuer") == 3 and kinds.count("procrastinate") == 2
    pgq = [(s["processes"], s["batch_size"], s["name"]) for s in sides
           if s["side"] == "pgqueuer"]
    assert pgq == [(1, 1, "pgqueuer, 1 process, batch_size=1"),
                   (1, 100, "pgqueuer, 1 process, batch_size=100"),
                   (2, 100, "pgqueuer, 2 processes, batch_size=100")]
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


# -- W10's goals, from synthetic results ----------------------------------------------

KNOBS = {"prefetch": 200, "complete_batch": 100, "complete_flush_s": 0.05}


def fake_side(name: str, kind: str, jobs_s: float, processes: int = 1,
              **extra: Any) -> dict[str, Any]:
    """A W10 side of a results.json: ``jobs_s`` in each of 3 rounds and as the median."""
    return {"name": name, "side": kind, "processes": processes,
            "knobs": extra.pop("knobs", {}), **extra,
            "summary": {"jobs_s": {"n": 3, "median": jobs_s, "min": jobs_s, "max": jobs_s,
                                   "p25": jobs_s, "p75": jobs_s}, "exactly_once": True},
            "rounds": [{"jobs_s": jobs_s}] * 3}


def pg_sides(ours_fast: float = 6000.0, ours_seq: float = 1500.0, pgq_two: float = 4500.0,
             pgq_one: float = 700.0, raw: float = 1600.0,
             wake_p99: float = 4.0) -> list[dict[str, Any]]:
    return [
        fake_side("ours, 1 worker", "ours", ours_seq,
                  wake={"samples": 50, "p50_ms": 1.0, "p99_ms": wake_p99, "max_ms": 9.0}),
        fake_side("ours, 1 worker, knobs", "ours", ours_fast, knobs=KNOBS),
        fake_side("ours, 2 processes, knobs", "ours", ours_fast * 0.9, 2, knobs=KNOBS),
        fake_side("raw client, 1 worker", "raw-postgresql", raw),
        fake_side("pgqueuer, 1 process, batch_size=1", "pgqueuer", pgq_one, batch_size=1),
        fake_side("pgqueuer, 2 processes, batch_size=100", "pgqueuer", pgq_two, 2,
                  batch_size=100),
    ]


def w10_goals(backend: str, sides: list[dict[str, Any]], **data: Any) -> dict[str, Goal]:
    w10 = {"status": "ok", "sides": sides, "raw_loop": True, "fencing": {},
           "peers": {"pgqueuer": "1.6.0", "procrastinate": None}, **data}
    goals = evaluate({"backends": {backend: {"available": True,
                                             "workloads": {"w10_drain": w10}}}})
    assert all(g.workload == "W10" for g in goals)
    return {g.goal: g for g in goals}


VS_PGQ = "throughput setting, 1 worker, vs pgqueuer batch_size=100, 2 processes"
SEQUENTIAL = "1 worker, no knobs (sequential), vs pgqueuer batch_size=1, 1 process"
VS_RAW = "throughput setting vs the raw client's two-request loop, 1 worker"
WAKE = "idle wake-up, ours 1 worker"


def test_w10_goals_pass_on_postgresql() -> None:
    goals = w10_goals("postgresql", pg_sides())
    assert set(goals) == {VS_PGQ, SEQUENTIAL, VS_RAW, WAKE}
    assert {g.status for g in goals.values()} == {"pass"}
    assert goals[VS_PGQ].measured.startswith("1.33x [1.33-1.33] (6,000 vs 4,500 jobs/s)")
    assert "aim 1.5x: not yet" in goals[VS_PGQ].note
    assert "with 2 processes (sharing the cores with the server) 1.20x" in goals[VS_PGQ].note
    assert goals[SEQUENTIAL].measured.startswith("2.14x")
    assert goals[VS_RAW].measured.startswith("3.75x") and "prefetch=200" in goals[VS_RAW].note
    assert goals[WAKE].measured == "p99 4.0 ms (median 1.0 ms, 50 samples)"


def test_w10_goals_miss_with_what_was_measured() -> None:
    goals = w10_goals("postgresql", pg_sides(ours_fast=3000.0, ours_seq=1000.0,
                                             wake_p99=25.0))
    for name in (VS_PGQ, SEQUENTIAL, VS_RAW, WAKE):
        assert goals[name].status == "miss", name
    assert goals[VS_PGQ].measured.startswith("0.67x (3,000 vs 4,500 jobs/s)") or \
        goals[VS_PGQ].measured.startswith("0.67x [")
    assert goals[WAKE].measured.startswith("p99 25.0 ms")


def test_w10_ratio_straddling_its_target_is_noted_and_aim_reached() -> None:
    sides = pg_sides(ours_fast=7000.0)  # 1.56x pgqueuer's 2 processes: the aim reached
    sides[1]["rounds"] = [{"jobs_s": 3000.0}, {"jobs_s": 4000.0}, {"jobs_s": 7000.0}]
    goal = w10_goals("postgresql", sides)[VS_PGQ]
    assert goal.status == "pass" and "aim 1.5x: reached" in goal.note
    assert "the middle half of the rounds' ratios straddles the target" in goal.note


def test_w10_goals_of_missing_sides_are_not_run() -> None:
    sides = [s for s in pg_sides() if s["side"] != "pgqueuer" and not s["knobs"]]
    goals = w10_goals("postgresql", sides, peers={"pgqueuer": None})
    assert goals[VS_PGQ].status == goals[SEQUENTIAL].status == "not run"
    assert goals[VS_PGQ].note == "pgqueuer is not installed"
    assert goals[VS_RAW].status == "not run"
    assert goals[VS_RAW].note == "not in this run: ours, 1 worker, throughput setting"
    assert goals[WAKE].status == "pass"
    # pgqueuer installed, but a run from before the batch_size=1 side
    old = [s for s in pg_sides() if s.get("batch_size") != 1]
    goal = w10_goals("postgresql", old)[SEQUENTIAL]
    assert goal.status == "not run" and goal.note == (
        "not in this run: pgqueuer, 1 process, batch_size=1")
    # no wake-up measured
    for side in old:
        side.pop("wake", None)
    assert w10_goals("postgresql", old)[WAKE].status == "not run"


def test_w10_goals_on_other_stores_compare_with_the_raw_loop_only() -> None:
    sides = [fake_side("ours, 1 worker", "ours", 100.0, wake={"samples": 3, "p50_ms": 5.0,
                                                               "p99_ms": 9.0}),
             fake_side("ours, 1 worker, knobs", "ours", 900.0, knobs=KNOBS),
             fake_side("raw client, 1 worker", "raw-etcd", 300.0)]
    goals = w10_goals("etcd", sides)
    assert set(goals) == {VS_RAW, WAKE}
    assert goals[VS_RAW].status == "pass" and goals[VS_RAW].measured.startswith("3.00x")
    assert "too few to tell a miss" in goals[WAKE].note  # 3 samples: a smoke run
    no_loop = w10_goals("memory", sides[:2], raw_loop=False)
    assert no_loop[VS_RAW].status == "n/a"


def test_w10_goals_of_the_committed_postgresql_run() -> None:
    """The committed W10 run (no batch_size=1 side then) evaluated anew, as --replot does."""
    path = Path(__file__).parents[1] / "benchmarks/results/w10/postgresql/results.json"
    results = json.loads(path.read_text())
    goals = {g.goal: g for g in evaluate(results) if g.workload == "W10"}
    assert set(goals) == {VS_PGQ, SEQUENTIAL, VS_RAW, WAKE}
    assert goals[SEQUENTIAL].status == "not run"
    assert {goals[n].status for n in (VS_PGQ, VS_RAW, WAKE)} <= {"pass", "miss"}
