"""``consensus-lease worker``: run a handler on every job of a work queue.

Registered through ``consensus_lease.cli.EXTRA_COMMANDS`` (``NAME``, ``add_parser``,
``run``). Every setting can also come from an environment variable (see
:data:`~consensus_lease.worker.config.ENVIRONMENT`); a command-line flag wins over its
variable. ``--metrics-port PORT`` (thread mode) serves the store's Prometheus metrics
(:class:`~consensus_lease.metrics.PrometheusObserver`, the ``metrics`` extra) on
``http://ADDR:PORT/metrics``, ``ADDR`` from ``--metrics-addr`` (default ``127.0.0.1``).
Exit status: 0 after a normal stop (SIGTERM, or the queue drained with
``--until-empty``); 1 on an error (the store cannot be opened, the handler cannot be
imported, a worker slot or process failed, or one had to be killed after the grace
period); 2 for a bad flag or variable, named (also a ``--ttl-s`` outside the store's TTL
range, checked against its backend's ``capabilities`` before the store is opened; a
``--backend`` no installed backend serves: an unknown scheme, or a missing extra, with
its ``pip install`` line; a handler that is not ``MODULE:FUNCTION``), before anything is
created or started; 130 after SIGINT.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from typing import Any, TypeVar

from rich.console import Console
from rich.markup import escape

from ..backend import Capabilities
from ..errors import InvalidArgument, LeaseError, UnsupportedBackend
from ..retry import RetryPolicy
from ..store import DEFAULT_TTL_S, backend_class
from . import config
from .handler import check_handler_spec
from .logs import configure_logging, parse_level
from .runner import run_worker

__all__ = ["NAME", "add_batching_flags", "add_parser", "check_arguments", "check_backend",
           "check_handler_argument", "check_ttl_range", "run", "settings", "source",
           "worker_arguments"]

NAME = "worker"

T = TypeVar("T")

_EPILOG = "environment variables (a flag wins over its variable):\n" + "\n".join(
    f"  {variable:34} --{name.replace('_', '-')}" if name != "handler"
    else f"  {variable:34} MODULE:FUNCTION"
    for name, (variable, _) in config.ENVIRONMENT.items()
) + """

exit status: 0 stopped (SIGTERM, or drained with --until-empty); 1 error (store, handler
import, a failed or killed worker); 2 bad flag or variable (also a --backend no
installed backend serves: unknown scheme, missing extra); 130 stopped by SIGINT.
A second SIGTERM/SIGINT skips the grace period."""


_flag = config.flag_type


def add_batching_flags(parser: Any, *, grace: str = "--grace-s") -> None:
    """Add ``--prefetch``, ``--complete-batch`` and ``--complete-flush-s`` (each parsed as
    :class:`~consensus_lease.worker.WorkerConfig` checks it, default ``None``: not given)
    to ``parser`` (an ``argparse`` parser or argument group); ``consensus-lease verify``
    takes them too. ``grace`` names, in the help of ``--prefetch``, the time a stop
    request leaves the jobs held (this command's ``--grace-s``; ``verify`` has no such
    flag and says what it is there)."""
    for flag, parse, metavar, text in (
        ("--prefetch", config.parse_prefetch, "N", "leases each slot claims ahead of the job it "
         f"works, held until worked (also after a stop request, within {grace}; default "
         "0; at most 256)"),
        ("--complete-batch", config.parse_complete_batch, "N", "most completions sent in one "
         "complete_many (default 1: each job completed at once; the store caps it)"),
        ("--complete-flush-s", config.parse_flush_s, "S", "longest wait of a queued completion, "
         "seconds (default 0.01; always sent well before its lease's deadline)"),
    ):
        parser.add_argument(flag, type=_flag(parse), metavar=metavar, help=text)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``worker`` subcommand to ``subparsers``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME, help="run a handler on every job of a work queue",
        description="Claim jobs of a work queue and call MODULE:FUNCTION(lease, payload) on\n"
        "each: complete the job with the bytes it returns, fail the attempt if it raises\n"
        "(retried after the retry policy's delay until the job's max_attempts are used\n"
        "up). SIGTERM/SIGINT: stop claiming, let jobs in flight finish within --grace-s,\n"
        "release the rest, exit.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("handler", nargs="?", metavar="MODULE:FUNCTION",
                        help="the handler, importable from the current directory")
    parser.add_argument("--backend", metavar="URL", help="store URL")
    parser.add_argument("--queue", metavar="QUEUE", help="work queue name")
    parser.add_argument("--concurrency", type=_flag(config.parse_concurrency), metavar="N",
                        help="jobs worked at once: threads, or processes (default 1; at "
                        f"most {config.MAX_CONCURRENCY})")
    parser.add_argument("--processes", action=argparse.BooleanOptionalAction, default=None,
                        help="one worker process per slot (spawned) instead of threads")
    parser.add_argument("--ttl-s", type=_flag(config.parse_positive_seconds), metavar="S",
                        help=f"session TTL, seconds (default {DEFAULT_TTL_S:g}; within the "
                        "store's range, capabilities.min_ttl_s to max_ttl_s: e.g. sqlite "
                        "0.05 to 604800)")
    parser.add_argument("--grace-s", type=_flag(config.parse_grace_s), metavar="S",
                        help="time jobs in flight get after SIGTERM, seconds (default 30)")
    parser.add_argument("--until-empty", action=argparse.BooleanOptionalAction, default=None,
                        help="exit once nothing is available or held (retry delays are "
                        "waited for; FAILED jobs are not)")
    parser.add_argument("--claim-wait-s", type=_flag(config.parse_claim_wait_s), metavar="S",
                        help="one claim's wait, seconds (default 1)")
    parser.add_argument("--fused-claim", action=argparse.BooleanOptionalAction, default=None,
                        help="complete each job and claim the next in one call "
                        "(complete_and_claim_next; the default); --no-fused-claim: "
                        "complete, then claim_next")
    add_batching_flags(parser)
    parser.add_argument("--max-attempts", type=_flag(config.parse_attempts), metavar="N",
                        help="the queue's RetryPolicy.max_attempts (recorded per job by "
                        "enqueue: set it where jobs are enqueued too)")
    parser.add_argument("--retry-initial-s", type=_flag(config.parse_retry_s), metavar="S",
                        help="delay after a first failed attempt (default 1, doubling)")
    parser.add_argument("--retry-max-s", type=_flag(config.parse_retry_s), metavar="S",
                        help="longest retry delay (default 300)")
    parser.add_argument("--owner", help="sessions' owner label: OWNER/slot (default "
                        "host:pid:random)")
    parser.add_argument("--log-level", metavar="LEVEL", help="worker log level (info)")
    parser.add_argument("--metrics-port", type=_flag(config.parse_port), metavar="PORT",
                        help="serve Prometheus metrics on this port (thread mode; needs "
                        "the metrics extra)")
    parser.add_argument("--metrics-addr", metavar="ADDR",
                        help="address of the metrics endpoint (default 127.0.0.1)")
    return parser


def settings(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, object]:
    """The environment's settings overridden by the flags given.

    Raises:
        InvalidArgument: a malformed variable (only one whose flag is not given: that
            variable is not read), or no store, queue or handler.
    """
    flags = {name: getattr(args, name) for name in config.ENVIRONMENT
             if getattr(args, name, None) is not None}
    values = config.from_environment(environ, skip=flags)  # a flag wins: its variable unread
    values.update(flags)
    missing = [("MODULE:FUNCTION" if name == "handler" else f"--{name}")
               + f" (or {config.ENVIRONMENT[name][0]})"
               for name in ("backend", "queue", "handler") if name not in values]
    if missing:
        raise InvalidArgument(f"missing: {', '.join(missing)}")
    return values


def _get(values: Mapping[str, object], name: str, default: T) -> T:
    value = values.get(name, default)
    return value  # type: ignore[return-value]  # parsed by config.ENVIRONMENT's parser / argparse


def worker_arguments(values: Mapping[str, object]) -> dict[str, Any]:
    """``run_worker`` keyword arguments from :func:`settings`."""
    retry = None
    if {"max_attempts", "retry_initial_s", "retry_max_s"} & values.keys():
        retry = RetryPolicy(max_attempts=_get(values, "max_attempts", None),
                            initial_s=_get(values, "retry_initial_s", 1.0),
                            max_s=_get(values, "retry_max_s", 300.0))
    return {
        "store": values["backend"], "queue": values["queue"], "handler": values["handler"],
        "concurrency": _get(values, "concurrency", 1),
        "mode": "process" if _get(values, "processes", False) else "thread",
        "ttl_s": _get(values, "ttl_s", DEFAULT_TTL_S), "owner": _get(values, "owner", None),
        "retry": retry, "grace_s": _get(values, "grace_s", 30.0),
        "until_empty": _get(values, "until_empty", False),
        "claim_wait_s": _get(values, "claim_wait_s", 1.0),
        "fused_claim": _get(values, "fused_claim", True),
        "prefetch": _get(values, "prefetch", 0),
        "complete_batch": _get(values, "complete_batch", 1),
        "complete_flush_s": _get(values, "complete_flush_s", 0.01),
    }


def source(args: argparse.Namespace | None, name: str) -> str:
    """Where setting ``name`` came from, as a message names it: its flag (``--ttl-s``)
    when given (or with no ``args``), else its environment variable."""
    if args is None or getattr(args, name, None) is not None:
        return f"--{name.replace('_', '-')}"
    return config.ENVIRONMENT[name][0]


_FIELD_SETTINGS = {"mode": ("processes",), "retry": ("max_attempts", "retry_initial_s",
                                                      "retry_max_s")}
"""``WorkerConfig`` fields that come from settings of other names."""


def check_arguments(arguments: Mapping[str, Any],
                    args: argparse.Namespace | None = None) -> None:
    """Refuse, before anything starts, the settings ``run_worker`` itself would refuse
    (``config.WorkerConfig``'s checks: ranges such as ``concurrency`` 1..1024, or a
    ``claim_wait_s`` past its limit), so that they exit 2 as a bad flag does, not 1. Each
    field is checked alone first, so the message names the flag it came from (or its
    environment variable, by ``args``: see :func:`source`); the parsers of
    :data:`config.ENVIRONMENT` refuse most such values already.

    Raises:
        InvalidArgument: a setting out of its range, naming its flag or variable.
    """
    fields = {f.name for f in dataclasses.fields(config.WorkerConfig)}
    given = {k: v for k, v in arguments.items() if k in fields}
    for name, value in given.items():
        try:
            if name == "queue":
                config.WorkerConfig(queue=value)
            else:
                config.WorkerConfig(queue=given["queue"], **{name: value})
        except InvalidArgument as exc:
            named = "/".join(source(args, setting)
                             for setting in _FIELD_SETTINGS.get(name, (name,)))
            raise InvalidArgument(f"{named}: {exc}") from None
    config.WorkerConfig(**given)


def check_backend(values: Mapping[str, object], args: argparse.Namespace | None = None) -> None:
    """Refuse, before anything is created, a store URL no installed backend serves: not
    a URL, an unknown scheme, or a backend whose client library (an extra) is missing
    (the message has the ``pip install`` line), naming ``--backend`` or
    ``CONSENSUS_LEASE_URL`` (as :func:`source` says). Only the backend's class is
    loaded; nothing connects.

    Raises:
        InvalidArgument: no backend for the URL.
    """
    try:
        backend_class(str(values["backend"]))
    except UnsupportedBackend as exc:
        raise InvalidArgument(f"{source(args, 'backend')}: {exc}") from None


def check_handler_argument(values: Mapping[str, object],
                           args: argparse.Namespace | None = None) -> None:
    """Refuse a handler that is not ``MODULE:FUNCTION``, naming where it came from (the
    positional argument, or ``CONSENSUS_LEASE_HANDLER``); its import is left to
    ``run_worker`` (exit status 1).

    Raises:
        InvalidArgument: a malformed spec.
    """
    try:
        check_handler_spec(values["handler"])
    except InvalidArgument as exc:
        where = ("MODULE:FUNCTION" if args is None or getattr(args, "handler", None) is not None
                 else config.ENVIRONMENT["handler"][0])
        raise InvalidArgument(f"{where}: {exc}") from None


def check_ttl_range(values: Mapping[str, object], ttl_s: float,
                    args: argparse.Namespace | None = None) -> None:
    """Refuse, before the store is opened, a TTL outside the range its backend declares
    (``capabilities.min_ttl_s`` .. ``max_ttl_s``, a class attribute of the backend:
    known without connecting), naming ``--ttl-s`` or ``CONSENSUS_LEASE_TTL_S`` (as
    :func:`source` says) and the range. A URL no backend serves is left to
    ``run_worker`` (it reports it as the store error it is); so is a backend whose
    capabilities are known only once open (``run_worker`` checks the TTL again there).

    Raises:
        InvalidArgument: ``ttl_s`` is outside the store's range.
    """
    url = values.get("backend")
    if not isinstance(url, str):
        return
    try:
        caps = getattr(backend_class(url), "capabilities", None)
    except UnsupportedBackend:
        return
    if not isinstance(caps, Capabilities) or caps.min_ttl_s <= ttl_s <= caps.max_ttl_s:
        return
    scheme = url.split("://", 1)[0].lower()
    where = source(args, "ttl_s")
    shown = _number(ttl_s)
    named = (f"the default TTL {shown} (--ttl-s not given)" if "ttl_s" not in values
             else f"{where} {shown}" if where.startswith("--")
             else f"environment variable {where}={shown}")
    raise InvalidArgument(
        f"{named} is outside the {scheme} store's TTL range [{caps.min_ttl_s:g}, "
        f"{caps.max_ttl_s:g}] s (capabilities.min_ttl_s, max_ttl_s)")


def _number(value: float) -> str:
    """``value`` short (``%g``) where that is exact, else in full (``repr``): a value
    just outside a range never prints as its bound."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def serve_metrics(values: Mapping[str, object], arguments: Mapping[str, Any],
                  args: argparse.Namespace | None = None) -> Any:
    """With ``metrics_port``: a :class:`~consensus_lease.metrics.PrometheusObserver`
    whose registry is served on ``metrics_addr:metrics_port``; else ``None``. Messages
    name the flags, or the variables they came from (as :func:`source` says).

    Raises:
        InvalidArgument: process mode (each process would need its own endpoint), the
            metrics extra is missing, or the address and port cannot be bound.
    """
    port = values.get("metrics_port")
    port_source = source(args, "metrics_port")
    if port is None:
        if "metrics_addr" in values:
            raise InvalidArgument(f"{source(args, 'metrics_addr')} needs --metrics-port "
                                  f"(or {config.ENVIRONMENT['metrics_port'][0]})")
        return None
    if arguments["mode"] != "thread":
        raise InvalidArgument(f"{port_source} serves one process's metrics: not with "
                              "--processes (run one worker command per port instead)")
    try:
        from prometheus_client import start_http_server

        from ..metrics import PrometheusObserver
    except ImportError as exc:
        raise InvalidArgument(f"{port_source}: {exc}") from exc
    addr = str(values.get("metrics_addr", "127.0.0.1"))
    named = (port_source if "metrics_addr" not in values
             else f"{source(args, 'metrics_addr')}/{port_source}")
    observer = PrometheusObserver()
    try:
        start_http_server(int(str(port)), addr=addr)
    except (OSError, ValueError) as exc:  # ValueError, UnicodeError: a malformed address
        raise InvalidArgument(f"{named}: cannot serve on {addr}:{port}: {exc}") from exc
    return observer


def run(args: argparse.Namespace, console: Console) -> int:
    """Run ``consensus-lease worker``; returns the exit status."""
    try:
        values = settings(args, os.environ)
        try:
            level = parse_level(_get(values, "log_level", "info"))
        except ValueError as exc:
            raise InvalidArgument(f"{source(args, 'log_level')}: {exc}") from None
        check_backend(values, args)
        check_handler_argument(values, args)
        arguments = worker_arguments(values)
        check_arguments(arguments, args)
        check_ttl_range(values, arguments["ttl_s"], args)
        observer = serve_metrics(values, arguments, args)
        if observer is not None:
            arguments["observer"] = observer
    except (InvalidArgument, ValueError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        return 2
    configure_logging(level)
    try:
        stats = run_worker(**arguments, handle_signals=True)
    except LeaseError as exc:
        console.print(f"[red]error:[/] {type(exc).__name__}: {escape(str(exc))}",
                      highlight=False)
        return 1
    console.print(f"worker stopped: {stats.summary()}", highlight=False, soft_wrap=True)
    return stats.exit_status
