"""W10's baseline: the raw client's two-request drain loop, one worker, per store.

Each job is claimed with one request and completed with another, nothing else (no
session, no lease expiry, no attempt count); the loop finds its jobs by reading a page
of the open ones now and then (etcd, ZooKeeper: one range / ``get_children`` per page).

==========  ================================================  ===========================
store       claim                                             complete
==========  ================================================  ===========================
sqlite3     ``BEGIN IMMEDIATE``; ``UPDATE .. WHERE job_id =   ``BEGIN IMMEDIATE``;
            (the oldest open) RETURNING``; ``COMMIT``         ``UPDATE .. WHERE generation
                                                              = g``; ``COMMIT``
psycopg 3   ``UPDATE .. WHERE job_id = (SELECT .. FOR UPDATE  ``UPDATE .. WHERE generation
            SKIP LOCKED LIMIT 1) RETURNING`` (autocommit)     = g`` (autocommit)
pyetcd      txn: ``mod_revision(open key) == r`` -> delete    txn: ``create_revision(held)
            it, put the held key                              == rev`` -> delete, put done
kazoo       multi: delete the open znode (version 0),         multi: delete the held
            create the held one (ephemeral)                   znode, create the done one
==========  ================================================  ===========================
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from .drainsides import _check, _cpu_s, _handshake

__all__ = ["LOOPS"]


RAW_PG_CLAIM = (
    "UPDATE {t} SET state = 1, generation = generation + 1 WHERE job_id = ("
    "SELECT job_id FROM {t} WHERE state = 0 ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED) "
    "RETURNING job_id, generation")
RAW_PG_DONE = "UPDATE {t} SET state = 2 WHERE job_id = %s AND generation = %s AND state = 1"
RAW_SQLITE_CLAIM = (
    "UPDATE raw_queue SET state = 1, generation = generation + 1 WHERE job_id = ("
    "SELECT job_id FROM raw_queue WHERE state = 0 ORDER BY seq LIMIT 1) "
    "RETURNING job_id, generation")
RAW_SQLITE_DONE = ("UPDATE raw_queue SET state = 2 WHERE job_id = ? AND generation = ? "
                   "AND state = 1")


def _raw_pg_drain(spec: dict[str, Any]) -> dict[str, Any]:
    import psycopg

    n, table = spec["jobs"], spec["raw_table"]

    def enqueue() -> None:
        with psycopg.connect(spec["conninfo"], autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (job_id text PRIMARY KEY, seq bigserial, "
                         "state int NOT NULL DEFAULT 0, generation bigint NOT NULL DEFAULT 0)")
            conn.execute(f"CREATE INDEX ON {table} (seq) WHERE state = 0")
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} (job_id) VALUES (%s)",
                                [(f"j{i}",) for i in range(n)])

    _handshake(enqueue)
    cpu, go = _cpu_s(), time.monotonic()
    ids: list[str] = []
    with psycopg.connect(spec["conninfo"], autocommit=True) as conn:
        claim, done = RAW_PG_CLAIM.format(t=table), RAW_PG_DONE.format(t=table)
        while (row := conn.execute(claim).fetchone()) is not None:
            ids.append(row[0])  # the no-op job
            if conn.execute(done, row).rowcount != 1:
                raise RuntimeError(f"raw completion of {row[0]} refused")
        end = time.monotonic()
    return {"drain_s": end - go, "client_cpu_s": _cpu_s() - cpu, **_check(ids, n)}


def _raw_sqlite_drain(spec: dict[str, Any]) -> dict[str, Any]:
    n, path = spec["jobs"], spec["raw_path"]

    def connect() -> sqlite3.Connection:
        db = sqlite3.connect(path, timeout=5.0, isolation_level=None)
        db.execute("PRAGMA busy_timeout = 5000")
        db.execute("PRAGMA journal_mode = WAL")
        return db

    def enqueue() -> None:
        db = connect()
        db.execute("CREATE TABLE raw_queue (job_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, "
                   "state INTEGER NOT NULL DEFAULT 0, generation INTEGER NOT NULL DEFAULT 0)")
        db.execute("CREATE INDEX raw_open ON raw_queue (seq) WHERE state = 0")
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO raw_queue (job_id, seq) VALUES (?, ?)",
                       [(f"j{i}", i) for i in range(n)])
        db.execute("COMMIT")
        db.close()

    _handshake(enqueue)
    cpu, go = _cpu_s(), time.monotonic()
    ids: list[str] = []
    db = connect()
    while True:
        db.execute("BEGIN IMMEDIATE")
        row = db.execute(RAW_SQLITE_CLAIM).fetchone()
        db.execute("COMMIT")
        if row is None:
            break
        ids.append(row[0])
        db.execute("BEGIN IMMEDIATE")
        changed = db.execute(RAW_SQLITE_DONE, row).rowcount
        db.execute("COMMIT")
        if changed != 1:
            raise RuntimeError(f"raw completion of {row[0]} refused")
    end = time.monotonic()
    db.close()
    return {"drain_s": end - go, "client_cpu_s": _cpu_s() - cpu, **_check(ids, n)}


def _raw_etcd_drain(spec: dict[str, Any]) -> dict[str, Any]:
    import pyetcd

    raw, n = spec["raw"], spec["jobs"]
    base = f"{raw['prefix'].rstrip('/')}/w10/{spec['queue']}"

    def connect() -> Any:
        return pyetcd.client(host=raw["host"], port=int(raw["port"]), timeout=10)

    def enqueue() -> None:
        client = connect()
        tx = client.transactions
        for start in range(0, n, 128):  # etcd's default --max-txn-ops
            client.transaction(compare=[], failure=[], success=[
                tx.put(f"{base}/open/{i:08d}", b"") for i in range(start, min(n, start + 128))])
        client.close()

    _handshake(enqueue)
    cpu, go = _cpu_s(), time.monotonic()
    client, ids = connect(), []
    tx = client.transactions
    while page := list(client.get_prefix(f"{base}/open/", sort_order="ascend",
                                         sort_target="key", limit=1000)):
        for _, meta in page:
            key = meta.key.decode()
            job = key.rsplit("/", 1)[1]
            held = f"{base}/held/{job}"
            ok, answers = client.transaction(compare=[tx.mod(key) == meta.mod_revision],
                                             success=[tx.delete(key), tx.put(held, b"raw")],
                                             failure=[])
            if not ok:
                continue  # another worker took it
            ids.append(job)
            revision = answers[1].response_put.header.revision
            ok, _ = client.transaction(compare=[tx.create(held) == revision], failure=[],
                                       success=[tx.delete(held), tx.put(f"{base}/done/{job}",
                                                                        b"")])
            if not ok:
                raise RuntimeError(f"raw etcd completion of {job} refused")
    end, cpu = time.monotonic(), _cpu_s() - cpu
    client.delete_prefix(base)
    client.close()
    return {"drain_s": end - go, "client_cpu_s": cpu, **_check(ids, n)}


def _raw_zookeeper_drain(spec: dict[str, Any]) -> dict[str, Any]:
    from kazoo.client import KazooClient

    raw, n = spec["raw"], spec["jobs"]
    base = f"{raw['base'].rstrip('/')}/w10-{spec['queue']}"

    def connect() -> Any:
        client = KazooClient(hosts=raw["hosts"], timeout=10.0)
        client.start(timeout=15.0)
        return client

    def enqueue() -> None:
        client = connect()
        for folder in ("open", "held", "done"):
            client.ensure_path(f"{base}/{folder}")
        for start in range(0, n, 500):
            batch = client.transaction()
            for i in range(start, min(n, start + 500)):
                batch.create(f"{base}/open/{i:08d}")
            batch.commit()
        client.stop()
        client.close()

    _handshake(enqueue)
    cpu, go = _cpu_s(), time.monotonic()
    client, ids = connect(), []
    while page := sorted(client.get_children(f"{base}/open")):
        for job in page:
            claim = client.transaction()
            claim.delete(f"{base}/open/{job}", version=0)
            claim.create(f"{base}/held/{job}", b"raw", ephemeral=True)
            if any(isinstance(r, Exception) for r in claim.commit()):
                continue  # another worker took it
            ids.append(job)
            done = client.transaction()
            done.delete(f"{base}/held/{job}")
            done.create(f"{base}/done/{job}")
            if any(isinstance(r, Exception) for r in done.commit()):
                raise RuntimeError(f"raw ZooKeeper completion of {job} refused")
    end, cpu = time.monotonic(), _cpu_s() - cpu
    client.delete(base, recursive=True)
    client.stop()
    client.close()
    return {"drain_s": end - go, "client_cpu_s": cpu, **_check(ids, n)}


LOOPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "sqlite": _raw_sqlite_drain, "postgresql": _raw_pg_drain, "etcd": _raw_etcd_drain,
    "zookeeper": _raw_zookeeper_drain}
"""The raw drain loop of each store, by backend name."""
