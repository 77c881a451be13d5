"""Small measuring helpers: percentiles, summaries, and counting a backend's calls."""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["CallLog", "percentile", "rate_from_times", "summarize"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between the closest
    ranks (numpy's default method). ``nan`` for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: Sequence[float], scale: float = 1.0) -> dict[str, float | int]:
    """``{"n", "p50", "p99", "mean", "max"}`` of ``values`` multiplied by ``scale``."""
    scaled = [v * scale for v in values]
    return {
        "n": len(scaled),
        "p50": percentile(scaled, 50),
        "p99": percentile(scaled, 99),
        "mean": statistics.fmean(scaled) if scaled else math.nan,
        "max": max(scaled) if scaled else math.nan,
    }


def median(values: Iterable[float]) -> float:
    items = list(values)
    return statistics.median(items) if items else math.nan


def rate_from_times(times: Sequence[float], window_s: float) -> float:
    """Events per second: from the spacing of the events when there are at least two
    (exact even for few events), else the count over the window."""
    if len(times) >= 2 and times[-1] > times[0]:
        return (len(times) - 1) / (times[-1] - times[0])
    return len(times) / window_s if window_s > 0 else math.nan


class CallLog:
    """Records the monotonic time of every call of some methods of *one* object.

    The methods are wrapped on the instance (an instance attribute shadows the class's
    method), so other instances are untouched; :meth:`restore` removes the wrappers.
    Calls the object makes to itself through ``self.name(...)`` are recorded too.
    """

    def __init__(self, target: object, names: Sequence[str]) -> None:
        self._target = target
        self._names = tuple(names)
        self._lock = threading.Lock()
        self._times: dict[str, list[float]] = {name: [] for name in self._names}
        for name in self._names:
            setattr(target, name, self._wrap(name, getattr(target, name)))

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        times = self._times[name]

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                times.append(time.monotonic())
            return method(*args, **kwargs)

        return wrapper

    def times(self, name: str, since: float = -math.inf, until: float = math.inf) -> list[float]:
        """Call times of ``name`` within ``[since, until]``."""
        with self._lock:
            return [t for t in self._times[name] if since <= t <= until]

    def count(self, name: str) -> int:
        with self._lock:
            return len(self._times[name])

    def restore(self) -> None:
        for name in self._names:
            if name in vars(self._target):
                delattr(self._target, name)
