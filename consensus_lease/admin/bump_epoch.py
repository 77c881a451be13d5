"""``consensus-lease bump-epoch``: raise the store's epoch after a restore, a PostgreSQL
failover or switchover, or any ``StoreRegressed``, so that every fencing token handed out
from now on exceeds every token handed out before (exit status: :data:`EXIT_CODES_HELP`;
docs/operations.md: "Restoring a store").

Prints three lines to stdout::

    old epoch: 0
    new epoch: 1
    lowest next token: 4294967296

(the lowest token any claim can get from now on: ``new epoch * 2**epoch_shift``, above
``--above``).
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from ..store import open_store
from . import EXIT_OK, guarded

__all__ = ["EXIT_CODES_HELP", "NAME", "add_parser", "run"]

NAME = "bump-epoch"

EXIT_CODES_HELP = """\
exit status: 0 epoch bumped (the three lines printed); 2 usage error or bad input,
nothing changed; 69 store unreachable or outcome unknown (run `inspect` to see the
epoch; bumping again is safe, tokens only go up)"""
"""``bump-epoch``'s exit statuses (it refuses no job, so never 1: :func:`guarded`)."""


def _token(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        value = -1
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be a token, an integer from 0 to 2**63-1, "
                                         f"got {text!r}")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bump-epoch`` subcommand to ``subparsers``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="raise the store's epoch after a restore, a PostgreSQL failover or "
        "StoreRegressed (tokens keep increasing)",
        description="Raise the store's epoch in one atomic store operation, so that "
        "every fencing token handed out from now on is higher than every token handed "
        "out before and than --above. Run it, with every worker stopped, after restoring "
        "the store from a backup or wiping it, after a PostgreSQL failover or switchover "
        "(a promoted standby), and after any StoreRegressed: the store keeps a regression "
        "marker and refuses every session and claim until the bump. Give --above the "
        "highest token any of your destinations has accepted (e.g. "
        "SqliteFence.highest_token).",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--backend", metavar="URL", required=True, help="store URL")
    parser.add_argument("--above", type=_token, metavar="TOKEN",
                        help="make every later token higher than this one")
    return parser


def _bump(args: argparse.Namespace, console: Console) -> int:
    with open_store(args.backend) as store:  # creates a wiped store: the epoch is its floor
        old = store.epoch()
        new = store.bump_epoch(args.above)
        shift = store.backend.epoch_shift
    for line in (f"old epoch: {old}", f"new epoch: {new}",
                 f"lowest next token: {new << shift}"):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return EXIT_OK


def run(args: argparse.Namespace, console: Console) -> int:
    """Bump the epoch; return the exit status (see :mod:`consensus_lease.admin`)."""
    return guarded(lambda: _bump(args, console))
