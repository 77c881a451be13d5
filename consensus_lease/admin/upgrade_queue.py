"""``consensus-lease upgrade-queue``: bring a work queue written by an earlier
consensus_lease to this version's queue layout (see :mod:`consensus_lease.admin` for the
exit status, and :meth:`Backend.upgrade_queue <consensus_lease.backend.Backend.upgrade_queue>`).

etcd rewrites the queue in place and prints one line to stdout::

    queue QUEUE: 3 open jobs indexed

(0 for a queue that needed nothing). A ZooKeeper queue this version serves prints the
same line with 0; one of the layout before buckets exits 2 with the manual upgrade steps
(drain and purge it with the previous release, delete its znode, enqueue again). SQLite
and PostgreSQL upgrade their stores when opened, so the command exits 2 saying there is
nothing to do.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from ..validation import check_queue_name
from . import EXIT_CODES_HELP, EXIT_OK, guarded, open_existing_store

__all__ = ["NAME", "add_parser", "run"]

NAME = "upgrade-queue"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``upgrade-queue`` subcommand to ``subparsers``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="upgrade a queue written by an earlier version (etcd)",
        description="Rewrite QUEUE, written by an earlier consensus_lease, to this "
        "version's queue layout in place, keeping its jobs, their order, claims and "
        "attempts. Run it once with the queue's workers and producers stopped; running it "
        "again does nothing. etcd only: a ZooKeeper queue of the old layout is upgraded "
        "by hand (the error gives the steps), and SQLite and PostgreSQL upgrade their "
        "stores when opened.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--backend", metavar="URL", required=True, help="store URL")
    parser.add_argument("queue", metavar="QUEUE", help="the queue's name")
    return parser


def _upgrade(args: argparse.Namespace, console: Console) -> int:
    queue = check_queue_name(args.queue)
    with open_existing_store(args.backend) as store:
        indexed = store.backend.upgrade_queue(queue)
    console.print(f"queue {queue}: {indexed} open jobs indexed", highlight=False,
                  markup=False, soft_wrap=True)
    return EXIT_OK


def run(args: argparse.Namespace, console: Console) -> int:
    """Upgrade the queue; return the exit status (see :mod:`consensus_lease.admin`)."""
    return guarded(lambda: _upgrade(args, console))
