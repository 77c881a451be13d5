"""The goals the issue set, evaluated against one run's results.

Goals are targets to report against, not assertions: a miss is reported with what was
measured. Every goal compares figures from the same run on the same store. Throughput
figures (W1, W6, W8) are medians of measured windows and are shown with the windows'
interquartile range ``[p25-p75]`` (min and max are in ``results.json``); a ratio whose
interquartile range straddles its target is noted as within the noise (its status
still follows the median).

==========  ==========================================================================
workload    goal
==========  ==========================================================================
W1          claim+complete cycles/s >= 0.9 x the raw client's two operations
W3          renewal requests/s at the largest number of held jobs <= 1.1 x at 10;
            client memory <= 2 KiB per held lease
W4          p99 takeover after SIGKILL <= TTL + 0.6 s (etcd, PostgreSQL), <= session timeout +
            tick + 0.2 s (ZooKeeper); p99 graceful handover <= 20 ms
W5          claim_many of 128 >= 10 x faster than 128 single claims
W6          >= 1.2 x kazoo Lock, >= 1.5 x pyetcd Lock, >= 1.5 x tooz (2.5 x on etcd); the
            raw client's two-request cycle is shown as the ceiling
W7          claim_next+complete p50 at the largest depth <= 1.5 x at the smallest (1k);
            queue_stats p50 <= 50 ms at 100k open jobs (at the largest depth up to 100k
            in a run without 100k); enqueue_many >= 10 x single enqueue jobs/s (etcd,
            ZooKeeper)
W8          one process with 200 asyncio tasks >= 0.8 x the cycles/s of 8 sync worker
            processes (etcd, ZooKeeper)
==========  ==========================================================================
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Goal", "cost_note", "evaluate", "span"]

PASS, MISS, NA, NOT_RUN = "pass", "miss", "n/a", "not run"

W1_MIN_RATIO = 0.9
W3_MAX_GROWTH = 1.1
W3_MAX_BYTES = 2048.0
W4_ETCD_SLACK_S = 0.6
W4_ZK_SLACK_S = 0.2
W4_GRACEFUL_MAX_MS = 20.0
W4_FEW_TRIALS = 10
"""Below this many trials a p99 is noted as inconclusive (quick and smoke runs)."""
W5_MIN_SPEEDUP = 10.0
W6_MIN = {"kazoo Lock": 1.2, "pyetcd Lock": 1.5}
W6_TOOZ_MIN = {"zookeeper": 1.5, "etcd": 2.5}
W7_MAX_GROWTH = 1.5
W7_STATS_DEPTH = 100_000
W7_STATS_MAX_MS = 50.0
W7_MIN_BATCH_SPEEDUP = 10.0
W7_BATCH_BACKENDS = ("etcd", "zookeeper")
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


def span(sp: Any, spec: str = ".0f") -> str:
    """``" [p25-p75]"`` (the interquartile range of the windows) of a
    :func:`~.windows.spread`, or ``""`` when there is none."""
    if not isinstance(sp, dict) or not _finite(sp.get("p25")) or not _finite(sp.get("p75")):
        return ""
    return f" [{sp['p25']:{spec}}-{sp['p75']:{spec}}]"


def _straddles(sp: Any, minimum: float) -> bool:
    return (isinstance(sp, dict) and _finite(sp.get("p25")) and _finite(sp.get("p75"))
            and sp["p25"] < minimum <= sp["p75"])


def _noise(sp: Any, minimum: float) -> str:
    return ("the middle half of the window ratios straddles the target: within the noise"
            if _straddles(sp, minimum) else "")


def cost_note(data: dict[str, Any], row: dict[str, Any]) -> str:
    """``"ours 1.30 ms CPU / 3.0 requests per cycle vs raw 0.90 ms / 2.0"``."""
    requests = data.get("requests") or {}
    ours, raw = requests.get("ours") or {}, requests.get("raw") or {}
    unit = ours.get("unit") or raw.get("unit") or "requests"

    def per(side: dict[str, Any]) -> str:
        value = side.get("per_cycle")
        return f"{value:.1f}" if _finite(value) else "?"

    cpu_ours, cpu_raw = row.get("ours_cpu_ms_per_cycle"), row.get("raw_cpu_ms_per_cycle")
    return (f"ours {cpu_ours if _finite(cpu_ours) else math.nan:.2f} ms CPU / {per(ours)} "
            f"{unit} per cycle vs raw {cpu_raw if _finite(cpu_raw) else math.nan:.2f} ms / "
            f"{per(raw)}")


def _w1(rows: _Rows, data: dict[str, Any]) -> None:
    for workers, row in data["workers"].items():
        ratio = row["ratio"]
        noun = "worker" if workers == "1" else "workers"
        sp = row.get("ratio_spread")
        note = "; ".join(filter(None, [cost_note(data, row), _noise(sp, W1_MIN_RATIO)]))
        rows.add("W1", f"cycle throughput vs raw client, {workers} {noun}",
                 f">= {W1_MIN_RATIO:.2f}x", f"{ratio:.2f}x{span(sp, '.2f')} "
                 f"({row['ours_cycles_per_s']:.0f}{span(row.get('ours_spread'))} vs "
                 f"{row['raw_cycles_per_s']:.0f}{span(row.get('raw_spread'))}/s)",
                 _status(ratio >= W1_MIN_RATIO), note)


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
    trials = int(data["trials"])
    few = (f"a p99 of {trials} trials is their slowest one: too few to tell a miss from "
           f"one slow trial (a full run makes 20)" if trials < W4_FEW_TRIALS else "")
    rows.add("W4", "graceful handover (release -> next claim)",
             f"p99 <= {W4_GRACEFUL_MAX_MS:.0f} ms",
             f"p99 {graceful:.1f} ms (median {data['graceful_ms']['p50']:.1f} ms)",
             _status(graceful <= W4_GRACEFUL_MAX_MS), few)


def _w5(rows: _Rows, data: dict[str, Any]) -> None:
    name = f"claim_many of {data['batch']} vs single claims"
    target = f">= {W5_MIN_SPEEDUP:.0f}x"
    if not data["supported"]:
        rows.add("W5", name, target, "not supported", NA,
                 "max_batch_claim = 1: one request per job")
        return
    speedup = data["speedup"]
    sp = data.get("speedup_spread")
    rounds = f", {data['rounds']} rounds" if "rounds" in data else ""
    requests = data["store_requests_per_batch"]
    rows.add("W5", name, target,
             f"{speedup:.1f}x{span(sp, '.1f')} ({requests} store "
             f"request{'' if requests == 1 else 's'} per batch{rounds})",
             _status(speedup >= W5_MIN_SPEEDUP),
             "the middle half of the rounds' speedups straddles the target: within the noise"
             if _straddles(sp, W5_MIN_SPEEDUP) else "")


def _ceiling(peers: list[dict[str, Any]], peer: dict[str, Any]) -> str:
    """How far ahead of ``peer`` the raw client's two-request cycle is (the most any
    two-request lock on that client can be), when measured."""
    floor = next((p for p in peers if p["library"] == "raw"), None)
    if floor is None or floor["error"] or not _finite(floor["cycles_per_s"]):
        return ""
    if not _finite(peer["cycles_per_s"]) or not peer["cycles_per_s"]:
        return ""
    return (f"ceiling: the raw client's 2-request cycle is "
            f"{floor['cycles_per_s'] / peer['cycles_per_s']:.2f}x this peer")


def _w6(rows: _Rows, data: dict[str, Any]) -> None:
    peers = data.get("peers", [])
    for peer in peers[1:]:
        if peer["library"] == "raw":
            continue  # the ceiling, shown next to each goal
        minimum = (W6_TOOZ_MIN.get(rows.backend, 1.5) if peer["library"] == "tooz"
                   else W6_MIN.get(peer["name"], 1.0))
        name = f"cycles/s vs {peer['name']}"
        if peer["error"] or not _finite(peer["ours_over_peer"]):
            rows.not_run("W6", name, f">= {minimum:.1f}x",
                         f"{peer['name']} failed: {peer['error']}")
            continue
        ratio = peer["ours_over_peer"]
        sp = peer.get("ratio_spread")
        note = "; ".join(filter(None, ["the peer has no fencing token", _noise(sp, minimum),
                                       _ceiling(peers, peer)]))
        rows.add("W6", name, f">= {minimum:.1f}x",
                 f"{ratio:.2f}x{span(sp, '.2f')} ({peer['cycles_per_s']:.0f}"
                 f"{span(peer.get('spread'))}/s for the peer)",
                 _status(ratio >= minimum), note)


def _w7_note(data: dict[str, Any]) -> str:
    skipped = [r for r in data["rows"] if "skipped" in r]
    return f"{skipped[0]['depth']:,} not measured: {skipped[0]['skipped']}" if skipped else ""


def _w7_cycle(rows: _Rows, data: dict[str, Any], measured: list[dict[str, Any]],
              failed: dict[str, Any] | None) -> None:
    deepest = failed or (measured[-1] if measured else data["rows"][-1])
    smallest = measured[0]["depth"] if measured else data["rows"][0]["depth"]
    name = f"claim_next+complete p50 at {deepest['depth']:,} open jobs vs {smallest:,}"
    target = f"<= {W7_MAX_GROWTH:.1f}x"
    growth = float(data.get("p50_growth") or math.nan)
    if failed is not None:  # the store broke down at a depth: missed, not "not run"
        rows.add("W7", name, target, "failed", MISS, _w7_note(data))
    elif len(measured) < 2 or not _finite(growth):
        rows.add("W7", name, target, "-", NA, _w7_note(data) or "one depth measured")
    else:
        first, last = measured[0]["cycle_ms"]["p50"], measured[-1]["cycle_ms"]["p50"]
        rows.add("W7", name, target, f"{growth:.2f}x ({last:.2f} vs {first:.2f} ms)",
                 _status(growth <= W7_MAX_GROWTH), _w7_note(data))


def _w7_stats(rows: _Rows, data: dict[str, Any], measured: list[dict[str, Any]],
              failed: dict[str, Any] | None) -> None:
    target = f"<= {W7_STATS_MAX_MS:.0f} ms at {W7_STATS_DEPTH:,}"
    if failed is not None and failed["depth"] <= W7_STATS_DEPTH:
        rows.add("W7", f"queue_stats p50 at {failed['depth']:,} open jobs", target, "failed",
                 MISS, _w7_note(data))
        return
    upto = [r for r in measured if r["depth"] <= W7_STATS_DEPTH] or measured[:1]
    if not upto:
        rows.not_run("W7", "queue_stats p50", target, _w7_note(data))
        return
    at = upto[-1]
    stats = at["queue_stats_ms"]["p50"]
    rows.add("W7", f"queue_stats p50 at {at['depth']:,} open jobs", target,
             f"{stats:.1f} ms (p99 {at['queue_stats_ms']['p99']:.1f})",
             _status(stats <= W7_STATS_MAX_MS),
             "" if at["depth"] == W7_STATS_DEPTH else
             f"measured at {at['depth']:,}: this run has no {W7_STATS_DEPTH:,}")


def _w7(rows: _Rows, data: dict[str, Any]) -> None:
    measured = [r for r in data["rows"] if "cycle_ms" in r]
    failed = next((r for r in data["rows"] if "failed" in r), None)
    _w7_cycle(rows, data, measured, failed)
    _w7_stats(rows, data, measured, failed)
    rates = data["rates"]
    speedup = rates["speedup"] if _finite(rates["speedup"]) else math.nan
    many = rates["enqueue_many_jobs_per_s"] or math.nan
    single = rates["enqueue_jobs_per_s"] or math.nan
    measured_rate = f"{speedup:.1f}x ({many:,.0f} vs {single:,.0f} jobs/s)"
    batch = f"max_enqueue_batch {rates['max_enqueue_batch']}"
    if rows.backend in W7_BATCH_BACKENDS:
        rows.add("W7", "enqueue_many vs single enqueue", f">= {W7_MIN_BATCH_SPEEDUP:.0f}x",
                 measured_rate,
                 _status(speedup >= W7_MIN_BATCH_SPEEDUP), batch)
    else:
        rows.add("W7", "enqueue_many vs single enqueue", "(none set)", measured_rate, NA,
                 batch)


def _w8(rows: _Rows, data: dict[str, Any]) -> None:
    ratio = data["ratio"]
    name = f"{data['tasks']} asyncio tasks in 1 process vs {data['processes']} processes"
    sp = data.get("ratio_spread")
    measured = (f"{ratio:.2f}x{span(sp, '.2f')} ({data['async_cycles_per_s']:.0f}"
                f"{span(data.get('async_spread'))} vs {data['processes_cycles_per_s']:.0f}"
                f"{span(data.get('processes_spread'))}/s)")
    if rows.backend in W8_BACKENDS:
        rows.add("W8", name, f">= {W8_MIN_RATIO:.1f}x", measured,
                 _status(ratio >= W8_MIN_RATIO), _noise(sp, W8_MIN_RATIO))
    else:
        rows.add("W8", name, "(none set)", measured, NA, "no goal set for this backend")


_CHECKS = {
    "w1_throughput": ("W1", "cycle throughput vs raw client", _w1),
    "w3_keepalive": ("W3", "renewal traffic and memory with held jobs", _w3),
    "w4_takeover": ("W4", "takeover and handover", _w4),
    "w5_batch": ("W5", "batch claim", _w5),
    "w6_peers": ("W6", "cycles/s vs peer lock libraries", _w6),
    "w7_depth": ("W7", "deep queue", _w7),
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
