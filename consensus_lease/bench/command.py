"""``consensus-lease bench``: the benchmark suite as a subcommand (see
:mod:`consensus_lease.bench`). Registered through ``cli.EXTRA_COMMANDS``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from .config import ALIASES, BACKENDS

__all__ = ["NAME", "add_parser", "run"]

NAME = "bench"


def _backends(text: str) -> tuple[str, ...]:
    names = []
    for raw in filter(None, (part.strip().lower() for part in text.split(","))):
        name = ALIASES.get(raw, raw)
        if name not in BACKENDS:
            raise argparse.ArgumentTypeError(
                f"unknown backend {raw!r}; choose from {', '.join(BACKENDS)}"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise argparse.ArgumentTypeError("no backend named")
    return tuple(n for n in BACKENDS if n in names)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        NAME,
        help="benchmarks: backends, raw clients and peer libraries side by side",
        description="Measure cycle throughput (against the raw client), latency, keepalive "
        "scaling, takeover, batch claims and peer lock libraries on each backend, and write "
        "results.json, results.md and PNG plots. etcd and ZooKeeper run as 3-member "
        "clusters started through the container kit unless URLs are given.",
    )
    parser.add_argument("--backends", type=_backends, default=BACKENDS, metavar="LIST",
                        help=f"comma-separated, from {','.join(BACKENDS)} (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and few trials (a few minutes at most)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), metavar="DIR",
                        help="output folder (default: ./bench-results)")
    parser.add_argument("--etcd-url", metavar="URL",
                        help="use this etcd (etcd://h1:2379,h2:2379,...) instead of starting one; "
                        "the bench keeps its keys under its own prefix")
    parser.add_argument("--zk-url", metavar="URL",
                        help="use this ZooKeeper (zk://h1:2181,...) instead of starting one; "
                        "the bench keeps its znodes under its own chroot")
    parser.add_argument("--pg-url", metavar="URL",
                        help="use this PostgreSQL (postgresql://user:password@host/db) instead "
                        "of $CONSENSUS_LEASE_POSTGRES_URL or scripts/start-postgres.sh; the "
                        "bench keeps its tables in its own schema, dropped afterwards")
    parser.add_argument("--zk-tick-ms", type=int, metavar="MS",
                        help="tickTime of the --zk-url ensemble, for the takeover goal "
                        "(default: asked with the 'conf' four-letter word if allowed)")
    parser.add_argument("--profile", action="store_true",
                        help="also write a pyinstrument profile of a claim+complete cycle per "
                        "backend (needs pyinstrument)")


def run(args: argparse.Namespace, console: Console) -> int:
    from .runner import BenchOptions, run_bench

    options = BenchOptions(
        backends=tuple(args.backends),
        quick=bool(args.quick),
        out=Path(args.out),
        etcd_url=args.etcd_url,
        zk_url=args.zk_url,
        zk_tick_ms=args.zk_tick_ms,
        profile=bool(args.profile),
        pg_url=args.pg_url,
    )
    return run_bench(options, console)
