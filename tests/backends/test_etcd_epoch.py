"""The etcd store epoch and the detection of a history that went back.

Without a server: the token arithmetic, the record formats (epoch 0 writes exactly what
was written before epochs existed) and the revision guard on fake headers. On one local
member: bump_epoch (tokens, stale caches in other drivers, lost answers), claims without
their handle, and a driver that sees a revision below one it saw. On a member restored
from an ``etcdctl`` snapshot: the running holder gets ``StoreRegressed`` within one
keepalive interval, the fence rejects it, a new worker cannot open a session, and after
``bump_epoch`` the next holder's tokens are above every earlier one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from etcd_local import LocalEtcd, backend_of, local_members, lose_answers, require_local_etcd

from consensus_lease import (
    FenceRejected,
    InvalidArgument,
    JobState,
    LeaseStore,
    SqliteFence,
    StaleLeaseError,
    StoreRegressed,
    open_store,
)
from consensus_lease.backends.etcd import EtcdBackend
from consensus_lease.backends.etcd._layout import History, Owner, StoreEpoch
from consensus_lease.backends.etcd._tokens import EPOCH_SHIFT, TokenOverflow, compose, split
from consensus_lease.backends.etcd._tokens_history import Mark, RevisionGuard
from consensus_lease.record import ClaimResult
from consensus_lease.testing.conformance import poll_until

STEP = 2**EPOCH_SHIFT

# -- no server ------------------------------------------------------------------------------


def test_tokens_fold_the_epoch_above_44_bits() -> None:
    assert EtcdBackend.epoch_shift == 44 and EtcdBackend.capabilities.epoch
    assert compose(0, 12345) == 12345  # epoch 0: the create revision, as before epochs
    assert compose(3, 7) == 3 * STEP + 7 and split(3 * STEP + 7) == (3, 7)
    with pytest.raises(TokenOverflow, match=r"2\*\*44"):
        compose(1, STEP)


def test_epoch_zero_values_are_the_pre_epoch_format() -> None:
    assert Owner("A", "1f", "n").encode() == b'{"nonce":"n","owner":"A","session":"1f"}'
    assert Owner.decode(Owner("A", "1f", "n", 5).encode(), b"k").epoch == 5
    history = History.decode(Owner("A", "1f", "n", 2).encode(), b"k")
    assert (history.owner, history.generation, history.epoch) == ("A", None, 2)
    assert StoreEpoch.decode(StoreEpoch(4, "x").encode(), b"k") == StoreEpoch(4, "x")


def _header(revision: int, cluster: int = 0xC1) -> Any:
    return SimpleNamespace(revision=revision, cluster_id=cluster, member_id=1)


def test_guard_flags_a_revision_below_the_one_seen_when_the_request_was_sent() -> None:
    guard = RevisionGuard()
    reasons: list[str] = []
    guard.subscribe(reasons.append)
    assert guard.observe(_header(100), guard.mark(), "m") is None
    early = guard.mark()  # a request sent now, answered late
    assert guard.observe(_header(120), guard.mark(), "m") is None
    assert guard.observe(_header(110), early, "m") is None  # concurrent: not a regression
    assert guard.observe(_header(119), None, "m") is None  # not linearizable: no verdict
    late = guard.mark()
    reason = guard.observe(_header(40), late, "m")
    assert reason is not None and "revision 40, below revision 120" in reason
    assert reasons == [reason]
    # The answer of a request sent before the regression was noticed is reported as
    # regressed to its caller, without ending the sessions again; the new history is
    # the baseline now.
    assert guard.observe(_header(41), late, "m") is not None
    assert len(reasons) == 1
    assert guard.observe(_header(42), guard.mark(), "m") is None and guard.high == 42


def test_guard_flags_another_cluster_id_on_any_answer() -> None:
    guard = RevisionGuard()
    reasons: list[str] = []
    guard.subscribe(reasons.append)
    assert guard.observe(_header(10, 0xAA), guard.mark(), "m") is None
    reason = guard.observe(_header(500, 0xBB), None, "m")
    assert reason is not None and "cluster bb, not cluster aa" in reason
    assert guard.observe(_header(501, 0xBB), guard.mark(), "m") is None
    assert reasons == [reason]


# -- one local member -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=80)


@pytest.fixture
def url(etcd_server: LocalEtcd) -> str:
    return etcd_server.url_with_prefix(f"e-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def store(url: str) -> Iterator[LeaseStore]:
    with open_store(url) as store:
        yield store


def test_bump_raises_every_later_token_above_every_earlier_one(store: LeaseStore) -> None:
    assert store.epoch() == 0
    with store.session("A", 30) as a:
        held = a.claim("held")
        done = a.claim("done")
        assert held is not None and done is not None and held.generation < STEP
        done.complete(b"r")
        assert store.bump_epoch() == 1 and store.epoch() == 1
        fresh = a.claim("fresh")
        assert fresh is not None and fresh.generation > STEP > held.generation
        held.renew()  # a holder across the bump keeps its old-epoch token
        record = store.get("held")
        assert record is not None and record.generation == held.generation
        assert held.complete(b"ok").generation == held.generation
        record = store.get("fresh")
        assert record is not None and record.generation == fresh.generation
        assert {r.job_id: r.generation for r in store.records()} == {
            "held": held.generation, "done": done.generation, "fresh": fresh.generation}
        fresh.release()
        again = store.get("fresh")
        assert again is not None and again.generation == fresh.generation
        above = 5 * STEP + 17
        assert store.bump_epoch(above=above) == 6
        later = a.claim("fresh")
        assert later is not None and later.generation > above and split(later.generation)[0] == 6


def test_bump_rejects_bad_input(store: LeaseStore) -> None:
    backend = backend_of(store)
    with pytest.raises(InvalidArgument):
        backend.bump_epoch(-1)
    with pytest.raises(InvalidArgument, match="2\\*\\*63"):
        backend.bump_epoch(2**63 - 1)  # epoch 2**19 would overflow the token
    assert store.epoch() == 0


def test_a_driver_with_a_stale_epoch_claims_in_the_new_one(url: str) -> None:
    with open_store(url) as first, open_store(url) as second, first.session("A", 30) as a:
        assert a.claim("warm") is not None  # first caches epoch 0
        first.enqueue("q", "limited", b"", max_attempts=3)
        assert second.bump_epoch() == 1
        one = a.claim("one")
        assert one is not None and split(one.generation)[0] == 1
        assert second.bump_epoch() == 2
        batch = a.claim_many(["b1", "b2"])
        assert all(lease is not None and split(lease.generation)[0] == 2 for lease in batch)
        assert second.bump_epoch() == 3
        limited = a.claim("limited")  # a job with an attempt limit: two transactions
        assert limited is not None and split(limited.generation)[0] == 3
        failed = limited.fail("boom")
        assert failed.generation == limited.generation


@pytest.mark.parametrize("applied", [True, False])
def test_bump_settles_a_lost_answer_by_reading_back(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    store.bump_epoch()
    dropped = lose_answers(store, monkeypatch, applied=applied)
    assert store.bump_epoch() == 2  # landed once, whether the first copy applied or not
    assert dropped and "epoch" in dropped[0]
    assert store.epoch() == 2


def test_a_claim_without_its_handle_is_checked_against_its_epoch(store: LeaseStore) -> None:
    backend = backend_of(store)
    store.bump_epoch()
    with store.session("A", 30) as a:
        lease = a.claim("job")
        assert lease is not None
        handle = lease.session.handle
        token = lease.generation
        local = split(token)[1]
        with pytest.raises(StaleLeaseError):  # same revision, another epoch
            backend.complete(handle, "job", ClaimResult(local), b"")
        with pytest.raises(StaleLeaseError):
            backend.release(handle, "job", ClaimResult(2 * STEP + local))
        with pytest.raises(StaleLeaseError):
            backend.renew(handle, "job", ClaimResult(local))
        backend.renew(handle, "job", ClaimResult(token))
        record = backend.complete(handle, "job", ClaimResult(token), b"x")
        assert record.state is JobState.COMPLETED and record.generation == token


def _pretend_seen(store: LeaseStore, ahead: int) -> None:
    """Make the driver believe it saw a revision ``ahead`` above the cluster's: to it,
    the next answers come from a history that went back."""
    guard = backend_of(store)._transport.guard
    guard._high += ahead
    guard._mark = Mark(guard._era, guard._high)  # what requests are marked with


def test_a_claim_answered_below_a_seen_revision_is_handed_back(
    url: str, store: LeaseStore
) -> None:
    with store.session("A", 30) as a, store.session("B", 30) as b:
        held = a.claim("held")
        assert held is not None
        _pretend_seen(store, 1000)
        with pytest.raises(StoreRegressed, match="went back"):
            b.claim("new")
        record = store.get("new")
        assert record is None or record.state is JobState.AVAILABLE  # handed back
        with pytest.raises(StoreRegressed):
            held.ensure_held()  # every session open at the time is over
        with pytest.raises(StoreRegressed):
            a.keepalive()
        with pytest.raises(StoreRegressed):  # refused until the epoch is raised
            store.session("C", 30)
        with open_store(url) as fresh:  # by the store's marker, in a new store object too
            with pytest.raises(StoreRegressed):
                fresh.session("C", 30)
            assert fresh.bump_epoch() == 1
        with store.session("C", 30) as c:
            new = c.claim("new")
            assert new is not None and split(new.generation)[0] == 1


def test_an_idle_holder_learns_of_it_at_its_next_keepalive(store: LeaseStore) -> None:
    with store.session("A", 3) as a:
        lease = a.claim("job")
        assert lease is not None
        _pretend_seen(store, 1000)
        interval = a.granted_ttl_s / 3
        start = time.monotonic()
        poll_until(lambda: isinstance(a.lost_reason, StoreRegressed), interval + 1.0)
        assert time.monotonic() - start < interval + 1.0
        with pytest.raises(StoreRegressed):
            lease.ensure_held()


# -- a member restored from a snapshot ------------------------------------------------------


def test_restored_store_ends_running_sessions_and_bump_puts_tokens_above(
    tmp_path: Path,
) -> None:
    require_local_etcd(etcdctl=True)
    with LocalEtcd(size=1, base=90) as cluster:
        url = cluster.url_with_prefix("restore")
        fence = SqliteFence(str(tmp_path / "fence.db"))
        with open_store(url) as old, old.session("old-holder", 9) as holder:
            cluster.save_snapshot(cluster.members[0], tmp_path / "snap.db")
            for i in range(20):  # history the snapshot does not have
                filler = holder.claim(f"filler-{i}")
                assert filler is not None
                filler.complete(b"")
            finished = holder.claim("finished")
            assert finished is not None
            finished.complete(b"done after the snapshot")
            lease = holder.claim("job")
            assert lease is not None
            seen = lease.generation
            fence.apply("job", seen, "step-1")

            cluster.restore_snapshot(tmp_path / "snap.db")
            ready = time.monotonic()
            within = holder.granted_ttl_s / 3 + 1.5
            poll_until(lambda: isinstance(holder.lost_reason, StoreRegressed), within)
            assert time.monotonic() - ready < within
            with pytest.raises(StoreRegressed):
                lease.ensure_held()
            _next_holders(url, fence, seen, finished.generation)
            with pytest.raises(FenceRejected):  # the old holder, writing late
                fence.apply("job", seen, "step-2")


def _next_holders(url: str, fence: SqliteFence, seen: int, finished: int) -> None:
    """A worker started on the restored store: before bump_epoch it cannot open a
    session (the marker the holder's driver wrote says the store went back); after,
    every token is above every earlier one."""
    with open_store(url) as store:
        with pytest.raises(StoreRegressed):
            store.session("next", 30)
        highest = fence.highest_token("job")
        assert highest == seen
        epoch = store.bump_epoch(above=highest)
        assert epoch >= 1
        with store.session("next", 30) as worker:
            after = worker.claim("job", wait_s=15)  # the old holder's lease may linger
            assert after is not None and after.generation > seen
            fence.apply("job", after.generation, "step-1")
            again = worker.claim("finished")  # completed after the snapshot: claimable again
            assert again is not None and again.generation > finished
