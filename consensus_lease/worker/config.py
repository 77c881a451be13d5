"""A worker's settings, checked; and how the command reads them from the environment."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from ..errors import InvalidArgument
from ..retry import RetryPolicy, check_max_attempts, check_policy
from ..store import DEFAULT_TTL_S
from ..validation import MAX_RETRY_IN_S, check_owner, check_queue_name, check_wait

T = TypeVar("T")

__all__ = ["ENVIRONMENT", "MAX_COMPLETE_BATCH", "MAX_CONCURRENCY", "MAX_FLUSH_S",
           "MAX_PREFETCH", "WorkerConfig", "from_environment"]

MAX_CONCURRENCY = 1024
"""Most worker slots (threads, or processes) one ``run_worker`` runs."""
MAX_PREFETCH = 256
"""Most leases one slot claims ahead of the job it works (``prefetch``). Per slot: a
slot refills when half is free, so ``prefetch=200`` claims 100 jobs per
``claim_next_many`` round trip, the size where a claim's cost per job is already a small
share of the job's own (more held ahead only keeps jobs from other workers longer)."""
MAX_COMPLETE_BATCH = 10_000
"""Most completions one slot keeps pending (``complete_batch``; the store's
``capabilities.max_complete_batch`` caps one batch further)."""
MAX_FLUSH_S = 60.0
"""Longest ``complete_flush_s``."""

Mode = Literal["thread", "process"]


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a worker runs (see :func:`~consensus_lease.worker.run_worker` for each field).

    Raises:
        InvalidArgument: a value out of range, naming the field.
    """

    queue: str
    concurrency: int = 1
    mode: Mode = "thread"
    ttl_s: float = DEFAULT_TTL_S
    owner: str | None = None
    retry: RetryPolicy | None = None
    grace_s: float = 30.0
    until_empty: bool = False
    claim_wait_s: float = 1.0
    fused_claim: bool = True
    prefetch: int = 0
    complete_batch: int = 1
    complete_flush_s: float = 0.01

    def __post_init__(self) -> None:
        check_queue_name(self.queue)
        if (isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int)
                or not 1 <= self.concurrency <= MAX_CONCURRENCY):
            raise InvalidArgument(
                f"concurrency must be an int from 1 to {MAX_CONCURRENCY}, not "
                f"{self.concurrency!r}")
        if self.mode not in ("thread", "process"):
            raise InvalidArgument(f"mode must be 'thread' or 'process', not {self.mode!r}")
        seconds("ttl_s", self.ttl_s, positive=True)
        check_wait(seconds("grace_s", self.grace_s), "grace_s")  # a thread waits it out
        seconds("claim_wait_s", self.claim_wait_s, positive=True)
        check_wait(self.claim_wait_s, "claim_wait_s")  # and no longer than a thread can wait
        if self.owner is not None:
            check_owner(self.owner)
        if self.retry is not None:
            check_policy(self.retry)
        if not isinstance(self.until_empty, bool):
            raise InvalidArgument(f"until_empty must be a bool, not {self.until_empty!r}")
        if not isinstance(self.fused_claim, bool):
            raise InvalidArgument(f"fused_claim must be a bool, not {self.fused_claim!r}")
        count("prefetch", self.prefetch, 0, MAX_PREFETCH)
        count("complete_batch", self.complete_batch, 1, MAX_COMPLETE_BATCH)
        if seconds("complete_flush_s", self.complete_flush_s) > MAX_FLUSH_S:
            raise InvalidArgument(f"complete_flush_s must be at most {MAX_FLUSH_S:g} s, not "
                                  f"{self.complete_flush_s!r}")

    @property
    def pipelined(self) -> bool:
        """Whether a slot needs its feeder thread: ``prefetch`` or batched completions."""
        return self.prefetch > 0 or self.complete_batch > 1

    def single(self) -> WorkerConfig:
        """This configuration for one worker process: one slot, in a thread."""
        return replace(self, concurrency=1, mode="thread")


def count(name: str, value: object, low: int, high: int) -> int:
    """``value`` as an int from ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{name} must be an int from {low} to {high}, not {value!r}")
    return value


def seconds(name: str, value: object, *, positive: bool = False) -> float:
    """``value`` as finite seconds, >= 0 (> 0 with ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} must be a number of seconds, not {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float: not a finite number either
        number = math.inf
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:36] + "..."
        raise InvalidArgument(f"{name} must be a finite number {'>' if positive else '>='} 0 "
                              f"of seconds, not {shown}")
    return number


# -- text (command-line flags and environment variables) -----------------------------

def flag_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an ``argparse`` ``type=``: its :class:`InvalidArgument` becomes
    ``argparse.ArgumentTypeError``, so argparse names the flag (``argument --ttl-s: ...``)."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except InvalidArgument as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


def parse_seconds(text: str, *, positive: bool = False) -> float:
    """Seconds: a decimal number in ASCII (``float()`` also takes ``"1_0"`` and
    Arabic-Indic digits; these are refused as not a number), >= 0 (> 0 with ``positive``)."""
    shown = repr(text) if len(text) <= 40 else repr(text[:36]) + "..."
    try:
        if "_" in text or not text.isascii() or any(c in text for c in "\n\r\v\f"):
            raise ValueError(text)  # (blanks: spaces and tabs, as the integer flags take)
        number = float(text)
    except ValueError:
        raise InvalidArgument(f"not a number of seconds: {shown}") from None
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise InvalidArgument(f"must be a finite number {'>' if positive else '>='} 0 of "
                              f"seconds, not {shown}")
    return number


def parse_positive_seconds(text: str) -> float:
    return parse_seconds(text, positive=True)


_DECIMAL = re.compile(r"[ \t]*[+-]?[0-9]{1,30}[ \t]*")
"""A decimal integer as the CLI and the environment take it: up to 30 ASCII digits, an
optional sign, surrounding spaces or tabs (``\\s`` would also take no-break and
ideographic spaces, and ``\\x1c``-``\\x1f``, which ``int()`` refuses)."""


def parse_count(text: str) -> int:
    """An integer >= 1."""
    return _integer(text, 1)


def parse_amount(text: str) -> int:
    """An integer >= 0."""
    return _integer(text, 0)


def _integer(text: str, least: int | None) -> int:
    if not _DECIMAL.fullmatch(text):  # int() also takes "1_0", "٣" and "+ 1"
        shown = repr(text) if len(text) <= 40 else repr(text[:36]) + "..."
        raise InvalidArgument(f"not an integer: {shown}")
    value = int(text)
    if least is not None and value < least:
        raise InvalidArgument(f"must be >= {least}, not {text!r}")
    return value


def parse_concurrency(text: str) -> int:
    """``concurrency``: an integer from 1 to :data:`MAX_CONCURRENCY`."""
    return count("concurrency", parse_count(text), 1, MAX_CONCURRENCY)


def parse_grace_s(text: str) -> float:
    """``grace_s``: seconds >= 0, no longer than a thread can wait."""
    return check_wait(parse_seconds(text), "grace_s")


def parse_integer(text: str) -> int:
    """An integer of any sign, in ASCII digits."""
    return _integer(text, None)


def parse_claim_wait_s(text: str) -> float:
    """``claim_wait_s``: seconds > 0, no longer than a thread can wait."""
    return check_wait(parse_positive_seconds(text), "claim_wait_s")


def parse_retry_s(text: str) -> float:
    """A retry delay (``RetryPolicy.initial_s`` / ``max_s``): seconds >= 0, at most
    ``MAX_RETRY_IN_S``."""
    value = parse_seconds(text)
    if value > MAX_RETRY_IN_S:
        raise InvalidArgument(f"must be at most {MAX_RETRY_IN_S:.0f} s (the longest retry delay "
                              f"lease.fail() accepts), not {text!r}")
    return value


def parse_prefetch(text: str) -> int:
    return count("prefetch", parse_amount(text), 0, MAX_PREFETCH)


def parse_complete_batch(text: str) -> int:
    return count("complete_batch", parse_count(text), 1, MAX_COMPLETE_BATCH)


def parse_flush_s(text: str) -> float:
    value = parse_seconds(text)
    if value > MAX_FLUSH_S:
        raise InvalidArgument(f"must be at most {MAX_FLUSH_S:g} s, not {text!r}")
    return value


def parse_attempts(text: str) -> int:
    return check_max_attempts(parse_count(text))


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise InvalidArgument(f"not a boolean (1/0, true/false, yes/no, on/off): {text!r}")


def parse_port(text: str) -> int:
    """A TCP port for the metrics endpoint: 1..65535."""
    if not _DECIMAL.fullmatch(text):  # int() also takes "1_0" and "٣"
        raise InvalidArgument(f"not a port number (1..65535): {text!r}")
    port = int(text)
    if not 1 <= port <= 65535:
        raise InvalidArgument(f"port must be in 1..65535, not {port}")
    return port


def parse_text(text: str) -> str:
    if not text:
        raise InvalidArgument("must not be empty")
    return text


ENVIRONMENT: dict[str, tuple[str, Callable[[str], object]]] = {
    "backend": ("CONSENSUS_LEASE_URL", parse_text),
    "queue": ("CONSENSUS_LEASE_QUEUE", parse_text),
    "handler": ("CONSENSUS_LEASE_HANDLER", parse_text),
    "concurrency": ("CONSENSUS_LEASE_CONCURRENCY", parse_concurrency),
    "processes": ("CONSENSUS_LEASE_PROCESSES", parse_bool),
    "ttl_s": ("CONSENSUS_LEASE_TTL_S", parse_positive_seconds),
    "grace_s": ("CONSENSUS_LEASE_GRACE_S", parse_grace_s),
    "until_empty": ("CONSENSUS_LEASE_UNTIL_EMPTY", parse_bool),
    "claim_wait_s": ("CONSENSUS_LEASE_CLAIM_WAIT_S", parse_claim_wait_s),
    "fused_claim": ("CONSENSUS_LEASE_FUSED_CLAIM", parse_bool),
    "prefetch": ("CONSENSUS_LEASE_PREFETCH", parse_prefetch),
    "complete_batch": ("CONSENSUS_LEASE_COMPLETE_BATCH", parse_complete_batch),
    "complete_flush_s": ("CONSENSUS_LEASE_COMPLETE_FLUSH_S", parse_flush_s),
    "max_attempts": ("CONSENSUS_LEASE_MAX_ATTEMPTS", parse_attempts),
    "retry_initial_s": ("CONSENSUS_LEASE_RETRY_INITIAL_S", parse_retry_s),
    "retry_max_s": ("CONSENSUS_LEASE_RETRY_MAX_S", parse_retry_s),
    "owner": ("CONSENSUS_LEASE_OWNER", parse_text),
    "log_level": ("CONSENSUS_LEASE_LOG_LEVEL", parse_text),
    "metrics_port": ("CONSENSUS_LEASE_METRICS_PORT", parse_port),
    "metrics_addr": ("CONSENSUS_LEASE_METRICS_ADDR", parse_text),
}
"""Setting name -> (environment variable, parser). Command-line flags win. Each parser
checks the whole range :class:`WorkerConfig` (or ``RetryPolicy``) checks, so that a value
out of range is refused naming its flag (``argument --concurrency: ...``) or its
variable (``environment variable CONSENSUS_LEASE_CONCURRENCY: ...``); the TTL's range is
the store's, checked by the command against the backend's ``capabilities``."""


def from_environment(environ: Mapping[str, str],
                     skip: Collection[str] = ()) -> dict[str, object]:
    """The settings ``environ`` gives (only those whose variable is set), parsed.
    Settings named in ``skip`` (those a command-line flag gives: a flag wins) are not
    read at all, so a malformed variable a flag overrides is never refused.

    Raises:
        InvalidArgument: a variable's value is malformed (the message names it).
    """
    found: dict[str, object] = {}
    for name, (variable, parse) in ENVIRONMENT.items():
        if variable not in environ or name in skip:
            continue
        try:
            found[name] = parse(environ[variable])
        except InvalidArgument as exc:
            raise InvalidArgument(f"environment variable {variable}: {exc}") from None
    return found
