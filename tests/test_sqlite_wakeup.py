"""SQLite: a claim waiting in one process is woken by a change another process made, by
the ``PRAGMA data_version`` watch, not by the (here 5 s) poll interval."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from consensus_lease import open_store
from consensus_lease.backends.sqlite import SqliteBackend
from consensus_lease.backends.sqlite._watches import ChangeWatch
from consensus_lease.testing.conformance import poll_until

HOLDER = r"""
import sys
from consensus_lease import open_store
with open_store(sys.argv[1]) as store, store.session("holder", ttl_s=30.0) as session:
    lease = session.claim("job")
    assert lease is not None
    print("held", flush=True)
    if sys.stdin.readline().strip() == "release":
        lease.release()
    print("released", flush=True)
"""

BOUND_S = 0.5
"""Margin for a busy 2-core machine; the benchmark (W4) carries the goal."""


def test_a_release_in_another_process_wakes_the_waiting_claim(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/jobs.db?poll_interval_s=5"
    with open_store(url) as store, store.session("waiter", ttl_s=30.0) as session:
        backend = store.backend
        assert isinstance(backend, SqliteBackend)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, url], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
        )
        try:
            assert holder.stdout is not None and holder.stdin is not None
            assert holder.stdout.readline().strip() == "held"
            got: list[float] = []

            def wait() -> None:
                lease = session.claim("job", wait_s=20.0)
                got.append(time.monotonic())
                lease.release()

            waiter = threading.Thread(target=wait)
            waiter.start()
            poll_until(lambda: backend._claims_wait(), timeout_s=10.0)
            time.sleep(0.1)  # a quiet store: the watch is at its longest interval
            start = time.monotonic()
            holder.stdin.write("release\n")
            holder.stdin.flush()
            waiter.join(20.0)
            assert got, "the waiting claim never got the job"
            assert got[0] - start < BOUND_S
            assert holder.stdout.readline().strip() == "released"
        finally:
            holder.kill()
            holder.wait(10.0)


def test_the_watch_reads_sparingly_while_nothing_changes(tmp_path: Path) -> None:
    """With claims waiting and no change, reads back off to one per interval (bounded
    from above only: a busy machine reads less), and the thread ends without waiters."""
    path = str(tmp_path / "jobs.db")
    with open_store(f"sqlite:///{path}") as store:
        waiting = threading.Event()
        changes: list[float] = []
        watch = ChangeWatch(path, lambda: changes.append(time.monotonic()),
                            waiting.is_set, min_interval_s=0.001, max_interval_s=0.01,
                            busy_timeout_s=5.0)
        waiting.set()
        watch.ensure()
        start, reads = time.monotonic(), watch.reads
        time.sleep(0.5)  # real idle time passes: the watch must back off while nothing changes
        elapsed = time.monotonic() - start
        assert watch.reads - reads <= elapsed / 0.01 + 10  # ~1 per 10 ms after backing off
        assert not changes
        other = open_store(f"sqlite:///{path}")
        try:
            other.enqueue("q", "j", b"")  # another connection's change
        finally:
            other.close()
        poll_until(lambda: bool(changes), timeout_s=BOUND_S)
        waiting.clear()
        poll_until(lambda: watch._thread is None, timeout_s=10.0)
        watch.close()
        assert store.get("j") is not None
