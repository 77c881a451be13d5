"""Issue 25, item 6: the heap a ZooKeeper member needs when the store is full and a
member rejoins by snapshot (SNAP), measured on a real 3-member ensemble.

``python benchmarks/zk_heap_resync.py [--heap-mb 256] [--store-max-jobs 18000]
[--store-max-bytes 8388608] [--payload-bytes 100] [--id-chars 120] [--writes 2000]
[--write-bytes 100] [--force-snap] [--rejoin follower,leader,paused-leader]
[--out FILE.json] [--logs-dir DIR] [--deadline-s 900]``

Starts a 3-member ensemble with the container kit (each member ``-Xmx{heap}m``, the
kit's serial collector, every collection logged to its console with ``-Xlog:gc``) on
loopback, opens a store with the given ``store_max_jobs`` / ``store_max_bytes``, and
fills three queues in turn with ``enqueue_many`` until the store refuses with
``QueueFull`` (chunks halve on each refusal down to single jobs, so the store ends
full to the job or the byte). Then:

1. a full collection on each member (``jcmd PID GC.run`` from the host), so its GC log
   says the live heap of the full tree;
2. for each member named by ``--rejoin`` (``follower``: one follower, ``leader``: the
   leader of that moment, both SIGKILLed and started again; ``paused-leader``: the
   leader frozen with ``docker pause`` and thawed once another leads, as a deposed
   leader): take it away, write ``--writes`` transactions of ``--write-bytes`` (``set``
   of one znode outside the store: the tree does not grow) so that its last zxid falls out of the
   leader's committed log (``zookeeper.commitLogCount``, 500), bring it back and wait
   until it serves and has synced; its log says how it synced (SNAP expected), and
   every member's GC log over the rejoin gives its heap peak (largest heap used before
   a collection) and its largest heap after one (the live set's upper bound), then a
   full collection its live set after the rejoin;
3. checks the ensemble survived: all three members serve, an enqueue still gets
   ``QueueFull`` (not ``OutcomeUnknown``), no ``OutOfMemoryError`` in any log.

Prints one JSON document (also to ``--out``). Heap figures are the JVM's own (GC log,
MB = MiB), VmHWM / VmRSS of the java process from ``/proc`` beside them. Every wait
has a deadline; the whole run stops at ``--deadline-s``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from consensus_lease import LeaseStore, OutcomeUnknown, QueueFull, open_store
from consensus_lease.testing.cluster import Member, ZooKeeperCluster

GC_LINE = re.compile(
    r"\[(?P<up>[\d.]+)s\].*GC\(\d+\) (?P<kind>Pause \w+) \((?P<cause>.*?)\) "
    r"(?P<before>\d+)M->(?P<after>\d+)M\((?P<total>\d+)M\)")
QUEUES = ("heap-q1", "heap-q2", "heap-q3")


@dataclass
class Heap:
    """One member's GC log over a window: MiB."""

    collections: int = 0
    full: int = 0
    peak_used_mb: int = 0  # largest heap used before a collection
    max_after_mb: int = 0  # largest heap left after a collection (live set's upper bound)
    last_full_after_mb: int | None = None  # after the last full collection: the live set
    committed_mb: int = 0
    vm_hwm_mb: float | None = None
    vm_rss_mb: float | None = None


@dataclass
class Fill:
    jobs: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    per_queue: dict[str, int] = field(default_factory=dict)
    refusal: str = ""
    outcome_unknown: int = 0


def gc_heap(log: str) -> Heap:
    """The collections in ``log`` (a member's console, ``-Xlog:gc``)."""
    heap = Heap()
    for match in GC_LINE.finditer(log):
        before, after = int(match["before"]), int(match["after"])
        heap.collections += 1
        heap.peak_used_mb = max(heap.peak_used_mb, before)
        heap.max_after_mb = max(heap.max_after_mb, after)
        heap.committed_mb = max(heap.committed_mb, int(match["total"]))
        if match["kind"] == "Pause Full":
            heap.full += 1
            heap.last_full_after_mb = after
    return heap


def java_pid(member: Member) -> int:
    container = member.docker()
    container.reload()
    return int(container.attrs["State"]["Pid"])


def proc_memory(pid: int) -> tuple[float | None, float | None]:
    """VmHWM and VmRSS of ``pid`` in MiB (None if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None, None
    values = {k: int(v.split()[0]) / 1024 for k, v in
              (line.split(":", 1) for line in text.splitlines() if line.startswith("Vm"))}
    return values.get("VmHWM"), values.get("VmRSS")


def full_collection(member: Member) -> str:
    """``jcmd PID GC.run`` from the host (the JDK's attach works across the container's
    namespaces as root); returns its output or why it failed."""
    try:
        done = subprocess.run(["jcmd", str(java_pid(member)), "GC.run"], capture_output=True,
                              text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"jcmd failed: {exc!r}"
    return (done.stdout + done.stderr).strip()[-200:]


def fill(store: LeaseStore, payload: bytes, id_chars: int, deadline: float) -> Fill:
    """Fill the queues in turn until a single enqueue is refused with QueueFull."""
    result, chunk, n = Fill(per_queue=dict.fromkeys(QUEUES, 0)), 1000, 0
    started = time.monotonic()
    while time.monotonic() < deadline:
        queue = QUEUES[(n // 1000) % len(QUEUES)]
        ids = [f"{queue}-{n + i:07d}-".ljust(id_chars, "z") for i in range(chunk)]
        try:
            store.enqueue_many(queue, [(job, payload) for job in ids])
        except QueueFull as exc:
            if chunk == 1:
                result.refusal = str(exc)
                break
            chunk = max(1, chunk // 2)
            continue  # the chunks before the refused one are in: the retry skips them
        except OutcomeUnknown:
            result.outcome_unknown += 1
            continue
        n += chunk
    result.seconds = round(time.monotonic() - started, 1)
    # counted by the store (a refused call's earlier multis are in)
    result.per_queue = {q: store.queue_stats(q).available for q in QUEUES}
    result.jobs = sum(result.per_queue.values())
    result.payload_bytes = result.jobs * len(payload)
    return result


def push_out_of_committed_log(cluster: ZooKeeperCluster, absent: Member, writes: int,
                              size: int, path: str) -> None:
    """``writes`` ``set``s of ``size`` bytes to one znode, on the members still up."""
    hosts = ",".join(m.endpoint for m in cluster.members if m is not absent)
    client = KazooClient(hosts=hosts, timeout=30)
    client.start(timeout=30)
    try:
        client.ensure_path(path)
        for start in range(0, writes, 20):  # 20 in flight (3 MB at 160 KB)
            pending = [client.set_async(path, (b"%d-" % i).ljust(size, b"w"))
                       for i in range(start, min(writes, start + 20))]
            for answer in pending:
                answer.get(timeout=30)
    finally:
        client.stop()
        client.close()


def heaps(cluster: ZooKeeperCluster, since: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each member's GC figures from its log after ``since[name]`` characters."""
    out = {}
    for member in cluster.members:
        log = cluster.logs(member)
        heap = gc_heap(log[since.get(member.name, 0):])
        heap.vm_hwm_mb, heap.vm_rss_mb = proc_memory(java_pid(member))
        out[member.name] = asdict(heap)
    return out


def trees(cluster: ZooKeeperCluster) -> dict[str, dict[str, str]]:
    """Each member's znode count and data bytes (``mntr``)."""
    keys = ("zk_znode_count", "zk_approximate_data_size", "zk_server_state")
    return {m.name: {k: v for k, v in cluster.mntr(m).items() if k in keys}
            for m in cluster.members}


def log_sizes(cluster: ZooKeeperCluster) -> dict[str, int]:
    return {m.name: len(cluster.logs(m)) for m in cluster.members}


def rejoin(cluster: ZooKeeperCluster, role: str, writes: tuple[int, int], path: str,
           ) -> dict[str, Any]:
    """Take the member of ``role`` away (``follower``, ``leader``: SIGKILL;
    ``paused-leader``: ``docker pause``), write past the committed log, bring it back,
    wait until it serves and has synced."""
    leader = cluster.leader()
    victim = leader if role.endswith("leader") else next(
        m for m in cluster.members if m is not leader)
    syncs_before = len(cluster.sync_modes(victim))
    if role == "paused-leader":
        cluster.pause(victim)
    else:
        cluster.kill(victim)
    cluster.leader(timeout_s=60)  # the others have one (a new one if the leader went)
    push_out_of_committed_log(cluster, victim, *writes, path)
    since = log_sizes(cluster)
    begun = time.monotonic()
    if role == "paused-leader":
        cluster.unpause(victim)
    else:
        cluster.restart(victim, ready_timeout_s=None)
    deadline = time.monotonic() + 180
    while len(cluster.sync_modes(victim)) == syncs_before or cluster.member_mode(victim) \
            not in ("leader", "follower"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{victim.name} did not sync within 180 s: "
                               + cluster.logs(victim, tail=30))
        time.sleep(0.2)
    ready_s = time.monotonic() - begun
    heap_window = heaps(cluster, since)  # the collections of the rejoin window
    for member in cluster.members:  # then the live set after it
        full_collection(member)
    live = {name: h["last_full_after_mb"] for name, h in heaps(cluster, since).items()}
    return {"role": role, "member": victim.name, "leader_before": leader.name,
            "leader_after": cluster.leader().name, "ready_s": round(ready_s, 1),
            "synced_by": cluster.sync_modes(victim)[syncs_before:],
            "heap": heap_window, "live_after_mb": live}


def statuses(cluster: ZooKeeperCluster) -> dict[str, dict[str, Any]]:
    """Each member's container status, ``srvr`` mode and whether it ran out of heap."""
    out = {}
    for member in cluster.members:
        container = member.docker()
        container.reload()
        log = cluster.logs(member)
        out[member.name] = {"status": container.status, "mode": cluster.member_mode(member),
                            "out_of_memory": "OutOfMemoryError" in log,
                            "log_tail": log.splitlines()[-8:]}
    return out


def survived(cluster: ZooKeeperCluster, store: LeaseStore, payload: bytes) -> dict[str, Any]:
    cluster.wait_ready(60)
    modes = {m.name: cluster.member_mode(m) for m in cluster.members}
    outcome = "accepted"
    try:
        store.enqueue(QUEUES[0], f"after-{uuid.uuid4().hex}", payload)  # as the fill's
    except QueueFull:
        outcome = "QueueFull"
    except OutcomeUnknown:
        outcome = "OutcomeUnknown"
    oom = [m.name for m in cluster.members if "OutOfMemoryError" in cluster.logs(m)]
    return {"modes": modes, "enqueue_after": outcome, "out_of_memory": oom}


def run(args: argparse.Namespace) -> dict[str, Any]:
    deadline = time.monotonic() + args.deadline_s
    chroot = f"heap-{uuid.uuid4().hex[:8]}"
    extra = {"forceSnapshotSync": "true"} if args.force_snap else {}
    with ZooKeeperCluster(heap_mb=args.heap_mb, jvm_flags=["-Xlog:gc:stdout"],
                          extra_config=extra) as cluster:
        url = (f"{cluster.url_with_prefix(chroot)}?store_max_jobs={args.store_max_jobs}"
               f"&store_max_bytes={args.store_max_bytes}")
        store = open_store(url, connect_timeout_s=30, timeout_s=60)
        try:
            filled = fill(store, b"p" * args.payload_bytes, args.id_chars, deadline)
            for member in cluster.members:
                full_collection(member)
            report: dict[str, Any] = {
                "setup": {k: v for k, v in vars(args).items()
                          if k not in ("out", "logs_dir")},
                "fill": asdict(filled), "tree": trees(cluster),
                "after_fill": heaps(cluster, {}), "rejoins": []}
            for role in args.rejoin.split(","):
                if time.monotonic() > deadline:
                    break
                try:
                    report["rejoins"].append(rejoin(
                        cluster, role, (args.writes, args.write_bytes), f"/{chroot}-w"))
                except Exception as exc:  # recorded with the members' state, not hidden
                    report["rejoins"].append({"role": role, "error": repr(exc),
                                              "members": statuses(cluster)})
                    break
            try:
                report["survived"] = survived(cluster, store, b"p" * args.payload_bytes)
            except Exception as exc:
                report["survived"] = {"error": repr(exc), "members": statuses(cluster),
                                      "enqueue_after": None, "out_of_memory": None}
            return report
        finally:
            store.close()
            if args.logs_dir is not None:
                args.logs_dir.mkdir(parents=True, exist_ok=True)
                for member in cluster.members:
                    (args.logs_dir / f"{member.name}.log").write_text(cluster.logs(member))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heap-mb", type=int, default=256)
    parser.add_argument("--store-max-jobs", type=int, default=18_000)
    parser.add_argument("--store-max-bytes", type=int, default=8_388_608)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--id-chars", type=int, default=120)
    parser.add_argument("--writes", type=int, default=2_000)
    parser.add_argument("--write-bytes", type=int, default=100,
                        help="data of each write; 160000 fills the committed log as "
                             "enqueue multis of 160 KB would (the rule's 80 MB)")
    parser.add_argument("--force-snap", action="store_true",
                        help="zookeeper.forceSnapshotSync: every sync is a SNAP (else the "
                             "leader sends a DIFF from its txn log when that is under a "
                             "third of its snapshot)")
    parser.add_argument("--rejoin", default="follower,leader,paused-leader")
    parser.add_argument("--deadline-s", type=float, default=900.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--logs-dir", type=Path, help="write each member's log there")
    args = parser.parse_args()
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    ok = report["survived"]["enqueue_after"] == "QueueFull" and not report["survived"][
        "out_of_memory"] and all(r.get("synced_by", [])[-1:] == ["SNAP"]
                                 for r in report["rejoins"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
