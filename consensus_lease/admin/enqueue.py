"""``consensus-lease enqueue``: add jobs to a work queue (see :mod:`consensus_lease.admin`
for the exit status)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from ..errors import InvalidArgument
from ..store import open_store
from ..validation import check_queue_name
from . import EXIT_CODES_HELP, EXIT_OK, EXIT_REFUSED, guarded, job_ids, say, shared

__all__ = ["NAME", "add_parser", "run"]

NAME = "enqueue"


def _attempts(text: str) -> int:
    from ..worker.config import flag_type, parse_attempts

    return flag_type(parse_attempts)(text)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``enqueue`` subcommand to ``subparsers``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="add jobs to a work queue",
        description="Add each JOB to the work queue (idempotent: a job already in it is "
        "left as it is). '-' reads job ids from stdin, one per line. Prints 'queued JOB' "
        "or 'already queued JOB' per job.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--backend", metavar="URL", required=True, help="store URL")
    parser.add_argument("--queue", metavar="QUEUE", required=True, help="the queue's name")
    parser.add_argument("jobs", nargs="+", metavar="JOB", help="job ids, or - for stdin")
    payload = parser.add_mutually_exclusive_group()
    payload.add_argument("--payload", metavar="TEXT", help="payload of every job (UTF-8)")
    payload.add_argument("--payload-file", metavar="FILE", type=Path,
                         help="payload of every job: this file's bytes")
    parser.add_argument("--max-attempts", metavar="N", type=_attempts, default=None,
                        help="claims a job may get before it fails for good (default: the "
                        "store's retry policy, unlimited)")
    return parser


def _payload(args: argparse.Namespace) -> bytes:
    if args.payload_file is not None:
        return bytes(args.payload_file.read_bytes())
    if args.payload is not None:
        return os.fsencode(str(args.payload))  # the bytes given, even if not UTF-8
    return b""


def _enqueue(args: argparse.Namespace, console: Console) -> int:
    queue = check_queue_name(args.queue)
    ids = job_ids(args.jobs)
    payload = _payload(args)
    refused = 0
    with shared(open_store(args.backend)) as store:
        limit = store.capabilities.max_payload_bytes
        if limit and len(payload) > limit:
            raise InvalidArgument(f"payload is {len(payload)} bytes; this store accepts at "
                                  f"most {limit}")
        for job in ids:
            try:
                added = store.enqueue(queue, job, payload, max_attempts=args.max_attempts)
            except InvalidArgument as exc:
                say(f"not queued {job!r}: {exc}")
                refused += 1
                continue
            console.print(f"{'queued' if added else 'already queued'} {job}",
                          highlight=False, markup=False, soft_wrap=True)
    return EXIT_REFUSED if refused else EXIT_OK


def run(args: argparse.Namespace, console: Console) -> int:
    """Enqueue the jobs; return the exit status (see :mod:`consensus_lease.admin`)."""
    return guarded(lambda: _enqueue(args, console))
