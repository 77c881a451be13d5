"""The shared fault suite on a real 3-member etcd cluster in containers; leader churn
under many held leases; a silent follower under the sessions' keepalive streams."""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

import pytest
from etcd_local import use_member

from consensus_lease import LeaseState, open_store
from consensus_lease.observe import Observer
from consensus_lease.testing.conformance import poll_until
from consensus_lease.testing.faultsuite import ClusterFaultSuite


class TestEtcdClusterFaults(ClusterFaultSuite):
    ttl_s = 2.0  # etcd grants at least 1.5 x its election timeout (1 s in the kit)
    leader_ttl_s = 6.0

    @pytest.fixture
    def cluster(self, etcd_cluster: Any) -> Any:
        return etcd_cluster


class _Headroom(Observer):
    """Every renewal's headroom (seconds left before the local deadline) and time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.renewals: list[tuple[float, float]] = []  # (monotonic time, headroom_s)

    def renewed(self, store: str, latency_s: float, headroom_s: float) -> None:
        with self._lock:
            self.renewals.append((time.monotonic(), headroom_s))

    def since(self, start: float, end: float = float("inf")) -> list[float]:
        """Headrooms of the renewals answered at monotonic times in ``[start, end)``."""
        with self._lock:
            return [h for t, h in self.renewals if start <= t < end]


CHURN_TTL_S = 5.0
CHURN_SESSIONS = 20
CHURN_KILLS = 3
CHURN_SPACING_S = 2.0
CHURN_RAFT = {"heartbeat_interval_ms": 25, "election_timeout_ms": 250, "extra_args": ["--pre-vote"]}
"""Raft timing of the churn cluster. Each kill costs the cluster an election, during
which no member renews a lease: a renewal due then is answered when the new leader is
there, and leaves ``TTL - margin - TTL/3 - E`` (see
:mod:`consensus_lease.backends.etcd._transport_keepalive`). Measured here from kill to
the held renewals' answers, E was 0.8-1.2 s with a 500 ms election timeout (38% of the
TTL left at best, whatever the client does) and 0.6-0.7 s with 250 ms. Pre-vote keeps the restarted member from forcing a second
election when it comes back. So the assertion measures the client's share: what it
adds to the election (a stream left waiting on a dead or restarting member, an attempt
that gives up on a follower holding the renewal) comes off the 40%."""


def _churn_report(observer: _Headroom, kills: list[float]) -> str:
    """Per kill: seconds from the kill to the first renewal after it, and the smallest
    headroom of the renewals until the next kill."""
    parts = []
    for start, end in zip(kills, [*kills[1:], float("inf")], strict=True):
        after = [(t, h) for t, h in observer.renewals if start <= t < end]
        if after:
            parts.append(f"+{after[0][0] - start:.2f} s/{min(h for _, h in after):.2f} s")
        else:
            parts.append("none")
    return "kill -> first renewal/smallest headroom: " + ", ".join(parts)


@pytest.mark.parametrize("fresh_etcd_cluster", [CHURN_RAFT], indirect=True)
def test_leader_churn_keeps_renewal_headroom(fresh_etcd_cluster: Any, key_prefix: str) -> None:
    """TTL 5 s, 20 sessions holding a lease each (shared keepalive streams, renewals
    spread over the interval); the leader is killed and restarted 3 times, 2 s apart
    (each kill waits for a leader to exist). No lease may be lost, and every renewal must
    come with at least 40% of the TTL left before the local deadline: a keepalive stuck
    on a member that does not answer, or waiting out a long per-request timeout, leaves
    far less."""
    cluster = fresh_etcd_cluster
    observer = _Headroom()
    with open_store(cluster.url_with_prefix(key_prefix), observer=observer) as store:
        sessions = []
        try:
            # Spread over one renewal interval, so that every kill comes just before
            # some session's renewal: the worst moment for it.
            spacing_s = CHURN_TTL_S / 3 / CHURN_SESSIONS
            for i in range(CHURN_SESSIONS):
                sessions.append(store.session(f"w{i}", CHURN_TTL_S))
                time.sleep(spacing_s)  # pacing the sessions: real time must pass
            leases = [s.claim(f"job-{i}") for i, s in enumerate(sessions)]
            assert all(lease is not None for lease in leases)
            started = time.monotonic()
            last_kill = started - CHURN_SPACING_S
            kills: list[float] = []
            for _ in range(CHURN_KILLS):
                leader = cluster.leader(timeout_s=15.0)
                while time.monotonic() < last_kill + CHURN_SPACING_S:
                    assert not [x for x in leases if x and x.state is LeaseState.LOST]
                    time.sleep(0.05)  # pacing the faults: real time must pass
                cluster.kill(leader)
                last_kill = time.monotonic()
                kills.append(last_kill)
                cluster.restart(leader, ready_timeout_s=None)
            cluster.leader(timeout_s=15.0)
            # Every session renews after the last election: then the churn is over.
            poll_until(lambda: len(observer.since(last_kill + 1.0)) >= CHURN_SESSIONS,
                       3 * CHURN_TTL_S)
            lost = [x.job_id for x in leases if x and x.state is not LeaseState.HELD]
            assert not lost, lost
            for lease in leases:
                assert lease is not None
                lease.ensure_held()
            smallest = min(observer.since(started))
            report = _churn_report(observer, kills)
            print(f"leader churn: smallest headroom {smallest:.2f} s = "
                  f"{smallest / CHURN_TTL_S:.0%} of the TTL; {report}")
            # The goal is 40% (measured 43-44% here under load); the assertion keeps a
            # margin for a busy CI host, where the election itself takes longer.
            assert smallest >= 0.35 * CHURN_TTL_S, report
        finally:
            for session in sessions:
                session.close()


SILENT_TTL_S = 5.0
SILENT_SESSIONS = 10
SILENT_GOAL = 0.40
"""The headroom goal of issue 25 item 2, as a share of the TTL. With the follower in use
frozen and no election, the headroom lost is the client's alone: ``0.567 TTL - d`` (see
:mod:`consensus_lease.backends.etcd._transport_keepalive`), ``d`` the wait on the silent
member before a live one answers. A hedge after ``max(0.15, TTL/20)`` leaves about 2.58 s
(52%) at TTL 5 s, so 40% keeps 0.58 s for a late renewer thread on a busy 2-core host
(measured: 50-52%, 47% beside two busy loops); waiting out a whole per-request
budget on the silent member (``min(timeout_s, TTL/3)`` = 1.67 s, the keepalive before
issue 25's fix) left 0.80-1.15 s (16-23%), 3.4-3.7 s between two good renewals."""
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _keepalives_received(member: Any) -> float:
    """LeaseKeepAlive messages the member has received since it started (its gRPC
    server metrics on the client port)."""
    with _NO_PROXY.open(f"http://{member.endpoint}/metrics", timeout=5.0) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("grpc_server_msg_received_total{")
               and 'grpc_method="LeaseKeepAlive"' in line)


def _wait_renewed(observer: _Headroom, leases: list[Any], since: float, count: int) -> None:
    """Poll until ``count`` renewals were answered after ``since``; stop at once when a
    lease is no longer held."""
    poll_until(lambda: len(observer.since(since)) >= count
               or any(x.state is not LeaseState.HELD for x in leases), 2 * SILENT_TTL_S)
    lost = [x.job_id for x in leases if x.state is not LeaseState.HELD]
    assert not lost, lost


def test_silent_follower_costs_a_short_attempt(etcd_cluster: Any, key_prefix: str) -> None:
    """TTL 5 s, 10 sessions holding a lease each, their keepalive streams on a follower;
    that follower is frozen (``docker pause``: its sockets stay open, nothing answers)
    and no election happens, so what a renewal loses is the client's failover alone.
    No lease may be lost, and every renewal answered while it is frozen must leave at
    least 40% of the TTL before the local deadline: a keepalive that waits out its whole
    budget on the silent member before the next leaves far less."""
    cluster = etcd_cluster
    leader = cluster.leader(timeout_s=15.0)
    follower = next(m for m in cluster.members if m is not leader)
    observer = _Headroom()
    with open_store(cluster.url_with_prefix(key_prefix), observer=observer) as store:
        use_member(store, follower.endpoint)  # before any session: streams open there
        received = _keepalives_received(follower)
        sessions = []
        try:
            # Spread over one renewal interval, so that renewals come due all through
            # the freeze, the first ones just after it.
            for i in range(SILENT_SESSIONS):
                sessions.append(store.session(f"w{i}", SILENT_TTL_S))
                time.sleep(SILENT_TTL_S / 3 / SILENT_SESSIONS)  # pacing: real time must pass
            claimed = [s.claim(f"job-{i}") for i, s in enumerate(sessions)]
            leases = [lease for lease in claimed if lease is not None]
            assert len(leases) == SILENT_SESSIONS
            _wait_renewed(observer, leases, 0.0, SILENT_SESSIONS)
            assert _keepalives_received(follower) > received, "keepalives not on the follower"
            cluster.pause(follower)
            frozen = time.monotonic()
            try:
                # Every session renews at least once after the freeze (each is due
                # within TTL/3 of it), most of them twice.
                _wait_renewed(observer, leases, frozen, 2 * SILENT_SESSIONS)
            finally:
                thawed = time.monotonic()
                cluster.unpause(follower)
            for lease in leases:
                lease.ensure_held()
            smallest = min(observer.since(frozen, thawed))
            # headroom = previous good renewal's send time + TTL - 10% margin - now
            report = (f"silent follower: smallest headroom {smallest:.2f} s = "
                      f"{smallest / SILENT_TTL_S:.0%} of the TTL, longest gap between "
                      f"good renewals {0.9 * SILENT_TTL_S - smallest:.2f} s, "
                      f"{len(observer.since(frozen, thawed))} renewals in "
                      f"{thawed - frozen:.1f} s frozen")
            print(report)
            assert smallest >= SILENT_GOAL * SILENT_TTL_S, report
        finally:
            for session in sessions:
                session.close()
