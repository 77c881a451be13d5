"""What the benchmark ran on: machine, operating system, library and server versions."""

from __future__ import annotations

import json
import os
import platform
import re
import sqlite3
import urllib.request
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .config import Target

__all__ = ["describe_machine", "load_average", "member_role", "server_version"]

LIBRARIES = ("consensus_lease", "etcd-sdk-python", "grpcio", "protobuf", "kazoo", "tooz",
             "etcd3gw", "matplotlib", "psycopg", "pgqueuer", "asyncpg", "procrastinate")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def describe_machine() -> dict[str, Any]:
    cpuinfo = _read("/proc/cpuinfo")
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    mem = re.search(r"^MemTotal:\s*(\d+) kB", _read("/proc/meminfo"), re.MULTILINE)
    osname = re.search(r'^PRETTY_NAME="?([^"\n]+)', _read("/etc/os-release"), re.MULTILINE)
    libs: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            libs[name] = version(name)
        except PackageNotFoundError:
            libs[name] = None
    return {
        "cpu": model.group(1).strip() if model else platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "memory_gib": round(int(mem.group(1)) / 1024 / 1024, 1) if mem else None,
        "os": osname.group(1) if osname else platform.platform(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "libraries": libs,
        "load_average_at_start": load_average(),
    }


def member_role(target: Target) -> str | None:
    """Whether the member every client connects to is the leader, best effort."""
    try:
        if target.backend == "etcd":
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            request = urllib.request.Request(
                f"{target.raw['gateway']}/v3/maintenance/status", data=b"{}",
                headers={"Content-Type": "application/json"},
            )
            with opener.open(request, timeout=2.0) as response:
                status = json.loads(response.read())
            return "leader" if status.get("leader") == status["header"]["member_id"] \
                else "follower"
        if target.backend == "zookeeper":
            from ..testing.cluster import four_letter_word

            host, _, port = target.raw["hosts"].split(",")[0].rpartition(":")
            found = re.search(r"^Mode: (\w+)", four_letter_word(host, int(port), "srvr"),
                              re.MULTILINE)
            return found.group(1) if found else None
    except (OSError, ValueError, KeyError):
        return None
    return None


def server_version(target: Target) -> str | None:
    """The store server's version, best effort (etcd ``/version``, ZooKeeper ``srvr``,
    PostgreSQL ``SHOW server_version``)."""
    try:
        if target.backend == "etcd":
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(f"{target.raw['gateway']}/version", timeout=2.0) as response:
                return f"etcd {json.loads(response.read())['etcdserver']}"
        if target.backend == "zookeeper":
            from ..testing.cluster import four_letter_word

            host, _, port = target.raw["hosts"].split(",")[0].rpartition(":")
            found = re.search(r"Zookeeper version: ([^,\s]+)", four_letter_word(host, int(port),
                                                                               "srvr"))
            return f"ZooKeeper {found.group(1)}" if found else None
        if target.backend == "postgresql":
            import psycopg

            with psycopg.connect(target.raw["conninfo"], connect_timeout=5) as conn:
                row = conn.execute("SHOW server_version").fetchone()
            return f"PostgreSQL {row[0]}" if row else None
    except (OSError, ValueError, KeyError, ImportError):
        return None
    except Exception:  # psycopg.Error: the version is best effort
        return None
    return f"SQLite {sqlite3.sqlite_version}" if target.backend == "sqlite" else None
