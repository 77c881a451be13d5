"""Claims sent without reading first (see ``consensus_lease.backends.zookeeper._jobs_known``):
a job this backend never saw is claimed as a new one (create + set_data at 0 + owner
znode), a job it released at the version it left; only a multi that fails is followed by
the read (and the claim that read decides). So a claim+complete cycle of a new job, or a
claim+release cycle of a job released here, is two requests, both multis.

Requests are counted at kazoo's transport by the bench's counter
(:func:`consensus_lease.bench.roundtrips.counting`) or on the session's client. Like the
other ZooKeeper tests these run on the 3-member container ensemble unless
``CONSENSUS_LEASE_ZK=local`` (see ``zk_local.py``).
"""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from zk_local import (  # noqa: F401  (fixtures)
    backend,
    handle,
    lose_next_answer,
    opened,
    session_ttl_s,
    store,
    zk_target,
    zk_url,
)

from consensus_lease import LeaseStore, open_store
from consensus_lease.backends.zookeeper import ZooKeeperBackend
from consensus_lease.backends.zookeeper._sessions import ZkSession
from consensus_lease.bench.roundtrips import counting
from consensus_lease.errors import JobCompleted, JobFailed
from consensus_lease.record import JobState
from consensus_lease.session import Session

pytestmark = pytest.mark.slow

CYCLES = 5


def requests(h: ZkSession) -> list[str]:
    """From now on, the type of each request ``h``'s client sends."""
    sent: list[str] = []
    real = h.client._call

    def counted(request: Any, async_object: Any) -> Any:
        sent.append(type(request).__name__)
        return real(request, async_object)

    h.client._call = counted
    return sent


@pytest.fixture
def other(zk_url: str) -> Iterator[LeaseStore]:
    """A second store on the same chroot: another process, as far as the first knows."""
    second = open_store(zk_url, connect_timeout_s=30)
    try:
        yield second
    finally:
        second.close()


def test_claim_complete_cycle_is_two_requests(zk_url: str) -> None:
    """The bench's count: a steady-state cycle on a new job is two multis, no read."""
    with counting(["kazoo"]) as count, open_store(zk_url, connect_timeout_s=30) as store, \
            store.session("A", 10.0) as session:
        warm = session.claim("warm")  # the session's first znodes, the epoch read
        assert warm is not None
        warm.complete(b"")
        count.reset()
        for i in range(CYCLES):
            lease = session.claim(f"job-{i}")
            assert lease is not None and lease.generation == 1
            lease.complete(b"r")
        assert count.snapshot() == {"Transaction": 2 * CYCLES}
        record = store.get(f"job-{CYCLES - 1}")
        assert record is not None and record.state is JobState.COMPLETED
        assert (record.generation, record.result, record.attempt) == (1, b"r", 1)


def test_claim_release_cycle_of_one_job_is_two_requests(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    a = opened("A")
    first = a.claim("lock")
    assert first is not None
    first.release()
    sent = requests(handle(a))
    for i in range(CYCLES):
        lease = a.claim("lock")
        assert lease is not None and lease.generation == i + 2  # consecutive tokens
        assert lease.claim_result.attempt == i + 2
        lease.release()
    assert sent == ["Transaction"] * (2 * CYCLES)
    record = store.get("lock")
    assert record is not None and record.state is JobState.AVAILABLE
    assert (record.generation, record.attempt) == (CYCLES + 1, CYCLES + 1)


def test_claim_many_of_new_jobs_is_one_multi(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    a = opened("A")
    sent = requests(handle(a))
    leases = a.claim_many([f"j{i}" for i in range(50)])
    assert all(lease is not None and lease.generation == 1 for lease in leases)
    assert sent == ["Transaction"]


def test_guessed_new_but_completed_elsewhere_reads_and_refuses(
    store: LeaseStore, other: LeaseStore, opened: Callable[..., Session]
) -> None:
    with other.session("B", 10.0) as b:
        done = b.claim("job")
        assert done is not None
        done.complete(b"B's")
    a = opened("A")
    sent = requests(handle(a))
    with pytest.raises(JobCompleted) as refused:
        a.claim("job")
    assert refused.value.generation == 1
    assert sent[0] == "Transaction" and sent.count("Transaction") == 1  # the guess only
    record = store.get("job")
    assert record is not None and record.state is JobState.COMPLETED
    assert (record.generation, record.result) == (1, b"B's")
    del sent[:]
    with pytest.raises(JobCompleted):
        a.claim("job")
    assert "Transaction" not in sent  # seen now: read first


def test_a_held_job_is_polled_by_reading(
    store: LeaseStore, other: LeaseStore, opened: Callable[..., Session]
) -> None:
    with other.session("B", 10.0) as b:
        held = b.claim("job")
        assert held is not None
        a = opened("A")
        sent = requests(handle(a))
        assert a.claim("job") is None  # the guess fails on the job znode's create
        assert sent.count("Transaction") == 1
        del sent[:]
        for _ in range(3):
            assert a.claim("job") is None
        assert "Transaction" not in sent  # a poll is a read, not a failing write
        held.release()
    lease = a.claim("job")
    assert lease is not None and lease.generation == 2


def test_released_here_then_changed_elsewhere(
    store: LeaseStore, other: LeaseStore, opened: Callable[..., Session]
) -> None:
    a = opened("A")
    first = a.claim("job")
    assert first is not None
    first.release()
    with other.session("B", 10.0) as b:  # claims and releases: version 2
        second = b.claim("job")
        assert second is not None and second.generation == 2
        second.release()
    sent = requests(handle(a))
    third = a.claim("job")  # guessed at version 1: fails, read, claimed at 2
    assert third is not None and third.generation == 3 and third.claim_result.attempt == 3
    assert sent.count("Transaction") == 2 and "GetData" in sent
    third.release()
    with other.session("B", 10.0) as b:
        fourth = b.claim("job")
        assert fourth is not None and fourth.generation == 4
        fourth.complete(b"B's")
    with pytest.raises(JobCompleted):
        a.claim("job")
    record = store.get("job")
    assert record is not None and record.state is JobState.COMPLETED
    assert (record.generation, record.result) == (4, b"B's")


def test_attempt_limit_survives_guessed_claims(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    store.enqueue("q", "job", max_attempts=2)
    a = opened("A")
    sent = requests(handle(a))
    first = a.claim("job")  # enqueued here: read first, no guess
    assert first is not None and first.claim_result.attempt == 1
    assert sent[0] == "GetData" and sent.count("Transaction") == 1
    first.release()
    del sent[:]
    second = a.claim("job")  # released here: guessed, with the queue's markers
    assert second is not None and second.claim_result.attempt == 2
    assert sent == ["Transaction"]
    record = store.get("job")
    assert record is not None and (record.attempt, record.max_attempts) == (2, 2)
    assert store.queue_stats("q").held == 1
    second.release()
    with pytest.raises(JobFailed):  # used up: not guessed; the read makes it FAILED
        a.claim("job")
    record = store.get("job")
    assert record is not None and record.state is JobState.FAILED


def test_claim_next_reads_first(store: LeaseStore, opened: Callable[..., Session]) -> None:
    """A queue's candidates exist: their claims read first, no multi is wasted."""
    store.enqueue("q", "j1")
    a = opened("A")
    sent = requests(handle(a))
    lease = a.claim_next("q")
    assert lease is not None and lease.job_id == "j1"
    assert sent.count("Transaction") == 1 and sent[-1] == "Transaction"


def test_a_job_released_before_an_epoch_bump_is_read(
    store: LeaseStore, other: LeaseStore, opened: Callable[..., Session]
) -> None:
    """A store restored from a backup may hold other data at the version this backend
    released a job at; the epoch raised after it ends the guess: the job is read."""
    a = opened("A")
    first = a.claim("job")
    assert first is not None
    first.release()
    assert other.bump_epoch() == 1
    sent = requests(handle(a))
    second = a.claim("job")
    assert second is not None and second.generation == 2**32 + 2
    # the guess fails on the epoch check alone; the epoch is read (after a write
    # barrier), the job is read, and claimed
    assert sent[0] == "Transaction" and sent.count("Transaction") == 3
    assert sent.count("GetData") == 5
    second.release()
    del sent[:]
    third = a.claim("job")  # released in this epoch: guessed again
    assert third is not None and third.generation == 2**32 + 3
    assert sent == ["Transaction"]


@pytest.mark.parametrize("applied", [True, False])
def test_guess_whose_answer_is_lost_is_read_back(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session], applied: bool
) -> None:
    a = opened("A")
    multis = lose_next_answer(handle(a).client, apply=applied)
    lease = a.claim("job")
    assert lease is not None and lease.generation == 1
    # the guess, the read-back's write barrier, then (not applied) the claim after a read
    assert len(multis) == (2 if applied else 3)
    lease.complete(b"")
    record = store.get("job")
    assert record is not None and record.state is JobState.COMPLETED
    assert record.generation == 1
