"""The goals the issue set, evaluated against one run's results.

Goals are targets to report against, not assertions: a miss is reported with what was
measured. Every goal compares figures from the same run on the same store. Throughput
figures (W1, W6, W8) are medians of measured windows and are shown with the windows'
interquartile range ``[p25-p75]`` (min and max are in ``results.json``); W10's are
medians of its rounds, its ratios shown with the interquartile range of the rounds'
ratios (round k of one side over round k of the other). A ratio whose interquartile
range straddles its target is noted as within the noise (its status still follows the
median).

==========  ==========================================================================
workload    goal
==========  ==========================================================================
W3          renewal requests/s at the largest number of held jobs <= 1.1 x at 10;
            client memory <= 2 KiB per held lease
W4          p99 takeover after SIGKILL <= TTL + 0.6 s (etcd, PostgreSQL), <= session timeout +
            tick + 0.2 s (ZooKeeper); p99 graceful handover <= 20 ms
W5          claim_many of 128 >= 10 x faster than 128 single claims
W6          >= 1.2 x kazoo Lock, >= 1.5 x pyetcd Lock; the raw client's two-request cycle
            is shown as the ceiling
W7          claim_next+complete p50 at the largest depth <= 1.5 x at the smallest (1k);
            queue_stats p50 <= 50 ms at 100k open jobs (at the largest depth up to 100k
            in a run without 100k); enqueue_many >= 10 x single enqueue jobs/s (etcd,
            ZooKeeper)
W8          one process with 200 asyncio tasks >= 0.8 x the cycles/s of 8 sync worker
            processes (etcd, ZooKeeper)
W10         PostgreSQL: the runner's throughput setting (1 worker) >= 1.0 x pgqueuer
            (batch_size=100, 2 processes), aiming at 1.5 x; ours with 1 worker and no
            knobs (sequential) >= 2 x pgqueuer with batch_size=1 (1 process). Every store
            with a raw loop: the throughput setting >= 2 x the raw client's two-request
            loop, both 1 worker. Every store: idle wake-up p99 <= 20 ms (ours, 1 worker)
==========  ==========================================================================

W1 (claim+complete against the raw client) and W6 against tooz have no goal: the issue
before showed them at or above the raw client's own ceiling. They stay on the page as
figures, with their costs per cycle (client CPU and store requests, W1's table) and the
raw client's ceiling over each peer (W6's table).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Goal", "evaluate", "span"]

PASS, MISS, NA, NOT_RUN = "pass", "miss", "n/a", "not run"

W3_MAX_GROWTH = 1.1
W3_MAX_BYTES = 2048.0
W4_ETCD_SLACK_S = 0.6
W4_ZK_SLACK_S = 0.2
W4_GRACEFUL_MAX_MS = 20.0
W4_FEW_TRIALS = 10
"""Below this many trials a p99 is noted as inconclusive (quick and smoke runs)."""
W5_MIN_SPEEDUP = 10.0
W6_MIN = {"kazoo Lock": 1.2, "pyetcd Lock": 1.5}
W7_MAX_GROWTH = 1.5
W7_STATS_DEPTH = 100_000
W7_STATS_MAX_MS = 50.0
W7_MIN_BATCH_SPEEDUP = 10.0
W7_BATCH_BACKENDS = ("etcd", "zookeeper")
W8_MIN_RATIO = 0.8
W8_BACKENDS = ("etcd", "zookeeper")
W10_OVER_PGQUEUER = 1.0
W10_OVER_PGQUEUER_AIM = 1.5
W10_SEQUENTIAL_OVER_PGQUEUER = 2.0
W10_OVER_RAW = 2.0
W10_WAKE_P99_MAX_MS = 20.0
W10_FEW_WAKE_SAMPLES = 20
"""Below this many wake-up samples a p99 is noted as inconclusive (smoke runs)."""
W10_PGQ_BATCH = 100
"""pgqueuer's ``batch_size`` of a W10 side that records none (:data:`.drainpeers.PGQ_BATCH`:
results written before the sides recorded it)."""


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


def _noise(sp: Any, minimum: float, ratios: str = "window ratios") -> str:
    return (f"the middle half of the {ratios} straddles the target: within the noise"
            if _straddles(sp, minimum) else "")


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
        if peer["library"] in ("raw", "tooz"):
            continue  # the ceiling, shown next to each goal; tooz: a figure (W6's table)
        minimum = W6_MIN.get(peer["name"], 1.0)
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


def _side(data: dict[str, Any], kind: str, processes: int, *, knobs: bool = False,
          batch_size: int | None = None) -> dict[str, Any] | None:
    """The W10 side of ``kind`` run in ``processes`` processes, with the runner's knobs
    or without, and (pgqueuer) at ``batch_size``; ``None`` when the run has none."""
    sides: list[dict[str, Any]] = data.get("sides") or []
    for side in sides:
        if side.get("side") != kind or int(side.get("processes", 1)) != processes:
            continue
        if kind == "ours" and bool(side.get("knobs")) != knobs:
            continue
        if batch_size is not None and side.get("batch_size", W10_PGQ_BATCH) != batch_size:
            continue
        return side
    return None


def _jobs_s(side: dict[str, Any]) -> float:
    value: Any = ((side.get("summary") or {}).get("jobs_s") or {}).get("median")
    return float(value) if _finite(value) else math.nan


def _round_ratios(ours: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """The spread of round k of ``ours`` over round k of ``other`` (same round)."""
    from .windows import spread

    pairs = zip(ours.get("rounds") or [], other.get("rounds") or [], strict=False)
    return spread([a["jobs_s"] / b["jobs_s"] for a, b in pairs
                   if _finite(a.get("jobs_s")) and _finite(b.get("jobs_s")) and b["jobs_s"]])


_Named = tuple[str, dict[str, Any] | None]


def _w10_ratio(rows: _Rows, name: str, minimum: float, mine_named: _Named,
               other_named: _Named, note: str = "", why: str = "") -> None:
    """A W10 goal ``ours / other >= minimum`` of the sides' median jobs/s; each side
    named ``(label, side)`` (``side`` ``None``: not in this run, because ``why``)."""
    target = f">= {minimum:.2f}x"
    ours, other = mine_named[1], other_named[1]
    if ours is None or other is None:
        gone = [label for label, side in (mine_named, other_named) if side is None]
        rows.not_run("W10", name, target, why or f"not in this run: {'; '.join(gone)}")
        return
    mine, theirs = _jobs_s(ours), _jobs_s(other)
    if not _finite(mine) or not _finite(theirs) or not theirs:
        rows.add("W10", name, target, "-", NA, "a side has no jobs/s")
        return
    ratio, sp = mine / theirs, _round_ratios(ours, other)
    wrong = [s["name"] for s in (ours, other)
             if not (s.get("summary") or {}).get("exactly_once", True)]
    notes = [note, _noise(sp, minimum, "rounds' ratios"),
             f"not every job done exactly once by: {', '.join(wrong)}" if wrong else ""]
    rows.add("W10", name, target,
             f"{ratio:.2f}x{span(sp, '.2f')} ({mine:,.0f} vs {theirs:,.0f} jobs/s)",
             _status(ratio >= minimum), "; ".join(filter(None, notes)))


def _knobs(side: dict[str, Any] | None) -> str:
    knobs = (side or {}).get("knobs") or {}
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "knobs"


def _w10_pgqueuer(rows: _Rows, data: dict[str, Any]) -> None:
    why = "" if (data.get("peers") or {}).get("pgqueuer") else "pgqueuer is not installed"
    fast = _side(data, "ours", 1, knobs=True)
    two = _side(data, "ours", 2, knobs=True)
    pgq = _side(data, "pgqueuer", 2, batch_size=W10_PGQ_BATCH)
    note = ""
    if fast is not None and pgq is not None and _jobs_s(pgq):
        ratio = _jobs_s(fast) / _jobs_s(pgq)
        also = ("" if two is None else f"; with 2 processes (sharing the cores with the "
                f"server) {_jobs_s(two) / _jobs_s(pgq):.2f}x")
        note = (f"ours: the runner's throughput setting ({_knobs(fast)}) with 1 worker, as "
                f"docs/worker.md gives it{also}; aim {W10_OVER_PGQUEUER_AIM:.1f}x: "
                f"{'reached' if ratio >= W10_OVER_PGQUEUER_AIM else 'not yet'}")
    _w10_ratio(rows, f"throughput setting, 1 worker, vs pgqueuer batch_size={W10_PGQ_BATCH}"
               ", 2 processes", W10_OVER_PGQUEUER, ("ours, 1 worker, throughput setting", fast),
               (f"pgqueuer, 2 processes, batch_size={W10_PGQ_BATCH}", pgq), note, why)
    _w10_ratio(rows, "1 worker, no knobs (sequential), vs pgqueuer batch_size=1, 1 process",
               W10_SEQUENTIAL_OVER_PGQUEUER, ("ours, 1 worker", _side(data, "ours", 1)),
               ("pgqueuer, 1 process, batch_size=1",
                _side(data, "pgqueuer", 1, batch_size=1)),
               "one job per claim and per dequeue on both sides", why)


def _w10_wake(rows: _Rows, data: dict[str, Any]) -> None:
    name, target = "idle wake-up, ours 1 worker", f"p99 <= {W10_WAKE_P99_MAX_MS:.0f} ms"
    side = _side(data, "ours", 1)
    wake = (side or {}).get("wake")
    if not isinstance(wake, dict) or not _finite(wake.get("p99_ms")):
        rows.not_run("W10", name, target, "no wake-up measured")
        return
    p99, samples = float(wake["p99_ms"]), int(wake.get("samples") or 0)
    few = (f"a p99 of {samples} samples is about their slowest one: too few to tell a "
           f"miss from one slow wake-up" if samples < W10_FEW_WAKE_SAMPLES else "")
    rows.add("W10", name, target,
             f"p99 {p99:.1f} ms (median {float(wake.get('p50_ms') or math.nan):.1f} ms, "
             f"{samples} samples)", _status(p99 <= W10_WAKE_P99_MAX_MS), few)


def _w10(rows: _Rows, data: dict[str, Any]) -> None:
    if rows.backend == "postgresql":
        _w10_pgqueuer(rows, data)
    name = "throughput setting vs the raw client's two-request loop, 1 worker"
    if data.get("raw_loop", True):
        fast = _side(data, "ours", 1, knobs=True)
        _w10_ratio(rows, name, W10_OVER_RAW, ("ours, 1 worker, throughput setting", fast),
                   ("raw client, 1 worker", _side(data, f"raw-{rows.backend}", 1)),
                   f"ours: {_knobs(fast)}; same worker count")
    else:
        rows.add("W10", name, f">= {W10_OVER_RAW:.2f}x", "-", NA,
                 "no raw two-request drain loop for this store")
    _w10_wake(rows, data)


_CHECKS = {
    "w3_keepalive": ("W3", "renewal traffic and memory with held jobs", _w3),
    "w4_takeover": ("W4", "takeover and handover", _w4),
    "w5_batch": ("W5", "batch claim", _w5),
    "w6_peers": ("W6", "cycles/s vs peer lock libraries", _w6),
    "w7_depth": ("W7", "deep queue", _w7),
    "w8_async": ("W8", "asyncio tasks vs worker processes", _w8),
    "w10_drain": ("W10", "queue drain", _w10),
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
