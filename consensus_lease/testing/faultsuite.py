"""Faults every clustered backend must survive, on a real 3-member cluster.

Subclass once per backend, giving the cluster fixture and TTLs::

    class TestEtcdFaults(ClusterFaultSuite):
        ttl_s = 2.0            # short: pause and kill tests wait it out
        leader_ttl_s = 6.0     # several times the election time

        @pytest.fixture
        def cluster(self, etcd_cluster):
            return etcd_cluster

What each test proves:

* a worker process paused (SIGSTOP) past its TTL loses the job to a newer generation,
  and after SIGCONT its ``ensure_held()`` fails, the store rejects its completion and the
  fenced destination rejects its late write;
* a killed worker's job becomes claimable only once the store expires its session, at a
  newer generation;
* killing the cluster's leader while a lease is held and renewed causes no false loss
  and no second holder;
* a worker cut off from every member stops (its local deadline) *before* the store can
  hand its job to anyone else;
* each member SIGKILLed and started again in turn (the one a store's client uses among
  them): once it serves, the store's very next calls succeed, with no stale connection
  state failing the first ones.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from ..errors import BackendUnavailable, LeaseSuspended
from ..fencing import SqliteFence
from ..record import JobState
from ..states import LeaseState, SessionState
from ..store import open_store
from .conformance import poll_until
from .workers import WorkerProcess

__all__ = ["ClusterFaultSuite"]

WORKER_GID = 4290
"""Group id the partitioned worker runs under (iptables owner match)."""


def _ok(reply: dict[str, Any]) -> dict[str, Any]:
    assert reply.get("ok"), reply
    return reply


class ClusterFaultSuite:
    """See the module docstring. Subclasses provide a ``cluster`` fixture."""

    ttl_s: float = 2.0
    leader_ttl_s: float = 6.0

    @pytest.fixture
    def cluster(self) -> Any:
        raise NotImplementedError("subclasses return the cluster fixture")

    @pytest.fixture
    def url(self, cluster: Any, key_prefix: str) -> str:
        return str(cluster.url_with_prefix(key_prefix))

    def test_paused_holder_is_fenced_everywhere(self, url: str, tmp_path: Path) -> None:
        destination = str(tmp_path / "destination.db")
        fence = SqliteFence(destination)
        with open_store(url) as store, WorkerProcess("A") as a:
            _ok(a.request("open", url=url, owner="A", ttl_s=self.ttl_s))
            claimed = _ok(a.request("claim", job="job"))
            gen_a = claimed["generation"]
            _ok(a.request("fence", path=destination, job="job", effect="step-1"))
            a.pause()
            try:
                with store.session("B", 30.0) as b:
                    lease_b = b.claim("job", wait_s=10 * self.ttl_s + 20)
                    assert lease_b is not None and lease_b.generation > gen_a
                    fence.apply("job", lease_b.generation, "step-1")
                    a.resume()
                    held = a.request("ensure_held", job="job")
                    assert not held["ok"] and held["error"] in ("LeaseLost", "SessionExpired")
                    done = a.request("complete", job="job", result="stale")
                    assert not done["ok"] and done["error"] in (
                        "StaleLeaseError", "SessionExpired", "LeaseLost"), done
                    late = a.request("fence", path=destination, job="job", effect="step-2")
                    assert not late["ok"] and late["error"] == "FenceRejected", late
                    lease_b.ensure_held()
                    record = lease_b.complete(b"by B")
                    assert record.generation == lease_b.generation
            finally:
                a.resume()
        tokens = [e.token for e in fence.effects("job")]
        assert tokens == sorted(tokens) and tokens[-1] > gen_a

    def test_killed_holder_job_claimable_after_store_expiry(self, url: str) -> None:
        with open_store(url) as store, WorkerProcess("A") as a:
            granted = _ok(a.request("open", url=url, owner="A", ttl_s=self.ttl_s))
            gen_a = _ok(a.request("claim", job="job"))["generation"]
            a.kill()
            killed_at = time.monotonic()
            with store.session("B", 30.0) as b:
                assert b.claim("job") is None  # not handed over at once: the store decides
                lease = b.claim("job", wait_s=10 * self.ttl_s + 20)
                taken_after = time.monotonic() - killed_at
                assert lease is not None and lease.generation > gen_a
        # A renewed at most TTL/3 before the kill, so the store kept the job for at least
        # about 2/3 of the granted TTL after it (margin for a busy machine).
        assert taken_after >= 0.5 * granted["granted_ttl_s"], taken_after

    def test_leader_killed_no_false_loss_no_second_holder(self, cluster: Any, url: str) -> None:
        with open_store(url) as store:
            holder = store.session("holder", self.leader_ttl_s)
            rival = store.session("rival", 30.0)
            try:
                lease = holder.claim("job")
                assert lease is not None
                cluster.kill(cluster.leader())
                end = time.monotonic() + 2 * self.leader_ttl_s
                while time.monotonic() < end:
                    assert lease.state is not LeaseState.LOST, lease.lost_reason
                    # The rival's own connection may fail or suspend during the election.
                    with contextlib.suppress(BackendUnavailable, LeaseSuspended):
                        assert rival.claim("job") is None
                    time.sleep(0.2)  # real time must pass for the TTL to matter
                # SUSPENDED (ZooKeeper) is allowed during the election; HELD must return.
                poll_until(lambda: lease.state is LeaseState.HELD, self.leader_ttl_s)
                lease.ensure_held()
                record = store.get("job")
                assert record is not None and record.state is JobState.HELD
                assert record.generation == lease.generation and record.owner == "holder"
                lease.complete(b"done")
            finally:
                holder.close()
                rival.close()

    def test_cut_off_holder_stops_before_takeover(self, cluster: Any, url: str) -> None:
        with open_store(url) as store, WorkerProcess("A", gid=WORKER_GID) as a:
            _ok(a.request("open", url=url, owner="A", ttl_s=self.ttl_s))
            gen_a = _ok(a.request("claim", job="job"))["generation"]
            cut = cluster.cut_client(WORKER_GID)
            cut_at = time.monotonic()
            try:
                with store.session("B", 30.0) as b:
                    stopped_at: float | None = None
                    taken = None
                    give_up = cut_at + 10 * self.ttl_s + 30
                    while taken is None and time.monotonic() < give_up:
                        if stopped_at is None:
                            state = _ok(a.request("lease", job="job", timeout_s=10))["state"]
                            if state != "held":
                                stopped_at = time.monotonic()
                        taken = b.claim("job")
                        time.sleep(0.05)  # polling both sides with a bounded loop
                    assert taken is not None and taken.generation > gen_a
                    taken_at = time.monotonic()
                    assert stopped_at is not None, "the cut-off holder never stopped"
                    assert stopped_at < taken_at, (stopped_at - cut_at, taken_at - cut_at)
                    assert stopped_at - cut_at <= self.ttl_s + 1.0
                    print(f"cut-off holder stopped after {stopped_at - cut_at:.2f} s, "
                          f"job taken after {taken_at - cut_at:.2f} s")
                    taken.complete(b"by B")
            finally:
                cut.heal()

    def test_first_calls_after_each_member_restart_succeed(self, cluster: Any, url: str) -> None:
        # Seen once on ZooKeeper (issue 25, item 7): after a SIGKILLed member came back,
        # the first two get() calls of a store that had used it each failed after 10 s.
        with open_store(url) as store, store.session("s", 30.0) as session:
            assert session.claim("job") is not None
            for member in list(cluster.members):
                cluster.kill(member)
                cluster.restart(member)  # returns once every member serves again
                started = time.monotonic()
                assert store.get("job") is not None  # no retry: the first call succeeds
                # the session's own connection may still be moving (SUSPENDED) if it was
                # on that member: its state is its own to settle
                poll_until(lambda: session.state is SessionState.ACTIVE, 10.0)
                lease = session.claim("other")
                assert lease is not None
                lease.release()
                took = time.monotonic() - started
                # A failover to a live member costs a connect; a stale connection waited
                # out whole request budgets (10 s each) first.
                assert took < 8.0, (member.name, took)
