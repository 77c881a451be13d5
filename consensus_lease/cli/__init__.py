"""The ``consensus-lease`` command (also ``python -m consensus_lease.cli``).

The subcommands live beside it: ``demo`` in :mod:`.demo`; the others in the tools'
packages listed in ``EXTRA_COMMANDS`` (admin, verify, bench, runcmd, worker, the test
kit's ``kit`` and the model checker), each loaded only when its libraries are installed.

Needs the ``cli`` extra (rich): without it the command prints the install line and exits
with status 2 instead of a traceback. A subcommand that needs another extra at run time
(a backend's client, the test kit, plotting) names it the same way.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from .._extras import MODULE_EXTRAS, install_hint, missing_dependency
from ..errors import LeaseError

__all__ = ["main"]

EXTRA_COMMANDS: list[str] = [
    "consensus_lease.admin.inspect",
    "consensus_lease.admin.enqueue",
    "consensus_lease.admin.requeue",
    "consensus_lease.admin.bump_epoch",
    "consensus_lease.admin.upgrade_queue",
    "consensus_lease.verify.command",
    "consensus_lease.bench.command",
    "consensus_lease.runcmd.command",
    "consensus_lease.runcmd.elect",
    "consensus_lease.worker.command",
    "consensus_lease.testing.kitcmd",
    "consensus_lease.model.command",
]
"""Modules providing further subcommands (see ``_command_modules``)."""


def _positive_seconds(text: str) -> float:
    """Seconds > 0 in ASCII, as every command's flags take them."""
    from ..worker.config import flag_type, parse_positive_seconds

    return flag_type(parse_positive_seconds)(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="consensus-lease",
        description="Expiring job leases with fencing tokens on etcd, ZooKeeper, PostgreSQL and "
                    "SQLite (and memory://, for tests).",
    )
    from .. import __version__

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

    unavailable: list[str] = []
    for module in _command_modules(unavailable):
        module.add_parser(sub)
    if unavailable:
        parser.epilog = "Commands missing here: " + "; ".join(unavailable)
    return parser


def _command_modules(unavailable: list[str] | None = None) -> list[Any]:
    """Subcommands that live in their own modules. Each has ``NAME``,
    ``add_parser(subparsers)`` and ``run(args, console) -> int``.

    A module that is absent, or that needs a library that is not installed, is left out
    (the second case described in ``unavailable``, if given, with the extra to install)."""
    import importlib

    modules = []
    for name in EXTRA_COMMANDS:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            line = _needs(name, exc)
            if line is None:
                raise
            if unavailable is not None:
                unavailable.append(line)
    return modules


def _needs(what: str, exc: ImportError) -> str | None:
    """One line saying which extra provides the library whose absence caused ``exc``
    (``None``: ``exc`` is not about a missing library)."""
    missing = missing_dependency(exc)
    if missing is None:
        return None
    extra = MODULE_EXTRAS.get(missing)
    how = install_hint(extra) if extra else f"install the {missing!r} module"
    return f"{what} needs {missing!r}, which is not installed: {how}"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from rich.console import Console
        from rich.markup import escape
    except ImportError as exc:
        line = _needs("consensus-lease", exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
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
        for module in _command_modules():
            if args.command == module.NAME:
                return int(module.run(args, console))
    except LeaseError as exc:
        # Messages are data, not markup: "pip install 'consensus_lease[etcd]'" keeps its
        # brackets.
        console.print(f"[red]error:[/] {type(exc).__name__}: {escape(str(exc))}")
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return 130
    except (OSError, ValueError) as exc:  # bad paths or URLs given to verify/bench
        console.print(f"[red]error:[/] {type(exc).__name__}: {escape(str(exc))}")
        return 2
    except ImportError as exc:  # an optional library a subcommand needs at run time
        line = _needs(f"consensus-lease {args.command}", exc)
        if line is None:
            raise
        console.print(f"[red]error:[/] {escape(line)}")
        return 2
    return 2
