"""`consensus-lease bench`: the files it writes have the promised shape.

Speed is not checked here (goals are reported, not asserted). The run of every store
(SQLite included) starts its own etcd and ZooKeeper clusters through the container kit
on the bench's loopback slots, so it needs the Docker engine and images.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from consensus_lease.bench.config import BACKENDS, QUICK, SMOKE, Target
from consensus_lease.bench.depth import depths_for, w7_depth
from consensus_lease.bench.goals import evaluate
from consensus_lease.bench.plots import PLOTS
from consensus_lease.bench.runner import DEFAULT_WORKLOADS

# Runs the real CLI; registers the subcommand if cli.EXTRA_COMMANDS does not list it yet.
CLI = (
    "import sys; from consensus_lease import cli; m = 'consensus_lease.bench.command'; "
    "m in cli.EXTRA_COMMANDS or cli.EXTRA_COMMANDS.append(m); sys.exit(cli.main(sys.argv[1:]))"
)
GOAL_KEYS = {"backend", "workload", "goal", "target", "measured", "status", "note"}
STATUSES = {"pass", "miss", "n/a", "not run"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(out: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLI, "bench", "--smoke", "--out", str(out), *args],
        capture_output=True, text=True, timeout=timeout_s,
    )


def check_files(out: Path, backends: set[str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    assert {"schema", "meta", "backends", "goals"} <= data.keys()
    assert {"command", "machine", "sizes", "duration_s", "quick"} <= data["meta"].keys()
    assert data["meta"]["quick"] is True
    assert set(data["backends"]) == backends
    for goal in data["goals"]:
        assert set(goal) == GOAL_KEYS and goal["status"] in STATUSES
    markdown = (out / "results.md").read_text()
    assert "| backend | workload | goal | target | measured | result | note |" in markdown
    assert data["meta"]["command"] in markdown  # how to reproduce
    for name in PLOTS:  # a plot only for a workload some backend measured
        measured = any(
            load.get("status") == "ok" and load.get("peers", True)  # W6 without peers: nothing
            for load in (e["workloads"].get(Path(name).stem, {}) for e in data["backends"].values())
        )
        if measured:
            assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
            assert f"]({name})" in markdown
        else:
            assert not (out / name).exists(), name
            assert f"]({name})" not in markdown
    return data


def check_measured(data: dict[str, Any], backend: str) -> None:
    entry = data["backends"][backend]
    assert entry["available"] is True and entry["reason"] is None
    loads = entry["workloads"]
    assert set(loads) == set(DEFAULT_WORKLOADS)  # W9 runs only when asked for
    for key, result in loads.items():
        assert result["status"] == "ok", f"{backend} {key}: {result.get('traceback')}"
    sizes = data["meta"]["sizes"]
    w1 = loads["w1_throughput"]["workers"]
    assert set(w1) == {str(n) for n in sizes["w1_workers"]}
    for row in w1.values():
        assert row["ours_cycles_per_s"] > 0 and row["raw_cycles_per_s"] > 0 and row["ratio"] > 0
    for op in ("claim", "renew", "complete"):
        assert {"p50", "p99", "n"} <= loads["w2_latency"][f"{op}_ms"].keys()
    w3 = loads["w3_keepalive"]
    assert [r["held"] for r in w3["rows"]] == sizes["w3_sizes"]
    assert all(r["ok"] and r["bytes_per_lease"] > 0 for r in w3["rows"])
    assert all(r["min_headroom_s"] is None or r["min_headroom_s"] > 0 for r in w3["rows"])
    w4 = loads["w4_takeover"]
    assert w4["kill_s"]["n"] == w4["graceful_ms"]["n"] == sizes["w4_trials"]
    assert w4["stale_writes_rejected"] == sizes["w4_trials"]  # the fence did its job
    w5 = loads["w5_batch"]
    assert w5["supported"] == (entry["capabilities"]["max_batch_claim"] > 1)
    assert ("speedup" in w5) == w5["supported"]
    w7 = loads["w7_depth"]
    assert [r["depth"] for r in w7["rows"]] == list(depths_for(backend, SMOKE))
    assert all(r["cycle_ms"]["n"] > 0 for r in w7["rows"] if "skipped" not in r)
    workloads_with_goals = {g["workload"] for g in data["goals"] if g["backend"] == backend}
    assert {"W3", "W4", "W5", "W7"} <= workloads_with_goals
    assert "W1" not in workloads_with_goals  # a figure: its costs are in its table


@pytest.mark.slow
def test_unavailable_backends_are_reported_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from consensus_lease import cli
    from consensus_lease.bench import clusters

    monkeypatch.setattr(cli, "EXTRA_COMMANDS", ["consensus_lease.bench.command"])
    monkeypatch.setattr(clusters, "backend_problem", lambda b: f"{b} driver missing (test)")
    code = cli.main(["bench", "--quick", "--backends", "etcd,zk", "--out", str(tmp_path)])
    assert code == 0
    data = check_files(tmp_path, {"etcd", "zookeeper"})
    for backend in ("etcd", "zookeeper"):
        entry = data["backends"][backend]
        assert entry["available"] is False and "driver missing" in entry["reason"]
        assert entry["workloads"] == {}
    assert {g["status"] for g in data["goals"]} == {"not run"}
    assert "not measured" in capsys.readouterr().out
    assert "**not measured**" in (tmp_path / "results.md").read_text()


def test_backends_option_is_checked() -> None:
    result = subprocess.run([sys.executable, "-c", CLI, "bench", "--backends", "redis"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown backend 'redis'" in result.stderr


def test_workloads_option_is_checked_and_selects() -> None:
    from consensus_lease.bench.command import _workloads

    assert _workloads("w7,w1") == ("w1_throughput", "w7_depth")  # run in the usual order
    assert _workloads("w7_depth") == ("w7_depth",)
    result = subprocess.run([sys.executable, "-c", CLI, "bench", "--workloads", "w0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown workload 'w0'" in result.stderr


@pytest.mark.containers
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_bench_on_every_backend(docker_engine: Any, tmp_path: Path) -> None:
    """Starts its own etcd cluster and ZooKeeper ensemble through the kit (bench slots,
    not the test suite's), so it needs only the engine and images. The SQLite part is
    checked here too (its own run was the same work again: one bench run covers it)."""
    from consensus_lease.bench.clusters import backend_problem

    result = bench(tmp_path, timeout_s=540)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    data = check_files(tmp_path, set(BACKENDS))
    for backend in BACKENDS:
        if backend_problem(backend) is None:
            check_measured(data, backend)
        else:  # the driver is not importable here: the bench must say so, not crash
            assert data["backends"][backend]["available"] is False
    w5 = data["backends"]["sqlite"]["workloads"]["w5_batch"]
    assert w5["supported"] is True and w5["speedup"] > 0  # claim_many: one transaction
    page = (tmp_path / "results.md").read_text()
    # W1 is a figure, not a goal line (issue 27): its table has the row, the goals W5's.
    assert "| sqlite | W5 |" in page and "| sqlite | W1 |" not in page
    assert "| sqlite | 1 |" in page  # W1's table: ours and raw at 1 worker
    for backend in ("etcd", "zookeeper"):
        peers = data["backends"][backend]["workloads"].get("w6_peers", {}).get("peers", [])
        if peers:
            assert peers[0]["fencing"] is True
            assert all(p["fencing"] is False for p in peers[1:])
            assert len(peers) == 4 and peers[-1]["library"] == "raw"  # the ceiling row
            assert peers[-1]["error"] is None, peers[-1]["error"]  # measured every repeat


W7_TINY = dataclasses.replace(
    QUICK, w7_depths=(200, 2_000), w7_samples=20, w7_stats_samples=2, w7_rate_jobs=50,
    w7_step_budget_s=30.0, w7_fill_budget_s=60.0,
)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_w7_measures_each_depth_and_rates(backend: str, tmp_path: Path) -> None:
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path}/w7.db"
    data = w7_depth(Target(backend, url=url), W7_TINY, "t7")
    assert [r["depth"] for r in data["rows"]] == [200, 2_000]
    for row in data["rows"]:
        assert "skipped" not in row, row
        assert row["cycle_ms"]["n"] == 20 and row["cycle_ms"]["p50"] > 0
        assert row["queue_stats_ms"]["n"] == 2
        # topped up to depth + samples + warm-up: queue_stats saw at least the depth
        assert row["depth"] <= row["open_jobs_seen"] <= row["depth"] + 25
        assert row["purged"] == 25  # the timed and warm-up cycles' completed jobs
    rates = data["rates"]
    assert rates["enqueue_jobs"] == 50 and rates["enqueue_many_jobs"] == 500
    assert rates["enqueue_many_jobs_per_s"] > 0 and rates["speedup"] > 0
    # one store request per max_enqueue_batch jobs, or one enqueue per job as fallback
    batch = rates["max_enqueue_batch"]
    assert rates["enqueue_many_requests"] == -(-500 // batch)
    assert data["largest"] == 2_000 and data["p50_growth"] > 0
    goals = evaluate({"backends": {backend: {"available": True,
                                             "workloads": {"w7_depth": {**data,
                                                                        "status": "ok"}}}}})
    assert [g.workload for g in goals] == ["W7", "W7", "W7"]
    assert {g.status for g in goals} <= {"pass", "miss", "n/a"}


def test_w7_skips_a_depth_above_the_documented_capacity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from consensus_lease.backends.memory import MemoryBackend

    capped = dataclasses.replace(MemoryBackend.capabilities, max_queue_jobs=1_000)
    monkeypatch.setattr(MemoryBackend, "capabilities", capped)
    data = w7_depth(Target("memory", url="memory://"), W7_TINY, "t7")
    first, second = data["rows"]
    assert "cycle_ms" in first
    assert "max_queue_jobs = 1,000" in second["skipped"]
    assert data["largest"] == 200 and data["p50_growth"] == 1.0


def test_w7_a_store_failing_at_a_depth_misses_the_goals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from consensus_lease import LeaseStore
    from consensus_lease.errors import BackendUnavailable

    original = LeaseStore.queue_stats
    calls: list[str] = []

    def breaks_when_deep(self: LeaseStore, queue: str) -> Any:
        calls.append(queue)
        if len(calls) > W7_TINY.w7_stats_samples:  # the first depth's calls succeed
            raise BackendUnavailable("the server fell over (test)")
        return original(self, queue)

    monkeypatch.setattr(LeaseStore, "queue_stats", breaks_when_deep)
    data = w7_depth(Target("memory", url="memory://"), W7_TINY, "t7")
    first, second = data["rows"]
    assert "cycle_ms" in first
    assert set(second) == {"depth", "failed", "skipped"}
    assert "the server fell over" in second["failed"]
    assert data["rates"]["enqueue_many_jobs"] == 500  # measured before the deep queue
    goals = evaluate({"backends": {"zookeeper": {
        "available": True, "workloads": {"w7_depth": {**data, "status": "ok"}}}}})
    by_goal = {g.goal: g for g in goals}
    assert by_goal["claim_next+complete p50 at 2,000 open jobs vs 200"].status == "miss"
    assert by_goal["queue_stats p50 at 2,000 open jobs"].status == "miss"


def test_w7_plot_is_written(tmp_path: Path) -> None:
    from consensus_lease.bench.plots import write_plots

    data = w7_depth(Target("memory", url="memory://"), W7_TINY, "t7")
    results = {"backends": {"memory": {"available": True,
                                       "workloads": {"w7_depth": {**data, "status": "ok"}}}}}
    write_plots(results, tmp_path)
    assert (tmp_path / "w7_depth.png").read_bytes()[:8] == PNG_MAGIC


RESULTS_JSON = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "results.json"


def test_replot_draws_the_committed_results_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from consensus_lease import cli

    monkeypatch.setattr(cli, "EXTRA_COMMANDS", ["consensus_lease.bench.command"])
    (tmp_path / "w7_depth.png").write_bytes(b"stale")  # W7 is not in these results
    code = cli.main(["bench", "--replot", str(RESULTS_JSON), "--out", str(tmp_path)])
    assert code == 0
    drawn = sorted(p.name for p in tmp_path.glob("*.png"))
    assert drawn == sorted(set(PLOTS) - {"w7_depth.png", "w10_drain.png"})
    assert all((tmp_path / n).read_bytes()[:8] == PNG_MAGIC for n in drawn)
    markdown = (tmp_path / "results.md").read_text()
    assert "## Goals: measured against target" in markdown
    assert "*Not part of this run* (`--workloads` left W7 out)." in markdown  # no empty table
    assert "*Not part of this run*" not in markdown.split("## W7")[0]


def test_replot_refuses_a_file_that_is_not_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from consensus_lease import cli

    monkeypatch.setattr(cli, "EXTRA_COMMANDS", ["consensus_lease.bench.command"])
    bad = tmp_path / "results.json"
    bad.write_text('{"schema": 1}')
    assert cli.main(["bench", "--replot", str(bad)]) == 2
    assert "is not a results.json" in capsys.readouterr().out
    assert list(tmp_path.glob("*.png")) == []


def test_percentile_and_rate_helpers() -> None:
    from consensus_lease.bench.stats import percentile, rate_from_times

    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    # four keepalives 0.5 s apart are 2 requests/s, whatever the window around them
    assert rate_from_times([10.0, 10.5, 11.0, 11.5], window_s=2.5) == pytest.approx(2.0)
    assert rate_from_times([], window_s=2.0) == 0.0


# -- measured windows, spread, CPU and requests per cycle ------------------------------

TINY = dataclasses.replace(
    QUICK, w1_workers=(1,), w1_duration_s=0.6, w1_windows=3, w1_warmup_s=1.0, w1_repeats=1,
    w1_warmup=3, w1_count_cycles=5, w6_duration_s=0.3, w6_windows=3, w6_warmup_s=0.1,
    w6_repeats=2, w8_tasks=4, w8_processes=1, w8_duration_s=0.6, w8_windows=3,
    w8_repeats=1,
)
"""Sizes for the windowed workloads' tests. W1's unmeasured warm-up is 1 s, not less: the
first window starts ``_BARRIER_S`` (0.3 s) + the warm-up after the "run" request is sent,
and a worker the request reaches later than that records no warm-up cycle (seen with
0.2 s on a loaded 2-core machine)."""
SPREAD_KEYS = {"n", "median", "min", "max", "p25", "p75"}


def _sqlite_results(sizes: Any, workload: str, data: dict[str, Any]) -> dict[str, Any]:
    """A results.json of one SQLite workload, with placeholder run metadata."""
    return {"meta": {"quick": True, "started_utc": "-", "duration_s": 1.0, "command": "-",
                     "machine": {"cpu": "-", "cores": 2, "memory_gib": 1, "os": "-",
                                 "kernel": "-", "python": "-", "sqlite": "-",
                                 "load_average_at_start": "-", "libraries": {}},
                     "load_average_at_end": "-", "sizes": dataclasses.asdict(sizes)},
            "backends": {"sqlite": {"available": True, "origin": "-", "url": "-",
                                    "workloads": {workload: {**data, "status": "ok"}}}}}


def test_windows_count_warmup_apart_and_stop_after_the_last() -> None:
    from consensus_lease.bench.windows import Windows, paired_ratios, spread

    w = Windows(start=100.0, warmup_s=1.0, windows=2, window_s=0.5)
    assert [w.record(t) for t in (100.1, 100.9)] == [True, True]  # warm-up
    assert [w.record(t) for t in (101.0, 101.2, 101.6)] == [True, True, True]
    assert w.record(102.0) is False  # ends after the last window: dropped, stop
    data = w.as_dict()
    assert data["warm_cycles"] == 2 and data["counts"] == [2, 1]
    assert len(data["cpu_s"]) == 2 and all(c is not None and c >= 0 for c in data["cpu_s"])
    sp = spread([3.0, 1.0, 2.0, 4.0])
    assert sp == {"n": 4, "median": 2.5, "min": 1.0, "max": 4.0, "p25": 1.75, "p75": 3.25}
    assert math.isnan(spread([])["median"])
    assert paired_ratios([2.0, 3.0, 1.0], [1.0, 0.0]) == [2.0]  # zero and unpaired skipped
    with pytest.raises(ValueError):
        Windows(0.0, 0.0, 0, 1.0)


def test_counting_sees_every_sqlite_statement_and_unpatches(tmp_path: Path) -> None:
    import sqlite3

    from consensus_lease.bench.raw import SqliteRaw
    from consensus_lease.bench.roundtrips import counting, requests_total

    connect = sqlite3.connect
    with counting(["sqlite3"]) as count:
        raw = SqliteRaw(str(tmp_path / "raw.db"))
        raw.open()
        count.reset()
        raw.cycle("a")
        raw.cycle("b")
        seen = count.snapshot()
        raw.close()
    assert sqlite3.connect is connect
    # per cycle: BEGIN, INSERT, COMMIT, BEGIN, UPDATE, COMMIT
    assert seen == {"BEGIN": 4, "INSERT": 2, "UPDATE": 2, "COMMIT": 4}
    assert requests_total({**seen, "TRIGGER": 3}) == 12
    assert count.transports == {"sqlite3"}
    with pytest.raises(ValueError, match="unknown transports"), counting(["redis"]):
        pass


def test_counting_sees_every_psycopg_statement_and_unpatches() -> None:
    """The raw PostgreSQL client's cycle is an INSERT and an UPDATE; ours (claim +
    complete) is one INSERT ... ON CONFLICT and one UPDATE, by the same counter."""
    import psycopg

    from consensus_lease import open_store
    from consensus_lease.bench.raw import PostgresRaw
    from consensus_lease.bench.roundtrips import counting, requests_total
    from consensus_lease.testing.postgresql import fresh_schema, postgres_url

    base = postgres_url()
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
    with fresh_schema(base) as schema:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            conn.execute(f'CREATE TABLE "{schema}".raw_jobs (job_id text PRIMARY KEY, '
                         "generation bigint NOT NULL, owner text, done boolean NOT NULL)")
        with counting(["psycopg"]) as count:
            raw = PostgresRaw(base, f'"{schema}".raw_jobs')
            raw.open()
            count.reset()
            raw.cycle("a")
            raw.cycle("b")
            seen_raw = count.snapshot()
            raw.close()
            with open_store(f"{base}?schema={schema}") as store:
                session = store.session("w", ttl_s=60.0)
                count.reset()
                for job_id in ("a", "b"):
                    lease = session.claim(job_id)
                    assert lease is not None
                    lease.complete(b"")
                seen_ours = count.snapshot()
            with psycopg.connect(base, autocommit=True) as conn, conn.cursor() as cur:
                count.reset()
                cur.executemany("SELECT %s", [(1,), (2,), (3,)])
                assert count.snapshot() == {"SELECT": 3}
        assert count.transports == {"psycopg"}
    assert (psycopg.Cursor.execute, psycopg.Cursor.executemany) == (execute, executemany)
    assert seen_raw == {"INSERT": 2, "UPDATE": 2}
    # ours: the claim is one statement led by a CTE (the session read once), named WITH
    assert seen_ours == {"WITH": 2, "UPDATE": 2} and requests_total(seen_ours) == 4


def test_w7_cleanup_on_postgresql_names_the_schema_dropped_at_the_end() -> None:
    from consensus_lease.bench.depth import _cleanup

    target = Target("postgresql", url="postgresql://u@h/db?schema=clbench_x")
    text = _cleanup(target, "postgresql://u@h/db?schema=clbench_x", 1.0)
    assert "clbench_x" in text and "dropped" in text and "nothing to delete (" not in text


@pytest.fixture(scope="module")
def one_worker() -> Any:
    from consensus_lease.bench.pool import WorkerPool

    with WorkerPool(1) as pool:
        yield pool


@pytest.mark.timeout(120)
def test_w1_reports_spread_cpu_and_requests_per_cycle(one_worker: Any, tmp_path: Path) -> None:
    from consensus_lease.bench import report
    from consensus_lease.bench.clusters import sqlite_target
    from consensus_lease.bench.report import markdown
    from consensus_lease.bench.workloads import w1_throughput

    data = w1_throughput(sqlite_target(str(tmp_path)), TINY, one_worker, "t1")
    row = data["workers"]["1"]
    for side in ("ours", "raw"):
        assert set(row[f"{side}_spread"]) == SPREAD_KEYS and row[f"{side}_spread"]["n"] == 3
        sp = row[f"{side}_spread"]
        assert 0 < sp["min"] <= row[f"{side}_cycles_per_s"] <= sp["max"]
        assert row[f"{side}_cpu_ms_per_cycle"] > 0
        (run,) = row["runs"][side]
        assert len(run["windows"]) == 3 and run["warm_cycles"] > 0  # warm-up not measured
        assert data["requests"][side]["unit"] == "statements"
        assert data["requests"][side]["cycles"] == 5
    assert row["ratio_spread"]["n"] == 3
    assert row["ratio"] == pytest.approx(row["ours_cycles_per_s"] / row["raw_cycles_per_s"])
    assert data["requests"]["raw"]["per_cycle"] == 6.0  # 2 x BEGIN, write, COMMIT
    ours = data["requests"]["ours"]
    assert ours["per_cycle"] >= 2 and ours["transports"] == ["sqlite3"]
    # at least a write to claim and one to complete
    assert ours["by_name"].get("INSERT", 0) + ours["by_name"].get("UPDATE", 0) >= 2

    results = _sqlite_results(TINY, "w1_throughput", data)
    assert evaluate(results) == []  # a figure, not a goal: its costs are in its table
    text = markdown(results, [], [])
    assert "ours client CPU ms/cycle" in text and "ours requests/cycle" in text
    assert f"| {row['ours_cpu_ms_per_cycle']:.2f} | {row['raw_cpu_ms_per_cycle']:.2f} |" in text
    assert "| sqlite | raw | statements | 6.0 |" in text
    assert report.FIGURES_NOTE in text


@pytest.mark.timeout(120)
def test_w8_reports_window_spread(one_worker: Any, tmp_path: Path) -> None:
    from consensus_lease.bench.asyncrate import w8_async
    from consensus_lease.bench.clusters import sqlite_target

    data = w8_async(sqlite_target(str(tmp_path)), TINY, one_worker, "t8")
    for side in ("async", "processes"):
        assert data[f"{side}_spread"]["n"] == 3
        assert data[f"{side}_cycles_per_s"] > 0
    assert data["ratio_spread"]["n"] == 3
    assert data["ratio"] == pytest.approx(data["async_cycles_per_s"] /
                                          data["processes_cycles_per_s"])


def test_w6_rates_are_window_medians_with_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    from consensus_lease.bench import peers

    def fake(name: str, library: str, pause_s: float) -> Any:
        def opener() -> Any:
            def cycle() -> None:
                time.sleep(pause_s)  # a fake peer cycle that takes real time

            return cycle, lambda: None

        return peers.Peer(name, library, library == "consensus_lease", opener)

    monkeypatch.setattr(peers, "peers_for", lambda target, sizes, prefix: [
        fake("ours", "consensus_lease", 0.001), fake("slow peer", "kazoo", 0.004),
        fake("tooz peer", "tooz", 0.004), fake("raw client", peers.RAW_FLOOR, 0.0005)])
    data = peers.w6_peers(Target("memory", url="memory://"), TINY, "t6")
    ours, slow, tooz, floor = data["peers"]
    for row in (ours, slow, tooz, floor):
        assert row["spread"]["n"] == 2 * 3  # two repeats of three windows
        assert row["spread"]["min"] <= row["cycles_per_s"] <= row["spread"]["max"]
    assert slow["ours_over_peer"] > 1 and slow["ratio_spread"]["n"] == 6
    # The raw client's row is the ceiling, shown next to the goal, not a goal itself;
    # tooz is a figure (no goal), its ceiling in W6's table.
    results = {"meta": {"sizes": dataclasses.asdict(TINY)}, "backends": {"zookeeper": {
        "available": True, "workloads": {"w6_peers": {**data, "status": "ok"}}}}}
    (goal,) = evaluate(results)
    assert goal.goal == "cycles/s vs slow peer"
    assert "[" in goal.measured and goal.status in {"pass", "miss"}
    ceiling = floor["cycles_per_s"] / slow["cycles_per_s"]
    assert f"ceiling: the raw client's 2-request cycle is {ceiling:.2f}x this peer" in goal.note
    from consensus_lease.bench.report import _w6

    table = "\n".join(_w6(results))
    assert "raw client / this (the ceiling)" in table
    tooz_ceiling = floor["cycles_per_s"] / tooz["cycles_per_s"]
    assert any(line.startswith("| zookeeper | tooz peer |") and
               f"| {tooz_ceiling:.2f}x |" in line for line in table.splitlines())


@pytest.mark.parametrize(("trials", "noted"), [(3, True), (20, False)])
def test_w4_handover_of_few_trials_is_noted_as_inconclusive(trials: int, noted: bool) -> None:
    data = {"status": "ok", "trials": trials, "granted_ttl_s": 2.0,
            "kill_s": {"p50": 2.0, "p99": 2.1}, "graceful_ms": {"p50": 5.0, "p99": 34.0}}
    goals = evaluate({"backends": {"etcd": {"available": True,
                                            "workloads": {"w4_takeover": data}}}})
    (graceful,) = [g for g in goals if g.goal.startswith("graceful")]
    assert graceful.status == "miss"  # still reported as measured
    assert ("too few to tell a miss from one slow trial" in graceful.note) is noted


@pytest.mark.timeout(120)
def test_w5_rounds_have_a_spread_and_a_budget(tmp_path: Path) -> None:
    from consensus_lease.bench.clusters import sqlite_target
    from consensus_lease.bench.report import markdown
    from consensus_lease.bench.workloads import w5_batch

    assert QUICK.w5_rounds >= 15 and QUICK.w5_budget_s <= 60  # a median, quickly
    sizes = dataclasses.replace(SMOKE, w5_rounds=5, w5_batch=8)
    data = w5_batch(sqlite_target(str(tmp_path)), sizes, "t5")
    assert data["rounds"] == 5 and data["single_ms"]["n"] == data["batch_ms"]["n"] == 5
    for key in ("single_spread", "batch_spread", "speedup_spread"):
        assert set(data[key]) == SPREAD_KEYS and data[key]["n"] == 5
    sp = data["single_spread"]
    assert sp["min"] <= data["single_ms"]["p50"] <= sp["max"]
    assert data["speedup"] == pytest.approx(data["single_ms"]["p50"] / data["batch_ms"]["p50"])
    assert data["store_requests_per_batch"] == 1  # SQLite: one transaction

    results = _sqlite_results(sizes, "w5_batch", data)
    (goal,) = evaluate(results)
    assert goal.workload == "W5" and "[" in goal.measured and "5 rounds" in goal.measured
    text = markdown(results, [goal], [])
    assert "| sqlite | 1000 | 5 | " in text and "(median [IQR])" in text
    assert "- sqlite: single claims " in text and "speedup " in text

    # The budget stops the rounds (one always runs).
    short = w5_batch(sqlite_target(str(tmp_path)), dataclasses.replace(sizes, w5_budget_s=0.0),
                     "t5b")
    assert short["rounds"] == 1 and short["rounds_planned"] == 5


@pytest.mark.parametrize("kind", ["etcd", "zookeeper"])
def test_ours_raw_and_peers_reach_the_same_member(kind: str) -> None:
    """Our etcd transport starts at a random member and kazoo at a random host: a given
    multi-member URL is pinned to its first member for ours as for the raw client, so a
    ratio never compares a write through a follower with one through the leader."""
    import contextlib

    from consensus_lease.bench.clusters import etcd_target, zookeeper_target

    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        if kind == "etcd":
            target = etcd_target("etcd://127.0.0.5:2379,127.0.0.6:2379,127.0.0.7:2379/x?timeout_s=5",
                                 "r1", stack, notes.append)
            assert (target.raw["host"], target.raw["port"]) == ("127.0.0.5", 2379)
        else:
            target = zookeeper_target("zk://127.0.0.5:2181,127.0.0.6:2181/x", "r1", stack,
                                      notes.append, tick_ms=250)
            assert target.raw["hosts"] == "127.0.0.5:2181"
    assert target.reason is None, target.reason
    assert target.url is not None
    member = "127.0.0.5:2379" if kind == "etcd" else "127.0.0.5:2181"
    assert target.url.split("://", 1)[1].split("/", 1)[0] == member
    if kind == "etcd":
        assert target.url.endswith("/clbench-r1?timeout_s=5")  # the options are kept
