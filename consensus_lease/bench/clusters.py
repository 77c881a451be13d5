"""Where each backend's store comes from: a temporary SQLite file, a cluster started
through the container kit, or a URL given on the command line.

Clusters started here take the kit's *highest* free loopback slot among
:data:`BENCH_SLOTS` (``127.0.63.x`` downwards), while the test suite's clusters take the
lowest free one from 0, so a benchmark never disturbs a test run and vice versa (the
kit's per-slot lock files also keep two runs apart).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..store import ENTRY_POINT_GROUP
from .config import Target

__all__ = [
    "BENCH_SLOTS", "backend_problem", "etcd_target", "postgresql_target", "sqlite_target",
    "zookeeper_target",
]

BENCH_SLOTS = tuple(range(63, 47, -1))
"""Kit slots tried, highest first (slot k puts members on 127.0.k.x)."""

SCHEMES = {"sqlite": "sqlite", "etcd": "etcd", "zookeeper": "zk", "postgresql": "postgresql"}
DEFAULT_PORTS = {"etcd": 2379, "zookeeper": 2181}

Note = Callable[[str], None]


def backend_problem(backend: str) -> str | None:
    """Why our driver for ``backend`` cannot be loaded, or ``None`` if it can."""
    scheme = SCHEMES[backend]
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == scheme]
    if not found:
        return f"no consensus_lease backend is registered for {scheme}://"
    try:
        found[0].load()
    except Exception as exc:  # ImportError, or the module not exporting the class yet
        return (f"our {backend} backend does not load ({found[0].value}): "
                f"{type(exc).__name__}: {exc}")
    return None


def split_hosts(url: str, default_port: int) -> list[tuple[str, int]]:
    """``[(host, port), ...]`` from ``scheme://h1:p1,h2:p2/...``."""
    netloc = urlsplit(url).netloc.rsplit("@", 1)[-1]
    hosts = []
    for item in filter(None, netloc.split(",")):
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        hosts.append((host, int(port) if port else default_port))
    if not hosts:
        raise ValueError(f"no hosts in {url!r}")
    return hosts


def _with_prefix(url: str, prefix: str) -> str:
    """``url`` with its path replaced by ``/prefix`` (query string kept)."""
    parts = urlsplit(url)
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}://{parts.netloc}/{prefix}{query}"


SQLITE_BUSY_TIMEOUT_S = 30.0
"""Both our backend and the raw baseline wait this long for the write lock: eight
processes writing one file on a busy 2-core machine can starve one for more than the
default 5 s (SQLite's busy handler is not fair)."""


def sqlite_target(directory: str) -> Target:
    timeout = SQLITE_BUSY_TIMEOUT_S
    return Target(
        backend="sqlite",
        # directory is absolute: four slashes
        url=f"sqlite:///{directory}/ours.db?busy_timeout_s={timeout:g}",
        raw={"kind": "sqlite", "path": f"{directory}/raw.db", "busy_timeout_s": timeout},
        origin=f"temporary files in {directory} (WAL, default synchronous=FULL, "
               f"busy timeout {timeout:g} s for ours and raw)",
    )


def _start_kit_cluster(kind: str, stack: contextlib.ExitStack, note: Note) -> Any:
    """Start a 3-member cluster on the highest free bench slot; stopped by ``stack``."""
    from ..testing import engine

    if not engine.engine_answers():
        raise RuntimeError(
            "no Docker engine answers on /var/run/docker.sock (docker/start-engine.sh "
            f"starts one), and no --{'etcd' if kind == 'etcd' else 'zk'}-url was given"
        )
    image = engine.etcd_image() if kind == "etcd" else engine.zookeeper_image()
    if engine.missing_images([image]):
        raise RuntimeError(f"image {image} is missing (consensus-lease kit build-images builds it)")
    from ..testing.cluster import ClusterError, EtcdCluster, ZooKeeperCluster

    for slot in BENCH_SLOTS:
        # the kit's ensemble allows any number of connections per client address
        # (maxClientCnxns=0): W9 opens thousands of sessions, one connection each
        cluster = EtcdCluster(slot=slot) if kind == "etcd" else ZooKeeperCluster(slot=slot)
        try:
            cluster.start(timeout_s=90.0)
        except ClusterError as exc:
            if "no free" in str(exc):
                continue
            raise
        stack.callback(cluster.stop)
        note(f"{kind}: started 3 members on slot {slot} ({', '.join(cluster.endpoints)}) "
             f"in {cluster.ready_after_s:.1f} s")
        return cluster
    raise RuntimeError(f"no free {kind} kit slot among {BENCH_SLOTS}")


def etcd_target(url: str | None, run_id: str, stack: contextlib.ExitStack, note: Note) -> Target:
    """etcd from ``url`` or a kit cluster; our keys under ``/clbench-RUN``."""
    problem = backend_problem("etcd")
    if problem is not None:
        return Target("etcd", reason=problem)
    origin = f"given URL {url}"
    if url is None:
        try:
            cluster = _start_kit_cluster("etcd", stack, note)
        except Exception as exc:
            return Target("etcd", reason=f"could not start an etcd cluster: {exc}")
        url = cluster.client_url
        origin = (f"container kit: 3 members of etcd 3.4 on {', '.join(cluster.endpoints)}, "
                  f"heartbeat {cluster.heartbeat_interval_ms} ms, election timeout "
                  f"{cluster.election_timeout_ms} ms")
    hosts = split_hosts(url, DEFAULT_PORTS["etcd"])
    # Our transport starts at a random member (to spread clients), and a write through a
    # follower costs one more hop than through the leader: pin ours to the member the raw
    # client and the peers use, so that their ratios compare like with like.
    host, port = hosts[0]
    parts = urlsplit(url)
    return Target(
        backend="etcd",
        url=_with_prefix(f"{parts.scheme}://{host}:{port}" + (f"?{parts.query}" if parts.query
                                                               else ""), f"clbench-{run_id}"),
        raw={"kind": "etcd", "host": host, "port": port, "prefix": f"/clbench-{run_id}-raw",
             "gateway": f"http://{host}:{port}"},
        origin=origin + f"; every client (ours, raw, peers) connects to {host}:{port}",
    )


def zookeeper_target(
    url: str | None, run_id: str, stack: contextlib.ExitStack, note: Note,
    tick_ms: int | None = None,
) -> Target:
    """ZooKeeper from ``url`` or a kit ensemble; our znodes under ``/clbench-RUN``.
    ``tick_ms`` is the given ensemble's tickTime, if known (else asked with ``conf``)."""
    problem = backend_problem("zookeeper")
    if problem is not None:
        return Target("zookeeper", reason=problem)
    origin = f"given URL {url}"
    tick_s: float | None = None
    tick_source = ""
    if url is None:
        try:
            cluster = _start_kit_cluster("zookeeper", stack, note)
        except Exception as exc:
            return Target("zookeeper", reason=f"could not start a ZooKeeper ensemble: {exc}")
        url = cluster.client_url
        tick_s = int(cluster.config["tickTime"]) / 1000.0
        tick_source = "kit configuration"
        origin = (f"container kit: 3 members of ZooKeeper 3.8 on {', '.join(cluster.endpoints)}, "
                  f"tickTime {cluster.config['tickTime']} ms")
    hosts = split_hosts(url, DEFAULT_PORTS["zookeeper"])
    # kazoo picks a random member per client, and a write through a follower costs one
    # more hop than through the leader: pin ours, the raw client and the peers to the
    # same member so that their ratios compare like with like.
    host, port = hosts[0]
    pinned = f"{host}:{port}"
    if tick_s is None and tick_ms is not None:
        tick_s, tick_source = tick_ms / 1000.0, "--zk-tick-ms"
    if tick_s is None:
        tick_s = zookeeper_tick_s(*hosts[0])
        tick_source = "'conf' four-letter word" if tick_s is not None else "unknown"
    parts = urlsplit(url)
    return Target(
        backend="zookeeper",
        url=f"zk://{pinned}/clbench-{run_id}" + (f"?{parts.query}" if parts.query else ""),
        raw={"kind": "zookeeper", "hosts": pinned,
             "base": f"/clbench-{run_id}-raw", "peers": f"/clbench-{run_id}-peers"},
        origin=origin + f"; every client (ours, raw, peers) connects to {pinned}",
        tick_s=tick_s,
        tick_source=tick_source,
    )


def zookeeper_tick_s(host: str, port: int) -> float | None:
    """tickTime from the ``conf`` four-letter word, if the server allows it."""
    from ..testing.cluster import four_letter_word

    try:
        reply = four_letter_word(host, port, "conf")
    except OSError:
        return None
    found = re.search(r"^tickTime=(\d+)", reply, re.MULTILINE)
    return int(found.group(1)) / 1000.0 if found else None


POSTGRES_ENV = "CONSENSUS_LEASE_POSTGRES_URL"
START_POSTGRES = Path(__file__).resolve().parents[2] / "scripts" / "start-postgres.sh"
"""The script the tests start PostgreSQL with (in a source checkout)."""


def _start_postgres(note: Note) -> str:
    """Start (or find running) the tests' throw-away server; its SQLAlchemy URL."""
    if not START_POSTGRES.is_file():
        raise RuntimeError(f"no --pg-url, no {POSTGRES_ENV}, and no {START_POSTGRES}")
    done = subprocess.run(["bash", str(START_POSTGRES)], capture_output=True, text=True,
                          timeout=300, check=False)
    found = re.search(rf"{POSTGRES_ENV}=(\S+)", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{START_POSTGRES.name} failed: {done.stderr.strip()[-400:]}")
    note(f"postgresql: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'up'}")
    return found.group(1)


def postgresql_target(url: str | None, run_id: str, stack: contextlib.ExitStack,
                      note: Note) -> Target:
    """PostgreSQL from ``url``, ``$CONSENSUS_LEASE_POSTGRES_URL`` or
    ``scripts/start-postgres.sh`` (started the way ``make test`` starts it, left running
    as the tests leave it); ours, the raw client and tooz in the schema ``clbench_RUN``,
    dropped at the end."""
    problem = backend_problem("postgresql")
    if problem is not None:
        return Target("postgresql", reason=problem)
    origin = "given URL"
    if url is None and os.environ.get(POSTGRES_ENV):
        url, origin = os.environ[POSTGRES_ENV], f"${POSTGRES_ENV}"
    if url is None:
        try:
            url = _start_postgres(note)
        except Exception as exc:
            return Target("postgresql", reason=f"could not start PostgreSQL: {exc}")
        origin = ("scripts/start-postgres.sh, as the tests start it (PostgreSQL on "
                  "127.0.0.1, fsync=off, its own data directory)")
    conninfo = "postgresql://" + url.split("://", 1)[1]
    schema = f"clbench_{run_id}"
    try:
        import psycopg

        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            conn.execute(f'CREATE TABLE "{schema}".raw_jobs (job_id text PRIMARY KEY, '
                         "generation bigint NOT NULL, owner text, done boolean NOT NULL)")
    except Exception as exc:
        return Target("postgresql", reason=f"PostgreSQL unusable: {type(exc).__name__}: {exc}")
    stack.callback(_drop_schema, conninfo, schema)
    host = urlsplit(conninfo).hostname
    return Target(
        backend="postgresql",
        url=f"{conninfo}?schema={schema}",
        raw={"kind": "postgresql", "conninfo": conninfo, "table": f'"{schema}".raw_jobs',
             "tooz": conninfo},
        origin=f"{origin}; every client (ours, raw, tooz) connects to {host}",
    )


def _drop_schema(conninfo: str, schema: str) -> None:
    import psycopg

    with contextlib.suppress(Exception), psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
