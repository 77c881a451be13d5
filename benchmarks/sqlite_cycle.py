"""Claim+complete cycles per second on the embedded SQLite store, against the same two
statements done with the raw sqlite3 module in the same run (quick check; the full
benchmark suite is `consensus-lease bench`)."""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

from consensus_lease import open_store


def ours(path: Path, n: int) -> float:
    with open_store(f"sqlite:///{path}") as store, store.session("bench", 30.0) as session:
        start = time.perf_counter()
        for i in range(n):
            lease = session.claim(f"job-{i}")
            assert lease is not None
            lease.complete(b"")
        return n / (time.perf_counter() - start)


def raw(path: Path, n: int) -> float:
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, generation INTEGER, owner TEXT, "
               "done INTEGER)")
    start = time.perf_counter()
    for i in range(n):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO jobs VALUES (?, 1, 'bench', 0) ON CONFLICT DO NOTHING",
                   (f"job-{i}",))
        db.execute("COMMIT")
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE jobs SET done = 1 WHERE job_id = ? AND generation = 1", (f"job-{i}",))
        db.execute("COMMIT")
    db.close()
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=2000, help="cycles (default 2000)")
    n = parser.parse_args().n
    with tempfile.TemporaryDirectory() as tmp:
        mine = ours(Path(tmp) / "ours.db", n)
        base = raw(Path(tmp) / "raw.db", n)
    print(f"consensus_lease sqlite: {mine:8.0f} cycles/s")
    print(f"raw sqlite3 baseline:   {base:8.0f} cycles/s")
    print(f"ratio:                  {mine / base:8.2f}x")


if __name__ == "__main__":
    main()
