"""W10's table (in ``results.md``) and plot (``w10_drain.png``): see :mod:`.drain`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["PLOT", "fencing_cell", "plot", "rows", "section"]

PLOT = "w10_drain.png"
HEADER = ["store", "side", "who rejects a stale completion", "jobs/s median [min-max]",
          "enqueue jobs/s", "transactions/job", "server CPU us/job", "client CPU us/job",
          "wake-up p50 / p99 ms", "exactly once"]


def _f(value: Any, spec: str) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:{spec}}"
    return "-"


def _ok(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for backend, entry in results["backends"].items():
        data = entry.get("workloads", {}).get("w10_drain")
        if data is not None and data.get("status") == "ok":
            found.append((backend, data))
    return found


def fencing_cell(side: dict[str, Any], fencing: dict[str, Any]) -> str:
    """The fencing column of one side: who refuses a paused worker's late completion
    after another worker took the job over."""
    kind = side["side"]
    if kind.startswith("raw-"):
        return "n/a: no expiry, so no takeover"
    check = fencing.get("ours" if kind == "ours" else kind)
    if not isinstance(check, dict):
        return "not checked"
    if check.get("error"):
        return f"check failed: {check['error']}"
    if check.get("fenced"):
        return f"the store ({check['late_completion'].removeprefix('refused: ')})"
    return f"nobody: {check.get('late_completion')}"


def _cell(summary: dict[str, Any], key: str, spec: str) -> str:
    sp = summary.get(key)
    return _f(sp.get("median"), spec) if isinstance(sp, dict) else "-"


def rows(backend: str, data: dict[str, Any]) -> list[list[str]]:
    out = []
    for side in data["sides"]:
        s, wake = side["summary"], side.get("wake")
        jobs = s.get("jobs_s") or {}
        out.append([
            backend, side["name"], fencing_cell(side, data.get("fencing", {})),
            f"{_f(jobs.get('median'), ',.0f')} [{_f(jobs.get('min'), ',.0f')}-"
            f"{_f(jobs.get('max'), ',.0f')}]",
            _cell(s, "enqueue_jobs_s", ",.0f"), _cell(s, "transactions_per_job", ".2f"),
            _cell(s, "server_cpu_us_per_job", ",.0f"),
            _cell(s, "client_cpu_us_per_job", ",.0f"),
            (f"{_f(wake.get('p50_ms'), '.1f')} / {_f(wake.get('p99_ms'), '.1f')}"
             if isinstance(wake, dict) else "-"),
            "yes" if s.get("exactly_once") else
            f"**no**: {s.get('duplicates')} twice, {s.get('missing')} missing"])
    return out


def section(results: dict[str, Any]) -> list[str]:
    """The W10 table and its notes (``## W10`` is written by the caller)."""
    table = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    notes = []
    for backend, data in _ok(results):
        for row in rows(backend, data):
            table.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        if not data.get("raw_loop", True):
            notes.append(f"*{backend}: no raw two-request drain loop for this store yet*")
        missing = [p for p, v in (data.get("peers") or {}).items() if not v]
        if backend == "postgresql" and missing:
            notes.append(f"*{backend}: not installed, so not measured: "
                         f"{', '.join(missing)} (`pip install 'consensus_lease[bench]'`)*")
        if backend == "postgresql" and not data.get("server_measured"):
            notes.append(f"*{backend}: the server is not on this machine: no server CPU*")
    for backend, entry in results["backends"].items():
        data = entry.get("workloads", {}).get("w10_drain")
        if data is not None and data.get("status") != "ok":
            notes.append(f"*{backend}: not measured — {data.get('error')}*")
    return [*table, "", *([*notes, ""] if notes else [])]


def plot(results: dict[str, Any], path: Path) -> bool:
    """Jobs/s per side (whiskers: min-max over the rounds), one panel per store."""
    import matplotlib.pyplot as plt

    found = _ok(results)
    if not found:
        return False
    fig, axes = plt.subplots(1, len(found), figsize=(max(7.5, 5.2 * len(found)), 4.4),
                             squeeze=False)
    fig.suptitle("W10 queue drain: jobs/s (blue: ours; grey: the raw client's loop; "
                 "hatched: no fencing; whiskers: min-max over rounds)", fontsize="medium")
    for ax, (backend, data) in zip(axes[0], found, strict=True):
        sides, top = data["sides"], 0.0
        for i, side in enumerate(sides):
            sp = side["summary"].get("jobs_s") or {}
            value = float(sp.get("median") or 0.0)
            top = max(top, float(sp.get("max") or value))
            kind = side["side"]
            colour = "#1f77b4" if kind == "ours" else "#aaaaaa" if kind.startswith(
                "raw-") else "#ff7f0e"
            err = [[max(0.0, value - float(sp.get("min") or value))],
                   [max(0.0, float(sp.get("max") or value) - value)]]
            ax.bar(i, value, color=colour, hatch="//" if colour == "#ff7f0e" else None,
                   yerr=err, capsize=3)
            ax.text(i, value, f"{value:,.0f}", ha="center", va="bottom", fontsize="x-small")
        ax.set_xticks(range(len(sides)), [s["name"].replace(", ", "\n") for s in sides],
                      fontsize="x-small", rotation=30, ha="right")
        ax.set_ylim(0, top * 1.18 if top > 0 else 1.0)
        ax.set_title(backend)
        ax.set_ylabel("jobs/s")
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
