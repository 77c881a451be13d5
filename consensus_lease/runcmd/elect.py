"""``consensus-lease elect``: run a command only while leader of an election.

For a singleton service installed on N machines: each runs ``consensus-lease elect
scheduler --backend URL --wait-s 3600 -- ./scheduler``; one becomes the leader and runs
the command, the others wait to take over (any of them may win: handover is unordered).

A mode of ``consensus-lease run`` (:mod:`.command`): the same deadline guard process, the
same kill schedule, the same exit statuses, with two differences: it campaigns for the
election instead of claiming a job, and it never completes anything: when the command
ends by itself, the runner resigns (another candidate may lead at once) and exits with
the command's status. The command's environment carries ``CONSENSUS_LEASE_TOKEN`` (the
leader's fencing token), ``CONSENSUS_LEASE_ELECTION``, ``CONSENSUS_LEASE_VALUE`` and
``CONSENSUS_LEASE_OWNER``.

Registered through ``consensus_lease.cli.EXTRA_COMMANDS``: ``NAME``, ``add_parser``, ``run``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from ..admin import shared
from ..election import Leadership
from ..errors import (
    ClaimTimeout,
    InvalidArgument,
    LeaseError,
    LeaseNotHeld,
    UnsupportedOperation,
)
from ..session import Session
from ..states import LeaseState
from ..store import DEFAULT_TTL_S, LeaseStore, open_store
from ..validation import check_election_name
from .command import (
    EXIT_LEASE_LOST,
    EXIT_NOT_ACQUIRED,
    EXIT_SOFTWARE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    _seconds,
    _usage_exits_64,
    run_command,
    stopped_status,
)
from .supervisor import Budget, Outcome

__all__ = ["NAME", "add_parser", "leader_env", "run"]

NAME = "elect"

EXIT_CODES_HELP = f"""\
exit status:
  N     the command's own status (128+S if killed by signal S; 126/127 if it could not
        be executed/found); the runner then resigns
  {EXIT_USAGE}    usage error, or a store without elections; no campaign
  {EXIT_UNAVAILABLE}    the store is unreachable or refused service
  {EXIT_SOFTWARE}    the deadline guard failed; the command was killed
  {EXIT_NOT_ACQUIRED}    not the leader (at once, or within --wait-s); not run
  {EXIT_LEASE_LOST}    the leadership was lost: the command was stopped before its deadline
  130/143/129  the runner got SIGINT/SIGTERM/SIGHUP: command stopped, resigned

timing: as `consensus-lease run` (see its --help): the command's process group is
SIGKILLed before the leadership's local deadline, by a guard process that is not paused
with the runner. Environment of the command: CONSENSUS_LEASE_TOKEN (the fencing token),
CONSENSUS_LEASE_ELECTION, CONSENSUS_LEASE_VALUE, CONSENSUS_LEASE_OWNER.
"""


@dataclass(frozen=True, slots=True)
class ElectOptions:
    """The checked options of one ``elect``."""

    backend: str
    name: str
    value: str
    command: tuple[str, ...]
    ttl_s: float
    wait_s: float | None
    grace_s: float | None


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``elect`` subcommand to ``subparsers``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="run a command only while leader of an election",
        description="Campaign for the election NAME and run COMMAND while leader, with the\n"
        "fencing token in its environment. If the leadership is lost, the command's process\n"
        "group is stopped (SIGTERM, then SIGKILL) before its local deadline, even if this\n"
        "runner is paused. When the command ends, the runner resigns. Not the leader: exit\n"
        "75, the command does not run.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s NAME --backend URL [--value TEXT] [--ttl-s S] [--wait-s S] "
        "[--grace-s S] -- COMMAND [ARG ...]",
    )
    _usage_exits_64(parser)
    _command_after_dashes(parser)
    parser.add_argument("name", metavar="NAME", help="the election's name")
    parser.add_argument("--backend", metavar="URL", required=True, help="store URL")
    parser.add_argument("--value", metavar="TEXT", default="",
                        help="what the leader announces (store.leader(NAME).value, UTF-8)")
    parser.add_argument("--ttl-s", type=_seconds, default=DEFAULT_TTL_S,
                        help=f"session TTL, s (default {DEFAULT_TTL_S:g})")
    parser.add_argument("--wait-s", type=_seconds, default=None,
                        help="wait up to this long to become the leader (default: try once)")
    parser.add_argument("--grace-s", type=_seconds, default=None,
                        help="SIGTERM to SIGKILL when the leadership is lost, s (default TTL/4, "
                        "at most 10; at most TTL/2 - margins)")
    return parser


def _command_after_dashes(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` take everything after the first ``--`` as the command
    (``args.argv``), parsing only what comes before: argparse cannot have a positional
    NAME before options and a ``REMAINDER`` after them."""
    parse = parser.parse_known_args

    def parse_known_args(
        args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        cut = words.index("--") if "--" in words else len(words)
        parsed, extra = parse(words[:cut], namespace)
        parsed.argv = words[cut + 1:]
        return parsed, extra

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign,assignment]


def _options(args: argparse.Namespace) -> ElectOptions:
    command = list(args.argv)
    if not command:
        raise InvalidArgument("no command given: elect NAME ... -- COMMAND [ARG ...]")
    if args.ttl_s <= 0:
        raise InvalidArgument(f"--ttl-s must be > 0, got {args.ttl_s:g}")
    return ElectOptions(
        backend=args.backend, name=check_election_name(args.name), value=args.value,
        command=tuple(command), ttl_s=args.ttl_s, wait_s=args.wait_s, grace_s=args.grace_s,
    )


def _say(message: str) -> None:
    print(f"consensus-lease elect: {message}", file=sys.stderr, flush=True)


def leader_env(leadership: Leadership, base: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment: ``base`` (default ``os.environ``) plus the leader's
    ``CONSENSUS_LEASE_TOKEN`` (generation), ``_ELECTION``, ``_VALUE`` and ``_OWNER``."""
    env = dict(os.environ if base is None else base)
    env["CONSENSUS_LEASE_TOKEN"] = str(leadership.generation)
    env["CONSENSUS_LEASE_ELECTION"] = leadership.name
    env["CONSENSUS_LEASE_VALUE"] = leadership.value.decode("utf-8", "replace")
    env["CONSENSUS_LEASE_OWNER"] = leadership.owner
    return env


def _not_leader(store: LeaseStore, name: str, why: str) -> int:
    try:
        leader = store.leader(name)
    except LeaseError:
        leader = None
    if leader is not None:
        why = f"led by {leader.owner} (generation {leader.generation})"
    _say(f"not the leader of {name!r}: {why}; not run")
    return EXIT_NOT_ACQUIRED


def _campaign(store: LeaseStore, session: Session, opts: ElectOptions) -> Leadership | int:
    """The leadership, or the exit status when there is none."""
    try:
        leadership = session.campaign(opts.name, os.fsencode(opts.value), wait_s=opts.wait_s)
    except ClaimTimeout:
        return _not_leader(store, opts.name, f"still led by another after {opts.wait_s:g} s")
    except LeaseNotHeld as exc:
        _say(f"not the leader of {opts.name!r}: {exc}; not run")
        return EXIT_NOT_ACQUIRED
    if leadership is None:
        return _not_leader(store, opts.name, "led by another candidate")
    return leadership


def _resign_quietly(leadership: Leadership) -> None:
    try:
        leadership.resign()
    except LeaseError as exc:
        _say(f"resigning {leadership.name!r} failed ({type(exc).__name__}: {exc}); the store "
             "ends the leadership when the session's TTL ends")


def _finish(leadership: Leadership, outcome: Outcome, opts: ElectOptions) -> int:
    """Resign (unless lost) and turn how the command ended into the exit status."""
    if leadership.state is not LeaseState.LOST:
        _resign_quietly(leadership)
    if outcome.stopped is None and outcome.status is not None:
        if outcome.detail:
            _say(f"cannot run {opts.command[0]!r}: {outcome.detail}")
        return outcome.status
    return stopped_status(outcome, f"leadership of {opts.name!r}", leadership.generation,
                          f"resigned from {opts.name!r}")


def _elect(opts: ElectOptions) -> int:
    with shared(open_store(opts.backend)) as store, \
            store.session(ttl_s=opts.ttl_s) as session:
        budget = Budget.for_session(session.granted_ttl_s, session.safety_margin_s,
                                    opts.grace_s)
        leadership = _campaign(store, session, opts)
        if isinstance(leadership, int):
            return leadership
        outcome = run_command(session, leadership, opts.command, leader_env(leadership),
                              budget)
        return _finish(leadership, outcome, opts)


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run the ``elect`` subcommand; return its exit status (see ``EXIT_CODES_HELP``).
    Messages go to stderr: stdout belongs to the command. Never raises a LeaseError."""
    try:
        return _elect(_options(args))
    except (InvalidArgument, UnsupportedOperation) as exc:
        _say(f"{type(exc).__name__}: {exc}")
        return EXIT_USAGE
    except LeaseError as exc:
        _say(f"{type(exc).__name__}: {exc}")
        return EXIT_UNAVAILABLE
