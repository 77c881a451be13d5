"""The batched queue claim part of the conformance suite: ``Session.claim_next_many``
(claim up to ``n`` of a queue's oldest claimable jobs in one store operation where the
store can) keeps the rules of ``claim`` for every job it claims.

Mixed into :class:`~consensus_lease.testing.conformance.BackendConformance`, so every
backend runs it, whether it claims the batch natively (``capabilities.max_queue_claim_batch``
> 1: memory under its lock, SQLite in one transaction, PostgreSQL in one statement, etcd
in one transaction of nested claims, ZooKeeper in one claim multi) or with the looped
default of :class:`~consensus_lease.backend.Backend` (1): the rules are the same. It
uses that class's hooks (``open``, ``expire``, ``_assert_newer``, the ``store`` and
``sessions`` fixtures). Every test name has
``claim_next_many`` in it (``-k claim_next_many`` runs them alone).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from typing import Any

import pytest

from ..backend import Backend
from ..errors import InvalidArgument, LeaseLost, StaleLeaseError
from ..record import EnqueueItem, JobState
from ..session import Session
from ..states import LeaseState, SessionState
from ..store import LeaseStore

__all__ = ["QueueBatchConformance"]

WAIT_S = 60.0
"""Upper bound for joins in these tests."""


class _Spy:
    """Wraps ``backend.claim_from_queue_many``, recording the ``n`` of each call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sizes: list[int] = []

    def __call__(self, session: Any, queue: str, n: int) -> Any:
        self.sizes.append(n)
        return self.inner(session, queue, n)


def _ordered(store: LeaseStore) -> bool:
    """The store hands a batch out oldest enqueued first (the native batches do; the
    looped default takes each job as ``claim_next`` does, from a random one of the
    oldest few)."""
    return store.capabilities.max_queue_claim_batch > 1


class QueueBatchConformance:
    """claim_next_many, on every backend."""

    open: Any
    expire: Any
    _assert_newer: Any

    def test_claim_next_many_capability_is_declared_truly(
        self, store: LeaseStore, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``max_queue_claim_batch`` >= 1; above 1 the driver has its own
        ``claim_from_queue_many`` and a batch of that size is one call of it."""
        size = store.capabilities.max_queue_claim_batch
        assert isinstance(size, int) and size >= 1
        if size == 1:
            return
        assert type(store.backend).claim_from_queue_many is not Backend.claim_from_queue_many
        n = min(size, 5)
        assert all(store.enqueue_many("cap", [f"cap-{i}" for i in range(n)]))
        spy = _Spy(store.backend.claim_from_queue_many)
        monkeypatch.setattr(store.backend, "claim_from_queue_many", spy)
        got = self.open(store, "W").claim_next_many("cap", n)
        assert sorted(lease.job_id for lease in got) == [f"cap-{i}" for i in range(n)]
        assert spy.sizes == [n]

    def test_claim_next_many_claims_distinct_jobs_with_fresh_tokens(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Distinct jobs, each HELD with a token above the job's last one and its
        payload, registered with the session; fewer than ``n`` when the queue is short,
        ``[]`` when it is empty (or unknown)."""
        ids = [f"m-{i}" for i in range(5)]
        assert all(store.enqueue_many("many", [(j, j.encode()) for j in ids]))
        a, w = self.open(store, "A"), self.open(store, "W")
        first = a.claim("m-0")
        assert first is not None
        first.release()
        got = w.claim_next_many("many", 3)
        assert len(got) == 3 and len({lease.job_id for lease in got}) == 3
        if _ordered(store):
            assert [lease.job_id for lease in got] == ids[:3]
        for lease in got:
            assert lease.state is LeaseState.HELD and lease.payload == lease.job_id.encode()
            assert (lease.owner, lease.queue) == ("W", "many")
            record = store.get(lease.job_id)
            assert record is not None and record.state is JobState.HELD
            assert (record.owner, record.generation) == ("W", lease.generation)
        by_id = {lease.job_id: lease for lease in got}
        if "m-0" in by_id:
            self._assert_newer(store, first.generation, by_id["m-0"].generation)
            assert by_id["m-0"].attempt == 2
        rest = w.claim_next_many("many", 10)
        assert sorted(lease.job_id for lease in got + rest) == ids  # fewer than n
        assert w.claim_next_many("many", 4) == []
        assert w.claim_next_many("no-such-queue", 4) == []
        assert {lease.job_id for lease in w.leases()} == set(ids)
        stats = store.queue_stats("many")
        assert (stats.available, stats.held) == (0, 5)

    def test_claim_next_many_skips_held_delayed_done_and_fails_exhausted(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """A job held by a live session, one in a retry delay and a completed one are
        not claimed; a job whose only attempt was used up becomes FAILED, not claimed."""
        store.enqueue_many("skip", [EnqueueItem("spent", b"", 1), "held", "delayed", "done",
                                    "free-1", "free-2"])
        a, b, w = self.open(store, "A"), self.open(store, "B"), self.open(store, "W")
        spent, held, delayed, done = (a.claim(j) for j in ("spent", "held", "delayed", "done"))
        assert spent is not None and held is not None
        assert delayed is not None and done is not None
        spent.release()  # its one attempt is used up
        delayed.fail("later", retry_in_s=3600)
        done.complete(b"r")
        assert b.claim("held") is None  # held by A
        got = w.claim_next_many("skip", 6)
        assert sorted(lease.job_id for lease in got) == ["free-1", "free-2"]
        record = store.get("spent")
        assert record is not None and record.state is JobState.FAILED
        record = store.get("held")
        assert record is not None and record.state is JobState.HELD
        assert (record.owner, record.generation) == ("A", held.generation)
        held.ensure_held()
        record = store.get("delayed")
        assert record is not None and record.state is JobState.AVAILABLE
        record = store.get("done")
        assert record is not None and record.state is JobState.COMPLETED
        stats = store.queue_stats("skip")
        assert (stats.held, stats.completed, stats.failed) == (3, 1, 1)

    @pytest.mark.parametrize("way", ["claim_next", "claim_next_many", "complete_and_claim_next"])
    def test_claim_next_many_and_claim_next_find_a_job_behind_40_exhausted(
        self, store: LeaseStore, sessions: list[Session], way: str
    ) -> None:
        """40 jobs whose one attempt was used up sit ahead of a fresh one (more than any
        read of candidates or pick of one store operation takes at once): ``claim_next``,
        ``claim_next_many(q, 1)`` and ``complete_and_claim_next`` return the fresh job,
        never "none claimable". Then every claim finds none, and the 40 end FAILED: a
        claim makes FAILED the exhausted jobs it walks past (all of them ahead of its
        pick on SQLite and in memory's ``claim_next_many``; from a random one of the
        oldest 8 where ``claim_next`` reads candidates; up to 16 per statement on
        PostgreSQL, which skips the others with its index of exhausted jobs), so within
        a few claims that return none."""
        queue, spent = f"spent-{way}", [f"spent-{way}-{i}" for i in range(40)]
        assert all(store.enqueue_many(queue, [EnqueueItem(j, b"", 1) for j in spent]))
        setup, w = self.open(store, "S"), self.open(store, "W")
        taken = setup.claim_next_many(queue, 40)
        assert sorted(lease.job_id for lease in taken) == sorted(spent)
        for lease in taken:
            lease.release()  # the job's only attempt ended without completion
        assert store.enqueue(queue, f"{queue}-fresh", b"p")
        if way == "claim_next":
            lease = w.claim_next(queue)
        elif way == "claim_next_many":
            got = w.claim_next_many(queue, 1)
            assert len(got) == 1
            lease = got[0]
        else:
            assert store.enqueue(f"{queue}-first", "first", b"")
            first = w.claim_next(f"{queue}-first")
            assert first is not None
            _record, lease = first.complete_and_claim_next(b"r", queue=queue)
        assert lease is not None and (lease.job_id, lease.payload) == (f"{queue}-fresh", b"p")
        assert lease.state is LeaseState.HELD and lease.attempt == 1
        for _ in range(len(spent)):  # each call FAILs one exhausted job at least
            assert w.claim_next(queue) is None and w.claim_next_many(queue, 1) == []
            if store.queue_stats(queue).failed == len(spent):
                break
        for job_id in spent:
            record = store.get(job_id)
            assert record is not None and record.state is JobState.FAILED, job_id
            assert record.attempt == 1
        stats = store.queue_stats(queue)
        assert (stats.available, stats.held, stats.failed) == (0, 1, 40)

    def test_claim_next_many_leases_renew_complete_and_refuse_stale(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Each lease works on its own: renews, completes; one whose hold was ended
        behind its back and taken by another session is refused (``StaleLeaseError``),
        LOST, the newer holder untouched."""
        store.enqueue_many("work", ["w-1", "w-2", "w-3"])
        w, other = self.open(store, "W"), self.open(store, "O")
        got = w.claim_next_many("work", 3)
        assert len(got) == 3
        keep, stale, release = got
        for lease in got:
            lease.renew()
        record = keep.complete(b"ok")
        assert (record.state, record.result) == (JobState.COMPLETED, b"ok")
        store.backend.release(w.handle, stale.job_id, stale.claim_result)
        newer = other.claim(stale.job_id)
        assert newer is not None
        self._assert_newer(store, stale.generation, newer.generation)
        with pytest.raises(StaleLeaseError):
            stale.complete(b"late")
        assert stale.state is LeaseState.LOST
        record = store.get(stale.job_id)
        assert record is not None and record.state is JobState.HELD
        assert (record.owner, record.generation) == ("O", newer.generation)
        release.release()
        again = other.claim_next_many("work", 2)
        assert [lease.job_id for lease in again] == [release.job_id]
        self._assert_newer(store, release.generation, again[0].generation)
        assert w.state is SessionState.ACTIVE and w.leases() == []

    def test_claim_next_many_bad_input_changes_nothing(
        self, store: LeaseStore, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store.enqueue_many("bad", ["b-1", "b-2"])
        spy = _Spy(store.backend.claim_from_queue_many)
        monkeypatch.setattr(store.backend, "claim_from_queue_many", spy)
        w = self.open(store, "W")
        bad: list[Any] = [0, -1, True, False, 1.0, 2.5, "2", None, [2]]
        for n in bad:
            with pytest.raises(InvalidArgument):
                w.claim_next_many("bad", n)
        for queue in ("", 42, "x" * 300):
            with pytest.raises(InvalidArgument):
                w.claim_next_many(queue, 1)
        assert spy.sizes == []
        assert w.leases() == [] and w.state is SessionState.ACTIVE
        for job in store.queue_jobs("bad"):
            assert job.record.state is JobState.AVAILABLE and job.record.attempt == 0

    def test_claim_next_many_splits_n_above_the_capability(
        self, store: LeaseStore, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``n`` above ``max_queue_claim_batch`` (here at most 2): one call of the driver
        per chunk, until a call returns fewer than it was asked for."""
        size = min(2, store.capabilities.max_queue_claim_batch)
        monkeypatch.setattr(store.backend, "capabilities", dataclasses.replace(
            store.capabilities, max_queue_claim_batch=size))
        spy = _Spy(store.backend.claim_from_queue_many)
        monkeypatch.setattr(store.backend, "claim_from_queue_many", spy)
        ids = [f"s-{i}" for i in range(5)]
        assert all(store.enqueue_many("split", ids))
        w = self.open(store, "W")
        got = w.claim_next_many("split", 4)
        assert len({lease.job_id for lease in got}) == 4
        assert spy.sizes == [size] * math.ceil(4 / size)
        spy.sizes.clear()
        rest = w.claim_next_many("split", 7)
        assert [lease.job_id for lease in rest] == sorted(set(ids) - {x.job_id for x in got})
        assert spy.sizes == ([1, 1] if size == 1 else [size])  # 1 left: the 2nd call finds none

    def test_claim_next_many_after_the_store_expired_the_session(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """The store ended the session: ``LeaseLost`` (``SessionExpired`` where the
        store says so), the session LOST, nothing claimed."""
        store.enqueue_many("gone", ["g-1", "g-2"])
        w = self.open(store, "W", keepalive=False)
        self.expire(store, w)
        with pytest.raises(LeaseLost):
            w.claim_next_many("gone", 2)
        assert w.state is SessionState.LOST and w.leases() == []
        for job in store.queue_jobs("gone"):
            assert job.record.state is JobState.AVAILABLE and job.record.attempt == 0

    def test_claim_next_many_concurrent_claimers_take_each_job_once(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Four threads, each its own session, claim batches of 4 and complete them
        until the queue is empty: every job completed exactly once."""
        ids = [f"c-{i:02d}" for i in range(32)]
        assert all(store.enqueue_many("race-many", ids))
        workers = [self.open(store, f"W{i}") for i in range(4)]
        done: dict[str, list[str]] = {w.owner: [] for w in workers}
        errors: list[BaseException] = []

        def work(session: Session) -> None:
            try:
                for _ in range(len(ids)):  # bounded
                    batch = session.claim_next_many("race-many", 4)
                    if not batch:
                        return
                    for lease in batch:
                        lease.complete(session.owner.encode())
                        done[session.owner].append(lease.job_id)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=WAIT_S)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads)
        assert sorted(j for got in done.values() for j in got) == ids
        stats = store.queue_stats("race-many")
        assert (stats.available, stats.held, stats.completed) == (0, 0, len(ids))

    def test_claim_next_many_async(self, store: LeaseStore) -> None:
        from ..aio import AsyncLease, AsyncLeaseStore

        store.enqueue_many("aq-many", [("a-1", b"p1"), ("a-2", b"p2"), ("a-3", b"p3")])

        async def main() -> None:
            astore = AsyncLeaseStore(store)
            async with astore.session("A", 30.0) as a:
                got = await a.claim_next_many("aq-many", 2)
                assert len(got) == 2 and all(isinstance(x, AsyncLease) for x in got)
                rest = await a.claim_next_many("aq-many", 5)
                leases = got + rest
                assert sorted(x.job_id for x in leases) == ["a-1", "a-2", "a-3"]
                assert await a.claim_next_many("aq-many", 1) == []
                with pytest.raises(InvalidArgument):
                    await a.claim_next_many("aq-many", 0)
                for x in leases:
                    record = await x.complete(x.payload or b"")
                    assert record.state is JobState.COMPLETED

        asyncio.run(asyncio.wait_for(main(), WAIT_S))
        for job in store.queue_jobs("aq-many"):
            assert job.record.state is JobState.COMPLETED and job.record.result == job.payload
