"""W8: claim+complete cycles/s of one asyncio process against sync worker processes.

One worker process runs ``w8_tasks`` asyncio tasks (:mod:`.aiocycler`: one
:class:`~consensus_lease.aio.AsyncLeaseStore` with its default pool, one session), each
cycling ``claim`` + ``complete`` on its own fresh jobs; then ``w8_processes`` worker
processes run the sync cycle of W1, for the same time, on the same store; both after
W1's warm-up, in ``w8_windows`` measured windows. ``repeats`` alternating pairs; each
side's rate is the median of its windows over every repeat (with their spread), the
ratio (asyncio / processes) that of the two medians (``ratios``: per pair).
"""

from __future__ import annotations

import math
from typing import Any

from .config import Sizes, Target
from .pool import WorkerPool
from .stats import median
from .windows import paired_ratios, spread
from .workloads import pool_rate

__all__ = ["w8_async"]


def w8_async(target: Target, sizes: Sizes, pool: WorkerPool, prefix: str) -> dict[str, Any]:
    """See the module docstring."""
    runs: dict[str, list[dict[str, Any]]] = {"async": [], "processes": []}
    ratios = []
    window_ratios: list[float] = []
    for rep in range(sizes.w8_repeats):
        order = ("async", "processes") if rep % 2 == 0 else ("processes", "async")
        for side in order:
            if side == "async":
                run = pool_rate(pool, 1, "async", target, f"{prefix}-a{rep}", sizes,
                                sizes.w8_duration_s, sizes.w8_windows,
                                {"tasks": sizes.w8_tasks})
            else:
                run = pool_rate(pool, sizes.w8_processes, "ours", target, f"{prefix}-p{rep}",
                                sizes, sizes.w8_duration_s, sizes.w8_windows)
            runs[side].append(run)
        ratios.append(runs["async"][-1]["cycles_per_s"] / runs["processes"][-1]["cycles_per_s"])
        window_ratios += paired_ratios(runs["async"][-1]["windows"],
                                       runs["processes"][-1]["windows"])
    rates = {side: median(w for r in runs[side] for w in r["windows"]) for side in runs}
    return {
        "tasks": sizes.w8_tasks,
        "processes": sizes.w8_processes,
        "duration_s": sizes.w8_duration_s,
        "repeats": sizes.w8_repeats,
        "windows": sizes.w8_windows,
        "async_cycles_per_s": rates["async"],
        "async_spread": spread([w for r in runs["async"] for w in r["windows"]]),
        "processes_cycles_per_s": rates["processes"],
        "processes_spread": spread([w for r in runs["processes"] for w in r["windows"]]),
        "async_cpu_ms_per_cycle": median(r["cpu_ms_per_cycle"] for r in runs["async"]),
        "processes_cpu_ms_per_cycle": median(r["cpu_ms_per_cycle"] for r in runs["processes"]),
        "async_threads": max(int(r["threads"]) for r in runs["async"]),
        "ratio": rates["async"] / rates["processes"] if rates["processes"] > 0 else math.nan,
        "ratios": ratios,
        "ratio_spread": spread(window_ratios),
        "runs": runs,
    }
