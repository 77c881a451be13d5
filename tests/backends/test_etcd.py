"""Focused tests of the etcd backend: URL parsing and key encoding (no server), then the
etcd mapping on one local member (keys, tokens, lease TTLs, watches, batching, records).

Fault tests (failover, lost answers, auth, TLS) are in ``test_etcd_faults.py``; the
conformance suite in ``test_etcd_conformance.py``.
"""

from __future__ import annotations

import base64
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import grpc
import pytest
from etcd_local import LocalEtcd, backend_of, local_members, lose_answers
from hypothesis import given, settings
from hypothesis import strategies as st
from pyetcd import etcdrpc

from consensus_lease import (
    BackendUnavailable,
    InvalidArgument,
    JobCompleted,
    JobState,
    LeaseStore,
    SessionExpired,
    StaleLeaseError,
    UnsupportedBackend,
    open_store,
)
from consensus_lease._election import election_key, is_election_key
from consensus_lease.backends.etcd import EtcdBackend, EtcdClaim, EtcdSession
from consensus_lease.backends.etcd._config import DEFAULT_PREFIX, parse_url
from consensus_lease.backends.etcd._jobs_fail import delay_ttl_s
from consensus_lease.backends.etcd._layout import (
    JOB_KINDS,
    Completion,
    History,
    Layout,
    Owner,
    _dump,
    free_range,
)
from consensus_lease.backends.etcd._transport import Failure
from consensus_lease.record import ClaimResult, LeaseRecord
from consensus_lease.testing.conformance import poll_until
from consensus_lease.validation import MAX_JOB_ID_BYTES

_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))

# -- URL and options (no server) ------------------------------------------------------------


def test_url_hosts_prefix_and_defaults() -> None:
    config = parse_url("etcd://127.0.0.11:2379,127.0.0.12,[::1]:2381/jobs/team-a/", {})
    assert config.endpoints == ("127.0.0.11:2379", "127.0.0.12:2379", "[::1]:2381")
    assert config.prefix == b"/jobs/team-a"
    assert (config.timeout_s, config.connect_timeout_s) == (5.0, 10.0)
    assert parse_url("etcd://h", {}).prefix == DEFAULT_PREFIX.encode()
    assert parse_url("etcd://h/%C3%A9t%C3%A9", {}).prefix == "/été".encode()


def test_url_options_query_and_kwargs() -> None:
    config = parse_url(
        "etcd://u%40x:p%3Aw@h:1/p", {"timeout_s": "0.5", "connect_timeout_s": 2, "user": "kw"}
    )
    assert (config.timeout_s, config.connect_timeout_s) == (0.5, 2.0)
    assert (config.user, config.password) == ("kw", "p:w")  # keyword arguments win
    assert "p:w" not in repr(config)


@pytest.mark.parametrize(
    ("url", "options", "error"),
    [
        ("etcd:///p", {}, UnsupportedBackend),
        ("etcd://h:0/p", {}, UnsupportedBackend),
        ("etcd://h:99999/p", {}, UnsupportedBackend),
        ("etcd://h:x/p", {}, UnsupportedBackend),
        ("etcd://h,,g/p", {}, UnsupportedBackend),
        ("etcd://h/p", {"bogus": "1"}, InvalidArgument),
        ("etcd://h/p", {"timeout_s": "0"}, InvalidArgument),
        ("etcd://h/p", {"timeout_s": "nan"}, InvalidArgument),
        ("etcd://h/p", {"connect_timeout_s": True}, InvalidArgument),
        ("etcd://h/p", {"user": "root"}, InvalidArgument),
        ("etcd://h/p", {"key_file": __file__, "cert_file": __file__}, InvalidArgument),
        ("etcd://h/p", {"ca_file": __file__, "key_file": __file__}, InvalidArgument),
        ("etcd://h/p", {"ca_file": "/nonexistent/ca.pem"}, InvalidArgument),
        ("etcd://h/p", {"ca_cert": __file__}, InvalidArgument),
    ],
)
def test_bad_urls_and_options(url: str, options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_url(url, options)


def test_unreadable_tls_file_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument):
        open_store("etcd://127.0.251.99:1/p", ca_file="/nonexistent/ca.pem")


# -- key encoding (no server) -----------------------------------------------------------------

_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
_job_ids = st.text(
    alphabet=st.characters(blacklist_categories=_SURROGATES, blacklist_characters="\x00"),
    min_size=1,
).filter(lambda s: len(s.encode()) <= MAX_JOB_ID_BYTES and not is_election_key(s))
"""Valid job ids: check_job_id refuses the prefix reserved for election keys (an id such
as ``"\x1fe:"`` is an election key with an empty name, which parses as an election)."""


@settings(max_examples=300)
@given(a=_job_ids, b=_job_ids)
def test_job_keys_round_trip_never_collide_and_keep_order(a: str, b: str) -> None:
    layout = Layout(b"/p")
    ka, kb = layout.job(a), layout.job(b)
    for keys, job in ((ka, a), (kb, b)):
        assert keys.owner.startswith(b"/p/") and keys.owner.count(b"/") == 3
        assert layout.parse(keys.owner) == (job, b"o")
        assert layout.parse(keys.completion) == (job, b"c")
    assert (ka.owner == kb.owner) == (a == b)
    assert (ka.owner < kb.owner) == (a < b)  # records() relies on key order == id order


@pytest.mark.parametrize("job", ["../../x", "/", "a/b", " ", "..", "ü/..", "x" * 256])
def test_hostile_ids_stay_inside_their_directory(job: str) -> None:
    layout = Layout(b"/jobs")
    keys = layout.job(job)
    assert keys.base.startswith(b"/jobs/") and b"/" not in keys.base[len(b"/jobs/") : -1]
    assert layout.parse(keys.history) == (job, b"h")


@settings(max_examples=300)
@given(name=_job_ids, job=_job_ids)
def test_election_keys_live_apart_from_every_job(name: str, job: str) -> None:
    """An election's keys are under ``PREFIX/elections/``, parse back to its election key,
    and never collide with a job's, whatever the job id (hex looking ones included)."""
    layout = Layout(b"/p")
    election = layout.job(election_key(name))
    assert election.is_election and not layout.job(job).is_election
    assert election.base.startswith(b"/p/elections/") and election.owner.count(b"/") == 4
    assert layout.parse(election.owner) == (election_key(name), b"o")
    assert layout.parse(election.value) == (election_key(name), b"v")
    assert not layout.job(job).owner.startswith(layout.elections)
    assert layout.parse(layout.job(job).owner) == (job, b"o")
    assert election.owner < layout.jobs_range_end


_texts = st.text(alphabet=st.characters(blacklist_categories=_SURROGATES))


@settings(max_examples=300)
@given(owner=_texts, session=_texts, nonce=_texts, epoch=st.integers(0, 2**19 - 1),
       generation=st.integers(0, 2**63 - 1), result=st.binary(max_size=64))
def test_owner_and_completion_values_are_the_json_they_always_were(
        owner: str, session: str, nonce: str, epoch: int, generation: int,
        result: bytes) -> None:
    """The hot path writes owner, completion and release values directly; they stay byte for byte
    the sorted, compact JSON every earlier version wrote and reads, and read back."""
    held = Owner(owner, session, nonce, epoch)
    fields: dict[str, object] = {"nonce": nonce, "owner": owner, "session": session}
    if epoch:
        fields["epoch"] = epoch
    assert held.encode() == _dump(fields)
    assert Owner.encoder(owner, session)(nonce, epoch) == held.encode()  # a session's
    assert Owner.decode(held.encode(), b"k") == held
    done = Completion(owner, session, generation, result)
    assert done.encode() == _dump({"generation": generation, "owner": owner,
                                   "result": base64.b64encode(result).decode(),
                                   "session": session})
    assert Completion.decode(done.encode(), b"k") == done
    for marker in (History(None, session, nonce, generation, released=True),
                   History(owner, session, nonce)):
        fields = {"nonce": nonce, "owner": marker.owner, "session": session}
        if marker.generation is not None:
            fields.update(generation=generation, released=True)
        assert marker.encode() == _dump(fields)
        assert History.decode(marker.encode(), b"k") == marker
    assert History.release_encoder(session)(nonce, generation) == History(
        None, session, nonce, generation, released=True).encode()  # a session's


def test_the_claims_range_compare_covers_exactly_limit_not_before_and_owner() -> None:
    """A common claim compares one range, ``l`` to ``o``, for the limit, not-before and
    owner keys: no other kind of job key may sort inside it (a claim would then be
    refused by that key too), none of the three outside."""
    base = Layout(b"/a").job("job").base
    key, end = free_range(base)
    inside = {kind for kind in JOB_KINDS if key <= base + kind < end}
    assert inside == {b"l", b"n", b"o"}


def test_foreign_keys_under_the_prefix_are_ignored() -> None:
    layout = Layout(b"/a")
    assert layout.parse(b"/a/62/6a6f62/o") is None  # a nested prefix /a/62's key
    assert layout.parse(b"/a/6A/o") is None  # not our canonical hex
    assert layout.parse(b"/a/61 62/o") is None
    assert layout.parse(b"/a/6162/x") is None
    assert layout.parse(b"/b/6162/o") is None
    assert layout.parse(b"/a/elections/6A/o") is None
    assert layout.parse(b"/a/elections/61/62/o") is None
    assert layout.parse(b"/a/elections/o") is None


# -- one local member ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[LocalEtcd]:
    """One member (metrics are then exact). To run these on the container kit instead:
    ``return request.getfixturevalue("etcd_cluster")``."""
    yield from local_members(size=1, base=20)


@pytest.fixture
def url(etcd_server: LocalEtcd) -> str:
    return etcd_server.url_with_prefix(f"t-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def store(url: str) -> Iterator[LeaseStore]:
    with open_store(url) as store:
        yield store


def _raw(store: LeaseStore) -> Any:
    """A raw KV stub on the store's member, to look at keys as etcd has them."""
    return backend_of(store)._transport.member().kv


def _raw_lease(store: LeaseStore) -> Any:
    """A raw Lease stub on the store's member."""
    backend = store.backend
    assert isinstance(backend, EtcdBackend)
    return backend._transport.member().lease


def _keys_under(store: LeaseStore) -> dict[bytes, Any]:
    backend = backend_of(store)
    root = backend._layout.root
    answer = _raw(store).Range(
        etcdrpc.RangeRequest(key=root, range_end=backend._layout.range_end), timeout=5
    )
    return {bytes(kv.key): kv for kv in answer.kvs}


def _metric(etcd_server: LocalEtcd, name: str, method: str | None = None) -> float:
    member = etcd_server.members[0]
    with _HTTP.open(f"{member.metrics_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (method is None or f'grpc_method="{method}"' in line):
            if method is None and not re.match(rf"{name}(\s|\{{)", line):
                continue
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_generation_is_the_owner_keys_create_revision(store: LeaseStore) -> None:
    with store.session("A", ttl_s=5) as a:
        lease = a.claim("job/../x y")
        assert lease is not None
        keys = _keys_under(store)
        session_key = backend_of(store)._layout.session(int(a.session_id, 16))
        assert keys.pop(session_key).lease == int(a.session_id, 16)  # the session's own
        owners = [kv for k, kv in keys.items() if k.endswith(b"/o")]
        assert len(owners) == 1 and len(keys) == 3  # owner, history, attempts
        (owner,) = owners
        assert owner.create_revision == lease.generation
        assert owner.lease == int(a.session_id, 16)
        lease.release()
        again = a.claim("job/../x y")
        assert again is not None and again.generation > lease.generation


def test_granted_ttl_is_what_etcd_granted(store: LeaseStore) -> None:
    with store.session("A", ttl_s=1.2) as a, store.session("B", ttl_s=7) as b:
        assert a.granted_ttl_s == 2.0  # whole seconds, rounded up
        assert b.granted_ttl_s == 7.0
        assert a.keepalive() == 2.0


def test_claim_with_a_dead_lease_is_session_expired(store: LeaseStore) -> None:
    backend = store.backend
    assert isinstance(backend, EtcdBackend)
    handle = backend.open_session("A", 5)
    backend.expire_session(handle.session_id)
    with pytest.raises(SessionExpired):
        backend.claim(handle, "job")
    with pytest.raises(SessionExpired):
        backend.keepalive(handle)
    assert store.get("job") is None
    backend.close_session(handle)  # idempotent on a lease already gone


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "injected: connection reset"


class _Lost:
    """A request future whose answer never comes: the connection broke."""

    def result(self) -> Any:
        raise _Unavailable()


def test_renew_sends_its_check_and_the_keepalive_in_one_round_trip(
        store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ownership check is sent, the keepalive made during its round trip, then the
    check's answer read; a check whose answer is lost is asked again (it is a read), and
    a stale claim is still refused by it."""
    backend = backend_of(store)
    transport = backend._transport
    events: list[str] = []
    real_start, real_keepalive = transport.start, backend._keepalives.keepalive_many

    def start(*args: Any, **kwargs: Any) -> Any:
        finish = real_start(*args, **kwargs)
        events.append("check sent")

        def answered() -> Any:
            events.append("check answered")
            return finish()
        return answered

    def keepalive(*args: Any, **kwargs: Any) -> Any:
        events.append("keepalive")
        return real_keepalive(*args, **kwargs)

    monkeypatch.setattr(transport, "start", start)
    monkeypatch.setattr(backend._keepalives, "keepalive_many", keepalive)
    with store.session("A", ttl_s=5) as session:
        lease = session.claim("job")
        assert lease is not None
        events.clear()
        lease.renew()
        assert events == ["check sent", "keepalive", "check answered"]

        kv = transport.members[transport._current].kv
        lost: list[int] = []
        real_future = kv.Txn.future

        class Flaky:
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return real_txn(*args, **kwargs)

            def future(self, *args: Any, **kwargs: Any) -> Any:
                if not lost:
                    lost.append(1)
                    return _Lost()
                return real_future(*args, **kwargs)

        real_txn = kv.Txn
        monkeypatch.setattr(kv, "Txn", Flaky())
        lease.renew()  # the lost answer is asked again
        assert lost == [1]
        stale = ClaimResult(lease.generation + 1, handle=None)
        with pytest.raises(StaleLeaseError):
            backend.renew(session.handle, "job", stale)
        lease.complete(b"")


def test_a_claim_carries_its_owner_value_and_is_checked_without_it(store: LeaseStore) -> None:
    """The claim's handle (an ``EtcdClaim``) carries the owner value that renew, complete
    and release compare; a claim without one is checked by the session's lease; a claim
    presented by another session proves nothing; a handle of another kind is refused."""
    backend = store.backend
    assert isinstance(backend, EtcdBackend)
    a, b = backend.open_session("A", 10), backend.open_session("B", 10)
    try:
        claim = backend.claim(a, "job")
        assert claim is not None and isinstance(claim.handle, EtcdClaim)
        assert (claim.handle.job_id, claim.handle.queue_known, claim.handle.queue) == (
            "job", True, None,
        )
        assert claim.attempt == claim.handle.attempt == 1
        assert claim.handle.nonce == claim.handle.claim_nonce == Owner.decode(
            claim.handle.owner_value, b"o").nonce
        bare = ClaimResult(claim.generation, attempt=1)
        assert bare == claim  # the handle is not compared
        assert backend.renew(a, "job", claim) > 0
        assert backend.renew(a, "job", bare) > 0  # by the session's lease
        with pytest.raises(StaleLeaseError):
            backend.complete(b, "job", claim, b"A's claim presented by B")
        with pytest.raises(InvalidArgument):
            backend.release(a, "job", ClaimResult(claim.generation, handle="not an etcd claim"))
        record = store.get("job")
        assert record is not None and record.state is JobState.HELD and record.owner == "A"
        done = backend.complete(a, "job", bare, b"r")
        assert (done.state, done.generation, done.result) == (
            JobState.COMPLETED, claim.generation, b"r",
        )
        assert backend.complete(a, "job", claim, b"r") == done  # a repeat, with the handle
    finally:
        backend.close_session(a)
        backend.close_session(b)


def test_expiry_and_close_free_jobs_at_once(store: LeaseStore) -> None:
    with store.session("A", ttl_s=60) as a, store.session("B", ttl_s=60) as b:
        for job in ("j1", "j2"):
            assert a.claim(job) is not None
        start = time.monotonic()
        store.backend.expire_session(a.session_id)  # type: ignore[attr-defined]
        assert b.claim("j1") is not None  # no 60 s TTL to wait out: etcd deleted the keys
        assert time.monotonic() - start < 5
        record = store.get("j2")
        assert record is not None and record.state is JobState.AVAILABLE
        assert record.owner == "A"  # expired, not released: the last holder stays on record
        with pytest.raises(SessionExpired):
            a.keepalive()
    with store.session("C", ttl_s=60) as c:
        assert c.claim("j3") is not None
    with store.session("D", ttl_s=60) as d:
        assert d.claim("j3") is not None  # closing C revoked its lease


def test_get_after_release_expiry_and_completion(store: LeaseStore) -> None:
    with store.session("A", ttl_s=10) as a:
        lease = a.claim("job")
        assert lease is not None
        held = store.get("job")
        assert held is not None and held.state is JobState.HELD
        assert held.lease_until is not None and held.lease_until > time.time()
        lease.release()
        released = store.get("job")
        assert released is not None
        assert (released.state, released.owner, released.generation) == (
            JobState.AVAILABLE, None, lease.generation,
        )
        second = a.claim("job")
        assert second is not None
        done = second.complete(b"r")
        assert store.get("job") == done
        assert done.generation == second.generation and done.lease_until is None


def test_takeover_is_woken_by_the_store(store: LeaseStore, etcd_server: LocalEtcd) -> None:
    """B waits 30 s; A's session ends in the store; B gets the job at once (a watch, not
    the next poll)."""
    with store.session("A", ttl_s=60) as a, store.session("B", ttl_s=60) as b:
        assert a.claim("job") is not None
        watchers = _metric(etcd_server, "etcd_debugging_mvcc_watcher_total")
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(b.claim("job", wait_s=30)))
        waiter.start()
        poll_until(  # B is waiting on its watch
            lambda: _metric(etcd_server, "etcd_debugging_mvcc_watcher_total") > watchers, 10
        )
        start = time.monotonic()
        store.backend.expire_session(a.session_id)  # type: ignore[attr-defined]
        waiter.join(timeout=30)
        assert got and got[0] is not None
        assert time.monotonic() - start < 3


def test_takeover_after_ttl_runs_out(store: LeaseStore) -> None:
    with store.session("A", ttl_s=1, keepalive=False) as a, store.session("B", 60) as b:
        first = a.claim("job")
        assert first is not None
        start = time.monotonic()
        second = b.claim("job", wait_s=30)
        assert second is not None and second.generation > first.generation
        waited = time.monotonic() - start
        assert waited < a.granted_ttl_s + 3  # the lease's TTL plus etcd's expiry sweep


def test_wait_for_change_cancels_its_watch(store: LeaseStore, etcd_server: LocalEtcd) -> None:
    with store.session("A", ttl_s=30) as a:
        assert a.claim("job") is not None
        # The session's own watch (its key's deletion, ``_sessions_revocation``) is created
        # on the shared stream asynchronously: counted before ``before`` is read, or a
        # fresh-clone run on a busy host saw one watcher "left" that was the session's.
        hub = store.backend._subscriptions_etcd.hub  # type: ignore[attr-defined]
        poll_until(lambda: hub.watch_ids == 1, 10)
        before = _metric(etcd_server, "etcd_debugging_mvcc_watcher_total")
        for _ in range(5):
            start = time.monotonic()
            store.backend.wait_for_change("job", 0.3)
            assert 0.2 < time.monotonic() - start < 5
        poll_until(
            lambda: _metric(etcd_server, "etcd_debugging_mvcc_watcher_total") <= before, 10
        )


def test_keepalives_share_one_stream_and_do_not_grow_with_jobs(
    store: LeaseStore, etcd_server: LocalEtcd
) -> None:
    with store.session("A", ttl_s=60, keepalive=False) as a:
        leases = a.claim_many([f"j{i}" for i in range(40)])
        assert all(leases)
        streams = _metric(etcd_server, "grpc_server_started_total", "LeaseKeepAlive")
        messages = _metric(etcd_server, "grpc_server_msg_received_total", "LeaseKeepAlive")
        for _ in range(10):
            a.keepalive()
        assert _metric(etcd_server, "grpc_server_msg_received_total", "LeaseKeepAlive") == (
            messages + 10
        )
        assert _metric(etcd_server, "grpc_server_started_total", "LeaseKeepAlive") <= streams + 1


def test_claim_many_is_one_transaction(store: LeaseStore) -> None:
    with store.session("A", 30) as a, store.session("B", 30) as b:
        first = a.claim("held")
        assert first is not None
        done = a.claim("done")
        assert done is not None
        done.complete(b"")
        results = b.claim_many(["x", "held", "done", "y"])
        assert results[1] is None and results[2] is None
        x, y = results[0], results[3]
        assert x is not None and y is not None
        assert x.generation == y.generation > first.generation  # one revision for the batch


def test_claim_many_falls_back_when_the_server_allows_fewer_ops() -> None:
    with LocalEtcd(size=1, base=30, extra_args=("--max-txn-ops", "8")) as cluster:
        with open_store(cluster.url_with_prefix("small")) as store, store.session("A", 30) as a:
            leases = a.claim_many([f"j{i}" for i in range(10)])
            assert all(leases)
            assert len({lease.generation for lease in leases if lease}) == 10


def test_records_in_id_order_across_pages_with_limit(store: LeaseStore) -> None:
    ids = [f"job-{i:04d}" for i in range(300)] + ["é", "a/b", "Z", "zz"]  # > 512 keys
    with store.session("A", 60) as a:
        for start in range(0, len(ids), 64):
            assert all(a.claim_many(ids[start : start + 64]))
        records = store.records()
        assert [r.job_id for r in records] == sorted(ids)
        assert all(r.state is JobState.HELD and r.owner == "A" for r in records)
        assert [r.job_id for r in store.records(limit=3)] == sorted(ids)[:3]
        assert store.records(limit=0) == []


def test_nested_prefixes_do_not_leak_into_each_other(etcd_server: LocalEtcd) -> None:
    base = f"n-{uuid.uuid4().hex[:8]}"
    with (
        open_store(etcd_server.url_with_prefix(base)) as outer,
        open_store(etcd_server.url_with_prefix(f"{base}/62")) as inner,
        inner.session("I", 30) as i,
        outer.session("O", 30) as o,
    ):
        assert i.claim("job") is not None
        assert o.claim("b") is not None  # hex of "b" is 62, the inner prefix's last segment
        assert [r.job_id for r in outer.records()] == ["b"]
        assert [r.job_id for r in inner.records()] == ["job"]
        record = outer.get("b")
        assert record is not None and record.owner == "O"


def test_result_too_large_is_invalid_argument_and_lease_still_held(store: LeaseStore) -> None:
    with store.session("A", 30) as a:
        lease = a.claim("big")
        assert lease is not None
        with pytest.raises(InvalidArgument):
            lease.complete(b"x" * (3 * 1024 * 1024))
        lease.ensure_held()
        assert lease.complete(b"small").result == b"small"
        with pytest.raises(JobCompleted):
            a.claim("big")


def test_unreachable_store_fails_in_bounded_time_naming_endpoints() -> None:
    start = time.monotonic()
    with pytest.raises(BackendUnavailable) as exc:
        open_store("etcd://127.0.251.97:9,127.0.251.98:9/p?connect_timeout_s=1&timeout_s=0.5")
    assert time.monotonic() - start < 5
    assert "127.0.251.97:9" in str(exc.value) and "127.0.251.98:9" in str(exc.value)
    assert isinstance(exc.value.__cause__, grpc.RpcError)


# -- job lifecycle: the retry delay's lease -------------------------------------------------


@pytest.mark.parametrize(
    ("retry_in_s", "ttl_s"), [(0.001, 1), (0.5, 1), (1.0, 1), (1.2, 2), (299.5, 300)]
)
def test_retry_delay_rounds_up_to_whole_seconds(retry_in_s: float, ttl_s: int) -> None:
    assert delay_ttl_s(retry_in_s) == ttl_s


def test_retry_delay_is_a_key_on_its_own_lease(store: LeaseStore) -> None:
    """fail(retry_in_s=1.2) puts the not-before key on a new lease of ceil(1.2) = 2 s
    (this member's minimum TTL is 1 s); claims get None until etcd deletes it, and the
    record shows when (local clock + the lease's TTL)."""
    with store.session("A", ttl_s=30) as a:
        lease = a.claim("job")
        assert lease is not None
        sent = time.monotonic()
        record = lease.fail("try later", retry_in_s=1.2)
        assert record.state is JobState.AVAILABLE and record.attempt == 1
        assert record.not_before is not None and 1.0 < record.not_before - time.time() <= 2.5
        keys = _keys_under(store)
        (delay,) = [kv for k, kv in keys.items() if k.endswith(b"/n")]
        assert delay.lease not in (0, int(a.session_id, 16))
        ttl = _raw_lease(store).LeaseTimeToLive(
            etcdrpc.LeaseTimeToLiveRequest(ID=delay.lease), timeout=5
        )
        assert ttl.grantedTTL == 2
        shown = store.get("job")
        assert shown is not None and shown.not_before is not None
        assert (shown.state, shown.error, shown.attempt) == (JobState.AVAILABLE, "try later", 1)
        assert a.claim("job") is None  # the delay runs: held-like
        again = a.claim("job", wait_s=30)  # woken by the key's deletion
        assert again is not None and again.attempt == 2
        assert 1.2 <= time.monotonic() - sent < 2 + 3  # the TTL plus etcd's expiry sweep
        assert not any(k.endswith(b"/n") for k in _keys_under(store))
        again.release()
        third = a.claim("job")
        assert third is not None and third.attempt == 3
        assert third.fail("at once", retry_in_s=0).not_before is None
        assert not any(k.endswith(b"/n") for k in _keys_under(store))  # no delay, no key
        assert store.get("job") == LeaseRecord(
            "job", None, None, third.generation, JobState.AVAILABLE, None, 3, "at once"
        )


def test_stale_fail_revokes_the_delay_lease(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = store.backend
    assert isinstance(backend, EtcdBackend)
    granted: list[int] = []
    real_grant = backend._ops.grant

    def grant(ttl_s: int, what: str) -> tuple[int, int]:
        granted.append(real_grant(ttl_s, what)[0])
        return granted[-1], ttl_s

    monkeypatch.setattr(backend._ops, "grant", grant)
    a = backend.open_session("A", 10)
    try:
        claim = backend.claim(a, "job")
        assert claim is not None
        stale = ClaimResult(claim.generation - 1)  # never held at that generation
        with pytest.raises(StaleLeaseError):
            backend.fail(a, "job", stale, "late", 30.0)
        (lease_id,) = granted
        ttl = _raw_lease(store).LeaseTimeToLive(
            etcdrpc.LeaseTimeToLiveRequest(ID=lease_id), timeout=5
        )
        assert ttl.TTL == -1  # revoked, not left to run for 30 s
        record = store.get("job")
        assert record is not None and record.state is JobState.HELD and record.error is None
    finally:
        backend.close_session(a)


def test_held_and_completed_records_show_the_attempt_limit(store: LeaseStore) -> None:
    """``max_attempts`` lands in its own field (not in ``not_before``) in every state."""
    assert store.enqueue("q", "job", b"p", max_attempts=3)
    with store.session("A", ttl_s=30) as a:
        lease = a.claim("job")
        assert lease is not None
        held = store.get("job")
        assert held is not None and held.state is JobState.HELD
        assert (held.max_attempts, held.not_before, held.attempt) == (3, None, 1)
        done = lease.complete(b"r")
        assert (done.max_attempts, done.not_before) == (3, None)
        assert store.get("job") == done


def _completion_reads(store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record, per completion transaction sent, how many reads its success branch has."""
    transport = backend_of(store)._transport
    real = transport.send
    reads: list[int] = []

    def send(*args: Any, **kwargs: Any) -> Any:
        request = args[2]
        if str(kwargs.get("what", "")).startswith("completion of"):
            reads.append(sum(op.HasField("request_range") for op in request.success))
        return real(*args, **kwargs)

    monkeypatch.setattr(transport, "send", send)
    return reads


def test_completion_record_comes_from_the_claim_handle(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record complete returns equals what ``get`` reads afterwards, whether the
    claim's handle told the whole lifecycle (first attempt, no limit: no read in the
    transaction), only the attempt and limit (a later attempt: the error key is read),
    or nothing (a claim without its handle: attempts, error and limit are read)."""
    reads = _completion_reads(store, monkeypatch)
    with store.session("A", ttl_s=30) as a:
        first = a.claim("first")
        assert first is not None
        assert first.complete(b"1") == store.get("first")

        lease = a.claim("again")
        assert lease is not None
        lease.fail("boom", retry_in_s=0)
        lease = a.claim("again")
        assert lease is not None and lease.attempt == 2
        done = lease.complete(b"2")
        assert (done.attempt, done.error) == (2, "boom")
        assert done == store.get("again")

        assert store.enqueue("q", "limited", b"p", max_attempts=4)
        lease = a.claim("limited")
        assert lease is not None
        done = lease.complete(b"3")
        assert (done.attempt, done.error, done.max_attempts) == (1, None, 4)
        assert done == store.get("limited")
    assert reads == [0, 1, 1]

    backend = backend_of(store)
    session = backend.open_session("B", 30)
    try:
        claim = backend.claim(session, "bare")
        assert claim is not None
        bare = ClaimResult(claim.generation, attempt=claim.attempt)  # no handle
        done = backend.complete(session, "bare", bare, b"4")
        assert (done.attempt, done.error, done.max_attempts) == (1, None, None)
        assert done == store.get("bare")
        assert reads == [0, 1, 1, 3]
    finally:
        backend.close_session(session)


def _sent_txns(store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Record each write transaction sent: ``(what, a copy of the request)``."""
    transport = backend_of(store)._transport
    real = transport.send
    sent: list[tuple[str, Any]] = []

    def send(*args: Any, **kwargs: Any) -> Any:
        copy = etcdrpc.TxnRequest()
        copy.CopyFrom(args[2])
        sent.append((str(kwargs.get("what", "")), copy))
        return real(*args, **kwargs)

    monkeypatch.setattr(transport, "send", send)
    return sent


def _without(request: Any, *fields: tuple[str, int, str]) -> Any:
    """A copy of a transaction with the fields ``(list, index, name)`` cleared."""
    copy = etcdrpc.TxnRequest()
    copy.CopyFrom(request)
    for where, index, name in fields:
        part = getattr(copy, where)[index]
        if where == "success":
            part = part.request_put
        if name == "value":
            part.ClearField(name)
        else:
            setattr(part, name, 0)
    return copy


def test_claims_and_releases_of_one_name_copy_the_last_request(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock claimed and released again and again sends a copy of the last claim
    (release) transaction with its own owner value (generation, marker): the request is
    the one built afresh, and a release with an older claim is still refused."""
    sent = _sent_txns(store, monkeypatch)
    backend = backend_of(store)
    session = backend.open_session("A", 30)
    try:
        claims = []
        for _ in range(3):
            claim = backend.claim(session, "lock")
            assert claim is not None
            claims.append(claim)
            backend.release(session, "lock", claim)
            other = backend.claim(session, f"other-{len(claims)}")  # kept: another job's
            assert other is not None
            backend.release(session, f"other-{len(claims)}", other)
        stale = backend.claim(session, "lock")
        assert stale is not None
        backend.release(session, "lock", stale)
        again = backend.claim(session, "lock")
        assert again is not None
        with pytest.raises(StaleLeaseError):
            backend.release(session, "lock", stale)  # the kept request had its generation
        backend.release(session, "lock", again)
        record = store.get("lock")
        assert record is not None and record.state is JobState.AVAILABLE
    finally:
        backend.close_session(session)
    lock_claims = [r for what, r in sent if what == "claim of 'lock'"]
    lock_releases = [r for what, r in sent if what.startswith("release of 'lock'")]
    assert len(lock_claims) == 5 and len(lock_releases) == 6
    values = [r.success[0].request_put.value for r in lock_claims]
    assert all(r.success[1].request_put.value == v for r, v in zip(lock_claims, values,
                                                                    strict=True))
    assert len(set(values)) == 5  # each with its own nonce
    bare = [_without(r, ("success", 0, "value"), ("success", 1, "value")) for r in lock_claims]
    assert all(b == bare[0] for b in bare)
    others = [r for what, r in sent if what.startswith("claim of 'other")]
    assert _without(others[0], ("success", 0, "value"), ("success", 1, "value")) != bare[0]
    for release, claim, value in zip(lock_releases, [*claims, stale, stale, again],
                                     [*values[:4], values[3], values[4]], strict=True):
        assert release.compare[0].create_revision == claim.generation
        assert release.compare[1].value == value
        marker = History.decode(release.success[1].request_put.value, b"h")
        assert (marker.generation, marker.released) == (claim.generation, True)
    bare = [_without(r, ("compare", 0, "create_revision"), ("compare", 1, "value"),
                     ("success", 1, "value")) for r in lock_releases]
    assert all(b == bare[0] for b in bare)


# -- elections: the leader's value -----------------------------------------------------------


@pytest.fixture
def backend(store: LeaseStore) -> EtcdBackend:
    return backend_of(store)


def _value_keys(store: LeaseStore) -> list[Any]:
    return [kv for k, kv in _keys_under(store).items() if k.endswith(b"/v")]


def _session(backend: EtcdBackend, owner: str, ttl_s: float = 30) -> EtcdSession:
    handle = backend.open_session(owner, ttl_s)
    assert isinstance(handle, EtcdSession)
    return handle


def test_set_value_is_shown_while_held_and_goes_with_the_hold(
    store: LeaseStore, backend: EtcdBackend
) -> None:
    """The value key rides on the session's lease under ``PREFIX/elections/``; release
    deletes it in its own transaction, expiry with the lease; a new hold starts without."""
    name = election_key("leader/../é")
    a, b = _session(backend, "A"), _session(backend, "B")
    try:
        claim = backend.claim(a, name)
        assert claim is not None
        record = backend.get(name)
        assert record is not None and record.state is JobState.HELD and record.value is None
        backend.set_value(a, name, claim, b"\x00first")
        backend.set_value(a, name, claim, b"second")
        record = backend.get(name)
        assert record is not None and (record.value, record.generation) == (
            b"second", claim.generation)
        (value_kv,) = _value_keys(store)
        assert value_kv.key.startswith(backend._layout.elections)
        assert value_kv.lease == a.lease_id
        backend.release(a, name, claim)
        assert _value_keys(store) == []
        released = backend.get(name)
        assert released is not None and released.state is JobState.AVAILABLE
        assert released.value is None
        again = backend.claim(b, name)
        assert again is not None and again.generation > claim.generation
        backend.set_value(b, name, again, b"b's")
        backend.expire_session(b.session_id)
        assert _value_keys(store) == []  # deleted with the lease
        third = backend.claim(a, name)
        assert third is not None
        record = backend.get(name)
        assert record is not None and record.owner == "A" and record.value is None
    finally:
        backend.close_session(a)
        backend.close_session(b)


def test_set_value_outside_the_hold_is_refused(store: LeaseStore, backend: EtcdBackend) -> None:
    name = election_key("e")
    a, b = _session(backend, "A"), _session(backend, "B")
    try:
        claim = backend.claim(a, name)
        assert claim is not None
        backend.set_value(a, name, claim, b"a")
        with pytest.raises(StaleLeaseError):  # A's claim presented by B
            backend.set_value(b, name, claim, b"b")
        with pytest.raises(StaleLeaseError):  # never held at that generation
            backend.set_value(a, name, ClaimResult(claim.generation - 1), b"old")
        bare = ClaimResult(claim.generation)  # no handle: checked by the session's lease
        backend.set_value(a, name, bare, b"bare")
        record = backend.get(name)
        assert record is not None and record.value == b"bare"
        backend.release(a, name, claim)
        with pytest.raises(StaleLeaseError):  # released: a late write is refused
            backend.set_value(a, name, claim, b"late")
        newer = backend.claim(b, name)
        assert newer is not None
        with pytest.raises(StaleLeaseError):
            backend.set_value(a, name, claim, b"late")
        record = backend.get(name)
        assert record is not None and record.owner == "B" and record.value is None
        backend.expire_session(b.session_id)
        with pytest.raises(SessionExpired):
            backend.set_value(b, name, newer, b"expired")
    finally:
        backend.close_session(a)
        backend.close_session(b)


def test_a_value_of_an_older_hold_is_stale(store: LeaseStore, backend: EtcdBackend) -> None:
    """On a job (not an election) release leaves the value key; the next hold of the
    same session does not show it, and its own value replaces it."""
    a = _session(backend, "A")
    try:
        first = backend.claim(a, "job")
        assert first is not None
        backend.set_value(a, "job", first, b"old")
        backend.release(a, "job", first)
        assert len(_value_keys(store)) == 1  # left in place: ordinary releases unchanged
        second = backend.claim(a, "job")
        assert second is not None
        record = backend.get("job")
        assert record is not None and record.state is JobState.HELD and record.value is None
        backend.set_value(a, "job", second, b"new")
        record = backend.get("job")
        assert record is not None and record.value == b"new"
    finally:
        backend.close_session(a)


@pytest.mark.parametrize("applied", [True, False])
def test_set_value_with_a_lost_answer_is_read_back(
    store: LeaseStore, backend: EtcdBackend, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    name = election_key("e")
    a = _session(backend, "A")
    try:
        claim = backend.claim(a, name)
        assert claim is not None
        backend.set_value(a, name, claim, b"before")
        dropped = lose_answers(store, monkeypatch, applied=applied)
        backend.set_value(a, name, claim, b"after")
        assert dropped and dropped[0].startswith("setting the value")
        record = backend.get(name)
        assert record is not None and record.value == b"after"
        (value_kv,) = _value_keys(store)
        assert value_kv.version == 2  # "after" put once: re-sent only when not applied
    finally:
        backend.close_session(a)


def test_set_value_with_a_lost_answer_after_the_hold_ended_is_refused(
    store: LeaseStore, backend: EtcdBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer is lost and the session's lease ends meanwhile: reading back finds
    neither our value nor our hold."""
    name = election_key("e")
    a = _session(backend, "A")
    try:
        claim = backend.claim(a, name)
        assert claim is not None
        transport = backend._transport
        real = transport.send

        def send(*args: Any, **kwargs: Any) -> Any:
            monkeypatch.setattr(transport, "send", real)
            backend.expire_session(a.session_id)
            raise Failure("injected", grpc.StatusCode.DEADLINE_EXCEEDED, "answer lost")

        monkeypatch.setattr(transport, "send", send)
        with pytest.raises(SessionExpired):
            backend.set_value(a, name, claim, b"v")
        assert _value_keys(store) == []
    finally:
        backend.close_session(a)


def test_a_value_too_large_is_invalid_argument_and_still_held(
    store: LeaseStore, backend: EtcdBackend
) -> None:
    name = election_key("e")
    a = _session(backend, "A")
    try:
        claim = backend.claim(a, name)
        assert claim is not None
        with pytest.raises(InvalidArgument):
            backend.set_value(a, name, claim, b"x" * (2 * 1024 * 1024))
        backend.renew(a, name, claim)
        backend.set_value(a, name, claim, b"x" * (1024 * 1024))  # 1 MiB fits, base64 and all
        record = backend.get(name)
        assert record is not None and record.value == b"x" * (1024 * 1024)
    finally:
        backend.close_session(a)


def test_elections_are_no_jobs(store: LeaseStore, backend: EtcdBackend) -> None:
    """Elections are left out of records (across pages too), cannot be enqueued, and
    complete and fail of one delete its value."""
    # Around PREFIX/elections/ in key order: hex e4b8ad... before it, f09f9880 after it.
    jobs = [f"中{i:03d}" for i in range(150)] + ["😀", "a"]
    a = _session(backend, "A")
    try:
        for start in range(0, len(jobs), 64):
            assert all(backend.claim_many(a, jobs[start : start + 64]))
        names = [election_key(f"n{i}") for i in range(140)]  # > 512 keys with their values
        for name in names:
            claim = backend.claim(a, name)
            assert claim is not None
            backend.set_value(a, name, claim, b"v")
        assert [r.job_id for r in backend.records()] == sorted(jobs)
        assert [r.job_id for r in backend.records(limit=100)] == sorted(jobs)[:100]
        with pytest.raises(InvalidArgument):
            backend.enqueue("q", election_key("n0"), b"")
        assert backend.queue_jobs("q") == []
        ended = backend.claim(a, election_key("ended"))
        assert ended is not None
        backend.set_value(a, election_key("ended"), ended, b"v")
        record = backend.fail(a, election_key("ended"), ended, "stop", 0.0)
        assert record.value is None
        again = backend.claim(a, election_key("ended"))
        assert again is not None
        backend.set_value(a, election_key("ended"), again, b"v")
        assert backend.complete(a, election_key("ended"), again, b"").value is None
        assert len(_value_keys(store)) == len(names)  # the failed and completed ones: gone
    finally:
        backend.close_session(a)


def test_an_election_subscription_follows_every_change(
    store: LeaseStore, backend: EtcdBackend
) -> None:
    """Observers follow a new leader and its value, not only its end (a job's
    subscription ignores a new claim)."""
    name = election_key("e")
    calls: list[str] = []
    a = _session(backend, "A")
    unsubscribe = backend.subscribe_job(name, lambda: calls.append("woken"))
    try:
        poll_until(lambda: len(calls) == 1, 10)  # claimable when subscribed: called at once
        claim = backend.claim(a, name)
        assert claim is not None
        poll_until(lambda: len(calls) == 2, 10)  # a new leader
        backend.set_value(a, name, claim, b"v")
        poll_until(lambda: len(calls) == 3, 10)  # its value
        backend.release(a, name, claim)
        poll_until(lambda: len(calls) == 4, 10)  # its end
    finally:
        unsubscribe()
        backend.close_session(a)
