"""PNG plots of a run (matplotlib, Agg backend: no display needed).

Made to be read at a glance: legends sit above the panels, never over the data; every
axis has headroom, so no bar, label or point touches the frame; backends whose lines
coincide are told apart by marker. A workload measured nowhere gets no plot at all (and
an old file of that name in the folder is removed), and a backend that did not measure
a workload gets no panel.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["PLOTS", "write_plots"]

PLOTS = ("w1_throughput.png", "w2_latency.png", "w3_keepalive.png", "w4_takeover.png",
         "w5_batch.png", "w6_peers.png", "w7_depth.png", "w8_async.png", "w10_drain.png")

OURS, RAW, PEER = "#1f77b4", "#aaaaaa", "#ff7f0e"
BACKEND_COLOURS = {"sqlite": "#2ca02c", "etcd": "#1f77b4", "zookeeper": "#d62728",
                   "memory": "#7f7f7f"}
HEADROOM = 1.18  # the y axis reaches this times the largest value
MARKERS = {"sqlite": ("o", 11), "etcd": ("s", 7), "zookeeper": ("^", 5)}
"""Marker and size per backend: large hollow to small filled, so equal values stay visible."""


def _ok(results: dict[str, Any], key: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for backend, entry in results["backends"].items():
        data = entry.get("workloads", {}).get(key)
        if data is not None and data.get("status") == "ok":
            found.append((backend, data))
    return found


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def _figure(panels: int, title: str) -> tuple[Any, list[Any]]:
    import matplotlib.pyplot as plt

    width = max(7.5, 4.6 * max(1, panels))
    fig, axes = plt.subplots(1, max(1, panels), figsize=(width, 4.0), squeeze=False)
    fig.suptitle(title, fontsize="medium")
    return fig, list(axes[0])


def _headroom(ax: Any, values: list[float]) -> None:
    top = max([v for v in values if math.isfinite(v)] or [0.0])
    ax.set_ylim(0, top * HEADROOM if top > 0 else 1.0)


def _labels(ax: Any, xs: list[float], values: list[float], fmt: str = "{:.0f}") -> None:
    for x, value in zip(xs, values, strict=True):
        ax.annotate(fmt.format(value), (x, value), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize="x-small",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.85})


def _save(fig: Any, path: Path) -> None:
    """One legend for the figure, between the title and the panels; then write it."""
    import matplotlib.pyplot as plt

    handles: dict[str, Any] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    top = 0.95
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="upper center",
                   bbox_to_anchor=(0.5, 0.945), ncol=min(len(handles), 5), frameon=False,
                   fontsize="small")
        top = 0.89
    fig.tight_layout(rect=(0.0, 0.0, 1.0, top))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _whisker(err: list[list[float]], value: float, sp: Any) -> None:
    """Append the distance from ``value`` down to the windows' 25th percentile and up to
    their 75th."""
    low = _num(sp.get("p25")) if isinstance(sp, dict) else value
    high = _num(sp.get("p75")) if isinstance(sp, dict) else value
    err[0].append(max(0.0, value - low))
    err[1].append(max(0.0, high - value))


def _w1(results: dict[str, Any], path: Path) -> bool:
    found = _ok(results, "w1_throughput")
    title = "W1 claim+complete cycles/s: ours vs raw client (same run; whiskers: windows' IQR)"
    if not found:
        return False
    fig, axes = _figure(len(found), title)
    for ax, (backend, data) in zip(axes, found, strict=True):
        labels, ours, raw = [], [], []
        ours_err: list[list[float]] = [[], []]
        raw_err: list[list[float]] = [[], []]
        for workers, row in data["workers"].items():
            labels.append(f"{workers} worker{'s' if workers != '1' else ''}\n"
                          f"ratio {_num(row['ratio']):.2f}x")
            ours.append(_num(row["ours_cycles_per_s"]))
            raw.append(_num(row["raw_cycles_per_s"]))
            _whisker(ours_err, ours[-1], row.get("ours_spread"))
            _whisker(raw_err, raw[-1], row.get("raw_spread"))
        x = range(len(labels))
        left, right = [i - 0.2 for i in x], [i + 0.2 for i in x]
        ax.bar(left, ours, 0.4, label="consensus_lease", color=OURS, yerr=ours_err, capsize=3)
        ax.bar(right, raw, 0.4, label="raw client", color=RAW, yerr=raw_err, capsize=3)
        _labels(ax, left, ours)
        _labels(ax, right, raw)
        _headroom(ax, [v + e for v, e in zip(ours + raw, ours_err[1] + raw_err[1], strict=True)])
        ax.set_xticks(list(x), labels)
        ax.set_title(backend)
        ax.set_ylabel("cycles/s")
    _save(fig, path)
    return True


def _w2(results: dict[str, Any], path: Path) -> bool:
    found = _ok(results, "w2_latency")
    title = "W2 latency per operation (p50 bar, p99 whisker)"
    if not found:
        return False
    fig, axes = _figure(len(found), title)
    for ax, (backend, data) in zip(axes, found, strict=True):
        ops = ["claim", "renew", "complete"]
        p50 = [_num(data[f"{op}_ms"]["p50"]) for op in ops]
        p99 = [_num(data[f"{op}_ms"]["p99"]) for op in ops]
        ax.bar(ops, p50, color=OURS, yerr=[[0.0] * 3, [b - a for a, b in zip(p50, p99,
                                                                         strict=True)]],
               capsize=6)
        for i, (low, high) in enumerate(zip(p50, p99, strict=True)):
            ax.text(i, low / 2, f"p50\n{low:.2f}", ha="center", va="center", color="white",
                    fontsize="x-small")
            ax.text(i + 0.1, high, f"p99 {high:.2f}", ha="left", va="center",
                    fontsize="x-small")
        _headroom(ax, p99)
        ax.set_title(backend)
        ax.set_ylabel("ms")
    _save(fig, path)
    return True


def _w3(results: dict[str, Any], path: Path) -> bool:
    found = _ok(results, "w3_keepalive")
    title = "W3 one worker holding N jobs"
    if not found:
        return False
    fig, axes = _figure(3, title)
    columns = ("renewal_requests_per_s", "cpu_ms_per_s", "bytes_per_lease")
    series: list[list[float]] = [[], [], []]
    for backend, data in found:
        held = [r["held"] for r in data["rows"]]
        marker, size = MARKERS.get(backend, ("D", 6))
        for i, column in enumerate(columns):
            values = [_num(r[column]) for r in data["rows"]]
            series[i] += values
            axes[i].plot(held, values, marker=marker, markersize=size, linestyle="-",
                         markerfacecolor="none" if size > 8 else None, label=backend)
    for ax, values, ylabel in zip(axes, series, ("renewal requests/s", "client CPU ms per s",
                                                 "client bytes per held lease"), strict=True):
        ax.set_xscale("log")
        ax.margins(x=0.08)
        ax.set_xlabel("held jobs")
        ax.set_ylabel(ylabel)
        _headroom(ax, values)
    axes[2].set_title("goal: at most 2048 bytes", fontsize="small")
    _save(fig, path)
    return True


def _w4(results: dict[str, Any], path: Path) -> bool:
    found = _ok(results, "w4_takeover")
    title = "W4 takeover: after SIGKILL (s) and graceful handover (ms)"
    if not found:
        return False
    fig, axes = _figure(2, title)
    names = [b for b, _ in found]
    x = range(len(found))
    kill50 = [_num(d["kill_s"]["p50"]) for _, d in found]
    kill99 = [_num(d["kill_s"]["p99"]) for _, d in found]
    axes[0].bar([i - 0.2 for i in x], kill50, 0.4, label="p50", color=OURS)
    axes[0].bar([i + 0.2 for i in x], kill99, 0.4, label="p99", color=PEER)
    for i, (_, d) in enumerate(found):
        axes[0].hlines(_num(d["granted_ttl_s"]), i - 0.45, i + 0.45, colors="black",
                       linestyles="dotted", label="TTL" if i == 0 else None)
    axes[0].set_xticks(list(x), names)
    axes[0].set_ylabel("s from SIGKILL to\nnext holder's fenced write")
    _labels(axes[0], [i - 0.2 for i in x], kill50, "{:.2f}")
    _labels(axes[0], [i + 0.2 for i in x], kill99, "{:.2f}")
    _headroom(axes[0], kill99 + [_num(d["granted_ttl_s"]) for _, d in found])
    g50 = [_num(d["graceful_ms"]["p50"]) for _, d in found]
    g99 = [_num(d["graceful_ms"]["p99"]) for _, d in found]
    axes[1].bar([i - 0.2 for i in x], g50, 0.4, label="p50", color=OURS)
    axes[1].bar([i + 0.2 for i in x], g99, 0.4, label="p99", color=PEER)
    axes[1].axhline(20, color="red", linestyle="--", linewidth=1, label="goal 20 ms")
    axes[1].set_xticks(list(x), names)
    axes[1].set_ylabel("ms from release to next claim")
    _labels(axes[1], [i - 0.2 for i in x], g50, "{:.1f}")
    _labels(axes[1], [i + 0.2 for i in x], g99, "{:.1f}")
    _headroom(axes[1], [*g99, 20.0])
    _save(fig, path)
    return True


def _w5(results: dict[str, Any], path: Path) -> bool:
    found = _ok(results, "w5_batch")
    title = "W5 claiming a batch: 128 single claims vs claim_many"
    if not found:
        return False
    fig, (ax,) = _figure(1, title)
    x = range(len(found))
    single = [_num(d["single_ms"]["p50"]) for _, d in found]
    batch = [_num(d["batch_ms"]["p50"]) if d["supported"] else 0.0 for _, d in found]
    ax.bar([i - 0.2 for i in x], single, 0.4, label="single claims", color=RAW)
    ax.bar([i + 0.2 for i in x], batch, 0.4, label="claim_many", color=OURS)
    for i, (_, d) in enumerate(found):
        text = f"{_num(d.get('speedup')):.1f}x" if d["supported"] else "not\nsupported"
        ax.text(i + 0.2, max(batch[i], 0.0), text, ha="center", va="bottom", fontsize="small")
    _labels(ax, [i - 0.2 for i in x], single)
    ax.set_xticks(list(x), [b for b, _ in found])
    ax.set_ylabel("ms (median)")
    _headroom(ax, single + batch)
    _save(fig, path)
    return True


def _w6(results: dict[str, Any], path: Path) -> bool:
    found = [(b, d) for b, d in _ok(results, "w6_peers") if d.get("peers")]
    title = ("W6 acquire+release cycles/s on the same store (hatched: a peer with no fencing "
             "token; grey: the raw client's ceiling; whiskers: windows' IQR)")
    if not found:
        return False
    fig, axes = _figure(len(found), title)
    for ax, (backend, data) in zip(axes, found, strict=True):
        peers = data["peers"]
        for i, peer in enumerate(peers):
            value = _num(peer["cycles_per_s"])
            err: list[list[float]] = [[], []]
            _whisker(err, value, peer.get("spread"))
            ceiling = peer["library"] == "raw"  # the raw client: grey, as in W1
            ax.bar(i, value, color=OURS if peer["fencing"] else RAW if ceiling else PEER,
                   hatch=None if peer["fencing"] or ceiling else "//", yerr=err, capsize=3)
            ax.text(i, value, "failed" if peer["error"] else f"{value:.0f}", ha="center",
                    va="bottom", fontsize="small")
        ax.set_xticks(range(len(peers)), [p["name"].replace(" (", "\n(") for p in peers],
                      fontsize="x-small", rotation=15)
        _headroom(ax, [_num(peer["cycles_per_s"]) for peer in peers])
        ax.set_title(backend)
        ax.set_ylabel("cycles/s")
    _save(fig, path)
    return True


def _count(value: float, _pos: object = None) -> str:
    """1000 -> 1k, 1000000 -> 1M."""
    for size, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def _w7(results: dict[str, Any], path: Path) -> bool:
    found = _ok(results, "w7_depth")
    title = "W7 deep queue: cost against open jobs (solid p50, dotted p99), enqueue rates"
    if not found:
        return False
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter
    from matplotlib.transforms import blended_transform_factory

    fig, axes = plt.subplots(1, 3, figsize=(14.0, 4.6))
    fig.suptitle(title, fontsize="medium")
    depths: set[int] = set()
    for backend, data in found:
        colour = BACKEND_COLOURS.get(backend, OURS)
        rows = [r for r in data["rows"] if "cycle_ms" in r]
        xs = [r["depth"] for r in rows]
        depths.update(xs)
        axes[0].plot(xs, [_num(r["cycle_ms"]["p50"]) for r in rows], "o-", color=colour,
                     label=backend)
        axes[0].plot(xs, [_num(r["cycle_ms"]["p99"]) for r in rows], ":", color=colour)
        axes[1].plot(xs, [_num(r["queue_stats_ms"]["p50"]) for r in rows], "o-",
                     color=colour)
        for r in data["rows"]:
            if "failed" in r:  # the store broke down there: an X at the top of both panels
                depths.add(r["depth"])
                for ax in axes[:2]:
                    ax.plot([r["depth"]], [0.93], "X", color=colour, markersize=10,
                            transform=blended_transform_factory(ax.transData, ax.transAxes))
                    ax.annotate("failed", (r["depth"], 0.93), xytext=(0, -14),
                                textcoords="offset points", ha="center", fontsize="small",
                                color=colour,
                                xycoords=blended_transform_factory(ax.transData,
                                                                   ax.transAxes))
    axes[1].axhline(50, color="black", linestyle="--", linewidth=1)
    for ax, name in zip(axes[:2], ("claim_next + complete (ms)",
                                   "queue_stats p50 (ms); dashed: goal at 100k"),
                        strict=True):
        ax.set_title(name, fontsize="medium")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sorted(depths))
        ax.xaxis.set_major_formatter(FuncFormatter(_count))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
        ax.set_xlabel("open jobs in the queue")
        ax.grid(True, which="major", alpha=0.3)
    x = range(len(found))
    single = [_num(d["rates"]["enqueue_jobs_per_s"]) for _, d in found]
    many = [_num(d["rates"]["enqueue_many_jobs_per_s"]) for _, d in found]
    axes[2].bar([i - 0.2 for i in x], single, 0.4, color=RAW, label="enqueue")
    axes[2].bar([i + 0.2 for i in x], many, 0.4, color=OURS, label="enqueue_many")
    for i, (_, d) in enumerate(found):
        axes[2].text(i + 0.2, max(many[i], 1.0), f"{_num(d['rates']['speedup']):.1f}x",
                     ha="center", va="bottom", fontsize="small")
    top = max([*many, *single, 10.0])
    axes[2].set_yscale("log")
    axes[2].set_ylim(1.0, top * 8)
    axes[2].yaxis.set_major_formatter(FuncFormatter(_count))
    axes[2].set_xticks(list(x), [b for b, _ in found])
    axes[2].set_title("enqueue rate (jobs/s)", fontsize="medium")
    axes[2].legend(fontsize="small", loc="upper left", ncol=2, frameon=False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(found), fontsize="small",
               frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _w8(results: dict[str, Any], path: Path) -> bool:
    found = _ok(results, "w8_async")
    title = "W8 claim+complete cycles/s: one asyncio process vs sync worker processes"
    if not found:
        return False
    fig, axes = _figure(len(found), title)
    for ax, (backend, data) in zip(axes, found, strict=True):
        values = [_num(data["async_cycles_per_s"]), _num(data["processes_cycles_per_s"])]
        labels = [f"1 process,\n{data['tasks']} asyncio tasks",
                  f"{data['processes']} sync\nprocesses"]
        ax.bar(labels, values, color=[OURS, RAW])
        _labels(ax, [0.0, 1.0], values)
        _headroom(ax, values)
        ax.set_title(f"{backend}: ratio {_num(data['ratio']):.2f}x")
        ax.set_ylabel("cycles/s")
    _save(fig, path)
    return True


def write_plots(results: dict[str, Any], out: Path) -> list[str]:
    """Write the plots of :data:`PLOTS` whose workload some backend measured into ``out``
    (a folder) and remove older files named after the others.

    Returns the names of the files written.

    Raises:
        ImportError: matplotlib is not installed.
        OSError: ``out`` cannot be written.
        KeyError, TypeError: ``results`` lacks what a measured workload records.
    """
    import matplotlib

    matplotlib.use("Agg")
    written = []
    from .drainreport import plot as _w10

    draws = (_w1, _w2, _w3, _w4, _w5, _w6, _w7, _w8, _w10)
    for name, draw in zip(PLOTS, draws, strict=True):
        if draw(results, out / name):
            written.append(name)
        else:
            (out / name).unlink(missing_ok=True)
    return written
