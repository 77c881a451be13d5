"""A/B cycle throughput of two source trees on the same store, same run.

For a change on the hot path: ``python benchmarks/cycle_ab.py URL OLD_TREE NEW_TREE``
runs ``--repeats`` alternating pairs of one-worker loops, each in its own subprocess
with that tree first on ``sys.path``, and prints cycles/s per side and the median of the
per-pair ratios NEW/OLD. The cycle is W1's (``--end complete``, the default: claim and
complete a fresh job) or W6's (``--end release``: claim and release one name). Both
trees need only the public API (``open_store``, ``session``, ``claim``, ``complete``,
``release``). Bounded: ``--duration-s`` per loop, at most ``--repeats`` pairs.

Example, before/after a commit::

    git worktree add /tmp/old HEAD~1
    python benchmarks/cycle_ab.py sqlite:////tmp/ab.db /tmp/old . --duration-s 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid

LOOP = r"""
import json, sys, time
from consensus_lease import open_store
url, prefix, duration, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
with open_store(url) as store, store.session("ab", ttl_s=10.0) as session:
    def cycle(i):
        if end == "complete":  # W1's cycle: a fresh job, claimed and completed
            session.claim(f"{prefix}-{i}").complete(b"")
        else:  # W6's cycle: one name, claimed and released again and again
            session.claim(f"{prefix}-lock").release()
    for i in range(20):  # warm-up outside the measured window
        cycle(f"warm-{i}")
    cycles, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration and cycles < 1_000_000:
        cycle(cycles)
        cycles += 1
    elapsed = time.perf_counter() - start
print(json.dumps({"cycles": cycles, "elapsed_s": elapsed}))
"""


def run_side(tree: str, url: str, duration_s: float, end: str) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    prefix = f"ab-{uuid.uuid4().hex[:8]}"
    out = subprocess.run(
        [sys.executable, "-c", LOOP, url, prefix, str(duration_s), end],
        # cwd=tree: ``python -c`` puts the working directory first on sys.path, so run
        # from inside another checkout both sides would import that checkout.
        env=env, cwd=os.path.abspath(tree), capture_output=True, text=True,
        timeout=duration_s + 120, check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["cycles"]) / float(result["elapsed_s"])


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
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"old": [], "new": []}
    for rep in range(max(1, min(args.repeats, 20))):
        order = ("old", "new") if rep % 2 == 0 else ("new", "old")
        for side in order:
            rates[side].append(run_side(getattr(args, side), args.url, args.duration_s, args.end))
    ratios = [n / o for n, o in zip(rates["new"], rates["old"], strict=True)]
    print(json.dumps({
        "url": args.url,
        "end": args.end,
        "old_cycles_per_s": rates["old"],
        "new_cycles_per_s": rates["new"],
        "median_ratio_new_over_old": statistics.median(ratios),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
