"""An asyncio worker cut off from the cluster has its guarded work cancelled.

The worker runs in its own process under its own group id; an iptables rule on that gid
cuts it from every member. Its guarded coroutine never checks the lease, yet it is
cancelled (and ``LeaseLost`` raised) once the local deadline passes without renewal —
before the store can give the job to anyone else.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from consensus_lease import open_store

WORKER_GID = 4292
TTL_S = 2.0

SCRIPT = """
import asyncio, sys, time
from consensus_lease import LeaseLost
from consensus_lease.aio import AsyncLeaseStore

async def main():
    store = await AsyncLeaseStore.open(sys.argv[1])
    session = await store.session("async-worker", float(sys.argv[2]))
    lease = await session.claim("job")
    print("claimed", lease.generation, flush=True)
    sys.stdin.readline()  # wait until the test has cut the network
    start = time.monotonic()
    try:
        async with lease.guard():
            await asyncio.sleep(120)  # work that never checks its lease
        print("finished-unguarded", flush=True)
    except LeaseLost:
        print("cancelled", round(time.monotonic() - start, 3), flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["etcd", "zookeeper"])
def test_partitioned_async_worker_is_cancelled_before_takeover(
    kind: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    cluster: Any = request.getfixturevalue(f"{kind}_cluster")
    url = cluster.url_with_prefix(key_prefix)
    proc = subprocess.Popen(
        ["setpriv", f"--regid={WORKER_GID}", "--clear-groups", sys.executable, "-c", SCRIPT,
         url, str(TTL_S)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        first = proc.stdout.readline().split()
        assert first and first[0] == "claimed", proc.stderr.read() if proc.stderr else ""
        generation = int(first[1])
        with cluster.cut_client(WORKER_GID), open_store(url) as store, \
                store.session("rival", 30.0) as rival:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            cut_at = time.monotonic()
            outcome = proc.stdout.readline().split()  # blocks until the guard ends
            stopped_after = time.monotonic() - cut_at
            assert outcome and outcome[0] == "cancelled", outcome
            # The store still had the job when the worker stopped: nobody took it over yet.
            taken = rival.claim("job", wait_s=10 * TTL_S + 20)
            taken_after = time.monotonic() - cut_at
            assert taken is not None and taken.generation > generation
            assert stopped_after < taken_after
            assert stopped_after <= TTL_S + 1.0
    finally:
        proc.kill()
        proc.communicate(timeout=30)
