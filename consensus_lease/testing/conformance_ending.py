"""The batch-ending part of the conformance suite: ``Session.release_many`` and
``Session.fail_many`` (release or fail many leases, each fenced by the store, each with
its own outcome).

Mixed into :class:`~consensus_lease.testing.conformance.BackendConformance`, so every
backend runs it, whether it ends many leases in one round trip
(``capabilities.max_end_batch`` > 1: every store this package ships) or with the
looped defaults of :class:`~consensus_lease.backend.Backend` (a driver that keeps
``max_end_batch`` 1): the rules are the same. It uses that class's hooks (``open``,
``expire``, the ``store`` and ``sessions`` fixtures); a stale item is made as in
:mod:`~consensus_lease.testing.conformance_completion`.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from ..errors import BackendUnavailable, InvalidArgument, JobFailed, SessionExpired, StaleLeaseError
from ..lease import Lease
from ..record import EnqueueItem, JobState, LeaseRecord
from ..session import Session
from ..states import LeaseState, SessionState
from ..store import LeaseStore
from .conformance_completion import CountCalls, assert_names_item, make_stale

__all__ = ["EndingConformance"]


def _claimed(session: Session, *job_ids: str) -> list[Lease]:
    leases = [session.claim(job_id) for job_id in job_ids]
    assert all(leases), leases
    return [lease for lease in leases if lease is not None]


def _spy(store: LeaseStore, monkeypatch: pytest.MonkeyPatch, *names: str) -> list[CountCalls]:
    """Count the calls of the backend's methods ``names``."""
    spies = []
    for name in names:
        spy = CountCalls(getattr(store.backend, name))
        monkeypatch.setattr(store.backend, name, spy)
        spies.append(spy)
    return spies


class EndingConformance:
    """release_many and fail_many, on every backend."""

    open: Any
    expire: Any

    # -- release_many ------------------------------------------------------------------

    def test_release_many_stale_item_refused_while_the_others_release(
        self, store: LeaseStore, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Each item its own outcome; a released job is claimable at once, at a higher
        generation; the stale item's job stays with its newer holder."""
        a, b = self.open(store, "A"), self.open(store, "B")
        x, y, z = _claimed(a, "rx", "ry", "rz")
        newer = make_stale(store, y, b)
        (spy,) = _spy(store, monkeypatch, "release_many")
        out = a.release_many([x, y, z])
        assert spy.calls == math.ceil(3 / store.capabilities.max_end_batch)
        assert out[0] is None and out[2] is None, out
        assert isinstance(out[1], StaleLeaseError) and out[1].job_id == "ry"
        assert_names_item(out[1], 1, "ry")
        assert (x.state, y.state, z.state) == (
            LeaseState.RELEASED, LeaseState.LOST, LeaseState.RELEASED)
        assert y.lost_reason is out[1]
        assert a.leases() == []
        record = store.get("ry")
        assert record is not None and record.state is JobState.HELD
        assert (record.owner, record.generation) == ("B", newer.generation)
        newer.ensure_held()
        for old in (x, z):
            released = store.get(old.job_id)
            assert released is not None and released.state is JobState.AVAILABLE
            again = b.claim(old.job_id)  # at once: no wait, no retry delay
            assert again is not None and again.generation > old.generation
            assert again.attempt == old.attempt + 1
        assert a.claim("rw") is not None  # the session is unharmed

    def test_release_many_backend_stale_generation(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Straight to the backend: an older generation of a job this session holds
        again is refused, the current hold untouched; the other item is released."""
        a = self.open(store, "A")
        first, other = _claimed(a, "again", "other")
        first.release()
        (second,) = _claimed(a, "again")
        out = store.backend.release_many(a.handle, [
            ("again", first.claim_result), ("other", other.claim_result)])
        assert isinstance(out[0], StaleLeaseError) and out[1] is None, out
        held = store.get("again")
        assert held is not None and held.state is JobState.HELD
        assert held.generation == second.generation
        second.ensure_held()
        freed = store.get("other")
        assert freed is not None and freed.state is JobState.AVAILABLE

    def test_release_many_after_the_session_expired(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A", keepalive=False)
        leases = _claimed(a, "re1", "re2")
        self.expire(store, a)
        out = a.release_many(leases)
        assert all(isinstance(r, SessionExpired) for r in out), out
        for index, job_id in enumerate(("re1", "re2")):  # each its own, named
            assert_names_item(out[index], index, job_id)
        assert out[0] is not out[1]
        assert a.state is SessionState.LOST
        assert all(lease.state is LeaseState.LOST for lease in leases)

    def test_release_many_splits_into_max_end_batch(
        self, store: LeaseStore, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        step = store.capabilities.max_end_batch
        count = min(step + 1, 130)
        a = self.open(store, "A")
        leases = [lease for lease in a.claim_many([f"r{i}" for i in range(count)]) if lease]
        assert len(leases) == count
        (spy,) = _spy(store, monkeypatch, "release_many")
        assert a.release_many(leases) == [None] * count
        assert spy.calls == math.ceil(count / step)
        assert all(lease.state is LeaseState.RELEASED for lease in leases)
        assert a.leases() == []

    # -- fail_many ---------------------------------------------------------------------

    def test_fail_many_stale_item_refused_while_the_others_fail(
        self, store: LeaseStore, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Each item its own outcome, each record as a lone ``fail`` of the same job
        with the same arguments gives (attempts, error, FAILED or the retry delay)."""
        jobs = [EnqueueItem(f"{kind}{n}", b"", limit)
                for n in (1, 2) for kind, limit in (("last", 1), ("wait", 3), ("now", 3))]
        store.enqueue_many("fmq", [*jobs, "fstale"])
        a, b = self.open(store, "A"), self.open(store, "B")
        last1, wait1, now1, last2, wait2, now2, stale = _claimed(
            a, *(j.job_id for j in jobs), "fstale")
        newer = make_stale(store, stale, b)
        (spy,) = _spy(store, monkeypatch, "fail_many")
        out = a.fail_many([(last1, "spent"), (wait1, ValueError("bad"), 60.0),
                           (stale, "late", 0.0), (now1, "again", 0.0)])
        assert spy.calls == math.ceil(4 / store.capabilities.max_end_batch)
        alone = [last2.fail("spent"), wait2.fail(ValueError("bad"), 60.0),
                 now2.fail("again", 0.0)]
        assert isinstance(out[2], StaleLeaseError) and out[2].job_id == "fstale"
        assert_names_item(out[2], 2, "fstale")
        many = [out[0], out[1], out[3]]
        assert all(isinstance(r, LeaseRecord) for r in many), out
        for got, lone in zip(many, alone, strict=True):
            assert isinstance(got, LeaseRecord)
            assert (got.state, got.attempt, got.error, got.max_attempts) == (
                lone.state, lone.attempt, lone.error, lone.max_attempts)
            assert (got.not_before is None) == (lone.not_before is None)
            if got.not_before is not None and lone.not_before is not None:
                assert abs(got.not_before - lone.not_before) < 30.0  # the same delay
        assert [r.state for r in alone] == [
            JobState.FAILED, JobState.AVAILABLE, JobState.AVAILABLE]
        assert alone[1].error == "ValueError: bad" and alone[1].not_before is not None
        assert (last1.state, wait1.state, now1.state, stale.state) == (
            LeaseState.FAILED, LeaseState.FAILED, LeaseState.FAILED, LeaseState.LOST)
        assert a.leases() == []
        current = store.get("fstale")
        assert current is not None and (current.owner, current.generation) == (
            "B", newer.generation)
        for done in ("last1", "last2"):
            with pytest.raises(JobFailed):
                b.claim(done)
        for delayed in ("wait1", "wait2"):
            assert b.claim(delayed) is None  # its retry delay (60 s) runs
        for now in ("now1", "now2"):
            again = b.claim(now)  # no delay: claimable at once, the next attempt
            assert again is not None and again.attempt == 2

    def test_fail_many_backend_stale_generation(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Straight to the backend: an older generation is refused (the current hold
        untouched), the other item fails with its own error."""
        a = self.open(store, "A")
        first, other = _claimed(a, "fagain", "fother")
        first.release()
        (second,) = _claimed(a, "fagain")
        out = store.backend.fail_many(a.handle, [
            ("fagain", first.claim_result, "old", 0.0),
            ("fother", other.claim_result, "mine", 0.0)])
        assert isinstance(out[0], StaleLeaseError), out
        assert isinstance(out[1], LeaseRecord) and out[1].error == "mine"
        assert out[1].state is JobState.AVAILABLE
        held = store.get("fagain")
        assert held is not None and held.state is JobState.HELD
        assert held.generation == second.generation and held.error is None
        second.ensure_held()

    def test_fail_many_after_the_session_expired(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A", keepalive=False)
        leases = _claimed(a, "fe1", "fe2")
        self.expire(store, a)
        out = a.fail_many([(lease, "boom", 0.0) for lease in leases])
        assert all(isinstance(r, SessionExpired) for r in out), out
        for index, job_id in enumerate(("fe1", "fe2")):  # each its own, named
            assert_names_item(out[index], index, job_id)
        assert out[0] is not out[1]
        assert a.state is SessionState.LOST
        assert all(lease.state is LeaseState.LOST for lease in leases)
        for job_id in ("fe1", "fe2"):
            record = store.get(job_id)
            assert record is not None and record.error is None

    # -- bad input ---------------------------------------------------------------------

    def test_release_many_and_fail_many_bad_input_changes_nothing(
        self, store: LeaseStore, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        a, b = self.open(store, "A"), self.open(store, "B")
        mine, ended = _claimed(a, "bmine", "bended")
        (theirs,) = _claimed(b, "btheirs")
        ended.release()
        spies = _spy(store, monkeypatch, "release_many", "fail_many", "release", "fail")
        bad_releases: list[tuple[Any, str]] = [
            ([], "at least one lease"), ("bmine", "sequence of leases"),
            (mine, "sequence of leases"), ([mine, theirs], "item 1: lease on 'btheirs'"),
            ([mine, mine], "item 1: 'bmine' is listed twice"),
            ([mine, ended], r"^item 1: lease on 'bended' generation \d+ already released"),
            ([(mine,)], "^item 0: lease on 'bmine': .*, got a 1-tuple$"),
            ([mine, 42], "^item 1: release_many.*, got int$"),
            ([(mine, "x")], "^item 0: lease on 'bmine': .*, got a 2-tuple$"),
        ]
        for leases, message in bad_releases:
            with pytest.raises(InvalidArgument, match=message):
                a.release_many(leases)
        bad_failures: list[tuple[Any, str]] = [
            ([], "at least one lease"),
            ([mine], "^item 0: lease on 'bmine': fail_many.*, got Lease$"),
            ([(mine, "e"), (mine, "e")], "item 1: 'bmine' is listed twice"),
            ([(mine, "e"), (theirs, "e")], "item 1: lease on 'btheirs'"),
            ([(mine, 42)], "^item 0: lease on 'bmine': error must be"),
            ([(mine, "e"), (ended, "e", -1.0)], "^item 1: lease on 'bended': retry_in_s"),
            ([(mine, "e", 1.0, 2)], "^item 0: lease on 'bmine': .*, got a 4-tuple$"),
            ([(mine, "e"), (ended, "e")], r"^item 1: lease on 'bended' generation \d+ already "
             "released"),
            ([("bmine", "e", 1.0)], "^item 0: fail_many.*, got a 3-tuple of str, str and float$"),
        ]
        for items, message in bad_failures:
            with pytest.raises(InvalidArgument, match=message):
                a.fail_many(items)
        assert [spy.calls for spy in spies] == [0, 0, 0, 0]
        mine.ensure_held()
        theirs.ensure_held()
        for job_id in ("bmine", "btheirs"):
            record = store.get(job_id)
            assert record is not None and record.state is JobState.HELD
            assert record.error is None

    def test_a_refused_round_trip_names_each_item(
        self, store: LeaseStore, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The driver refuses a whole batch (``BackendUnavailable``: nothing applied):
        every item gets its own error naming its index and job, as a refusal of one item
        does; each lease is still held, each job as it was."""
        a = self.open(store, "A")
        leases = _claimed(a, "nu0", "nu1", "nu2")

        def down(*_args: object) -> object:
            raise BackendUnavailable("the store is down (test)")

        for name in ("complete_many", "release_many", "fail_many"):
            monkeypatch.setattr(store.backend, name, down)
        outs = [a.complete_many(leases), a.release_many(leases),
                a.fail_many([(lease, "e") for lease in leases])]
        for out in outs:
            assert all(isinstance(r, BackendUnavailable) for r in out), out
            for index, lease in enumerate(leases):
                assert_names_item(out[index], index, lease.job_id)
            assert len({id(r) for r in out}) == len(leases)
        for lease in leases:
            lease.ensure_held()
        for lease in leases:  # store.get: not a patched method
            record = store.get(lease.job_id)
            assert record is not None and record.state is JobState.HELD
            assert record.generation == lease.generation and record.error is None

    # -- async -------------------------------------------------------------------------

    def test_async_release_many_and_fail_many(self, store: LeaseStore) -> None:
        from ..aio import AsyncLeaseStore

        async def main() -> None:
            astore = AsyncLeaseStore(store)
            async with astore.session("A", 30.0) as a:
                one, two, three = [await a.claim(j) for j in ("ar1", "ar2", "af1")]
                assert one is not None and two is not None and three is not None
                with pytest.raises(InvalidArgument,
                                   match=r"^item 0: lease on 'ar1': .*, got a Lease"):
                    await a.release_many([one.sync])  # type: ignore[list-item]
                assert await a.release_many([one, two]) == [None, None]
                out = await a.fail_many([(three, "boom", 0.0)])
                assert isinstance(out[0], LeaseRecord) and out[0].error == "boom"
                assert three.sync.state is LeaseState.FAILED

        asyncio.run(asyncio.wait_for(main(), 60))
        for job_id in ("ar1", "ar2", "af1"):
            record = store.get(job_id)
            assert record is not None and record.state is JobState.AVAILABLE
