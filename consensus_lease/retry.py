"""How long a failed job waits before its next attempt, and how many attempts it gets.

The *delay* is computed here, from the attempt number (exponential backoff, optionally
with "full jitter"); the *waiting* is done by the store: ``lease.fail()`` sends the delay
and the store makes the job claimable again only when that much of its own time has
passed (SQLite: the database clock; etcd: a key on a lease of that TTL; ZooKeeper: the
server's time of the failing write). A worker's clock never decides when a job may run again.

The backoff is one line of arithmetic, computed here rather than with tenacity's wait
strategies: those are built for tenacity's own retry loop (they read a ``RetryCallState``),
and using them would make tenacity a dependency of every install and of
``import consensus_lease``, although the embedded SQLite store needs nothing beyond the
standard library.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .errors import InvalidArgument
from .validation import MAX_RETRY_IN_S, retry_limit_message, shown_number

__all__ = ["DEFAULT_RETRY", "RetryPolicies", "RetryPolicy"]


def _finite(value: float) -> bool:
    """Whether ``value`` is finite (an int too large for a float is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry policy of a work queue (or of a whole store).

    Attributes:
        max_attempts: how many claims a job may get before a failure (or a lease that
            ends without completion) makes it FAILED; ``None`` = unlimited. Recorded with
            each job at ``enqueue`` time, so every worker applies the same limit.
        initial_s: delay after the first failed attempt, in seconds (float >= 0).
        multiplier: each further failed attempt multiplies the delay by this (>= 1).
        max_s: the delay never exceeds this (seconds).
        jitter: spread the delay uniformly over ``[0, delay]`` ("full jitter") so that
            jobs failing together do not retry together.

    Raises:
        InvalidArgument: a value out of range.
    """

    max_attempts: int | None = None
    initial_s: float = 1.0
    multiplier: float = 2.0
    max_s: float = 300.0
    jitter: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts is not None:
            check_max_attempts(self.max_attempts)
        for name, low in (("initial_s", 0.0), ("multiplier", 1.0), ("max_s", 0.0)):
            value = getattr(self, name)
            if (name != "multiplier" and isinstance(value, int)
                    and not isinstance(value, bool) and value > MAX_RETRY_IN_S):
                raise InvalidArgument(retry_limit_message(f"RetryPolicy.{name}", value))
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not _finite(value) or value < low):
                text = shown_number(value)
                shown = text if len(text) <= 40 else text[:36] + "..."
                raise InvalidArgument(
                    f"RetryPolicy.{name}={shown} must be a finite number >= {low}")
        if not isinstance(self.jitter, bool):
            raise InvalidArgument(f"RetryPolicy.jitter must be a bool, not {self.jitter!r}")
        for name in ("initial_s", "max_s"):
            if getattr(self, name) > MAX_RETRY_IN_S:
                raise InvalidArgument(
                    retry_limit_message(f"RetryPolicy.{name}", getattr(self, name)))

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait after attempt number ``attempt`` (1, 2, ...) failed.

        ``min(max_s, initial_s * multiplier ** (attempt - 1))``; with ``jitter`` a uniform
        random value from 0 to that. An attempt below 1 counts as 1.
        """
        exponent = max(1, attempt) - 1
        try:
            # A float power overflows quickly (OverflowError) where an int power would
            # build a huge integer for a large attempt number.
            growth = float(self.multiplier) ** exponent
        except OverflowError:
            growth = math.inf
        delay = min(self.max_s, self.initial_s * growth) if self.initial_s > 0 else 0.0
        if self.jitter:
            delay = random.uniform(0.0, delay)
        return float(delay)


DEFAULT_RETRY = RetryPolicy()
"""Unlimited attempts; 1 s after the first failure, doubling, at most 5 minutes."""


def check_max_attempts(value: object) -> int:
    """``value`` as an attempt limit (an int from 1 to 2**31 - 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**31:
        raise InvalidArgument(f"max_attempts must be an int from 1 to 2**31-1, not {value!r}")
    return value


class RetryPolicies:
    """A store's retry policies: one default and optional ones per work queue.

    Thread-safe for reading; set policies before starting workers.
    """

    def __init__(self, default: RetryPolicy = DEFAULT_RETRY) -> None:
        self.default = check_policy(default)
        self._by_queue: dict[str, RetryPolicy] = {}

    def set(self, queue: str, policy: RetryPolicy) -> None:
        self._by_queue[queue] = check_policy(policy)

    def get(self, queue: str | None) -> RetryPolicy:
        """The policy of ``queue`` (``None``: a job claimed by name), else the default."""
        if queue is None:
            return self.default
        return self._by_queue.get(queue, self.default)


def check_policy(policy: object) -> RetryPolicy:
    if not isinstance(policy, RetryPolicy):
        raise InvalidArgument(f"expected a consensus_lease.RetryPolicy, not {policy!r}")
    return policy
