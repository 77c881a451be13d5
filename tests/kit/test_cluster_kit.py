"""The cluster kit itself: real 3-member etcd and ZooKeeper clusters, and their faults.

Uses the raw clients (pyetcd, kazoo), not the library, so a failure here points
at the kit. Every wait is bounded.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

from consensus_lease.testing.cluster import (
    Cluster,
    EtcdCluster,
    Member,
    MemberState,
    ZooKeeperCluster,
    leftovers,
)
from consensus_lease.testing.pytest_plugin import KitImages

pyetcd = pytest.importorskip("pyetcd")
kazoo_client = pytest.importorskip("kazoo.client")
kazoo_exceptions = pytest.importorskip("kazoo.exceptions")
kazoo_threading = pytest.importorskip("kazoo.handlers.threading")

pytestmark = pytest.mark.containers

CLIENT_GID = 4999  # a gid no member uses: the "worker" cut off by cut_client()
RECOVERY_S = 20.0
T = TypeVar("T")


def eventually(action: Callable[[], T], timeout_s: float = RECOVERY_S) -> T:
    """``action()``'s result once it stops raising; re-raises its last error at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return action()
        except Exception:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)  # poll interval inside a deadline loop


@contextmanager
def etcd(member: Member, timeout_s: float = 2.0) -> Iterator[Any]:
    client = pyetcd.client(
        member.address,
        member.client_port,
        timeout=timeout_s,
        grpc_options=[("grpc.enable_http_proxy", 0)],
    )
    try:
        yield client
    finally:
        client.close()


def etcd_put_get(writer: Member, reader: Member, key: str, value: bytes) -> None:
    # New clients each try: pyetcd marks a failed endpoint unusable for minutes.
    with etcd(writer) as w:
        w.put(key, value)
    with etcd(reader) as r:
        assert r.get(key)[0] == value


@contextmanager
def zk(*members: Member, chroot: str = "", timeout_s: float = 10.0) -> Iterator[Any]:
    hosts = ",".join(m.endpoint for m in members) + (f"/{chroot}" if chroot else "")
    client = kazoo_client.KazooClient(hosts=hosts, timeout=4.0)
    client.start(timeout=timeout_s)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def zk_put_get(writer: Member, reader: Member, path: str, value: bytes) -> None:
    with zk(writer) as w:
        w.ensure_path(path)
        w.set(path, value)
    with zk(reader) as r:
        r.sync(path)
        assert r.get(path)[0] == value


def restart_everyone(cluster: Cluster) -> None:
    for member in cluster.members:
        cluster.kill(member)
    for member in cluster.members:
        cluster.restart(member, ready_timeout_s=None)
    cluster.wait_ready(RECOVERY_S)


def others(cluster: Cluster, *excluded: Member) -> list[Member]:
    return [m for m in cluster.members if m not in excluded]


def can_connect_as(gid: int, member: Member, timeout_s: float = 1.0) -> bool:
    """Whether a process with group ``gid`` can open a TCP connection to the member."""
    probe = (
        "import socket, sys; "
        f"socket.create_connection(({member.address!r}, {member.client_port}), timeout={timeout_s})"
    )
    done = subprocess.run(
        ["setpriv", f"--regid={gid}", "--clear-groups", sys.executable, "-c", probe],
        capture_output=True,
        timeout=timeout_s + 10,
    )
    return done.returncode == 0


# -- etcd --------------------------------------------------------------------------------


def test_etcd_cluster_serves_and_has_a_leader(etcd_cluster: EtcdCluster, key_prefix: str) -> None:
    assert len(etcd_cluster.members) == 3
    assert etcd_cluster.client_url.startswith("etcd://127.0.")
    assert etcd_cluster.url_with_prefix(key_prefix).endswith(f"/{key_prefix}")
    assert etcd_cluster.leader() in etcd_cluster.members
    first, _, last = etcd_cluster.members
    etcd_put_get(first, last, f"/{key_prefix}/k", b"v1")


def test_etcd_stops_writes_without_quorum_and_recovers(
    etcd_cluster: EtcdCluster, key_prefix: str
) -> None:
    survivor, *paused = etcd_cluster.members
    for member in paused:
        etcd_cluster.pause(member)
    with etcd(survivor, timeout_s=1.0) as client:
        started = time.monotonic()
        # The client's 1 s deadline passes, or etcd gives up first ("etcdserver:
        # request timed out", UNAVAILABLE) when its leader steps down for want of quorum.
        with pytest.raises(
            (pyetcd.exceptions.ConnectionTimeoutError, pyetcd.exceptions.ConnectionFailedError)
        ):
            client.put(f"/{key_prefix}/k", b"lost")
        assert time.monotonic() - started < 3.0
    for member in paused:
        etcd_cluster.unpause(member)
    eventually(lambda: etcd_put_get(survivor, paused[0], f"/{key_prefix}/k", b"back"))


def test_etcd_survives_killing_the_leader(fresh_etcd_cluster: EtcdCluster, key_prefix: str) -> None:
    cluster = fresh_etcd_cluster
    victim = cluster.leader()
    cluster.kill(victim)
    a, b = others(cluster, victim)
    eventually(lambda: etcd_put_get(a, b, f"/{key_prefix}/k", b"two-left"))
    assert cluster.leader() in (a, b)
    cluster.restart(victim, ready_timeout_s=RECOVERY_S)
    eventually(lambda: etcd_put_get(a, victim, f"/{key_prefix}/k", b"three-again"))
    restart_everyone(cluster)  # no member to copy from: data must have survived in each
    with etcd(victim) as client:
        assert eventually(lambda: client.get(f"/{key_prefix}/k"))[0] == b"three-again"


def test_etcd_isolated_leader_is_replaced(etcd_cluster: EtcdCluster, key_prefix: str) -> None:
    old = etcd_cluster.leader()
    with etcd_cluster.isolate(old):
        a, b = others(etcd_cluster, old)
        eventually(lambda: etcd_put_get(a, b, f"/{key_prefix}/k", b"majority"))
        new = eventually(lambda: _leader_other_than(etcd_cluster, old))
        assert new in (a, b)
    etcd_cluster.wait_ready(RECOVERY_S)
    eventually(lambda: etcd_put_get(a, old, f"/{key_prefix}/k", b"healed"))


def _leader_other_than(cluster: Cluster, old: Member) -> Member:
    leader = cluster.leader(timeout_s=1.0)
    assert leader is not old
    return leader


# -- ZooKeeper ---------------------------------------------------------------------------


def test_zookeeper_ensemble_serves_and_has_a_leader(
    zookeeper_cluster: ZooKeeperCluster, key_prefix: str
) -> None:
    assert zookeeper_cluster.client_url.startswith("zk://127.0.")
    assert zookeeper_cluster.leader() in zookeeper_cluster.members
    first, _, last = zookeeper_cluster.members
    zk_put_get(first, last, f"/{key_prefix}/n", b"v1")
    with zk(*zookeeper_cluster.members, chroot=key_prefix) as chrooted:
        assert chrooted.get("/n")[0] == b"v1"


def test_zookeeper_stops_writes_without_quorum_and_recovers(
    zookeeper_cluster: ZooKeeperCluster, key_prefix: str
) -> None:
    survivor, *paused = zookeeper_cluster.members
    with zk(survivor) as client:
        client.ensure_path(f"/{key_prefix}")
        for member in paused:
            zookeeper_cluster.pause(member)
        with pytest.raises((kazoo_threading.KazooTimeoutError, kazoo_exceptions.ConnectionLoss)):
            client.create_async(f"/{key_prefix}/n", b"lost").get(timeout=2.0)
    for member in paused:
        zookeeper_cluster.unpause(member)
    zookeeper_cluster.wait_ready(RECOVERY_S)
    eventually(lambda: zk_put_get(survivor, paused[0], f"/{key_prefix}/n", b"back"))


def test_zookeeper_survives_killing_the_leader(
    fresh_zookeeper_cluster: ZooKeeperCluster, key_prefix: str
) -> None:
    cluster = fresh_zookeeper_cluster
    victim = cluster.leader()
    cluster.kill(victim)
    a, b = others(cluster, victim)
    eventually(lambda: zk_put_get(a, b, f"/{key_prefix}/n", b"two-left"))
    assert cluster.leader() in (a, b)
    cluster.restart(victim, ready_timeout_s=RECOVERY_S)
    eventually(lambda: zk_put_get(a, victim, f"/{key_prefix}/n", b"three-again"))
    restart_everyone(cluster)  # no member to copy from: data must have survived in each
    with zk(victim) as client:
        assert client.get(f"/{key_prefix}/n")[0] == b"three-again"


def test_zookeeper_isolated_leader_is_replaced(
    zookeeper_cluster: ZooKeeperCluster, key_prefix: str
) -> None:
    old = zookeeper_cluster.leader()
    with zookeeper_cluster.isolate(old):
        a, b = others(zookeeper_cluster, old)
        new = eventually(lambda: _leader_other_than(zookeeper_cluster, old))
        assert new in (a, b)
        eventually(lambda: zk_put_get(a, b, f"/{key_prefix}/n", b"majority"))
    zookeeper_cluster.wait_ready(RECOVERY_S)
    eventually(lambda: zk_put_get(a, old, f"/{key_prefix}/n", b"healed"))


def test_zookeeper_wipe_loses_the_whole_history(
    fresh_zookeeper_cluster: ZooKeeperCluster, key_prefix: str
) -> None:
    cluster = fresh_zookeeper_cluster
    first, *_ = cluster.members
    with zk(*cluster.members) as client:
        client.ensure_path(f"/{key_prefix}/n")
        for i in range(20):
            client.set(f"/{key_prefix}/n", b"%d" % i)
        seen_zxid = client.last_zxid
    assert cluster.wipe() > 0
    assert [m.state for m in cluster.members] == [MemberState.RUNNING] * 3
    with zk(first) as client:  # a fresh client: no newer zxid for the members to refuse
        assert client.exists(f"/{key_prefix}") is None
        client.ensure_path(f"/{key_prefix}/n")
        assert client.exists(f"/{key_prefix}/n").version == 0
        assert client.last_zxid < seen_zxid  # the history started again
    assert cluster.leader() in cluster.members


# -- partitions and cleanup --------------------------------------------------------------


def test_cut_client_blocks_one_gid_until_healed(etcd_cluster: EtcdCluster) -> None:
    target, untouched, _ = etcd_cluster.members
    assert can_connect_as(CLIENT_GID, target)
    with etcd_cluster.cut_client(CLIENT_GID, target):
        assert not can_connect_as(CLIENT_GID, target)
        assert can_connect_as(CLIENT_GID, untouched)
        assert can_connect_as(CLIENT_GID + 1, target)
    assert can_connect_as(CLIENT_GID, target)


def test_partition_between_members_blocks_their_gids(etcd_cluster: EtcdCluster) -> None:
    a, b, c = etcd_cluster.members
    cut = etcd_cluster.partition(a, b)
    assert not can_connect_as(a.gid, b)
    assert not can_connect_as(b.gid, a)
    assert can_connect_as(a.gid, c)
    cut.heal()
    assert can_connect_as(a.gid, b)
    assert can_connect_as(b.gid, a)


def test_stop_leaves_no_container_and_no_rule(docker_engine: KitImages) -> None:
    cluster = EtcdCluster(image=docker_engine.etcd, image_style=docker_engine.style)
    with cluster:
        assert cluster.slot is not None
        cluster.partition(cluster.members[0], cluster.members[1])
        cluster.cut_client(CLIENT_GID)
        assert len([x for x in leftovers(cluster=cluster.name) if x.startswith("rule")]) == 5
    assert leftovers(cluster=cluster.name) == []
