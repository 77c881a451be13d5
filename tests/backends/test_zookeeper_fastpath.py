"""Completion and release without a read round trip: a claim returns what it made as its
``ClaimResult.handle`` (a ``Hold``), the lease hands it back, and the multi is sent at
once; the store checks generation (the job znode's version) and holder (the owner znode,
its version) atomically with the writes. A claim without a hold of this session
(``ClaimResult(generation)``) is read first.

Each test counts the requests the session's own kazoo client sends (every request but
pings goes through ``KazooClient._call``): the common path is exactly one
``Transaction``; reads only ever come after a failed multi, to say why. Like the other
ZooKeeper tests these run on the 3-member container ensemble unless
``CONSENSUS_LEASE_ZK=local`` (see ``zk_local.py``).
"""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient
from zk_local import (  # noqa: F401  (fixtures)
    LostAnswer,
    backend,
    handle,
    lose_next_answer,
    opened,
    raw,
    reading_back_fails,
    session_ttl_s,
    store,
    zk_target,
    zk_url,
)

from consensus_lease import LeaseStore, open_store
from consensus_lease.backends.zookeeper import ZooKeeperBackend
from consensus_lease.backends.zookeeper._jobs import Hold
from consensus_lease.backends.zookeeper._layout import JobPaths
from consensus_lease.backends.zookeeper._sessions import ZkSession
from consensus_lease.errors import (
    OutcomeUnknown,
    SessionExpired,
    StaleLeaseError,
)
from consensus_lease.record import ClaimResult, JobState
from consensus_lease.session import Session

pytestmark = pytest.mark.slow


def synced(raw: KazooClient) -> KazooClient:
    """``raw`` after a ``sync``: its member has applied every write answered before."""
    raw.sync("/")
    return raw


def requests(h: ZkSession) -> list[str]:
    """From now on, the type of each request ``h``'s client sends (``Transaction`` for a
    multi, ``GetData``/``Exists``/``Sync`` for reads)."""
    sent: list[str] = []
    real = h.client._call

    def counting(request: Any, async_object: Any) -> Any:
        sent.append(type(request).__name__)
        return real(request, async_object)

    h.client._call = counting
    return sent


def paths(backend: ZooKeeperBackend, job_id: str) -> JobPaths:
    return JobPaths.of(backend.config.base, job_id)


def hold(claim: ClaimResult) -> Hold:
    """The hold a claim of this backend returned as its handle."""
    assert isinstance(claim.handle, Hold)
    return claim.handle


# -- the common path: one multi, nothing read ----------------------------------------------


def test_complete_and_release_send_one_multi_and_read_nothing(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    a = opened("A")
    done, free = a.claim("done"), a.claim("free")
    assert done is not None and free is not None
    sent = requests(handle(a))
    record = done.complete(b"r")
    assert (record.state, record.generation, record.result) == (JobState.COMPLETED, 1, b"r")
    free.release()
    assert sent == ["Transaction", "Transaction"]
    assert hold(done.claim_result).ended and hold(free.claim_result).ended
    stored = store.get("done")
    assert stored is not None and stored.state is JobState.COMPLETED and stored.result == b"r"
    stored = store.get("free")
    assert stored is not None and stored.state is JobState.AVAILABLE and stored.generation == 1
    again = opened("B").claim("free")
    assert again is not None and again.generation == 2


def test_queued_job_markers_go_in_the_same_multi(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session], raw: KazooClient
) -> None:
    store.enqueue("q", "j1")
    store.enqueue("q", "j2")
    a = opened("A")
    first, second = a.claim_next("q"), a.claim_next("q")
    assert first is not None and second is not None
    queue = f"{backend.config.queues_base}/q/b/0000000000"  # the queue's first bucket
    assert len(synced(raw).get_children(f"{queue}/held")) == 2
    sent = requests(handle(a))
    first.complete(b"")
    second.release()
    assert sent == ["Transaction", "Transaction"]
    assert synced(raw).get_children(f"{queue}/held") == []
    assert len(synced(raw).get_children(f"{queue}/open")) == 1  # the released one is still open
    assert [job_id for job_id, _ in backend.queue_candidates("q", 10)] == [second.job_id]


def test_marker_deleted_by_hand_is_dropped_without_reading(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session], raw: KazooClient
) -> None:
    store.enqueue("q", "j")
    a = opened("A")
    lease = a.claim_next("q")
    assert lease is not None
    bucket = f"{backend.config.queues_base}/q/b/0000000000"  # the queue's first bucket
    (held,) = synced(raw).get_children(f"{bucket}/held")
    raw.delete(f"{bucket}/held/{held}")
    sent = requests(handle(a))
    lease.complete(b"ok")
    assert sent == ["Transaction", "Transaction"]  # failed on the marker; again without it
    assert synced(raw).get_children(f"{bucket}/open") == []
    assert store.queue_stats("q").completed == 1


# -- what the session does not hold: nothing is written ----------------------------------


def test_a_claim_this_session_does_not_hold_writes_nothing(
    backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    a, b = opened("A"), opened("B")
    first = a.claim("job")
    assert first is not None
    first.release()
    second = b.claim("job")
    assert second is not None and second.generation == 2
    sent = requests(handle(a))
    for call in (
        lambda: backend.release(a.handle, "job", first.claim_result),  # released already
        lambda: backend.complete(a.handle, "job", first.claim_result, b"x"),
        lambda: backend.complete(a.handle, "job", ClaimResult(1), b"x"),
        lambda: backend.complete(a.handle, "job", ClaimResult(2), b"x"),  # B's
        lambda: backend.complete(a.handle, "job", second.claim_result, b"x"),  # B's hold
        lambda: backend.release(a.handle, "job", second.claim_result),
        lambda: backend.release(a.handle, "never-claimed", ClaimResult(1)),
    ):
        with pytest.raises(StaleLeaseError):
            call()
    assert "Transaction" not in sent  # diagnosed by reading only
    assert not hold(second.claim_result).ended  # A's calls say nothing about B's claim
    second.complete(b"B's")


def test_a_claim_without_a_hold_is_read_then_written(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    """A claim presented without its hold (``ClaimResult(generation)``: not made by this
    process) is checked by the session alone: one read shows this session's owner znode
    at that generation, then the one multi."""
    a = opened("A")
    done, free = a.claim("done"), a.claim("free")
    assert done is not None and free is not None
    sent = requests(handle(a))
    record = backend.complete(a.handle, "done", ClaimResult(done.generation), b"r")
    assert (record.state, record.generation, record.result) == (JobState.COMPLETED, 1, b"r")
    assert sent.count("Transaction") == 1 and sent[-1] == "Transaction"
    assert "Sync" in sent[: sent.index("Transaction")]  # read first
    del sent[:]
    backend.release(a.handle, "free", ClaimResult(free.generation))
    assert sent.count("Transaction") == 1 and sent[-1] == "Transaction"
    stored = store.get("free")
    assert stored is not None and stored.state is JobState.AVAILABLE
    stored = store.get("done")
    assert stored is not None and stored.state is JobState.COMPLETED and stored.result == b"r"


def test_retried_completion_returns_the_record_without_a_multi(
    backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    a = opened("A")
    claim = backend.claim(a.handle, "job")
    assert claim == ClaimResult(1, attempt=1)
    first = backend.complete(a.handle, "job", claim, b"r")
    sent = requests(handle(a))
    assert backend.complete(a.handle, "job", claim, b"r") == first  # the hold is ended
    assert backend.complete(a.handle, "job", ClaimResult(1), b"r") == first
    assert "Transaction" not in sent


# -- the fast multi failing: read to say why ----------------------------------------------


def test_a_newer_claim_fails_the_multi_and_is_diagnosed(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session], raw: KazooClient
) -> None:
    """A's owner znode is deleted by hand and B claims: A's hold is stale; its
    completion multi fails on the version, one read says why, nothing is written."""
    a, b = opened("A"), opened("B")
    lease = a.claim("job")
    assert lease is not None
    raw.delete(paths(backend, "job").owner)
    taken = b.claim("job")
    assert taken is not None and taken.generation == 2
    sent = requests(handle(a))
    with pytest.raises(StaleLeaseError) as stale:
        backend.complete(a.handle, "job", lease.claim_result, b"late")
    assert stale.value.current_generation == 2
    assert sent.count("Transaction") == 1
    assert hold(lease.claim_result).ended  # final: later calls read first
    record = store.get("job")
    assert record is not None and record.state is JobState.HELD and record.owner == "B"


def test_owner_znode_gone_with_the_same_version_is_stale(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session], raw: KazooClient
) -> None:
    """The version still stands but the owner znode is gone: the delete fails the multi
    (and with it the versioned set_data); nothing is written."""
    a = opened("A")
    lease = a.claim("job")
    assert lease is not None
    raw.delete(paths(backend, "job").owner)
    sent = requests(handle(a))
    with pytest.raises(StaleLeaseError):
        backend.complete(a.handle, "job", lease.claim_result, b"x")
    assert sent.count("Transaction") == 1
    record = store.get("job")
    assert record is not None and record.state is JobState.AVAILABLE and record.generation == 1


def test_owner_znode_rewritten_is_read_and_still_completed(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session], raw: KazooClient
) -> None:
    """The owner znode's version moved (written by hand): the hold's version fails the
    delete; the read shows it still this session's at the generation; the multi is sent
    again with the version read."""
    a = opened("A")
    lease = a.claim("job")
    assert lease is not None
    owner = paths(backend, "job").owner
    raw.set(owner, synced(raw).get(owner)[0])
    sent = requests(handle(a))
    record = lease.complete(b"ok")
    assert record.state is JobState.COMPLETED
    assert sent.count("Transaction") == 2
    assert synced(raw).exists(owner) is None


def test_renew_with_the_hold_is_one_multi_of_checks(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session], raw: KazooClient
) -> None:
    """Renew sends one multi of two checks (nothing read); a hold whose owner znode went
    (deleted by hand) fails it, and the read that follows says why."""
    a = opened("A")
    lease = a.claim("job")
    assert lease is not None
    sent = requests(handle(a))
    assert backend.renew(a.handle, "job", lease.claim_result) > 0
    assert sent == ["Transaction"]
    version = synced(raw).get(paths(backend, "job").job)[1].version
    assert version == 1  # the checks changed nothing
    raw.delete(paths(backend, "job").owner)
    del sent[:]
    with pytest.raises(StaleLeaseError):
        backend.renew(a.handle, "job", lease.claim_result)
    assert sent[0] == "Transaction" and "GetData" in sent
    assert hold(lease.claim_result).ended  # final: no complete/release will follow


def test_renew_with_the_owner_znode_rewritten_is_read_and_still_held(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session], raw: KazooClient
) -> None:
    a = opened("A")
    lease = a.claim("job")
    assert lease is not None
    owner = paths(backend, "job").owner
    raw.set(owner, synced(raw).get(owner)[0])  # version 1: the hold's check fails
    sent = requests(handle(a))
    backend.renew(a.handle, "job", lease.claim_result)
    assert sent.count("Transaction") == 2  # the checks, then the read's write barrier
    assert lease.complete(b"ok").state is JobState.COMPLETED


def test_expired_session_completes_nothing(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    a = opened("A")
    claim = backend.claim(a.handle, "job")
    assert claim == ClaimResult(1, attempt=1)
    backend.expire_session(a.session_id)
    for unknown in (claim, ClaimResult(1)):
        with pytest.raises(SessionExpired):
            backend.complete(a.handle, "job", unknown, b"x")
        with pytest.raises(SessionExpired):
            backend.release(a.handle, "job", unknown)
    record = store.get("job")
    assert record is not None and record.state is JobState.AVAILABLE


def test_adopted_and_handed_back_claims_carry_their_hold(zk_url: str) -> None:
    """Claims whose answer was lost and could not be read back (OutcomeUnknown) stay on
    the session as uncertain: one is adopted by a later claim of the job, which returns
    its hold, then completed with one multi; keepalive hands the other back (released
    with the hold it read)."""
    store = open_store(zk_url, timeout_s=1.0, connect_timeout_s=30)
    backend = store.backend
    assert isinstance(backend, ZooKeeperBackend)
    try:
        h = backend.open_session("A", 10.0)
        assert isinstance(h, ZkSession)
        with reading_back_fails(backend):
            for job in ("adopted", "handed-back"):
                lose_next_answer(h.client, apply=True)  # the claim's multi: applied, lost
                with pytest.raises(OutcomeUnknown):
                    backend.claim(h, job)
            assert set(h.uncertain) == {"adopted", "handed-back"}
        claim = backend.claim(h, "adopted")  # its own claim, found again
        assert claim == ClaimResult(1, attempt=1) and hold(claim).session is h
        sent = requests(h)
        assert backend.complete(h, "adopted", claim, b"r").state is JobState.COMPLETED
        assert sent == ["Transaction"]
        backend.keepalive(h)
        record = store.get("handed-back")
        assert record is not None and record.state is JobState.AVAILABLE
        assert h.uncertain == {}
    finally:
        store.close()
