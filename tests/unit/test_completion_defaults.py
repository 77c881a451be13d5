"""The looped defaults of ``Backend.complete_many``, ``Backend.complete_and_claim_next``,
``Backend.claim_from_queue_many``, ``Backend.release_many`` and ``Backend.fail_many``
(for stores that cannot do them in one round trip: etcd, ZooKeeper) keep the rules of the
native ones: the completion, ``claim_next_many`` and batch-ending conformance cases on a
memory store stripped of its native versions, and what the defaults do when the store
fails part-way."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from consensus_lease import LeaseStore
from consensus_lease.backend import Backend
from consensus_lease.backends.memory import MemoryBackend
from consensus_lease.errors import BackendUnavailable, SessionExpired
from consensus_lease.record import ClaimResult, JobState
from consensus_lease.session import Session
from consensus_lease.states import LeaseState, SessionState
from consensus_lease.testing.conformance_completion import CompletionConformance
from consensus_lease.testing.conformance_ending import EndingConformance
from consensus_lease.testing.conformance_queue_batch import QueueBatchConformance


class LoopedMemory(MemoryBackend):
    """A memory store that completes one job per call and claims one queue job per call,
    as a store without batching."""

    capabilities = dataclasses.replace(
        MemoryBackend.capabilities, max_complete_batch=1, fused_claim_next=False,
        max_queue_claim_batch=1, max_end_batch=1)
    complete_many = Backend.complete_many  # type: ignore[assignment]
    release_many = Backend.release_many  # type: ignore[assignment]
    fail_many = Backend.fail_many  # type: ignore[assignment]
    complete_and_claim_next = Backend.complete_and_claim_next  # type: ignore[assignment]
    claim_from_queue_many = Backend.claim_from_queue_many  # type: ignore[assignment]


class TestLoopedDefaults(CompletionConformance, QueueBatchConformance, EndingConformance):
    @pytest.fixture
    def store(self) -> Iterator[LeaseStore]:
        store = LeaseStore(LoopedMemory())
        try:
            yield store
        finally:
            store.close()

    @pytest.fixture
    def sessions(self) -> Iterator[list[Session]]:
        opened: list[Session] = []
        self._opened = opened
        yield opened
        for session in opened:
            session.close()

    def open(self, store: LeaseStore, owner: str, ttl_s: float = 30.0, **kw: Any) -> Session:
        session = store.session(owner, ttl_s, **kw)
        self._opened.append(session)
        return session

    def expire(self, store: LeaseStore, session: Session) -> None:
        store.backend.expire_session(session.session_id)  # type: ignore[attr-defined]

    def _assert_newer(self, store: LeaseStore, old: int, new: int) -> None:
        assert new == old + 1


def test_looped_fused_claim_failing_after_the_completion_returns_no_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The completion committed, then the claim found the store unreachable: the record
    is returned with no lease (the job stays claimable), nothing raised."""
    store = LeaseStore(LoopedMemory())
    try:
        store.enqueue_many("q", ["a", "b"])
        session = store.session("W", 30.0)
        lease = session.claim("a")
        assert lease is not None

        def unreachable(*args: object) -> None:
            raise BackendUnavailable("store unreachable")

        monkeypatch.setattr(store.backend, "queue_candidates", unreachable)
        record, nxt = lease.complete_and_claim_next(b"r", queue="q")
        assert nxt is None and record.state is JobState.COMPLETED
        assert lease.state is LeaseState.COMPLETED
        waiting = store.get("b")
        assert waiting is not None and waiting.state is JobState.AVAILABLE
    finally:
        store.close()


@pytest.fixture
def looped() -> Iterator[tuple[LoopedMemory, LeaseStore, Session]]:
    """A looped store with four jobs in queue ``q``, and a session on it."""
    backend = LoopedMemory()
    store = LeaseStore(backend)
    try:
        store.enqueue_many("q", ["a", "b", "c", "d"])
        yield backend, store, store.session("W", 30.0)
    finally:
        store.close()


def _failing_claims(backend: MemoryBackend, after: int, error: Exception) -> None:
    """Make ``backend.claim`` raise ``error`` once ``after`` claims went through."""
    inner = backend.claim
    made = [0]

    def claim(session: Any, job_id: str) -> ClaimResult | None:
        if made[0] >= after:
            raise error
        made[0] += 1
        return inner(session, job_id)

    backend.claim = claim  # type: ignore[method-assign]


def test_looped_queue_claim_hands_over_the_jobs_claimed_before_an_error(
    looped: tuple[LoopedMemory, LeaseStore, Session],
) -> None:
    """The store stops answering after two claims: the two are returned (held), the
    error is not raised; with none claimed it is."""
    backend, store, session = looped
    _failing_claims(backend, 2, BackendUnavailable("store unreachable"))
    picks = backend.claim_from_queue_many(session.handle, "q", 4)
    assert len(picks) == 2
    for job_id, claim, _ in picks:
        record = store.get(job_id)
        assert record is not None and record.state is JobState.HELD
        assert record.generation == claim.generation
    with pytest.raises(BackendUnavailable):
        backend.claim_from_queue_many(session.handle, "q", 2)


def test_looped_queue_claim_raises_session_expired_even_after_claims(
    looped: tuple[LoopedMemory, LeaseStore, Session],
) -> None:
    """The session's end is raised whatever was claimed before (its jobs go with it),
    and through ``claim_next_many`` it loses the session."""
    backend, _, session = looped
    _failing_claims(backend, 1, SessionExpired("expired in the store"))
    with pytest.raises(SessionExpired):
        session.claim_next_many("q", 3)
    assert session.state is SessionState.LOST and session.leases() == []


def test_split_claim_next_many_returns_the_leases_of_earlier_calls_after_an_error(
    looped: tuple[LoopedMemory, LeaseStore, Session],
) -> None:
    """``n`` split into calls of one job: the store stops answering at the third call;
    the two leases claimed are returned HELD and registered, the error not raised; a
    claim that fails before any job was claimed raises it."""
    backend, _, session = looped
    _failing_claims(backend, 2, BackendUnavailable("store unreachable"))
    leases = session.claim_next_many("q", 4)
    assert len(leases) == 2 and set(session.leases()) == set(leases)
    for lease in leases:
        lease.ensure_held()
    with pytest.raises(BackendUnavailable):
        session.claim_next_many("q", 2)
    assert session.state is SessionState.ACTIVE and len(session.leases()) == 2


def test_looped_release_and_fail_many_answer_an_unreachable_item_alone(
    looped: tuple[LoopedMemory, LeaseStore, Session], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store fails the request of one item: that item is answered with the error
    (its lease still held: nothing applied), the others are released / failed."""
    backend, _, session = looped
    a, b, c, d = (session.claim(j) for j in ("a", "b", "c", "d"))
    assert a is not None and b is not None and c is not None and d is not None
    release, fail = backend.release, backend.fail

    def release_but_b(s: Any, job_id: str, claim: ClaimResult) -> None:
        if job_id == "b":
            raise BackendUnavailable("store unreachable")
        release(s, job_id, claim)

    def fail_but_d(s: Any, job_id: str, *rest: Any) -> Any:
        if job_id == "d":
            raise BackendUnavailable("store unreachable")
        return fail(s, job_id, *rest)

    monkeypatch.setattr(backend, "release", release_but_b)
    monkeypatch.setattr(backend, "fail", fail_but_d)
    out = session.release_many([a, b])
    assert out[0] is None and isinstance(out[1], BackendUnavailable)
    failed = session.fail_many([(c, "boom", 0.0), (d, "boom", 0.0)])
    assert failed[0].state is JobState.AVAILABLE  # type: ignore[union-attr]
    assert isinstance(failed[1], BackendUnavailable)
    assert (a.state, b.state, c.state, d.state) == (
        LeaseState.RELEASED, LeaseState.HELD, LeaseState.FAILED, LeaseState.HELD)
    assert set(session.leases()) == {b, d}
    b.ensure_held()
    d.ensure_held()
    monkeypatch.undo()  # the store answers again
    assert session.release_many([b, d]) == [None, None]


def test_batch_ending_raised_for_the_whole_chunk_is_every_items_answer(
    looped: tuple[LoopedMemory, LeaseStore, Session], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A driver's ``release_many`` / ``fail_many`` that raises (nothing of the batch
    applied) answers every item with that error; a ``SessionExpired`` loses the session
    and every lease with it."""
    backend, _, session = looped
    leases = [session.claim(j) for j in ("a", "b", "c")]
    assert all(leases)
    held = [lease for lease in leases if lease is not None]

    def unreachable(*args: object) -> None:
        raise BackendUnavailable("store unreachable")

    monkeypatch.setattr(backend, "release_many", unreachable)
    out = session.release_many(held[:2])
    assert all(isinstance(r, BackendUnavailable) for r in out) and len(out) == 2
    assert all(lease.state is LeaseState.HELD for lease in held)

    def expired(*args: object) -> None:
        raise SessionExpired("expired in the store")

    monkeypatch.setattr(backend, "fail_many", expired)
    failed = session.fail_many([(lease, "boom") for lease in held])
    assert all(isinstance(r, SessionExpired) for r in failed) and len(failed) == 3
    assert session.state is SessionState.LOST
    assert all(lease.state is LeaseState.LOST for lease in held)
