"""ZooKeeper-native subscriptions (:mod:`consensus_lease.backends.zookeeper._watches_subscribe`):
woken by watches within a fraction of a second, only for what is subscribed, one watch
per znode however many subscribe, a timer at a retry delay's end, and one wake on a lost
connection, re-armed when it is back.

Runs where the other ZooKeeper tests run (``zk_local.py``: the container ensemble, or a
local server with ``CONSENSUS_LEASE_ZK=local``). Nothing sleeps to synchronise: waits
poll with deadlines; "not woken" is checked over a quiet period after the wake it must
not have joined.
"""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from zk_local import (  # noqa: F401  (fixtures)
    ZkTarget,
    backend,
    opened,
    session_ttl_s,
    store,
    zk_target,
    zk_url,
)

from consensus_lease import LeaseStore, open_store
from consensus_lease.backends.zookeeper import ZooKeeperBackend, _watches_timer
from consensus_lease.lease import Lease
from consensus_lease.session import Session
from consensus_lease.states import LeaseState
from consensus_lease.testing.conformance import poll_until

pytestmark = pytest.mark.slow

WAKE_WITHIN_S = 0.2
"""A subscription is called this soon after the call that frees its job was made."""

QUIET_S = 0.3
"""How long a subscription that must not be called is watched for."""


class Calls:
    """A subscription callback that records when it was called."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.times: list[float] = []

    def __call__(self) -> None:
        with self._lock:
            self.times.append(time.monotonic())

    def __len__(self) -> int:
        with self._lock:
            return len(self.times)

    def after(self, t: float) -> list[float]:
        with self._lock:
            return [x for x in self.times if x >= t]


def woken_within(calls: Calls, since: float, within_s: float = WAKE_WITHIN_S) -> float:
    """Seconds from ``since`` to the first call at or after it; fails unless within
    ``within_s`` (polled up to a few times that, to report the actual delay)."""
    poll_until(lambda: calls.after(since), max(2.0, 5 * within_s), interval_s=0.005)
    delay = calls.after(since)[0] - since
    assert delay <= within_s, f"woken after {delay:.3f} s"
    return delay


def stays_uncalled(calls: Calls, quiet_s: float = QUIET_S) -> None:
    give_up = time.monotonic() + quiet_s
    while time.monotonic() < give_up:
        assert len(calls) == 0, "called for a change it did not subscribe to"
        time.sleep(0.01)  # polling the absence of a call over the quiet period


def held(session: Session, job_id: str) -> Lease:
    """``job_id`` claimed by ``session``, and seen by the store's shared read client.

    The claim goes through the session's own client; the subscriptions read through the
    shared one, which may be connected to a follower that has not applied the claim yet
    (ZooKeeper reads are served by the member a client is connected to). A subscription
    read there finds the job free and wakes at once: a spurious wake, which the contract
    allows, but which a test of "held: nothing to report" would count. ``sync`` makes
    that member catch up with the leader first (ZooKeeper Programmer's Guide,
    "Consistency Guarantees")."""
    lease = session.claim(job_id)
    assert lease is not None
    backend = session.backend
    assert isinstance(backend, ZooKeeperBackend)
    backend._wire.reader().sync("/")
    return lease


def settled(backend: ZooKeeperBackend, watches: int | None = None) -> None:
    """Until every round of reads the subscriptions sent is answered (and ``watches``
    znode watches are armed, if given)."""
    subs = backend._subs
    poll_until(lambda: subs.in_flight() == 0 and watches in (None, subs.watches()), 10)


# -- woken by the store --------------------------------------------------------------------


@pytest.mark.parametrize("end", ["release", "complete", "expiry", "fail"])
def test_job_subscription_wakes_when_the_hold_ends(
    backend: ZooKeeperBackend, opened: Callable[..., Session], end: str
) -> None:
    holder = opened("holder")
    lease = held(holder, "job")
    calls, other = Calls(), Calls()
    backend.subscribe_job("job", calls)
    held(holder, "other-job")
    backend.subscribe_job("other-job", other)
    settled(backend, 2)
    assert len(calls) == 0  # held: nothing to report
    since = time.monotonic()
    if end == "release":
        lease.release()
    elif end == "complete":
        lease.complete(b"done")
    elif end == "fail":
        lease.fail("boom", retry_in_s=0.0)
    else:
        backend.expire_session(holder.session_id)
    woken_within(calls, since)
    if end != "expiry":  # the expiry ends "other-job"'s hold too
        stays_uncalled(other)


def test_queue_subscription_wakes_on_enqueue_and_release(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    calls, other = Calls(), Calls()
    backend.subscribe_queue("q", calls)  # no such queue yet: armed on its creation
    backend.subscribe_queue("other-q", other)
    settled(backend, 2)  # the two queues' first ``open``, which do not exist yet
    since = time.monotonic()
    store.enqueue("q", "q-0")
    woken_within(calls, since)
    holder = opened("holder")
    lease = holder.claim_next("q")
    assert lease is not None
    settled(backend, 4)  # open, held and delayed of "q"'s bucket, open of "other-q"
    since = time.monotonic()
    store.enqueue("q", "q-1")
    woken_within(calls, since)
    assert holder.claim_next("q") is not None
    settled(backend, 4)
    since = time.monotonic()
    lease.release()
    woken_within(calls, since)
    assert len(other) == 0


def test_an_enqueue_wakes_the_longest_waiting_subscriber_before_its_round(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    """An event on ``open`` (here its creation by the queue's first enqueue) wakes the
    first subscriber at once, then every subscriber when the round's answers show a job
    claimable; a claim (an event on ``held`` alone) wakes nobody early."""
    first, second = Calls(), Calls()
    backend.subscribe_queue("q", first)
    backend.subscribe_queue("q", second)
    settled(backend, 1)  # the exists watch on the missing ``open``
    assert len(first) == len(second) == 0
    store.enqueue("q", "q-0")
    poll_until(lambda: len(second) == 1, 5, interval_s=0.005)
    settled(backend)
    assert len(first) == 2  # at once, and with the round's answers
    assert len(second) == 1
    assert opened("holder").claim_next("q") is not None  # held changes, open does not
    settled(backend, 3)
    stays_uncalled_since = (len(first), len(second))
    give_up = time.monotonic() + QUIET_S
    while time.monotonic() < give_up:
        assert (len(first), len(second)) == stays_uncalled_since
        time.sleep(0.01)  # polling the absence of a call over the quiet period


def test_a_claimable_looking_job_is_checked_again_while_subscribers_wait(
    backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    """A claim that read a member lagging behind the shared client's may have missed what
    woke it: while the job looks claimable and its subscribers still wait, it is read
    again (backing off); once held, nothing is read or called until it is let go."""
    calls = Calls()
    backend.subscribe_job("free", calls)
    poll_until(lambda: len(calls) >= 3, 2)  # at once, then after 0.05 s, 0.1 s, ...
    lease = held(opened("holder"), "free")
    poll_until(lambda: not backend._subs._targets[("job", "free")].ready, 5)
    settled(backend, 1)
    count = len(calls)
    give_up = time.monotonic() + QUIET_S
    while time.monotonic() < give_up:
        assert len(calls) == count
        time.sleep(0.01)  # polling the absence of a call over the quiet period
    since = time.monotonic()
    lease.release()
    woken_within(calls, since)


def test_wake_timer_runs_calls_in_order_and_its_thread_ends_when_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_watches_timer, "IDLE_EXIT_S", 0.1)
    timer = _watches_timer.WakeTimer("test-wake-timer")
    ran: list[str] = []
    now = time.monotonic()
    timer.at(now + 0.06, lambda: ran.append("second"))
    timer.at(now + 0.03, lambda: ran.append("first"))
    timer.at(now + 0.03, lambda: 1 / 0)  # logged; the others still run
    poll_until(lambda: len(ran) == 2, 2)
    assert ran == ["first", "second"]
    poll_until(lambda: not any(t.name == "test-wake-timer" for t in threading.enumerate()), 2)
    timer.at(time.monotonic(), lambda: ran.append("again"))  # a new thread when needed
    poll_until(lambda: "again" in ran, 2)
    timer.close()
    timer.at(time.monotonic(), lambda: ran.append("closed"))
    poll_until(lambda: not any(t.name == "test-wake-timer" for t in threading.enumerate()), 2)
    assert "closed" not in ran and len(timer) == 0


# -- scale, unsubscribe, close -------------------------------------------------------------


def test_thousand_subscriptions_cost_one_watch_per_znode_and_no_thread(
    backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    holder = opened("holder")
    jobs = [f"job-{i}" for i in range(5)]
    leases = [held(holder, job) for job in jobs]
    backend.get("warm-up")  # the shared client exists before counting threads
    threads = threading.active_count()
    calls = {job: [Calls() for _ in range(200)] for job in jobs}
    cancels = [backend.subscribe_job(job, c) for job in jobs for c in calls[job]]
    settled(backend, len(jobs))
    assert threading.active_count() <= threads + 1  # the backend's one timer thread
    assert backend._subs.subscribers() == 1000
    reader = backend._wire.reader()
    for job in jobs:
        assert len(reader._data_watchers[backend._paths(job).owner]) == 1
    leases[0].release()
    poll_until(lambda: all(len(c) for c in calls[jobs[0]]), 2)
    settled(backend)
    for job in jobs[1:]:
        assert not any(len(c) for c in calls[job])
    for cancel in cancels:
        cancel()
        cancel()  # idempotent
    assert backend._subs.subscribers() == 0
    assert threading.active_count() <= threads + 1  # the backend's one timer thread


def test_unsubscribe_stops_callbacks(
    backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    holder = opened("holder")
    lease = held(holder, "job")
    kept, dropped = Calls(), Calls()
    backend.subscribe_job("job", kept)
    backend.subscribe_job("job", dropped)()
    settled(backend, 1)
    since = time.monotonic()
    lease.release()
    woken_within(kept, since)
    stays_uncalled(dropped)


def test_close_calls_every_subscriber_once(zk_url: str) -> None:
    store = open_store(zk_url, connect_timeout_s=30)
    backend = store.backend
    assert isinstance(backend, ZooKeeperBackend)
    holder = store.session("holder", 10.0)
    held(holder, "job")
    calls = Calls()
    backend.subscribe_job("job", calls)
    backend.subscribe_queue("q", calls)
    settled(backend, 2)
    store.close()
    poll_until(lambda: len(calls) >= 2, 1)
    late = Calls()
    backend.subscribe_job("job", late)
    assert len(late) == 1  # a closed backend calls back at once


# -- retry delays --------------------------------------------------------------------------


def test_retry_delay_end_wakes_a_job_subscription(
    backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    held(opened("holder"), "job").fail("later", retry_in_s=1.0)
    failed_at = time.monotonic()
    waiter = opened("waiter")
    calls = Calls()
    backend.subscribe_job("job", calls)
    assert waiter.claim("job") is None  # refused for the delay: its end is noted
    woken_within(calls, failed_at + 0.8, within_s=0.5)  # not before it ends, soon after
    assert waiter.claim("job", wait_s=2) is not None


def test_retry_delay_end_wakes_a_queue_subscription(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    store.enqueue("q", "q-0")
    lease = opened("holder").claim_next("q")
    assert lease is not None
    lease.fail("later", retry_in_s=1.0)
    failed_at = time.monotonic()
    waiter = opened("waiter")
    calls = Calls()
    backend.subscribe_queue("q", calls)
    assert waiter.claim_next("q") is None  # the listing times the delay
    woken_within(calls, failed_at + 0.8, within_s=0.5)
    assert waiter.claim_next("q", wait_s=2) is not None


# -- the connection ------------------------------------------------------------------------


def test_server_restart_wakes_once_and_re_arms(zk_url: str, zk_target: ZkTarget) -> None:
    store = open_store(zk_url, connect_timeout_s=30, timeout_s=30)
    backend = store.backend
    assert isinstance(backend, ZooKeeperBackend)
    try:
        lease = held(store.session("holder", 30.0), "job")
        calls = Calls()
        backend.subscribe_job("job", calls)
        settled(backend, 1)
        zk_target.stop()
        try:
            poll_until(lambda: len(calls) >= 1, 30)  # SUSPENDED: woken once
        finally:
            zk_target.start()
        poll_until(lambda: backend._wire.reader().connected, 60)
        settled(backend, 1)  # armed again
        # The holder's session usually survives the restart; if it did not, the job is
        # claimed again, through the re-armed watch's creation event.
        poll_until(lambda: lease.state in (LeaseState.HELD, LeaseState.LOST), 60)
        if lease.state is LeaseState.LOST:
            lease = held(store.session("holder-2", 30.0), "job")
            settled(backend, 1)
        since = time.monotonic()
        lease.release()
        woken_within(calls, since, within_s=1.0)
    finally:
        store.close()
