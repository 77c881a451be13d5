"""One benchmark run: find or start the stores, run every workload on every available
backend with a progress bar, then write JSON, Markdown and plots.

``results.json`` has the keys ``schema``, ``meta`` (command, machine, sizes, times),
``backends`` (per backend: ``available``, ``reason``, ``url``, ``origin``, ``server``,
``capabilities``, ``workloads`` -> ``w1_throughput`` ... ``w6_peers``, ``w8_async``,
``w7_depth`` (last: its deep queue would slow the others), each
with a ``status`` of ``ok`` or ``error``) and ``goals`` (rows of :class:`.goals.Goal`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..store import ENTRY_POINT_GROUP
from . import clusters
from .asyncrate import w8_async
from .config import BACKENDS, FULL, QUICK, SMOKE, Sizes, Target
from .depth import w7_depth
from .drain import w10_drain
from .goals import evaluate
from .holding import w3_keepalive
from .machine import describe_machine, load_average, member_role, server_version
from .peers import w6_peers
from .pool import WorkerPool
from .report import write_json, write_markdown
from .sessions import w9_sessions
from .takeover import w4_takeover
from .workloads import w1_throughput, w2_latency, w5_batch

__all__ = ["BenchOptions", "run_bench"]

SCHEMA = 1
WORKLOADS = ("w1_throughput", "w2_latency", "w3_keepalive", "w4_takeover", "w5_batch",
             "w6_peers", "w8_async", "w7_depth", "w9_sessions", "w10_drain")
DEFAULT_WORKLOADS = tuple(k for k in WORKLOADS if k not in ("w9_sessions", "w10_drain"))
"""What a run without ``--workloads`` measures: W9 (12,000 sessions beside busy loops,
minutes of a loaded machine) and W10 (30,000 jobs drained per side, the peers' among
them) run only when asked for (``--workloads w9``, ``--workloads w10``)."""
LABELS = {
    "w1_throughput": "W1 cycle throughput vs raw client",
    "w2_latency": "W2 latency",
    "w3_keepalive": "W3 keepalive scaling",
    "w4_takeover": "W4 takeover",
    "w5_batch": "W5 batch claim",
    "w6_peers": "W6 peers",
    "w8_async": "W8 asyncio vs processes",
    "w7_depth": "W7 deep queue",
    "w9_sessions": "W9 many sessions on a busy host",
    "w10_drain": "W10 queue drain",
}


def short_name(key: str) -> str:
    """``w1_throughput`` -> ``w1``, ``w10_drain`` -> ``w10``: the ``--workloads`` name."""
    return key.split("_", 1)[0]


@dataclass
class BenchOptions:
    backends: tuple[str, ...] = BACKENDS
    quick: bool = False
    smoke: bool = False
    """The smallest sizes (:data:`.config.SMOKE`): checks the harness, measures nothing."""
    out: Path = Path("bench-results")
    etcd_url: str | None = None
    zk_url: str | None = None
    zk_tick_ms: int | None = None
    profile: bool = False
    workloads: tuple[str, ...] = DEFAULT_WORKLOADS
    """Which of :data:`WORKLOADS` to run (in that order)."""
    pg_url: str | None = None

    @property
    def sizes(self) -> Sizes:
        if self.smoke:
            return SMOKE
        return QUICK if self.quick else FULL


def _capabilities(target: Target) -> dict[str, Any] | None:
    scheme = clusters.SCHEMES[target.backend]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == scheme:
            try:
                return dataclasses.asdict(ep.load().capabilities)
            except Exception:
                return None
    return None


def _targets(options: BenchOptions, run_id: str, workdir: str, stack: contextlib.ExitStack,
             note: Callable[[str], None]) -> list[Target]:
    targets = []
    for backend in options.backends:
        if backend == "sqlite":
            targets.append(clusters.sqlite_target(workdir))
        elif backend == "etcd":
            targets.append(clusters.etcd_target(options.etcd_url, run_id, stack, note))
        elif backend == "postgresql":
            targets.append(clusters.postgresql_target(options.pg_url, run_id, stack, note))
        else:
            targets.append(clusters.zookeeper_target(options.zk_url, run_id, stack, note,
                                                     options.zk_tick_ms))
    return targets


def _workload(key: str, target: Target, sizes: Sizes, pool: WorkerPool | None, workdir: str,
              prefix: str) -> dict[str, Any]:
    if key == "w1_throughput":
        assert pool is not None
        return w1_throughput(target, sizes, pool, prefix)
    if key == "w2_latency":
        return w2_latency(target, sizes, prefix)
    if key == "w3_keepalive":
        return w3_keepalive(target, sizes, prefix)
    if key == "w4_takeover":
        return w4_takeover(target, sizes, workdir, prefix)
    if key == "w5_batch":
        return w5_batch(target, sizes, prefix)
    if key == "w7_depth":
        return w7_depth(target, sizes, prefix)
    if key == "w8_async":
        assert pool is not None
        return w8_async(target, sizes, pool, prefix)
    if key == "w9_sessions":
        return w9_sessions(target, sizes, prefix)
    if key == "w10_drain":
        return w10_drain(target, sizes, prefix)
    return w6_peers(target, sizes, prefix)


def _measure(targets: list[Target], options: BenchOptions, run_id: str, workdir: str,
             stack: contextlib.ExitStack, progress: Progress, task: Any, console: Console,
             results: dict[str, Any]) -> int:
    """Run every workload on every available target; return the number of errors."""
    sizes = options.sizes
    errors = 0
    pool: WorkerPool | None = None
    if any(t.available for t in targets):
        progress.update(task, description=f"starting {sizes.pool_size} worker processes")
        pool = stack.enter_context(WorkerPool(sizes.pool_size))
    for target in targets:
        entry: dict[str, Any] = {
            "available": target.available, "reason": target.reason, "url": target.url,
            "origin": target.origin, "capabilities": _capabilities(target), "workloads": {},
        }
        results["backends"][target.backend] = entry
        if not target.available:
            console.print(f"[yellow]{target.backend}: not measured[/]: {target.reason}")
            progress.advance(task, len(options.workloads))
            continue
        entry["server"] = server_version(target)
        entry["member_role"] = member_role(target)
        entry["tick_s"], entry["tick_source"] = target.tick_s, target.tick_source
        for key in options.workloads:
            progress.update(task, description=f"{target.backend}: {LABELS[key]}")
            started = time.monotonic()
            prefix = f"{run_id}-{short_name(key)}"
            try:
                data = _workload(key, target, sizes, pool, workdir, prefix)
                data["status"] = "ok"
            except Exception as exc:
                errors += 1
                data = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:600],
                        "traceback": traceback.format_exc()[-3000:]}
                console.print(f"[red]{target.backend}: {LABELS[key]} failed[/]: {data['error']}")
            data["wall_s"] = time.monotonic() - started
            entry["workloads"][key] = data
            progress.advance(task)
        if options.profile:
            progress.update(task, description=f"{target.backend}: profiling a cycle")
            try:
                from .profile import profile_cycle

                name = profile_cycle(target, 3.0, f"{run_id}-pf", options.out)
                results["meta"].setdefault("profiles", []).append(name)
            except Exception as exc:
                console.print(f"[yellow]{target.backend}: no profile[/]: {exc!r}")
    return errors


def _command(options: BenchOptions) -> str:
    """The command line that reproduces this run."""
    argv = ["consensus-lease", "bench"]
    if options.backends != BACKENDS:
        argv += ["--backends", ",".join(options.backends)]
    if options.smoke:
        argv.append("--smoke")
    elif options.quick:
        argv.append("--quick")
    if options.workloads != DEFAULT_WORKLOADS:
        argv += ["--workloads", ",".join(short_name(k) for k in options.workloads)]
    argv += ["--out", str(options.out)]
    if options.etcd_url:
        argv += ["--etcd-url", options.etcd_url]
    if options.zk_url:
        argv += ["--zk-url", options.zk_url]
    if options.pg_url:
        argv += ["--pg-url", options.pg_url]
    if options.zk_tick_ms:
        argv += ["--zk-tick-ms", str(options.zk_tick_ms)]
    if options.profile:
        argv.append("--profile")
    return shlex.join(argv)


def _summary(goals: list[Any], console: Console) -> None:
    table = Table(title="goals: measured vs target")
    for column in ("backend", "workload", "goal", "target", "measured", "result", "note"):
        table.add_column(column, overflow="fold")
    colour = {"pass": "green", "miss": "red"}
    for g in goals:
        style = colour.get(g.status, "yellow")
        table.add_row(g.backend, g.workload, g.goal, g.target, g.measured,
                      f"[{style}]{g.status}[/]", g.note)
    console.print(table)


def run_bench(options: BenchOptions, console: Console) -> int:
    """Run the benchmark and write its files into ``options.out``.

    Returns 0 when every workload of every available backend ran (goals may still be
    missed: they are reported, not asserted), 1 when a workload failed. A backend that
    is not available is reported as such and is not an error.
    """
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    started = time.monotonic()
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "meta": {
            "command": _command(options),
            "quick": options.quick,
            "run_id": run_id,
            "started_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "machine": describe_machine(),
            "sizes": dataclasses.asdict(options.sizes),
            "python_executable": sys.executable,
        },
        "backends": {},
    }
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with contextlib.ExitStack() as stack:
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="clbench-"))
        progress = stack.enter_context(
            Progress(*columns, console=console, refresh_per_second=2)
        )
        task = progress.add_task("starting stores", total=1 + len(options.backends) *
                                 len(options.workloads))
        targets = _targets(options, run_id, workdir, stack,
                           lambda text: progress.console.print(text))
        progress.advance(task)
        errors = _measure(targets, options, run_id, workdir, stack, progress, task, console,
                          results)
        progress.update(task, description="stopping stores")
    results["meta"]["duration_s"] = time.monotonic() - started
    results["meta"]["load_average_at_end"] = load_average()
    goals = evaluate(results)
    results["goals"] = [g.as_dict() for g in goals]
    plots: list[str] = []
    try:
        from .plots import write_plots

        plots = write_plots(results, out)
    except ImportError as exc:
        console.print(f"[yellow]no plots[/]: {escape(str(exc))} "
                      + escape("(pip install 'consensus_lease[bench]')"))
    write_json(results, out)
    write_markdown(results, goals, plots, out)
    _summary(goals, console)
    console.print(f"wrote {out}/results.json, results.md and {len(plots)} plots "
                  f"in {results['meta']['duration_s']:.0f} s")
    return 1 if errors else 0
