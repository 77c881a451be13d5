"""Write ``benchmarks/results/verify/results.md`` from the ``--summary`` JSON files that
``benchmarks/verify_runs.sh`` leaves there: one row per run, then each run's command.

    python benchmarks/verify_table.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "verify"
ORDER = ("sqlite", "postgresql", "etcd", "zookeeper")
FLAGS = (("workers", "--workers"), ("jobs", "--jobs"), ("steps", "--steps"),
         ("think_s", "--think-s"), ("ttl_s", "--ttl-s"), ("duration_s", "--duration-s"),
         ("quiet_s", "--quiet-s"), ("seed", "--seed"))


def command(run: dict[str, Any]) -> str:
    options = run["options"]
    where = (f"--backend '{options['backend']}'" if options["backend"]
             else f"--cluster {options['cluster']}")
    flags = " ".join(f"{flag} {options[key]:g}" if isinstance(options[key], float)
                     else f"{flag} {options[key]}" for key, flag in FLAGS
                     if options[key] is not None)
    unfenced = " --unfenced" if options["unfenced"] else ""
    if options.get("until_done"):
        unfenced = " --until-done" + unfenced
    return f"consensus-lease verify {where} {flags} --faults {','.join(options['faults'])}" \
           f"{unfenced}"


def row(name: str, run: dict[str, Any]) -> str:
    counts, violations = run["counts"], run["violations"]
    bad = ", ".join(f"{k} {v}" for k, v in violations.items() if v) or "0"
    faults = sum(run["faults_injected"].values())
    under = run.get("claims_under_faults")
    return (f"| {name} | **{run['verdict']}** | {counts['claims']:,} | "
            f"{'?' if under is None else f'{under:,}'} | "
            f"{counts['completions']:,} | {bad} | "
            f"{counts['stale_writes_rejected']} + {counts['stale_completions_rejected']} | "
            f"{faults} ({len(run['faults_injected'])} kinds) {period(run['options'])} | "
            f"{_seconds(run.get('last_completion_s'))} | "
            f"{run['elapsed_s']:.0f} s |")


def period(options: dict[str, Any]) -> str:
    """How long the fault period lasted (as asked for)."""
    limit = f"{options['duration_s']:.0f} s"
    return f"until done (at most {limit})" if options.get("until_done") else f"over {limit}"


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f} s"


def main() -> int:
    runs = {p.stem: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(RESULTS.glob("*.json"))}
    names = [n for store in ORDER for n in (store, f"{store}-unfenced") if n in runs]
    lines = [
        "# verify: 10,000 claims per store",
        "",
        "Written by `python benchmarks/verify_table.py` from the `--summary` files next to",
        "it; the runs come from `bash benchmarks/verify_runs.sh` (one at a time, on a",
        "2-core Debian 12 VM shared with other work). Each store's run must PASS with",
        "zero violations; its `--unfenced` control (the same faults, a destination that",
        "does not check tokens) must FAIL. Faults are injected during the fault period",
        "(`--duration-s`); *last job completed at* counts from the fault period's start,",
        "and *claims during the fault period* are the claims made under faults (the rest",
        "came in the quiet period after it).",
        "",
        "| run | verdict | claims | claims during the fault period | completed | "
        "violations | stale refused "
        "(writes + completions) | faults injected | last job completed at | run time |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(row(n, runs[n]) for n in names),
        "",
        "## Commands",
        "",
    ]
    for name in names:
        run = runs[name]
        injected = ", ".join(f"{k} {v}" for k, v in sorted(run["faults_injected"].items()))
        lines += [f"**{name}** ([summary]({name}.json)): faults injected: {injected}.",
                  "", "```sh", command(run), "```", ""]
    (RESULTS / "results.md").write_text("\n".join(lines), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
