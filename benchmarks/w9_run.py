"""W9 (many sessions per process on a busy host) with its sizes on the command line.

``consensus-lease bench --workloads w9`` runs W9 at its defaults (TTL 10 s) on a cluster it
starts; this runs the same workload (:func:`consensus_lease.bench.sessions.w9_sessions`)
on a store you name, with another TTL, session counts or hold time, and prints the
result as JSON (the losses split by cause: ``store_ended`` by the store, ``client_lost``
by a local deadline). Example, on the kit's 3-member etcd::

    python benchmarks/w9_run.py etcd://127.0.62.11:2379,127.0.62.12:2379/w9 --ttl 30
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from consensus_lease.bench.config import FULL, Target
from consensus_lease.bench.sessions import w9_sessions


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="store URL (its own key prefix / chroot)")
    parser.add_argument("--ttl", type=float, default=FULL.w9_ttl_s, help="session TTL, s")
    parser.add_argument("--hold", type=float, default=FULL.w9_hold_s, help="hold time, s")
    parser.add_argument("--processes", type=int, default=FULL.w9_processes)
    parser.add_argument("--per-process", type=int, default=FULL.w9_sessions_per_process)
    parser.add_argument("--single", type=int, default=FULL.w9_single_sessions)
    parser.add_argument("--hogs", type=int, default=FULL.w9_hogs)
    args = parser.parse_args(argv)
    sizes = dataclasses.replace(
        FULL, w9_ttl_s=args.ttl, w9_hold_s=args.hold, w9_processes=args.processes,
        w9_sessions_per_process=args.per_process, w9_single_sessions=args.single,
        w9_hogs=args.hogs)
    backend = args.url.split(":", 1)[0]
    result = w9_sessions(Target(backend, url=args.url), sizes, "w9")
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0 if result["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
