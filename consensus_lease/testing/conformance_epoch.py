"""The store-epoch part of the conformance suite: ``bump_epoch`` makes every token handed
out afterwards higher than every token before (README: "Restoring a store").

Mixed into :class:`~consensus_lease.testing.conformance.BackendConformance`, so every
backend runs it; it uses that class's hooks (``open``, ``process_url``, fixtures). A
backend without an epoch declares it (``Capabilities.epoch`` False) and these tests then
check that ``epoch`` and ``bump_epoch`` say so with ``UnsupportedOperation``: never a
skip.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ..errors import InvalidArgument, JobCompleted, StaleLeaseError, UnsupportedOperation
from ..lease import Lease
from ..record import ClaimResult, JobState
from ..session import Session
from ..store import LeaseStore, open_store

__all__ = ["EpochConformance"]


def _claim(session: Session, job_id: str) -> Lease:
    lease = session.claim(job_id)
    assert lease is not None, f"{job_id!r} could not be claimed"
    return lease


class EpochConformance:
    """``epoch`` and ``bump_epoch``, on every backend."""

    open: Any
    process_url: Any

    def _epoch_or_declared_absent(self, store: LeaseStore) -> bool:
        """True if the backend keeps an epoch; otherwise checks that it says so."""
        if store.capabilities.epoch:
            return True
        with pytest.raises(UnsupportedOperation):
            store.epoch()
        with pytest.raises(UnsupportedOperation):
            store.bump_epoch()
        return False

    def test_bump_epoch_every_later_token_is_higher(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """A fresh store is at epoch 0 (tokens are the store's own counter). After a bump
        every new token is in the new epoch, above every earlier token; a job's next
        token exceeds its earlier ones by at least 2**epoch_shift; records and
        completions report the tokens handed out; another process sees the epoch."""
        if not self._epoch_or_declared_absent(store):
            return
        shift = store.backend.epoch_shift
        assert store.epoch() == 0
        a = self.open(store, "A")
        old: dict[str, int] = {}
        for job in ("e-1", "e-2", "e-2"):
            lease = _claim(a, job)
            old[job] = lease.generation
            lease.release()
        assert all(token >> shift == 0 for token in old.values())
        new_epoch = store.bump_epoch()
        assert new_epoch == 1 and store.epoch() == 1
        new: dict[str, int] = {}
        for job in ("e-1", "e-2", "e-3"):
            lease = _claim(a, job)
            new[job] = lease.generation
            assert lease.generation >> shift == new_epoch
            record = store.get(job)
            assert record is not None and record.generation == lease.generation
            assert lease.complete(job.encode()).generation == lease.generation
        assert min(new.values()) >= new_epoch << shift > max(old.values())
        for job, token in old.items():
            assert new[job] - token >= 2**shift
        assert {r.job_id: r.generation for r in store.records()} == new
        url = self.process_url(store)
        if url is not None:
            with open_store(url) as other:
                assert other.epoch() == new_epoch

    def test_bump_epoch_above_a_token(self, store: LeaseStore, sessions: list[Session]) -> None:
        """``bump_epoch(above=T)`` sets ``max(epoch + 1, T // 2**shift + 1)``: the next
        token exceeds T; an ``above`` lower than the current epoch's tokens adds 1."""
        if not self._epoch_or_declared_absent(store):
            return
        shift = store.backend.epoch_shift
        a = self.open(store, "A")
        lease = _claim(a, "above-1")
        first = lease.generation
        lease.release()
        above = (3 << shift) + 12345
        assert store.bump_epoch(above=above) == 4
        lease = _claim(a, "above-1")
        assert lease.generation > above and lease.generation >> shift == 4
        assert store.bump_epoch(above=first) == 5
        assert store.bump_epoch(above=0) == 6
        lease.release()
        assert _claim(a, "above-1").generation >> shift == 6

    def test_holder_across_a_bump_keeps_working(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Leases claimed before a bump renew, complete and fail with their old tokens,
        and the store reports those tokens; a new holder gets a new-epoch token, and the
        old token presented for it is stale."""
        if not self._epoch_or_declared_absent(store):
            return
        shift = store.backend.epoch_shift
        a = self.open(store, "A")
        held, failing, released = (_claim(a, job) for job in ("hx-1", "hx-2", "hx-3"))
        epoch = store.bump_epoch()
        held.renew()
        held.ensure_held()
        record = store.get("hx-1")
        assert record is not None and record.state is JobState.HELD
        assert record.generation == held.generation
        assert held.complete(b"ok").generation == held.generation
        with pytest.raises(JobCompleted) as done:
            a.claim("hx-1")
        assert done.value.generation == held.generation
        after = failing.fail("boom", retry_in_s=0)
        assert after.generation == failing.generation and after.state is JobState.AVAILABLE
        again = _claim(a, "hx-2")
        assert again.generation >> shift == epoch and again.generation > failing.generation
        released.release()
        b = self.open(store, "B")
        taken = _claim(b, "hx-3")
        assert taken.generation >> shift == epoch
        with pytest.raises(StaleLeaseError):
            store.backend.complete(b.handle, "hx-3", ClaimResult(released.generation), b"x")
        record = store.get("hx-3")
        assert record is not None and record.state is JobState.HELD
        assert record.generation == taken.generation
        assert taken.complete(b"new").generation == taken.generation

    def test_queue_tokens_carry_the_epoch(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        if not self._epoch_or_declared_absent(store) or not store.capabilities.queues:
            return
        shift = store.backend.epoch_shift
        store.enqueue("epq", "q-1", b"p")
        epoch = store.bump_epoch()
        lease = self.open(store, "A").claim_next("epq")
        assert lease is not None and lease.generation >> shift == epoch
        (queued,) = store.queue_jobs("epq")
        assert queued.record.generation == lease.generation
        assert lease.complete(b"r").generation == lease.generation

    def test_concurrent_bumps_all_apply(self, store: LeaseStore) -> None:
        """Bumps racing each other each raise the epoch once (compare-and-set)."""
        if not self._epoch_or_declared_absent(store):
            return
        got: list[int] = []
        threads = [threading.Thread(target=lambda: got.append(store.bump_epoch()))
                   for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(got) == [1, 2, 3, 4] and store.epoch() == 4

    def test_bump_epoch_bad_input_changes_nothing(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Bad ``above`` values and an epoch past the int64 token range are
        InvalidArgument; the epoch and the next token are unchanged. The last epoch
        that fits still works and its tokens stay below 2**63."""
        if not self._epoch_or_declared_absent(store):
            return
        shift = store.backend.epoch_shift
        a = self.open(store, "A")
        bad: Any
        for bad in (-1, True, 1.5, "3", 2**63, 2**63 - 1):
            with pytest.raises(InvalidArgument):
                store.bump_epoch(bad)
        assert store.epoch() == 0
        lease = _claim(a, "range-1")
        assert lease.generation >> shift == 0
        lease.release()
        last = 2 ** (63 - shift) - 1
        assert store.bump_epoch(above=(last - 1) << shift) == last
        with pytest.raises(InvalidArgument):
            store.bump_epoch()
        assert store.epoch() == last
        lease = _claim(a, "range-1")
        assert lease.generation >> shift == last and lease.generation < 2**63
        lease.complete(b"")
