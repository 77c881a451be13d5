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
from consensus_lease.errors import BackendUnavailable
from consensus_lease.testing.conformance import poll_until

SESSIONS = 100
OPENED_DURING = 40
"""Sessions opened while no member serves (as a worker's slots open new ones after an
outage longer than their TTL): their clients have never connected."""
TTL_S = 30.0  # the outage (kill, 4 s, restart, election) must fit well inside it
OUTAGE_S = 4.0


def test_sessions_reconnect_paced_while_no_member_serves(
    zookeeper_cluster: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 sessions, every member SIGKILLed for 4 s, and 40 more sessions opened
    meanwhile. Each session client used to try every host on its own back-off (at most
    a second): some 3,600 connection attempts in those 4 s for the 100, and with 10
    processes of 1,000 sessions a load of 500-600 on this 2-core machine that kept an
    election from ending for 70 s. The clients of sessions being opened were not paced
    at first (a newcomer's run: 20 of them made 885 attempts in 4 s). Paced, the store
    makes one round per 0.1 s once every client has failed its first: at most 3 hosts x
    (2 rounds a client + 2 x 40 turns). Once the ensemble is back (ZooKeeper keeps
    sessions across a restart of every member), each session is ACTIVE again and still
    holds its job; each of the 40 opens either gives a session or, past its connect
    timeout, ``BackendUnavailable``."""
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
            opening = ThreadPoolExecutor(OPENED_DURING)
            try:
                poll_until(lambda: all(s.state is SessionState.SUSPENDED for s in sessions), 15.0)
                before = connects[0]
                opens = [opening.submit(store.session, f"new{i}", TTL_S)
                         for i in range(OPENED_DURING)]
                time.sleep(OUTAGE_S)  # real time must pass: the outage's length
                during = connects[0] - before
            finally:
                for member in cluster.members:
                    cluster.restart(member, ready_timeout_s=None)
                cluster.wait_ready(60.0)
                opening.shutdown(wait=True)
            for future in opens:
                error = future.exception()
                if error is None:
                    future.result().close()
                else:
                    assert isinstance(error, BackendUnavailable), repr(error)
            poll_until(lambda: all(s.state is SessionState.ACTIVE for s in sessions), TTL_S / 2)
            for lease in leases:
                assert lease is not None
                lease.ensure_held()
            bound = 3 * (2 * (SESSIONS + OPENED_DURING) + 2 * OUTAGE_S / TURN_INTERVAL_S)
            print(f"connection attempts in the {OUTAGE_S:g} s outage: {during} (bound {bound:g})")
            assert during <= bound, (during, bound)
        finally:
            with ThreadPoolExecutor(20) as pool:
                list(pool.map(lambda s: s.close(), sessions))
