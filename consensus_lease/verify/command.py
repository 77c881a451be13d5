"""``consensus-lease verify``: prove zero stale effects under faults, on any backend.

Registered through ``consensus_lease.cli.EXTRA_COMMANDS``: ``NAME``, ``add_parser``, ``run``.

Exit status (:data:`EXIT_STATUSES`): 0 PASS only with zero violations in a conclusive
run; 1 FAIL with violations; 2 INCONCLUSIVE when there was no violation but the run
proves nothing — a worker crashed, a fault kind asked for never happened, or the fence
was never tested (no ``pause-at-check`` ran, or none of them led to a stale write
rejected by the fence or a stale completion refused by the store) — and also when the
run could not be set up (bad options, unreachable store). On a terminal a progress bar
shows the fault and quiet periods (elapsed / total seconds, faults injected, claims,
completions / jobs, violations seen so far, stale writes fenced, time since the start);
otherwise one line per phase is printed, and the same figures every 30 s. SIGTERM or
SIGINT ends the run early: every fault healed and every worker it started ended, exit
status 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .checker import COUNTS, VIOLATIONS
from .interrupts import Interrupted
from .nemesis import CLUSTER_FAULTS, FAULTS, WORKER_FAULTS, parse_faults
from .progress import ProgressBar, StatusLines
from .runner import VerifyConfig, VerifyResult, no_password, run_verify

__all__ = ["EXIT_STATUSES", "NAME", "VERDICTS", "add_parser", "config_from_args", "render",
           "run", "summary"]

NAME = "verify"

EXIT_STATUSES = (
    "exit status: 0 PASS: zero violations, every fault kind asked for happened and the "
    "fence was tested (a stale write rejected by the fence, or a stale completion refused "
    "by the store, after a pause-at-check); 1 FAIL: violations; 2 INCONCLUSIVE: no "
    "violation, but a worker crashed, a fault kind never happened, or the fence was never "
    "tested (e.g. --faults pause,skew) -- or the run could not be set up; 128+N: "
    "stopped by signal N (130 SIGINT, 143 SIGTERM), every fault healed and every worker "
    "ended, no verdict."
)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _faults(text: str) -> tuple[str, ...]:
    try:
        return parse_faults(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``verify`` subcommand to ``subparsers``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="check that no stale effect gets through under faults",
        description="Worker processes claim and work jobs, writing every step to a fenced "
        "destination with the lease's token, while a nemesis pauses, kills and skews "
        "workers (and, with --cluster etcd|zookeeper, pauses, kills and partitions cluster "
        "members). A checker then reads the history and the destination. Exit 0 only with "
        "zero violations in a run that exercised every fault kind asked for and tested the "
        "fence. Every seed starts with pause-at-check, then one fault of each other kind.",
        epilog=EXIT_STATUSES,
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--backend", metavar="URL", help="store URL (default: --cluster sqlite)")
    where.add_argument("--cluster", choices=("sqlite", "etcd", "zookeeper"), default="sqlite",
                       help="a store the verifier creates: a SQLite file, or a 3-member "
                       "etcd/ZooKeeper cluster in containers (default sqlite)")
    parser.add_argument("--workers", type=_positive_int, default=4, help="worker processes (4)")
    parser.add_argument("--jobs", type=_positive_int, default=100, help="jobs to complete (100)")
    parser.add_argument("--steps", type=_positive_int, default=3, help="effects per job (3)")
    parser.add_argument("--ttl-s", type=_seconds, default=1.0, help="session TTL, s (1)")
    parser.add_argument("--duration-s", type=_seconds, default=30.0,
                        help="fault period, s (30)")
    parser.add_argument("--quiet-s", type=_seconds, default=20.0,
                        help="longest quiet period after the faults, s (20)")
    parser.add_argument("--seed", type=int, default=1, help="derives the fault schedule (1)")
    parser.add_argument("--faults", type=_faults, default=None, metavar="LIST",
                        help=f"comma-separated, from: {', '.join(FAULTS)} (default: "
                        f"{','.join(WORKER_FAULTS)}, plus the cluster faults with "
                        "--cluster etcd|zookeeper). Without pause-at-check the run can "
                        "only be INCONCLUSIVE: nothing else tests the fence by design")
    parser.add_argument("--history", metavar="PATH", help="history file (default: in the run "
                        "directory)")
    parser.add_argument("--destination", metavar="URL", help="SQLAlchemy URL of the fenced "
                        "destination (default: a SqliteFence file in the run directory)")
    parser.add_argument("--unfenced", action="store_true", help="the destination stops "
                        "checking tokens: the run must then FAIL (proof the checker can)")
    parser.add_argument("--think-s", type=_seconds, default=None,
                        help="longest think time per step, s (default: spreads the work "
                        "over the fault period, at most TTL/3)")
    parser.add_argument("--run-dir", metavar="DIR", help="where the run's files go (default: "
                        "a new temporary directory)")
    parser.add_argument("--until-done", action="store_true", help="end the fault period "
                        "as soon as every job is completed: with a "
                        "long --duration-s, every claim is made under faults")
    parser.add_argument("--summary", metavar="PATH", help="also write the verdict, the "
                        "options, the violations, counts and faults as JSON to PATH (a few "
                        "KB, to keep with the results)")
    return parser


def config_from_args(args: argparse.Namespace) -> VerifyConfig:
    """Build the run's configuration from parsed arguments."""
    faults = args.faults
    if faults is None:
        faults = WORKER_FAULTS
        if args.backend is None and args.cluster in ("etcd", "zookeeper"):
            faults = WORKER_FAULTS + CLUSTER_FAULTS
    return VerifyConfig(
        backend=args.backend, cluster=args.cluster, workers=args.workers, jobs=args.jobs,
        steps=args.steps, ttl_s=args.ttl_s, duration_s=args.duration_s, quiet_s=args.quiet_s,
        seed=args.seed, faults=tuple(faults), history=args.history,
        destination=args.destination, unfenced=args.unfenced, think_s=args.think_s,
        run_dir=args.run_dir, until_done=args.until_done,
    )


def render(result: VerifyResult, console: Console, *, unfenced: bool = False) -> None:
    """Print the summary tables, the history path and the verdict."""
    report = result.report
    verdict = Table(title="violations (each must be 0)")
    for column in ("check", "count", ""):
        verdict.add_column(column)
    for name in VIOLATIONS:
        n = report.violations[name]
        verdict.add_row(name, str(n), "[green]ok[/]" if n == 0 else "[red]VIOLATED[/]")
    console.print(verdict)

    counts = Table(title="what happened")
    counts.add_column("count")
    counts.add_column("value", justify="right")
    for name in COUNTS:
        counts.add_row(name, str(report.counts[name]))
    console.print(counts)
    _render_faults(result, console)
    _render_bad_jobs(result, console)
    _render_where(result, console, unfenced=unfenced)
    _render_verdict(result, console)


def _render_faults(result: VerifyResult, console: Console) -> None:
    report = result.report
    kinds = list(dict.fromkeys([*report.faults_requested, *report.fault_outcomes]))
    if not kinds:
        return
    table = Table(title="faults (each kind asked for must have been injected)")
    for column in ("fault", "scheduled", "injected", "not injected"):
        table.add_column(column, justify="left" if column == "fault" else "right")
    for kind in kinds:
        outcomes = report.fault_outcomes.get(kind) or Counter()
        other = ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items())
                          if outcome not in ("healed", "heal_error"))
        injected = report.faults[kind]
        table.add_row(kind, str(report.faults_scheduled[kind]),
                      str(injected) if injected else "[yellow]0[/]", other or "-")
    console.print(table)


def _render_bad_jobs(result: VerifyResult, console: Console) -> None:
    report = result.report
    bad = [j for j in report.jobs.values() if not j.ok]
    if not bad:
        return
    jobs = Table(title=f"jobs with violations ({len(bad)} of {len(report.jobs)})")
    for column in ("job", "violations", "tokens accepted (in order)", "completed by"):
        jobs.add_column(column, overflow="fold")
    for job in bad[:20]:
        jobs.add_row(job.job, ", ".join(f"{k}={v}" for k, v in job.violations.items() if v),
                     " ".join(map(str, job.tokens)) or "-",
                     "-" if job.completed_generation is None else str(job.completed_generation))
    console.print(jobs)
    for example in report.examples[:10]:
        console.print(f"  [red]x[/] {example}", highlight=False)


def _render_where(result: VerifyResult, console: Console, *, unfenced: bool) -> None:
    report = result.report
    console.print(f"[bold]store[/]       {no_password(result.store_url)}", highlight=False)
    console.print(f"[bold]destination[/] {no_password(result.destination)}"
                  f"{' (UNFENCED)' if unfenced else ''}", highlight=False)
    console.print(f"[bold]history[/]     {result.history_path}", highlight=False)
    console.print(f"[bold]run dir[/]     {result.run_dir}", highlight=False)
    done = ("all jobs completed" if result.all_completed_at_s is not None
            else "NOT all jobs completed")
    console.print(f"[bold]duration[/]    {result.elapsed_s:.1f} s; {result.faults_injected} "
                  f"faults; {report.counts['claims']} claims ({result.claims_under_faults} "
                  f"during the fault period); {done}", highlight=False)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    for crash in result.worker_crashes:
        console.print(f"[red]worker crashed:[/] {crash}", highlight=False)


def _render_verdict(result: VerifyResult, console: Console) -> None:
    status = result.exit_status
    if status == 0:
        refused = (result.report.counts["stale_writes_rejected"]
                   + result.report.counts["stale_completions_rejected"])
        console.print(f"[bold green]PASS: zero violations: no stale effect got through "
                      f"({refused} stale action(s) refused).[/]")
    elif status == 1:
        console.print(f"[bold red]FAIL: {result.report.total_violations} violation(s).[/]")
    else:
        console.print("[bold yellow]INCONCLUSIVE: no safety violation found, but the run "
                      "proves nothing:[/]")
        for reason in result.inconclusive:
            console.print(f"  [yellow]-[/] {reason}", highlight=False)


def _wants_bar(console: Console) -> bool:
    """A progress bar only on a terminal (standard output a TTY)."""
    return console.is_terminal and sys.stdout.isatty()


def run(args: argparse.Namespace, console: Console) -> int:
    """Run ``consensus-lease verify``; returns the exit status (:data:`EXIT_STATUSES`)."""
    config = config_from_args(args)

    def say(message: str) -> None:
        console.print(f"[dim]{message}[/]", highlight=False)

    try:
        if _wants_bar(console):
            with ProgressBar(console) as bar:
                result = run_verify(config, progress=say, watch=bar)
        else:
            result = run_verify(config, progress=say, watch=StatusLines(say))
    except Interrupted as stopped:
        console.print(f"[yellow]{stopped}: every fault healed, every worker stopped; no "
                      "verdict[/]", highlight=False)
        return stopped.exit_status
    render(result, console, unfenced=config.unfenced)
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(json.dumps(summary(result, config), indent=2) + "\n",
                                      encoding="utf-8")
    return result.exit_status


VERDICTS = {0: "PASS", 1: "FAIL", 2: "INCONCLUSIVE"}


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def summary(result: VerifyResult, config: VerifyConfig) -> dict[str, Any]:
    """The run in a few KB (``--summary``): verdict and exit status, the options, the
    violations and counts (:mod:`~consensus_lease.verify.checker`), faults injected per
    kind, the claims made during the fault period, timings (seconds: the whole run; when
    the store showed every job completed and when the last completion returned, both
    after the fault period began) and the machine (platform, CPU count, Python)."""
    report = result.report
    options = {k: v for k, v in asdict(config).items()
               if k not in ("history", "run_dir")}
    return {
        "verdict": VERDICTS.get(result.exit_status, "?"), "exit_status": result.exit_status,
        "options": {**options, "backend": no_password(config.backend),
                    "destination": no_password(config.destination)},
        "store": no_password(result.store_url),
        "destination": no_password(result.destination),
        "violations": {name: report.violations[name] for name in VIOLATIONS},
        "counts": {name: report.counts[name] for name in COUNTS},
        "faults_injected": dict(report.faults), "faults_scheduled": dict(report.faults_scheduled),
        "fault_outcomes": {k: dict(v) for k, v in report.fault_outcomes.items()},
        "examples": report.examples[:5], "inconclusive": result.inconclusive,
        "worker_crashes": [c[:300] for c in result.worker_crashes], "notes": result.notes,
        "elapsed_s": round(result.elapsed_s, 1),
        "all_completed_at_s": _round(result.all_completed_at_s),
        "last_completion_s": _round(result.last_completion_s),
        "claims_under_faults": result.claims_under_faults,
        "machine": {"system": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
    }
