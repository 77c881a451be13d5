"""The batch part of the conformance suite: ``enqueue_many``, the declared queue capacity
(``QueueFull``), ``claim_many`` keeping the rules of ``claim``, and ``queue_stats``
consistent while workers claim.

Mixed into :class:`~consensus_lease.testing.conformance.BackendConformance`, so every
backend runs it; it uses that class's hooks (``open``, fixtures). Everything is driven
by the backend's :class:`~consensus_lease.backend.Capabilities`: ``max_enqueue_batch``
(how :meth:`~consensus_lease.LeaseStore.enqueue_many` chunks, and what is atomic) and
``max_queue_jobs`` (filled and refused if small enough to fill in seconds, else checked to
be documented).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import threading
import time
from collections.abc import Collection, Sequence
from typing import Any

import pytest

from ..errors import InvalidArgument, QueueFull
from ..record import EnqueueItem, JobState, QueueStats
from ..session import Session
from ..store import LeaseStore

__all__ = ["BatchConformance", "check_stats_total", "documented_capacity", "run_stats_race"]

FILL_LIMIT = 20_000
"""A declared ``max_queue_jobs`` up to this is filled by the capacity test; above it the
test checks the value is documented instead (filling would take too long)."""

WAIT_S = 60.0
"""Upper bound for joins and waits in these tests."""


def check_stats_total(stats: QueueStats, total: int) -> None:
    """Every job is in exactly one state: the four counts add up to ``total``."""
    counts = (stats.available, stats.held, stats.completed, stats.failed)
    assert min(counts) >= 0, stats
    assert sum(counts) == total, (stats, total)


def documented_capacity(backend: object) -> str:
    """The docstrings where a backend documents its capacity: its class, its module and
    the package the module belongs to."""
    cls = type(backend)
    module = sys.modules[cls.__module__]
    package = sys.modules.get(cls.__module__.rpartition(".")[0])
    return "\n".join(d or "" for d in (cls.__doc__, module.__doc__,
                                       package.__doc__ if package else ""))


class _Spy:
    """Wraps ``backend.enqueue_many``, recording the size of each call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sizes: list[int] = []

    def __call__(self, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
        self.sizes.append(len(items))
        result: list[bool] = self.inner(queue, items)
        return result


class BatchConformance:
    """enqueue_many, capacity, claim_many and queue_stats, on every backend."""

    open: Any
    _assert_newer: Any
    short_ttl_s: float
    long_ttl_s: float

    def test_enqueue_many_answers_in_order_and_is_idempotent(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        assert store.enqueue("bq", "a") is True
        items: list[Any] = [EnqueueItem("b", b"pb", 2), ("a", b"other"), "c", ("d", b"pd")]
        assert store.enqueue_many("bq", items) == [True, False, True, True]
        jobs = store.queue_jobs("bq")
        assert [j.record.job_id for j in jobs] == ["a", "b", "c", "d"]  # enqueue order
        assert [j.payload for j in jobs] == [b"", b"pb", b"", b"pd"]  # "a" left unchanged
        assert [j.record.max_attempts for j in jobs][1] == 2
        assert all(j.record.state is JobState.AVAILABLE for j in jobs)
        assert store.enqueue_many("bq", items) == [False] * 4
        assert store.enqueue_many("bq", (x for x in ["e"])) == [True]  # any iterable
        assert store.enqueue_many("bq", []) == []
        check_stats_total(store.queue_stats("bq"), 5)
        worker = self.open(store, "W")
        taken = {lease.job_id for lease in (worker.claim_next("bq") for _ in range(5)) if lease}
        assert taken == {"a", "b", "c", "d", "e"}

    def test_enqueue_many_bad_input_sends_nothing(
        self, store: LeaseStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        spy = _Spy(store.backend.enqueue_many)
        monkeypatch.setattr(store.backend, "enqueue_many", spy)
        too_big = b"x" * (store.capabilities.max_payload_bytes + 1)
        bad: list[list[Any]] = [
            ["ok", "dup", "dup"],  # duplicate job id
            ["ok", 42],
            ["ok", ("x",)],
            ["ok", ("x", "text payload")],
            ["ok", ""],
            ["ok", EnqueueItem("big", too_big)],
            ["ok", EnqueueItem("zero", b"", 0)],
        ]
        for items in bad:
            with pytest.raises(InvalidArgument):
                store.enqueue_many("bq", items)
        with pytest.raises(InvalidArgument):
            store.enqueue_many("", ["ok"])
        assert spy.sizes == []  # refused before anything was sent
        assert store.queue_jobs("bq") == [] and store.get("ok") is None

    def test_enqueue_many_job_outside_the_queue_refuses_its_chunk(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """A job of another queue, or a named job, in the batch: InvalidArgument, and of
        the batch only the chunks before the offending one are in (none when the batch
        fits one atomic chunk; each job is its own chunk where ``max_enqueue_batch`` is 1)."""
        assert store.enqueue("other", "taken")
        named = self.open(store, "A").claim("named")
        assert named is not None
        size = max(1, store.capabilities.max_enqueue_batch)
        for intruder in ("taken", "named"):
            queue = f"bq-{intruder}"
            items = [f"{intruder}-new-1", intruder, f"{intruder}-new-2"]
            with pytest.raises(InvalidArgument):
                store.enqueue_many(queue, items)
            before = items[: items.index(intruder) // size * size]
            assert [j.record.job_id for j in store.queue_jobs(queue)] == before
        assert [j.record.job_id for j in store.queue_jobs("other")] == ["taken"]

    def test_enqueue_many_splits_into_chunks_of_max_enqueue_batch(
        self, store: LeaseStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The store sends chunks of ``max_enqueue_batch`` (here at most 3) in order;
        after a refused chunk the earlier ones are in, and calling again adds only what
        is missing."""
        size = min(3, max(1, store.capabilities.max_enqueue_batch))
        monkeypatch.setattr(store.backend, "capabilities", dataclasses.replace(
            store.capabilities, max_enqueue_batch=size))
        spy = _Spy(store.backend.enqueue_many)
        monkeypatch.setattr(store.backend, "enqueue_many", spy)
        ids = [f"c-{i}" for i in range(8)]
        assert store.enqueue_many("chunks", ids) == [True] * 8
        assert spy.sizes == [size] * (8 // size) + ([8 % size] if 8 % size else [])
        assert [j.record.job_id for j in store.queue_jobs("chunks")] == ids
        assert store.enqueue("elsewhere", "intruder")
        more = [f"m-{i}" for i in range(7)]
        with pytest.raises(InvalidArgument):
            store.enqueue_many("more", [*more[:4], "intruder", *more[4:]])
        sent = 4 // size * size  # the chunks before the intruder's
        assert [j.record.job_id for j in store.queue_jobs("more")] == more[:sent]
        assert store.enqueue_many("more", more) == [False] * sent + [True] * (7 - sent)

    def test_queue_capacity_is_enforced_or_documented(self, store: LeaseStore) -> None:
        """``max_queue_jobs``: ``None`` (disk- or memory-bound) must be documented by the
        backend; a limit small enough to fill in seconds is filled and enforced with
        QueueFull (nothing of the refused request added, re-enqueueing an existing job
        still answers False, a purge makes room); a larger one must be documented."""
        capacity = store.capabilities.max_queue_jobs
        docs = documented_capacity(store.backend)
        if capacity is None:
            assert "max_queue_jobs" in docs, "the backend must document its queue capacity"
            return
        assert capacity >= 1
        if capacity > FILL_LIMIT:
            spelled = {str(capacity), f"{capacity:,}", f"{capacity:_}"}
            assert any(s in docs for s in spelled), f"max_queue_jobs {capacity} not documented"
            return
        ids = [f"full-{i:06d}" for i in range(capacity)]
        assert all(store.enqueue_many("full", ids))
        with pytest.raises(QueueFull):
            store.enqueue("full", "one-more")
        with pytest.raises(QueueFull):
            store.enqueue_many("full", [ids[0], "one-more"])
        assert store.get("one-more") is None
        assert store.enqueue("full", ids[0]) is False
        assert store.enqueue_many("full", ids[:2]) == [False, False]
        check_stats_total(store.queue_stats("full"), capacity)
        worker = store.session("W", self.long_ttl_s)
        try:
            lease = worker.claim_next("full")
            assert lease is not None
            lease.complete(b"")
        finally:
            worker.close()
        assert store.purge("full") == 1
        assert store.enqueue("full", "one-more") is True

    def test_claim_many_keeps_the_rules_of_claim(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Generation +1 over the last claim, attempt counted, a used-up budget FAILED,
        a completed job and a job held elsewhere: ``None``."""
        store.enqueue_many("cm", [EnqueueItem("once", b"", 1), "again", "done", "held"])
        a, b = self.open(store, "A"), self.open(store, "B")
        first = {j: a.claim(j) for j in ("once", "again", "done", "held")}
        assert all(first.values())
        for job_id in ("once", "again"):
            lease = first[job_id]
            assert lease is not None
            lease.release()
        done = first["done"]
        assert done is not None
        done.complete(b"r")
        got = dict(zip(["once", "again", "done", "held", "fresh"],
                       b.claim_many(["once", "again", "done", "held", "fresh"]), strict=True))
        assert got["once"] is None and got["done"] is None and got["held"] is None
        again, fresh, old = got["again"], got["fresh"], first["again"]
        assert again is not None and fresh is not None and old is not None
        self._assert_newer(store, old.generation, again.generation)
        assert again.attempt == 2 and fresh.attempt == 1
        once = store.get("once")
        assert once is not None and once.state is JobState.FAILED
        done_record = store.get("done")
        assert done_record is not None and done_record.state is JobState.COMPLETED
        stats = store.queue_stats("cm")
        assert (stats.available, stats.held, stats.completed, stats.failed) == (0, 2, 1, 1)

    def test_queue_stats_consistent_under_four_claimers(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Four threads claim, complete (and fail a fifth of the jobs, whose budget is one
        attempt) while the main thread reads ``queue_stats``: at every read the counts
        add up to the jobs enqueued, at most four are held, completed and failed never
        go down; at the end every job is COMPLETED or FAILED."""
        total = 120
        items = [EnqueueItem(f"s-{i:03d}", b"", 1 if i % 5 == 0 else None) for i in range(total)]
        assert all(store.enqueue_many("sq", items))
        failing = {item.job_id for item in items if item.max_attempts == 1}
        run_stats_race(store, [self.open(store, f"W{i}") for i in range(4)], "sq", total,
                       failing)
        final = store.queue_stats("sq")
        assert (final.available, final.held) == (0, 0)
        assert (final.completed, final.failed) == (total - total // 5, total // 5)

    def test_async_enqueue_many(self, store: LeaseStore) -> None:
        from ..aio import AsyncLeaseStore

        async def main() -> None:
            astore = AsyncLeaseStore(store)
            assert await astore.enqueue_many("aq", ["a", ("b", b"p")]) == [True, True]
            assert await astore.enqueue_many("aq", ["b", "c"]) == [False, True]
            with pytest.raises(InvalidArgument):
                await astore.enqueue_many("aq", ["d", "d"])
            stats = await astore.queue_stats("aq")
            check_stats_total(stats, 3)

        asyncio.run(asyncio.wait_for(main(), WAIT_S))
        assert [j.record.job_id for j in store.queue_jobs("aq")] == ["a", "b", "c"]


def run_stats_race(
    store: LeaseStore, workers: list[Session], queue: str, total: int,
    failing: Collection[str] = (), per_worker: int = 0,
) -> list[QueueStats]:
    """Each worker thread claims and ends jobs of ``queue`` (``fail`` for the jobs in
    ``failing``, enqueued with a one-attempt budget; else ``complete``) until the queue
    has nothing for it, or ``per_worker`` jobs (0: no limit; bounded by ``total``
    anyway), while this thread reads ``queue_stats`` and checks each read against
    ``total``. Returns the reads."""
    errors: list[BaseException] = []
    running = threading.Event()
    running.set()

    def work(session: Session) -> None:
        try:
            for _ in range(per_worker or total):
                lease = session.claim_next(queue)
                if lease is None:
                    return
                if lease.job_id in failing:
                    lease.fail("no luck", retry_in_s=0)
                else:
                    lease.complete(b"")
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    reads: list[QueueStats] = []
    give_up = time.monotonic() + WAIT_S
    while any(t.is_alive() for t in threads) and time.monotonic() < give_up:
        stats = store.queue_stats(queue)
        check_stats_total(stats, total)
        assert stats.held <= len(workers), stats
        if reads:
            assert stats.completed >= reads[-1].completed, (reads[-1], stats)
            assert stats.failed >= reads[-1].failed, (reads[-1], stats)
        reads.append(stats)
    for t in threads:
        t.join(timeout=WAIT_S)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    check_stats_total(store.queue_stats(queue), total)
    return reads
