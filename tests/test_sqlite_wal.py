"""SQLite's WAL: under ``wal_limit_bytes`` while readers allow checkpoints; a reader that
blocks them is warned about and measured; once it ends the WAL shrinks again."""

from __future__ import annotations

import itertools
import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from consensus_lease import InvalidArgument, Session, open_store
from consensus_lease.backends.sqlite import SqliteBackend
from consensus_lease.backends.sqlite._transport_wal import DEFAULT_LIMIT_BYTES, wal_bytes
from consensus_lease.observe import Observer
from consensus_lease.testing.conformance import poll_until

SMALL_LIMIT = 1024 * 1024
"""The smallest bound the option accepts (about 64 claim+complete cycles of WAL)."""


class WalSeen(Observer):
    """What the store reported of its WAL, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reports: list[tuple[int, bool]] = []

    def wal_measured(self, store: str, path: str, wal_bytes: int, blocked: bool) -> None:
        with self.lock:
            self.reports.append((wal_bytes, blocked))

    def last(self) -> tuple[int, bool] | None:
        with self.lock:
            return self.reports[-1] if self.reports else None

    def blocked_sizes(self) -> list[int]:
        with self.lock:
            return [size for size, blocked in self.reports if blocked]


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "jobs.db")


@pytest.fixture
def reader(path: str) -> Iterator[sqlite3.Connection]:
    """Another connection to the store's file, as a sqlite3 shell or a report would be."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        yield db
    finally:
        db.close()


def cycles(worker: Session, prefix: str, count: int) -> None:
    for i in range(count):
        lease = worker.claim(f"{prefix}-{i}")
        assert lease is not None
        lease.complete(b"")


def hold_snapshot(db: sqlite3.Connection) -> None:
    """A read transaction left open: ``BEGIN; SELECT ...`` without ``COMMIT``."""
    db.execute("BEGIN")
    db.execute("SELECT count(*) FROM cl_jobs").fetchone()


def grow_past(worker: Session, path: str, size: int, prefix: str) -> None:
    """Claim and complete jobs until the WAL is larger than ``size`` (bounded)."""
    for round_ in range(400):
        if wal_bytes(path) > size:
            return
        cycles(worker, f"{prefix}-{round_}", 25)
    raise AssertionError(f"the WAL did not pass {size} bytes: {wal_bytes(path)}")


def test_the_wal_stays_under_its_bound_while_readers_allow(
    path: str, reader: sqlite3.Connection
) -> None:
    """The default bound (16 MiB), after a reader made the WAL outgrow it: it shrinks
    back once the reader ends, with no commit needed, and stays under the bound over
    2,000 claim+complete cycles (about 32 MiB of WAL frames) of two writers, each on its
    own connection, while another connection reads in short transactions all along."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def short_reads() -> None:
        while not stop.wait(0.002):  # pacing a load, not synchronising
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM cl_jobs").fetchone()
            reader.execute("COMMIT")

    def other_writer(worker: Session) -> None:
        try:
            cycles(worker, "other", 1000)
        except BaseException as exc:  # reported by the test's thread
            failures.append(exc)

    with open_store(f"sqlite:///{path}") as store, store.session("W", 30.0) as worker, \
            open_store(f"sqlite:///{path}") as second, second.session("V", 30.0) as other:
        cycles(worker, "warm", 10)
        hold_snapshot(reader)
        grow_past(worker, path, DEFAULT_LIMIT_BYTES, "held")
        reader.execute("ROLLBACK")
        poll_until(lambda: wal_bytes(path) <= DEFAULT_LIMIT_BYTES, 20.0)
        threads = [threading.Thread(target=short_reads, daemon=True),
                   threading.Thread(target=other_writer, args=(other,), daemon=True)]
        for thread in threads:
            thread.start()
        peak = 0
        try:
            for i in range(1000):
                lease = worker.claim(f"after-{i}")
                assert lease is not None
                lease.complete(b"")
                peak = max(peak, wal_bytes(path))
            threads[1].join(60.0)
        finally:
            stop.set()
            for thread in threads:
                thread.join(10.0)
    assert not failures and not threads[1].is_alive()
    assert peak <= DEFAULT_LIMIT_BYTES


def test_a_reader_blocking_checkpoints_is_warned_about_and_measured(
    path: str, reader: sqlite3.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    seen = WalSeen()
    url = f"sqlite:///{path}?wal_limit_bytes={SMALL_LIMIT}&wal_interval_s=0.05"
    with open_store(url, observer=seen) as store, store.session("W", 30.0) as worker:
        cycles(worker, "warm", 10)
        poll_until(lambda: seen.last() is not None and not seen.last()[1], 10.0)
        caplog.set_level(logging.WARNING, logger="consensus_lease")
        hold_snapshot(reader)

        rounds = itertools.count()

        def warned() -> list[logging.LogRecord]:
            cycles(worker, f"held-{next(rounds)}", 25)  # the WAL grows meanwhile
            return [r for r in caplog.records if r.levelno == logging.WARNING]

        first = poll_until(warned, 30.0)[0]
        warned_at = int(first.__dict__["wal_bytes"])  # the record's extra
        assert warned_at > SMALL_LIMIT
        message = first.getMessage()
        assert path in message and f"{warned_at / 2**20:.1f} MiB" in message
        assert "read transaction" in message and "COMMIT or ROLLBACK" in message

        # the metric follows the WAL as it grows; the warning is not repeated
        grow_past(worker, path, 2 * warned_at, "more")
        poll_until(lambda: max(seen.blocked_sizes()) > 2 * warned_at, 30.0)
        assert [r for r in caplog.records if r.levelno == logging.WARNING] == [first]

        caplog.clear()
        caplog.set_level(logging.INFO, logger="consensus_lease")
        reader.execute("ROLLBACK")
        _, blocked = poll_until(
            lambda: (last := seen.last()) is not None and last[0] <= SMALL_LIMIT and last,
            30.0)
        assert not blocked
        assert wal_bytes(path) <= SMALL_LIMIT
        poll_until(lambda: any("back under its bound" in r.getMessage()
                               for r in caplog.records), 10.0)


def test_a_large_write_transaction_is_not_taken_for_a_reader(
    path: str, reader: sqlite3.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """A WAL above the bound while a writer's own transaction is still open (every
    committed page checkpointed): no warning, nothing reported blocked."""
    seen = WalSeen()
    url = f"sqlite:///{path}?wal_limit_bytes={SMALL_LIMIT}&wal_interval_s=0.05"
    with open_store(url, observer=seen) as store, store.session("W", 30.0) as worker:
        cycles(worker, "warm", 10)
        backend = store.backend
        assert isinstance(backend, SqliteBackend) and backend._wal is not None
        caplog.set_level(logging.WARNING, logger="consensus_lease")
        reader.execute("BEGIN IMMEDIATE")  # as a large enqueue_many would
        reader.execute("CREATE TABLE scratch (b BLOB)")
        reader.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                       "WHERE i < 64) INSERT INTO scratch SELECT randomblob(65536) FROM n")
        poll_until(lambda: wal_bytes(path) > 2 * SMALL_LIMIT, 10.0)  # the cache spilled
        checks = backend._wal.checks
        poll_until(lambda: backend._wal is not None and backend._wal.checks >= checks + 5,
                   10.0)
        assert wal_bytes(path) > SMALL_LIMIT
        reader.execute("ROLLBACK")
        assert not seen.blocked_sizes()
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_the_wal_options_are_checked_and_the_guard_ends_with_the_store(path: str) -> None:
    for bad in ({"wal_limit_bytes": 0}, {"wal_limit_bytes": "16M"},
                {"wal_limit_bytes": 1024 * 1024 - 1}, {"wal_interval_s": 0},
                {"wal_interval_s": 1e-9}, {"wal_interval_s": 0.0099}):
        with pytest.raises(InvalidArgument, match=next(iter(bad))):
            open_store(f"sqlite:///{path}", **bad)
    with pytest.raises(InvalidArgument, match=r"wal_interval_s must be >= 0.01"):
        open_store(f"sqlite:///{path}?wal_interval_s=1e-9")  # 30% of a core when idle
    open_store(f"sqlite:///{path}", wal_interval_s=0.01).close()
    store = open_store(f"sqlite:///{path}", wal_limit_bytes=SMALL_LIMIT)
    backend = store.backend
    assert isinstance(backend, SqliteBackend) and backend._wal is not None
    assert backend._transport.db.execute("PRAGMA journal_size_limit").fetchone()[0] == SMALL_LIMIT
    thread = backend._wal._thread
    assert thread.is_alive()
    store.close()
    poll_until(lambda: not thread.is_alive(), 10.0)
