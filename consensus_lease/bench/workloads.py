"""W1 cycle throughput, W2 latency and W5 batch claims (W3, W4, W6 have their own
modules: :mod:`.holding`, :mod:`.takeover`, :mod:`.peers`).

Each workload takes a :class:`~consensus_lease.bench.config.Target` and the run's
:class:`~consensus_lease.bench.config.Sizes` and returns a JSON-able dict.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..store import open_store
from .config import Sizes, Target
from .pool import PoolError, WorkerPool
from .roundtrips import TRANSPORTS, requests_total
from .stats import CallLog, median, summarize
from .windows import paired_ratios, spread

__all__ = ["pool_rate", "w1_throughput", "w2_latency", "w5_batch"]

_BARRIER_S = 0.3
"""Workers start this long after the ``run`` request is sent (a common start time)."""


def _aggregate(replies: list[dict[str, Any]], window_s: float) -> dict[str, Any]:
    """Sum the workers' windows: cycles/s and client CPU per cycle of each window."""
    n = len(replies[0]["counts"])
    counts = [sum(int(r["counts"][k]) for r in replies) for k in range(n)]
    rates = [c / window_s for c in counts]
    cpu_ms: list[float] = []
    cpu_total, cpu_cycles = 0.0, 0
    for k in range(n):
        cpu = [(float(r["cpu_s"][k]), int(r["counts"][k])) for r in replies
               if r["cpu_s"][k] is not None]
        spent, cycles = sum(c for c, _ in cpu), sum(m for _, m in cpu)
        cpu_total, cpu_cycles = cpu_total + spent, cpu_cycles + cycles
        cpu_ms.append(1000.0 * spent / cycles if cycles else math.nan)
    return {
        "window_s": window_s,
        "windows": rates,
        "cycles_per_s": median(rates),
        "spread": spread(rates),
        "cycles": sum(counts),
        "warm_cycles": sum(int(r["warm_cycles"]) for r in replies),
        "cpu_ms_windows": cpu_ms,
        "cpu_ms_per_cycle": 1000.0 * cpu_total / cpu_cycles if cpu_cycles else math.nan,
        "threads": max(int(r.get("threads", 0)) for r in replies),
    }


def pool_rate(pool: WorkerPool, workers: int, kind: str, target: Target, prefix: str,
              sizes: Sizes, duration_s: float | None = None, windows: int | None = None,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Aggregate cycles/s of ``workers`` processes cycling at once on distinct jobs:
    ``sizes.w1_warmup_s`` unmeasured, then ``windows`` windows over ``duration_s``
    (defaults W1's); ``extra`` goes into each worker's ``prepare``. The rate is the
    median of the windows' rates, with their ``spread``."""
    duration = sizes.w1_duration_s if duration_s is None else duration_s
    count = sizes.w1_windows if windows is None else windows
    window_s = duration / count
    base = {"kind": kind, "url": target.url, "raw": target.raw, "ttl_s": sizes.session_ttl_s,
            "warmup": sizes.w1_warmup, **(extra or {})}
    pool.call([{**base, "op": "prepare", "prefix": f"{prefix}-w{i}", "owner": f"bench-w{i}"}
               for i in range(workers)], timeout_s=120.0)
    try:
        start_at = time.monotonic() + _BARRIER_S
        replies = pool.call(
            [{"op": "run", "start_at": start_at, "warmup_s": sizes.w1_warmup_s,
              "windows": count, "window_s": window_s, "max_cycles": 10_000_000}
             for _ in range(workers)],
            timeout_s=_BARRIER_S + sizes.w1_warmup_s + duration + 60.0,
        )
    finally:
        pool.call([{"op": "close"}] * workers, timeout_s=60.0)
    return _aggregate(replies, window_s)


def count_requests(pool: WorkerPool, kind: str, target: Target, prefix: str,
                   sizes: Sizes) -> dict[str, Any]:
    """Store requests per claim+complete cycle of ``kind`` (``ours`` or ``raw``),
    counted at the transport on a client of their own in one worker (see
    :mod:`.roundtrips`); ``{"error": ..}`` if that fails."""
    unit = "statements" if target.backend in ("sqlite", "postgresql") else "requests"
    try:
        reply = pool.call([{"op": "count", "kind": kind, "url": target.url, "raw": target.raw,
                            "ttl_s": sizes.session_ttl_s, "owner": "bench-count",
                            "prefix": prefix, "warmup": sizes.w1_warmup,
                            "cycles": sizes.w1_count_cycles,
                            "transports": [t for b, t in TRANSPORTS.items()
                                           if b == target.backend]}],
                           timeout_s=120.0)[0]
    except PoolError as exc:
        return {"error": str(exc)[:400], "unit": unit}
    cycles = int(reply["cycles"])
    by_name = {k: n / cycles for k, n in sorted(reply["requests"].items())}
    return {"per_cycle": requests_total(reply["requests"]) / cycles, "by_name": by_name,
            "unit": unit, "cycles": cycles, "transports": reply["transports"]}


def _side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [w for r in runs for w in r["windows"]]
    cpu = [c for r in runs for c in r["cpu_ms_windows"]]
    return {"cycles_per_s": median(rates), "spread": spread(rates),
            "cpu_ms_per_cycle": median(r["cpu_ms_per_cycle"] for r in runs),
            "cpu_spread": spread(cpu)}


def w1_throughput(target: Target, sizes: Sizes, pool: WorkerPool, prefix: str) -> dict[str, Any]:
    """Claim+complete cycles/s of ours and of the raw baseline, for each worker count;
    ``repeats`` alternating pairs of runs of ``w1_windows`` windows each.

    Each side's rate is the median of all its windows (every repeat), with their
    spread; the ratio is ours over raw of those medians (``ratios``: per pair), and its
    spread that of window ``k`` of ours over window ``k`` of raw in the same pair.
    Client CPU per cycle is the worker processes' CPU time over the cycles; store
    requests per cycle are counted once per side on a separate client
    (:func:`count_requests`)."""
    out: dict[str, Any] = {"duration_s": sizes.w1_duration_s, "repeats": sizes.w1_repeats,
                           "windows": sizes.w1_windows, "warmup_s": sizes.w1_warmup_s,
                           "workers": {}}
    out["requests"] = {kind: count_requests(pool, kind, target, f"{prefix}-count-{kind}",
                                            sizes) for kind in ("ours", "raw")}
    for workers in sizes.w1_workers:
        runs: dict[str, list[dict[str, Any]]] = {"ours": [], "raw": []}
        ratios: list[float] = []
        window_ratios: list[float] = []
        for rep in range(sizes.w1_repeats):
            order = ("raw", "ours") if rep % 2 == 0 else ("ours", "raw")
            for kind in order:
                runs[kind].append(
                    pool_rate(pool, workers, kind, target, f"{prefix}-{kind}{workers}r{rep}",
                              sizes)
                )
            ours, raw = runs["ours"][-1], runs["raw"][-1]
            ratios.append(ours["cycles_per_s"] / raw["cycles_per_s"]
                          if raw["cycles_per_s"] > 0 else math.nan)
            window_ratios += paired_ratios(ours["windows"], raw["windows"])
        sides = {kind: _side(runs[kind]) for kind in ("ours", "raw")}
        raw_rate = sides["raw"]["cycles_per_s"]
        out["workers"][str(workers)] = {
            **{f"{kind}_{key}": value for kind, side in sides.items()
               for key, value in side.items()},
            "ratio": sides["ours"]["cycles_per_s"] / raw_rate if raw_rate > 0 else math.nan,
            "ratios": ratios,
            "ratio_spread": spread(window_ratios),
            "runs": runs,
        }
    return out


def w2_latency(target: Target, sizes: Sizes, prefix: str) -> dict[str, Any]:
    """p50/p99 (ms) of claim, ``lease.renew()`` and complete, one in-process worker."""
    assert target.url is not None
    claims: list[float] = []
    renews: list[float] = []
    completes: list[float] = []
    with open_store(target.url) as store, store.session("bench-w2", sizes.session_ttl_s) as s:
        for i in range(5):  # warm-up: connections, first-use costs
            lease = s.claim(f"{prefix}-warm-{i}")
            assert lease is not None
            lease.complete(b"")
        for i in range(sizes.w2_samples):
            t0 = time.perf_counter()
            lease = s.claim(f"{prefix}-{i}")
            t1 = time.perf_counter()
            assert lease is not None, "uncontended claim refused"
            lease.renew()
            t2 = time.perf_counter()
            lease.complete(b"")
            t3 = time.perf_counter()
            claims.append(t1 - t0)
            renews.append(t2 - t1)
            completes.append(t3 - t2)
    return {
        "samples": sizes.w2_samples,
        "claim_ms": summarize(claims, 1000.0),
        "renew_ms": summarize(renews, 1000.0),
        "complete_ms": summarize(completes, 1000.0),
    }


def w5_batch(target: Target, sizes: Sizes, prefix: str) -> dict[str, Any]:
    """``session.claim_many`` of ``w5_batch`` jobs against as many single claims, on
    fresh jobs each round: one untimed warm-up round, then up to ``w5_rounds`` measured
    rounds, fewer if ``w5_budget_s`` seconds of them have passed (at least one). The
    results are medians over the rounds with their spread (``*_spread``: n, median, min,
    max, p25, p75); the speedup's spread is that of each round's singles over its batch.
    Store requests are counted by wrapping the backend's ``claim`` and ``claim_many``."""
    assert target.url is not None
    n = sizes.w5_batch
    with open_store(target.url) as store:
        max_batch = store.capabilities.max_batch_claim
        out: dict[str, Any] = {"batch": n, "max_batch_claim": max_batch,
                               "supported": max_batch > 1, "rounds_planned": sizes.w5_rounds,
                               "budget_s": sizes.w5_budget_s}
        calls = CallLog(store.backend, ("claim", "claim_many"))
        singles: list[float] = []
        batches: list[float] = []
        batch_requests: list[int] = []
        with store.session("bench-w5", sizes.session_ttl_s) as s:
            _w5_round(s, n, max_batch, f"{prefix}-warm", calls)  # caches, statements
            give_up = time.monotonic() + sizes.w5_budget_s
            for r in range(sizes.w5_rounds):
                if r and time.monotonic() >= give_up:
                    break
                single_s, batch = _w5_round(s, n, max_batch, f"{prefix}-r{r}", calls)
                singles.append(single_s)
                if batch is not None:
                    batches.append(batch[0])
                    batch_requests.append(batch[1])
        calls.restore()
    out["rounds"] = len(singles)
    out["single_ms"] = summarize(singles, 1000.0)
    out["single_spread"] = spread([t * 1000.0 for t in singles])
    out["single_claims_per_s"] = n / median(singles)
    if out["supported"]:
        out["batch_ms"] = summarize(batches, 1000.0)
        out["batch_spread"] = spread([t * 1000.0 for t in batches])
        out["batch_claims_per_s"] = n / median(batches)
        out["store_requests_per_batch"] = max(batch_requests)
        out["speedup"] = median(singles) / median(batches)
        out["speedup_spread"] = spread(paired_ratios(singles, batches))
    else:
        out["note"] = (f"not supported: the {target.backend} backend declares "
                       "max_batch_claim == 1, so claim_many makes one request per job")
    return out


def _w5_round(session: Any, n: int, max_batch: int, name: str,
              calls: CallLog) -> tuple[float, tuple[float, int] | None]:
    """One W5 round on fresh jobs: seconds of ``n`` single claims, and (``None``
    without batching) seconds of one ``claim_many`` of ``n`` with its store requests."""
    t0 = time.perf_counter()
    for i in range(n):
        if session.claim(f"{name}-single-{i}") is None:
            raise RuntimeError("uncontended single claim refused")
    single_s = time.perf_counter() - t0
    if max_batch <= 1:
        return single_s, None
    before = (calls.count("claim"), calls.count("claim_many"))
    t0 = time.perf_counter()
    leases = session.claim_many([f"{name}-batch-{i}" for i in range(n)])
    batch_s = time.perf_counter() - t0
    if any(lease is None for lease in leases):
        raise RuntimeError("uncontended batch claim refused a job")
    single_calls = calls.count("claim") - before[0]
    many_calls = calls.count("claim_many") - before[1]
    # A driver that falls back to single claims inside claim_many shows them as claim
    # calls: then those are the store requests.
    return single_s, (batch_s, single_calls if single_calls else many_calls)
