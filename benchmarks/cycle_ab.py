"""A/B cycle throughput of two source trees on the same store, same run.

For a change on the hot path: ``python benchmarks/cycle_ab.py URL OLD_TREE NEW_TREE``
runs ``--repeats`` alternating pairs of one-worker loops, each in its own subprocess
with that tree first on ``sys.path``, and prints cycles/s per side and the median of the
per-pair ratios NEW/OLD, and the same for the CPU time per cycle (steadier than the
rate on a loaded machine). The cycle is W1's (``--end complete``, the default: claim and
complete a fresh job) or W6's (``--end release``: claim and release one name). Both
trees need only the public API (``open_store``, ``session``, ``claim``, ``complete``,
``release``). Bounded: ``--duration-s`` per loop, at most ``--repeats`` pairs.

Example, before/after a commit::

    git worktree add /tmp/old HEAD~1
    python benchmarks/cycle_ab.py sqlite:////tmp/ab.db /tmp/old . --duration-s 5

The cost of an observer: the same tree on both sides, one with it on
(``--new-observer otel``: :class:`consensus_lease.otel.OTelObserver` on the SDK, batched
spans and metrics collected every second, both to exporters that discard them;
``prometheus``: PrometheusObserver)::

    python benchmarks/cycle_ab.py sqlite:////tmp/ab.db . . --new-observer otel

Steadier for an observer on a loaded machine: both in one process, alternating blocks of
100 cycles (``--interleave 100``), the median of the per-block ratios::

    python benchmarks/cycle_ab.py sqlite:////tmp/ab.db . . --new-observer otel \
        --interleave 100 --duration-s 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid

MAKE_OBSERVER = r"""
def make_observer(kind):
    if kind == "otel":  # the SDK as an application sets it up: batched spans, metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (MetricExporter, MetricExportResult,
                                                      PeriodicExportingMetricReader)
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (BatchSpanProcessor, SpanExporter,
                                                    SpanExportResult)
        from consensus_lease.otel import OTelObserver
        class Discard(SpanExporter):  # exporters that cost nothing: only ours is timed
            def export(self, spans):
                return SpanExportResult.SUCCESS
        class DiscardMetrics(MetricExporter):
            def export(self, metrics_data, timeout_millis=10_000, **kwargs):
                return MetricExportResult.SUCCESS
            def force_flush(self, timeout_millis=10_000):
                return True
            def shutdown(self, timeout_millis=30_000, **kwargs):
                pass
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(BatchSpanProcessor(Discard()))
        reader = PeriodicExportingMetricReader(DiscardMetrics(), export_interval_millis=1000)
        return OTelObserver(tracer_provider=tracer_provider,
                            meter_provider=MeterProvider(metric_readers=[reader]))
    if kind == "prometheus":
        from prometheus_client import CollectorRegistry
        from consensus_lease.metrics import PrometheusObserver
        return PrometheusObserver(registry=CollectorRegistry())
    return None
"""

LOOP = MAKE_OBSERVER + r"""
import json, sys, time
from consensus_lease import open_store
url, prefix, duration, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
observer = make_observer(sys.argv[5])
with open_store(url, observer=observer) as store, store.session("ab", ttl_s=10.0) as session:
    def cycle(i):
        if end == "complete":  # W1's cycle: a fresh job, claimed and completed
            session.claim(f"{prefix}-{i}").complete(b"")
        else:  # W6's cycle: one name, claimed and released again and again
            session.claim(f"{prefix}-lock").release()
    for i in range(20):  # warm-up outside the measured window
        cycle(f"warm-{i}")
    cycles, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < duration and cycles < 1_000_000:
        cycle(cycles)
        cycles += 1
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"cycles": cycles, "elapsed_s": elapsed, "cpu_s": cpu}))
"""


INTERLEAVED = MAKE_OBSERVER + r"""
import json, sys, time
from consensus_lease import open_store
url, prefix, duration, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
kinds, block = (sys.argv[5], sys.argv[6]), int(sys.argv[7])
stores = [open_store(url, observer=make_observer(kind)) for kind in kinds]
sessions = [store.session(f"ab-{i}", ttl_s=10.0) for i, store in enumerate(stores)]
counter = [0]
def cycle(session, side):
    counter[0] += 1
    if end == "complete":
        session.claim(f"{prefix}-{side}-{counter[0]}").complete(b"")
    else:
        session.claim(f"{prefix}-{side}-lock").release()
for side, session in enumerate(sessions):
    for _ in range(50):  # warm-up outside the measured blocks
        cycle(session, side)
out = {"wall_s": [[], []], "cpu_s": [[], []]}
start = time.perf_counter()
while time.perf_counter() - start < 2 * duration and len(out["wall_s"][0]) < 10_000:
    for side in (0, 1) if len(out["wall_s"][0]) % 2 == 0 else (1, 0):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(block):
            cycle(sessions[side], side)
        out["wall_s"][side].append(time.perf_counter() - wall)
        out["cpu_s"][side].append(time.process_time() - cpu)
for session in sessions:
    session.close()
for store in stores:
    store.close()
print(json.dumps(out))
"""


def run_interleaved(tree: str, url: str, duration_s: float, end: str, old: str, new: str,
                    block: int) -> dict[str, object]:
    """Both observers in one process, on one store file, in alternating blocks of
    ``block`` cycles: the machine's load swings hit both sides alike. Returns the
    median over block pairs of NEW/OLD time per block (wall and CPU)."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    prefix = f"ab-{uuid.uuid4().hex[:8]}"
    out = subprocess.run(
        [sys.executable, "-c", INTERLEAVED, url, prefix, str(duration_s), end, old, new,
         str(block)],
        env=env, cwd=os.path.abspath(tree), capture_output=True, text=True,
        timeout=2 * duration_s + 300,
    )
    if out.returncode != 0:
        raise SystemExit(f"the interleaved loop failed:\n{out.stderr[-4000:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    wall, cpu = data["wall_s"], data["cpu_s"]
    return {
        "blocks_per_side": len(wall[0]),
        "cycles_per_block": block,
        "old_us_per_cycle_median": statistics.median(wall[0]) * 1e6 / block,
        "new_us_per_cycle_median": statistics.median(wall[1]) * 1e6 / block,
        "median_wall_ratio_new_over_old": statistics.median(
            n / o for o, n in zip(wall[0], wall[1], strict=True)),
        "old_cpu_us_per_cycle_median": statistics.median(cpu[0]) * 1e6 / block,
        "new_cpu_us_per_cycle_median": statistics.median(cpu[1]) * 1e6 / block,
        "median_cpu_ratio_new_over_old": statistics.median(
            n / o for o, n in zip(cpu[0], cpu[1], strict=True) if o > 0),
    }


def run_side(tree: str, url: str, duration_s: float, end: str,
             observer: str) -> tuple[float, float]:
    """One loop: (cycles per second of wall time, CPU microseconds per cycle of the whole
    process, its background threads included). The CPU figure hardly moves with the
    machine's load, which on a shared machine swings the wall-time rate by 10x."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    prefix = f"ab-{uuid.uuid4().hex[:8]}"
    out = subprocess.run(
        [sys.executable, "-c", LOOP, url, prefix, str(duration_s), end, observer],
        # cwd=tree: ``python -c`` puts the working directory first on sys.path, so run
        # from inside another checkout both sides would import that checkout.
        env=env, cwd=os.path.abspath(tree), capture_output=True, text=True,
        timeout=duration_s + 120,
    )
    if out.returncode != 0:
        raise SystemExit(f"the loop of {tree} failed:\n{out.stderr[-4000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    cycles = max(1, int(result["cycles"]))
    return cycles / float(result["elapsed_s"]), float(result["cpu_s"]) * 1e6 / cycles


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="store URL (loopback servers only)")
    parser.add_argument("old", help="source tree A (the baseline)")
    parser.add_argument("new", help="source tree B")
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--end", choices=("complete", "release"), default="complete",
                        help="complete: W1's cycle (claim+complete of a fresh job); "
                             "release: W6's (claim+release of one name)")
    for side in ("old", "new"):
        parser.add_argument(f"--{side}-observer", choices=("none", "otel", "prometheus"),
                            default="none",
                            help=f"observer of side {side.upper()}'s store (otel: "
                                 "consensus_lease.otel with the SDK, batched spans)")
    parser.add_argument("--interleave", type=int, default=0, metavar="BLOCK",
                        help="same tree, two observers: run both in one process in "
                             "alternating blocks of BLOCK cycles (--duration-s each side)")
    args = parser.parse_args()
    if args.interleave:
        if os.path.abspath(args.old) != os.path.abspath(args.new):
            parser.error("--interleave compares two observers of one tree: OLD == NEW")
        result = run_interleaved(args.new, args.url, args.duration_s, args.end,
                                 args.old_observer, args.new_observer, args.interleave)
        print(json.dumps({"url": args.url, "end": args.end, "old_observer": args.old_observer,
                          "new_observer": args.new_observer, **result}, indent=2))
        return 0
    rates: dict[str, list[float]] = {"old": [], "new": []}
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    for rep in range(max(1, min(args.repeats, 20))):
        order = ("old", "new") if rep % 2 == 0 else ("new", "old")
        for side in order:
            rate, cpu_us = run_side(getattr(args, side), args.url, args.duration_s, args.end,
                                    getattr(args, f"{side}_observer"))
            rates[side].append(rate)
            cpu[side].append(cpu_us)
    ratios = [n / o for n, o in zip(rates["new"], rates["old"], strict=True)]
    cpu_ratios = [n / o for n, o in zip(cpu["new"], cpu["old"], strict=True)]
    print(json.dumps({
        "url": args.url,
        "end": args.end,
        "old_observer": args.old_observer,
        "new_observer": args.new_observer,
        "old_cycles_per_s": rates["old"],
        "new_cycles_per_s": rates["new"],
        "median_ratio_new_over_old": statistics.median(ratios),
        "old_cpu_us_per_cycle": cpu["old"],
        "new_cpu_us_per_cycle": cpu["new"],
        "median_cpu_ratio_new_over_old": statistics.median(cpu_ratios),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
