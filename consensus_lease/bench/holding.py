"""W3: one worker holding many jobs. Renewal traffic must not grow with them.

For each size N: open a session (TTL ``w3_ttl_s``), claim N fresh jobs (with
``session.claim_many`` when ``capabilities.max_batch_claim > 1``, else one by one)
under ``tracemalloc``, then watch an idle window of ``w3_window_s`` seconds while the
session's own keepalive thread renews. Reported per N:

* ``renewal_requests_per_s``: calls of the backend instance's ``keepalive`` and
  ``renew`` in the window (both wrapped to record call times), as events per second
  from their spacing. A ZooKeeper client's own pings are kazoo's, below the backend
  interface, and not counted; they do not depend on N either.
* ``cpu_ms_per_s``: ``time.process_time()`` of the whole process over the window, per
  second (1000 = one core busy): the keepalive and watchdog threads, the client
  library's own threads, and the bench's progress bar (refreshed twice a second).
* ``bytes_per_lease``: Python heap still allocated after the claims (``tracemalloc``,
  after ``gc.collect()``) / N: the Lease objects plus the driver's per-job state. Memory
  held by C libraries (gRPC core) is not seen by tracemalloc.
* ``min_headroom_s``: the smallest renewal headroom in the window (time left before the
  session's local deadline when a renewal succeeded, from the store's observer; ``None``
  if nothing renewed): how close the holder came to losing its jobs.
"""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
from typing import Any

from ..observe import Observer
from ..states import SessionState
from ..store import open_store
from .config import Sizes, Target
from .stats import CallLog, rate_from_times

__all__ = ["w3_keepalive"]


class _Headroom(Observer):
    """Renewal headrooms (seconds) with their monotonic times."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: list[tuple[float, float]] = []

    def renewed(self, store: str, latency_s: float, headroom_s: float) -> None:
        with self._lock:
            self._seen.append((time.monotonic(), headroom_s))

    def smallest(self, start: float, end: float) -> float | None:
        with self._lock:
            return min((h for t, h in self._seen if start <= t <= end), default=None)


def _hold(target: Target, sizes: Sizes, n: int, prefix: str) -> dict[str, Any]:
    assert target.url is not None
    headroom = _Headroom()
    with open_store(target.url, observer=headroom) as store:
        calls = CallLog(store.backend, ("keepalive", "renew"))
        max_batch = store.capabilities.max_batch_claim
        with store.session(f"bench-w3-{n}", sizes.w3_ttl_s) as session:
            ids = [f"{prefix}-n{n}-{i}" for i in range(n)]
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                t0 = time.perf_counter()
                if max_batch > 1:
                    claimed = sum(lease is not None for lease in session.claim_many(ids))
                else:
                    claimed = sum(session.claim(j) is not None for j in ids)
                claim_s = time.perf_counter() - t0
                gc.collect()
                after = tracemalloc.get_traced_memory()[0]
            finally:
                tracemalloc.stop()
            if claimed != n:
                raise RuntimeError(f"claimed {claimed} of {n} uncontended jobs")
            cpu0, t_start = time.process_time(), time.monotonic()
            threading.Event().wait(sizes.w3_window_s)
            cpu1, t_end = time.process_time(), time.monotonic()
            keepalives = calls.times("keepalive", t_start, t_end)
            renews = calls.times("renew", t_start, t_end)
            requests = sorted(keepalives + renews)
            held_at_end = len(session.leases())
            state = session.state
        calls.restore()
    window = t_end - t_start
    return {
        "held": n,
        "claim_s": claim_s,
        "claims_per_s": n / claim_s if claim_s > 0 else None,
        "claim_mode": "claim_many" if max_batch > 1 else "claim loop",
        "window_s": window,
        "keepalive_calls": len(keepalives),
        "renew_calls": len(renews),
        "renewal_requests_per_s": rate_from_times(requests, window),
        "cpu_ms_per_s": 1000.0 * (cpu1 - cpu0) / window,
        "bytes_per_lease": (after - before) / n,
        "min_headroom_s": headroom.smallest(t_start, t_end),
        "held_at_end": held_at_end,
        "session_state_at_end": state.value,
        "ok": held_at_end == n and state is SessionState.ACTIVE,
    }


def w3_keepalive(target: Target, sizes: Sizes, prefix: str) -> dict[str, Any]:
    rows = [_hold(target, sizes, n, prefix) for n in sizes.w3_sizes]
    first, last = rows[0], rows[-1]
    return {
        "ttl_s": sizes.w3_ttl_s,
        "window_s": sizes.w3_window_s,
        "rows": rows,
        "renewal_growth": last["renewal_requests_per_s"] / first["renewal_requests_per_s"],
        "smallest": first["held"],
        "largest": last["held"],
    }
