"""Faults for the etcd backend on local members: lost answers, member failure and pause,
no member at all, credentials and TLS.

Lost answers are injected at the transport (the request is applied, then the answer is
dropped; or dropped before it is sent), so each read-back path is exercised exactly.
Member faults are real: SIGKILL / SIGSTOP of local etcd processes.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from etcd_local import (
    LocalEtcd,
    LocalMember,
    backend_of,
    local_members,
    lose_answers,
    require_local_etcd,
    use_member,
)
from pyetcd import etcdrpc

from consensus_lease import (
    AuthenticationFailed,
    BackendUnavailable,
    InvalidArgument,
    JobState,
    LeaseLost,
    LeaseState,
    LeaseStore,
    OutcomeUnknown,
    open_store,
)
from consensus_lease.errors import JobFailed
from consensus_lease.observe import Observer
from consensus_lease.testing.conformance import poll_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalEtcd]:
    yield from local_members(size=3, base=40)


@pytest.fixture
def healthy(cluster: LocalEtcd) -> Iterator[LocalEtcd]:
    """The shared cluster, restored (thawed, restarted) after the test."""
    cluster.wait_ready()
    yield cluster
    cluster.restore()


def _url(cluster: LocalEtcd, **options: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return cluster.url_with_prefix(f"f-{uuid.uuid4().hex[:12]}") + (f"?{query}" if query else "")


# -- lost answers ---------------------------------------------------------------------------


@pytest.mark.parametrize("applied", [True, False])
def test_claim_with_a_lost_answer_is_read_back(
    healthy: LocalEtcd, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    with open_store(_url(healthy)) as store, store.session("A", 30) as a:
        dropped = lose_answers(store, monkeypatch, applied=applied)
        lease = a.claim("job")
        assert dropped and lease is not None
        record = store.get("job")
        assert record is not None and record.state is JobState.HELD
        assert record.generation == lease.generation  # one claim, not two
        lease.complete(b"ok")


@pytest.mark.parametrize("applied", [True, False])
def test_complete_with_a_lost_answer_is_read_back(
    healthy: LocalEtcd, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    with open_store(_url(healthy)) as store, store.session("A", 30) as a:
        lease = a.claim("job")
        assert lease is not None
        dropped = lose_answers(store, monkeypatch, applied=applied)
        record = lease.complete(b"result")
        assert dropped
        assert (record.state, record.generation, record.result) == (
            JobState.COMPLETED, lease.generation, b"result",
        )
        assert store.get("job") == record


@pytest.mark.parametrize("applied", [True, False])
def test_release_with_a_lost_answer_is_read_back(
    healthy: LocalEtcd, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    with open_store(_url(healthy)) as store, store.session("A", 30) as a:
        lease = a.claim("job")
        assert lease is not None
        dropped = lose_answers(store, monkeypatch, applied=applied)
        lease.release()
        assert dropped and lease.state is LeaseState.RELEASED
        record = store.get("job")
        assert record is not None and record.state is JobState.AVAILABLE


def test_claim_batch_with_a_lost_answer_is_read_back(
    healthy: LocalEtcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(_url(healthy)) as store, store.session("A", 30) as a:
        lose_answers(store, monkeypatch, applied=True)
        leases = a.claim_many(["x", "y", "z"])
        assert all(leases)
        for lease in leases:
            assert lease is not None
            record = store.get(lease.job_id)
            assert record is not None and record.generation == lease.generation


def test_unsettled_claim_is_outcome_unknown_then_adopted(
    healthy: LocalEtcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim lands, its answer is lost and reading back fails too: OutcomeUnknown.
    The session's next claim of the job finds its own key and adopts it."""
    with open_store(_url(healthy, connect_timeout_s=1)) as store, store.session("A", 30) as a:
        transport = backend_of(store)._transport
        lose_answers(store, monkeypatch, applied=True)
        real_call = transport.call

        def no_reads(*args: Any, **kwargs: Any) -> Any:
            raise BackendUnavailable("injected: reads fail")

        monkeypatch.setattr(transport, "call", no_reads)
        with pytest.raises(OutcomeUnknown):
            a.claim("job")
        monkeypatch.setattr(transport, "call", real_call)
        record = store.get("job")
        assert record is not None and record.state is JobState.HELD and record.owner == "A"
        with store.session("B", 30) as b:
            assert b.claim("job") is None  # held, by A's landed claim
        lease = a.claim("job")
        assert lease is not None and lease.generation == record.generation
        lease.complete(b"adopted")


def _version(store: LeaseStore, job_id: str, kind: bytes) -> int:
    """How many times the job's key of ``kind`` was written (0: absent)."""
    backend = backend_of(store)
    answer = backend._transport.member().kv.Range(
        etcdrpc.RangeRequest(key=backend._layout.job(job_id).base + kind), timeout=5
    )
    return int(answer.kvs[0].version) if answer.kvs else 0


@pytest.mark.parametrize("applied", [True, False])
@pytest.mark.parametrize("final", [True, False])
def test_fail_with_a_lost_answer_is_read_back(
    healthy: LocalEtcd, monkeypatch: pytest.MonkeyPatch, applied: bool, final: bool
) -> None:
    """The fail lands (or not) and its answer is lost: reading back finds the error
    record with this request's nonce (or the hold still ours, and sends it again). One
    error record either way; FAILED (the last attempt) or delayed."""
    with open_store(_url(healthy)) as store, store.session("A", 30) as a:
        store.enqueue("q", "job", max_attempts=1 if final else 5)
        lease = a.claim_next("q")
        assert lease is not None
        dropped = lose_answers(store, monkeypatch, applied=applied)
        record = lease.fail("boom", retry_in_s=30)
        assert dropped and lease.state is LeaseState.FAILED
        expected = JobState.FAILED if final else JobState.AVAILABLE
        assert (record.state, record.error, record.attempt) == (expected, "boom", 1)
        stored = store.get("job")
        assert stored is not None and (stored.state, stored.error) == (expected, "boom")
        assert _version(store, "job", b"e") == 1  # written once
        assert _version(store, "job", b"f") == (1 if final else 0)
        assert (stored.not_before is None) == final
        if final:
            with pytest.raises(JobFailed):
                a.claim("job")
        else:
            assert a.claim("job") is None  # the 30 s delay runs
        assert backend_of(store).queue_candidates("q", 10) == []


@pytest.mark.parametrize("applied", [True, False])
def test_requeue_with_a_lost_answer_is_read_back(
    healthy: LocalEtcd, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    with open_store(_url(healthy)) as store, store.session("A", 30) as a:
        store.enqueue("q", "job", max_attempts=1)
        lease = a.claim_next("q")
        assert lease is not None
        assert lease.fail("boom", retry_in_s=0).state is JobState.FAILED
        dropped = lose_answers(store, monkeypatch, applied=applied)
        record = store.requeue("job")
        assert dropped
        assert (record.state, record.attempt, record.error) == (JobState.AVAILABLE, 1, "boom")
        assert _version(store, "job", b"l") == 2  # enqueue, then one requeue
        with pytest.raises(InvalidArgument):
            store.requeue("job")  # not FAILED any more
        again = a.claim_next("q")
        assert again is not None and again.attempt == 2  # a fresh budget of one attempt
        again.complete(b"ok")


@pytest.mark.parametrize("applied", [True, False])
def test_claim_that_fails_the_job_with_a_lost_answer_is_read_back(
    healthy: LocalEtcd, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    """The attempts are used up (the one attempt was released): the claim's second
    transaction makes the job FAILED; its answer is lost; reading back finds the FAILED
    record: JobFailed, written once."""
    with open_store(_url(healthy)) as store, store.session("A", 30) as a:
        store.enqueue("q", "job", max_attempts=1)
        lease = a.claim_next("q")
        assert lease is not None
        lease.release()
        dropped = lose_answers(store, monkeypatch, applied=applied, times=2)
        with pytest.raises(JobFailed) as refused:
            a.claim("job")
        assert len(dropped) == 2  # the limit-refused claim, then the FAILED transaction
        assert refused.value.attempt == 1 and refused.value.error is not None
        assert "without completion" in refused.value.error
        assert _version(store, "job", b"f") == 1
        record = store.get("job")
        assert record is not None and record.state is JobState.FAILED
        assert backend_of(store).queue_candidates("q", 10) == []


@pytest.mark.parametrize("applied", [True, False])
def test_claim_of_a_limited_job_with_a_lost_answer_is_read_back(
    healthy: LocalEtcd, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    with open_store(_url(healthy)) as store, store.session("A", 30) as a:
        store.enqueue("q", "job", max_attempts=3)
        dropped = lose_answers(store, monkeypatch, applied=applied, times=2)
        lease = a.claim("job")
        assert len(dropped) == 2 and lease is not None and lease.attempt == 1
        record = store.get("job")
        assert record is not None and record.state is JobState.HELD
        assert (record.generation, record.attempt) == (lease.generation, 1)  # one claim
        assert _version(store, "job", b"a") == 1
        lease.complete(b"ok")


# -- member faults ------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["leader", "follower"])
def test_failover_when_the_member_in_use_dies(healthy: LocalEtcd, role: str) -> None:
    with open_store(_url(healthy, timeout_s=1)) as store, store.session("A", 10) as a:
        held = a.claim("held")
        assert held is not None
        leader = healthy.leader()
        victim = leader if role == "leader" else next(m for m in healthy.members if m is not leader)
        use_member(store, victim.endpoint)
        healthy.kill(victim)
        start = time.monotonic()
        fresh = a.claim("fresh")  # fails over; during an election it reads back and re-sends
        assert fresh is not None
        record = store.get("fresh")
        assert record is not None and record.generation == fresh.generation
        assert held.complete(b"done").state is JobState.COMPLETED
        a.keepalive()
        assert time.monotonic() - start < 15
        fresh.ensure_held()


def test_paused_member_is_left_and_leases_stay_held(healthy: LocalEtcd) -> None:
    """A member that stops answering (SIGSTOP: connection open, silence) costs one request
    timeout, not the lease: keepalives and claims move to another member."""
    with open_store(_url(healthy, timeout_s=1)) as store, store.session("A", 6) as a:
        lease = a.claim("held")
        assert lease is not None
        follower = next(m for m in healthy.members if m is not healthy.leader())
        use_member(store, follower.endpoint)
        healthy.pause(follower)
        start = time.monotonic()
        fresh = a.claim("fresh")
        assert fresh is not None
        assert time.monotonic() - start < 10
        end = time.monotonic() + 2 * a.granted_ttl_s  # the keepalive thread must fail over
        while time.monotonic() < end:
            lease.ensure_held()
            time.sleep(0.2)  # real time must pass: the lease must outlive its TTL
        assert lease.state is LeaseState.HELD
        record = store.get("fresh")
        assert record is not None and record.generation == fresh.generation


class _Headroom(Observer):
    def __init__(self) -> None:
        self.headrooms: list[float] = []

    def renewed(self, store: str, latency_s: float, headroom_s: float) -> None:
        self.headrooms.append(headroom_s)


def test_silent_member_costs_a_keepalive_one_short_attempt(healthy: LocalEtcd) -> None:
    """A keepalive stream on a member that falls silent (SIGSTOP) is left after a short
    attempt (TTL/10), not after a whole TTL/3 request timeout followed by a pause: the
    renewal lands with most of the TTL still left."""
    observer = _Headroom()
    follower = next(m for m in healthy.members if m is not healthy.leader())
    with open_store(_url(healthy), observer=observer) as store:
        use_member(store, follower.endpoint)  # the keepalive stream opens on it
        with store.session("A", 5) as a:
            lease = a.claim("held")
            assert lease is not None
            poll_until(lambda: observer.headrooms, 2 * a.granted_ttl_s)
            healthy.pause(follower)
            poll_until(lambda: len(observer.headrooms) >= 3, 2 * a.granted_ttl_s)
            lease.ensure_held()
    smallest = min(observer.headrooms)
    # Renewed every 1.67 s, so 2.83 s are left when all is well; a silent member may
    # cost one 0.5 s attempt. (Waiting out a 1.67 s timeout left under 1.2 s.)
    assert smallest >= 0.35 * a.granted_ttl_s, observer.headrooms


def test_no_member_left_is_backend_unavailable_then_lost(healthy: LocalEtcd) -> None:
    with open_store(_url(healthy, timeout_s=0.5, connect_timeout_s=1.5)) as store:
        a = store.session("A", 3)
        lease = a.claim("job")
        assert lease is not None
        for member in healthy.members:
            healthy.kill(member)
        start = time.monotonic()
        with pytest.raises(BackendUnavailable) as exc:
            a.claim("other")
        assert time.monotonic() - start < 6
        assert isinstance(exc.value, (OutcomeUnknown, BackendUnavailable))
        with pytest.raises(BackendUnavailable) as down:
            store.get("job")
        for member in healthy.members:
            assert member.endpoint in str(down.value)
        # Nobody answers keepalives: the session's local deadline passes; never swallowed.
        poll_until(lambda: a.lost.is_set(), timeout_s=10)
        with pytest.raises(LeaseLost):
            lease.ensure_held()
        a.close()  # best effort: the revoke cannot reach anyone; must not hang or raise


# -- credentials --------------------------------------------------------------------------------


def _enable_auth(member: LocalMember, user: str, password: str) -> None:
    """What ``etcdctl user add root && etcdctl auth enable`` does, on the raw stubs."""
    from pyetcd import etcdrpc as r

    with grpc.insecure_channel(member.endpoint) as channel:
        auth = r.AuthStub(channel)
        auth.UserAdd(r.AuthUserAddRequest(name=user, password=password), timeout=10)
        auth.RoleAdd(r.AuthRoleAddRequest(name="root"), timeout=10)
        auth.UserGrantRole(r.AuthUserGrantRoleRequest(user=user, role="root"), timeout=10)
        auth.AuthEnable(r.AuthEnableRequest(), timeout=10)


@pytest.fixture(scope="module")
def auth_cluster() -> Iterator[LocalEtcd]:
    """One member with auth enabled (root / s3cret) and 1 s tokens."""
    require_local_etcd()
    with LocalEtcd(size=1, base=50, extra_args=("--auth-token-ttl", "1")) as c:
        _enable_auth(c.members[0], "root", "s3cret")
        yield c


def test_credentials(auth_cluster: LocalEtcd) -> None:
    url = auth_cluster.url_with_prefix("auth")
    with pytest.raises(AuthenticationFailed):
        open_store(url, user="root", password="wrong")
    with pytest.raises(AuthenticationFailed):
        open_store(url)  # auth is on and we gave no user
    with open_store(url, user="root", password="s3cret") as store, store.session("A", 5) as a:
        lease = a.claim("job")
        assert lease is not None
        # Tokens last 1 s here; after one has expired, the driver authenticates again.
        first_token = backend_of(store)._transport.metadata()
        time.sleep(2.5)  # real time must pass for the token TTL to matter
        lease.renew()
        assert backend_of(store)._transport.metadata() != first_token  # re-authenticated
        assert lease.complete(b"ok").state is JobState.COMPLETED


# -- TLS ----------------------------------------------------------------------------------------

TLS_ADDRESS = "127.0.251.61"


def _make_certs(directory: Path) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={ca}",
            "-keyout", str(directory / f"{ca}.key"), "-out", str(directory / f"{ca}.pem"))
    for name, usage, san in (
        ("server", "serverAuth", f"IP:{TLS_ADDRESS}"),
        ("client", "clientAuth", "DNS:client"),
    ):
        ext = directory / f"{name}.ext"
        ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", str(directory / f"{name}.key"), "-out", str(directory / f"{name}.csr"))
        run("x509", "-req", "-in", str(directory / f"{name}.csr"), "-CA", str(directory / "ca.pem"),
            "-CAkey", str(directory / "ca.key"), "-CAcreateserial", "-days", "1",
            "-extfile", str(ext), "-out", str(directory / f"{name}.pem"))


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalEtcd, Path]]:
    require_local_etcd()
    directory = tmp_path_factory.mktemp("tls")
    _make_certs(directory)
    with LocalEtcd(size=1, base=60, tls_dir=directory) as c:
        yield c, directory


def test_tls_with_client_certificates(tls_cluster: tuple[LocalEtcd, Path]) -> None:
    cluster, certs = tls_cluster
    url = cluster.url_with_prefix("tls")
    good: dict[str, Any] = {
        "ca_file": str(certs / "ca.pem"),
        "key_file": str(certs / "client.key"),
        "cert_file": str(certs / "client.pem"),
    }
    with open_store(url, **good) as store, store.session("A", 5) as a:
        lease = a.claim("job")
        assert lease is not None
        assert lease.complete(b"ok").result == b"ok"
    fast: dict[str, Any] = {"connect_timeout_s": 1, "timeout_s": 0.5}
    with pytest.raises(AuthenticationFailed):  # the server wants a client certificate
        open_store(url, ca_file=str(certs / "ca.pem"), **fast)
    with pytest.raises(AuthenticationFailed):  # we do not trust the server's CA
        open_store(url, **{**good, "ca_file": str(certs / "other-ca.pem")}, **fast)
    with pytest.raises(BackendUnavailable):  # plaintext to a TLS port
        open_store(url, **fast)
