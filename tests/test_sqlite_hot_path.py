"""SQLite's claim+complete cycle: how many statements and WAL pages it costs, and the
upgrade of a file whose indexes and claim count an earlier version wrote."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from consensus_lease import JobState, LeaseStore, StoreRegressed, open_store
from consensus_lease.backends.sqlite import (
    CLAIM_OBJECTS,
    CLAIM_SQL,
    PARTIAL_INDEXES,
    SqliteBackend,
)
from consensus_lease.backends.sqlite._jobs_claim import claim_params
from consensus_lease.bench.roundtrips import counting, requests_total

OLD_INDEXES = (
    "DROP INDEX cl_jobs_by_session; DROP INDEX cl_jobs_by_queue; DROP INDEX cl_jobs_open; "
    "DROP TRIGGER cl_claims_insert; DROP TRIGGER cl_claims_update; "
    "CREATE INDEX cl_jobs_by_session ON cl_jobs(session_id); "
    "CREATE INDEX cl_jobs_by_queue ON cl_jobs(queue, completed_at, seq); "
    "CREATE INDEX cl_jobs_open ON cl_jobs(queue, seq) "
    "WHERE completed_at IS NULL AND failed_at IS NULL;"
)
"""Turns a store file back into what the version before partial indexes wrote."""


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "jobs.db")


def backend_of(store: LeaseStore) -> SqliteBackend:
    backend = store.backend
    assert isinstance(backend, SqliteBackend)
    return backend


def test_this_sqlite_has_what_the_one_statement_claim_needs() -> None:
    # the upsert (3.24+) and the RETURNING of the other statements (3.35+)
    assert sqlite3.sqlite_version_info >= (3, 35)


def test_a_cycle_is_two_statements(path: str) -> None:
    cycles = 20
    with counting(["sqlite3"]) as count:
        with open_store(f"sqlite:///{path}") as store, store.session("W", 30.0) as worker:
            store.enqueue_many("q", [f"q-{i}" for i in range(cycles)])
            for i in range(3):  # warm-up: the session's first statements
                lease = worker.claim(f"warm-{i}")
                assert lease is not None
                lease.complete(b"")
            count.reset()
            for i in range(cycles):
                lease = worker.claim(f"job-{i}")
                assert lease is not None
                lease.complete(b"r")
            named = count.snapshot()
            count.reset()
            for _ in range(cycles):
                lease = worker.claim_next("q")
                assert lease is not None
                lease.complete(b"r")
            queued = count.snapshot()
    # the claim's upsert and the complete's update, each its own transaction
    assert named == {"INSERT": cycles, "UPDATE": cycles}
    assert requests_total(named) == 2 * cycles
    # a queue claim reads its candidate first
    assert requests_total(queued) == 3 * cycles


def wal_pages_per_cycle(store: LeaseStore, path: str, claim: object, cycles: int) -> float:
    backend = backend_of(store)
    backend._transport.db.execute("PRAGMA wal_autocheckpoint = 0")
    backend._transport.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = int(backend._transport.db.execute("PRAGMA page_size").fetchone()[0])
    before = os.path.getsize(path + "-wal")
    for i in range(cycles):
        lease = claim(i)  # type: ignore[operator]
        assert lease is not None
        lease.complete(b"")
    return (os.path.getsize(path + "-wal") - before) / (page + 24) / cycles


def test_wal_pages_per_cycle(path: str) -> None:
    """Pages written per cycle (WAL frames, checkpoints off): the job row's table page
    twice, its primary-key page and ``cl_meta`` (the claim count) once; a queue job also
    its ``cl_jobs_by_session`` entry (twice), its ``cl_jobs_open`` entry and its
    ``cl_queue_counts`` row. Measured 4.0 and 7.2 (10.0 and 8.4 before the partial
    indexes); the bounds leave room for B-tree splits."""
    cycles = 100
    with open_store(f"sqlite:///{path}") as store, store.session("W", 30.0) as worker:
        store.enqueue_many("q", [f"q-{i}" for i in range(cycles)])
        named = wal_pages_per_cycle(store, path, lambda i: worker.claim(f"j-{i}"), cycles)
        queued = wal_pages_per_cycle(store, path, lambda i: worker.claim_next("q"), cycles)
    assert named <= 4.6
    assert queued <= 7.8


@pytest.fixture
def old_file(path: str) -> str:
    with open_store(f"sqlite:///{path}") as store, store.session("W", 30.0) as worker:
        store.enqueue_many("q", ["a", "b", "c"])
        lease = worker.claim("a")
        assert lease is not None
        lease.complete(b"")
    with sqlite3.connect(path) as db:
        db.executescript(OLD_INDEXES)
    return path


def test_older_indexes_are_rebuilt_once_on_open(old_file: str) -> None:
    with open_store(f"sqlite:///{old_file}") as store, store.session("W", 30.0) as worker:
        rows = dict(backend_of(store)._transport.db.execute(
            "SELECT name, sql FROM sqlite_master WHERE type IN ('index', 'trigger')"))
        for name, sql in PARTIAL_INDEXES.items():
            assert rows[name] == sql
        assert CLAIM_OBJECTS.issubset(rows)
        claims = backend_of(store)._transport.db.execute("SELECT claims FROM cl_meta").fetchone()[0]
        lease = worker.claim_next("q")
        assert lease is not None and lease.job_id in ("b", "c")
        assert backend_of(store)._transport.db.execute(
            "SELECT claims FROM cl_meta").fetchone()[0] == claims + 1
        assert store.queue_stats("q").held == 1
        assert [j.record.job_id for j in store.queue_jobs("q")] == ["a", "b", "c"]


def test_an_older_writer_counting_claims_itself_is_no_regression(path: str) -> None:
    """A writer of the version before the trigger adds 1 to the claim count in its own
    statement too (+2 per claim): the count still only grows, no StoreRegressed."""
    with open_store(f"sqlite:///{path}") as store, store.session("W", 30.0) as worker:
        first = worker.claim("mine")
        assert first is not None
        old = sqlite3.connect(path, isolation_level=None)
        try:
            old.execute("BEGIN IMMEDIATE")
            old.execute("INSERT INTO cl_jobs (job_id, generation, owner, session_id, attempt) "
                        "VALUES ('theirs', 1, 'old', NULL, 1)")
            old.execute("UPDATE cl_meta SET claims = claims + 1 WHERE id = 1")
            old.execute("COMMIT")
        finally:
            old.close()
        second = worker.claim("next")
        assert second is not None
        first.complete(b"")
        assert worker.claim("after") is not None


def test_a_copy_missing_this_process_claim_refuses_the_next(path: str, tmp_path: Path) -> None:
    """The one-statement claim compares the claim count itself: after a restore that lost
    a claim this process made, the next claim applies nothing and ends the session."""
    copy = str(tmp_path / "copy.db")
    with open_store(f"sqlite:///{path}") as store:
        worker = store.session("W", 30.0)
        assert worker.claim("a") is not None
        backup(path, copy)
        assert worker.claim("b") is not None  # a claim the copy does not have
        backup(copy, path)
        with pytest.raises(StoreRegressed):
            worker.claim("c")
        assert store.get("c") is None


def backup(source: str, target: str) -> None:
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()



def test_closing_a_session_frees_its_jobs_in_and_out_of_queues(path: str) -> None:
    """close_session clears the session of its queue jobs (by ``cl_jobs_by_session``);
    its other jobs and election keys keep the id of a session row that is gone, which
    frees them just the same."""
    with open_store(f"sqlite:///{path}") as store:
        store.enqueue("q", "queued", b"")
        first = store.session("A", 30.0)
        assert first.claim("named") is not None and first.claim("queued") is not None
        assert store.queue_stats("q").held == 1
        first.close()
        for job_id in ("named", "queued"):
            record = store.get(job_id)
            assert record is not None and record.state is JobState.AVAILABLE
        assert store.queue_stats("q").held == 0
        with store.session("B", 30.0) as second:
            again = second.claim("named")
            assert again is not None and again.generation == 2
            assert second.claim_next("q") is not None


def test_the_one_statement_claim_notes_the_exact_claim_count(path: str) -> None:
    """What a claim notes as the store's claim count is the count in the file (as the
    count's trigger wrote it, handed over by CLAIM_CAPTURES): one too high would
    report a false regression at the next refused claim, one too low would miss a
    restore that lost this claim."""
    with open_store(f"sqlite:///{path}") as store, store.session("W", 30.0) as worker:
        backend = backend_of(store)
        for i in range(3):
            lease = worker.claim(f"job-{i}")  # inserted
            assert lease is not None
            lease.release()
            assert worker.claim(f"job-{i}") is not None  # taken over: the update path
            stored = backend._transport.db.execute("SELECT claims FROM cl_meta").fetchone()[0]
            assert backend._history.claims_seen == stored


def test_complete_returns_the_row_it_wrote_and_the_file_has_no_capture_trigger(
    path: str,
) -> None:
    """The complete's record comes from a TEMP trigger of the store's own connection
    (COMPLETED_CAPTURE): it must be the record a read gives afterwards (an earlier
    attempt's error and the attempt limit included), and the trigger must not be in the
    file, where other processes and versions would run it."""
    with open_store(f"sqlite:///{path}") as store, store.session("W", 30.0) as worker:
        store.enqueue("q", "a", b"p", max_attempts=3)
        first = worker.claim("a")
        assert first is not None
        first.fail("boom", retry_in_s=0)
        second = worker.claim("a")
        assert second is not None
        record = second.complete(b"done")
        assert record == store.get("a")
        assert (record.state, record.result, record.attempt, record.error,
                record.max_attempts, record.owner) == (
                    JobState.COMPLETED, b"done", 2, "boom", 3, "W")
        assert record.generation == second.fencing_token
        # completed again by the same session: the idempotent read-back path
        assert second.complete(b"done") == record
        plain = worker.claim("plain")
        assert plain is not None
        assert plain.complete(b"") == store.get("plain")
    with sqlite3.connect(path) as db:
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert not any("capture" in name for name in names)


def test_a_refused_claim_statement_neither_inserts_nor_takes_over(path: str) -> None:
    """CLAIM_SQL's store conditions (identity, claim count, the claiming session alive)
    guard both of the upsert's paths: run directly with a condition failing, it changes
    no row, whether the job's row exists (claimable) or not."""
    with open_store(f"sqlite:///{path}") as store:
        backend = backend_of(store)
        handle = backend.open_session("W", 30.0)
        claim = backend.claim(handle, "old")
        assert claim is not None
        backend.release(handle, "old", claim)
        before = backend._transport.db.execute("SELECT * FROM cl_jobs ORDER BY job_id").fetchall()
        good = claim_params(backend, handle, "old")
        for bad in (
            (good[0], "another identity", *good[2:]),
            (good[0], good[1], good[2] + 1, *good[3:]),
            (*good[:3], "no such session", good[4], "no such session"),
        ):
            for job_id in ("old", "new"):
                params = (job_id, *bad[1:])
                changed = backend._transport.db.execute(CLAIM_SQL, params).rowcount
                assert changed == 0, (job_id, bad)
        assert backend._transport.db.execute(
            "SELECT * FROM cl_jobs ORDER BY job_id").fetchall() == before
        assert backend._transport.db.execute(CLAIM_SQL, ("new", *good[1:])).rowcount == 1
