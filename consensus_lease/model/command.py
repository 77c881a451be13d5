"""``consensus-lease model-check``: the exhaustive check, deeper than CI runs it.

Registered through ``consensus_lease.cli.EXTRA_COMMANDS``. Without arguments it runs
:data:`DEEP`: each configuration to its depth with a progress bar (rich), then every
mutation (:mod:`.mutations`), which must each be caught. ``--workers`` (with
``--depth``, the fault switches and ``--mutation``, which need it) checks one
configuration instead. Exit status 0: no violation and every mutation caught (with
``--mutation``: the configuration's counterexample found, as it must be); 1: a violation
(its shortest counterexample printed as a timeline) or a mutation not caught; 2: options
that need ``--workers`` given without it. Off a terminal, progress is a line per depth.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..errors import InvalidArgument
from .checker import CheckResult, check, format_timeline
from .mutations import CASES, FULL, LEAN, run_case
from .protocol import Config
from .store import Mutation

__all__ = ["CI", "DEEP", "NAME", "add_parser", "run"]

NAME = "model-check"

CI: tuple[tuple[str, Config, int], ...] = (
    ("2 workers, every fault", FULL, 12),
    ("3 workers, every fault", dataclasses.replace(FULL, workers=3), 9),
    ("2 workers, read-modify-write, no loss/duplication",
     dataclasses.replace(LEAN, rmw=True), 12),
)
"""What the unit tests check (tests/unit/test_model.py): name, configuration, depth."""

DEEP: tuple[tuple[str, Config, int], ...] = (
    ("2 workers, every fault", FULL, 13),
    ("3 workers, every fault", dataclasses.replace(FULL, workers=3), 11),
    ("2 workers, read-modify-write, every fault", dataclasses.replace(FULL, rmw=True), 12),
    ("2 workers, read-modify-write, no loss/duplication",
     dataclasses.replace(LEAN, rmw=True), 15),
)
"""What ``consensus-lease model-check`` (``make model-check``) checks by default."""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        NAME,
        help="model-check the lease protocol exhaustively (docs/model.md)",
        description="Explore every reachable state of the protocol model up to a depth "
        "and check its invariants; then check that every mutation is caught. Exit 0 if "
        "no violation was found and every mutation was caught, else 1.",
    )
    parser.add_argument("--workers", type=_bounded(1, 6),
                        help="check one configuration: N workers (1-6)")
    parser.add_argument("--depth", type=_bounded(1, 100),
                        help="with --workers: steps explored (default 12)")
    parser.add_argument("--rmw", action="store_true",
                        help="with --workers: the read-modify-write client")
    parser.add_argument("--no-loss", action="store_true", help="with --workers: no loss")
    parser.add_argument("--no-duplication", action="store_true",
                        help="with --workers: no duplicated messages")
    parser.add_argument("--mutation", choices=[m.value for m in Mutation], action="append",
                        default=[], help="with --workers: switch this rule off (repeatable); "
                        "the check must then find a counterexample")
    parser.add_argument("--skip-mutations", action="store_true",
                        help="do not check the mutations")


def _bounded(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        from ..worker.config import flag_type, parse_integer

        value = flag_type(parse_integer)(text)  # ASCII digits, as every command's flags
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low}..{high}, got {value}")
        return value
    return parse


def _configs(args: argparse.Namespace) -> tuple[tuple[str, Config, int], ...]:
    """The configurations to check: :data:`DEEP`, or the one ``--workers`` describes.

    Raises:
        InvalidArgument: an option of ``--workers`` given without it.
    """
    if args.workers is None:
        given = [flag for flag, value in (
            ("--depth", args.depth is not None), ("--rmw", args.rmw),
            ("--no-loss", args.no_loss), ("--no-duplication", args.no_duplication),
            ("--mutation", bool(args.mutation))) if value]
        if given:
            raise InvalidArgument(f"{', '.join(given)} describe(s) one configuration: "
                                  "give --workers N with it (without, the default "
                                  "configurations run, and they would be ignored)")
        return DEEP
    config = dataclasses.replace(FULL, workers=args.workers, rmw=args.rmw,
                                 loss=not args.no_loss, duplication=not args.no_duplication)
    for name in args.mutation:
        config = config.with_mutation(Mutation(name))
    depth = 12 if args.depth is None else args.depth
    return ((f"{args.workers} workers", config, depth),)


def _checked(name: str, config: Config, depth: int, console: Any) -> CheckResult:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("depth, {task.fields[states]:,} states"))
    if not console.is_terminal:  # a CI log or a pipe: a line per depth, no bar
        return check(config, depth, lambda d, n, _f: console.print(
            f"{name}: depth {d}/{depth}, {n:,} states", highlight=False))
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(name, total=depth, states=0)
        result = check(config, depth, lambda d, n, _f: bar.update(task, completed=d,
                                                                  states=n))
    return result


def run(args: argparse.Namespace, console: Any) -> int:
    ok = True
    for name, config, depth in _configs(args):
        result = _checked(name, config, depth, console)
        reach = "every reachable state" if result.exhausted else f"depth {result.depth}"
        if args.mutation:  # the rules switched off must let the checker find a violation
            verdict = ("counterexample found, as it must be with --mutation"
                       if result.trace else "NO counterexample: the mutation was not caught")
            ok = ok and bool(result.trace)
        else:
            verdict = "VIOLATION" if result.trace else "0 violations"
            ok = ok and not result.trace
        console.print(f"{name}: {result.states:,} states, {reach}, "
                      f"{result.transitions:,} transitions, {result.seconds:.1f} s: "
                      f"{verdict}", highlight=False)
        if result.trace:
            console.print(format_timeline(result.trace), highlight=False, markup=False)
    if args.skip_mutations:
        return 0 if ok else 1
    for case in CASES:
        result = run_case(case)
        caught = case.breaks in result.violation
        ok = ok and caught
        console.print(f"mutation {case.mutation.value}: "
                      f"{'caught' if caught else 'NOT CAUGHT'} in {len(result.trace)} steps "
                      f"({result.states:,} states, {result.seconds:.1f} s): "
                      f"{result.violation or '-'}", highlight=False, markup=False)
    return 0 if ok else 1
