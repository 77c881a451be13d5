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


def _tick_ms(text: str) -> int:
    """An integer >= 1 in ASCII digits, as every command's flags take them."""
    from ..worker.config import flag_type, parse_count

    return flag_type(parse_count)(text)


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


def _workloads(text: str) -> tuple[str, ...]:
    from .runner import WORKLOADS, short_name

    by_short = {short_name(key): key for key in WORKLOADS}
    names = []
    for raw in filter(None, (part.strip().lower() for part in text.split(","))):
        key = by_short.get(raw, raw)
        if key not in WORKLOADS:
            raise argparse.ArgumentTypeError(
                f"unknown workload {raw!r}; choose from {', '.join(by_short)}")
        names.append(key)
    if not names:
        raise argparse.ArgumentTypeError("no workload named")
    return tuple(k for k in WORKLOADS if k in names)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        NAME,
        help="benchmarks: backends, raw clients and peer libraries side by side",
        description="Measure cycle throughput (against the raw client), latency, keepalive "
        "scaling, takeover, batch claims, peer lock libraries and deep queues on each backend, "
        "and write results.json, results.md and PNG plots. etcd and ZooKeeper run as 3-member "
        "clusters started through the container kit unless URLs are given.",
    )
    parser.add_argument("--backends", type=_backends, default=BACKENDS, metavar="LIST",
                        help=f"comma-separated, from {','.join(BACKENDS)} (default: all)")
    parser.add_argument("--workloads", type=_workloads, default=None, metavar="LIST",
                        help="comma-separated, from w1,w2,w3,w4,w5,w6,w7,w8,w9,w10 (default: "
                        "all but w9 and w10, which run only when named)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and few trials (a few minutes at most)")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest sizes: checks that every workload runs end to end "
                        "(the test suite uses it); its numbers mean nothing")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="output folder (default: ./bench-results; with --replot, the "
                        "folder of RESULTS_JSON)")
    parser.add_argument("--replot", type=Path, metavar="RESULTS_JSON",
                        help="measure nothing: draw the plots and write results.md again "
                        "(goals evaluated anew) from a results.json written by an earlier "
                        "run")
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
    parser.add_argument("--zk-tick-ms", type=_tick_ms, metavar="MS",
                        help="tickTime of the --zk-url ensemble, for the takeover goal "
                        "(default: asked with the 'conf' four-letter word if allowed)")
    parser.add_argument("--profile", action="store_true",
                        help="also write a pyinstrument profile of a claim+complete cycle per "
                        "backend (needs pyinstrument)")


def replot(results_json: Path, out: Path | None, console: Console) -> int:
    """Draw the plots of an earlier run again from its ``results.json``, and write its
    ``results.md`` again with the goals evaluated by this version.

    Raises:
        OSError: the file cannot be read or the folder written.
        ValueError: the file is not a results.json of ``consensus-lease bench``.
        ImportError: matplotlib is missing.
    """
    import json

    from .goals import evaluate
    from .plots import write_plots
    from .report import write_markdown

    results = json.loads(results_json.read_text())
    if not isinstance(results, dict) or not isinstance(results.get("backends"), dict):
        raise ValueError(f"{results_json} is not a results.json of consensus-lease bench")
    folder = out if out is not None else results_json.parent
    folder.mkdir(parents=True, exist_ok=True)
    try:
        written = write_plots(results, folder)
        write_markdown(results, evaluate(results), written, folder)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{results_json} lacks what a plot needs: {exc!r}") from exc
    console.print(f"wrote {len(written)} plots and results.md in {folder}: "
                  f"{', '.join(written)}")
    return 0


def run(args: argparse.Namespace, console: Console) -> int:
    if args.replot is not None:
        return replot(args.replot, args.out, console)
    from .runner import BenchOptions, run_bench

    options = BenchOptions(
        backends=tuple(args.backends),
        quick=bool(args.quick) or bool(args.smoke),
        smoke=bool(args.smoke),
        out=Path(args.out) if args.out is not None else Path("bench-results"),
        etcd_url=args.etcd_url,
        zk_url=args.zk_url,
        zk_tick_ms=args.zk_tick_ms,
        profile=bool(args.profile),
        pg_url=args.pg_url,
    )
    if args.workloads is not None:
        options.workloads = tuple(args.workloads)
    return run_bench(options, console)
