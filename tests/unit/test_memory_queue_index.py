"""The memory backend's per-queue index (open jobs by seq, counts, holders) agrees, after
every step of a random workload, with what reading every job says."""

from __future__ import annotations

import contextlib
import random

from consensus_lease import (
    EnqueueItem,
    JobState,
    LeaseError,
    LeaseState,
    LeaseStore,
    SessionState,
    open_store,
)
from consensus_lease.backend import Backend
from consensus_lease.backends.memory import MemoryBackend
from consensus_lease.clock import FakeClock
from consensus_lease.lease import Lease
from consensus_lease.session import Session

QUEUES = ("a", "b")


def brute_candidates(store: LeaseStore, clock: FakeClock, queue: str) -> list[str]:
    """Claimable jobs of ``queue`` in enqueue order, from every job's record."""
    return [
        j.record.job_id for j in store.queue_jobs(queue)
        if j.record.state is JobState.AVAILABLE
        and (j.record.not_before is None or j.record.not_before <= clock.time())
    ]


def check(store: LeaseStore, clock: FakeClock, seen: set[str]) -> None:
    backend = store.backend
    assert isinstance(backend, MemoryBackend)
    for queue in QUEUES:
        stats = backend.queue_stats(queue)
        assert stats == Backend.queue_stats(backend, queue)
        seen.update(name for name in ("available", "held", "completed", "failed")
                    if getattr(stats, name))
        got = [job_id for job_id, _ in backend.queue_candidates(queue, 10_000)]
        assert got == brute_candidates(store, clock, queue)


def step(rng: random.Random, store: LeaseStore, clock: FakeClock,
         workers: list[Session], held: list[Lease], counter: list[int]) -> None:
    """One random operation."""
    queue = rng.choice(QUEUES)
    action = rng.randrange(9)
    if action == 0:
        items = []
        for _ in range(rng.randrange(1, 6)):
            counter[0] += 1
            items.append(EnqueueItem(f"{queue}-{counter[0]}", b"", rng.choice([None, 1, 2])))
        store.enqueue_many(queue, items)
    elif action in (1, 2):
        lease = rng.choice(workers).claim_next(queue)
        if lease is not None:
            held.append(lease)
    elif action == 3 and held:
        lease = held.pop(rng.randrange(len(held)))
        if lease.state is LeaseState.HELD:
            lease.complete(b"")
    elif action == 4 and held:
        lease = held.pop(rng.randrange(len(held)))
        if lease.state is LeaseState.HELD:
            lease.fail("boom", retry_in_s=rng.choice([0.0, 5.0]))
    elif action == 5 and held:
        lease = held.pop(rng.randrange(len(held)))
        if lease.state is LeaseState.HELD:
            lease.release()
    elif action == 6:
        failed = [j.record.job_id for j in store.queue_jobs(queue)
                  if j.record.state is JobState.FAILED]
        if failed:
            store.requeue(rng.choice(failed))
    elif action == 7:
        clock.advance(rng.choice([1.0, 6.0, 25.0]))  # retry delays pass, sessions expire
    else:
        store.purge(queue)


def test_index_agrees_with_every_job_under_a_random_workload() -> None:
    clock = FakeClock()
    store = open_store("memory://", store_clock=clock)
    seen: set[str] = set()
    try:
        for seed in range(2):
            rng = random.Random(seed)
            workers = [store.session(f"W{i}", 20.0, keepalive=False) for i in range(3)]
            held: list[Lease] = []
            counter = [seed * 100_000]
            for _ in range(300):
                # LeaseError: the store expired a session its worker thought alive
                with contextlib.suppress(LeaseError):
                    step(rng, store, clock, workers, held, counter)
                workers = [
                    w if w.state not in (SessionState.LOST, SessionState.CLOSED)
                    else store.session(w.owner, 20.0, keepalive=False) for w in workers]
                check(store, clock, seen)
            for worker in workers:
                worker.close()
            check(store, clock, seen)
    finally:
        store.close()
    assert seen == {"available", "held", "completed", "failed"}  # every state was exercised
