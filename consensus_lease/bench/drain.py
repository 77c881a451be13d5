"""W10: queue drain. ``w10_jobs`` no-op jobs enqueued (batched), then drained by a
worker; jobs/s over ``w10_rounds`` rounds (median and spread), the sides in turn within
each round (ours, the raw client's two-request loop, the peers), every job checked done
exactly once. On PostgreSQL pgqueuer runs three ways: ``batch_size=100`` (its throughput
configuration) in 1 and 2 processes, and ``batch_size=1`` in 1 process (one job per
dequeue: the sequential comparison for ours with one worker and no knobs).

Per side and round (each side a subprocess of its own, :mod:`.drainsides`):

* ``jobs_s``: jobs / seconds from the go signal to the worker's return (worker start-up
  included; ours ends when a non-waiting claim finds the queue drained);
* ``enqueue_jobs_s``: the batched enqueue's rate (``enqueue_many``; pgqueuer's list
  ``enqueue``; procrastinate's ``batch_defer_async`` of 1,000; the raw client's one
  ``executemany`` transaction);
* ``client_cpu_us_per_job``: the drain's CPU (user + system) of the side's process and
  its worker processes;
* on PostgreSQL, when the server runs on this machine: ``server_cpu_us_per_job`` (the
  postmaster's children, live ones from ``/proc`` and exited ones through the
  postmaster's ``cutime``/``cstime``) and ``transactions_per_job``
  (``pg_stat_database.xact_commit + xact_rollback``, read after the drain's backends
  exited, which flushes their counts; autovacuum's included). The enqueue's connection
  is closed, and its backend gone, before the first snapshot.

Then, per library (its 1-process side without knobs, pgqueuer at ``batch_size=100``),
the wake-up latency of an idle worker: ``w10_wake_samples`` jobs
enqueued one at a time, ``w10_wake_gap_s`` apart; from each enqueue's return to the
handler's start (p50/p99; the first job, the worker's warm-up, is left out). The raw
loop has none (it does not wait: it polls).

Fencing, once per run: a worker claims a job and is paused (SIGSTOP) past its TTL;
another worker takes the job over; the paused one resumes and completes it late. Ours
refuses it. The peers the same way, in one process (the paused worker sends nothing):
pgqueuer's job is re-picked by another worker's dequeue after the paused one's
heartbeat timeout (1 s); procrastinate's after its stalled-job retry
(``get_stalled_jobs`` past a 1 s heartbeat, ``retry_job``); then the paused worker
completes, and what the store kept is read back.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .config import Sizes, Target
from .stats import percentile
from .windows import spread

__all__ = ["w10_drain"]

CLIENT_BACKEND = re.compile(r"^postgres: \S+ \S+ (\[local\]|\S+\(\d+\))")
"""A client backend's title in ``/proc/PID/cmdline`` (not a background process)."""


RAW_LOOPS = ("sqlite", "postgresql", "etcd", "zookeeper")
"""Stores with a raw two-request drain loop (:mod:`.drainraw`)."""


class PgServer:
    """The server's CPU and transaction counts, read around a drain (same machine)."""

    def __init__(self, conninfo: str) -> None:
        import psycopg

        self.conninfo = conninfo
        self.postmaster: int | None = None
        self.baseline = 0
        with psycopg.connect(conninfo, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid(), current_database()").fetchone()
            assert row is not None
            try:  # while the backend lives: it exits once the connection is closed
                with open(f"/proc/{row[0]}/stat") as stat:
                    self.postmaster = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                self.postmaster = None  # not on this machine: no server CPU
        self.database = str(row[1])
        if self.postmaster is not None:
            self.baseline = self.client_backends()  # other clients of this server

    def _children(self) -> list[int]:
        assert self.postmaster is not None
        path = f"/proc/{self.postmaster}/task/{self.postmaster}/children"
        with open(path) as children:
            return [int(p) for p in children.read().split()]

    def cpu_s(self) -> float | None:
        if self.postmaster is None:
            return None
        ticks = 0
        with open(f"/proc/{self.postmaster}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        for pid in self._children():
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])
            except OSError:
                continue  # exited meanwhile: in the postmaster's cutime at its reaping
        return ticks / os.sysconf("SC_CLK_TCK")

    def client_backends(self) -> int:
        count = 0
        for pid in self._children() if self.postmaster is not None else []:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    title = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            count += bool(CLIENT_BACKEND.match(title))
        return count

    def wait_idle(self, timeout_s: float = 20.0) -> None:
        """Until no more client backends than when this was made are left (exited
        backends have flushed their statistics)."""
        deadline = time.monotonic() + timeout_s
        while self.client_backends() > self.baseline and time.monotonic() < deadline:
            time.sleep(0.02)

    def transactions(self) -> int:
        """Commits + rollbacks of the database so far (this read's own connection is
        one more, counted by the next read)."""
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                               "WHERE datname = %s", (self.database,)).fetchone()
        assert row is not None
        return int(row[0])


def _sides(target: Target, peers: dict[str, str | None]) -> list[dict[str, Any]]:
    from .drainpeers import PGQ_BATCH
    from .drainsides import runner_knobs

    sides: list[dict[str, Any]] = [{"name": "ours, 1 worker", "side": "ours", "processes": 1}]
    knobs = runner_knobs()
    if knobs:
        label = ", ".join(f"{k}={v}" for k, v in knobs.items())
        sides.append({"name": f"ours, 1 worker, {label}", "side": "ours", "processes": 1,
                      "knobs": knobs})
    sides.append({"name": "ours, 2 processes", "side": "ours", "processes": 2})
    if knobs:
        sides.append({"name": f"ours, 2 processes, {label}", "side": "ours",
                      "processes": 2, "knobs": knobs})
    if target.backend in RAW_LOOPS:
        sides.append({"name": "raw client, 1 worker", "side": f"raw-{target.backend}",
                      "processes": 1})
    if target.backend != "postgresql":
        return sides
    if peers.get("pgqueuer"):
        for processes, batch in ((1, 1), (1, PGQ_BATCH), (2, PGQ_BATCH)):
            noun = "process" if processes == 1 else "processes"
            sides.append({"name": f"pgqueuer, {processes} {noun}, batch_size={batch}",
                          "side": "pgqueuer", "processes": processes, "batch_size": batch})
    if peers.get("procrastinate"):
        sides.append({"name": "procrastinate, 1 process", "side": "procrastinate",
                      "processes": 1})
        sides.append({"name": "procrastinate, 2 processes", "side": "procrastinate",
                      "processes": 2})
    return sides


def _spec(target: Target, side: dict[str, Any], queue: str, jobs: int, scratch: str,
          schemas: dict[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {**side, "url": target.url, "queue": queue, "jobs": jobs,
                            "scratch": scratch}
    if target.backend == "postgresql":
        conninfo = target.raw["conninfo"]
        spec["conninfo"] = conninfo
        spec["raw_table"] = f'{target.raw["table"].rsplit(".", 1)[0]}."{queue}"'
        spec["schema"] = schemas.get(side["side"], "")
    elif target.backend == "sqlite":
        spec["raw_path"] = os.path.join(scratch, f"{queue}.db")
    else:
        spec["raw"] = target.raw
    return spec


def _child(what: str, spec: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "consensus_lease.bench.drainsides", what, json.dumps(spec)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _last_json(text: str) -> dict[str, Any]:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError("the side printed no result")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _drain_once(spec: dict[str, Any], server: PgServer | None) -> dict[str, Any]:
    """One side, one round: enqueue, snapshot, drain, snapshot."""
    child = _child("drain", spec)
    assert child.stdin is not None and child.stdout is not None
    try:
        ready = json.loads(child.stdout.readline() or "{}")
        if not ready.get("ready"):
            raise RuntimeError(f"{spec['name']}: no ready line")
        if server is not None:
            server.wait_idle()
            cpu0, xact0 = server.cpu_s(), server.transactions()
        child.stdin.write("go\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=3600)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode:
        raise RuntimeError(f"{spec['name']} exited {child.returncode}")
    result = _last_json(out)
    jobs = spec["jobs"]
    result["jobs_s"] = jobs / result["drain_s"]
    result["enqueue_jobs_s"] = jobs / ready["enqueue_s"]
    result["client_cpu_us_per_job"] = result["client_cpu_s"] / jobs * 1e6
    if server is not None:
        server.wait_idle()
        cpu1, xact1 = server.cpu_s(), server.transactions()
        if cpu0 is not None and cpu1 is not None:
            result["server_cpu_us_per_job"] = (cpu1 - cpu0) / jobs * 1e6
        result["transactions_per_job"] = (xact1 - xact0 - 1) / jobs
    if spec["side"] == "ours":
        _purge(spec["url"], spec["queue"])
    return result


def _purge(url: str, queue: str) -> None:
    """Delete a drained queue's COMPLETED records, after the server snapshot, as a user
    does once done with them: ZooKeeper's store-wide limit (``store_max_jobs``) counts
    them, and a run enqueues ``w10_jobs`` for every side and round."""
    from ..store import open_store

    with open_store(url) as store:
        store.purge(queue)


def _wake(spec: dict[str, Any]) -> dict[str, Any]:
    child = _child("wake", spec)
    out, _ = child.communicate("", timeout=600)
    if child.returncode:
        raise RuntimeError(f"{spec['name']} wake-up exited {child.returncode}")
    latencies = _last_json(out)["latencies_s"]
    return {"samples": len(latencies), "p50_ms": percentile(latencies, 50) * 1e3,
            "p99_ms": percentile(latencies, 99) * 1e3, "max_ms": max(latencies) * 1e3}


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("jobs_s", "enqueue_jobs_s", "client_cpu_us_per_job", "server_cpu_us_per_job",
            "transactions_per_job")
    summary: dict[str, Any] = {}
    for key in keys:
        values = [r[key] for r in rounds if r.get(key) is not None]
        if values:
            summary[key] = spread(values)
    summary["exactly_once"] = all(r.get("exactly_once") for r in rounds)
    summary["duplicates"] = sum(r.get("duplicates", 0) for r in rounds)
    summary["missing"] = sum(r.get("missing", 0) for r in rounds)
    return summary


def _fencing(target: Target, prefix: str, peers: dict[str, str | None],
             schemas: dict[str, str]) -> dict[str, Any]:
    from . import drainpeers

    url, queue = str(target.url), f"{prefix}-fence"
    conninfo = target.raw.get("conninfo", "")
    checks: dict[str, Callable[[], dict[str, Any]]] = {
        "ours": lambda: drainpeers.fence_ours(url, queue)}
    if target.backend == "postgresql" and peers.get("pgqueuer"):
        checks["pgqueuer"] = lambda: drainpeers.fence_pgqueuer(
            conninfo, schemas["pgqueuer"], queue)
    if target.backend == "postgresql" and peers.get("procrastinate"):
        checks["procrastinate"] = lambda: drainpeers.fence_procrastinate(
            conninfo, schemas["procrastinate"], queue)
    fencing: dict[str, Any] = {}
    for name, check in checks.items():
        try:
            fencing[name] = check()
        except Exception as exc:
            fencing[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return fencing


def w10_drain(target: Target, sizes: Sizes, prefix: str) -> dict[str, Any]:
    """W10 on ``target`` (see the module docstring)."""
    from . import drainpeers

    assert target.url is not None
    safe = re.sub(r"[^a-z0-9_]", "_", prefix.lower())
    schemas = {"pgqueuer": f"w10_pgq_{safe}", "procrastinate": f"w10_procr_{safe}"}
    peers: dict[str, str | None] = dict.fromkeys(drainpeers.PEERS)
    server = None
    if target.backend == "postgresql":
        peers = drainpeers.setup_peers(target.raw["conninfo"], schemas)
        server = PgServer(target.raw["conninfo"])
        if server.postmaster is None:
            server = None
    try:
        result = _measure(target, sizes, safe, peers, schemas, server)
    finally:
        if target.backend == "postgresql":
            drainpeers.drop_schemas(target.raw["conninfo"], schemas)
    return result


def _measure(target: Target, sizes: Sizes, safe: str, peers: dict[str, str | None],
             schemas: dict[str, str], server: PgServer | None) -> dict[str, Any]:
    from .drainpeers import PGQ_BATCH

    sides = _sides(target, peers)
    per_side: dict[str, list[dict[str, Any]]] = {s["name"]: [] for s in sides}
    with tempfile.TemporaryDirectory(prefix="clbench-w10-") as scratch:
        for r in range(sizes.w10_rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for side in order:
                queue = f"{safe}_r{r}_s{sides.index(side)}"
                spec = _spec(target, side, queue, sizes.w10_jobs, scratch, schemas)
                per_side[side["name"]].append(_drain_once(spec, server))
        wake: dict[str, Any] = {}
        for index, side in enumerate(sides):
            if side["side"].startswith("raw-") or side.get("processes", 1) != 1 \
                    or side.get("knobs") or side.get("batch_size", PGQ_BATCH) != PGQ_BATCH:
                continue  # one idle worker per library: ours with no knobs, pgqueuer at 100
            spec = _spec(target, side, f"{safe}_wake{index}", 0, scratch, schemas)
            spec.update(wake_samples=sizes.w10_wake_samples, wake_gap_s=sizes.w10_wake_gap_s)
            wake[side["name"]] = _wake(spec)
    return {"jobs": sizes.w10_jobs, "rounds": sizes.w10_rounds, "peers": peers,
            "sides": [{"name": s["name"], "side": s["side"],
                       "processes": s.get("processes", 1), "knobs": s.get("knobs", {}),
                       **({"batch_size": s["batch_size"]} if "batch_size" in s else {}),
                       "summary": _summary(per_side[s["name"]]),
                       "rounds": per_side[s["name"]],
                       "wake": wake.get(s["name"])} for s in sides],
            "fencing": _fencing(target, f"{safe}_f", peers, schemas),
            "raw_loop": target.backend in RAW_LOOPS,
            "server_measured": server is not None}
