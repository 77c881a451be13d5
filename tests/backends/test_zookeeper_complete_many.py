"""ZooKeeper's ``complete_many``, ``release_many`` and ``fail_many``: one multi for a
batch of this session's own claims (split by count and by bytes); a stale item makes
that multi apply nothing, and each item is then ended alone (its own outcome: the others
still commit); a lost answer is read back, never re-sent blindly; a version out of
ZooKeeper's 32-bit range is refused before anything is sent."""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

from typing import Any

import pytest
from kazoo.client import KazooClient
from zk_local import (  # noqa: F401  (fixtures)
    handle,
    lose_answer,
    lose_next_multi,
    multi_op_types,
    raw,
    reading_back_fails,
    store,
    zk_target,
    zk_url,
)

from consensus_lease import LeaseStore, open_store
from consensus_lease.backends.zookeeper import ZooKeeperBackend
from consensus_lease.backends.zookeeper._layout import JobPaths
from consensus_lease.backends.zookeeper._transport_multi import MAX_VERSION
from consensus_lease.errors import (
    OutcomeUnknown,
    StaleLeaseError,
    TokenSpaceExhausted,
)
from consensus_lease.lease import Lease
from consensus_lease.record import ClaimResult, JobState, LeaseRecord
from consensus_lease.session import Session

pytestmark = pytest.mark.containers


def _count_multis(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []
    wire = store.backend._wire
    inner = wire.commit

    def commit(h: Any, build: Any, settle: Any, what: str, *rest: Any) -> Any:
        sent.append(what)
        return inner(h, build, settle, what, *rest)

    monkeypatch.setattr(wire, "commit", commit)
    return sent


def test_complete_many_is_one_multi_and_a_stale_item_falls_back_alone(
    zk_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = open_store(zk_url, connect_timeout_s=30)
    try:
        store.enqueue_many("q", [f"j{i}" for i in range(10)])
        a, b = store.session("A", 30.0), store.session("B", 30.0)
        leases = [lease for lease in a.claim_many([f"j{i}" for i in range(10)]) if lease]
        assert len(leases) == 10
        sent = _count_multis(store, monkeypatch)
        out = a.complete_many([(lease, b"r") for lease in leases[:8]])
        assert sent == ["complete_many"]  # one round trip for 8 completions
        assert all(isinstance(r, LeaseRecord) and r.state is JobState.COMPLETED for r in out)
        stale, fresh = leases[8], leases[9]
        # Released behind the lease's back by a claim without its hold (handle None), so
        # the hold the lease carries still looks current: the batch multi is sent.
        store.backend.release(a.handle, stale.job_id, ClaimResult(stale.generation))
        newer = b.claim(stale.job_id)
        assert newer is not None
        sent.clear()
        out = a.complete_many([stale, fresh])
        assert isinstance(out[0], StaleLeaseError) and isinstance(out[1], LeaseRecord)
        assert sent[0] == "complete_many" and len(sent) <= 3  # the batch, then each alone
        record = store.get(fresh.job_id)
        assert record is not None and record.state is JobState.COMPLETED
        held = store.get(stale.job_id)
        assert held is not None and held.owner == "B"
        a.close()
        b.close()
    finally:
        store.close()


# -- release_many and fail_many ---------------------------------------------------------------


def _claimed(store: LeaseStore, session: Session, count: int, prefix: str = "j") -> list[Lease]:
    store.enqueue_many("q", [f"{prefix}{i}" for i in range(count)])
    leases = [lease for lease in session.claim_many([f"{prefix}{i}" for i in range(count)])
              if lease]
    assert len(leases) == count
    return leases


def _sent_multis(client: KazooClient) -> list[int]:
    """Grows by one per multi of more than one operation ``client`` really sends (write
    barriers, one ``check``, are not counted)."""
    return lose_answer(client, apply=False, nth=0,  # nth 0: no answer is lost
                       counts=lambda request: len(multi_op_types(request)) > 1)


def _stale_behind_its_back(store: LeaseStore, lease: Lease, other: Session) -> None:
    """Release ``lease`` by a claim without its hold (so the hold it carries still looks
    current and the batch multi is sent), and let ``other`` claim the job."""
    store.backend.release(lease.session.handle, lease.job_id, ClaimResult(lease.generation))
    assert other.claim(lease.job_id) is not None


def test_release_many_and_fail_many_send_one_multi_per_chunk(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert store.capabilities.max_end_batch == 128
    a = store.session("A", 30.0)
    leases = _claimed(store, a, 260)
    sent = _count_multis(store, monkeypatch)
    assert a.release_many(leases[:130]) == [None] * 130
    assert sent == ["release_many", "release_many"]  # 128 + 2: the session splits
    again = a.claim_many([lease.job_id for lease in leases[:3]])
    assert [lease.generation for lease in again if lease] == [2, 2, 2]  # claimable at once
    sent.clear()
    out = a.fail_many([(lease, f"e{i}", 60.0) for i, lease in enumerate(leases[130:])])
    assert sent == ["fail_many", "fail_many"]
    assert all(isinstance(r, LeaseRecord) and r.state is JobState.AVAILABLE for r in out)
    assert len({r.not_before for r in out[:128] if isinstance(r, LeaseRecord)}) == 1
    assert out[5] == store.get(leases[135].job_id)  # one multi: one mtime
    a.close()


def test_a_stale_item_is_refused_while_the_others_end(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = store.session("A", 30.0), store.session("B", 30.0)
    leases = _claimed(store, a, 6)
    _stale_behind_its_back(store, leases[0], b)
    _stale_behind_its_back(store, leases[3], b)
    sent = _count_multis(store, monkeypatch)
    out = a.release_many(leases[:3])
    assert isinstance(out[0], StaleLeaseError) and out[1:] == [None, None]
    assert sent == ["release_many", "release", "release", "release"]  # the batch, then alone
    sent.clear()
    failed = a.fail_many([(lease, "boom", 0.0) for lease in leases[3:]])
    assert isinstance(failed[0], StaleLeaseError)
    assert sent[0] == "fail_many" and len(sent) == 4
    for lease, answer in zip(leases[4:], failed[1:], strict=True):
        assert isinstance(answer, LeaseRecord) and answer == store.get(lease.job_id)
        assert answer.error == "boom" and answer.state is JobState.AVAILABLE
    for job_id in (leases[0].job_id, leases[3].job_id):
        record = store.get(job_id)
        assert record is not None and record.owner == "B"
    a.close()
    b.close()


def test_fail_many_splits_a_chunk_over_the_size_limit(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = store.session("A", 30.0)
    leases = _claimed(store, a, 5)
    sent = _count_multis(store, monkeypatch)
    errors = [chr(ord("a") + i) * 60_000 for i in range(5)]  # 2 per 160 KB multi
    out = a.fail_many(list(zip(leases, errors, strict=True)))
    assert sent == ["fail_many"] * 3
    for lease, error, answer in zip(leases, errors, out, strict=True):
        assert isinstance(answer, LeaseRecord) and answer.error == error
        assert store.get(lease.job_id) == answer
    a.close()


@pytest.mark.parametrize("apply", [True, False], ids=["applied", "not-applied"])
@pytest.mark.parametrize("op", ["release_many", "fail_many"])
def test_lost_answer_is_settled_by_reading_back(
    store: LeaseStore, raw: KazooClient, op: str, apply: bool,
) -> None:
    a = store.session("A", 30.0)
    leases = _claimed(store, a, 3)
    calls = lose_next_multi(handle(a).client, apply)
    if op == "release_many":
        assert a.release_many(leases) == [None, None, None]
        # applied: the one multi, read back; not applied: then each item alone
        assert len(calls) == (1 if apply else 4)
        again = a.claim_many([lease.job_id for lease in leases])
        assert [lease.generation for lease in again if lease] == [2, 2, 2]
    else:
        out = a.fail_many([(lease, "boom", 5.0) for lease in leases])
        assert len(calls) == (1 if apply else 4)
        backend = store.backend
        assert isinstance(backend, ZooKeeperBackend)
        raw.sync("/")
        for lease, answer in zip(leases, out, strict=True):
            paths = JobPaths.of(backend.config.base, lease.job_id)
            stat = raw.exists(paths.failure)
            assert stat.version == 1  # written once: never sent twice
            assert isinstance(answer, LeaseRecord) and answer == store.get(lease.job_id)
            assert answer.not_before == pytest.approx((stat.mtime + 5000) / 1000)
    a.close()


@pytest.mark.parametrize("op", ["release_many", "fail_many"])
def test_an_answer_that_cannot_be_read_back_is_each_items_outcome_unknown(
    zk_url: str, op: str,
) -> None:
    store = open_store(zk_url, connect_timeout_s=30, timeout_s=1.0)
    backend = store.backend
    assert isinstance(backend, ZooKeeperBackend)
    try:
        a = store.session("A", 30.0)
        leases = _claimed(store, a, 3)
        calls = lose_next_multi(handle(a).client, apply=True)
        with reading_back_fails(backend):
            out: list[Any] = (a.release_many(leases) if op == "release_many"
                              else a.fail_many([(lease, "boom") for lease in leases]))
        assert all(isinstance(answer, OutcomeUnknown) for answer in out)
        assert len(calls) == 1  # not re-sent
        assert a.leases() == []
        for lease in leases:  # applied, as the store shows
            record = store.get(lease.job_id)
            assert record is not None and record.state is JobState.AVAILABLE
    finally:
        store.close()


def test_a_version_out_of_range_is_refused_before_sending(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = store.session("A", 30.0)
    leases = _claimed(store, a, 3)
    hold: Any = leases[1].claim_result.handle
    hold.owner_version = MAX_VERSION + 1  # as an owner znode rewritten past the limit
    sent = _sent_multis(handle(a).client)
    out = a.release_many(leases)
    assert out[0] is None and out[2] is None and isinstance(out[1], TokenSpaceExhausted)
    assert len(sent) == 2  # not the batch: the two good items alone
    hold.owner_version = 0
    assert leases[1].state.name == "HELD"  # nothing was sent for it: still held
    assert a.release_many([leases[1]]) == [None]
    a.close()

