"""The sides of W10 (:mod:`.drain`), each run in a subprocess of its own:
``python -m consensus_lease.bench.drainsides drain|wake SPEC_JSON``.

``drain``: enqueue ``jobs`` jobs (batched), close the enqueueing connection, print a
``{"ready": ...}`` line, wait for a line on stdin (the parent snapshots the server
then), drain the queue with the side's worker, and print one JSON line: the drain's
seconds (from the go line to the end of the last handler), the client CPU of the drain
(this process and its reaped children), and the exactly-once check (every job's handler
ran exactly once).

``wake``: an idle worker, jobs enqueued one at a time ``wake_gap_s`` apart; prints
the seconds from each enqueue's return to its handler's start.

=================  ============================================================
side               worker
=================  ============================================================
``ours``           :func:`consensus_lease.worker.run_worker`, ``until_empty=True``
                   (``processes`` > 1: ``mode="process"``)
``raw-STORE``      the raw client's two-request loop (:mod:`.drainraw`)
``pgqueuer``       ``QueueManager.run(mode=drain, batch_size=...)`` on asyncpg
``procrastinate``  ``app.run_worker_async(wait=False, concurrency=...)``
=================  ============================================================
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["runner_knobs"]

SEEN_ENV = "CONSENSUS_LEASE_W10_SEEN"
"""Where a worker process of ``ours`` appends ``job_id monotonic_end`` lines."""

_seen_file: Any = None


def record_handler(lease: Any, payload: bytes) -> bytes:
    """The no-op job of ``ours``: records the job id and the time it ended."""
    global _seen_file
    if _seen_file is None:
        _seen_file = open(f"{os.environ[SEEN_ENV]}.{os.getpid()}", "a", buffering=1)  # noqa: SIM115
    _seen_file.write(f"{lease.job_id} {time.monotonic()}\n")
    return b""


BATCHED_KNOBS = {"prefetch": 200, "complete_batch": 100, "complete_flush_s": 0.05}
"""The runner's throughput setting of docs/worker.md (where this version of the runner
has those knobs): claims of up to 100 jobs per round trip (``claim_next_many``: half of
``prefetch``, refilled at half), completions of up to 100 per ``complete_many``, sent
within 50 ms."""


def runner_knobs() -> dict[str, Any]:
    """The :data:`BATCHED_KNOBS` that ``run_worker`` takes (none before the runner had
    prefetch and batched completion: then W10 has no batched side)."""
    from ..worker import run_worker

    params = inspect.signature(run_worker).parameters
    return {name: value for name, value in BATCHED_KNOBS.items() if name in params}


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _check(ids: list[str], expected: int) -> dict[str, Any]:
    distinct = len(set(ids))
    return {"handled": len(ids), "distinct": distinct, "duplicates": len(ids) - distinct,
            "missing": expected - distinct, "exactly_once": len(ids) == distinct == expected}


def _handshake(enqueue: Callable[[], None]) -> float:
    started = time.monotonic()
    enqueue()
    enqueue_s = time.monotonic() - started
    print(json.dumps({"ready": True, "enqueue_s": enqueue_s}), flush=True)
    sys.stdin.readline()
    return enqueue_s


# -- ours ------------------------------------------------------------------------------

def _ours_drain(spec: dict[str, Any]) -> dict[str, Any]:
    from ..store import open_store
    from ..worker import run_worker

    queue, n = spec["queue"], spec["jobs"]
    seen = f"{spec['scratch']}/{queue}"
    os.environ[SEEN_ENV] = seen

    def enqueue() -> None:
        with open_store(spec["url"]) as store:
            store.enqueue_many(queue, [f"{queue}-{i}" for i in range(n)])

    _handshake(enqueue)
    cpu, go = _cpu_s(), time.monotonic()
    processes = int(spec.get("processes", 1))
    stats = run_worker(spec["url"], queue, "consensus_lease.bench.drainsides:record_handler",
                       concurrency=processes, mode="process" if processes > 1 else "thread",
                       until_empty=True, claim_wait_s=0.2, **spec.get("knobs", {}))
    end, cpu = time.monotonic(), _cpu_s() - cpu
    if _seen_file is not None:
        _seen_file.close()
    ids, _ = _read_seen(seen)
    return {"drain_s": end - go, "client_cpu_s": cpu,
            "completed": stats.completed, "errors": stats.errors, **_check(ids, n)}


def _read_seen(prefix: str) -> tuple[list[str], list[float]]:
    folder, base = os.path.split(prefix)
    ids: list[str] = []
    ends: list[float] = []
    for name in os.listdir(folder):
        if name.startswith(base + "."):
            with open(os.path.join(folder, name)) as lines:
                for line in lines:
                    job, end = line.split()
                    ids.append(job)
                    ends.append(float(end))
            os.unlink(os.path.join(folder, name))
    return ids, ends


# -- ours and the peers, woken from idle -------------------------------------------------

def _ours_wake(spec: dict[str, Any]) -> dict[str, Any]:
    from ..store import open_store
    from ..worker import run_worker

    queue, started = spec["queue"], threading.Event()
    begun: list[float] = []

    def handler(lease: Any, payload: bytes) -> bytes:
        begun.append(time.monotonic())
        started.set()
        return b""

    stop = threading.Event()
    worker = threading.Thread(target=run_worker, args=(spec["url"], queue, handler),
                              kwargs={"stop_event": stop, "grace_s": 5.0,
                                      **spec.get("knobs", {})}, daemon=True)
    worker.start()
    latencies = []
    with open_store(spec["url"]) as store:
        for i in range(spec["wake_samples"] + 1):
            time.sleep(spec["wake_gap_s"])  # the workload: the worker goes idle
            started.clear()
            store.enqueue(queue, f"{queue}-w{i}")
            enqueued = time.monotonic()
            if not started.wait(30):
                raise RuntimeError(f"job {i} not started within 30 s")
            latencies.append(begun[-1] - enqueued)
    stop.set()
    worker.join(30)
    return {"latencies_s": latencies[1:]}


def main(argv: list[str]) -> int:
    from . import drainpeers, drainraw

    what, spec = argv[0], json.loads(argv[1])
    kind = spec["side"]
    table: dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]] = {
        ("drain", "ours"): _ours_drain, ("wake", "ours"): _ours_wake,
        **{("drain", f"raw-{store}"): loop for store, loop in drainraw.LOOPS.items()},
        ("drain", "pgqueuer"): lambda s: asyncio.run(drainpeers.pgqueuer_drain(s)),
        ("drain", "procrastinate"): lambda s: asyncio.run(drainpeers.procrastinate_drain(s)),
        ("wake", "pgqueuer"): lambda s: asyncio.run(drainpeers.pgqueuer_wake(s)),
        ("wake", "procrastinate"): lambda s: asyncio.run(drainpeers.procrastinate_wake(s)),
        ("fence", "ours"): drainpeers.ours_fence_child,
    }
    print(json.dumps(table[(what, kind)](spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
