"""The ZooKeeper backend against a real server: the conformance suite, plus what is
specific to ZooKeeper (negotiated TTL, session events, multi-op races, lost answers,
ACLs, no stray znodes).

Where the server comes from is decided in ONE place, the ``zk_target`` fixture in
``zk_local.py``: the 3-member container ensemble (``zookeeper_cluster``) by default, a
local standalone ZooKeeper with ``CONSENSUS_LEASE_ZK=local``. Every test reaches the server
through ``zk_url`` (a fresh chroot per test) or, for faults, the ``zk_target`` adapter; the
fixtures and helpers the ZooKeeper test modules share are in ``zk_local.py`` too. Nothing
sleeps to synchronise: waits poll with deadlines.
"""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from zk_local import (  # noqa: F401  (fixtures)
    LocalZooKeeper,
    ZkTarget,
    available,
    backend,
    chroot_of,
    handle,
    lose_next_answer,
    opened,
    raw_client,
    reading_back_fails,
    session_ttl_s,
    store,
    zk_target,
    zk_url,
)

from consensus_lease import LeaseStore, open_store
from consensus_lease.backend import SessionEvent
from consensus_lease.backends.zookeeper import ZooKeeperBackend
from consensus_lease.backends.zookeeper._jobs_claim import Plan
from consensus_lease.backends.zookeeper._layout import JobPaths, new_nonce
from consensus_lease.backends.zookeeper._sessions import Status, ZkSession
from consensus_lease.errors import (
    AuthenticationFailed,
    BackendUnavailable,
    InvalidArgument,
    JobCompleted,
    LeaseSuspended,
    OutcomeUnknown,
    SessionExpired,
    StaleLeaseError,
)
from consensus_lease.record import ClaimResult, JobState
from consensus_lease.session import Session
from consensus_lease.states import LeaseState, SessionState
from consensus_lease.testing.conformance import BackendConformance, poll_until

pytestmark = pytest.mark.slow


def znodes_under(url: str) -> dict[str, list[str]]:
    """job znode name -> its children, for the chroot of ``url``."""
    base = "/" + url.split("://", 1)[1].split("/", 1)[1].split("?")[0] + "/jobs"
    client = raw_client(url)
    try:
        return {name: client.get_children(f"{base}/{name}") for name in client.get_children(base)}
    finally:
        client.stop()
        client.close()


# -- the conformance suite -----------------------------------------------------------------


class TestZooKeeperConformance(BackendConformance):
    short_ttl_s = 1.0
    long_ttl_s = 30.0

    @pytest.fixture(autouse=True)
    def _url(self, zk_url: str) -> None:
        self.url = zk_url

    def open_store_for_test(self) -> LeaseStore:
        return open_store(self.url, connect_timeout_s=30)

    def process_url(self, store: LeaseStore) -> str | None:
        return self.url

    def regress(self, store: LeaseStore, between: Callable[[], None]) -> None:
        """The store identity deleted, as a wipe of the ensemble leaves it (the real
        wipe: ``test_zookeeper_epoch``); the job znodes keep their versions."""
        between()
        raw = raw_client(self.url)
        try:
            raw.delete(f"{chroot_of(self.url)}/identity")
        finally:
            raw.stop()
            raw.close()


# -- ZooKeeper-specific behaviour ------------------------------------------------------------


def test_granted_ttl_is_the_negotiated_session_timeout(
    opened: Callable[..., Session], zk_target: ZkTarget
) -> None:
    floor_s = 2 * zk_target.tick_ms / 1000
    assert opened("short", ttl_s=0.2).granted_ttl_s == pytest.approx(max(0.2, floor_s))
    assert opened("long", ttl_s=600).granted_ttl_s == pytest.approx(60.0)  # maxSessionTimeout
    middle = opened("middle", ttl_s=3.0)
    assert middle.granted_ttl_s == pytest.approx(3.0)
    assert middle.keepalive() == pytest.approx(3.0)


def test_a_session_that_expires_while_opening_is_backend_unavailable(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a busy host a new session can expire before its setup read is answered: the
    open fails like any other open (BackendUnavailable, nothing created), never with
    SessionExpired, which means "the session you had is over"."""
    backend: Any = store.backend
    before = len(backend._sessions)

    def expired(_h: Any) -> None:
        raise SessionExpired("kazoo reported the session LOST (expired by the server)")

    monkeypatch.setattr(backend, "_open_store", expired)
    with pytest.raises(BackendUnavailable, match=r"opening a session: .*expired"):
        store.session("late")
    assert len(backend._sessions) == before


def test_session_is_the_ephemeral_owner(store: LeaseStore, opened: Callable[..., Session],
                                        zk_url: str) -> None:
    a = opened("A")
    lease = a.claim("job")
    assert lease is not None and lease.generation == 1
    client = raw_client(zk_url)
    try:
        base = "/" + zk_url.split("/", 3)[3] + "/jobs"
        _, stat = client.get(f"{base}/job")
        _, owner_stat = client.get(f"{base}/job/owner")
        assert stat.version == 1 and stat.ephemeralOwner == 0
        assert owner_stat.ephemeralOwner == handle(a).sid
        assert f"{owner_stat.ephemeralOwner:#x}" == f"{int(a.session_id, 16):#x}"
    finally:
        client.stop()
        client.close()


def test_completion_beats_a_claim_prepared_before_it(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    """B reads the job (version g) just before A's completion commits, then sends the
    claim multi prepared from that read: its versioned set_data must fail, and the job
    must stay completed."""
    a, b = opened("A"), opened("B")
    lease = a.claim("raced")
    assert lease is not None
    paths = JobPaths.of(backend.config.base, "raced")
    version_read_by_b = handle(b).client.exists(paths.job).version
    assert version_read_by_b == lease.generation
    lease.complete(b"done")  # commits between B's read and B's write
    outcome: dict[str, Any] = {}
    retry = backend._claims.send(handle(b), [Plan(paths, version_read_by_b, new_nonce())],
                                 outcome, set())
    assert outcome == {} and retry == ["raced"]  # BadVersion: read again
    with pytest.raises(JobCompleted) as done:
        b.claim("raced")
    assert done.value.generation == lease.generation
    record = store.get("raced")
    assert record is not None and record.state is JobState.COMPLETED
    assert (record.generation, record.result, record.owner) == (lease.generation, b"done", "A")
    assert handle(b).client.exists(paths.owner) is None
    assert handle(b).client.exists(paths.job).version == lease.generation + 1


def test_claimers_racing_a_completion_never_win(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    a = opened("A")
    claimers = [opened(f"C{i}") for i in range(3)]
    for round_ in range(4):
        job = f"job-{round_}"
        lease = a.claim(job)
        assert lease is not None
        stop = threading.Event()
        won: list[Any] = []
        errors: list[BaseException] = []

        def spam(session: Session, job: str = job, stop: threading.Event = stop,
                 won: list[Any] = won, errors: list[BaseException] = errors) -> None:
            while not stop.is_set():
                try:
                    if session.claim(job) is not None:
                        won.append(session.owner)
                except JobCompleted:
                    return
                except BaseException as exc:
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=spam, args=(s,)) for s in claimers]
        for t in threads:
            t.start()
        lease.complete(b"r")
        for t in threads:
            t.join(timeout=30)
        stop.set()
        assert not won and not errors, (won, errors)
        record = store.get(job)
        assert record is not None and record.state is JobState.COMPLETED


def test_stale_holder_is_rejected_with_the_current_generation(
    backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    a, b = opened("A"), opened("B")
    first = a.claim("job")
    assert first is not None
    first.release()
    second = b.claim("job")
    assert second is not None and second.generation == first.generation + 1
    for call in (
        lambda: backend.renew(a.handle, "job", first.claim_result),
        lambda: backend.release(a.handle, "job", first.claim_result),
        lambda: backend.complete(a.handle, "job", first.claim_result, b"x"),
        lambda: backend.complete(a.handle, "job", ClaimResult(second.generation), b"x"),
        lambda: backend.complete(a.handle, "job", second.claim_result, b"x"),  # B's handle
    ):
        with pytest.raises(StaleLeaseError) as stale:
            call()
        assert stale.value.current_generation == second.generation
    second.renew()
    second.complete(b"ok")
    with pytest.raises(StaleLeaseError):
        backend.renew(b.handle, "job", second.claim_result)


def test_no_stray_znodes(store: LeaseStore, opened: Callable[..., Session], zk_url: str) -> None:
    a, b = opened("A"), opened("B")
    done = a.claim("done")
    assert done is not None
    assert b.claim("done") is None  # failed claim
    done.complete(b"x")
    with pytest.raises(JobCompleted):
        b.claim("done")
    released = a.claim("released")
    assert released is not None
    released.release()
    closed = opened("C")
    assert closed.claim("closed") is not None
    closed.close()
    a.claim_many(["m1", "m2"])
    a.close()
    assert znodes_under(zk_url) == {"done": [], "released": [], "closed": [], "m1": [], "m2": []}


def test_deleted_jobs_container_is_recreated(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str
) -> None:
    a = opened("A")
    client = raw_client(zk_url)
    try:
        client.delete("/" + zk_url.split("/", 3)[3] + "/jobs")  # empty: nothing claimed yet
    finally:
        client.stop()
        client.close()
    lease = a.claim("job")
    assert lease is not None and lease.generation == 1


def test_session_events(zk_url: str, zk_target: ZkTarget) -> None:
    """SUSPENDED when the connection is lost, RECONNECTED when the same session is back,
    EXPIRED when the store expires it; the expired session's client is never reused."""
    store = open_store(zk_url, connect_timeout_s=30, timeout_s=30)
    backend = store.backend
    assert isinstance(backend, ZooKeeperBackend)
    events: list[SessionEvent] = []
    h = backend.open_session("A", 8.0, events.append)
    assert isinstance(h, ZkSession)
    try:
        claim = backend.claim(h, "job")
        assert claim == ClaimResult(1, attempt=1)
        zk_target.stop()
        try:
            poll_until(lambda: SessionEvent.SUSPENDED in events, 30)
            with pytest.raises(BackendUnavailable):
                backend.keepalive(h)
        finally:
            zk_target.start()
        poll_until(lambda: SessionEvent.RECONNECTED in events, 30)
        backend.renew(h, "job", claim)  # the same session still holds it
        backend.expire_session(h.session_id)
        assert events[-1] is SessionEvent.EXPIRED and h.status is Status.EXPIRED
        with pytest.raises(SessionExpired):
            backend.keepalive(h)
        with pytest.raises(SessionExpired):
            backend.claim(h, "other")
        poll_until(lambda: not h.client.connected, 30)  # stopped, not living on
        other = backend.open_session("B", 8.0)
        assert backend.claim(other, "job") == ClaimResult(2, attempt=2)
    finally:
        store.close()


def test_core_session_suspends_and_resumes(zk_target: ZkTarget, zk_url: str) -> None:
    store = open_store(zk_url, connect_timeout_s=30)
    try:
        session = store.session("A", ttl_s=8.0)
        lease = session.claim("job")
        assert lease is not None
        zk_target.pause()
        try:
            poll_until(lambda: lease.state is LeaseState.SUSPENDED, 30)
            with pytest.raises(LeaseSuspended):
                lease.ensure_held()
        finally:
            zk_target.resume()
        poll_until(lambda: lease.state is LeaseState.HELD, 30)
        lease.ensure_held()
        assert session.state is SessionState.ACTIVE
        lease.complete(b"after the blip")
        session.close()
    finally:
        store.close()


def test_unreachable_store_fails_in_bounded_time() -> None:
    """open_store connects (as on etcd): an unreachable ensemble is reported there."""
    start = time.monotonic()
    with pytest.raises(BackendUnavailable) as info:
        open_store("zk://127.0.250.9:9,127.0.250.10:9/x", connect_timeout_s=1.0)
    assert "127.0.250.9:9" in str(info.value)
    assert time.monotonic() - start < 20


def test_digest_auth_and_acls(zk_url: str) -> None:
    owner = open_store(zk_url, user="svc", password="right")
    intruder = open_store(zk_url, user="svc", password="wrong")
    anonymous = open_store(zk_url)
    try:
        with owner.session("A") as a:
            lease = a.claim("secret")
            assert lease is not None
            for other in (intruder, anonymous):
                with pytest.raises(AuthenticationFailed):
                    other.get("secret")
                with pytest.raises(AuthenticationFailed):  # it cannot read the store identity
                    other.session("X")
            lease.complete(b"ok")
        world = open_store(zk_url + "-read", user="svc", password="right",
                           acl="creator_world_read")
        reader = open_store(zk_url + "-read")
        try:
            with world.session("A") as a:
                assert a.claim("public") is not None
                record = reader.get("public")
                assert record is not None and record.state is JobState.HELD
        finally:
            world.close()
            reader.close()
    finally:
        for s in (owner, intruder, anonymous):
            s.close()


def test_claim_many_is_one_multi_and_reports_each_job(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    a, b = opened("A"), opened("B")
    assert b.claim("held") is not None
    done = b.claim("done")
    assert done is not None
    done.complete(b"x")
    sent: list[int] = []
    real = backend._wire.commit

    def counting(*args: Any, **kwargs: Any) -> Any:
        sent.append(1)
        return real(*args, **kwargs)

    backend._wire.commit = counting  # type: ignore[method-assign]
    ids = [f"n-{i}" for i in range(40)] + ["held", "done"]
    leases = a.claim_many(ids)
    assert sent == [1]
    assert [lease is None for lease in leases] == [False] * 40 + [True, True]
    assert all(lease is not None and lease.generation == 1 for lease in leases[:40])
    assert len(store.records()) == 42


def test_records_are_ordered_and_limited(store: LeaseStore, opened: Callable[..., Session]) -> None:
    a = opened("A")
    ids = ["b", "a/b", "..", "é", "Z", "a"]
    for job_id in ids:
        assert a.claim(job_id) is not None
    assert [r.job_id for r in store.records()] == sorted(ids)
    assert [r.job_id for r in store.records(limit=2)] == sorted(ids)[:2]
    assert all(r.lease_until is None for r in store.records())


def test_wait_for_change_is_woken_by_the_watch(
    backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    a = opened("A")
    lease = a.claim("job")
    assert lease is not None
    start = time.monotonic()
    backend.wait_for_change("job", 0.3)  # held: times out
    assert time.monotonic() - start >= 0.25
    woke: list[float] = []

    def wait() -> None:
        backend.wait_for_change("job", 30)
        woke.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    waiter.start()
    poll_until(lambda: backend._watches._armed, 10)
    released_at = time.monotonic()
    lease.release()
    waiter.join(timeout=30)
    assert woke and woke[0] - released_at < 5  # woken, not timed out at 30 s
    start = time.monotonic()
    backend.wait_for_change("job", 30)  # nobody holds it: returns at once
    assert time.monotonic() - start < 5


def test_result_size_is_checked_before_sending(opened: Callable[..., Session], zk_url: str) -> None:
    store = open_store(zk_url, max_result_bytes=10)
    try:
        with store.session("A") as a:
            lease = a.claim("job")
            assert lease is not None
            with pytest.raises(InvalidArgument):
                lease.complete(b"x" * 11)
            lease.ensure_held()
            assert lease.complete(b"x" * 10).result == b"x" * 10
    finally:
        store.close()


# -- lost answers: read back, never re-send blindly ---------------------------------------


@pytest.mark.parametrize("apply", [True, False], ids=["applied", "not-applied"])
def test_lost_claim_answer_is_read_back(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str, apply: bool
) -> None:
    a, b = opened("A"), opened("B")
    lose_next_answer(handle(a).client, apply)
    lease = a.claim("job")
    assert lease is not None and lease.generation == 1  # no double bump either way
    assert b.claim("job") is None
    lease.release()
    again = b.claim("job")
    assert again is not None and again.generation == 2
    again.release()
    assert znodes_under(zk_url) == {"job": []}


@pytest.mark.parametrize("apply", [True, False], ids=["applied", "not-applied"])
def test_lost_completion_and_release_answers_are_read_back(
    store: LeaseStore, opened: Callable[..., Session], apply: bool
) -> None:
    a = opened("A")
    lease = a.claim("done")
    assert lease is not None
    lose_next_answer(handle(a).client, apply)
    record = lease.complete(b"r")
    assert (record.state, record.generation, record.result) == (JobState.COMPLETED, 1, b"r")
    stored = store.get("done")
    assert stored is not None and stored.state is JobState.COMPLETED and stored.generation == 1
    other = a.claim("free")
    assert other is not None
    lose_next_answer(handle(a).client, apply)
    other.release()
    free = store.get("free")
    assert free is not None and free.state is JobState.AVAILABLE and free.generation == 1


def test_unsettled_claim_is_adopted_or_handed_back(
    zk_url: str, opened: Callable[..., Session]
) -> None:
    store = open_store(zk_url, timeout_s=1.0)
    backend = store.backend
    assert isinstance(backend, ZooKeeperBackend)
    try:
        h = backend.open_session("A", 10.0)
        assert isinstance(h, ZkSession)
        with reading_back_fails(backend):
            for job in ("adopted", "handed-back"):
                lose_next_answer(h.client, apply=True)
                with pytest.raises(OutcomeUnknown):
                    backend.claim(h, job)
        assert backend.claim(h, "adopted") == ClaimResult(1, attempt=1)  # its own claim, found again
        backend.keepalive(h)  # hands back the one nobody asked for again
        record = store.get("handed-back")
        assert record is not None and record.state is JobState.AVAILABLE
        assert h.uncertain == {}
        b = opened("B")
        lease = b.claim("handed-back")
        assert lease is not None and lease.generation == 2
    finally:
        store.close()


# -- liveness follows the worker's renewals -------------------------------------------------


def test_unrenewed_session_ends_and_frees_its_jobs(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    """kazoo keeps pinging, so the ZooKeeper session would live on: the core ends it
    (close_session) once its local deadline passed with no renewal."""
    a = opened("A", ttl_s=1.0, keepalive=False)
    b = opened("B")
    lease = a.claim("job")
    assert lease is not None
    taken = b.claim("job", wait_s=20)
    assert taken is not None and taken.generation == 2
    # The worker's local deadline (send + TTL - margin) passed, the session is LOST...
    assert a.state is SessionState.LOST and lease.state is LeaseState.LOST
    # ...and the core closed its ZooKeeper session, which is what freed the job.
    poll_until(lambda: handle(a).status is Status.CLOSED, 10)
    with pytest.raises(SessionExpired):
        store.backend.keepalive(a.handle)
    poll_until(lambda: not handle(a).client.connected, 10)


def test_backend_session_without_the_core_does_not_lapse(
    store: LeaseStore, backend: ZooKeeperBackend
) -> None:
    """The backend no longer ends sessions by itself: a handle used without the core's
    Session, never renewed, keeps its job past its granted TTL until closed."""
    h = backend.open_session("A", 1.0)
    assert isinstance(h, ZkSession)
    try:
        claim = backend.claim(h, "job")
        assert claim == ClaimResult(1, attempt=1)
        past = time.monotonic() + 2 * h.granted_ttl_s + 1.0
        while time.monotonic() < past:
            assert h.status is Status.CONNECTED
            time.sleep(0.2)  # real time must pass: the session must outlive its TTL
        record = store.get("job")
        assert record is not None and record.state is JobState.HELD
        backend.renew(h, "job", claim)
    finally:
        backend.close_session(h)
    record = store.get("job")
    assert record is not None and record.state is JobState.AVAILABLE


# -- TLS (a local server of its own: the container ensemble serves plain TCP) ----------------


@pytest.fixture(scope="module")
def tls_server() -> Iterator[LocalZooKeeper]:
    reason = available()
    if reason is not None:
        pytest.skip(f"no local ZooKeeper for the TLS test: {reason}")
    with LocalZooKeeper(address="127.0.250.2", tls=True) as server:
        yield server


def test_tls_with_client_certificate(tls_server: LocalZooKeeper) -> None:
    d = tls_server.dir
    url = f"zk://{tls_server.tls_endpoint}/tls?ca_file={d / 'ca.pem'}"
    store = open_store(url, cert_file=str(d / "client.crt"), key_file=str(d / "client.key"))
    try:
        assert isinstance(store.backend, ZooKeeperBackend) and store.backend.config.tls
        with store.session("A", ttl_s=5.0) as a:
            lease = a.claim("secure")
            assert lease is not None
            lease.renew()
            lease.complete(b"over TLS")
        record = store.get("secure")
        assert record is not None and record.result == b"over TLS"
    finally:
        store.close()
    for bad in (
        url,  # no client certificate: handshake refused
        f"zk://{tls_server.tls_endpoint}/tls",  # plain TCP
    ):
        with pytest.raises(BackendUnavailable):  # open_store connects
            open_store(bad, connect_timeout_s=2.0)
