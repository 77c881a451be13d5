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

``--workload lock-set`` runs Jepsen's lock-set workload instead
(:mod:`~consensus_lease.verify.lockset`: a set read and written back under the lease,
5 workers, TTL 2 s, a worker paused 3-5 s every 5 s, 90 s): ``--mode fenced``
(``read_fenced`` / ``write_fenced``) or the ``--mode write-only`` control. Its exit
status: 0 PASS no acknowledged update lost and at least one takeover; 1 FAIL an update
lost (the expected result of the control, and the report says so); 2 INCONCLUSIVE no
loss but no takeover (or a worker crashed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..errors import InvalidArgument
from ..validation import check_wait
from ..worker.command import add_batching_flags
from ..worker.config import flag_type, parse_count, parse_integer, parse_seconds
from .checker import COUNTS, VIOLATIONS
from .destination import LOCK_SET_MODES
from .interrupts import Interrupted
from .lockset import PAUSE_TARGETS, LockSetConfig, LockSetResult, lost_items_text, run_lockset
from .nemesis import CLUSTER_FAULTS, FAULTS, WORKER_FAULTS, parse_faults
from .progress import ProgressBar, StatusLines
from .queue_worker import GRACE_S
from .runner import VerifyConfig, VerifyResult, no_password, run_verify

__all__ = ["EXIT_STATUSES", "NAME", "VERDICTS", "WORKLOADS", "add_parser", "config_from_args",
           "lockset_config_from_args", "lockset_summary", "render", "render_lockset", "run",
           "summary"]

WORKLOADS = ("jobs", "lock-set")
"""``jobs``: the job workload (claim, write each step fenced, complete); ``lock-set``:
Jepsen's lock-set (:mod:`~consensus_lease.verify.lockset`)."""
JOB_DEFAULTS = {"workers": 4, "ttl_s": 1.0, "duration_s": 30.0, "jobs": 100, "steps": 3,
                "quiet_s": 20.0}
LOCK_SET_DEFAULTS = {"workers": 5, "ttl_s": 2.0, "duration_s": 90.0, "pause_every_s": 5.0,
                     "pause_min_s": 3.0, "pause_max_s": 5.0, "pause_target": "random",
                     "mode": "fenced"}
_RUNNER = {"prefetch": "--prefetch", "complete_batch": "--complete-batch",
           "complete_flush_s": "--complete-flush-s"}
_JOB_ONLY = {"jobs": "--jobs", "steps": "--steps", "quiet_s": "--quiet-s", "faults": "--faults",
             "think_s": "--think-s", "runner": "--runner", **_RUNNER}
_LOCK_SET_ONLY = {"pause_every_s": "--pause-every-s", "pause_min_s": "--pause-min-s",
                  "pause_max_s": "--pause-max-s", "pause_target": "--pause-target",
                  "mode": "--mode"}

NAME = "verify"

EXIT_STATUSES = (
    "exit status: 0 PASS: zero violations, every fault kind asked for happened and the "
    "fence was tested (a stale write rejected by the fence, or a stale completion refused "
    "by the store, after a pause-at-check); 1 FAIL: violations; 2 INCONCLUSIVE: no "
    "violation, but a worker crashed, a fault kind never happened, or the fence was never "
    "tested (e.g. --faults pause,skew) -- or the run could not be set up; 128+N: "
    "stopped by signal N (130 SIGINT, 143 SIGTERM), every fault healed and every worker "
    "ended, no verdict. --workload lock-set: 0 PASS: no acknowledged update lost and at "
    "least one takeover; 1 FAIL: an update lost (the expected result of --mode write-only, "
    "the control); 2 INCONCLUSIVE: nothing lost but no takeover happened or a worker "
    "crashed -- or the run could not be set up."
)


def _check_seconds(text: str) -> float:
    """Seconds >= 0 in ASCII, no longer than a thread can wait."""
    return check_wait(parse_seconds(text), "seconds")


_seconds = flag_type(_check_seconds)
_positive_int = flag_type(parse_count)
_seed = flag_type(parse_integer)


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
    parser.add_argument("--workload", choices=WORKLOADS, default="jobs",
                        help="jobs (default): claim, write each step with the token, complete; "
                        "lock-set: Jepsen's lock-set, a set read and written back under the "
                        "lease by every worker in turn, a worker paused past its TTL every "
                        "--pause-every-s")
    parser.add_argument("--workers", type=_positive_int, default=None,
                        help="worker processes (4; lock-set 5)")
    parser.add_argument("--jobs", type=_positive_int, default=None, help="jobs to complete (100)")
    parser.add_argument("--steps", type=_positive_int, default=None, help="effects per job (3)")
    parser.add_argument("--ttl-s", type=_seconds, default=None, help="session TTL, s (1; "
                        "lock-set 2)")
    parser.add_argument("--duration-s", type=_seconds, default=None,
                        help="fault period, s (30; lock-set: the whole run, 90)")
    parser.add_argument("--quiet-s", type=_seconds, default=None,
                        help="longest quiet period after the faults, s (20)")
    parser.add_argument("--seed", type=_seed, default=1, help="derives the fault schedule (1)")
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
    parser.add_argument("--run-dir", metavar="DIR", help="where the run's files go: a new or "
                        "empty directory (default: a new temporary directory); one that "
                        "already holds a run's files (parts/, logs/, history.jsonl, store.db, "
                        "destination.db) is refused, exit status 2: a second run there would "
                        "mix the first one's history into its own")
    parser.add_argument("--until-done", action="store_true", help="end the fault period "
                        "as soon as every job is completed: with a "
                        "long --duration-s, every claim is made under faults")
    runner = parser.add_argument_group(
        "the worker runner (jobs workload): the jobs are a work queue, each worker "
        "process runs consensus_lease.worker.run_worker on it, completions are its own "
        "(batched: complete_many); any of its knobs implies --runner")
    runner.add_argument("--runner", action="store_true", default=None,
                        help="workers drive the worker runner instead of claiming by job id")
    add_batching_flags(runner, grace=f"the runner's {GRACE_S:g} s grace period once the "
                       "verifier stops the workers")
    lock_set = parser.add_argument_group("lock-set workload (--workload lock-set)")
    lock_set.add_argument("--mode", choices=LOCK_SET_MODES, default=None,
                          help="fenced (default): read_fenced / write_fenced; write-only: "
                          "the control, the set read unfenced and only the write fenced "
                          "(it can lose updates: a loss is its expected result)")
    lock_set.add_argument("--pause-every-s", type=_seconds, default=None,
                          help="a pause starts every this many seconds (5)")
    lock_set.add_argument("--pause-min-s", type=_seconds, default=None,
                          help="shortest pause, s (3)")
    lock_set.add_argument("--pause-max-s", type=_seconds, default=None,
                          help="longest pause, s (5)")
    lock_set.add_argument("--pause-target", choices=PAUSE_TARGETS, default=None,
                          help="random (default, Jepsen's): any worker; holder: the worker "
                          "the store shows holding the job (every pause forces a takeover)")
    parser.add_argument("--summary", metavar="PATH", help="also write the verdict, the "
                        "options, the violations, counts and faults as JSON to PATH (a few "
                        "KB, to keep with the results)")
    return parser


def _given(args: argparse.Namespace, names: dict[str, str]) -> list[str]:
    return [flag for name, flag in names.items() if getattr(args, name, None) is not None]


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def config_from_args(args: argparse.Namespace) -> VerifyConfig:
    """Build the job workload's configuration from parsed arguments.

    Raises:
        InvalidArgument: a lock-set option given (``--mode``, ``--pause-*``).
    """
    wrong = _given(args, _LOCK_SET_ONLY)
    if wrong:
        raise InvalidArgument(f"{', '.join(wrong)}: only with --workload lock-set")
    faults = args.faults
    if faults is None:
        faults = WORKER_FAULTS
        if args.backend is None and args.cluster in ("etcd", "zookeeper"):
            faults = WORKER_FAULTS + CLUSTER_FAULTS
    d = JOB_DEFAULTS
    return VerifyConfig(
        backend=args.backend, cluster=args.cluster, workers=_or(args.workers, d["workers"]),
        jobs=_or(args.jobs, d["jobs"]), steps=_or(args.steps, d["steps"]),
        ttl_s=_or(args.ttl_s, d["ttl_s"]), duration_s=_or(args.duration_s, d["duration_s"]),
        quiet_s=_or(args.quiet_s, d["quiet_s"]), seed=args.seed, faults=tuple(faults),
        history=args.history,
        destination=args.destination, unfenced=args.unfenced, think_s=args.think_s,
        run_dir=args.run_dir, until_done=args.until_done,
        runner=bool(args.runner or _given(args, _RUNNER)),
        **{name: getattr(args, name) for name in _RUNNER if getattr(args, name) is not None},
    )


def lockset_config_from_args(args: argparse.Namespace) -> LockSetConfig:
    """Build the lock-set workload's configuration from parsed arguments.

    Raises:
        InvalidArgument: an option of the job workload given (``--jobs``, ``--steps``,
            ``--quiet-s``, ``--faults``, ``--think-s``, ``--unfenced``, ``--until-done``,
            ``--runner`` and its knobs ``--prefetch``, ``--complete-batch``,
            ``--complete-flush-s``).
    """
    wrong = _given(args, _JOB_ONLY) + [flag for name, flag in (
        ("unfenced", "--unfenced"), ("until_done", "--until-done")) if getattr(args, name)]
    if wrong:
        hint = " (the lock-set's control is --mode write-only)" if args.unfenced else ""
        raise InvalidArgument(f"{', '.join(wrong)}: not with --workload lock-set{hint}")
    d = LOCK_SET_DEFAULTS
    return LockSetConfig(
        backend=args.backend, cluster=args.cluster, workers=_or(args.workers, d["workers"]),
        ttl_s=_or(args.ttl_s, d["ttl_s"]), duration_s=_or(args.duration_s, d["duration_s"]),
        pause_every_s=_or(args.pause_every_s, d["pause_every_s"]),
        pause_min_s=_or(args.pause_min_s, d["pause_min_s"]),
        pause_max_s=_or(args.pause_max_s, d["pause_max_s"]),
        pause_target=_or(args.pause_target, d["pause_target"]), mode=_or(args.mode, d["mode"]),
        seed=args.seed, destination=args.destination, history=args.history,
        run_dir=args.run_dir,
    )


def render_lockset(result: LockSetResult, console: Console) -> None:
    """Print the lock-set's counts, where it ran and the verdict."""
    report, config = result.report, result.config
    how = "the write-only-fenced control" if result.control else "read_fenced / write_fenced"
    table = Table(title=f"lock-set, {config.mode} ({how})")
    table.add_column("count")
    table.add_column("value", justify="right")
    for name, value in (
        ("acknowledged updates", report.acknowledged),
        ("in the final set", report.in_final_set),
        ("lost (acknowledged, not in the final set)", len(report.lost)),
        ("pauses", report.pauses),
        ("takeovers (claimed before its holder released it)", report.takeovers),
        ("claims", report.claims),
        ("fenced reads refused", report.reads_refused),
        ("write-backs refused", report.writes_refused),
        ("releases that found the lease lost", report.leases_lost),
        ("in the set, never acknowledged", report.unacknowledged_in_set),
    ):
        table.add_row(name, str(value))
    console.print(table)
    console.print(f"[bold]store[/]       {no_password(result.store_url)}", highlight=False)
    console.print(f"[bold]destination[/] {no_password(result.destination)}", highlight=False)
    console.print(f"[bold]history[/]     {result.history_path}", highlight=False)
    console.print(f"[bold]run dir[/]     {result.run_dir}", highlight=False)
    console.print(f"[bold]duration[/]    {result.elapsed_s:.1f} s; {config.workers} workers, "
                  f"TTL {config.ttl_s} s, pauses of {config.pause_min_s}-{config.pause_max_s} "
                  f"s every {config.pause_every_s} s ({config.pause_target} worker)",
                  highlight=False)
    for crash in result.worker_crashes:
        console.print(f"[red]worker crashed:[/] {crash}", highlight=False)
    status = result.exit_status
    if status == 1:
        console.print(f"[bold red]FAIL: {len(report.lost)} acknowledged update(s) lost: "
                      f"{lost_items_text(report.lost)}.[/]", highlight=False)
        if result.control:
            console.print("[yellow]expected: this is the write-only-fenced control. Fencing "
                          "only the write does not protect a read-modify-write: a paused "
                          "holder's write-back landed after the new holder's read, and the "
                          "new holder's write-back dropped it (docs/model.md, the "
                          "write-only-fenced mutation). --mode fenced must lose nothing.[/]")
    elif status == 0:
        console.print(f"[bold green]PASS: no acknowledged update lost ({report.takeovers} "
                      f"takeover(s), {report.reads_refused + report.writes_refused} late "
                      "read(s) or write-back(s) refused).[/]")
        if result.control:
            console.print("[yellow]note: the write-only-fenced control lost nothing this "
                          "time: its loss needs a paused holder's write-back to land between "
                          "a newer holder's read and that holder's own write-back, a narrow "
                          "window; the model checker finds it in 15 steps (docs/model.md, "
                          "write-only-fenced). Losses are its expected result.[/]")
    else:
        console.print("[bold yellow]INCONCLUSIVE: no update lost, but the run proves "
                      "nothing:[/]")
        for reason in result.inconclusive:
            console.print(f"  [yellow]-[/] {reason}", highlight=False)


def lockset_summary(result: LockSetResult) -> dict[str, Any]:
    """A lock-set run as JSON (``--summary``): verdict and exit status, the options, the
    accounting (:class:`~consensus_lease.verify.lockset.LockSetReport`, the lost items
    capped at 50) and the machine."""
    report = result.report
    counts = {k: v for k, v in asdict(report).items() if k != "lost"}
    return {
        "workload": "lock-set", "verdict": VERDICTS.get(result.exit_status, "?"),
        "exit_status": result.exit_status,
        "expected": "FAIL or PASS (the control: a loss is expected)" if result.control
        else "PASS",
        "options": {**asdict(result.config), "backend": no_password(result.config.backend),
                    "destination": no_password(result.config.destination)},
        "store": no_password(result.store_url),
        "destination": no_password(result.destination),
        **counts, "lost": len(report.lost), "lost_items": report.lost[:50],
        "inconclusive": result.inconclusive,
        "worker_crashes": [c[:300] for c in result.worker_crashes],
        "elapsed_s": round(result.elapsed_s, 1),
        "machine": {"system": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
    }


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
    """Run ``consensus-lease verify``; returns the exit status (:data:`EXIT_STATUSES`).

    Raises:
        InvalidArgument: options that do not go together (e.g. ``--mode`` without
            ``--workload lock-set``), or bad values (see :func:`run_verify`,
            :func:`~consensus_lease.verify.lockset.run_lockset`).
    """
    def say(message: str) -> None:
        console.print(f"[dim]{message}[/]", highlight=False)

    if getattr(args, "workload", "jobs") == "lock-set":
        return _run_lockset(args, console, say)
    config = config_from_args(args)

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


def _run_lockset(args: argparse.Namespace, console: Console,
                 say: Callable[[str], None]) -> int:
    config = lockset_config_from_args(args)
    try:
        if _wants_bar(console):
            with ProgressBar(console) as bar:
                result = run_lockset(config, progress=say, watch=bar)
        else:
            result = run_lockset(config, progress=say, watch=StatusLines(say))
    except Interrupted as stopped:
        console.print(f"[yellow]{stopped}: every pause healed, every worker stopped; no "
                      "verdict[/]", highlight=False)
        return stopped.exit_status
    render_lockset(result, console)
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(json.dumps(lockset_summary(result), indent=2) + "\n",
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
