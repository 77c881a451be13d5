"""W7: cost of a work queue as it grows deep, and the rate of filling it.

One queue per backend grows step by step to each depth of ``w7_depths`` (plus
``w7_deep_depths`` on the backends in ``w7_deep_backends``); at each depth D:

* the queue is topped up with ``store.enqueue_many`` to D + ``w7_samples`` + the warm-up
  cycles' AVAILABLE jobs, so it holds at least D open jobs while measured;
* ``claim_next`` + ``lease.complete`` is timed ``w7_samples`` times (after a few
  warm-up cycles), one in-process worker, one session: p50/p99 of the cycle and of the
  ``claim_next`` alone;
* ``store.queue_stats`` is timed ``w7_stats_samples`` times;
* the completed jobs are purged (``store.purge``), so the next step starts with only
  open jobs again.

A step is skipped, with the reason written down, when the depth is above the backend's
documented ``capabilities.max_queue_jobs``, when filling it would overrun the run's
fill budget at the fill rate measured so far, or when the store fails at a smaller
depth (``QueueFull``, ``BackendUnavailable``...: the error is written down as
``failed``); sampling at one depth also stops at ``w7_step_budget_s``. The deeper steps
after a skipped one are skipped too.

Enqueue rates, on a queue of their own: ``w7_rate_jobs`` single ``enqueue`` calls (or
as many as fit in ``w7_rate_budget_s``) against one ``enqueue_many`` of
``w7_rate_jobs * 10`` jobs. The backend's ``enqueue`` and ``enqueue_many`` are counted
on the instance (:class:`~.stats.CallLog`): a driver without a native batch shows one
``enqueue`` per job inside ``enqueue_many``.

The server's size is read at each depth where the server tells it (etcd: the member's
``dbSize`` from ``Status``; ZooKeeper: ``zk_approximate_data_size`` and
``zk_znode_count`` of ``mntr``, if four-letter words are allowed), against a reading
taken just before the deep queue is filled: the row's ``server`` (``bytes_per_job``,
``znodes_per_job``) is the growth over the open jobs, the figure the capacity model
(docs/capacity.md) is checked against.

Afterwards the bench's own W7 key prefix (etcd) or chroot (ZooKeeper) is deleted with
the raw client, within ``w7_cleanup_budget_s``; a SQLite file is the run's temporary
file; PostgreSQL's W7 jobs are in the run's schema, dropped when the run ends. The
store URL of W7 is the target's with ``-w7`` appended to its prefix (etcd, ZooKeeper),
so the deep queue never slows the other workloads.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ..errors import LeaseError
from ..record import EnqueueItem
from ..store import LeaseStore, open_store
from .config import Sizes, Target
from .stats import CallLog, summarize

__all__ = ["depths_for", "w7_depth"]

_WARMUP = 5
"""Untimed claim_next+complete cycles at each depth before the samples."""

_FILL_CHUNK = 10_000
"""Jobs per ``enqueue_many`` call while filling (the store splits it further into
``max_enqueue_batch`` chunks); between calls the fill budget is checked."""


def depths_for(backend: str, sizes: Sizes) -> tuple[int, ...]:
    """The depths W7 measures on ``backend``, smallest first."""
    deep = sizes.w7_deep_depths if backend in sizes.w7_deep_backends else ()
    return tuple(sorted({*sizes.w7_depths, *deep}))


def w7_url(url: str) -> str:
    """``url`` with ``-w7`` appended to its path (the etcd key prefix or ZooKeeper
    chroot); a SQLite or memory URL is returned as it is."""
    parts = urlsplit(url)
    if parts.scheme not in ("etcd", "zk") or not parts.path.strip("/"):
        return url
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "-w7"))


def _items(prefix: str, start: int, count: int, payload: bytes) -> Iterator[EnqueueItem]:
    for i in range(start, start + count):
        yield EnqueueItem(f"{prefix}-{i:08d}", payload)


class _Filler:
    """Tops one queue up with ``enqueue_many`` and keeps the fill rate and budget."""

    def __init__(self, store: LeaseStore, queue: str, payload: bytes, budget_s: float) -> None:
        self.store, self.queue, self.payload = store, queue, payload
        self.ids = f"{queue}-j"
        self.deadline = time.monotonic() + budget_s
        self.enqueued = 0
        self.fill_s = 0.0

    @property
    def rate(self) -> float | None:
        """Jobs/s of the filling so far, or ``None`` before any."""
        return self.enqueued / self.fill_s if self.enqueued and self.fill_s > 0 else None

    def would_overrun(self, jobs: int) -> str | None:
        """Why adding ``jobs`` would overrun the budget, or ``None``."""
        rate = self.rate
        left = self.deadline - time.monotonic()
        if rate is not None and jobs / rate > left:
            return (f"filling {jobs:,} more jobs would take ~{jobs / rate:.0f} s at the "
                    f"{rate:,.0f} jobs/s measured; {max(0.0, left):.0f} s of the fill "
                    "budget left")
        return None

    def add(self, jobs: int) -> None:
        """Enqueue ``jobs`` fresh jobs; ``TimeoutError`` once past the budget."""
        done = 0
        while done < jobs:
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"fill budget spent after {self.enqueued:,} jobs")
            n = min(_FILL_CHUNK, jobs - done)
            t0 = time.perf_counter()
            self.store.enqueue_many(self.queue, _items(self.ids, self.enqueued, n, self.payload))
            self.fill_s += time.perf_counter() - t0
            self.enqueued += n
            done += n


def _cycles(store: LeaseStore, queue: str, samples: int, budget_s: float,
            owner: str, ttl_s: float) -> tuple[list[float], list[float]]:
    """``(cycle_s, claim_s)`` of up to ``samples`` claim_next+complete cycles."""
    cycles: list[float] = []
    claims: list[float] = []
    with store.session(owner, ttl_s) as s:
        for _ in range(_WARMUP):
            lease = s.claim_next(queue)
            if lease is None:
                raise RuntimeError(f"claim_next found nothing in {queue!r} while warming up")
            lease.complete(b"")
        stop_at = time.monotonic() + budget_s
        for _ in range(samples):
            t0 = time.perf_counter()
            lease = s.claim_next(queue)
            t1 = time.perf_counter()
            if lease is None:
                raise RuntimeError(f"claim_next found nothing in {queue!r} (uncontended)")
            lease.complete(b"")
            t2 = time.perf_counter()
            claims.append(t1 - t0)
            cycles.append(t2 - t0)
            if time.monotonic() > stop_at:
                break
    return cycles, claims


def _stats(store: LeaseStore, queue: str, samples: int, budget_s: float
           ) -> tuple[list[float], int]:
    """Times of up to ``samples`` ``queue_stats`` calls, and the last count of open
    (available + held) jobs."""
    times: list[float] = []
    open_jobs = 0
    stop_at = time.monotonic() + budget_s
    for _ in range(samples):
        t0 = time.perf_counter()
        stats = store.queue_stats(queue)
        times.append(time.perf_counter() - t0)
        open_jobs = stats.available + stats.held
        if time.monotonic() > stop_at:
            break
    return times, open_jobs


def server_size(target: Target) -> dict[str, int] | None:
    """What the server says of its size (see the module docstring), or ``None``."""
    try:
        if target.backend == "etcd":
            import pyetcd

            client = pyetcd.client(host=target.raw["host"], port=int(target.raw["port"]),
                                   timeout=10)
            try:
                return {"bytes": int(client.status().db_size)}
            finally:
                client.close()
        if target.backend == "zookeeper":
            from ..testing.cluster import four_letter_word

            host, _, port = str(target.raw["hosts"]).rpartition(":")
            reply = four_letter_word(host, int(port), "mntr")
            found = dict(line.split("\t", 1) for line in reply.splitlines() if "\t" in line)
            return {"bytes": int(found["zk_approximate_data_size"]),
                    "znodes": int(found["zk_znode_count"])}
    except Exception:  # not allowed or not answered: the figure is simply not reported
        return None
    return None


def _growth(before: dict[str, int] | None, after: dict[str, int] | None,
            open_jobs: int) -> dict[str, float] | None:
    if before is None or after is None or open_jobs <= 0:
        return None
    return {f"{k}_per_job": (after[k] - before[k]) / open_jobs for k in after if k in before}


def _measure_step(store: LeaseStore, target: Target, sizes: Sizes, queue: str,
                  filler: _Filler, missing: int, baseline: dict[str, int] | None,
                  row: dict[str, Any]) -> int:
    """Fill, time and purge one depth into ``row``; return the jobs consumed."""
    fill_before = (filler.enqueued, filler.fill_s)
    filler.add(missing)
    added, spent = filler.enqueued - fill_before[0], filler.fill_s - fill_before[1]
    row["fill_jobs_per_s"] = added / spent if added and spent > 0 else None
    stats_s, open_jobs = _stats(store, queue, sizes.w7_stats_samples, sizes.w7_step_budget_s)
    row["open_jobs_seen"] = open_jobs
    row["server"] = _growth(baseline, server_size(target), open_jobs)
    cycles, claims = _cycles(store, queue, sizes.w7_samples, sizes.w7_step_budget_s,
                             f"bench-w7-{row['depth']}", sizes.session_ttl_s)
    row["cycle_ms"] = summarize(cycles, 1000.0)
    row["claim_next_ms"] = summarize(claims, 1000.0)
    row["queue_stats_ms"] = summarize(stats_s, 1000.0)
    t0 = time.perf_counter()
    row["purged"] = store.purge(queue)
    row["purge_ms"] = 1000.0 * (time.perf_counter() - t0)
    return len(cycles) + _WARMUP


def _steps(store: LeaseStore, target: Target, sizes: Sizes, queue: str
           ) -> list[dict[str, Any]]:
    capacity = store.capabilities.max_queue_jobs
    payload = b"p" * sizes.w7_payload_bytes
    filler = _Filler(store, queue, payload, sizes.w7_fill_budget_s)
    consumed = 0
    baseline = server_size(target)
    rows: list[dict[str, Any]] = []
    skip: str | None = None
    for depth in depths_for(target.backend, sizes):
        row: dict[str, Any] = {"depth": depth}
        rows.append(row)
        want = depth + sizes.w7_samples + _WARMUP
        missing = want - (filler.enqueued - consumed)
        if skip is None and capacity is not None and want > capacity:
            skip = (f"above the backend's documented capacity (max_queue_jobs = "
                    f"{capacity:,})")
        if skip is None:
            skip = filler.would_overrun(missing)
        if skip is not None:
            row["skipped"] = skip
            continue
        try:
            consumed += _measure_step(store, target, sizes, queue, filler, missing, baseline,
                                      row)
        except (TimeoutError, LeaseError) as exc:  # QueueFull, BackendUnavailable, ...
            for key in [k for k in row if k != "depth"]:
                del row[key]
            skip = row["failed"] = f"{type(exc).__name__}: {exc}"[:400]
            row["skipped"] = f"failed: {skip}"
    return rows


def _rates(store: LeaseStore, sizes: Sizes, queue: str) -> dict[str, Any]:
    """Single ``enqueue`` against ``enqueue_many`` jobs/s, and the store requests each
    made (counted on the backend instance)."""
    payload = b"p" * sizes.w7_payload_bytes
    calls = CallLog(store.backend, ("enqueue", "enqueue_many"))
    try:
        for item in _items(f"{queue}-w", 0, _WARMUP, payload):  # connections, first use
            store.enqueue(queue, item.job_id, item.payload)
        singles = 0
        stop_at = time.monotonic() + sizes.w7_rate_budget_s
        t0 = time.perf_counter()
        for item in _items(f"{queue}-s", 0, sizes.w7_rate_jobs, payload):
            store.enqueue(queue, item.job_id, item.payload)
            singles += 1
            if time.monotonic() > stop_at:
                break
        single_s = time.perf_counter() - t0
        before = (calls.count("enqueue"), calls.count("enqueue_many"))
        many = sizes.w7_rate_jobs * 10
        t0 = time.perf_counter()
        store.enqueue_many(queue, _items(f"{queue}-m", 0, many, payload))
        many_s = time.perf_counter() - t0
        inner_single = calls.count("enqueue") - before[0]
        requests = inner_single if inner_single else calls.count("enqueue_many") - before[1]
    finally:
        calls.restore()
    single_rate = singles / single_s if single_s > 0 else None
    many_rate = many / many_s if many_s > 0 else None
    return {
        "enqueue_jobs": singles,
        "enqueue_jobs_per_s": single_rate,
        "enqueue_many_jobs": many,
        "enqueue_many_jobs_per_s": many_rate,
        "enqueue_many_requests": requests,
        "max_enqueue_batch": store.capabilities.max_enqueue_batch,
        "speedup": many_rate / single_rate if single_rate and many_rate else None,
    }


def _cleanup(target: Target, url: str, budget_s: float) -> str:
    """Delete W7's own prefix (etcd) or chroot (ZooKeeper) with the raw client; say
    what happens to the rest (PostgreSQL: the run's schema is dropped at its end)."""
    if target.backend == "etcd":
        import pyetcd

        path = urlsplit(url).path.rstrip("/")
        client = pyetcd.client(host=target.raw["host"], port=int(target.raw["port"]),
                               timeout=max(10, int(budget_s)))
        try:
            client.delete_prefix(path)
        finally:
            client.close()
        return f"deleted the etcd keys under {path}"
    if target.backend == "zookeeper":
        return _zk_delete_tree(str(target.raw["hosts"]), urlsplit(url).path.rstrip("/"),
                               budget_s)
    if target.backend == "postgresql":
        schema = dict(parse_qsl(urlsplit(url).query)).get("schema", "?")
        return (f"nothing to delete now: W7's jobs are in the run's schema {schema}, "
                "dropped (DROP SCHEMA ... CASCADE) when the run ends")
    return "nothing to delete (the run's temporary SQLite file, or a memory store)"


def _zk_delete_tree(hosts: str, root: str, budget_s: float) -> str:
    """Delete ``root`` and everything under it, leaves first, many deletes in flight."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError

    client = KazooClient(hosts=hosts, timeout=10.0)
    client.start(timeout=15.0)
    stop_at = time.monotonic() + budget_s
    deleted = 0
    try:
        order: list[str] = []
        stack = [root]
        while stack:  # parents before children; deleted in reverse
            if time.monotonic() > stop_at:
                return f"cleanup budget spent while listing {root}"
            path = stack.pop()
            order.append(path)
            with contextlib.suppress(NoNodeError):
                stack.extend(f"{path}/{c}" for c in client.get_children(path))
        window = 500
        for start in range(len(order), 0, -window):
            if time.monotonic() > stop_at:
                return f"cleanup budget spent: {deleted:,} of {len(order):,} znodes deleted"
            # children before parents: ZooKeeper applies one client's requests in order
            chunk = reversed(order[max(0, start - window):start])
            pending = [client.delete_async(p) for p in chunk]
            for result in pending:
                with contextlib.suppress(NoNodeError):
                    result.get(timeout=30.0)
                deleted += 1
    finally:
        client.stop()
        client.close()
    return f"deleted {deleted:,} znodes under {root}"


def w7_depth(target: Target, sizes: Sizes, prefix: str) -> dict[str, Any]:
    """Latency of ``claim_next`` + ``complete`` and of ``queue_stats`` at each depth,
    and ``enqueue`` / ``enqueue_many`` rates (see the module docstring)."""
    assert target.url is not None
    url = w7_url(target.url)
    out: dict[str, Any] = {"samples": sizes.w7_samples, "payload_bytes": sizes.w7_payload_bytes,
                           "fill_budget_s": sizes.w7_fill_budget_s}
    try:
        with open_store(url) as store:
            out["max_queue_jobs"] = store.capabilities.max_queue_jobs
            out["rates"] = _rates(store, sizes, f"{prefix}-rate")
            out["rows"] = _steps(store, target, sizes, f"{prefix}-deep")
    finally:
        t0 = time.monotonic()
        try:
            out["cleanup"] = _cleanup(target, url, sizes.w7_cleanup_budget_s)
        except Exception as exc:
            out["cleanup"] = f"failed: {type(exc).__name__}: {exc}"[:300]
        out["cleanup_s"] = time.monotonic() - t0
    measured = [r for r in out["rows"] if "cycle_ms" in r]
    out["smallest"] = measured[0]["depth"] if measured else None
    out["largest"] = measured[-1]["depth"] if measured else None
    first = measured[0]["cycle_ms"]["p50"] if measured else 0.0
    out["p50_growth"] = measured[-1]["cycle_ms"]["p50"] / first if first > 0 else None
    return out
