"""Many sessions in one process on a busy host share the store's renewal threads (and on
etcd its keepalive streams), not their failures: a slow answer to one session's keepalive
never ends another session. On etcd and on ZooKeeper (one connection per session)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from consensus_lease import SessionState, open_store

SESSIONS = {"etcd": 300, "zookeeper": 200}  # ZooKeeper: a connection and a thread each
TTL_S = {"etcd": 2.0, "zookeeper": 4.0}
"""etcd: the kit's minimum, a keepalive every 0.67 s (450 a second in all); ZooKeeper:
kazoo's connection threads (one per session) must also answer its pings in time."""
HOLD_S = 15.0
HOGS = 1
"""A busy loop on the client's core, which leaves the client about half of it (the
issue's "a CPU hog beside it"). Two left it a third, and on a 2-core CI machine with
anything else running the smallest headroom fell to 0.19 s of the 1.8 s (etcd, TTL 2 s):
fresh-clone runs lost 20 of 300 etcd sessions, and a ZooKeeper run its first session
while the other 199 opened."""
HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
"""A busy loop that ends when its parent does (an interrupted run leaves none behind)."""


@contextmanager
def client_core_kept_busy() -> Iterator[None]:
    """Busy-loop processes beside this thread, all on one core: the client (this thread,
    and every thread it starts meanwhile) shares that core with the busy loops, and the
    servers keep the other cores. What is under test is a busy *client* host: with the
    busy loops free on both cores of this 2-core machine, the three ZooKeeper members
    were starved too (a CI run saw the ensemble itself expire sessions, 171 of 200 lost),
    which says nothing about the client. The busy loops are killed by PID."""
    cores = sorted(os.sched_getaffinity(0))
    one = {cores[0]}
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(HOGS)]
    try:
        for hog in hogs:
            os.sched_setaffinity(hog.pid, one)
        os.sched_setaffinity(0, one)
        yield
    finally:
        os.sched_setaffinity(0, set(cores))
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(timeout=30)


@pytest.mark.parametrize("store_kind", ["etcd", "zookeeper"])
def test_many_sessions_on_a_busy_host_are_not_lost(
    store_kind: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    """300 (etcd) or 200 (ZooKeeper) sessions of TTL 2 s (4 s) in one process, opened at once
    (their keepalives come in bursts), held for 15 s while a busy loop shares the
    client's core: none is lost. Answers come late on such a host (p99 of hundreds of ms); when
    one late answer tore down etcd's shared stream, every keepalive waiting on it failed
    with it, and a third of the sessions were lost within seconds; with two threads per
    session (before the shared renewal scheduler) 2,000 sessions lost 1,546."""
    cluster = request.getfixturevalue(f"{store_kind}_cluster")
    count = SESSIONS[store_kind]
    with client_core_kept_busy(), open_store(cluster.url_with_prefix(key_prefix)) as store:
        with ThreadPoolExecutor(20) as pool:
            sessions = list(pool.map(lambda i: store.session(f"w{i}", TTL_S[store_kind]), range(count)))
        try:
            held = sessions[0].claim("job")
            assert held is not None
            end = time.monotonic() + HOLD_S
            while time.monotonic() < end:
                lost = [s for s in sessions if s.state is SessionState.LOST]
                assert not lost, (f"{len(lost)} of {count} sessions lost: "
                                  f"{[str(s.lost_reason) for s in lost[:3]]}")
                time.sleep(0.2)  # real time must pass: the sessions must outlive their TTL
            held.ensure_held()
        finally:
            with ThreadPoolExecutor(20) as pool:
                list(pool.map(lambda s: s.close(), sessions))
