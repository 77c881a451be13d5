"""Queue drain by the worker runner with the fused completion on and off (issue 27, item 3).

Each round enqueues ``--jobs`` no-op jobs on a queue of its own, then times
``run_worker(store, queue, noop, concurrency=SLOTS, until_empty=True, fused_claim=...)``
(thread mode in this process, the store opened once before; the time includes the end of
the drain: the last slot's ``claim_next`` waiting ``--claim-wait-s`` and the drained
check) and checks every job COMPLETED exactly once. Rounds alternate fused on / off for
each slot count. One extra, smaller counted round per configuration reports the store
operations per job: backend calls made by the slot threads (keepalives and the waiting
claim's poller left out) and SQL statements (:mod:`consensus_lease.bench.roundtrips`;
never on a timed round). Prints JSON. Example::

    eval "$(bash scripts/start-postgres.sh)"
    python benchmarks/worker_fused_ab.py --stores sqlite postgresql --slots 1 4 \\
        --jobs 5000 --rounds 3 --scratch /work/brief/scratch/me
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from consensus_lease import JobState, Lease, LeaseStore, open_store
from consensus_lease.bench.roundtrips import counting, requests_total
from consensus_lease.worker import run_worker

OPERATIONS = (
    "open_session", "close_session", "claim", "claim_many", "claim_from_queue",
    "queue_candidates", "complete", "complete_many", "complete_and_claim_next", "release",
    "fail", "queue_stats",
)
"""Backend calls a slot makes itself, each one store round trip."""

TRANSPORT = {"sqlite": "sqlite3", "postgresql": "psycopg"}


def noop(lease: Lease, payload: bytes) -> bytes:
    return b""


@contextlib.contextmanager
def store_url(kind: str, scratch: Path) -> Iterator[str]:
    """A URL of an empty store of ``kind``: a fresh SQLite file, or a fresh schema of the
    PostgreSQL server named by ``CONSENSUS_LEASE_POSTGRES_URL``."""
    if kind == "sqlite":
        path = scratch / f"drain-{os.getpid()}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        yield f"sqlite:///{path}"
        return
    from consensus_lease.testing.postgresql import fresh_schema, postgres_url

    base = postgres_url()
    with fresh_schema(base) as schema:
        yield f"{base}?schema={schema}"


def drain(store: LeaseStore, queue: str, jobs: int, slots: int, fused: bool,
          claim_wait_s: float) -> dict[str, Any]:
    ids = [f"{queue}-{i}" for i in range(jobs)]
    store.enqueue_many(queue, ids)
    started = time.perf_counter()
    stats = run_worker(store, queue, noop, concurrency=slots, until_empty=True,
                       fused_claim=fused, claim_wait_s=claim_wait_s)
    elapsed = time.perf_counter() - started
    records = [store.get(j) for j in ids]
    done = sum(1 for r in records if r is not None and r.state is JobState.COMPLETED
               and r.attempt == 1)
    if done != jobs or stats.completed != jobs or stats.errors:
        raise SystemExit(f"{queue}: {done} of {jobs} completed once; {stats.summary()}")
    store.purge(queue)
    return {"jobs_per_s": jobs / elapsed, "elapsed_s": elapsed,
            "fused_claims": stats.fused_claims}


def counted(url: str, queue: str, jobs: int, slots: int, fused: bool, transport: str,
            claim_wait_s: float) -> dict[str, float]:
    """Store operations per job of one drain (on a store opened while counting)."""
    calls: Counter[str] = Counter()
    with counting([transport]) as statements, open_store(url) as store:
        store.enqueue_many(queue, [f"{queue}-{i}" for i in range(jobs)])
        backend = store.backend
        for name in OPERATIONS:
            original = getattr(backend, name)

            def wrapped(*args: Any, _name: str = name, _original: Any = original,
                        **kwargs: Any) -> Any:
                if threading.current_thread().name.startswith("consensus-lease-worker-"):
                    calls[_name] += 1
                return _original(*args, **kwargs)

            setattr(backend, name, wrapped)
        statements.reset()
        run_worker(store, queue, noop, concurrency=slots, until_empty=True,
                   fused_claim=fused, claim_wait_s=claim_wait_s)
        by_statement = statements.snapshot()
        store.purge(queue)
    return {"backend_calls_per_job": sum(calls.values()) / jobs,
            "statements_per_job": requests_total(by_statement) / jobs,
            "calls": dict(calls), "statements": by_statement}  # type: ignore[dict-item]


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", nargs="+", default=["sqlite"],
                        choices=["sqlite", "postgresql"])
    parser.add_argument("--slots", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--counted-jobs", type=int, default=1000)
    parser.add_argument("--claim-wait-s", type=float, default=0.02)
    parser.add_argument("--scratch", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    results: list[dict[str, Any]] = []
    for kind in args.stores:
        with store_url(kind, args.scratch) as url:
            for slots in args.slots:
                rates: dict[bool, list[float]] = {True: [], False: []}
                with open_store(url) as store:
                    for n in range(args.rounds):
                        for fused in (True, False) if n % 2 == 0 else (False, True):
                            queue = f"drain-{slots}-{int(fused)}-{n}"
                            rates[fused].append(drain(store, queue, args.jobs, slots, fused,
                                                      args.claim_wait_s)["jobs_per_s"])
                for fused in (True, False):
                    ops = counted(url, f"counted-{slots}-{int(fused)}", args.counted_jobs,
                                  slots, fused, TRANSPORT[kind], args.claim_wait_s)
                    results.append({"store": kind, "slots": slots, "fused": fused,
                                    "jobs_per_s": spread(rates[fused]),
                                    "rounds": rates[fused], **ops})
                    print(json.dumps(results[-1]), file=sys.stderr)
    json.dump({"jobs": args.jobs, "rounds": args.rounds, "results": results}, sys.stdout,
              indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
