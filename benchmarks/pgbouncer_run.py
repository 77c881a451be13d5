"""Issue 29's PgBouncer run (not in CI): N worker processes through PgBouncer 1.18 in
transaction pooling mode, each with its own store (``pooling=transaction``,
``listen_url`` = the direct server, ``pool_size`` P); J jobs enqueued first, E more one
at a time while the workers run. Reports jobs done (each must be done once), errors,
enqueue failures and the wall time.

    eval "$(bash scripts/start-postgres.sh)"
    PYTHONPATH=$PWD python benchmarks/pgbouncer_run.py --workers 16 --pool-size 4 \\
        --jobs 2000 --late 40
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "backends"))

import psycopg
from pgbouncer_local import pgbouncer

from consensus_lease import open_store

WORKER = r"""
import json, sys, time
from consensus_lease import open_store
from consensus_lease.errors import ClaimTimeout, LeaseError
url, schema, listen = sys.argv[1:4]
pool, stop_after = int(sys.argv[4]), float(sys.argv[5])
store = open_store(url, schema=schema, pooling="transaction", listen_url=listen or None,
                   pool_size=pool)
deadline = time.monotonic() + stop_after
with store.session("w", ttl_s=10.0) as session:
    while time.monotonic() < deadline:
        try:
            lease = session.claim_next("q", wait_s=1.0)
        except ClaimTimeout:
            if store.get("stop") is not None:
                break
            continue
        except LeaseError as exc:
            print(json.dumps({"error": repr(exc)}), flush=True)
            continue
        try:
            lease.complete(b"ok")
            print(json.dumps({"done": lease.job_id}), flush=True)
        except LeaseError as exc:
            print(json.dumps({"error": repr(exc)}), flush=True)
store.close()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--pool-size", type=int, default=4)
    ap.add_argument("--bouncer-pool", type=int, default=8, help="PgBouncer default_pool_size")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--late", type=int, default=40)
    ap.add_argument("--no-listen", action="store_true", help="poll instead of LISTEN")
    args = ap.parse_args()
    base = _base_url()
    schema = f"b{uuid.uuid4().hex[:12]}"
    with pgbouncer(base, pool_size=args.bouncer_pool) as url:
        admin = open_store(url, schema=schema, pooling="transaction")
        admin.enqueue_many("q", [(f"a{i}", b"") for i in range(args.jobs)])
        start = time.monotonic()
        procs = [subprocess.Popen(
            [sys.executable, "-c", WORKER, url, schema, "" if args.no_listen else base,
             str(args.pool_size), "300"], stdout=subprocess.PIPE, text=True)
            for _ in range(args.workers)]
        enqueue_errors = 0
        for i in range(args.late):
            try:
                admin.enqueue("q", f"late{i}")
            except Exception:
                enqueue_errors += 1
            time.sleep(0.05)
        total = args.jobs + args.late
        while True:
            stats = admin.queue_stats("q")
            if stats.completed >= total or time.monotonic() - start > 240:
                break
            time.sleep(0.2)
        elapsed = time.monotonic() - start
        admin.enqueue("stop", "stop")  # the workers' sign to end
        done: Counter[str] = Counter()
        errors: list[str] = []
        for p in procs:
            out, _ = p.communicate(timeout=60)
            for line in out.splitlines():
                item = json.loads(line)
                if "done" in item:
                    done[item["done"]] += 1
                else:
                    errors.append(item["error"])
        admin.close()
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    print(json.dumps({
        "workers": args.workers, "pool_size": args.pool_size,
        "bouncer_pool": args.bouncer_pool, "jobs": total, "done": len(done),
        "done_twice": sum(1 for v in done.values() if v > 1), "errors": len(errors),
        "first_errors": errors[:3], "enqueue_errors": enqueue_errors,
        "seconds": round(elapsed, 2), "listen": not args.no_listen,
    }))


def _base_url() -> str:
    import os

    url = os.environ["CONSENSUS_LEASE_POSTGRES_URL"]
    return "postgresql://" + url.split("://", 1)[1]


if __name__ == "__main__":
    main()
