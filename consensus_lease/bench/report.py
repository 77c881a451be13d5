"""Writing a run's results: ``results.json`` (everything) and ``results.md`` (tables)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .drainreport import section as drain_section
from .goals import Goal, span

__all__ = ["JSON_NAME", "MARKDOWN_NAME", "markdown", "write_json", "write_markdown"]

JSON_NAME = "results.json"
MARKDOWN_NAME = "results.md"
FIGURES_NOTE = (
    "W1 (claim+complete against the raw client) and W6 against tooz are figures, not "
    "goals: the issue before showed them at or above the raw client's own ceiling. Their "
    "costs are in their sections: client CPU and store requests per cycle, ours and "
    "raw (W1), and the raw client's cycles/s over each peer's (W6).")
"""Under the goals table: where W1 and the W6 tooz ratios went."""


def _clean(value: Any) -> Any:
    """JSON has no NaN/Infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(results: dict[str, Any], out: Path) -> Path:
    path = out / JSON_NAME
    path.write_text(json.dumps(_clean(results), indent=2, sort_keys=False) + "\n")
    return path


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return [*lines, ""]


def _f(value: Any, spec: str = ".1f", unit: str = "") -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:{spec}}{unit}"
    return "-"


def _ok_workloads(results: dict[str, Any], key: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for backend, entry in results["backends"].items():
        data = entry.get("workloads", {}).get(key)
        if data is not None and data.get("status") == "ok":
            found.append((backend, data))
    return found


def _errors(results: dict[str, Any], key: str) -> list[str]:
    lines = []
    for backend, entry in results["backends"].items():
        data = entry.get("workloads", {}).get(key)
        if data is not None and data.get("status") != "ok":
            lines.append(f"*{backend}: not measured — {data.get('error')}*")
    return [*lines, ""] if lines else []


def _per_cycle(side: Any) -> str:
    if not isinstance(side, dict):
        return "-"
    if side.get("error"):
        return "not counted"
    return _f(side.get("per_cycle"), ".1f")


def _w1(results: dict[str, Any]) -> list[str]:
    rows, counted = [], []
    for backend, data in _ok_workloads(results, "w1_throughput"):
        requests = data.get("requests") or {}
        for workers, row in data["workers"].items():
            rows.append([backend, workers,
                         _f(row["ours_cycles_per_s"], ".0f") + span(row.get("ours_spread")),
                         _f(row["raw_cycles_per_s"], ".0f") + span(row.get("raw_spread")),
                         _f(row["ratio"], ".2f", "x") + span(row.get("ratio_spread"), ".2f"),
                         ", ".join(f"{r:.2f}" for r in row["ratios"]),
                         _f(row["ours_cpu_ms_per_cycle"], ".2f"),
                         _f(row["raw_cpu_ms_per_cycle"], ".2f"),
                         _per_cycle(requests.get("ours")), _per_cycle(requests.get("raw"))])
        for kind in ("ours", "raw"):
            side = requests.get(kind)
            if not isinstance(side, dict):
                continue
            detail = side.get("error") or ", ".join(
                f"{name} {n:.2f}" for name, n in side.get("by_name", {}).items())
            counted.append([backend, kind, side.get("unit", ""), _per_cycle(side), detail])
    return _table(["backend", "workers", "ours cycles/s [windows IQR]",
                   "raw client cycles/s [IQR]", "ratio [window ratios IQR]",
                   "per-repeat ratios", "ours client CPU ms/cycle",
                   "raw client CPU ms/cycle", "ours requests/cycle", "raw requests/cycle"],
                  rows) + _errors(results, "w1_throughput") + (
        ["Store requests per claim+complete cycle, counted at the transport (see "
         "above), by request:", "",
         *_table(["backend", "side", "unit", "per cycle", "by request (per cycle)"], counted)]
        if counted else [])


def _w2(results: dict[str, Any]) -> list[str]:
    rows = []
    for backend, data in _ok_workloads(results, "w2_latency"):
        for op in ("claim", "renew", "complete"):
            s = data[f"{op}_ms"]
            rows.append([backend, op, _f(s["p50"], ".2f"), _f(s["p99"], ".2f"),
                         _f(s["mean"], ".2f"), s["n"]])
    return _table(["backend", "operation", "p50 ms", "p99 ms", "mean ms", "samples"], rows) + \
        _errors(results, "w2_latency")


def _w3(results: dict[str, Any]) -> list[str]:
    rows = []
    for backend, data in _ok_workloads(results, "w3_keepalive"):
        for r in data["rows"]:
            rows.append([backend, f"{r['held']:,}", r["claim_mode"],
                         _f(r["claims_per_s"], ".0f"),
                         _f(r["renewal_requests_per_s"], ".2f"),
                         f"{r['keepalive_calls']} + {r['renew_calls']}",
                         _f(r["cpu_ms_per_s"], ".1f"), _f(r["bytes_per_lease"], ",.0f"),
                         _f(r.get("min_headroom_s"), ".2f"),
                         "yes" if r["ok"] else f"NO ({r['held_at_end']} held)"])
    return _table(["backend", "held jobs", "claimed with", "claims/s", "renewal requests/s",
                   "keepalive + renew calls in window", "client CPU ms/s", "bytes per lease",
                   "smallest renewal headroom s", "all held at end"], rows) + \
        _errors(results, "w3_keepalive")


def _w4(results: dict[str, Any]) -> list[str]:
    rows = []
    for backend, data in _ok_workloads(results, "w4_takeover"):
        k, g = data["kill_s"], data["graceful_ms"]
        tick = data.get("tick_s")
        rows.append([backend, _f(data["granted_ttl_s"], "g", " s"),
                     _f(tick, "g", " s") if tick else "-", data["trials"],
                     _f(k["p50"], ".2f"), _f(k["p99"], ".2f"), _f(k["max"], ".2f"),
                     _f(g["p50"], ".1f"), _f(g["p99"], ".1f"),
                     f"{data['stale_writes_rejected']}/{data['trials']}"])
    return _table(["backend", "TTL / session timeout", "tick", "trials",
                   "kill->fenced write p50 s", "p99 s", "max s",
                   "graceful p50 ms", "graceful p99 ms", "stale writes rejected"], rows) + \
        _errors(results, "w4_takeover")


def _discarded(results: dict[str, Any]) -> list[str]:
    lines = []
    for backend, data in _ok_workloads(results, "w4_takeover"):
        for reason in data.get("discarded_trials", []):
            lines.append(f"- {backend}: discarded and re-run: {reason}")
    if not lines:
        return []
    return ["Trials whose holder failed before the measured moment (not counted):", "",
            *lines, ""]


def _w5(results: dict[str, Any]) -> list[str]:
    rows, ranges = [], []
    for backend, data in _ok_workloads(results, "w5_batch"):
        single = _f(data["single_ms"]["p50"], ".1f") + span(data.get("single_spread"), ".1f")
        if data["supported"]:
            rows.append([backend, data["max_batch_claim"], _f(data.get("rounds"), "d"), single,
                         _f(data["batch_ms"]["p50"], ".1f")
                         + span(data.get("batch_spread"), ".2f"),
                         data["store_requests_per_batch"],
                         _f(data["speedup"], ".1f", "x")
                         + span(data.get("speedup_spread"), ".1f")])
        else:
            rows.append([backend, data["max_batch_claim"], _f(data.get("rounds"), "d"), single,
                         "not supported", "-", "-"])
        parts = []
        for key, label, spec, unit in (("single_spread", "single claims", ".1f", " ms"),
                                       ("batch_spread", "claim_many", ".2f", " ms"),
                                       ("speedup_spread", "speedup", ".1f", "x")):
            sp = data.get(key)
            if isinstance(sp, dict):
                parts.append(f"{label} {_min_max(sp, spec)}{unit}")
        if parts:
            ranges.append(f"- {backend}: {', '.join(parts)}")
    lines = _table(["backend", "max_batch_claim", "rounds",
                    f"{_batch(results)} single claims ms (median [IQR])",
                    "claim_many ms (median [IQR])", "store requests per claim_many",
                    "speedup [rounds' IQR]"], rows)
    if ranges:
        lines += ["Least-most over the rounds (a wide range means a busy machine; the "
                  "medians above are the result):", "", *ranges, ""]
    return lines + _errors(results, "w5_batch")


def _min_max(sp: dict[str, Any], spec: str) -> str:
    """``"70.1-229.4"``: the least and the most of a :func:`~.windows.spread`."""
    return f"{_f(sp.get('min'), spec)}-{_f(sp.get('max'), spec)}"


def _batch(results: dict[str, Any]) -> int:
    return int(results["meta"]["sizes"]["w5_batch"])


def _over(floor: Any, peer: dict[str, Any]) -> str:
    """The raw client's cycles/s over ``peer``'s: the most any two-request lock on that
    client can be ahead of it (``-`` for the raw row itself, or unmeasured)."""
    if floor is None or floor is peer or floor.get("error") or peer.get("error"):
        return "-"
    ours, theirs = floor.get("cycles_per_s"), peer.get("cycles_per_s")
    if not isinstance(theirs, (int, float)) or not theirs:
        return "-"
    return _f(ours / theirs if isinstance(ours, (int, float)) else None, ".2f", "x")


def _w6(results: dict[str, Any]) -> list[str]:
    rows = []
    for backend, data in _ok_workloads(results, "w6_peers"):
        peers = data.get("peers", [])
        floor = next((p for p in peers if p["library"] == "raw"), None)
        for peer in peers:
            rows.append([backend, peer["name"], "yes" if peer["fencing"] else "no",
                         _f(peer["cycles_per_s"], ".0f") + span(peer.get("spread")),
                         _f(peer["ours_over_peer"], ".2f", "x")
                         + span(peer.get("ratio_spread"), ".2f"),
                         _over(floor, peer), peer["error"] or ""])
    notes = [f"*{backend}: {data['note']}*" for backend, data in
             _ok_workloads(results, "w6_peers") if data.get("note")]
    return _table(["store", "library", "fencing token",
                   "acquire+release cycles/s [windows IQR]",
                   "ours / this [window ratios IQR]", "raw client / this (the ceiling)",
                   "error"], rows) + \
        _errors(results, "w6_peers") + ([*notes, ""] if notes else [])


def _w8(results: dict[str, Any]) -> list[str]:
    rows = []
    for backend, data in _ok_workloads(results, "w8_async"):
        rows.append([backend, data["tasks"],
                     _f(data["async_cycles_per_s"], ".0f") + span(data.get("async_spread")),
                     data["processes"],
                     _f(data["processes_cycles_per_s"], ".0f")
                     + span(data.get("processes_spread")),
                     _f(data["ratio"], ".2f", "x") + span(data.get("ratio_spread"), ".2f"),
                     ", ".join(f"{r:.2f}" for r in data["ratios"]),
                     _f(data["async_cpu_ms_per_cycle"], ".2f"),
                     _f(data["processes_cpu_ms_per_cycle"], ".2f"), data["async_threads"]])
    return _table(["backend", "asyncio tasks", "asyncio cycles/s [IQR]", "processes",
                   "processes cycles/s [IQR]", "ratio [IQR]", "per-repeat ratios",
                   "asyncio CPU ms/cycle", "processes CPU ms/cycle", "asyncio threads"],
                  rows) + _errors(results, "w8_async")


def _w7(results: dict[str, Any]) -> list[str]:
    rows, rates = [], []
    for backend, data in _ok_workloads(results, "w7_depth"):
        for r in data["rows"]:
            if "skipped" in r:
                rows.append([backend, f"{r['depth']:,}", "-", "-", "-", "-", "-", "-", "-",
                             "-", f"not measured: {r['skipped']}"])
                continue
            c, q = r["cycle_ms"], r["queue_stats_ms"]
            server = r.get("server") or {}
            rows.append([backend, f"{r['depth']:,}", _f(c["p50"], ".2f"), _f(c["p99"], ".2f"),
                         _f(r["claim_next_ms"]["p50"], ".2f"), _f(q["p50"], ".1f"),
                         _f(q["max"], ".1f"), _f(r.get("fill_jobs_per_s"), ",.0f"),
                         _f(server.get("bytes_per_job"), ",.0f"),
                         _f(server.get("znodes_per_job"), ".1f"),
                         f"{c['n']} cycles, {q['n']} stats; queue_stats saw "
                         f"{r['open_jobs_seen']:,} open"])
        rt = data["rates"]
        rates.append([backend, rt["max_enqueue_batch"], _f(rt["enqueue_jobs_per_s"], ",.0f"),
                      f"{rt['enqueue_many_jobs']:,}", _f(rt["enqueue_many_jobs_per_s"], ",.0f"),
                      rt["enqueue_many_requests"], _f(rt["speedup"], ".1f", "x"),
                      data.get("cleanup", "")])
    return _table(["backend", "open jobs", "claim_next+complete p50 ms", "p99 ms",
                   "claim_next p50 ms", "queue_stats p50 ms", "queue_stats max ms",
                   "fill jobs/s (enqueue_many)", "server bytes per open job",
                   "znodes per open job", "samples"], rows) + \
        _table(["backend", "max_enqueue_batch", "enqueue jobs/s", "enqueue_many of",
                "enqueue_many jobs/s", "store requests for it", "speedup", "cleanup"],
               rates) + _errors(results, "w7_depth")


def markdown(results: dict[str, Any], goals: list[Goal], plots: list[str]) -> str:
    meta = results["meta"]
    m = meta["machine"]
    lines = [
        "# consensus_lease benchmark results",
        "",
        f"{'Quick' if meta['quick'] else 'Full'} run of {meta['started_utc']} "
        f"({meta['duration_s']:.0f} s). Reproduce with:",
        "",
        "```sh",
        meta["command"],
        "```",
        "",
        "Every ratio below compares two figures measured in this run on the same store.",
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu']}, {m['cores']} cores; memory {m['memory_gib']} GiB",
        f"- {m['os']}, kernel {m['kernel']}, Python {m['python']}, SQLite {m['sqlite']}",
        f"- load average (1, 5, 15 min) at start {m['load_average_at_start']}, at end "
        f"{meta['load_average_at_end']}: other processes shared these cores",
        "- libraries: " + ", ".join(f"{k} {v}" for k, v in m["libraries"].items() if v),
        "",
        "## Stores",
        "",
    ]
    store_rows = []
    for backend, entry in results["backends"].items():
        if entry["available"]:
            role = entry.get("member_role")
            origin = entry["origin"] + (f" (a {role} at the start)" if role else "")
            store_rows.append([backend, entry.get("server") or "-", origin,
                               f"`{entry['url']}`"])
        else:
            store_rows.append([backend, "-", f"**not measured**: {entry['reason']}", "-"])
    lines += _table(["backend", "server", "where", "our store URL"], store_rows)
    lines += ["## Goals: measured against target", ""]
    lines += _table(["backend", "workload", "goal", "target", "measured", "result", "note"],
                    ([g.backend, g.workload, g.goal, g.target, g.measured,
                      f"**{g.status}**" if g.status == "miss" else g.status, g.note]
                     for g in goals))
    ran = {key for entry in results["backends"].values() for key in entry.get("workloads", {})}
    if ran & {"w1_throughput", "w6_peers"}:
        lines += [FIGURES_NOTE, ""]
    s = meta["sizes"]
    lines += [
        "## W1 — claim+complete cycles/s against the raw client",
        "",
        "Worker processes (spawned) each open their client and run "
        f"{s['w1_warmup']} untimed cycles, then cycle on their own fresh jobs from a "
        f"common start: {s.get('w1_warmup_s', 0)} s of warm-up (not measured), then "
        f"{s.get('w1_windows', 1)} measured windows over {s['w1_duration_s']} s; "
        f"{s['w1_repeats']} alternating ours/raw pair(s). A rate is the median of the "
        "windows' rates, shown with their interquartile range [p25-p75] (min and max "
        "in results.json): a gap wider than the ranges is not noise. The ratio is ours "
        "over raw of those medians; its range is that of window k of ours over window k "
        "of raw in the same pair. Client CPU: "
        "`process_time` of the worker processes (every thread) over the measured cycles. "
        "Requests per cycle: "
        f"{s.get('w1_count_cycles', 0)} cycles of each side on a client of their own, "
        "counted at the transport (etcd: gRPC calls and stream messages, by an "
        "interceptor; ZooKeeper: requests kazoo writes to the socket, pings left out, a "
        "multi counts once; SQLite: statements started, BEGIN and COMMIT included; "
        "PostgreSQL: statements psycopg executes). Raw "
        "client: the same two store operations (sqlite3: two write transactions; pyetcd: "
        "a compare-create txn, then a compare-delete+put txn; kazoo: two multis; psycopg: "
        "two autocommit statements).",
        "",
        *_w1(results),
        "## W2 — latency of one operation (one in-process worker)",
        "",
        "`lease.renew()` compares owner and generation in the store and extends the "
        "session (etcd: a read-only compare txn plus a keepalive).",
        "",
        *_w2(results),
        "## W3 — one worker holding many jobs",
        "",
        f"Session TTL {s['w3_ttl_s']} s (keepalive every TTL/3); an idle window of "
        f"{s['w3_window_s']} s after claiming. Renewal requests = calls of the backend's "
        "`keepalive` and `renew` (wrapped on the instance), per second from their spacing. "
        "Client CPU: the whole bench process while idle (keepalive, client library threads, "
        "progress bar). Memory: Python heap allocated by the claims (tracemalloc) / held "
        "jobs; C-level allocations (gRPC core) are not seen. Smallest renewal headroom: "
        "the least time left before the session's local deadline when a renewal "
        "succeeded in the window.",
        "",
        *_w3(results),
        "## W4 — takeover",
        "",
        "Kill: holder A (a worker process) holds the job and wrote a fenced effect; "
        "waiter B is blocked in `claim(wait_s=...)`; from A's SIGKILL to B's first write "
        "accepted by a `SqliteFence` with B's generation. A's late write with its old "
        "token is then tried: it must be rejected. Graceful: from A's release request to "
        "B's claim returning. The kill or release comes 0-100 ms (at random) after B started "
        "waiting. SQLite has no watch: B reads `PRAGMA data_version` every 1-5 ms (another "
        "process's commit) and polls the store every 50 ms (the default `poll_interval_s`, "
        "for expiries).",
        "",
        *_w4(results),
        *_discarded(results),
        f"## W5 — claim_many of {_batch(results)} jobs",
        "",
        f"Each round claims {_batch(results)} fresh jobs one by one, then "
        f"{_batch(results)} other fresh jobs with one `claim_many`, in one session; one "
        f"untimed warm-up round first, then up to {s['w5_rounds']} rounds (none started "
        f"after {s.get('w5_budget_s', '-')} s). Medians over the rounds with their "
        "interquartile range [p25-p75]; the speedup is the ratio of the medians, its "
        "range that of each round's single claims over its `claim_many`.",
        "",
        *_w5(results),
        "## W6 — peers on the same store",
        "",
        "One client, one lock name, acquire+release (ours: claim+release) in a loop: "
        f"{s.get('w6_warmup_s', 0)} s unmeasured, then {s.get('w6_windows', 1)} windows "
        f"over {s['w6_duration_s']} s, {s['w6_repeats']} repeat(s) in alternating order; "
        "median of the windows with their interquartile range. No peer hands out a "
        "fencing token.",
        "",
        *_w6(results),
        "## W8 — one asyncio process against sync worker processes",
        "",
        f"One process runs {s['w8_tasks']} asyncio tasks, each cycling `claim` + "
        "`complete` on its own fresh jobs through one `AsyncLeaseStore` (its default "
        f"thread pool) and one session; then {s['w8_processes']} sync worker processes "
        f"cycle as in W1; after W1's warm-up, {s.get('w8_windows', 1)} windows over "
        f"{s['w8_duration_s']} s each, {s['w8_repeats']} alternating pair(s); medians of "
        "the windows with their interquartile range.",
        "",
        *_w8(results),
        "## W7 — a deep work queue",
        "",
        "One queue per backend is filled with `enqueue_many` step by step to each depth "
        f"(plus {s['w7_samples']} jobs, so the depth stays at or above it while measured); "
        f"then one in-process worker times up to {s['w7_samples']} `claim_next` + "
        f"`complete` cycles and up to {s['w7_stats_samples']} `queue_stats` calls; the "
        f"completed jobs are purged before the next step. Payloads {s['w7_payload_bytes']} "
        "bytes. A depth is skipped (and says why) above the backend's documented "
        "`max_queue_jobs` or when filling it would overrun the fill budget "
        f"({s['w7_fill_budget_s']:g} s). Enqueue rates: single `enqueue` calls against "
        "one `enqueue_many` of ten times as many jobs, on a queue of their own; store "
        "requests counted on the backend instance. Server bytes per open job: growth of "
        "etcd's `dbSize` (the bbolt file: pages, history until compaction) or ZooKeeper's "
        "`zk_approximate_data_size` (paths + data, no per-znode overhead) since just "
        "before the fill, over the open jobs.",
        "",
        *_w7(results),
        "## W10 — queue drain",
        "",
        f"{s.get('w10_jobs', 0):,} no-op jobs enqueued (batched), then drained by one "
        f"side at a time, {s.get('w10_rounds', 0)} round(s), the order reversed every "
        "other round; each side a process of its own (its worker processes spawned). "
        "Jobs/s: jobs over the seconds from the go signal to the worker's return (start-up "
        "included; ours: `run_worker(until_empty=True)`, which ends when a non-waiting "
        "claim finds the queue drained). Transactions and server CPU per job (PostgreSQL, a "
        "server on this machine): `pg_stat_database` commits + rollbacks, and the CPU of "
        "the postmaster's children, around the drain. Client CPU: the side's processes. "
        f"Wake-up: {s.get('w10_wake_samples', 0)} jobs enqueued one at a time to an idle "
        "worker, from the enqueue's return to the handler's start. The fencing column: a "
        "worker paused past its lease (ours: SIGSTOP beyond the TTL; pgqueuer: its "
        "heartbeat timeout; procrastinate: its stalled-job retry) completes late after "
        "another worker took the job.",
        "",
        *drain_section(results),
    ]
    lines = _without_unrun(results, lines)
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    profiles = meta.get("profiles") or []
    if profiles:
        lines += ["## Profiles", ""] + [f"- [{p}]({p})" for p in profiles] + [""]
    return "\n".join(lines)


SECTION_KEYS = {"W1": "w1_throughput", "W2": "w2_latency", "W3": "w3_keepalive",
                "W4": "w4_takeover", "W5": "w5_batch", "W6": "w6_peers", "W7": "w7_depth",
                "W8": "w8_async", "W10": "w10_drain"}


def _without_unrun(results: dict[str, Any], lines: list[str]) -> list[str]:
    """``lines`` with the body of each workload section that no backend ran
    (``--workloads``) replaced by one line saying so: no empty tables."""
    ran = {key for entry in results["backends"].values()
           for key in entry.get("workloads", {})}
    out: list[str] = []
    skipping = False
    for line in lines:
        if line.startswith("## "):
            workload = line[3:].split(" ", 1)[0]
            skipping = workload in SECTION_KEYS and SECTION_KEYS[workload] not in ran
            out.append(line)
            if skipping:
                out += ["", f"*Not part of this run* (`--workloads` left {workload} out).",
                        ""]
            continue
        if not skipping:
            out.append(line)
    return out


def write_markdown(results: dict[str, Any], goals: list[Goal], plots: list[str],
                   out: Path) -> Path:
    path = out / MARKDOWN_NAME
    path.write_text(markdown(results, goals, plots))
    return path
