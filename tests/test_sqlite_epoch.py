"""SQLite: the store epoch on disk (migration of older files) and what a running process
notices when the file goes back (restored from an older copy, replaced, wiped)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from consensus_lease import (
    JobState,
    LeaseLost,
    LeaseStore,
    SessionState,
    StaleLeaseError,
    StoreRegressed,
    open_store,
)
from consensus_lease.testing.conformance import poll_until

FIRST_SCHEMA = """
CREATE TABLE cl_sessions (session_id TEXT PRIMARY KEY, owner TEXT NOT NULL,
                          ttl_s REAL NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE cl_jobs (job_id TEXT PRIMARY KEY, generation INTEGER NOT NULL, owner TEXT,
                      session_id TEXT, completed_at REAL, completed_session TEXT,
                      result BLOB, queue TEXT, payload BLOB, seq INTEGER);
CREATE INDEX cl_jobs_by_session ON cl_jobs(session_id);
CREATE INDEX cl_jobs_by_queue ON cl_jobs(queue, completed_at, seq);
CREATE TABLE cl_seq (id INTEGER PRIMARY KEY CHECK (id = 1), last INTEGER NOT NULL);
INSERT INTO cl_jobs VALUES ('done-job', 5, 'old', NULL, 1.0, 's', x'7221', NULL, NULL, NULL);
INSERT INTO cl_jobs VALUES ('free-job', 3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
"""
"""A store file as the first version wrote it (no lifecycle columns, no epoch)."""


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "leases.db")


@pytest.fixture
def store(path: str) -> Iterator[LeaseStore]:
    with open_store(f"sqlite:///{path}") as opened:
        yield opened


def copy_db(source: str, target: str) -> None:
    """Copy database ``source`` onto ``target`` through SQLite's backup API: how
    ``sqlite3 target ".restore source"`` restores a file in place (processes that have
    it open see the copy at their next transaction)."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def test_file_of_the_first_version_keeps_its_tokens(path: str) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(FIRST_SCHEMA)
    with open_store(f"sqlite:///{path}") as store:
        assert store.epoch() == 0
        done = store.get("done-job")
        assert done is not None and done.state is JobState.COMPLETED
        assert (done.generation, done.result) == (5, b"r!")
        with store.session("W", 30.0) as session:
            lease = session.claim("free-job")
            assert lease is not None and lease.generation == 4
            lease.release()
            assert store.bump_epoch() == 1
            again = session.claim("free-job")
            assert again is not None and again.generation == 2**32 + 5
            assert again.complete(b"").generation == 2**32 + 5
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT generation, epoch FROM cl_jobs WHERE job_id = 'free-job'"
                          ).fetchone() == (5, 1)


def test_epoch_outlives_reopening(path: str) -> None:
    url = f"sqlite:///{path}"
    with open_store(url) as store:
        assert store.bump_epoch(above=7 << 32) == 8
    with open_store(url) as store, store.session("W", 30.0) as session:
        assert store.epoch() == 8
        lease = session.claim("j")
        assert lease is not None and lease.generation == (8 << 32) + 1


def test_restored_older_copy_ends_every_session(path: str, store: LeaseStore) -> None:
    """A copy taken before some claims is restored in place while sessions run: each
    session's next keepalive, and any claim, raises StoreRegressed; a process opened
    after the restore cannot open a session (the regression marker), until bump-epoch
    --above the highest token; after the bump both store objects are trusted again."""
    early = store.session("early", 30.0, keepalive=False)
    held = early.claim("j-1")
    assert held is not None
    backup = path + ".backup"
    copy_db(path, backup)
    late = store.session("late", 30.0, keepalive=False)  # opened after the copy
    used = late.claim("j-2")
    assert used is not None
    copy_db(backup, path)
    with pytest.raises(StoreRegressed, match="claim count went back"):
        early.keepalive()
    with pytest.raises(StoreRegressed):
        held.ensure_held()
    with pytest.raises(StoreRegressed):
        late.keepalive()
    with pytest.raises(StoreRegressed):
        store.session("new", 30.0)
    with open_store(f"sqlite:///{path}") as fresh:
        with pytest.raises(StoreRegressed, match="claim count went back"):
            fresh.session("fresh", 30.0)  # the marker the first process wrote tells it
        assert fresh.bump_epoch(above=used.generation) == 1
        other = fresh.session("fresh", 30.0)
        after = other.claim("j-2")
        assert after is not None and after.generation > used.generation
        after.release()
    with store.session("after-bump", 30.0) as session:
        lease = session.claim("j-2")
        assert lease is not None and lease.generation >> 32 == 1
        lease.release()


def test_session_opened_after_the_copy_is_noticed_by_its_row(
    path: str, store: LeaseStore
) -> None:
    """No claim since the copy, so the claim count cannot tell: the session row, which
    cannot have been deleted yet, is missing."""
    backup = path + ".backup"
    copy_db(path, backup)
    late = store.session("late", 30.0, keepalive=False)
    copy_db(backup, path)
    with pytest.raises(StoreRegressed, match="row is gone"):
        late.keepalive()


def test_background_keepalive_loses_the_session(path: str, store: LeaseStore) -> None:
    backup = path + ".backup"
    copy_db(path, backup)
    session = store.session("W", 0.6)
    lease = session.claim("bg")
    assert lease is not None
    copy_db(backup, path)
    poll_until(lambda: session.state is SessionState.LOST, timeout_s=10.0)
    assert isinstance(session.lost_reason, StoreRegressed)
    with pytest.raises(StoreRegressed):
        lease.ensure_held()


def test_claim_on_a_regressed_store_changes_nothing(path: str, store: LeaseStore) -> None:
    session = store.session("W", 30.0, keepalive=False)
    backup = path + ".backup"
    copy_db(path, backup)
    first = session.claim("c-1")
    assert first is not None
    copy_db(backup, path)
    with pytest.raises(StoreRegressed):
        session.claim("c-2")
    assert store.get("c-2") is None


def test_replaced_file_is_noticed_for_good(path: str, store: LeaseStore) -> None:
    """A copy moved into place (a new inode): this process's connection is on the old,
    unlinked file. Sessions end; a bump through this object is refused (it would change
    the dead file); a new store object works after its bump."""
    session = store.session("W", 30.0, keepalive=False)
    lease = session.claim("r-1")
    assert lease is not None
    backup = path + ".backup"
    copy_db(path, backup)
    os.replace(backup, path)
    with pytest.raises(StoreRegressed, match="replaced by another file"):
        session.keepalive()
    with pytest.raises(StoreRegressed):
        store.bump_epoch()
    with open_store(f"sqlite:///{path}") as fresh:
        assert fresh.bump_epoch(above=lease.generation) == 1
    with pytest.raises(StoreRegressed):
        store.session("still-the-old-file", 30.0)


def test_wiped_store_is_noticed(path: str, store: LeaseStore) -> None:
    """The file deleted and a fresh store created at the path (another identity)."""
    session = store.session("W", 30.0, keepalive=False)
    assert session.claim("w-1") is not None
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    with open_store(f"sqlite:///{path}") as fresh:
        assert fresh.epoch() == 0
        with pytest.raises(StoreRegressed, match=r"deleted|replaced"):
            session.keepalive()


def test_another_stores_file_copied_in_place(path: str, tmp_path: Path, store: LeaseStore) -> None:
    """Another store's content restored into this file (same inode): its identity."""
    session = store.session("W", 30.0, keepalive=False)
    other = str(tmp_path / "other.db")
    open_store(f"sqlite:///{other}").close()
    copy_db(other, path)
    with pytest.raises(StoreRegressed, match="identity changed"):
        session.keepalive()


def test_expired_session_is_not_a_regression(store: LeaseStore) -> None:
    session = store.session("W", 30.0, keepalive=False)
    lease = session.claim("x-1")
    assert lease is not None
    store.backend.expire_session(session.session_id)  # type: ignore[attr-defined]
    with pytest.raises(LeaseLost) as lost:
        session.keepalive()
    assert not isinstance(lost.value, StoreRegressed)
    with store.session("B", 30.0) as other:
        taken = other.claim("x-1")
        assert taken is not None
        with pytest.raises(StaleLeaseError):
            lease.complete(b"late")
