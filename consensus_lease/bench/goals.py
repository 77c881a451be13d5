"""The goals the issue set, evaluated against one run's results.

Goals are targets to report against, not assertions: a miss is reported with what was
measured. Every goal compares figures from the same run on the same store.

==========  ==========================================================================
workload    goal
==========  ==========================================================================
W1          claim+complete cycles/s >= 0.9 x the raw client's two operations
W3          renewal requests/s at the largest number of held jobs <= 1.1 x at 10;
            client memory <= 2 KiB per held lease
W4          p99 takeover after SIGKILL <= TTL + 0.6 s (etcd, PostgreSQL), <= session timeout +
            tick + 0.2 s (ZooKeeper); p99 graceful handover <= 20 ms
W5          claim_many of 128 >= 10 x faster than 128 single claims
W6          >= 1.0 x kazoo Lock and pyetcd Lock, >= 1.5 x tooz
W8          one process with 200 asyncio tasks >= 0.8 x the cycles/s of 8 sync worker
            processes (etcd, ZooKeeper)
==========  ==========================================================================
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Goal", "evaluate"]

PASS, MISS, NA, NOT_RUN = "pass", "miss", "n/a", "not run"

W1_MIN_RATIO = 0.9
W3_MAX_GROWTH = 1.1
W3_MAX_BYTES = 2048.0
W4_ETCD_SLACK_S = 0.6
W4_ZK_SLACK_S = 0.2
W4_GRACEFUL_MAX_MS = 20.0
W5_MIN_SPEEDUP = 10.0
W6_MIN = {"kazoo Lock": 1.0, "pyetcd Lock": 1.0}
W6_TOOZ_MIN = 1.5
W8_MIN_RATIO = 0.8
W8_BACKENDS = ("etcd", "zookeeper")


@dataclass(frozen=True)
class Goal:
    backend: str
    workload: str
    goal: str
    target: str
    measured: str
    status: str
    note: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _status(ok: bool) -> str:
    return PASS if ok else MISS


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


class _Rows:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.rows: list[Goal] = []

    def add(self, workload: str, goal: str, target: str, measured: str, status: str,
            note: str = "") -> None:
        self.rows.append(Goal(self.backend, workload, goal, target, measured, status, note))

    def not_run(self, workload: str, goal: str, target: str, why: str) -> None:
        self.add(workload, goal, target, "-", NOT_RUN, why)


def _w1(rows: _Rows, data: dict[str, Any]) -> None:
    for workers, row in data["workers"].items():
        ratio = row["ratio"]
        noun = "worker" if workers == "1" else "workers"
        rows.add("W1", f"cycle throughput vs raw client, {workers} {noun}",
                 f">= {W1_MIN_RATIO:.2f}x", f"{ratio:.2f}x "
                 f"({row['ours_cycles_per_s']:.0f} vs {row['raw_cycles_per_s']:.0f}/s)",
                 _status(ratio >= W1_MIN_RATIO))


def _w3(rows: _Rows, data: dict[str, Any]) -> None:
    growth = data["renewal_growth"]
    last = data["rows"][-1]
    rows.add("W3", f"renewal requests/s at {data['largest']:,} held vs {data['smallest']:,}",
             f"<= {W3_MAX_GROWTH:.1f}x",
             f"{growth:.2f}x ({last['renewal_requests_per_s']:.2f}/s vs "
             f"{data['rows'][0]['renewal_requests_per_s']:.2f}/s)",
             _status(growth <= W3_MAX_GROWTH))
    per = last["bytes_per_lease"]
    rows.add("W3", f"client memory per held lease (at {data['largest']:,})",
             f"<= {W3_MAX_BYTES / 1024:.0f} KiB", f"{per:,.0f} B", _status(per <= W3_MAX_BYTES),
             "Python heap (tracemalloc)")


def _w4(rows: _Rows, data: dict[str, Any]) -> None:
    p99 = data["kill_s"]["p99"]
    ttl = data["granted_ttl_s"]
    measured = f"p99 {p99:.2f} s (median {data['kill_s']['p50']:.2f} s)"
    name = f"takeover after SIGKILL (TTL {ttl:g} s, {data['trials']} trials)"
    if rows.backend in ("etcd", "postgresql"):
        limit = ttl + W4_ETCD_SLACK_S
        rows.add("W4", name, f"<= TTL + {W4_ETCD_SLACK_S} = {limit:.2f} s", measured,
                 _status(p99 <= limit))
    elif rows.backend == "zookeeper":
        tick = data.get("tick_s")
        if isinstance(tick, (int, float)) and _finite(tick):
            limit = ttl + float(tick) + W4_ZK_SLACK_S
            rows.add("W4", name, f"<= timeout + tick + {W4_ZK_SLACK_S} = {limit:.2f} s",
                     measured, _status(p99 <= limit))
        else:
            rows.add("W4", name, "<= timeout + tick + 0.2 s", measured, NA,
                     "the server's tickTime is unknown (pass --zk-tick-ms)")
    else:
        rows.add("W4", name, "(none set)", measured, NA, "no goal set for this backend")
    graceful = data["graceful_ms"]["p99"]
    rows.add("W4", "graceful handover (release -> next claim)",
             f"p99 <= {W4_GRACEFUL_MAX_MS:.0f} ms",
             f"p99 {graceful:.1f} ms (median {data['graceful_ms']['p50']:.1f} ms)",
             _status(graceful <= W4_GRACEFUL_MAX_MS))


def _w5(rows: _Rows, data: dict[str, Any]) -> None:
    name = f"claim_many of {data['batch']} vs single claims"
    target = f">= {W5_MIN_SPEEDUP:.0f}x"
    if not data["supported"]:
        rows.add("W5", name, target, "not supported", NA,
                 "max_batch_claim = 1: one request per job")
        return
    speedup = data["speedup"]
    rows.add("W5", name, target,
             f"{speedup:.1f}x ({data['store_requests_per_batch']} requests per batch)",
             _status(speedup >= W5_MIN_SPEEDUP))


def _w6(rows: _Rows, data: dict[str, Any]) -> None:
    for peer in data.get("peers", [])[1:]:
        minimum = W6_TOOZ_MIN if peer["library"] == "tooz" else W6_MIN.get(peer["name"], 1.0)
        name = f"cycles/s vs {peer['name']}"
        if peer["error"] or not _finite(peer["ours_over_peer"]):
            rows.not_run("W6", name, f">= {minimum:.1f}x",
                         f"{peer['name']} failed: {peer['error']}")
            continue
        ratio = peer["ours_over_peer"]
        rows.add("W6", name, f">= {minimum:.1f}x",
                 f"{ratio:.2f}x ({peer['cycles_per_s']:.0f}/s for the peer)",
                 _status(ratio >= minimum), "the peer has no fencing token")


def _w8(rows: _Rows, data: dict[str, Any]) -> None:
    ratio = data["ratio"]
    name = f"{data['tasks']} asyncio tasks in 1 process vs {data['processes']} processes"
    measured = (f"{ratio:.2f}x ({data['async_cycles_per_s']:.0f} vs "
                f"{data['processes_cycles_per_s']:.0f}/s)")
    if rows.backend in W8_BACKENDS:
        rows.add("W8", name, f">= {W8_MIN_RATIO:.1f}x", measured,
                 _status(ratio >= W8_MIN_RATIO))
    else:
        rows.add("W8", name, "(none set)", measured, NA, "no goal set for this backend")


_CHECKS = {
    "w1_throughput": ("W1", "cycle throughput vs raw client", _w1),
    "w3_keepalive": ("W3", "renewal traffic and memory with held jobs", _w3),
    "w4_takeover": ("W4", "takeover and handover", _w4),
    "w5_batch": ("W5", "batch claim", _w5),
    "w6_peers": ("W6", "cycles/s vs peer lock libraries", _w6),
    "w8_async": ("W8", "asyncio tasks vs worker processes", _w8),
}


def evaluate(results: dict[str, Any]) -> list[Goal]:
    """Every goal row of every backend in ``results`` (see :mod:`.runner` for its shape)."""
    goals: list[Goal] = []
    for backend, entry in results["backends"].items():
        rows = _Rows(backend)
        if not entry["available"]:
            rows.not_run("all", "every workload", "-", str(entry["reason"]))
            goals.extend(rows.rows)
            continue
        for key, (workload, label, check) in _CHECKS.items():
            data = entry["workloads"].get(key)
            if data is None:
                continue
            if data.get("status") != "ok":
                rows.not_run(workload, label, "-", f"error: {data.get('error')}")
                continue
            if key == "w6_peers" and not data.get("peers"):
                continue
            check(rows, data)
        goals.extend(rows.rows)
    return goals
