"""The store epoch on ZooKeeper (``{chroot}/epoch``, checked by every claim multi, folded
into every token) and noticing a store whose history went back: its identity znode gone,
and a wiped ensemble (a 3-member ensemble of its own, wiped under a running holder).

Like the other ZooKeeper tests these run on the container ensemble unless
``CONSENSUS_LEASE_ZK=local`` (see ``zk_local.py``); the wipe test always needs the
containers. Nothing sleeps to synchronise: waits poll with deadlines.
"""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from zk_local import (  # noqa: F401  (fixtures)
    backend,
    chroot_of,
    handle,
    lose_answer,
    raw_client,
    store,
    zk_target,
    zk_url,
)

from consensus_lease import LeaseStore, SqliteFence, open_store
from consensus_lease.backends.zookeeper import ZooKeeperBackend
from consensus_lease.backends.zookeeper._sessions import ZkSession
from consensus_lease.backends.zookeeper._tokens_history import PROBE_INTERVAL_S
from consensus_lease.errors import (
    FenceRejected,
    InvalidArgument,
    StaleLeaseError,
    StoreRegressed,
)
from consensus_lease.fencing import FenceOutcome
from consensus_lease.record import ClaimResult, JobState
from consensus_lease.testing.conformance import poll_until

pytestmark = pytest.mark.slow

EPOCH = 2**32
"""One epoch in tokens (``epoch_shift`` 32)."""


def requests(h: ZkSession) -> list[str]:
    """From now on, the type of each request ``h``'s client sends (``Transaction`` for a
    multi, ``GetData``/``Sync`` for reads)."""
    sent: list[str] = []
    real = h.client._call

    def counting(request: Any, async_object: Any) -> Any:
        sent.append(type(request).__name__)
        return real(request, async_object)

    h.client._call = counting
    return sent


@pytest.fixture
def other(zk_url: str) -> Iterator[LeaseStore]:
    """A second store (its own backend: another process, as far as the first can tell)
    on the same chroot."""
    second = open_store(zk_url, connect_timeout_s=30)
    try:
        yield second
    finally:
        second.close()


# -- the epoch in tokens -------------------------------------------------------------------


def test_bump_raises_every_later_token_and_a_holder_across_it_keeps_working(
    store: LeaseStore,
) -> None:
    assert ZooKeeperBackend.capabilities.epoch and ZooKeeperBackend.epoch_shift == 32
    assert store.epoch() == 0
    session = store.session("A", 30.0)
    held = session.claim("held")
    assert held is not None and held.generation == 1  # epoch 0: the version, as always
    assert store.bump_epoch() == 1 and store.epoch() == 1
    held.renew()
    fresh = session.claim("fresh")
    assert fresh is not None and fresh.generation == EPOCH + 1
    record = store.get("fresh")
    assert record is not None and (record.state, record.generation) == (JobState.HELD,
                                                                        EPOCH + 1)
    done = fresh.complete(b"r")
    assert done.generation == EPOCH + 1
    stored = store.get("fresh")
    assert stored is not None and stored.generation == EPOCH + 1
    assert held.complete(b"old").generation == 1  # claimed in epoch 0: its token stays
    assert [r.generation for r in store.records()] == [EPOCH + 1, 1]
    above = 5 * EPOCH + 7
    assert store.bump_epoch(above=above) == 6
    again = session.claim("third")
    assert again is not None and again.generation == 6 * EPOCH + 1 > above
    session.close()


def test_bad_bumps_change_nothing(store: LeaseStore) -> None:
    with pytest.raises(InvalidArgument):
        store.bump_epoch(above=-1)
    with pytest.raises(InvalidArgument):
        store.bump_epoch(above=2**63 - 1)  # epoch 2**31: tokens beyond int64
    assert store.epoch() == 0


def test_a_claim_without_its_hold_is_checked_against_the_whole_token(
    store: LeaseStore, backend: ZooKeeperBackend
) -> None:
    store.bump_epoch()
    h = backend.open_session("A", 30.0)
    try:
        claim = backend.claim(h, "job")
        assert claim is not None and claim.generation == EPOCH + 1
        backend.renew(h, "job", ClaimResult(claim.generation))
        with pytest.raises(StaleLeaseError) as wrong:
            backend.renew(h, "job", ClaimResult(1))  # the right version, not the epoch
        assert wrong.value.current_generation == EPOCH + 1
        with pytest.raises(StaleLeaseError):
            backend.complete(h, "job", ClaimResult(1), b"x")
        record = backend.complete(h, "job", ClaimResult(claim.generation), b"x")
        assert (record.state, record.generation) == (JobState.COMPLETED, EPOCH + 1)
    finally:
        backend.close_session(h)


def test_a_bump_between_the_epoch_read_and_the_claim_is_read_and_sent_again(
    store: LeaseStore, other: LeaseStore
) -> None:
    """The session cached epoch 0 when it opened; another process bumps it; the claim
    multi fails on its check of the epoch znode alone, the epoch is read again and the
    multi sent once more, without reading the job (a new one: see ``_jobs_known``). Later
    claims cost what they always did: one multi."""
    session = store.session("A", 30.0)
    assert other.bump_epoch() == 1
    sent = requests(handle(session))
    lease = session.claim("job")
    assert lease is not None and lease.generation == EPOCH + 1
    # the failed multi; the epoch read after a write barrier; the multi again
    assert sent == ["Transaction", "Transaction", "GetData", "Transaction"]
    sent.clear()
    second = session.claim("second")
    assert second is not None and second.generation == EPOCH + 1
    assert sent == ["Transaction"]
    assert lease.complete(b"r").generation == EPOCH + 1
    record = other.get("job")
    assert record is not None and (record.state, record.generation) == (JobState.COMPLETED,
                                                                        EPOCH + 1)
    session.close()


def lose_answer_of_multi(client: KazooClient, nth: int, apply: bool) -> list[int]:
    """The ``nth`` multi (1-based) ``client`` starts loses its answer, after being applied
    if ``apply``. Returns a list that grows by one per multi started (write barriers are
    multis too)."""
    return lose_answer(client, apply, nth=nth)


@pytest.mark.parametrize("apply", [True, False], ids=["applied", "not-applied"])
def test_lost_answer_to_a_bump_is_read_back(
    store: LeaseStore, backend: ZooKeeperBackend, apply: bool
) -> None:
    assert store.epoch() == 0  # starts the shared client
    multis = lose_answer_of_multi(backend._wire.reader(), 2, apply)  # 1: the read's barrier
    assert store.bump_epoch() == 1
    # applied: its nonce is found after a barrier; not applied: read and sent again
    assert len(multis) == (3 if apply else 5)
    assert store.epoch() == 1  # never bumped twice


def test_concurrent_bumps_each_raise_the_epoch(zk_url: str) -> None:
    stores = [open_store(zk_url, connect_timeout_s=30) for _ in range(4)]
    try:
        for s in stores:
            s.epoch()  # connected before the race
        results: list[int] = []
        start = threading.Barrier(len(stores))

        def bump(s: LeaseStore) -> None:
            start.wait()
            results.append(s.bump_epoch())

        threads = [threading.Thread(target=bump, args=(s,)) for s in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(results) == [1, 2, 3, 4]
        assert stores[0].epoch() == 4
    finally:
        for s in stores:
            s.close()


# -- history gone back ----------------------------------------------------------------------


def test_identity_gone_ends_every_session_until_the_epoch_is_raised(
    store: LeaseStore, backend: ZooKeeperBackend, zk_url: str
) -> None:
    """The identity znode is read in the keepalive round trip at most once per keepalive
    interval: deleting it (as a wipe would) ends the session with StoreRegressed within
    about one interval; opening another one is refused until the epoch is raised."""
    session = store.session("A", ttl_s=3.0)
    lease = session.claim("job")
    assert lease is not None and lease.generation == 1
    raw = raw_client(zk_url)
    try:
        raw.delete(f"{chroot_of(zk_url)}/identity")
    finally:
        raw.stop()
        raw.close()
    poll_until(lambda: session.lost.is_set(), 2 * session.granted_ttl_s / 3 + 5)
    assert isinstance(session.lost_reason, StoreRegressed)
    with pytest.raises(StoreRegressed):
        lease.ensure_held()
    with pytest.raises(StoreRegressed):
        backend.keepalive(session.handle)
    with pytest.raises(StoreRegressed):
        store.session("B", ttl_s=3.0)
    assert store.bump_epoch() == 1  # the operator's answer: the backend is usable again
    again = store.session("C", ttl_s=3.0).claim("job", wait_s=10)  # handed back
    assert again is not None and again.generation == EPOCH + 2
    again.release()


def test_wiped_ensemble_ends_the_holder_with_store_regressed_promptly(
    fresh_zookeeper_cluster: Any, tmp_path: Path
) -> None:
    """A holder runs across a wipe of the whole ensemble. Its client is refused by every
    member (it has seen newer zxids than the new history has), so only a probe with a
    fresh client can tell: the session ends with StoreRegressed within one keepalive
    interval of the ensemble serving again, not after its TTL. The next holder's token
    on the wiped store is below the old one (the fence rejects it) until the epoch is
    raised above the fence's highest token; then its write is accepted and the old
    holder's late write rejected."""
    cluster = fresh_zookeeper_cluster
    url = cluster.url_with_prefix("wiped")
    fence = SqliteFence(str(tmp_path / "fence.db"))
    old = open_store(url, connect_timeout_s=30)
    new: LeaseStore | None = None
    try:
        session = old.session("old-holder", ttl_s=45.0)
        interval_s = session.granted_ttl_s / 3
        for _ in range(20):  # a history with some length: generation 21
            warmup = session.claim("job")
            assert warmup is not None
            warmup.release()
        lease = session.claim("job")
        assert lease is not None and lease.generation == 21
        assert fence.apply("job", lease.fencing_token, "before") is FenceOutcome.ACCEPTED
        lease.renew()  # the local deadline is a whole TTL away: not what ends the session
        wipe_s = cluster.wipe()
        served = time.monotonic()
        poll_until(lambda: session.lost.is_set(), interval_s + 10)
        noticed_s = time.monotonic() - served
        assert isinstance(session.lost_reason, StoreRegressed), session.lost_reason
        assert noticed_s < interval_s, (wipe_s, noticed_s)
        assert noticed_s < 2 * PROBE_INTERVAL_S + 5  # prompt: not the ~45 s of a refused client
        with pytest.raises(StoreRegressed):
            lease.ensure_held()

        new = open_store(url, connect_timeout_s=30)
        next_session = new.session("next-holder", ttl_s=30.0)
        honest = next_session.claim("job")
        assert honest is not None and honest.generation == 1  # the wiped store starts again
        with pytest.raises(FenceRejected):
            fence.apply("job", honest.fencing_token, "too-low")
        honest.release()
        highest = fence.highest_token("job")
        assert highest == 21
        assert new.bump_epoch(above=highest) == 1
        after = next_session.claim("job")
        assert after is not None and after.generation == EPOCH + 2 > highest
        assert fence.apply("job", after.fencing_token, "after") is FenceOutcome.ACCEPTED
        with pytest.raises(FenceRejected):
            fence.apply("job", lease.fencing_token, "late-old-write")
        after.release()
        resumed = old.session("old-process-again", ttl_s=30.0)  # the epoch was raised
        again = resumed.claim("job")
        assert again is not None and again.generation == EPOCH + 3
        again.release()
    finally:
        fence.close()
        old.close()
        if new is not None:
            new.close()
