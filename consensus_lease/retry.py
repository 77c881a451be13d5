"""How long a failed job waits before its next attempt, and how many attempts it gets.

The *delay* is computed here, from the attempt number, with tenacity's wait strategies;
the *waiting* is done by the store: ``lease.fail()`` sends the delay and the store makes
the job claimable again only when that much of its own time has passed (SQLite: the
database clock; etcd: a key on a lease of that TTL; ZooKeeper: the server's time of the
failing write). A worker's clock never decides when a job may run again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tenacity

from .errors import InvalidArgument
from .validation import MAX_RETRY_IN_S

__all__ = ["DEFAULT_RETRY", "RetryPolicies", "RetryPolicy"]


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
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < low):
                raise InvalidArgument(f"RetryPolicy.{name}={value!r} must be a number >= {low}")
        if not isinstance(self.jitter, bool):
            raise InvalidArgument(f"RetryPolicy.jitter must be a bool, not {self.jitter!r}")
        for name in ("initial_s", "max_s"):
            if getattr(self, name) > MAX_RETRY_IN_S:
                raise InvalidArgument(
                    f"RetryPolicy.{name}={getattr(self, name)!r} is over the limit of "
                    f"{MAX_RETRY_IN_S} s (the longest retry delay lease.fail() accepts)"
                )

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait after attempt number ``attempt`` (1, 2, ...) failed."""
        strategy: tenacity.wait.wait_base
        if self.jitter:
            strategy = tenacity.wait_random_exponential(
                multiplier=self.initial_s, max=self.max_s, exp_base=self.multiplier
            )
        else:
            strategy = tenacity.wait_exponential(
                multiplier=self.initial_s, max=self.max_s, exp_base=self.multiplier
            )
        state = tenacity.RetryCallState(None, None, (), {})  # type: ignore[arg-type]
        state.attempt_number = max(1, attempt)
        return float(min(self.max_s, strategy(state)))


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
