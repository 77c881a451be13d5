"""SQLite queues at depth: ``cl_queue_counts`` kept by triggers (also for writers that
bypass this version's statements, and filled once for a store written before it existed),
and ``enqueue_many`` / ``claim_many`` as one transaction each."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from consensus_lease import EnqueueItem, LeaseStore, QueueStats, open_store
from consensus_lease.backends.sqlite import QUEUE_OBJECTS, SqliteBackend


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/jobs.db"


@pytest.fixture
def store(url: str) -> Iterator[LeaseStore]:
    store = open_store(url)
    yield store
    store.close()


def counts(stats: QueueStats) -> tuple[int, int, int, int]:
    return stats.available, stats.held, stats.completed, stats.failed


def fill_states(store: LeaseStore) -> None:
    """Queue ``q``: 2 COMPLETED, 1 FAILED, 1 held, 6 available; queue ``r``: 3 available."""
    store.enqueue_many("q", [EnqueueItem(f"q-{i}", b"", 1 if i == 2 else None)
                             for i in range(10)])
    store.enqueue_many("r", ["r-0", "r-1", "r-2"])
    worker = store.session("W", 30)
    for job_id in ("q-0", "q-1"):
        lease = worker.claim(job_id)
        assert lease is not None
        lease.complete(b"")
    lease = worker.claim("q-2")
    assert lease is not None
    lease.fail("boom", retry_in_s=0)
    assert worker.claim("q-3") is not None
    assert worker.claim("named-job") is not None  # in no queue: counted nowhere


def test_counts_follow_every_state_change(store: LeaseStore) -> None:
    fill_states(store)
    assert counts(store.queue_stats("q")) == (6, 1, 2, 1)
    assert counts(store.queue_stats("r")) == (3, 0, 0, 0)
    store.requeue("q-2")
    assert counts(store.queue_stats("q")) == (7, 1, 2, 0)
    assert store.purge("q") == 2
    assert counts(store.queue_stats("q")) == (7, 1, 0, 0)
    assert counts(store.queue_stats("none")) == (0, 0, 0, 0)


def test_an_expired_holder_leaves_its_job_available(store: LeaseStore) -> None:
    store.enqueue_many("q", ["a", "b"])
    worker = store.session("W", 30, keepalive=False)
    lease = worker.claim_next("q")
    assert lease is not None
    held = store.queue_stats("q")
    assert counts(held) == (1, 1, 0, 0) and held.oldest_held_lease_until is not None
    backend = store.backend
    assert isinstance(backend, SqliteBackend)
    backend.expire_session(worker.session_id)
    after = store.queue_stats("q")
    assert counts(after) == (2, 0, 0, 0) and after.oldest_held_lease_until is None


def test_writers_bypassing_the_library_keep_the_counts(store: LeaseStore, url: str) -> None:
    """An earlier version's statements (no knowledge of the counts) still keep them: the
    triggers live in the file."""
    store.enqueue_many("q", ["a", "b", "c"])
    raw = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        raw.execute("UPDATE cl_jobs SET completed_at = 1.0 WHERE job_id = 'a'")
        raw.execute("UPDATE cl_jobs SET failed_at = 1.0 WHERE job_id = 'b'")
        raw.execute("INSERT INTO cl_jobs (job_id, generation, queue, seq) VALUES ('d', 0, 'q', 99)")
        raw.execute("DELETE FROM cl_jobs WHERE job_id = 'c'")
    finally:
        raw.close()
    assert counts(store.queue_stats("q")) == (1, 0, 1, 1)


def test_a_store_written_before_the_counts_gets_them_on_open(url: str) -> None:
    first = open_store(url)
    fill_states(first)
    first.close()
    raw = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    try:  # as an earlier version left the file: no counts table, no triggers
        for name in ("cl_count_insert", "cl_count_delete", "cl_count_update"):
            raw.execute(f"DROP TRIGGER {name}")
        raw.execute("DROP TABLE cl_queue_counts")
        raw.execute("UPDATE cl_jobs SET completed_at = 2.0 WHERE job_id = 'q-4'")
    finally:
        raw.close()
    again = open_store(url)
    try:
        # closing the first store ended its session: q-3 is available again
        assert counts(again.queue_stats("q")) == (6, 0, 3, 1)
        assert counts(again.queue_stats("r")) == (3, 0, 0, 0)
        backend = again.backend
        assert isinstance(backend, SqliteBackend)
        names = {r[0] for r in backend._transport.db.execute("SELECT name FROM sqlite_master")}
        assert QUEUE_OBJECTS.issubset(names)
    finally:
        again.close()
    reopened = open_store(url)  # filled once: opening again changes nothing
    try:
        assert counts(reopened.queue_stats("q")) == (6, 0, 3, 1)
    finally:
        reopened.close()


def _transactions(store: LeaseStore) -> list[str]:
    """Records each ``BEGIN`` the store's connection runs from now on."""
    backend = store.backend
    assert isinstance(backend, SqliteBackend)
    begun: list[str] = []
    backend._transport.db.set_trace_callback(
        lambda sql: begun.append(sql) if sql.startswith("BEGIN") else None)
    return begun


def test_enqueue_many_and_claim_many_are_one_transaction_per_chunk(store: LeaseStore) -> None:
    size = store.capabilities.max_enqueue_batch
    assert size == 10_000 and store.capabilities.max_batch_claim == 1000
    begun = _transactions(store)
    assert all(store.enqueue_many("q", [f"j-{i}" for i in range(size + 5)]))
    assert len(begun) == 2
    worker = store.session("W", 30)
    begun.clear()
    leases = worker.claim_many([f"j-{i}" for i in range(1500)])
    assert all(leases) and len(begun) == 2  # 1000 + 500
    assert counts(store.queue_stats("q")) == (size + 5 - 1500, 1500, 0, 0)


def _spent_head(store: LeaseStore, queue: str, spent: int) -> None:
    """``queue``: ``spent`` jobs whose one attempt was used up, then one in a retry delay
    (no candidate), one held by a live session on its last attempt (the caller claims
    it: not touched), then ``fresh-0``, ``fresh-1`` and, behind them, 2 more spent jobs."""
    items = [EnqueueItem(f"{queue}-s{i}", b"", 1) for i in range(spent)]
    items += [EnqueueItem(f"{queue}-delayed", b"", 2), EnqueueItem(f"{queue}-held", b"", 1),
              EnqueueItem(f"{queue}-fresh-0", b"0"), EnqueueItem(f"{queue}-fresh-1", b"1"),
              EnqueueItem(f"{queue}-t0", b"", 1), EnqueueItem(f"{queue}-t1", b"", 1)]
    assert all(store.enqueue_many(queue, items))
    with store.session("setup", 30) as setup:
        for job_id in [f"{queue}-s{i}" for i in range(spent)] + [f"{queue}-t0", f"{queue}-t1"]:
            lease = setup.claim(job_id)
            assert lease is not None
            lease.release()
        delayed = setup.claim(f"{queue}-delayed")
        assert delayed is not None
        delayed.fail("later", retry_in_s=3600)


@pytest.mark.parametrize("way", ["claim_next", "claim_next_many", "complete_and_claim_next"])
def test_exhausted_jobs_ahead_of_the_pick_fail_in_its_one_transaction(
    store: LeaseStore, way: str
) -> None:
    """2,000 exhausted jobs ahead of a claimable one: one ``BEGIN IMMEDIATE`` claims it
    and makes every one of them FAILED (the error text of a lone claim's refusal), the
    counts moved by the trigger; the exhausted jobs behind the pick, the held one and the
    one in a retry delay are left alone."""
    _spent_head(store, "q", 2000)
    holder = store.session("H", 30)
    assert holder.claim("q-held") is not None
    worker = store.session("W", 30)
    first = None
    if way == "complete_and_claim_next":
        store.enqueue("other", "first")
        first = worker.claim_next("other")
        assert first is not None
    begun = _transactions(store)
    if way == "claim_next":
        lease = worker.claim_next("q")
    elif way == "claim_next_many":
        got = worker.claim_next_many("q", 1)
        lease = got[0] if got else None
    else:
        assert first is not None
        _record, lease = first.complete_and_claim_next(b"r", queue="q")
    assert len(begun) == 1
    assert lease is not None and (lease.job_id, lease.payload) == ("q-fresh-0", b"0")
    failed = [r for r in store.records() if r.state.name == "FAILED"]
    assert sorted(r.job_id for r in failed) == sorted(f"q-s{i}" for i in range(2000))
    assert {r.error for r in failed} == {"attempts exhausted: attempt 1 ended without completion"}
    assert counts(store.queue_stats("q")) == (4, 2, 0, 2000)  # delayed, fresh-1, t0, t1
    for job_id in ("q-delayed", "q-t0", "q-t1"):
        record = store.get(job_id)
        assert record is not None and record.state.name == "AVAILABLE"


def test_claim_next_many_fails_the_exhausted_jobs_ahead_of_its_last_pick(
    store: LeaseStore,
) -> None:
    """``claim_next_many(q, 2)``: both fresh jobs, the spent ones ahead of them FAILED,
    those behind the second left alone; asked for more than there are, it fails every
    exhausted candidate of the queue."""
    _spent_head(store, "q", 40)
    assert store.session("H", 30).claim("q-held") is not None
    worker = store.session("W", 30)
    got = worker.claim_next_many("q", 2)
    assert [lease.job_id for lease in got] == ["q-fresh-0", "q-fresh-1"]
    assert counts(store.queue_stats("q")) == (3, 3, 0, 40)  # delayed, t0, t1 available
    assert worker.claim_next_many("q", 5) == []
    assert counts(store.queue_stats("q")) == (1, 3, 0, 42)  # delayed, held: no candidates
