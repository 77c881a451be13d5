"""`consensus-lease bench`: the files it writes have the promised shape.

Speed is not checked here (goals are reported, not asserted). The SQLite run needs no
containers; the etcd/ZooKeeper run starts its own clusters through the container kit
on the bench's loopback slots, so it needs the Docker engine and images.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from consensus_lease.bench.config import BACKENDS
from consensus_lease.bench.plots import PLOTS
from consensus_lease.bench.runner import WORKLOADS

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
        [sys.executable, "-c", CLI, "bench", "--quick", "--out", str(out), *args],
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
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
        assert f"]({name})" in markdown
    return data


def check_measured(data: dict[str, Any], backend: str) -> None:
    entry = data["backends"][backend]
    assert entry["available"] is True and entry["reason"] is None
    loads = entry["workloads"]
    assert set(loads) == set(WORKLOADS)
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
    workloads_with_goals = {g["workload"] for g in data["goals"] if g["backend"] == backend}
    assert {"W1", "W3", "W4", "W5"} <= workloads_with_goals


@pytest.mark.slow
def test_quick_bench_on_sqlite_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    result = bench(tmp_path, "--backends", "sqlite", timeout_s=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = check_files(tmp_path, {"sqlite"})
    check_measured(data, "sqlite")
    w5 = data["backends"]["sqlite"]["workloads"]["w5_batch"]
    assert w5["supported"] is True and w5["speedup"] > 0  # claim_many: one transaction
    assert "| sqlite | W1 |" in (tmp_path / "results.md").read_text()


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


@pytest.mark.containers
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_bench_on_every_backend(docker_engine: Any, tmp_path: Path) -> None:
    """Starts its own etcd cluster and ZooKeeper ensemble through the kit (bench slots,
    not the test suite's), so it needs only the engine and images."""
    from consensus_lease.bench.clusters import backend_problem

    result = bench(tmp_path, timeout_s=840)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    data = check_files(tmp_path, set(BACKENDS))
    for backend in BACKENDS:
        if backend_problem(backend) is None:
            check_measured(data, backend)
        else:  # the driver is not importable here: the bench must say so, not crash
            assert data["backends"][backend]["available"] is False
    for backend in ("etcd", "zookeeper"):
        peers = data["backends"][backend]["workloads"].get("w6_peers", {}).get("peers", [])
        if peers:
            assert peers[0]["fencing"] is True
            assert all(p["fencing"] is False for p in peers[1:])
            assert len(peers) == 3


def test_percentile_and_rate_helpers() -> None:
    from consensus_lease.bench.stats import percentile, rate_from_times

    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    # four keepalives 0.5 s apart are 2 requests/s, whatever the window around them
    assert rate_from_times([10.0, 10.5, 11.0, 11.5], window_s=2.5) == pytest.approx(2.0)
    assert rate_from_times([], window_s=2.0) == 0.0
