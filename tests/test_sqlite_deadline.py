"""SQLite: ``busy_timeout_s`` bounds each call as a whole, also when threads of the same
process queue for its connection behind each other (each used to wait its own
``busy_timeout_s`` after those before it had waited theirs)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from consensus_lease import open_store
from consensus_lease.errors import BackendUnavailable

BUSY_S = 0.5


def test_threads_queued_behind_a_locked_file_each_end_by_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    store = open_store(f"sqlite:///{path}", busy_timeout_s=BUSY_S)
    holder = sqlite3.connect(path, isolation_level=None)  # another "process" holding the lock
    try:
        store.enqueue("q", "first")
        holder.execute("BEGIN IMMEDIATE")
        outcomes: dict[str, tuple[float, BaseException | None]] = {}
        started = time.monotonic()

        def run(name: str) -> None:
            raised: BaseException | None = None
            try:
                if name.startswith("write"):
                    store.enqueue("q", name)
                else:
                    store.get("first")
            except BaseException as exc:  # reported to the test
                raised = exc
            outcomes[name] = (time.monotonic() - started, raised)

        names = ["write-1", "write-2", "write-3", "write-4", "read"]
        threads = [threading.Thread(target=run, args=(name,)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        for name in names:
            elapsed, raised = outcomes[name]
            assert elapsed <= BUSY_S + 0.5, (name, outcomes)
            if name.startswith("write"):
                assert isinstance(raised, BackendUnavailable), (name, raised)
                assert "busy" in str(raised) or "locked" in str(raised), raised
    finally:
        holder.rollback()
        holder.close()
    assert store.enqueue("q", "after") is True  # the budget is whole again
    store.close()
