"""Jepsen's lock-set workload: a set read and written back under the lease, with pauses.

``python benchmarks/lockset.py URL`` starts ``--workers`` worker processes (default 5)
on the store URL. Each loops: claim the one job ``lockset`` (TTL ``--ttl-s``, default
2 s), read the set at the destination, add its next item, write the set back, release;
an item counts as *acknowledged* once its write returned and the worker logged it. Every
``--pause-every-s`` seconds (default 5) the parent SIGSTOPs a random worker for 3-5 s
(past its TTL: another worker takes the job over), then SIGCONTs it. After
``--duration-s`` (default 90) the workers stop and the final set is read: an
acknowledged item missing from it is a **lost update**.

The destination is a :class:`consensus_lease.SqliteFence` file. ``--mode fenced`` (the
default) uses ``read_fenced`` / ``write_fenced``; ``--mode write-only`` reads the set
unfenced and fences only the write (``apply`` with the token, the set as payload): the
control, which loses updates (docs/model.md, the ``write-only-fenced`` mutation).
Prints one JSON line: acknowledged, in the final set, lost, pauses, takeovers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = r"""
import json, sys, time
from consensus_lease import FenceRejected, LeaseError, LeaseLost, SqliteFence, open_store
url, fence_path, name, ttl, mode, log_path, stop_path = sys.argv[1:8]
ttl = float(ttl)
fence = SqliteFence(fence_path)
log = open(log_path, "a", buffering=1)
store = open_store(url)
n, session = 0, None

def read_unfenced():
    effects = fence.effects("lockset")
    return set(json.loads(effects[-1].payload)) if effects else set()

while not __import__("os").path.exists(stop_path):
    try:
        if session is None or session.state.name != "ACTIVE":
            session = store.session(name, ttl_s=ttl)
        lease = session.claim("lockset", wait_s=ttl * 2)
        with lease:
            n += 1
            item = f"{name}-{n}"
            if mode == "fenced":
                read = fence.read_fenced("lockset", lease.generation)
                items = set(json.loads(read.value or b"[]")) | {item}
                time.sleep(0.02)                      # the work between read and write
                fence.write_fenced(read, json.dumps(sorted(items)).encode())
            else:
                items = read_unfenced() | {item}
                time.sleep(0.02)
                fence.apply("lockset", lease.generation, item, json.dumps(sorted(items)).encode())
            log.write(item + "\n")                    # acknowledged
    except FenceRejected:
        log.write("#rejected\n")
    except LeaseLost as exc:
        log.write(f"#lease {type(exc).__name__}\n")
        session = None
    except LeaseError as exc:
        log.write(f"#other {type(exc).__name__}\n")
"""


def _final_set(fence_path: Path, mode: str) -> set[str]:
    from consensus_lease import SqliteFence

    fence = SqliteFence(str(fence_path))
    try:
        if mode == "fenced":
            value = fence.read_fenced("lockset", 2**62).value  # above every token
            return set(json.loads(value or b"[]"))
        effects = fence.effects("lockset")
        return set(json.loads(effects[-1].payload)) if effects else set()
    finally:
        fence.close()


def _pauses(procs: list[subprocess.Popen[bytes]], args: argparse.Namespace) -> int:
    """Every ``pause_every_s`` seconds a pause of a random worker starts, 3-5 s long."""
    start = time.monotonic()
    end, pauses = start + args.duration_s, 0
    while True:
        next_at = start + (pauses + 1) * args.pause_every_s
        if next_at >= end:
            break
        time.sleep(max(next_at - time.monotonic(), 0))  # the schedule: real time
        victim = random.choice(procs)
        os.kill(victim.pid, signal.SIGSTOP)
        time.sleep(random.uniform(3.0, 5.0))  # the pause itself: real time must pass
        os.kill(victim.pid, signal.SIGCONT)
        pauses += 1
    time.sleep(max(end - time.monotonic(), 0))
    return pauses


def run(args: argparse.Namespace) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="lockset-"))
    fence_path, stop = work / "dest.db", work / "stop"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, args.url, str(fence_path),
                               f"w{i}", str(args.ttl_s), args.mode, str(work / f"w{i}.log"),
                               str(stop)]) for i in range(args.workers)]
    try:
        pauses = _pauses(procs, args)
    finally:
        stop.touch()
        for proc in procs:
            os.kill(proc.pid, signal.SIGCONT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    lines = [ln.strip() for i in range(args.workers)
             for ln in (work / f"w{i}.log").read_text().splitlines()]
    acked = {ln for ln in lines if ln and not ln.startswith("#")}
    final = _final_set(fence_path, args.mode)
    return {"url": args.url.split("@")[-1], "mode": args.mode, "workers": args.workers,
            "ttl_s": args.ttl_s, "duration_s": args.duration_s, "pauses": pauses,
            "acknowledged": len(acked), "in_final_set": len(acked & final),
            "lost": len(acked - final), "fence_rejected": lines.count("#rejected"),
            "lease_lost": sum(ln.startswith("#lease") for ln in lines)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--ttl-s", type=float, default=2.0)
    parser.add_argument("--duration-s", type=float, default=90.0)
    parser.add_argument("--pause-every-s", type=float, default=5.0)
    parser.add_argument("--mode", choices=["fenced", "write-only"], default="fenced")
    print(json.dumps(run(parser.parse_args())), flush=True)


if __name__ == "__main__":
    main()
