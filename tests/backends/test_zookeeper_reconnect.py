"""While no member of the ensemble serves, a store's many sessions reconnect at a paced
rate, not each on its own back-off; once the ensemble is back every session reconnects
and keeps its leases (:mod:`consensus_lease.backends.zookeeper._transport_reconnect`)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from consensus_lease import SessionState, open_store
from consensus_lease.backends.zookeeper._transport_kazoo import PollHandler
from consensus_lease.backends.zookeeper._transport_reconnect import TURN_INTERVAL_S
from consensus_lease.testing.conformance import poll_until

SESSIONS = 100
TTL_S = 30.0  # the outage (kill, 4 s, restart, election) must fit well inside it
OUTAGE_S = 4.0


def test_sessions_reconnect_paced_while_no_member_serves(
    zookeeper_cluster: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 sessions, every member SIGKILLed for 4 s. Each session client used to try
    every host on its own back-off (at most a second): some 3,600 connection attempts
    in those 4 s, and with 10 processes of 1,000 sessions a load of 500-600 on this
    2-core machine that kept an election from ending for 70 s. Paced, the store makes
    one round per 0.1 s once every client has failed its first: at most 3 hosts x (2
    rounds a client + 2 x 40 turns). Once the ensemble is back (ZooKeeper keeps
    sessions across a restart of every member), each session is ACTIVE again and still
    holds its job."""
    cluster = zookeeper_cluster
    connects = [0]
    lock = threading.Lock()
    create_connection = PollHandler.create_connection

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            connects[0] += 1
        return create_connection(self, *args, **kwargs)

    monkeypatch.setattr(PollHandler, "create_connection", counted)
    with open_store(cluster.url_with_prefix(key_prefix)) as store:
        with ThreadPoolExecutor(20) as pool:
            sessions = list(pool.map(lambda i: store.session(f"w{i}", TTL_S), range(SESSIONS)))
            leases = list(pool.map(lambda i: sessions[i].claim(f"job-{i}"), range(SESSIONS)))
        try:
            assert all(lease is not None for lease in leases)
            for member in cluster.members:
                cluster.kill(member)
            try:
                poll_until(lambda: all(s.state is SessionState.SUSPENDED for s in sessions), 15.0)
                before = connects[0]
                time.sleep(OUTAGE_S)  # real time must pass: the outage's length
                during = connects[0] - before
            finally:
                for member in cluster.members:
                    cluster.restart(member, ready_timeout_s=None)
                cluster.wait_ready(60.0)
            poll_until(lambda: all(s.state is SessionState.ACTIVE for s in sessions), TTL_S / 2)
            for lease in leases:
                assert lease is not None
                lease.ensure_held()
            bound = 3 * (2 * SESSIONS + 2 * OUTAGE_S / TURN_INTERVAL_S)
            print(f"connection attempts in the {OUTAGE_S:g} s outage: {during} (bound {bound:g})")
            assert during <= bound, (during, bound)
        finally:
            with ThreadPoolExecutor(20) as pool:
                list(pool.map(lambda s: s.close(), sessions))
