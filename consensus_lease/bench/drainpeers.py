"""W10's peers on PostgreSQL, pgqueuer and procrastinate (in the ``bench`` extra),
and the fencing check of each: a paused worker's late completion, after another worker
took its job over.

==============  =========================================================================
peer            configured for throughput as its docs say
==============  =========================================================================
pgqueuer        asyncpg, ``QueueManager.run(batch_size=100, mode=drain)`` (W10 also runs
                it with ``batch_size=1``: one job per dequeue, the sequential
                comparison); its tables installed by ``Queries.install()`` in a schema
                of the run's own
procrastinate   ``PsycopgConnector``, ``run_worker_async(concurrency=10, wait=False)``
                (``listen_notify`` on, the default); its schema applied by
                ``schema_manager.apply_schema_async()`` in a schema of the run's own
==============  =========================================================================

Both peers run several processes the same way ours does: each process a worker of its
own (spawned, never forked), all draining the same queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from multiprocessing import get_context
from typing import Any

__all__ = ["PEERS", "fence_ours", "fence_pgqueuer", "fence_procrastinate", "peer_versions",
           "setup_peers"]

PEERS = ("pgqueuer", "procrastinate")
PGQ_BATCH = 100
"""pgqueuer's ``batch_size`` where a W10 side names none: a side's ``batch_size`` key
picks another (results written before sides recorded it ran every pgqueuer side with
this one)."""
PROCRASTINATE_CONCURRENCY = 10


def peer_versions() -> dict[str, str | None]:
    """The installed version of each peer, ``None`` if it is not installed (or its
    driver is not: pgqueuer here needs asyncpg)."""
    found: dict[str, str | None] = {}
    for name in PEERS:
        try:
            __import__(name)
            if name == "pgqueuer":
                __import__("asyncpg")
            found[name] = importlib.metadata.version(name)
        except ImportError:
            found[name] = None
    return found


def with_schema(conninfo: str, schema: str) -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo(conninfo, options=f"-c search_path={schema}")


async def _asyncpg(conninfo: str, schema: str) -> Any:
    import asyncpg  # type: ignore[import-untyped]

    return await asyncpg.connect(conninfo, server_settings={"search_path": schema})


async def _setup(conninfo: str, schemas: dict[str, str], versions: dict[str, Any]) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        for schema in schemas.values():
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    if versions.get("pgqueuer"):
        from pgqueuer import AsyncpgDriver, Queries

        conn = await _asyncpg(conninfo, schemas["pgqueuer"])
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()
    if versions.get("procrastinate"):
        app = _procrastinate_app(conninfo, schemas["procrastinate"], "w10-setup")[0]
        async with app.open_async():
            await app.schema_manager.apply_schema_async()


def drop_schemas(conninfo: str, schemas: dict[str, str]) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        for schema in schemas.values():
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def setup_peers(conninfo: str, schemas: dict[str, str]) -> dict[str, str | None]:
    """Install each installed peer's schema in its own PostgreSQL schema; return
    :func:`peer_versions`."""
    versions = peer_versions()
    asyncio.run(_setup(conninfo, schemas, versions))
    return versions


# -- pgqueuer --------------------------------------------------------------------------

async def _pgq_enqueue(spec: dict[str, Any], payloads: list[bytes]) -> None:
    from pgqueuer import AsyncpgDriver, Queries

    conn = await _asyncpg(spec["conninfo"], spec["schema"])
    try:
        await Queries(AsyncpgDriver(conn)).enqueue(
            [spec["queue"]] * len(payloads), list(payloads), [0] * len(payloads))
    finally:
        await conn.close()


async def _pgq_worker(spec: dict[str, Any]) -> list[str]:
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    conn = await _asyncpg(spec["conninfo"], spec["schema"])
    seen: list[str] = []
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(spec["queue"])
    async def noop(job: Any) -> None:
        seen.append(bytes(job.payload).decode())

    try:
        await qm.run(batch_size=int(spec.get("batch_size", PGQ_BATCH)),
                     mode=QueueExecutionMode.drain)
    finally:
        await conn.close()
    return seen


# -- procrastinate ---------------------------------------------------------------------

def _procrastinate_app(conninfo: str, schema: str, queue: str) -> tuple[Any, Any, list[str]]:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=with_schema(conninfo, schema)))
    seen: list[str] = []

    @app.task(name=f"noop-{queue}", queue=queue)
    async def noop(i: str) -> None:
        seen.append(i)

    return app, noop, seen


async def _procrastinate_enqueue(spec: dict[str, Any], ids: list[str]) -> None:
    app, task, _ = _procrastinate_app(spec["conninfo"], spec["schema"], spec["queue"])
    async with app.open_async():
        for start in range(0, len(ids), 1000):
            await task.batch_defer_async(*({"i": i} for i in ids[start:start + 1000]))


async def _procrastinate_worker(spec: dict[str, Any]) -> list[str]:
    app, _, seen = _procrastinate_app(spec["conninfo"], spec["schema"], spec["queue"])
    async with app.open_async():
        await app.run_worker_async(queues=[spec["queue"]], wait=False,
                                   concurrency=PROCRASTINATE_CONCURRENCY,
                                   install_signal_handlers=False)
    return seen


# -- the drain of a peer, in one process or several ------------------------------------

def _worker_in_process(kind: str, spec: dict[str, Any]) -> list[str]:
    worker = _pgq_worker if kind == "pgqueuer" else _procrastinate_worker
    return asyncio.run(worker(spec))


async def _drain(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    from .drainsides import _check, _cpu_s

    ids = [f"{spec['queue']}-{i}" for i in range(spec["jobs"])]
    started = time.monotonic()
    if kind == "pgqueuer":
        await _pgq_enqueue(spec, [i.encode() for i in ids])
    else:
        await _procrastinate_enqueue(spec, ids)
    print(json.dumps({"ready": True, "enqueue_s": time.monotonic() - started}), flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    cpu, go = _cpu_s(), time.monotonic()
    processes = int(spec.get("processes", 1))
    if processes == 1:
        worker = _pgq_worker if kind == "pgqueuer" else _procrastinate_worker
        seen = await worker(spec)
    else:
        with ProcessPoolExecutor(processes, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(_worker_in_process, kind, spec) for _ in range(processes)]
            seen = [i for f in futures for i in await asyncio.wrap_future(f)]
    end = time.monotonic()
    return {"drain_s": end - go, "client_cpu_s": _cpu_s() - cpu, **_check(seen, len(ids))}


async def pgqueuer_drain(spec: dict[str, Any]) -> dict[str, Any]:
    return await _drain("pgqueuer", spec)


async def procrastinate_drain(spec: dict[str, Any]) -> dict[str, Any]:
    return await _drain("procrastinate", spec)


# -- woken from idle -------------------------------------------------------------------

async def _wake_loop(spec: dict[str, Any], enqueue: Any, started: asyncio.Event,
                     begun: list[float]) -> list[float]:
    latencies = []
    for i in range(spec["wake_samples"] + 1):
        await asyncio.sleep(spec["wake_gap_s"])  # the workload: the worker goes idle
        started.clear()
        await enqueue(f"{spec['queue']}-w{i}")
        enqueued = time.monotonic()
        await asyncio.wait_for(started.wait(), 30)
        latencies.append(begun[-1] - enqueued)
    return latencies[1:]


async def pgqueuer_wake(spec: dict[str, Any]) -> dict[str, Any]:
    from pgqueuer import AsyncpgDriver, Queries, QueueManager

    started, begun = asyncio.Event(), []
    worker_conn = await _asyncpg(spec["conninfo"], spec["schema"])
    enqueue_conn = await _asyncpg(spec["conninfo"], spec["schema"])
    qm = QueueManager(Queries(AsyncpgDriver(worker_conn)))

    @qm.entrypoint(spec["queue"])
    async def noop(job: Any) -> None:
        begun.append(time.monotonic())
        started.set()

    queries = Queries(AsyncpgDriver(enqueue_conn))
    running = asyncio.create_task(
        qm.run(batch_size=int(spec.get("batch_size", PGQ_BATCH))))
    try:
        latencies = await _wake_loop(
            spec, lambda i: queries.enqueue(spec["queue"], i.encode(), 0), started, begun)
    finally:
        qm.shutdown.set()
        await running
        await worker_conn.close()
        await enqueue_conn.close()
    return {"latencies_s": latencies}


async def procrastinate_wake(spec: dict[str, Any]) -> dict[str, Any]:
    from procrastinate import App, PsycopgConnector

    started, begun = asyncio.Event(), []
    app = App(connector=PsycopgConnector(conninfo=with_schema(spec["conninfo"],
                                                              spec["schema"])))

    @app.task(name=f"noop-{spec['queue']}", queue=spec["queue"])
    async def noop(i: str) -> None:
        begun.append(time.monotonic())
        started.set()

    async with app.open_async():
        running = asyncio.create_task(app.run_worker_async(
            queues=[spec["queue"]], concurrency=PROCRASTINATE_CONCURRENCY,
            install_signal_handlers=False))
        try:
            latencies = await _wake_loop(spec, lambda i: noop.defer_async(i=i), started, begun)
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    return {"latencies_s": latencies}


# -- fencing ---------------------------------------------------------------------------

def ours_fence_child(spec: dict[str, Any]) -> dict[str, Any]:
    """The paused worker: claims the job, waits (the parent SIGSTOPs it, lets another
    worker take the job over, SIGCONTs it), then completes late."""
    from ..store import open_store

    with open_store(spec["url"]) as store:
        ttl_s = max(1.0, store.capabilities.min_ttl_s)
        session = store.session("w10-fence-paused", ttl_s=ttl_s)
        lease = session.claim_next(spec["queue"], wait_s=10.0)
        print(json.dumps({"claimed": lease.job_id, "token": lease.fencing_token}), flush=True)
        sys.stdin.readline()
        try:
            lease.complete(b"late")
            outcome = "accepted"
        except Exception as exc:
            outcome = f"refused: {type(exc).__name__}"
    return {"late_completion": outcome}


def fence_ours(url: str, queue: str) -> dict[str, Any]:
    """A paused worker's late completion against ours, and what the store kept."""
    from ..store import open_store

    with open_store(url) as store:
        store.enqueue(queue, f"{queue}-fence")
        spec = json.dumps({"side": "ours", "url": url, "queue": queue})
        child = subprocess.Popen(
            [sys.executable, "-m", "consensus_lease.bench.drainsides", "fence", spec],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdin is not None and child.stdout is not None
        try:
            claimed = json.loads(child.stdout.readline())
            os.kill(child.pid, signal.SIGSTOP)  # the pause: no renewal, no request
            session = store.session("w10-fence-new", ttl_s=10.0)
            lease = session.claim_next(queue, wait_s=30.0)  # once the paused TTL ends
            os.kill(child.pid, signal.SIGCONT)
            child.stdin.write("\n")
            child.stdin.flush()
            out, _ = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGCONT)
                child.kill()
        late = json.loads([x for x in out.splitlines() if x.startswith("{")][-1])
        taken = lease.job_id == claimed["claimed"]
        lease.complete(b"new")
        record = store.get(f"{queue}-fence")
        kept = record is not None and record.result == b"new"
    return {"late_completion": late["late_completion"], "taken_over": taken,
            "paused_token": claimed["token"], "store_kept_new_holder": kept,
            "fenced": late["late_completion"].startswith("refused") and kept}


async def _fence_pgqueuer(conninfo: str, schema: str, queue: str) -> dict[str, Any]:
    from pgqueuer import AsyncpgDriver, Queries
    from pgqueuer.ports.repository import EntrypointExecutionParameter

    paused_conn, new_conn = (await _asyncpg(conninfo, schema), await _asyncpg(conninfo, schema))
    try:
        paused, new = Queries(AsyncpgDriver(paused_conn)), Queries(AsyncpgDriver(new_conn))
        await paused.enqueue(queue, b"fence", 0)
        entry = {queue: EntrypointExecutionParameter(concurrency_limit=0)}
        beat = timedelta(seconds=1)
        first = await paused.dequeue(1, entry, uuid.uuid4(), None, beat)  # type: ignore[arg-type]
        await asyncio.sleep(1.5)  # the pause: no heartbeat past heartbeat_timeout
        second = await new.dequeue(1, entry, uuid.uuid4(), None, beat)  # type: ignore[arg-type]
        taken = bool(first and second and first[0].id == second[0].id)
        await paused.log_jobs([(first[0], "successful", None)])
        table = paused.qbq.qualified.queue_table
        left = await new_conn.fetchval(f"SELECT count(*) FROM {table} WHERE id = $1",
                                       first[0].id)
    finally:
        await paused_conn.close()
        await new_conn.close()
    outcome = ("accepted: the job's row was deleted while the new worker still ran it"
               if taken and left == 0 else f"taken_over={taken}, rows left={left}")
    return {"late_completion": outcome, "taken_over": taken, "fenced": False}


def fence_pgqueuer(conninfo: str, schema: str, queue: str) -> dict[str, Any]:
    """pgqueuer's completion of a job another worker re-picked after a missed
    heartbeat: its ``log_jobs`` DELETE matches the job id alone."""
    return asyncio.run(_fence_pgqueuer(conninfo, schema, queue))


async def _fence_procrastinate(conninfo: str, schema: str, queue: str) -> dict[str, Any]:
    from procrastinate.jobs import Status

    app, task, _ = _procrastinate_app(conninfo, schema, queue)
    async with app.open_async():
        manager = app.job_manager
        job_id = await task.defer_async(i="fence")
        paused_worker = await manager.register_worker()
        first = await manager.fetch_job([queue], paused_worker)
        await asyncio.sleep(1.5)  # the pause: no heartbeat
        stalled = [j for j in await manager.get_stalled_jobs(
            queue=queue, seconds_since_heartbeat=1.0) if j.id == job_id]
        for job in stalled:  # what its retry_stalled_jobs task does
            await manager.retry_job(job)
        new_worker = await manager.register_worker()
        second = await manager.fetch_job([queue], new_worker)
        taken = bool(first and second and first.id == second.id == job_id)
        assert first is not None
        await manager.finish_job(first, status=Status.SUCCEEDED, delete_job=False)
        status = await manager.get_job_status_async(job_id)
    outcome = (f"accepted: the job is {status.value} while the new worker still runs it"
               if taken and status == Status.SUCCEEDED else f"taken_over={taken}, {status}")
    return {"late_completion": outcome, "taken_over": taken, "fenced": False}


def fence_procrastinate(conninfo: str, schema: str, queue: str) -> dict[str, Any]:
    """procrastinate's completion of a job another worker got after the stalled-job
    retry (``get_stalled_jobs`` + ``retry_job``, as its ``retry_stalled_jobs`` task
    does): ``finish_job`` matches the job id alone."""
    return asyncio.run(_fence_procrastinate(conninfo, schema, queue))
