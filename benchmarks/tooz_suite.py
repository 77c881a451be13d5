"""tooz's own test suite on our driver, beside tooz's own drivers on the same servers.

``python benchmarks/tooz_suite.py [--stores sqlite,etcd,zk,postgresql] [--out FILE.md]``

Starts a 3-member etcd 3.4 cluster and a 3-member ZooKeeper 3.8 ensemble with the
container kit (Docker engine and the kit's images: ``docker/build-images.sh``) and takes
PostgreSQL from ``$CONSENSUS_LEASE_POSTGRES_URL`` (``eval "$(bash
scripts/start-postgres.sh)"``). Then runs ``pytest --pyargs tooz.tests.test_coordination``
(:func:`consensus_lease.testing.tooz_suite.run_tooz_suite`) once per URL, one after the
other:

* ours: ``consensus-lease+sqlite``, ``consensus-lease+etcd`` (3 members),
  ``consensus-lease+zk`` (3 members), ``consensus-lease+postgresql``;
* tooz's ``zookeeper`` driver (kazoo) on the same ensemble, tooz's ``etcd3+http``
  driver (etcd3gw, etcd 3.4's ``/v3`` gateway on one member's client port) on the same
  cluster.

Prints (and with ``--out`` writes) a Markdown table: passed / skipped / failed / errors and
wall time per URL, and every skip reason. ``make test`` runs only ours
(``tests/integrations/test_tooz_suite.py``); this comparison costs about 4 minutes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

from consensus_lease.testing import engine
from consensus_lease.testing.cluster import EtcdCluster, ZooKeeperCluster
from consensus_lease.testing.postgresql import POSTGRES_ENV, fresh_schema
from consensus_lease.testing.tooz_suite import SuiteCounts, run_tooz_suite

TITLE = "tooz's own test suite per driver and store"


def _pg_base() -> str | None:
    url = os.environ.get(POSTGRES_ENV, "").strip()
    if not url:
        return None
    rest = url.split("://", 1)[1]
    return f"postgresql://{rest}"


def _table(rows: list[tuple[str, str, SuiteCounts]]) -> str:
    lines = ["| driver | store | passed | skipped | failed | errors | of | wall s |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for driver, store, c in rows:
        lines.append(f"| {driver} | {store} | {c.passed} | {c.skipped} | {c.failed} | "
                     f"{c.errors} | {c.tests} | {c.wall_s:.0f} |")
    lines.append("")
    for driver, store, c in rows:
        for name, reason in sorted(c.skips.items()):
            lines.append(f"* {driver} on {store}: `{name}` skipped: {reason}")
        for name, text in sorted(c.problems.items()):
            lines.append(f"* {driver} on {store}: `{name}` FAILED: {text.splitlines()[0]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,etcd,zk,postgresql")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the table there too (benchmarks/results/tooz_suite.md)")
    args = parser.parse_args(argv)
    stores = set(args.stores.split(","))
    run = uuid.uuid4().hex[:8]
    rows: list[tuple[str, str, SuiteCounts]] = []

    def record(driver: str, store: str, url: str) -> None:
        counts = run_tooz_suite(url, timeout_s=900.0)
        print(f"{driver} on {store}: {counts.summary()}", flush=True)
        rows.append((driver, store, counts))

    etcd = zk = None
    try:
        if "etcd" in stores:
            etcd = EtcdCluster(image=engine.etcd_image(), image_style=engine.image_style())
            etcd.start(timeout_s=90.0)
        if "zk" in stores:
            zk = ZooKeeperCluster(image=engine.zookeeper_image(),
                                  image_style=engine.image_style())
            zk.start(timeout_s=90.0)
        if "sqlite" in stores:
            with tempfile.TemporaryDirectory(prefix="tooz-sqlite-") as tmp:
                record("consensus_lease", "SQLite", f"consensus-lease+sqlite:///{tmp}/t.db")
        if etcd is not None:
            record("consensus_lease", "etcd 3-member",
                   f"consensus-lease+{etcd.url_with_prefix(f'tooz-{run}')}")
            record("tooz etcd3gw", "etcd 3-member", f"etcd3+http://{etcd.endpoints[0]}")
        if zk is not None:
            record("consensus_lease", "ZooKeeper 3-member",
                   f"consensus-lease+{zk.url_with_prefix(f'tooz-{run}')}")
            record("tooz zookeeper", "ZooKeeper 3-member",
                   f"zookeeper://{','.join(zk.endpoints)}/tooz-ref-{run}")
        if "postgresql" in stores:
            base = _pg_base()
            if base is None:
                print(f"PostgreSQL skipped: {POSTGRES_ENV} is not set", file=sys.stderr)
            else:
                with fresh_schema(base) as schema:  # dropped afterwards
                    record("consensus_lease", "PostgreSQL",
                           f"consensus-lease+{base}?schema={schema}")
    finally:
        for cluster in (etcd, zk):
            if cluster is not None:
                cluster.stop()
    text = _table(rows)
    print(text)
    if args.out is not None:  # the guide includes the table section (docs/integrations/tooz.md)
        args.out.write_text(f"# {TITLE}\n\n(`python benchmarks/tooz_suite.py --out ...`)\n\n"
                            f"<!-- --8<-- [start:table] -->\n{text}"
                            "<!-- --8<-- [end:table] -->\n")
    return 0 if all(c.failed == c.errors == 0 for d, _, c in rows
                    if d == "consensus_lease") else 1


if __name__ == "__main__":
    raise SystemExit(main())
