"""etcd subscriptions (``subscribe_job`` / ``subscribe_queue``): watches multiplexed on one
shared Watch stream per driver, on local etcd members.

What wakes a subscriber and how fast (well within 100 ms of the change on a local
member), what does not, that 1,000 subscriptions cost one stream and one thread, that
unsubscribing cancels the watch, and what a broken, compacted, silent or restarted stream
does: every subscriber called once, the watches resumed without losing an event.
"""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest
from etcd_local import LocalEtcd, LocalMember, backend_of, local_members, require_local_etcd
from pyetcd import etcdrpc

from consensus_lease import LeaseStore, open_store
from consensus_lease.backends.etcd import _watches_hub
from consensus_lease.backends.etcd._watches_hub import WatchHub
from consensus_lease.backends.etcd._watches_subscribe import Subscriptions
from consensus_lease.testing.conformance import poll_until

WAKES_WITHIN_S = 2.0
"""A subscriber is called this soon after the change that frees its job. Typically 2-5 ms;
the margin is for a busy 2-core machine (0.5 s was seen in CI with 1,000 subscriptions)."""

QUIET_S = 0.3
"""How long a subscriber must stay silent to count as "not woken"."""

_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))

SESSION = 1
"""Watches the hub carries for the sessions while one is open (the session keys' watch,
:mod:`consensus_lease.backends.etcd._sessions_revocation`)."""


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=80)


@pytest.fixture
def store(etcd_server: LocalEtcd) -> Iterator[LeaseStore]:
    with open_store(etcd_server.url_with_prefix(f"s-{uuid.uuid4().hex[:12]}")) as store:
        yield store


class Calls:
    """A subscription callback that records when it was called."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.event = threading.Event()

    def __call__(self) -> None:
        self.times.append(time.monotonic())
        self.event.set()

    def __len__(self) -> int:
        return len(self.times)

    def woken_within(self, since: float, within_s: float) -> float:
        """Wait (at most 5 s) for a call; return how long after ``since`` it came and
        check that it came within ``within_s``."""
        assert self.event.wait(5), "not called"
        latency = self.times[-1] - since
        assert latency <= within_s, f"called after {latency:.3f} s"
        return latency

    def quiet(self, for_s: float = QUIET_S) -> bool:
        """``True`` if not called during the next ``for_s`` seconds."""
        return not self.event.wait(for_s)

    def reset(self) -> None:
        self.event.clear()


def _subs(store: LeaseStore) -> Subscriptions:
    return backend_of(store)._subscriptions_etcd


def _hub(store: LeaseStore) -> WatchHub:
    return _subs(store).hub


def _metric(etcd: LocalEtcd, name: str) -> float:
    with _HTTP.open(f"{etcd.members[0].metrics_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def _watchers(etcd: LocalEtcd) -> float:
    return _metric(etcd, "etcd_debugging_mvcc_watcher_total")


def _settled_watchers(etcd: LocalEtcd, timeout_s: float = 10.0) -> float:
    """The server's watcher count once it holds still for 0.3 s (bounded): watches a
    session or an earlier test started or cancelled reach the server asynchronously, so
    a baseline read while one is in flight is off by one."""
    deadline = time.monotonic() + timeout_s
    last = _watchers(etcd)
    while time.monotonic() < deadline:
        time.sleep(0.3)  # poll interval of a deadline loop (until the count holds still)
        now = _watchers(etcd)
        if now == last:
            return now
        last = now
    raise AssertionError(f"the server's watcher count did not settle within {timeout_s} s")


def _streams(etcd: LocalEtcd) -> float:
    return _metric(etcd, "etcd_debugging_mvcc_watch_stream_total")


def _revoke_delay(store: LeaseStore, job_id: str) -> None:
    """End the retry delay of ``job_id`` now, as its lease running out would."""
    backend = backend_of(store)
    answer = backend._transport.call(
        "kv", "Range", etcdrpc.RangeRequest(key=backend._layout.job(job_id).not_before),
        what="reading the delay")
    (kv,) = answer.kvs
    backend._transport.call("lease", "LeaseRevoke", etcdrpc.LeaseRevokeRequest(ID=kv.lease),
                            what="ending the delay")


def _wake_by(store: LeaseStore, how: str) -> Callable[[], None]:
    """Hold ``job`` in a session; return what frees it ``how``."""
    a = store.session("A", ttl_s=30)
    lease = a.claim("job")
    assert lease is not None
    if how == "delay ends":
        lease.fail("later", retry_in_s=60)
        return lambda: _revoke_delay(store, "job")
    actions: dict[str, Callable[[], object]] = {
        "release": lease.release,
        "expiry": lambda: backend_of(store).expire_session(a.session_id),
        "complete": lambda: lease.complete(b"done"),
        "fail": lambda: lease.fail("boom", retry_in_s=0),
    }
    action = actions[how]

    def free() -> None:
        action()

    return free


# -- what wakes, how fast -------------------------------------------------------------


@pytest.mark.parametrize("how", ["release", "expiry", "complete", "fail", "delay ends"])
def test_a_job_subscriber_is_called_at_once(store: LeaseStore, how: str) -> None:
    free = _wake_by(store, how)
    calls = Calls()
    unsubscribe = store.backend.subscribe_job("job", calls)
    assert calls.quiet(0.1)
    started = time.monotonic()
    free()
    calls.woken_within(started, WAKES_WITHIN_S)
    unsubscribe()


def test_a_claimable_completed_or_failed_job_calls_back_soon(store: LeaseStore) -> None:
    with store.session("A", ttl_s=30) as a:
        done = a.claim("done")
        assert done is not None
        done.complete(b"")
        for job_id in ("free", "done"):
            calls = Calls()
            started = time.monotonic()
            unsubscribe = store.backend.subscribe_job(job_id, calls)
            calls.woken_within(started, WAKES_WITHIN_S)
            unsubscribe()


def test_what_does_not_free_the_job_does_not_call(store: LeaseStore) -> None:
    """Another job's changes, a fail with a retry delay (the job is not claimable yet),
    enqueues: nothing. The delay's end then calls."""
    store.enqueue("q", "queued")
    with store.session("A", ttl_s=30) as a:
        lease = a.claim("job")
        assert lease is not None
        calls = Calls()
        unsubscribe = store.backend.subscribe_job("job", calls)
        other = a.claim("other")
        assert other is not None
        other.release()
        other_again = a.claim("other")
        assert other_again is not None
        other_again.complete(b"")
        store.enqueue("q", "queued-2")
        lease.fail("later", retry_in_s=60)
        assert calls.quiet()
        started = time.monotonic()
        _revoke_delay(store, "job")
        calls.woken_within(started, WAKES_WITHIN_S)
        unsubscribe()


def test_a_new_claim_does_not_call(store: LeaseStore) -> None:
    with store.session("A", ttl_s=30) as a:
        calls = Calls()
        unsubscribe = store.backend.subscribe_job("job", calls)
        calls.woken_within(time.monotonic(), 1.0)  # claimable now
        calls.reset()
        lease = a.claim("job")
        assert lease is not None
        lease.renew()
        assert calls.quiet()
        started = time.monotonic()
        lease.release()
        calls.woken_within(started, WAKES_WITHIN_S)
        unsubscribe()


def test_a_queue_subscriber_is_called_for_what_frees_a_job_of_its_queue(
    store: LeaseStore,
) -> None:
    """Enqueue, release, expiry, requeue, a job enqueued after subscribing then released:
    calls. A completion, another queue's changes: nothing."""
    store.enqueue("q", "first")
    with store.session("A", ttl_s=30) as a, store.session("B", ttl_s=30) as b:
        first = a.claim_next("q")
        assert first is not None
        calls = Calls()
        unsubscribe = store.backend.subscribe_queue("q", calls)
        assert calls.quiet(0.1)

        def woken(action: Callable[[], object]) -> None:
            calls.reset()
            started = time.monotonic()
            action()
            calls.woken_within(started, WAKES_WITHIN_S)

        def quiet(action: Callable[[], object]) -> None:
            calls.reset()
            action()
            assert calls.quiet()

        woken(first.release)
        woken(lambda: store.enqueue("q", "second"))
        held = [a.claim_next("q"), a.claim_next("q")]
        assert all(lease is not None for lease in held)
        store.enqueue("other", "elsewhere")
        elsewhere = b.claim_next("other")
        assert elsewhere is not None
        quiet(elsewhere.release)
        quiet(lambda: store.enqueue("other", "elsewhere-2"))
        quiet(lambda: held[0].complete(b""))  # type: ignore[union-attr]
        woken(lambda: backend_of(store).expire_session(a.session_id))
        unsubscribe()


def test_a_requeue_calls_the_queue_subscriber(store: LeaseStore) -> None:
    store.enqueue("q", "job", max_attempts=1)
    with store.session("A", ttl_s=30) as a:
        lease = a.claim_next("q")
        assert lease is not None
        lease.fail("dead")
        calls = Calls()
        unsubscribe = store.backend.subscribe_queue("q", calls)
        assert calls.quiet(0.1)
        started = time.monotonic()
        store.requeue("job")
        calls.woken_within(started, WAKES_WITHIN_S)
        unsubscribe()


# -- sharing, unsubscribing -------------------------------------------------------------


def test_a_thousand_subscriptions_share_one_stream_and_one_thread(
    store: LeaseStore, etcd_server: LocalEtcd
) -> None:
    """1,000 jobs held, one subscription each: one Watch stream with 1,000 watch ids,
    at most 3 more threads; a release calls only its
    job's subscriber; unsubscribing cancels every watch and the stream ends."""
    jobs = [f"job-{i}" for i in range(1000)]
    with store.session("A", ttl_s=60) as a:
        leases = []
        for start in range(0, len(jobs), 64):
            leases += a.claim_many(jobs[start:start + 64])
        assert all(lease is not None for lease in leases)
        threads, watchers, streams = threading.active_count(), _watchers(etcd_server), \
            _streams(etcd_server)
        calls = [Calls() for _ in jobs]
        unsubscribes = [store.backend.subscribe_job(j, c) for j, c in zip(jobs, calls,
                                                                           strict=True)]
        poll_until(lambda: _hub(store).watch_ids == len(jobs) + SESSION, 20)
        assert _watchers(etcd_server) - watchers == len(jobs)
        assert _streams(etcd_server) - streams == 0  # the session's watch opened it
        assert _hub(store).streams_opened == 1
        # the hub's thread, and gRPC's two for a stream call (its channel's poller and
        # the request sender): the same for 1 watch or 1,000
        assert threading.active_count() - threads <= 3, [t.name for t in threading.enumerate()]
        started = time.monotonic()
        leases[500].release()  # type: ignore[union-attr]
        calls[500].woken_within(started, WAKES_WITHIN_S)
        assert not any(len(c) for i, c in enumerate(calls) if i != 500)
        for unsubscribe in unsubscribes:
            unsubscribe()
        poll_until(lambda: _watchers(etcd_server) <= watchers, 10)
        poll_until(lambda: threading.active_count() <= threads, 10)
        assert len(_subs(store)) == 0 and len(_hub(store)) == SESSION
    poll_until(lambda: _streams(etcd_server) < streams, 10)  # idle: the stream ends


def test_subscribers_of_one_job_share_its_watch_and_leave_one_by_one(
    store: LeaseStore, etcd_server: LocalEtcd
) -> None:
    with store.session("A", ttl_s=30) as a:
        lease = a.claim("job")
        assert lease is not None
        watchers = _settled_watchers(etcd_server)  # the session's own watch included
        first, second = Calls(), Calls()
        leave_first = store.backend.subscribe_job("job", first)
        leave_second = store.backend.subscribe_job("job", second)
        assert len(_hub(store)) == 1 + SESSION
        poll_until(lambda: _watchers(etcd_server) == watchers + 1, 10)
        leave_first()
        leave_first()  # idempotent
        started = time.monotonic()
        lease.release()
        second.woken_within(started, WAKES_WITHIN_S)
        assert first.quiet(0.1)
        leave_second()
        assert len(_hub(store)) == SESSION
        poll_until(lambda: _watchers(etcd_server) <= watchers, 10)
        second.reset()
        again = a.claim("job")
        assert again is not None
        again.release()
        assert second.quiet(0.1) and len(second) == 1


def test_queues_share_one_watch_of_the_job_keys(store: LeaseStore) -> None:
    for queue in ("q1", "q2", "q3"):
        store.enqueue(queue, f"{queue}-job")
    unsubscribes = [store.backend.subscribe_queue(q, Calls()) for q in ("q1", "q2", "q3")]
    assert len(_hub(store)) == 3 + 1  # a pending-keys watch per queue, one shared
    for unsubscribe in unsubscribes:
        unsubscribe()
    assert len(_hub(store)) == 0


# -- closing ----------------------------------------------------------------------------


def test_close_calls_every_subscriber_once_and_later_ones_at_once(
    etcd_server: LocalEtcd,
) -> None:
    url = etcd_server.url_with_prefix(f"s-{uuid.uuid4().hex[:12]}")
    with open_store(url) as holder_store, holder_store.session("A", ttl_s=30) as a:
        assert a.claim("job") is not None
        holder_store.enqueue("q", "job-q")
        assert a.claim_next("q") is not None
        store = open_store(url)
        calls = [Calls(), Calls(), Calls()]
        store.backend.subscribe_job("job", calls[0])
        store.backend.subscribe_job("job", calls[1])
        store.backend.subscribe_queue("q", calls[2])
        assert all(c.quiet(0.05) for c in calls)
        started = time.monotonic()
        store.close()
        for c in calls:
            c.woken_within(started, 1.0)
        late = Calls()
        store.backend.subscribe_job("job", late)()
        assert len(late) == 1
        for c in calls:
            c.reset()
        assert all(c.quiet(0.1) for c in calls)
        assert [len(c) for c in calls] == [1, 1, 1]
        assert _hub(store).streams_opened == 1


# -- a broken stream -------------------------------------------------------------------


def test_a_broken_stream_calls_once_and_resumes_without_losing_an_event(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream breaks: every subscriber is called once. A release while it is down is
    delivered by the re-created watch (from the revision after its last event)."""
    monkeypatch.setattr(_watches_hub, "RETRY_MIN_S", 1.0)  # a long gap to change things in
    with store.session("A", ttl_s=30) as a:
        lease = a.claim("job")
        assert lease is not None
        calls = Calls()
        unsubscribe = store.backend.subscribe_job("job", calls)
        hub = _hub(store)
        poll_until(lambda: hub.watch_ids == 1 + SESSION, 10)
        stream = hub._stream
        assert stream is not None
        started = time.monotonic()
        stream.call.cancel()  # as a broken connection would
        calls.woken_within(started, WAKES_WITHIN_S)
        calls.reset()
        lease.release()  # while no stream is open
        assert hub._stream is None and len(calls) == 1
        calls.woken_within(started, 5.0)
        assert len(calls) == 2 and hub.streams_opened == 2
        unsubscribe()


def test_a_compacted_watch_resumes_and_calls(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream is down while the store is compacted past the watch's revision: the
    watch resumes from the compaction and its subscribers are called."""
    monkeypatch.setattr(_watches_hub, "RETRY_MIN_S", 1.0)
    backend = backend_of(store)
    with store.session("A", ttl_s=30) as a:
        lease = a.claim("job")
        assert lease is not None
        calls = Calls()
        unsubscribe = store.backend.subscribe_job("job", calls)
        hub = _hub(store)
        poll_until(lambda: hub.watch_ids == 1 + SESSION, 10)
        stream = hub._stream
        assert stream is not None
        stream.call.cancel()
        poll_until(lambda: len(calls) == 1, 5)
        for i in range(5):
            other = a.claim(f"other-{i}")
            assert other is not None
            other.release()
        header = backend._transport.call("kv", "Range", etcdrpc.RangeRequest(key=b"/"),
                                         what="revision").header
        backend._transport.call("kv", "Compact",
                                etcdrpc.CompactionRequest(revision=header.revision),
                                what="compacting")
        poll_until(lambda: len(calls) == 2, 5)  # re-created, compacted, called
        poll_until(lambda: hub.watch_ids == 1 + SESSION, 5)
        calls.reset()
        started = time.monotonic()
        lease.release()
        calls.woken_within(started, WAKES_WITHIN_S)
        unsubscribe()


@pytest.fixture
def own_member() -> Iterator[LocalEtcd]:
    """A member of its own, for tests that stop it."""
    yield from local_members(size=1, base=85)


def test_a_member_restart_calls_once_and_the_watch_comes_back(own_member: LocalEtcd) -> None:
    with open_store(own_member.url_with_prefix("restart")) as store, \
            store.session("A", ttl_s=60) as a:
        lease = a.claim("job")
        assert lease is not None
        calls = Calls()
        unsubscribe = store.backend.subscribe_job("job", calls)
        hub = _hub(store)
        poll_until(lambda: hub.watch_ids == 1 + SESSION, 10)
        member = own_member.members[0]
        started = time.monotonic()
        own_member.kill(member)
        calls.woken_within(started, 1.0)
        calls.reset()
        assert calls.quiet(1.0)  # failed reconnects do not call again
        own_member.restart(member)
        poll_until(lambda: hub.watch_ids == 1 + SESSION, 10)
        assert len(calls) == 1
        calls.reset()
        started = time.monotonic()
        lease.release()
        calls.woken_within(started, WAKES_WITHIN_S)
        unsubscribe()


def test_a_silent_stream_is_probed_and_replaced(own_member: LocalEtcd) -> None:
    """A frozen member answers nothing: after HEARTBEAT_S of silence a progress request
    goes out, unanswered within timeout_s the stream counts as broken (called once);
    once the member thaws, the watch works again."""
    url = own_member.url_with_prefix("frozen")
    with open_store(url, timeout_s=1.0) as store, store.session("A", ttl_s=60) as a:
        lease = a.claim("job")
        assert lease is not None
        calls = Calls()
        unsubscribe = store.backend.subscribe_job("job", calls)
        hub = _hub(store)
        poll_until(lambda: hub.watch_ids == 1 + SESSION, 10)
        member = own_member.members[0]
        started = time.monotonic()
        own_member.pause(member)
        try:
            calls.woken_within(started, _watches_hub.HEARTBEAT_S + 1.0 + 2 * _watches_hub.TICK_S
                               + 0.5)
        finally:
            own_member.unpause(member)
        poll_until(lambda: hub.watch_ids == 1 + SESSION, 15)
        calls.reset()
        started = time.monotonic()
        lease.release()
        calls.woken_within(started, WAKES_WITHIN_S)
        unsubscribe()



def _enable_auth(member: LocalMember, user: str, password: str) -> None:
    """``etcdctl user add`` (with the root role) and ``etcdctl auth enable``."""
    with grpc.insecure_channel(member.endpoint) as channel:
        auth = etcdrpc.AuthStub(channel)
        auth.UserAdd(etcdrpc.AuthUserAddRequest(name=user, password=password), timeout=10)
        auth.RoleAdd(etcdrpc.AuthRoleAddRequest(name="root"), timeout=10)
        auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user=user, role="root"),
                           timeout=10)
        auth.AuthEnable(etcdrpc.AuthEnableRequest(), timeout=10)


def test_a_watch_created_after_the_auth_token_expired_gets_a_new_token() -> None:
    """etcd refuses a watch created on a stream whose token expired ("permission
    denied"): the hub re-opens the stream with a fresh token; both watches work."""
    require_local_etcd()
    with LocalEtcd(size=1, base=87, extra_args=("--auth-token-ttl", "1")) as cluster:
        _enable_auth(cluster.members[0], "root", "s3cret")
        url = cluster.url_with_prefix("auth")
        with open_store(url, user="root", password="s3cret") as store, \
                store.session("A", ttl_s=30) as a:
            leases = a.claim_many(["first", "second"])
            first, second = Calls(), Calls()
            unsubscribe = [store.backend.subscribe_job("first", first)]
            hub = _hub(store)
            poll_until(lambda: hub.watch_ids == 1 + SESSION, 10)
            time.sleep(2.5)  # real time must pass for the stream's token to expire
            unsubscribe.append(store.backend.subscribe_job("second", second))
            poll_until(lambda: hub.watch_ids == 2 + SESSION, 10)
            assert hub.streams_opened == 2  # the first one's token had expired
            for lease, calls in zip(leases, (first, second), strict=True):
                calls.reset()
                started = time.monotonic()
                lease.release()  # type: ignore[union-attr]
                calls.woken_within(started, WAKES_WITHIN_S)
            for leave in unsubscribe:
                leave()
