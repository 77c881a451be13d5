"""W9: many sessions per process on a busy host; none may be lost.

Two phases on one store, each holding every session for ``w9_hold_s`` seconds while
``w9_hogs`` busy-loop processes (``python -c "while True: pass"``) keep the client
machine's cores busy, started before the sessions are opened and killed by PID after:

* ``spread``: ``w9_processes`` worker processes with ``w9_sessions_per_process``
  sessions each (10 x 1,000 by default);
* ``single``: one process with ``w9_single_sessions`` sessions (2,000 by default).

Sessions have TTL ``w9_ttl_s`` and renew on their store's shared renewal threads
(:mod:`consensus_lease._renewer`: one scheduler, one watchdog and the keepalive
runners, not two threads per session). A worker is a
subprocess (``python -m consensus_lease.bench.sessions worker URL N TTL HOLD``) that
opens its sessions with 20 threads (an open that fails is tried again, up to 5 times,
and counted), holds them, and prints one JSON line: sessions
lost (not ACTIVE at the end: each one a false loss, the cluster being healthy), the
renewals seen, their latency p50/p99/max (send to answer, from the store's observer)
and the smallest headroom (time left before the local deadline at a renewal), with the
losses split by cause: ``store_ended`` (the store ended the lease, e.g. before its TTL:
counted by the driver as an early revocation, which is the store's fault, not this
client's) and ``client`` (the local deadline passed: a false loss of this library).
Not a timed test: the goal (0 lost) is reported, never asserted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import BackendUnavailable, SessionExpired
from ..observe import Observer
from ..states import SessionState
from ..store import open_store
from .config import Sizes, Target

__all__ = ["w9_sessions"]

HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
"""A busy loop that ends when its parent does (a killed bench leaves no hog behind)."""
OPEN_TRIES = 5
"""Tries to open one session (a busy host's LeaseGrant may time out)."""


class _Renewals(Observer):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latencies: list[float] = []
        self.min_headroom_s: float | None = None

    def renewed(self, store: str, latency_s: float, headroom_s: float) -> None:
        with self._lock:
            self.latencies.append(latency_s)
            if self.min_headroom_s is None or headroom_s < self.min_headroom_s:
                self.min_headroom_s = headroom_s


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _worker(url: str, count: int, ttl_s: float, hold_s: float) -> dict[str, Any]:
    observer = _Renewals()
    refused = [0]  # session opens that failed (BackendUnavailable) and were tried again

    def open_one(store: Any, i: int) -> Any:
        for _ in range(OPEN_TRIES - 1):
            try:
                return store.session(f"s{i}", ttl_s)
            except BackendUnavailable:
                refused[0] += 1  # an overloaded host: opening is not what is measured
        return store.session(f"s{i}", ttl_s)

    with open_store(url, observer=observer) as store, ThreadPoolExecutor(20) as pool:
        opened = time.monotonic()
        sessions = list(pool.map(lambda i: open_one(store, i), range(count)))
        open_s = time.monotonic() - opened
        time.sleep(hold_s)  # the workload: hold every session this long
        threads = threading.active_count()
        lost = [s for s in sessions if s.state is not SessionState.ACTIVE]
        reasons: dict[str, int] = {}
        store_ended = sum(isinstance(s.lost_reason, SessionExpired) for s in lost)
        for session in lost:
            text = re.sub(r"\b(0x)?[0-9a-f]{8,}\b", "ID",  # one line per cause, not per id
                          str(session.lost_reason).split(": ", 1)[-1])[:80]
            reasons[text] = reasons.get(text, 0) + 1
        list(pool.map(lambda s: s.close(), sessions))
    latencies = sorted(observer.latencies)
    return {"sessions": count, "lost": len(lost), "store_ended": store_ended,
            "client_lost": len(lost) - store_ended,
            "threads": threads, "open_s": open_s, "open_retries": refused[0],
            "renewals": len(latencies), "p50_s": _quantile(latencies, 0.5),
            "p99_s": _quantile(latencies, 0.99), "max_s": latencies[-1] if latencies else None,
            "min_headroom_s": observer.min_headroom_s, "loss_reasons": reasons}


def _phase(url: str, processes: int, per_process: int, ttl_s: float,
           hold_s: float) -> dict[str, Any]:
    started = time.monotonic()
    workers = [subprocess.Popen(
        [sys.executable, "-m", "consensus_lease.bench.sessions", "worker", url,
         str(per_process), str(ttl_s), str(hold_s)], stdout=subprocess.PIPE, text=True)
        for _ in range(processes)]
    replies = []
    for worker in workers:
        out, _ = worker.communicate(timeout=hold_s + 600)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        replies.append(json.loads(lines[-1]) if lines else {"error": f"exit {worker.returncode}"})
    done = [r for r in replies if "error" not in r]
    p99s = [r["p99_s"] for r in done if r["p99_s"] is not None]
    heads = [r["min_headroom_s"] for r in done if r["min_headroom_s"] is not None]
    return {"processes": processes, "sessions": processes * per_process,
            "lost": sum(r["lost"] for r in done), "failed_workers": len(replies) - len(done),
            "store_ended": sum(r["store_ended"] for r in done),
            "client_lost": sum(r["client_lost"] for r in done),
            "threads_max_process": max((r["threads"] for r in done), default=None),
            "renewals": sum(r["renewals"] for r in done),
            "p99_s_worst_process": max(p99s) if p99s else None,
            "min_headroom_s": min(heads) if heads else None,
            "wall_s": time.monotonic() - started, "workers": replies}


def w9_sessions(target: Target, sizes: Sizes, prefix: str) -> dict[str, Any]:
    """Both phases (see the module docstring) on ``target``; the hogs run throughout."""
    assert target.url is not None  # sessions write no keys: the run's URL is enough
    url = target.url
    hogs = [subprocess.Popen([sys.executable, "-c", HOG])
            for _ in range(sizes.w9_hogs)]
    try:
        spread = _phase(url, sizes.w9_processes, sizes.w9_sessions_per_process,
                        sizes.w9_ttl_s, sizes.w9_hold_s)
        single = _phase(url, 1, sizes.w9_single_sessions, sizes.w9_ttl_s, sizes.w9_hold_s)
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(timeout=30)
    return {"ttl_s": sizes.w9_ttl_s, "hold_s": sizes.w9_hold_s, "hogs": sizes.w9_hogs,
            "spread": spread, "single": single,
            "lost": spread["lost"] + single["lost"]}


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "worker":
        url, count, ttl_s, hold_s = argv[1], int(argv[2]), float(argv[3]), float(argv[4])
        print(json.dumps(_worker(url, count, ttl_s, hold_s)), flush=True)
        return 0
    print("usage: python -m consensus_lease.bench.sessions worker URL N TTL_S HOLD_S",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
