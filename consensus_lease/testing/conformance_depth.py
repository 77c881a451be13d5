"""The queue-depth part of the conformance suite: a claim costs about the same in a
20,000-job queue as in a 200-job one, and ``queue_stats`` stays correct at that depth
while four workers claim.

Mixed into :class:`~consensus_lease.testing.conformance.BackendConformance`, so every
backend runs it (the issue-15 CI check); it uses that class's hooks (``open``, fixtures).
The 3x bound is generous on purpose — it catches a claim that reads the whole queue
(a 100x difference at this depth), not a few percent; the benchmark (W7) carries the real
goal.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ..record import EnqueueItem
from ..session import Session
from ..store import LeaseStore
from .conformance_batch import check_stats_total, run_stats_race

__all__ = ["DEEP_JOBS", "QueueDepthConformance"]

DEEP_JOBS = 20_000
"""Jobs in the deep queue (filled with ``enqueue_many``)."""

SHALLOW_JOBS = 200
"""Jobs in the shallow queue the deep one is compared with."""

SAMPLES = 30
"""Timed claims per queue (the median of each is compared)."""

RATIO = 3.0
"""The deep queue's median claim may take at most this many times the shallow one's..."""

SLACK_S = 0.002
"""... plus this much, for a busy shared machine (scheduling noise, not queue cost)."""


class QueueDepthConformance:
    """Claim cost and ``queue_stats`` at depth, on every backend."""

    open: Any
    long_ttl_s: float

    def test_claim_next_cost_does_not_grow_with_queue_depth(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Claims alternate between a 200-job and a 20,000-job queue (so both see the
        same load on the machine); each claimed job is completed, untimed. The deep
        queue's median ``claim_next`` is within 3x (+2 ms) of the shallow one's."""
        fill(store, "shallow", SHALLOW_JOBS)
        fill(store, "deep", DEEP_JOBS)
        worker = self.open(store, "W")
        timings: dict[str, list[float]] = {"shallow": [], "deep": []}
        for _ in range(SAMPLES):
            for queue, times in timings.items():
                started = time.perf_counter()
                lease = worker.claim_next(queue)
                times.append(time.perf_counter() - started)
                assert lease is not None
                lease.complete(b"")
        shallow = statistics.median(timings["shallow"])
        deep = statistics.median(timings["deep"])
        assert deep <= RATIO * shallow + SLACK_S, (
            f"claim_next median {deep * 1e3:.2f} ms at {DEEP_JOBS} jobs vs "
            f"{shallow * 1e3:.2f} ms at {SHALLOW_JOBS}")
        check_stats_total(store.queue_stats("deep"), DEEP_JOBS)
        assert store.queue_stats("deep").completed == SAMPLES

    def test_queue_stats_correct_at_depth_under_four_claimers(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """A 20,000-job queue; four workers claim and complete 25 jobs each while
        ``queue_stats`` is read: every read adds up to 20,000, and the end counts are
        exact."""
        fill(store, "deep", DEEP_JOBS)
        stats = store.queue_stats("deep")
        assert (stats.available, stats.held, stats.completed, stats.failed) == (
            DEEP_JOBS, 0, 0, 0)
        workers = [self.open(store, f"W{i}") for i in range(4)]
        run_stats_race(store, workers, "deep", DEEP_JOBS, per_worker=25)
        final = store.queue_stats("deep")
        check_stats_total(final, DEEP_JOBS)
        assert (final.held, final.completed, final.failed) == (0, 100, 0)


def fill(store: LeaseStore, queue: str, count: int) -> None:
    """Enqueue ``count`` jobs (small payloads) into ``queue`` with ``enqueue_many``."""
    items = [EnqueueItem(f"{queue}-{i:06d}", b"payload") for i in range(count)]
    assert all(store.enqueue_many(queue, items))
