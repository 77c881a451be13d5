"""The completion part of the conformance suite: ``Session.complete_many`` (fenced batch
completion) and ``Lease.complete_and_claim_next`` (complete a job and claim the next one
of its queue in one store operation).

Mixed into :class:`~consensus_lease.testing.conformance.BackendConformance`, so every
backend runs it, whether it does these natively in one round trip
(``capabilities.max_complete_batch`` > 1, ``capabilities.fused_claim_next``) or with the
looped defaults of :class:`~consensus_lease.backend.Backend`: the rules are the same. It
uses that class's hooks (``open``, the ``store`` and ``sessions`` fixtures).

A stale item is made the way a paused holder's lease goes stale: its hold is ended in
the store behind the lease's back (the backend's ``release``, as the store's expiry
would) and another session claims the job, while the lease object still says HELD.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from ..errors import InvalidArgument, JobFailed, LeaseError, SessionExpired, StaleLeaseError
from ..lease import Lease
from ..record import EnqueueItem, JobState, LeaseRecord
from ..session import Session
from ..states import LeaseState, SessionState
from ..store import LeaseStore

__all__ = ["CompletionConformance"]


def make_stale(store: LeaseStore, lease: Lease, other: Session) -> Lease:
    """End ``lease``'s hold in the store behind its back and let ``other`` claim the job:
    ``lease`` still says HELD, the store knows a newer generation. Returns the new lease."""
    store.backend.release(lease.session.handle, lease.job_id, lease.claim_result)
    newer = other.claim(lease.job_id)
    assert newer is not None and newer.generation > lease.generation
    return newer


def assert_names_item(error: object, index: int, job_id: str) -> None:
    """``error``, returned or raised for item ``index`` of a batch ending, is that item's
    own: a ``LeaseError`` whose message starts ``item INDEX: `` and names the job, with
    its ``job_id`` (the same on every store)."""
    assert isinstance(error, LeaseError), error
    text = str(error)
    assert text.startswith(f"item {index}: ") and repr(job_id) in text, text
    assert error.job_id == job_id, (error.job_id, job_id)


class CountCalls:
    """Wraps a backend method, counting its calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.inner(*args)


class CompletionConformance:
    """complete_many and complete_and_claim_next, on every backend."""

    open: Any
    expire: Any

    # -- complete_many ---------------------------------------------------------------

    def test_complete_many_stale_item_refused_while_the_others_commit(
        self, store: LeaseStore, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        a, b = self.open(store, "A"), self.open(store, "B")
        leases = [a.claim(j) for j in ("x", "y", "z")]
        assert all(leases)
        x, y, z = (lease for lease in leases if lease is not None)
        newer = make_stale(store, y, b)
        spy = CountCalls(store.backend.complete_many)
        monkeypatch.setattr(store.backend, "complete_many", spy)
        out = a.complete_many([(x, b"rx"), (y, b"ry"), z])
        assert spy.calls == math.ceil(3 / store.capabilities.max_complete_batch)
        assert isinstance(out[0], LeaseRecord) and isinstance(out[2], LeaseRecord)
        assert isinstance(out[1], StaleLeaseError) and out[1].job_id == "y"
        assert_names_item(out[1], 1, "y")
        assert (out[0].job_id, out[0].result, out[0].state) == ("x", b"rx", JobState.COMPLETED)
        assert (out[2].job_id, out[2].result) == ("z", b"")
        assert (x.state, y.state, z.state) == (
            LeaseState.COMPLETED, LeaseState.LOST, LeaseState.COMPLETED)
        assert y.lost_reason is out[1]
        assert a.leases() == []
        record = store.get("y")
        assert record is not None and record.state is JobState.HELD
        assert (record.owner, record.generation) == ("B", newer.generation)
        newer.ensure_held()
        for job_id, result in (("x", b"rx"), ("z", b"")):
            done = store.get(job_id)
            assert done is not None and done.state is JobState.COMPLETED
            assert done.result == result
        assert a.claim("w") is not None  # the session is unharmed

    def test_complete_many_backend_retry_and_stale_generation(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Straight to the backend: a repeat of this session's completion is its record,
        an older generation of a job this session holds again is refused."""
        a = self.open(store, "A")
        done, first = a.claim("done"), a.claim("again")
        assert done is not None and first is not None
        record = done.complete(b"r")
        first.release()
        second = a.claim("again")
        assert second is not None
        out = store.backend.complete_many(a.handle, [
            ("done", done.claim_result, b"r"),
            ("again", first.claim_result, b"stale"),
        ])
        assert out[0] == record
        assert isinstance(out[1], StaleLeaseError)
        held = store.get("again")
        assert held is not None and held.state is JobState.HELD
        assert held.generation == second.generation
        second.ensure_held()

    def test_complete_many_after_the_session_expired(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """The store expired the session: each item is refused with ``SessionExpired``
        (the job still at its generation, no other holder), the session is LOST."""
        a = self.open(store, "A", keepalive=False)
        leases = [a.claim(j) for j in ("e1", "e2")]
        assert all(leases)
        self.expire(store, a)
        out = a.complete_many([lease for lease in leases if lease is not None])
        assert all(isinstance(r, SessionExpired) for r in out), out
        for index, job_id in enumerate(("e1", "e2")):  # each its own, named
            assert_names_item(out[index], index, job_id)
        assert out[0] is not out[1]
        assert a.state is SessionState.LOST
        assert all(lease is not None and lease.state is LeaseState.LOST for lease in leases)
        for job_id in ("e1", "e2"):
            record = store.get(job_id)
            assert record is not None and record.state is not JobState.COMPLETED

    def test_complete_many_bad_input_changes_nothing(
        self, store: LeaseStore, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        a, b = self.open(store, "A"), self.open(store, "B")
        mine, theirs, ended = a.claim("mine"), b.claim("theirs"), a.claim("ended")
        assert mine is not None and theirs is not None and ended is not None
        ended.release()
        spy = CountCalls(store.backend.complete_many)
        monkeypatch.setattr(store.backend, "complete_many", spy)
        bad: list[Any] = [
            [], "mine", mine, [mine, theirs], [mine, mine], [mine, (mine, b"2")],
            [mine, ended], [(mine, "text")], [42],
        ]
        for leases in bad:
            with pytest.raises(InvalidArgument):
                a.complete_many(leases)
        for leases, index, job_id in (([mine, ended], 1, "ended"),
                                      ([(mine, "text")], 0, "mine"),
                                      ([mine, (theirs, b"")], 1, "theirs")):
            with pytest.raises(InvalidArgument) as refused:
                a.complete_many(leases)
            assert_names_item(refused.value, index, job_id)
        assert spy.calls == 0
        mine.ensure_held()
        theirs.ensure_held()
        for job_id in ("mine", "theirs"):
            record = store.get(job_id)
            assert record is not None and record.state is JobState.HELD

    def test_complete_many_splits_into_max_complete_batch(
        self, store: LeaseStore, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """More leases than one round trip carries: chunks of ``max_complete_batch``."""
        step = store.capabilities.max_complete_batch
        count = min(step + 1, 130)
        a = self.open(store, "A")
        leases = [lease for lease in a.claim_many([f"j{i}" for i in range(count)]) if lease]
        assert len(leases) == count
        spy = CountCalls(store.backend.complete_many)
        monkeypatch.setattr(store.backend, "complete_many", spy)
        out = a.complete_many(leases)
        assert spy.calls == math.ceil(count / step)
        assert all(isinstance(r, LeaseRecord) and r.state is JobState.COMPLETED for r in out)
        assert [r.job_id for r in out if isinstance(r, LeaseRecord)] == [
            f"j{i}" for i in range(count)]

    # -- complete_and_claim_next -----------------------------------------------------

    def test_fused_completion_claims_the_next_job_then_none(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Each completion claims the oldest claimable job (not one this session holds);
        the completion of the last job commits and returns no lease."""
        store.enqueue_many("fq", [("j1", b"p1"), ("j2", b"p2")])
        a = self.open(store, "A")
        first, second = a.claim_next("fq"), a.claim_next("fq")
        assert first is not None and second is not None
        assert {first.job_id, second.job_id} == {"j1", "j2"}
        store.enqueue("fq", "j3", b"p3")  # after: claim_next picks among the oldest few
        record, third = first.complete_and_claim_next(b"r1")
        assert (record.job_id, record.state, record.result) == (
            first.job_id, JobState.COMPLETED, b"r1")
        assert first.state is LeaseState.COMPLETED
        assert third is not None and third.job_id == "j3"
        assert (third.payload, third.queue, third.session) == (b"p3", "fq", a)
        assert third.state is LeaseState.HELD and third in a.leases()
        held = store.get("j3")
        assert held is not None and held.state is JobState.HELD and held.owner == "A"
        assert held.generation == third.generation
        record2, none = second.complete_and_claim_next(b"r2")
        assert none is None and record2.state is JobState.COMPLETED  # j3 is ours
        last, nothing = third.complete_and_claim_next(b"r3")
        assert nothing is None and last.state is JobState.COMPLETED and last.result == b"r3"
        assert a.leases() == []
        stats = store.queue_stats("fq")
        assert (stats.available, stats.held, stats.completed) == (0, 0, 3)

    def test_fused_completion_with_an_empty_queue_commits(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A")
        lease = a.claim("solo")
        assert lease is not None
        with pytest.raises(InvalidArgument):
            lease.complete_and_claim_next(b"r")  # not from a queue: name one
        record, nothing = lease.complete_and_claim_next(b"r", queue="empty-queue")
        assert nothing is None and record.state is JobState.COMPLETED
        done = store.get("solo")
        assert done is not None and done.state is JobState.COMPLETED and done.result == b"r"
        with pytest.raises(InvalidArgument):  # ended: nothing sent again
            lease.complete_and_claim_next(b"r", queue="empty-queue")

    def test_fused_stale_completion_refused_and_nothing_claimed(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        store.enqueue("sq", "s1")
        a, b = self.open(store, "A"), self.open(store, "B")
        lease = a.claim_next("sq")
        assert lease is not None and lease.job_id == "s1"
        store.enqueue("sq", "s2")
        newer = make_stale(store, lease, b)
        with pytest.raises(StaleLeaseError):
            lease.complete_and_claim_next(b"late")
        assert lease.state is LeaseState.LOST
        assert a.leases() == []
        untouched = store.get("s2")
        assert untouched is not None and untouched.state is JobState.AVAILABLE
        current = store.get("s1")
        assert current is not None and current.state is JobState.HELD
        assert (current.owner, current.generation) == ("B", newer.generation)
        # The stale worker's session is unharmed and can still take the next job.
        nxt = a.claim_next("sq")
        assert nxt is not None and nxt.job_id == "s2"

    def test_fused_completion_outcomes_match_the_backend_contract(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Straight to the backend: the retried completion of this session is its
        record (nothing claimed twice); an exhausted job is never claimed."""
        store.enqueue_many("bq2", [EnqueueItem("e1", b"", 1), "e2"])
        a, b = self.open(store, "A"), self.open(store, "B")
        spent = b.claim("e1")
        assert spent is not None
        spent.release()  # its one attempt is used up: the next claim makes it FAILED
        lease = a.claim("e-other")
        assert lease is not None
        record, picked = store.backend.complete_and_claim_next(
            a.handle, "e-other", lease.claim_result, b"ok", "bq2")
        assert record.state is JobState.COMPLETED
        assert picked is not None and picked[0] == "e2"
        # FAILED on the way (stores that pick the head), or by this claim (the looped
        # default starts at a random one of the oldest few and may have skipped it).
        with pytest.raises(JobFailed):
            b.claim("e1")
        again, nothing = store.backend.complete_and_claim_next(
            a.handle, "e-other", lease.claim_result, b"ok", "bq2")
        assert again.state is JobState.COMPLETED and again.generation == record.generation
        assert nothing is None  # e2 is this session's, e1 FAILED: nothing claimed twice

    def test_async_fused_completion_and_complete_many(self, store: LeaseStore) -> None:
        from ..aio import AsyncLeaseStore

        store.enqueue_many("aq", ["a1", "a2", "a3"])

        async def main() -> None:
            astore = AsyncLeaseStore(store)
            async with astore.session("A", 30.0) as a:
                first = await a.claim_next("aq")
                assert first is not None
                record, second = await first.complete_and_claim_next(b"r")
                assert record.state is JobState.COMPLETED and second is not None
                third = await a.claim_next("aq")
                assert third is not None
                out = await a.complete_many([(second, b"r2"), third])
                assert all(isinstance(r, LeaseRecord) for r in out)
                assert {r.job_id for r in out if isinstance(r, LeaseRecord)} | {
                    record.job_id} == {"a1", "a2", "a3"}

        asyncio.run(asyncio.wait_for(main(), 60))
