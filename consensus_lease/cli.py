"""The ``consensus-lease`` command."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from .errors import LeaseError
from .record import JobState
from .store import open_store

__all__ = ["main"]

EXTRA_COMMANDS: list[str] = [
    "consensus_lease.verify.command",
    "consensus_lease.bench.command",
    "consensus_lease.worker.command",
]
"""Modules providing further subcommands (see ``_command_modules``)."""


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="consensus-lease",
        description="Expiring job leases with fencing tokens on etcd, ZooKeeper and SQLite.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo",
        help="the worked example with two real worker processes",
        description="Worker A claims a job and is paused past its TTL; B takes over with a "
        "newer generation; A's loss, stale completion and late write must all be rejected. "
        "Exit 0 only if they were.",
    )
    demo.add_argument("--backend", metavar="URL",
                      help="store URL (default: a temporary SQLite file)")
    demo.add_argument("--ttl-s", type=_positive_seconds, default=2.0,
                      help="session TTL in seconds (default 2)")
    demo.add_argument("--unfenced", action="store_true",
                      help="destination does not check tokens: the demo must then FAIL")

    inspect = sub.add_parser("inspect", help="show lease records")
    inspect.add_argument("--backend", metavar="URL", required=True, help="store URL")
    inspect.add_argument("jobs", nargs="*", metavar="JOB", help="only these jobs")
    inspect.add_argument("--limit", type=int, default=1000, help="at most this many records")
    inspect.add_argument("--queue", action="append", default=[], metavar="QUEUE",
                         help="show this work queue's counts instead (repeatable)")
    for module in _command_modules():
        module.add_parser(sub)
    return parser


def _command_modules() -> list[Any]:
    """Subcommands that live in their own modules. Each has ``NAME``,
    ``add_parser(subparsers)`` and ``run(args, console) -> int``."""
    import importlib

    modules = []
    for name in EXTRA_COMMANDS:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists but needs something missing
                raise
    return modules


def _inspect_queues(url: str, queues: Sequence[str], console: Console) -> int:
    with open_store(url) as store:
        stats = [store.queue_stats(q) for q in queues]
    table = Table(title=f"work queues in {url}")
    for col in ("queue", "available", "held", "completed", "oldest held lease ends in (s)"):
        table.add_column(col)
    now = time.time()  # display only: lease_until is on the store's clock
    for s in stats:
        end = s.oldest_held_lease_until
        ends = "-" if end is None else f"{end - now:.1f}"
        table.add_row(s.queue, str(s.available), str(s.held), str(s.completed), ends)
    console.print(table)
    return 0


def _inspect(url: str, jobs: Sequence[str], limit: int, console: Console) -> int:
    with open_store(url) as store:
        if jobs:
            found = [(j, store.get(j)) for j in jobs]
        else:
            found = [(r.job_id, r) for r in store.records(limit)]
    table = Table(title=f"lease records in {url}")
    for col in ("job", "owner", "generation", "state", "expires in (s)"):
        table.add_column(col, overflow="fold")
    now = time.time()  # display only: lease_until is on the store's clock
    for job_id, record in found:
        if record is None:
            table.add_row(job_id, "-", "-", "unknown", "-")
            continue
        expires = (
            f"{record.lease_until - now:.1f}"
            if record.lease_until is not None and record.state is JobState.HELD
            else "-"
        )
        table.add_row(record.job_id, record.owner or "-", str(record.generation),
                      record.state.value, expires)
    console.print(table)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Client libraries (kazoo, grpc) log every reconnect attempt; the command reports
    # failures itself, as typed errors.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    # Wide enough for the demo's timeline when the output is a pipe or a CI log.
    console = Console() if sys.stdout.isatty() else Console(width=150)
    try:
        if args.command == "demo":
            from .demo import run_demo

            return 0 if run_demo(args.backend, args.ttl_s, unfenced=args.unfenced,
                                 console=console) else 1
        if args.command == "inspect" and args.queue:
            return _inspect_queues(args.backend, args.queue, console)
        if args.command == "inspect":
            return _inspect(args.backend, args.jobs, args.limit, console)
        for module in _command_modules():
            if args.command == module.NAME:
                return int(module.run(args, console))
    except LeaseError as exc:
        console.print(f"[red]error:[/] {type(exc).__name__}: {exc}")
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return 130
    except (OSError, ValueError) as exc:  # bad paths or URLs given to verify/bench
        console.print(f"[red]error:[/] {type(exc).__name__}: {exc}")
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
