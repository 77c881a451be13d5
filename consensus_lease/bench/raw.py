"""The raw-client baseline: the same two store operations a claim+complete cycle makes,
done with the client library directly and nothing else (no sessions, no read-back, no
history or completion records, no error translation).

=========  ===============================================  ================================
backend    "claim"                                          "complete"
=========  ===============================================  ================================
sqlite3    ``BEGIN IMMEDIATE``; ``INSERT .. ON CONFLICT     ``BEGIN IMMEDIATE``; ``UPDATE ..
           DO NOTHING``; ``COMMIT``                         WHERE generation = 1``; ``COMMIT``
pyetcd     txn: ``create_revision(owner) == 0`` ->          txn: ``create_revision(owner) ==
           put owner (attached to a lease)                  rev`` -> delete owner, put done
kazoo      multi: create job znode, create ephemeral        multi: delete owner, set job data
           owner znode                                      at version 0
psycopg 3  ``INSERT .. ON CONFLICT DO NOTHING`` (one         ``UPDATE .. WHERE generation = 1``
           autocommit statement)                            (one autocommit statement)
=========  ===============================================  ================================

Each cycler owns its client; create it in the process that uses it (never fork one).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["Cycler", "EtcdRaw", "PostgresRaw", "SqliteRaw", "ZooKeeperRaw", "raw_cycler"]


class Cycler(Protocol):
    """One claim+complete cycle per :meth:`cycle` call, on a job id never used before."""

    def open(self) -> None: ...

    def cycle(self, job_id: str) -> None: ...

    def close(self) -> None: ...


class BaselineError(RuntimeError):
    """A raw compare failed: the baseline is not doing what it claims to."""


class SqliteRaw:
    """Two write transactions with the ``sqlite3`` module, as our SQLite backend opens
    the file (WAL, default ``synchronous``, a busy timeout)."""

    def __init__(self, path: str, busy_timeout_s: float = 5.0) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self._db: sqlite3.Connection | None = None

    def open(self) -> None:
        db = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("BEGIN IMMEDIATE")
        db.execute("CREATE TABLE IF NOT EXISTS raw_jobs (job_id TEXT PRIMARY KEY, "
                   "generation INTEGER NOT NULL, owner TEXT, done INTEGER NOT NULL)")
        db.execute("COMMIT")
        self._db = db

    def cycle(self, job_id: str) -> None:
        db = self._db
        assert db is not None, "open() first"
        db.execute("BEGIN IMMEDIATE")
        claimed = db.execute(
            "INSERT INTO raw_jobs VALUES (?, 1, 'bench', 0) ON CONFLICT DO NOTHING", (job_id,)
        ).rowcount
        db.execute("COMMIT")
        db.execute("BEGIN IMMEDIATE")
        done = db.execute(
            "UPDATE raw_jobs SET done = 1, owner = NULL WHERE job_id = ? AND generation = 1 "
            "AND done = 0", (job_id,)
        ).rowcount
        db.execute("COMMIT")
        if claimed != 1 or done != 1:
            raise BaselineError(f"raw sqlite cycle of {job_id!r}: {claimed=} {done=}")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


class EtcdRaw:
    """Two transactions with pyetcd (etcd-sdk-python) on one member, the owner key
    attached to one lease granted at :meth:`open`."""

    def __init__(self, host: str, port: int, prefix: str) -> None:
        self.host, self.port, self.prefix = host, port, prefix.rstrip("/")
        self._client: Any = None
        self._lease: Any = None

    def open(self) -> None:
        import pyetcd

        self._client = pyetcd.client(host=self.host, port=self.port, timeout=10)
        self._lease = self._client.lease(60)

    def cycle(self, job_id: str) -> None:
        client = self._client
        tx = client.transactions
        owner = f"{self.prefix}/{job_id}/o"
        ok, responses = client.transaction(
            compare=[tx.create(owner) == 0],
            success=[tx.put(owner, b"bench", lease=self._lease)],
            failure=[],
        )
        if not ok:
            raise BaselineError(f"raw etcd claim of {job_id!r} refused")
        revision = responses[0].response_put.header.revision
        ok, _ = client.transaction(
            compare=[tx.create(owner) == revision],
            success=[tx.delete(owner), tx.put(f"{self.prefix}/{job_id}/c", b"done")],
            failure=[],
        )
        if not ok:
            raise BaselineError(f"raw etcd complete of {job_id!r} refused")

    def close(self) -> None:
        if self._client is not None:
            try:
                if self._lease is not None:
                    self._lease.revoke()
            finally:
                self._client.close()
                self._client = None


class ZooKeeperRaw:
    """Two multis with kazoo."""

    def __init__(self, hosts: str, base: str) -> None:
        self.hosts, self.base = hosts, base.rstrip("/")
        self._client: Any = None

    def open(self) -> None:
        from kazoo.client import KazooClient

        client = KazooClient(hosts=self.hosts, timeout=10.0)
        client.start(timeout=15.0)
        client.ensure_path(self.base)
        self._client = client

    def cycle(self, job_id: str) -> None:
        client = self._client
        job = f"{self.base}/{job_id}"
        claim = client.transaction()
        claim.create(job, b"held")
        claim.create(f"{job}/owner", b"bench", ephemeral=True)
        self._check(claim.commit(), job_id, "claim")
        done = client.transaction()
        done.delete(f"{job}/owner")
        done.set_data(job, b"done", version=0)
        self._check(done.commit(), job_id, "complete")

    @staticmethod
    def _check(results: list[Any], job_id: str, what: str) -> None:
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise BaselineError(f"raw ZooKeeper {what} of {job_id!r}: {failed[0]!r}")

    def close(self) -> None:
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None


class PostgresRaw:
    """Two autocommit statements with psycopg 3 on one connection (each statement its own
    transaction, one round trip), on a table the target made (:mod:`.clusters`)."""

    def __init__(self, conninfo: str, table: str) -> None:
        self.conninfo, self.table = conninfo, table
        self._conn: Any = None

    def open(self) -> None:
        import psycopg

        self._conn = psycopg.connect(self.conninfo, autocommit=True)

    def cycle(self, job_id: str) -> None:
        conn = self._conn
        claimed = conn.execute(
            f"INSERT INTO {self.table} VALUES (%s, 1, 'bench', false) ON CONFLICT DO NOTHING",
            (job_id,)).rowcount
        done = conn.execute(
            f"UPDATE {self.table} SET done = true, owner = NULL WHERE job_id = %s "
            "AND generation = 1 AND NOT done", (job_id,)).rowcount
        if claimed != 1 or done != 1:
            raise BaselineError(f"raw PostgreSQL cycle of {job_id!r}: {claimed=} {done=}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def raw_cycler(spec: Mapping[str, Any]) -> Cycler:
    """The raw cycler for a target's ``raw`` spec (see :mod:`.clusters`)."""
    kind = spec["kind"]
    if kind == "sqlite":
        return SqliteRaw(str(spec["path"]), float(spec.get("busy_timeout_s", 5.0)))
    if kind == "etcd":
        return EtcdRaw(str(spec["host"]), int(spec["port"]), str(spec["prefix"]))
    if kind == "zookeeper":
        return ZooKeeperRaw(str(spec["hosts"]), str(spec["base"]))
    if kind == "postgresql":
        return PostgresRaw(str(spec["conninfo"]), str(spec["table"]))
    raise ValueError(f"no raw baseline for {kind!r}")
