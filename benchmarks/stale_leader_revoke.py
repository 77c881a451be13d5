"""Issue 25's stale-leader scenario: how long two holders overlap when etcd revokes early.

``python benchmarks/stale_leader_revoke.py [--sessions 20] [--ttl-s 3] [--pause-s 5]``

Starts a 3-member etcd cluster with the container kit, opens
``--sessions`` sessions of ``--ttl-s`` in one store, each holding a job, and a contender
(another store, one session of ``--contender-ttl-s``) waiting on every job. Then the
leader is frozen (``docker pause``) for ``--pause-s`` and thawed. etcd 3.4.23
(etcd#15247) revokes leases about 50 ms after the thaw although the holders renewed with
the new leader.

Per job it prints, relative to the thaw (monotonic seconds of this process): the owner
key's deletion as a raw watch saw it, the contender's claim (returned), and the last
time the holder's ``ensure_held()`` passed. Overlap = last pass - claim (positive: two
holders); loss - deletion = how long after the store's revocation the holder learnt it.
Bounded: each wait has a deadline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid

import grpc
from pyetcd import etcdrpc

from consensus_lease import open_store
from consensus_lease.errors import LeaseError
from consensus_lease.observe import Observer


class _Count(Observer):
    def __init__(self) -> None:
        self.early = 0

    def early_revocation(self, store: str, session_id: str, early_by_s: float) -> None:
        self.early += 1


def _deletions(endpoint: str, prefix: bytes, seen: dict[bytes, float],
               stop: threading.Event) -> None:
    """Record the arrival time of each owner-key DELETE under ``prefix`` (raw watch)."""
    channel = grpc.insecure_channel(endpoint)
    stub = etcdrpc.WatchStub(channel)

    def requests():  # type: ignore[no-untyped-def]
        yield etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
            key=prefix, range_end=prefix[:-1] + bytes([prefix[-1] + 1]),
            filters=[etcdrpc.WatchCreateRequest.NOPUT]))
        stop.wait()

    call = stub.Watch(requests())
    try:
        for response in call:
            now = time.monotonic()
            for event in response.events:
                key = bytes(event.kv.key)
                if key.endswith(b"/o"):
                    seen.setdefault(key, now)
    except grpc.RpcError:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--ttl-s", type=float, default=3.0)
    parser.add_argument("--pause-s", type=float, default=5.0)
    parser.add_argument("--contender-ttl-s", type=float, default=60.0,
                        help="long enough that the stale leader does not revoke it too")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    from consensus_lease.testing.cluster import EtcdCluster

    with EtcdCluster() as cluster:
        for round_ in range(args.rounds):
            run(cluster, args, round_)
    return 0


def run(cluster, args, round_: int) -> None:  # type: ignore[no-untyped-def]
    prefix = f"stale-{uuid.uuid4().hex[:8]}"
    url = cluster.url_with_prefix(prefix)
    n = args.sessions
    jobs = [f"job-{i}" for i in range(n)]
    count = _Count()
    holders_store = open_store(url, observer=count)
    contender_store = open_store(url)
    stop = threading.Event()
    deleted: dict[bytes, float] = {}
    root = f"/{prefix}/".encode()
    sessions = [holders_store.session(f"h{i}", args.ttl_s) for i in range(n)]
    leases = [s.claim(j) for s, j in zip(sessions, jobs, strict=True)]
    assert all(lease is not None for lease in leases)
    last_pass: dict[str, float] = {}
    claimed: dict[str, float] = {}

    def hold(lease) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + args.pause_s + 30
        while time.monotonic() < deadline:
            try:
                lease.ensure_held()
            except LeaseError:
                return
            last_pass[lease.job_id] = time.monotonic()
            time.sleep(0.001)  # polling ensure_held as a worker would before each effect

    contender = contender_store.session("contender", args.contender_ttl_s)

    def contend(job: str) -> None:
        try:
            contender.claim(job, wait_s=args.pause_s + 30)
            claimed[job] = time.monotonic()
        except LeaseError as exc:
            print(f"  contender {job}: {exc}", file=sys.stderr)

    threads = [threading.Thread(target=hold, args=(lease,), daemon=True) for lease in leases]
    threads += [threading.Thread(target=contend, args=(j,), daemon=True) for j in jobs]
    for t in threads:
        t.start()
    leader = cluster.leader(timeout_s=15.0)
    follower = next(m for m in cluster.members if m is not leader)
    watcher = threading.Thread(target=_deletions, args=(follower.endpoint, root, deleted, stop),
                               daemon=True)
    watcher.start()
    time.sleep(1.0)  # the contenders are waiting (pacing the fault: real time must pass)
    cluster.pause(leader)
    time.sleep(args.pause_s)  # the fault's length: real time must pass
    cluster.unpause(leader)
    thawed = time.monotonic()
    for t in threads:
        t.join(timeout=args.pause_s + 35)
    stop.set()
    overlaps, lags = [], []
    for job in jobs:
        key = root + job.encode().hex().encode() + b"/o"
        d, c, p = deleted.get(key), claimed.get(job), last_pass.get(job)
        if c is not None and p is not None:
            overlaps.append(p - c)
        if d is not None and p is not None:
            lags.append(p - d)
    print(f"round {round_}: leader {leader.name} paused {args.pause_s} s; "
          f"{len(claimed)}/{n} claimed by the contender, {len(deleted)} deletions seen, "
          f"early_revocations counted {count.early}")
    if deleted:
        first = min(deleted.values()) - thawed
        print(f"  deletions at +{first:.3f} .. +{max(deleted.values()) - thawed:.3f} s after thaw")
    if claimed:
        print(f"  claims at +{min(claimed.values()) - thawed:.3f} .. "
              f"+{max(claimed.values()) - thawed:.3f} s")
    if overlaps:
        two = [o for o in overlaps if o > 0]
        print(f"  two-holder overlap (last ensure_held pass - contender's claim): "
              f"{len(two)}/{len(overlaps)} positive, max {max(overlaps) * 1000:.0f} ms, "
              f"median {statistics.median(overlaps) * 1000:.0f} ms")
    if lags:
        print(f"  holder's last pass - deletion seen: max {max(lags) * 1000:.0f} ms, "
              f"median {statistics.median(lags) * 1000:.0f} ms")
    for s in sessions:
        s.close()
    contender.close()
    holders_store.close()
    contender_store.close()


if __name__ == "__main__":
    sys.exit(main())
