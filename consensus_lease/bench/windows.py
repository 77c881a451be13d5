"""Measured windows: a warm-up, then several equal windows, so that every rate is a
median with a spread instead of one number from one stretch of time.

A loop that cycles calls :meth:`Windows.record` with the monotonic time at which each
cycle ended. Cycles that end before ``start + warmup_s`` are warm-up (counted apart,
never in a rate); the rest fall into ``windows`` windows of ``window_s`` seconds each,
by end time; a cycle that ends after the last window is dropped and stops the loop.

Every process of a run gets the same ``start`` (``CLOCK_MONOTONIC`` is one clock for the
whole machine), so the windows of all workers line up and can be summed.

Client CPU is sampled with :func:`time.process_time` (every thread of the process: gRPC's
and kazoo's threads too) when the first cycle ends at or after each window boundary, so
the CPU between two samples is that of exactly as many cycles as the window counted
(shifted by one cycle).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from .stats import median, percentile

__all__ = ["Windows", "paired_ratios", "spread"]


class Windows:
    """Counts cycles and client CPU per window (see the module docstring).

    Args:
        start: monotonic seconds at which the warm-up begins (shared by every worker).
        warmup_s: seconds of unmeasured cycles before the first window.
        windows: how many measured windows (at least 1).
        window_s: seconds per window (more than 0).
    """

    def __init__(self, start: float, warmup_s: float, windows: int, window_s: float) -> None:
        if windows < 1 or window_s <= 0 or warmup_s < 0:
            raise ValueError(f"bad windows: {windows=} {window_s=} {warmup_s=}")
        self.window_s = window_s
        first = start + warmup_s
        self.bounds = [first + k * window_s for k in range(windows + 1)]
        self.counts = [0] * windows
        self.warm = 0
        self._cpu: list[float | None] = [None] * (windows + 1)
        self._next = 0

    @property
    def end(self) -> float:
        """Monotonic time at which the last window ends."""
        return self.bounds[-1]

    def record(self, now: float) -> bool:
        """Count one cycle that ended at monotonic ``now``; ``False`` once past the end."""
        bounds = self.bounds
        while self._next < len(bounds) and now >= bounds[self._next]:
            self._cpu[self._next] = time.process_time()
            self._next += 1
        k = self._next - 1
        if k < 0:
            self.warm += 1
            return True
        if k >= len(self.counts):
            return False
        self.counts[k] += 1
        return True

    def cpu_s(self) -> list[float | None]:
        """Client CPU seconds per window (``None`` where no cycle ended after its end)."""
        out: list[float | None] = []
        for before, after in zip(self._cpu, self._cpu[1:], strict=False):
            out.append(after - before if before is not None and after is not None else None)
        return out

    def as_dict(self) -> dict[str, Any]:
        """``counts``, ``cpu_s``, ``window_s``, ``warm_cycles`` (JSON-able)."""
        return {"counts": list(self.counts), "cpu_s": self.cpu_s(), "window_s": self.window_s,
                "warm_cycles": self.warm}


def spread(values: Sequence[float]) -> dict[str, float | int]:
    """``{"n", "median", "min", "max", "p25", "p75"}`` of ``values`` (``nan`` for none)."""
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not finite:
        return {"n": 0, "median": math.nan, "min": math.nan, "max": math.nan,
                "p25": math.nan, "p75": math.nan}
    return {"n": len(finite), "median": median(finite), "min": min(finite),
            "max": max(finite), "p25": percentile(finite, 25), "p75": percentile(finite, 75)}


def paired_ratios(ours: Sequence[float], other: Sequence[float]) -> list[float]:
    """Window ``k`` of one side over window ``k`` of the other (same repeat), for the
    range of a ratio: it moves with the noise of both sides."""
    return [a / b for a, b in zip(ours, other, strict=False) if b > 0]
