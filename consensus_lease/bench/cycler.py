"""The worker-process side of W1: run claim+complete cycles on command.

A worker is started by :class:`~consensus_lease.bench.pool.WorkerPool` with the
multiprocessing *spawn* context (a fresh interpreter: nothing inherited, so no gRPC or
kazoo client crosses a fork) and serves requests from its pipe, one at a time:

* ``{"op": "prepare", "kind": "ours"|"raw"|"async", "url": .., "raw": {..}, "prefix": ..,
  "warmup": n, "tasks": t}`` opens the client and runs ``warmup`` untimed cycles
  (``async``: ``t`` asyncio tasks, see :mod:`.aiocycler`);
* ``{"op": "run", "start_at": t, "warmup_s": w, "windows": n, "window_s": d,
  "max_cycles": m}`` waits until the monotonic time ``t`` (``CLOCK_MONOTONIC`` is one
  clock for every process of the machine, so this is a start barrier), cycles ``w``
  seconds unmeasured (sessions, connections and the store's first keys settle), then
  ``n`` measured windows of ``d`` seconds (:class:`~.windows.Windows`) or ``m`` cycles;
  replies ``counts`` and ``cpu_s`` per window, ``window_s``, ``warm_cycles``;
* ``{"op": "count", "kind": .., "url": .., "raw": {..}, "prefix": .., "warmup": n,
  "cycles": c, "transports": [..]}`` opens a *separate* client with the store requests counted
  (:mod:`.roundtrips`), runs ``n`` uncounted then ``c`` counted cycles, closes it and
  replies ``requests`` (by name), ``transports`` and ``cycles``; the timed client of
  ``prepare`` is never a counted one;
* ``{"op": "close"}``, ``{"op": "exit"}``.

Every reply has ``ok``; a failure replies ``ok: false`` with the error instead of dying.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from .aiocycler import AsyncCycler
from .raw import Cycler, raw_cycler
from .roundtrips import counting
from .windows import Windows

__all__ = ["OursCycler", "serve"]


class OursCycler:
    """``session.claim(job)`` then ``lease.complete()``: one claim+complete cycle."""

    def __init__(self, url: str, ttl_s: float = 10.0, owner: str = "bench") -> None:
        self.url, self.ttl_s, self.owner = url, ttl_s, owner
        self._store: Any = None
        self._session: Any = None

    def open(self) -> None:
        from ..store import open_store

        self._store = open_store(self.url)
        self._session = self._store.session(self.owner, self.ttl_s)

    def cycle(self, job_id: str) -> None:
        lease = self._session.claim(job_id)
        if lease is None:
            raise RuntimeError(f"{job_id!r} was not claimable: the workload is not uncontended")
        lease.complete(b"")

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        if self._store is not None:
            self._store.close()
            self._store = None


def make_cycler(request: dict[str, Any]) -> Cycler:
    if request["kind"] == "ours":
        return OursCycler(str(request["url"]), float(request.get("ttl_s", 10.0)),
                          owner=str(request.get("owner", "bench")))
    if request["kind"] == "async":
        return AsyncCycler(str(request["url"]), float(request.get("ttl_s", 10.0)),
                           str(request.get("owner", "bench")), int(request["tasks"]))
    return raw_cycler(request["raw"])


def run_request(cycler: Cycler, prefix: str, request: dict[str, Any]) -> dict[str, Any]:
    """Answer a ``run`` request: many tasks for an :class:`AsyncCycler`, else one loop."""
    windows = Windows(float(request["start_at"]), float(request["warmup_s"]),
                      int(request["windows"]), float(request["window_s"]))
    max_cycles = int(request["max_cycles"])
    if isinstance(cycler, AsyncCycler):
        return cycler.run(prefix, float(request["start_at"]), windows, max_cycles)
    return run_cycles(cycler, prefix, float(request["start_at"]), windows, max_cycles)


def run_cycles(cycler: Cycler, prefix: str, start_at: float, windows: Windows,
               max_cycles: int) -> dict[str, Any]:
    """Cycle from ``start_at`` until ``windows`` ends (or ``max_cycles``)."""
    delay = start_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    for i in range(max_cycles):
        cycler.cycle(f"{prefix}-{i}")
        if not windows.record(time.monotonic()):
            break
    return windows.as_dict()


def count_requests(request: dict[str, Any]) -> dict[str, Any]:
    """Answer a ``count`` request (see the module docstring)."""
    prefix = str(request["prefix"])
    with counting(request["transports"]) as count:
        cycler = make_cycler(request)
        cycler.open()
        try:
            for i in range(int(request.get("warmup", 0))):
                cycler.cycle(f"{prefix}-warm-{i}")
            count.reset()
            cycles = int(request["cycles"])
            for i in range(cycles):
                cycler.cycle(f"{prefix}-{i}")
            requests = count.snapshot()
        finally:
            cycler.close()
    return {"requests": requests, "transports": sorted(count.transports), "cycles": cycles}


def serve(conn: Any, index: int) -> None:
    """Entry point of a spawned worker: answer requests on ``conn`` until ``exit``."""
    cycler: Cycler | None = None
    prefix = f"w{index}"
    while True:
        try:
            request: dict[str, Any] = conn.recv()
        except EOFError:
            break
        op = request.get("op")
        reply: dict[str, Any] = {"ok": True, "worker": index}
        try:
            if op == "prepare":
                if cycler is not None:
                    cycler.close()
                cycler = make_cycler(request)
                cycler.open()
                prefix = str(request["prefix"])
                for i in range(int(request.get("warmup", 0))):
                    cycler.cycle(f"{prefix}-warm-{i}")
            elif op == "run":
                assert cycler is not None, "prepare first"
                reply.update(run_request(cycler, prefix, request))
            elif op == "count":
                reply.update(count_requests(request))
            elif op == "close":
                if cycler is not None:
                    cycler.close()
                    cycler = None
            elif op == "exit":
                conn.send(reply)
                break
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:  # report, do not die: the parent decides
            reply = {"ok": False, "worker": index, "error": f"{type(exc).__name__}: {exc}"}
        conn.send(reply)
    if cycler is not None:
        # Exiting anyway; the store's TTL ends what close could not.
        with contextlib.suppress(Exception):
            cycler.close()
