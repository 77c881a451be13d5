"""``consensus-lease requeue``: put FAILED jobs (dead letters) back to work (see
:mod:`consensus_lease.admin` for the exit status)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from ..errors import InvalidArgument
from . import (
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_REFUSED,
    guarded,
    job_ids,
    open_existing_store,
    say,
)

__all__ = ["NAME", "add_parser", "run"]

NAME = "requeue"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``requeue`` subcommand to ``subparsers``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="make FAILED jobs claimable again",
        description="Make each FAILED JOB claimable at once with a fresh budget of "
        "max_attempts attempts (its attempt count and last error are kept). '-' reads job "
        "ids from stdin, one per line. A job that is not FAILED, or unknown, is refused "
        "and left as it is.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--backend", metavar="URL", required=True, help="store URL")
    parser.add_argument("jobs", nargs="+", metavar="JOB", help="job ids, or - for stdin")
    return parser


def _requeue(args: argparse.Namespace, console: Console) -> int:
    ids = job_ids(args.jobs)
    refused = 0
    with open_existing_store(args.backend) as store:
        for job in ids:
            try:
                record = store.requeue(job)
            except InvalidArgument as exc:
                say(f"not requeued {job!r}: {exc}")
                refused += 1
                continue
            console.print(f"requeued {job} (attempts so far: {record.attempt})",
                          highlight=False, markup=False, soft_wrap=True)
    return EXIT_REFUSED if refused else EXIT_OK


def run(args: argparse.Namespace, console: Console) -> int:
    """Requeue the jobs; return the exit status (see :mod:`consensus_lease.admin`)."""
    return guarded(lambda: _requeue(args, console))
