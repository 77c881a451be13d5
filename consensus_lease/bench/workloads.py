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
from .pool import WorkerPool
from .stats import CallLog, median, summarize

__all__ = ["pool_rate", "w1_throughput", "w2_latency", "w5_batch"]

_BARRIER_S = 0.3
"""Workers start this long after the ``run`` request is sent (a common start time)."""


def pool_rate(pool: WorkerPool, workers: int, kind: str, target: Target, prefix: str,
              sizes: Sizes, duration_s: float | None = None,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Aggregate cycles/s of ``workers`` processes cycling at once on distinct jobs for
    ``duration_s`` (default W1's); ``extra`` goes into each worker's ``prepare``."""
    duration = sizes.w1_duration_s if duration_s is None else duration_s
    base = {"kind": kind, "url": target.url, "raw": target.raw, "ttl_s": sizes.session_ttl_s,
            "warmup": sizes.w1_warmup, **(extra or {})}
    pool.call([{**base, "op": "prepare", "prefix": f"{prefix}-w{i}", "owner": f"bench-w{i}"}
               for i in range(workers)], timeout_s=120.0)
    try:
        start_at = time.monotonic() + _BARRIER_S
        replies = pool.call(
            [{"op": "run", "start_at": start_at, "duration_s": duration,
              "max_cycles": 1_000_000} for _ in range(workers)],
            timeout_s=_BARRIER_S + duration + 60.0,
        )
    finally:
        pool.call([{"op": "close"}] * workers, timeout_s=60.0)
    cycles = sum(int(r["cycles"]) for r in replies)
    elapsed = max(float(r["end"]) for r in replies) - min(float(r["start"]) for r in replies)
    return {
        "cycles": cycles,
        "elapsed_s": elapsed,
        "cycles_per_s": cycles / elapsed if elapsed > 0 else math.nan,
        "worker_cpu_s": sum(float(r["cpu_s"]) for r in replies),
        "cpu_ms_per_cycle": 1000.0 * sum(float(r["cpu_s"]) for r in replies) / max(1, cycles),
        "threads": max(int(r.get("threads", 0)) for r in replies),
    }


def w1_throughput(target: Target, sizes: Sizes, pool: WorkerPool, prefix: str) -> dict[str, Any]:
    """Claim+complete cycles/s of ours and of the raw baseline, for each worker count;
    ``repeats`` alternating pairs, ratio = median of the per-pair ratios."""
    out: dict[str, Any] = {"duration_s": sizes.w1_duration_s, "repeats": sizes.w1_repeats,
                           "workers": {}}
    for workers in sizes.w1_workers:
        runs: dict[str, list[dict[str, Any]]] = {"ours": [], "raw": []}
        ratios = []
        for rep in range(sizes.w1_repeats):
            order = ("raw", "ours") if rep % 2 == 0 else ("ours", "raw")
            for kind in order:
                runs[kind].append(
                    pool_rate(pool, workers, kind, target, f"{prefix}-{kind}{workers}r{rep}",
                               sizes)
                )
            ratios.append(runs["ours"][-1]["cycles_per_s"] / runs["raw"][-1]["cycles_per_s"])
        out["workers"][str(workers)] = {
            "ours_cycles_per_s": median(r["cycles_per_s"] for r in runs["ours"]),
            "raw_cycles_per_s": median(r["cycles_per_s"] for r in runs["raw"]),
            "ours_cpu_ms_per_cycle": median(r["cpu_ms_per_cycle"] for r in runs["ours"]),
            "raw_cpu_ms_per_cycle": median(r["cpu_ms_per_cycle"] for r in runs["raw"]),
            "ratio": median(ratios),
            "ratios": ratios,
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
    fresh jobs each round. Store requests are counted by wrapping the backend's
    ``claim`` and ``claim_many``."""
    assert target.url is not None
    n = sizes.w5_batch
    with open_store(target.url) as store:
        max_batch = store.capabilities.max_batch_claim
        out: dict[str, Any] = {"batch": n, "max_batch_claim": max_batch,
                               "supported": max_batch > 1, "rounds": sizes.w5_rounds}
        calls = CallLog(store.backend, ("claim", "claim_many"))
        singles: list[float] = []
        batches: list[float] = []
        batch_requests: list[int] = []
        with store.session("bench-w5", sizes.session_ttl_s) as s:
            for r in range(sizes.w5_rounds):
                t0 = time.perf_counter()
                for i in range(n):
                    if s.claim(f"{prefix}-r{r}-single-{i}") is None:
                        raise RuntimeError("uncontended single claim refused")
                singles.append(time.perf_counter() - t0)
                if max_batch <= 1:
                    continue
                before = (calls.count("claim"), calls.count("claim_many"))
                t0 = time.perf_counter()
                leases = s.claim_many([f"{prefix}-r{r}-batch-{i}" for i in range(n)])
                batches.append(time.perf_counter() - t0)
                if any(lease is None for lease in leases):
                    raise RuntimeError("uncontended batch claim refused a job")
                single_calls = calls.count("claim") - before[0]
                many_calls = calls.count("claim_many") - before[1]
                # A driver that falls back to single claims inside claim_many shows
                # them as claim calls: then those are the store requests.
                batch_requests.append(single_calls if single_calls else many_calls)
        calls.restore()
    out["single_ms"] = summarize(singles, 1000.0)
    out["single_claims_per_s"] = n / median(singles)
    if out["supported"]:
        out["batch_ms"] = summarize(batches, 1000.0)
        out["batch_claims_per_s"] = n / median(batches)
        out["store_requests_per_batch"] = max(batch_requests)
        out["speedup"] = median(singles) / median(batches)
    else:
        out["note"] = (f"not supported: the {target.backend} backend declares "
                       "max_batch_claim == 1, so claim_many makes one request per job")
    return out
