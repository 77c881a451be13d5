"""``consensus-lease inspect``: show lease records or work queue counts, as a table or as
JSON (see :mod:`consensus_lease.admin` for the exit status).

``--json`` prints one JSON array to stdout. Each lease record is an object::

    {"job_id": str, "state": "available"|"held"|"completed"|"failed"|null (never seen),
     "owner": str|null, "generation": int, "attempt": int, "max_attempts": int|null,
     "error": str|null, "lease_until": float|null, "not_before": float|null,
     "result": str|null, "result_encoding": "base64"|"utf-8"|null}

plus ``"queue"``, ``"payload"`` and ``"payload_encoding"`` for jobs listed from a queue
(``--queue Q --state S``). Times are seconds since the epoch on the *store's* clock.

``--queue Q --state S`` reads at most ``--limit`` jobs of each queue (its oldest first)
and lists at most ``--limit`` in all, so its cost does not grow with the queue's depth;
the table shows the queue's counts (``queue_stats``) in full above the jobs, and a line
per queue with how many jobs in those states were not listed (with ``--json``: on
stderr, stdout staying one JSON array).
Bytes (result, payload) are base64 by default; with ``--bytes utf-8`` they are text when
they are valid UTF-8 and base64 otherwise, and the ``*_encoding`` field says which, so no
byte is ever lost. Queue counts (``--queue`` without ``--state``) are objects with
``queue``, ``available``, ``held``, ``completed``, ``failed`` and
``oldest_held_lease_until``.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import InvalidArgument
from ..options import redact_url
from ..record import JobState, LeaseRecord, QueuedJob, QueueStats
from ..store import LeaseStore
from . import EXIT_CODES_HELP, EXIT_OK, guarded, open_existing_store

__all__ = ["NAME", "add_parser", "encode_bytes", "record_json", "run"]

NAME = "inspect"

Row = tuple[str, LeaseRecord | None, QueuedJob | None]
"""A job id, its record (``None``: never seen) and its queue entry (listed by queue)."""


def _limit(text: str) -> int:
    """An integer >= 0 in ASCII digits, as every command's flags take them."""
    from ..worker.config import flag_type, parse_amount

    return flag_type(parse_amount)(text)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``inspect`` subcommand to ``subparsers``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="show lease records, or work queue counts",
        description="Show the lease records of JOBs (default: every job, by id), with "
        "attempts and last errors; or, with --queue, the queue's counts by state (with "
        "--state: its jobs in those states).",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--backend", metavar="URL", required=True, help="store URL")
    parser.add_argument("jobs", nargs="*", metavar="JOB", help="only these jobs")
    parser.add_argument("--limit", type=_limit, default=1000,
                        help="at most this many records (default 1000); with --queue and "
                        "--state, also the most jobs read from each queue (its oldest): the "
                        "queue's counts are shown in full, with how many were not listed")
    parser.add_argument("--queue", action="append", default=[], metavar="QUEUE",
                        help="show this work queue's counts instead (repeatable)")
    parser.add_argument("--state", action="append", default=[],
                        choices=[s.value for s in JobState],
                        help="only jobs in this state (repeatable)")
    parser.add_argument("--json", action="store_true",
                        help="print JSON instead of a table (fields: see the module docs)")
    parser.add_argument("--bytes", choices=("base64", "utf-8"), default="base64",
                        help="JSON encoding of results and payloads (default base64; utf-8 "
                        "falls back to base64 per value that is not valid UTF-8)")
    return parser


def encode_bytes(data: bytes | None, encoding: str) -> tuple[str | None, str | None]:
    """``(text, encoding used)`` for ``data``: UTF-8 text if asked for and valid, else
    base64; ``(None, None)`` for ``None``."""
    if data is None:
        return None, None
    if encoding == "utf-8":
        try:
            return data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(data).decode("ascii"), "base64"


def record_json(row: Row, encoding: str) -> dict[str, Any]:
    """One row as the JSON object described in the module docstring."""
    job_id, record, queued = row
    if record is None:
        return {"job_id": job_id, "state": None}
    out: dict[str, Any] = {
        "job_id": record.job_id, "state": record.state.value, "owner": record.owner,
        "generation": record.generation, "attempt": record.attempt,
        "max_attempts": record.max_attempts, "error": record.error,
        "lease_until": record.lease_until, "not_before": record.not_before,
    }
    out["result"], out["result_encoding"] = encode_bytes(record.result, encoding)
    if queued is not None:
        out["queue"] = queued.queue
        out["payload"], out["payload_encoding"] = encode_bytes(queued.payload, encoding)
    return out


def _rows(store: LeaseStore, args: argparse.Namespace) -> list[Row]:
    states = {JobState(s) for s in args.state}
    rows: list[Row]
    if args.jobs:
        rows = [(job, store.get(job), None) for job in args.jobs]
    else:
        rows = [(r.job_id, r, None) for r in store.records(None if states else args.limit)]
    if states:
        rows = [row for row in rows if row[1] is not None and row[1].state in states]
    return rows[: args.limit]


def _queue_rows(
    store: LeaseStore, args: argparse.Namespace
) -> tuple[list[Row], list[QueueStats], list[str]]:
    """The jobs of ``args.queue`` in ``args.state``, their queues' counts, and one line
    per queue with jobs in those states that are not listed. Bounded: at most
    ``args.limit`` jobs are read from each queue (its oldest) and listed in all, plus one
    ``queue_stats`` per queue; the counts and the listing are two reads, not a snapshot."""
    states = [JobState(s) for s in args.state]
    rows: list[Row] = []
    stats: list[QueueStats] = []
    notes: list[str] = []
    for queue in args.queue:
        counts = store.queue_stats(queue)
        stats.append(counts)
        jobs = store.queue_jobs(queue, args.limit)
        matching = [(j.record.job_id, j.record, j) for j in jobs if j.record.state in states]
        shown = matching[: max(0, args.limit - len(rows))]
        rows += shown
        left = sum(getattr(counts, state.value) for state in states) - len(shown)
        if left > 0:
            read = (f"only its oldest {len(jobs)} jobs were read"
                    if len(jobs) >= args.limit else "not within --limit")
            notes.append(f"{left} more {'/'.join(s.value for s in states)} job(s) of queue "
                         f"{queue!r} not listed ({read}; --limit {args.limit}: raise it to "
                         "see more)")
    return rows, stats, notes


def _cell(record: LeaseRecord, now: float) -> tuple[str, str, str, str]:
    """attempt, expires in, retry in, error: display only (store-clock times vs ours)."""
    attempt = str(record.attempt)
    if record.max_attempts is not None and record.attempt > record.max_attempts:
        # requeue gave a fresh budget of max_attempts; the count goes on from where it was
        attempt += f" ({record.max_attempts} per requeue)"
    elif record.max_attempts is not None:
        attempt += f"/{record.max_attempts}"
    expires = "-"
    if record.lease_until is not None and record.state is JobState.HELD:
        expires = f"{record.lease_until - now:.1f}"
    retry = "-"
    if record.not_before is not None and record.not_before > now:
        retry = f"{record.not_before - now:.1f}"
    # A COMPLETED job's last error is from an attempt before the one that completed it.
    shown = None if record.state is JobState.COMPLETED else record.error
    lines = (shown or "").splitlines()
    error = lines[0] + (" …" if len(lines) > 1 else "") if lines else "-"
    # A handler's exception text is not trusted: no terminal control sequences.
    error = "".join(ch if ch.isprintable() else "\N{REPLACEMENT CHARACTER}" for ch in error)
    if len(error) > 60:
        error = error[:59] + "…"
    return attempt, expires, retry, error


def _records_table(url: str, rows: list[Row], console: Console, epoch: int | None) -> None:
    title = f"lease records in {redact_url(url)}"
    if epoch is not None:
        title += f" (store epoch {epoch})"
    table = Table(title=title)
    for col in ("job", "owner", "generation", "state", "attempt", "expires in (s)",
                "retry in (s)", "error"):
        table.add_column(col, overflow="fold")
    now = time.time()  # display only: lease_until and not_before are on the store's clock
    for job_id, record, _ in rows:
        if record is None:
            table.add_row(Text(job_id), "-", "-", "unknown", "-", "-", "-", "-")
            continue
        attempt, expires, retry, error = _cell(record, now)
        # Text, not markup: ids, owners and errors are data ("[red]" stays as written).
        table.add_row(Text(record.job_id), Text(record.owner or "-"), str(record.generation),
                      record.state.value, attempt, expires, retry, Text(error))
    console.print(table)


def _counts(store: LeaseStore, args: argparse.Namespace, console: Console) -> int:
    stats = [store.queue_stats(q) for q in args.queue]
    if args.json:
        print(json.dumps([asdict(s) for s in stats], indent=2))
        return EXIT_OK
    _counts_table(args.backend, stats, console)
    return EXIT_OK


def _counts_table(url: str, stats: list[QueueStats], console: Console) -> None:
    table = Table(title=f"work queues in {redact_url(url)}")
    for col in ("queue", "available", "held", "completed", "failed",
                "oldest held lease ends in (s)"):
        table.add_column(col)
    now = time.time()  # display only: lease_until is on the store's clock
    for s in stats:
        end = s.oldest_held_lease_until
        table.add_row(Text(s.queue), str(s.available), str(s.held), str(s.completed),
                      str(s.failed), "-" if end is None else f"{end - now:.1f}")
    console.print(table)


def _inspect(args: argparse.Namespace, console: Console) -> int:
    if args.queue and args.jobs:
        raise InvalidArgument(
            "inspect: give JOB ids or --queue, not both (--queue shows a queue's counts, "
            "and with --state its jobs in those states)"
        )
    args.queue = list(dict.fromkeys(args.queue))  # a queue named twice is shown once
    stats: list[QueueStats] = []
    notes: list[str] = []
    with open_existing_store(args.backend) as store:
        if args.queue and not args.state:
            return _counts(store, args, console)
        if args.queue:
            rows, stats, notes = _queue_rows(store, args)
        else:
            rows = _rows(store, args)
        # One more read, for the table's title only (not part of the JSON output).
        epoch = store.epoch() if store.capabilities.epoch and not args.json else None
    if args.json:
        print(json.dumps([record_json(row, args.bytes) for row in rows], indent=2,
                         ensure_ascii=False))
        sys.stdout.flush()
        for note in notes:  # stdout stays one JSON array
            print(note, file=sys.stderr)
        return EXIT_OK
    if stats:
        _counts_table(args.backend, stats, console)
    _records_table(args.backend, rows, console, epoch)
    for note in notes:
        console.print(Text(note))
    return EXIT_OK


def run(args: argparse.Namespace, console: Console) -> int:
    """Show the records or counts; return the exit status (see :mod:`..admin`)."""
    return guarded(lambda: _inspect(args, console))
