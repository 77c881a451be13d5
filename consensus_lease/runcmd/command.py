"""``consensus-lease run``: run a command only while holding the lease on a job.

For a cron job installed on N machines that must run on one: each machine runs
``consensus-lease run --backend URL --job nightly-report -- ./report.sh``; one claims the
job and runs the command, the others exit 75 without running it.

The command runs in a process group of its own with the fencing token in its environment
(``CONSENSUS_LEASE_TOKEN``, plus ``CONSENSUS_LEASE_JOB_ID``, ``CONSENSUS_LEASE_ATTEMPT``,
``CONSENSUS_LEASE_OWNER``): send the token with every effect to a fenced destination.

The guarantee: the command's process group is SIGKILLed *before* the lease's local
deadline, so it is dead before the store can hand the job to anyone else, even when this
runner is paused (SIGSTOP, a frozen VM). A separate guard process, not paused with the
runner, starts the command and kills its group on a schedule it knows in advance; the
runner passes each renewed deadline on to it (see :mod:`.guard`, :mod:`.supervisor` and
:class:`.supervisor.Budget` for the timing). What it cannot cover: processes that leave
the command's process group (``setsid``, daemonizing) and effects already sent before the
kill, which the destination must fence with the token.

Registered through ``consensus_lease.cli.EXTRA_COMMANDS``: ``NAME``, ``add_parser``, ``run``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from rich.console import Console

from ..admin import shared
from ..errors import (
    BackendUnavailable,
    ClaimTimeout,
    InvalidArgument,
    JobCompleted,
    JobFailed,
    LeaseError,
    LeaseLost,
    LeaseNotHeld,
)
from ..lease import Lease
from ..record import JobState
from ..session import Session
from ..states import LeaseState
from ..store import DEFAULT_TTL_S, LeaseStore, open_store
from ..validation import check_job_id, check_retry_in
from .supervisor import Budget, GuardProcess, Outcome, Wakeup, forwarded_signals, supervise

__all__ = [
    "EXIT_LEASE_LOST", "EXIT_NOT_ACQUIRED", "EXIT_NOT_RUNNABLE", "EXIT_SOFTWARE",
    "EXIT_UNAVAILABLE", "EXIT_USAGE", "NAME", "add_parser", "child_env", "run", "run_command",
    "stopped_status",
]

NAME = "run"

EXIT_USAGE = 64
"""Bad arguments or options (sysexits EX_USAGE); nothing was claimed."""
EXIT_NOT_RUNNABLE = 65
"""The job is COMPLETED or FAILED (a dead letter): it is never run again as it is."""
EXIT_UNAVAILABLE = 69
"""The store could not be reached or refused service (EX_UNAVAILABLE)."""
EXIT_SOFTWARE = 70
"""The guard process failed (EX_SOFTWARE); the command was killed."""
EXIT_NOT_ACQUIRED = 75
"""The lease was not acquired (EX_TEMPFAIL): held elsewhere, or in its retry delay."""
EXIT_LEASE_LOST = 76
"""The lease was lost while the command ran (it was stopped), or its completion or
failure could not be recorded because the lease was lost."""

EXIT_CODES_HELP = f"""\
exit status:
  N     the command's own status (128+S if killed by signal S; 126/127 if it could not
        be executed/found); with --complete, 0 only once the completion is recorded
  {EXIT_USAGE}    usage error; nothing was claimed
  {EXIT_NOT_RUNNABLE}    the job is completed or failed (dead letter); not run
  {EXIT_UNAVAILABLE}    the store is unreachable or refused service
  {EXIT_SOFTWARE}    the deadline guard failed; the command was killed
  {EXIT_NOT_ACQUIRED}    the lease was not acquired (at once, or within --wait-s); not run
  {EXIT_LEASE_LOST}    the lease was lost: the command was stopped, or its outcome not recorded
  130/143/129  the runner got SIGINT/SIGTERM/SIGHUP: command stopped, job released

timing, with granted TTL T and safety margin m = T/10: the lease's local deadline D is
the send time of the last renewal + T - m (renewals every T/3). If no renewal arrives,
the command's process group gets SIGTERM at D - k - grace and SIGKILL at D - k
(k = min(0.25 s, T/20)); the store hands the job to another runner no earlier than
D + m. A separate guard process carries this out, so it holds while the runner is
paused (SIGSTOP). When the command's first process exits, the rest of its process group
is killed. Environment of the command: CONSENSUS_LEASE_TOKEN (the fencing token),
CONSENSUS_LEASE_JOB_ID, CONSENSUS_LEASE_ATTEMPT, CONSENSUS_LEASE_OWNER.
"""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """The checked options of one ``run``."""

    backend: str
    job: str
    command: tuple[str, ...]
    ttl_s: float
    wait_s: float | None
    grace_s: float | None
    complete: bool
    fail_on_error: bool
    retry_in_s: float | None


def _seconds(text: str) -> float:
    """Seconds >= 0 in ASCII, as every command's flags take them, no longer than a thread
    can wait."""
    from ..validation import check_wait
    from ..worker.config import flag_type, parse_seconds

    return flag_type(lambda t: check_wait(parse_seconds(t), "seconds"))(text)


def _usage_exits_64(parser: argparse.ArgumentParser) -> None:
    """Make ``parser``'s usage errors exit 64 (argparse exits 2, a common status of the
    commands this one wraps)."""

    def error(message: str) -> NoReturn:
        parser.print_usage(sys.stderr)
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: {message}\n")

    parser.error = error  # type: ignore[method-assign]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``run`` subcommand to ``subparsers``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="run a command only while holding the lease on a job",
        description="Claim the lease on JOB and run COMMAND while it is held, with the\n"
        "fencing token in its environment. If the lease is lost, the command's process\n"
        "group is stopped (SIGTERM, then SIGKILL) before the lease's local deadline, even\n"
        "if this runner is paused. Not acquired: exit 75, the command does not run.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _usage_exits_64(parser)
    parser.add_argument("--backend", metavar="URL", required=True, help="store URL")
    parser.add_argument("--job", metavar="NAME", required=True, help="the job's id")
    parser.add_argument("--ttl-s", type=_seconds, default=DEFAULT_TTL_S,
                        help=f"session TTL, s (default {DEFAULT_TTL_S:g})")
    parser.add_argument("--wait-s", type=_seconds, default=None,
                        help="wait up to this long for the lease (default: try once)")
    parser.add_argument("--grace-s", type=_seconds, default=None,
                        help="SIGTERM to SIGKILL when the lease is lost, s (default TTL/4, at "
                        "most 10; at most TTL/2 - margins)")
    parser.add_argument("--complete", action="store_true",
                        help="mark the job completed when the command exits 0 (it is then "
                        "never run again); otherwise the job is released")
    parser.add_argument("--fail-on-error", action="store_true",
                        help="record a non-zero exit as a failed attempt (lease.fail): the job "
                        "waits its retry delay, or becomes FAILED once its attempts ran out")
    parser.add_argument("--retry-in-s", type=_seconds, default=None,
                        help="with --fail-on-error: retry delay, s (default: the store's "
                        "retry policy, 1 s doubling per attempt, at most 300 s)")
    # dest is not "command": the cli package's subparsers use that name for the subcommand.
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG ...]",
                        help="the command to run")
    return parser


def _options(args: argparse.Namespace) -> RunOptions:
    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise InvalidArgument("no command given: run ... -- COMMAND [ARG ...]")
    if args.retry_in_s is not None and not args.fail_on_error:
        raise InvalidArgument("--retry-in-s needs --fail-on-error")
    if args.ttl_s <= 0:
        raise InvalidArgument(f"--ttl-s must be > 0, got {args.ttl_s:g}")
    if args.retry_in_s is not None:
        check_retry_in(args.retry_in_s)
    return RunOptions(
        backend=args.backend, job=check_job_id(args.job), command=tuple(command),
        ttl_s=args.ttl_s, wait_s=args.wait_s, grace_s=args.grace_s, complete=args.complete,
        fail_on_error=args.fail_on_error, retry_in_s=args.retry_in_s,
    )


def _say(message: str) -> None:
    print(f"consensus-lease run: {message}", file=sys.stderr, flush=True)


def child_env(lease: Lease, base: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment: ``base`` (default ``os.environ``) plus the lease's
    ``CONSENSUS_LEASE_TOKEN`` (generation), ``_JOB_ID``, ``_ATTEMPT`` and ``_OWNER``."""
    env = dict(os.environ if base is None else base)
    env["CONSENSUS_LEASE_TOKEN"] = str(lease.generation)
    env["CONSENSUS_LEASE_JOB_ID"] = lease.job_id
    env["CONSENSUS_LEASE_ATTEMPT"] = str(lease.attempt)
    env["CONSENSUS_LEASE_OWNER"] = lease.owner
    return env


def _not_acquired(store: LeaseStore, job: str, why: str) -> int:
    try:
        record = store.get(job)
    except LeaseError:
        record = None
    if record is not None and record.state is JobState.HELD:
        why = f"held by {record.owner} (generation {record.generation})"
    elif record is not None and record.not_before is not None:
        why = "waiting for the retry delay of its last failed attempt"
    _say(f"lease on {job!r} not acquired: {why}; not run")
    return EXIT_NOT_ACQUIRED


def _claim(store: LeaseStore, session: Session, opts: RunOptions) -> Lease | int:
    """The lease, or the exit status when there is none."""
    try:
        lease = session.claim(opts.job, wait_s=opts.wait_s)
    except ClaimTimeout:
        return _not_acquired(store, opts.job, f"still held after {opts.wait_s:g} s")
    except JobCompleted:
        _say(f"job {opts.job!r} is completed; not run")
        return EXIT_NOT_RUNNABLE
    except JobFailed as exc:
        _say(f"job {opts.job!r} is failed (attempts used up; requeue it to run it again): "
             f"{exc.error or exc}; not run")
        return EXIT_NOT_RUNNABLE
    except LeaseNotHeld as exc:
        _say(f"lease on {opts.job!r} not acquired: {exc}; not run")
        return EXIT_NOT_ACQUIRED
    if lease is None:
        return _not_acquired(store, opts.job, "held by another worker")
    return lease


def run_command(
    session: Session, lease: Lease, command: Sequence[str], env: dict[str, str], budget: Budget
) -> Outcome:
    """Run ``command`` with ``env`` under the deadline guard while ``lease`` is held
    (also ``consensus-lease elect``'s); return how it ended."""
    wake = Wakeup()
    unregister = session.on_lost(lambda _session, _reason: wake.set("lost"))
    try:
        with forwarded_signals(wake):
            try:
                guard = GuardProcess(command, env, lease.deadline, budget)
            except OSError as exc:
                return Outcome(status=None, stopped="guard-failed", detail=str(exc))
            try:
                outcome = supervise(lease, guard, budget, wake)
            finally:
                guard.close()
    finally:
        unregister()
        wake.close()
    if outcome.stopped == "term" and wake.signum is not None:
        return Outcome(status=128 + wake.signum, stopped="term")
    return outcome


def _release_quietly(lease: Lease) -> None:
    try:
        lease.release()
    except LeaseError as exc:
        _say(f"releasing {lease.job_id!r} failed ({type(exc).__name__}: {exc}); the store "
             "frees it when the session's TTL ends")


def _stopped(lease: Lease, outcome: Outcome) -> int:
    if lease.state is not LeaseState.LOST:  # e.g. renewal late but not lost: hand it back
        _release_quietly(lease)
    return stopped_status(outcome, f"lease on {lease.job_id!r}", lease.generation,
                          f"{lease.job_id!r} released")


def stopped_status(outcome: Outcome, what: str, generation: int, handed_back: str) -> int:
    """The exit status (and message) of a command the runner stopped: interrupted
    (SIGINT/SIGTERM/SIGHUP to the runner), the deadline guard failed, or ``what`` (the
    lease or leadership, at ``generation``) was lost. Shared by ``run`` and ``elect``."""
    if outcome.stopped == "term":
        _say(f"interrupted: command stopped, {handed_back}")
        return outcome.status or 1
    if outcome.stopped == "guard-failed":
        _say(f"the deadline guard failed ({outcome.detail or 'it died'}); command killed")
        return EXIT_SOFTWARE
    reasons = {"deadline": "no renewal in time", "lost": "the session was lost",
               "eof": "the guard lost the runner"}
    _say(f"{what} generation {generation} lost "
         f"({reasons.get(outcome.stopped or '', outcome.stopped)}): command stopped before "
         "its local deadline")
    return EXIT_LEASE_LOST


def _record(lease: Lease, status: int, opts: RunOptions) -> int:
    """Complete, fail or release the lease after the command ended by itself."""
    recording = (status == 0 and opts.complete) or (status != 0 and opts.fail_on_error)
    try:
        if status == 0 and opts.complete:
            lease.complete()
        elif status != 0 and opts.fail_on_error:
            what = f"exit status {status}" if status < 128 else f"signal {status - 128}"
            record = lease.fail(f"command ended with {what}", opts.retry_in_s)
            if record.state is JobState.FAILED:
                _say(f"job {lease.job_id!r} is now failed: attempts used up")
        else:
            lease.release()
    except LeaseLost as exc:
        if not recording:
            _say(f"the command ended under the lease, but releasing it failed: {exc}")
            return status
        _say(f"the lease was lost before the outcome was recorded: {exc}")
        return EXIT_LEASE_LOST
    except BackendUnavailable as exc:
        if not recording:
            _say(f"releasing {lease.job_id!r} failed ({exc}); the store frees it at TTL end")
            return status
        _say(f"recording the outcome failed ({type(exc).__name__}: {exc})")
        return EXIT_UNAVAILABLE
    return status


def _finish(lease: Lease, outcome: Outcome, opts: RunOptions) -> int:
    if outcome.stopped is not None or outcome.status is None:
        return _stopped(lease, outcome)
    if outcome.detail:
        _say(f"cannot run {opts.command[0]!r}: {outcome.detail}")
    return _record(lease, outcome.status, opts)


def _run(opts: RunOptions) -> int:
    with shared(open_store(opts.backend)) as store, \
            store.session(ttl_s=opts.ttl_s) as session:
        budget = Budget.for_session(session.granted_ttl_s, session.safety_margin_s,
                                    opts.grace_s)
        lease = _claim(store, session, opts)
        if isinstance(lease, int):
            return lease
        outcome = run_command(session, lease, opts.command, child_env(lease), budget)
        return _finish(lease, outcome, opts)


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run the ``run`` subcommand; return its exit status (see ``EXIT_CODES_HELP``).
    Messages go to stderr: stdout belongs to the command. Never raises a LeaseError."""
    try:
        return _run(_options(args))
    except InvalidArgument as exc:
        _say(f"{type(exc).__name__}: {exc}")
        return EXIT_USAGE
    except (JobCompleted, JobFailed) as exc:
        _say(f"{type(exc).__name__}: {exc}")
        return EXIT_NOT_RUNNABLE
    except LeaseError as exc:
        _say(f"{type(exc).__name__}: {exc}")
        return EXIT_UNAVAILABLE

