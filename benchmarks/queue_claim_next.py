"""Work-queue throughput: worker processes drain one queue with ``claim_next`` +
``complete`` until it is empty; jobs completed per second of wall time, on any backend.

    python benchmarks/queue_claim_next.py sqlite:////tmp/q.db
    python benchmarks/queue_claim_next.py etcd://127.0.0.11:2379,127.0.0.12:2379,127.0.0.13:2379
    python benchmarks/queue_claim_next.py --kit etcd        # starts the container kit's cluster

The store must support work queues (``capabilities.queues``). Each run uses a fresh
queue (``bench-<random>``), purged afterwards. The jobs are enqueued first (timed
separately); each worker process (multiprocessing *spawn*: no client crosses a fork)
opens its own store and session before a common start signal, then loops
``claim_next(queue)`` + ``lease.complete(b"")`` until ``claim_next`` returns ``None``
(nothing claimable: the rest is held by others). The run checks that every job was
completed exactly once.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from consensus_lease import JobState, open_store


@dataclass
class WorkerResult:
    jobs: list[str]
    claim_s: list[float]  # latency of each successful claim_next
    complete_s: list[float]
    empty_polls: int


def _worker(url: str, queue: str, ttl_s: float, ready: Any, go: Any, out: Any,
            named: list[str] | None) -> None:
    try:
        with open_store(url) as store, store.session(f"w-{mp.current_process().pid}",
                                                      ttl_s) as session:
            result = WorkerResult([], [], [], 0)
            todo = iter(named or ())
            ready.release()
            go.wait()
            while True:
                start = time.perf_counter()
                if named is None:
                    lease = session.claim_next(queue)
                else:
                    job = next(todo, None)
                    lease = None if job is None else session.claim(job)
                if lease is None:
                    result.empty_polls += 1
                    break
                claimed = time.perf_counter()
                lease.complete(b"")
                result.claim_s.append(claimed - start)
                result.complete_s.append(time.perf_counter() - claimed)
                result.jobs.append(lease.job_id)
            out.put(("ok", result))
    except BaseException as exc:  # report, never hang the parent
        ready.release()
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def _ms(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(url: str, jobs: int, workers: int, payload_bytes: int, ttl_s: float,
        named: bool = False) -> dict[str, Any]:
    """One run. ``named``: the baseline instead, each worker claiming its own share of
    the jobs by name (``claim`` + ``complete``, no queue), same counts."""
    queue = f"bench-{uuid.uuid4().hex[:10]}"
    payload = b"p" * payload_bytes
    ids = [f"{queue}-{i:06d}" for i in range(jobs)]
    with open_store(url) as store:
        if not store.capabilities.queues:
            raise SystemExit(f"{store.backend.scheme}: this backend has no work queues")
        start = time.perf_counter()
        for job in ids:
            if not named:
                store.enqueue(queue, job, payload)
        enqueue_s = time.perf_counter() - start

        ctx = mp.get_context("spawn")
        ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=_worker, args=(url, queue, ttl_s, ready, go, out,
                                              ids[w::workers] if named else None))
            for w in range(workers)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            ready.acquire(timeout=120)
        start = time.perf_counter()
        go.set()
        results: list[WorkerResult] = []
        errors: list[str] = []
        for _ in procs:
            kind, value = out.get(timeout=600)
            (results if kind == "ok" else errors).append(value)
        wall_s = time.perf_counter() - start
        for p in procs:
            p.join(timeout=30)
        if errors:
            raise SystemExit("worker failed: " + "; ".join(errors))

        done = [j for r in results for j in r.jobs]
        if named:
            ok = len(done) == len(set(done)) == jobs
            purged = 0
        else:
            stats = store.queue_stats(queue)
            ok = (len(done) == len(set(done)) == jobs and stats.completed == jobs
                  and all(j.record.state is JobState.COMPLETED
                          for j in store.queue_jobs(queue)))
            purged = store.purge(queue)
        claims = [s for r in results for s in r.claim_s]
        completes = [s for r in results for s in r.complete_s]
        return {
            "backend": store.backend.scheme + (" (named baseline)" if named else ""),
            "jobs": jobs,
            "workers": workers,
            "payload_bytes": payload_bytes,
            "enqueue_per_s": jobs / enqueue_s if not named else float("nan"),
            "wall_s": wall_s,
            "jobs_per_s": jobs / wall_s,
            "per_worker": sorted(len(r.jobs) for r in results),
            "claim_next_p50_ms": _ms(claims, 0.5),
            "claim_next_p99_ms": _ms(claims, 0.99),
            "complete_p50_ms": _ms(completes, 0.5),
            "complete_p99_ms": _ms(completes, 0.99),
            "each_job_once": ok,
            "purged": purged,
        }


def report(r: dict[str, Any], rates: dict[str, list[float]]) -> None:
    rates.setdefault(r["backend"], []).append(r["jobs_per_s"])
    print(
        f"{r['backend']}: {r['jobs']} jobs, {r['workers']} workers: "
        f"{r['jobs_per_s']:.0f} jobs/s (wall {r['wall_s']:.2f} s; "
        f"enqueue {r['enqueue_per_s']:.0f}/s); claim p50/p99 "
        f"{r['claim_next_p50_ms']:.1f}/{r['claim_next_p99_ms']:.1f} ms, complete "
        f"p50/p99 {r['complete_p50_ms']:.1f}/{r['complete_p99_ms']:.1f} ms; "
        f"per worker {r['per_worker']}; each job once: {r['each_job_once']}",
        flush=True,
    )
    if not r["each_job_once"]:
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", help="store URL (sqlite:///..., etcd://..., zk://...)")
    parser.add_argument("--kit", choices=["etcd", "zookeeper"],
                        help="start the container kit's 3-member cluster and use it")
    parser.add_argument("--jobs", type=int, default=400, help="jobs to enqueue (default 400)")
    parser.add_argument("--workers", type=int, default=8, help="worker processes (default 8)")
    parser.add_argument("--payload-bytes", type=int, default=64, help="default 64")
    parser.add_argument("--ttl", type=float, default=30.0, help="session TTL, s (default 30)")
    parser.add_argument("--repeat", type=int, default=1, help="runs (default 1)")
    parser.add_argument("--baseline", action="store_true",
                        help="also run the baseline: the same claim+complete cycles on "
                             "named jobs, each worker its own share (the queue's ceiling)")
    args = parser.parse_args()
    if (args.url is None) == (args.kit is None):
        parser.error("give a URL or --kit")

    cluster: Any = None
    url = args.url
    if args.kit is not None:
        from consensus_lease.testing.cluster import EtcdCluster, ZooKeeperCluster

        cluster = (EtcdCluster() if args.kit == "etcd" else ZooKeeperCluster()).start()
        url = cluster.url_with_prefix(f"qbench-{uuid.uuid4().hex[:8]}")
    try:
        rates: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            for named in (False, True) if args.baseline else (False,):
                report(run(url, args.jobs, args.workers, args.payload_bytes, args.ttl, named),
                       rates)
        for backend, values in rates.items():
            if len(values) > 1:
                print(f"{backend}: median of {len(values)}: "
                      f"{statistics.median(values):.0f} jobs/s")
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
