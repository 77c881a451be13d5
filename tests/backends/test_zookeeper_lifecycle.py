"""The job lifecycle on ZooKeeper (attempts, ``fail``, retry delays, FAILED, ``requeue``):
what the conformance suite cannot see. The failure znode and the queue's delayed
markers, retry delays measured on the store's clock only (a write's mtime, never the
worker's clock), lost answers of ``fail`` and ``requeue`` read back, and the cost of the
common path. Like the other ZooKeeper tests these run on the 3-member container
ensemble unless ``CONSENSUS_LEASE_ZK=local`` (see ``zk_local.py``). Nothing sleeps to
synchronise: waits poll with deadlines.
"""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient
from zk_local import (  # noqa: F401  (fixtures)
    backend,
    handle,
    lose_answer,
    lose_next_multi,
    multi_op_types,
    opened,
    raw,
    session_ttl_s,
    store,
    zk_target,
    zk_url,
)

from consensus_lease import LeaseStore
from consensus_lease.backends.zookeeper import ZooKeeperBackend
from consensus_lease.backends.zookeeper._layout import JobPaths, encode_job_id, parse_failure
from consensus_lease.errors import InvalidArgument, JobFailed
from consensus_lease.record import JobState
from consensus_lease.session import Session
from consensus_lease.testing.conformance import poll_until

pytestmark = pytest.mark.slow


# -- helpers --------------------------------------------------------------------------------


def synced(raw: KazooClient) -> KazooClient:
    raw.sync("/")
    return raw


def job_paths(backend: ZooKeeperBackend, job_id: str) -> JobPaths:
    return JobPaths.of(backend.config.base, job_id)


def queue_dir(backend: ZooKeeperBackend, queue: str, kind: str) -> str:
    """A directory of the queue's first bucket (every test here stays below 257 jobs)."""
    return f"{backend.config.queues_base}/{encode_job_id(queue)}/b/0000000000/{kind}"


def markers(raw: KazooClient, backend: ZooKeeperBackend, queue: str, kind: str) -> list[str]:
    """The job ids with a ``kind`` marker (open, held, delayed, failed) in ``queue``."""
    path = queue_dir(backend, queue, kind)
    if synced(raw).exists(path) is None:
        return []
    return sorted(name.split("-", 1)[1] for name in raw.get_children(path))


def requests(client: KazooClient) -> list[str]:
    """From now on, the type of each request ``client`` sends (``Transaction`` for a multi,
    ``SetData`` for a write of the store's clock, ``GetData``/``Exists``/... for reads)."""
    sent: list[str] = []
    real = client._call

    def counting(request: Any, async_object: Any) -> Any:
        sent.append(type(request).__name__)
        return real(request, async_object)

    client._call = counting
    return sent


# -- layout ---------------------------------------------------------------------------------


def test_fail_writes_the_failure_znode_not_the_job_znode(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session],
    raw: KazooClient,
) -> None:
    """Generations stay consecutive: fail, a claim finding the attempts used up and
    requeue write the failure znode; only claims (and completion) move the job znode's
    version. The queue's markers follow: delayed made by a fail with a delay and deleted
    by the next claim; open deleted when FAILED and made again by requeue."""
    store.enqueue("q", "j", b"p", max_attempts=2)
    paths = job_paths(backend, "j")
    a = opened("A")
    first = a.claim_next("q")
    assert first is not None and (first.generation, first.attempt) == (1, 1)
    record = first.fail("boom", retry_in_s=0.3)
    data, stat = synced(raw).get(paths.failure)
    failure = parse_failure((data, stat), paths.failure)
    assert failure is not None and (failure.generation, failure.error) == (1, "boom")
    assert record.not_before == pytest.approx((stat.mtime + 300) / 1000)
    assert raw.exists(paths.job).version == 1  # the fail did not bump it
    assert markers(raw, backend, "q", "delayed") == ["j"]
    assert markers(raw, backend, "q", "open") == ["j"] and markers(raw, backend, "q", "held") == []
    second = a.claim_next("q", wait_s=30)
    assert second is not None and (second.generation, second.attempt) == (2, 2)
    assert markers(raw, backend, "q", "delayed") == []  # the claim deleted it
    second.release()  # the second attempt ends without completion: the budget is used up
    with pytest.raises(JobFailed) as refused:
        a.claim("j")
    assert (refused.value.attempt, refused.value.error) == (2, "boom")
    assert synced(raw).exists(paths.job).version == 2
    assert markers(raw, backend, "q", "open") == []  # FAILED: out of the listings
    assert markers(raw, backend, "q", "failed") == ["j"]  # and counted
    assert backend.queue_candidates("q", 10) == []
    assert store.queue_stats("q").failed == 1
    again = store.requeue("j")
    assert (again.state, again.attempt, again.generation) == (JobState.AVAILABLE, 2, 2)
    assert markers(raw, backend, "q", "open") == ["j"]
    assert markers(raw, backend, "q", "failed") == []
    third = a.claim_next("q")
    assert third is not None and (third.generation, third.attempt) == (3, 3)
    third.complete(b"ok")
    assert store.purge("q") == 1  # the failure znode goes with the job
    assert synced(raw).exists(paths.job) is None


def test_a_delayed_marker_deleted_by_hand_does_not_block_the_claim(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session],
    raw: KazooClient,
) -> None:
    store.enqueue("q", "j")
    a = opened("A")
    lease = a.claim_next("q")
    assert lease is not None
    lease.fail("boom", retry_in_s=0.2)
    delayed = queue_dir(backend, "q", "delayed")
    raw.delete(f"{delayed}/{synced(raw).get_children(delayed)[0]}")
    again = a.claim("j", wait_s=30)
    assert again.attempt == 2
    again.complete(b"")


# -- the store's clock ----------------------------------------------------------------------


@pytest.mark.parametrize("skew_s", [3600.0, -3600.0], ids=["ahead", "behind"])
def test_a_skewed_worker_clock_does_not_change_the_delay(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session],
    raw: KazooClient, monkeypatch: pytest.MonkeyPatch, skew_s: float,
) -> None:
    """Every process of the test has a wall clock an hour off: the delay still ends by the
    store's clock. The claim that finds it running makes one write (its mtime is the
    store's "now") and no multi; the claim that gets the job is applied at least the delay
    after the failing write, both times taken from the store (mtimes)."""
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + skew_s)
    a, b = opened("A"), opened("B")
    lease = a.claim("skewed")
    assert lease is not None
    record = lease.fail("boom", retry_in_s=1.0)
    paths = job_paths(backend, "skewed")
    failed_at_ms = synced(raw).exists(paths.failure).mtime
    assert record.not_before == pytest.approx((failed_at_ms + 1000) / 1000)
    assert abs(record.not_before - (real_time() + 1.0)) < 30  # the store's clock, not ours
    sent = requests(handle(b).client)
    assert b.claim("skewed") is None
    assert sent.count("SetData") == 1 and "Transaction" not in sent
    later = b.claim("skewed", wait_s=30)
    assert later.attempt == 2
    claimed_at_ms = synced(raw).exists(paths.job).mtime
    assert claimed_at_ms - failed_at_ms >= 1000
    later.release()


def test_claim_and_complete_without_a_limit_add_no_round_trip(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    """A job enqueued without max_attempts (and never failed): the claim is one round
    trip of pipelined reads (job, owner, tag, failure znode) and one multi, the completion
    one multi; no write of the store's clock."""
    store.enqueue("q", "j")
    a = opened("A")
    sent = requests(handle(a).client)
    lease = a.claim("j")
    assert lease is not None and lease.attempt == 1
    lease.complete(b"r")
    assert sent == ["GetData"] * 4 + ["Transaction"] * 2


def test_a_waiting_claim_next_gets_a_delayed_job_without_spinning(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    """ZooKeeper has no timer event: while the only job's delay runs, a waiter sleeps
    until its end (timed once from the store's clock), then gets it."""
    store.enqueue("q", "j")
    a, b = opened("A"), opened("B")
    lease = a.claim_next("q")
    assert lease is not None
    lease.fail("boom", retry_in_s=1.5)
    reader, worker = requests(backend._wire.reader()), requests(handle(b).client)
    started = time.monotonic()
    again = b.claim_next("q", wait_s=30)
    waited = time.monotonic() - started
    assert again is not None and again.attempt == 2
    assert 1.0 <= waited < 10.0
    assert len(reader) + len(worker) < 56  # a few round trips (7 requests each), not a spin
    again.complete(b"")


def test_wait_for_change_returns_when_the_delay_ends(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session]
) -> None:
    a, b = opened("A"), opened("B")
    lease = a.claim("j")
    assert lease is not None
    lease.fail("boom", retry_in_s=1.0)
    assert b.claim("j") is None  # times the delay on the store's clock
    started = time.monotonic()
    backend.wait_for_change("j", 20.0)
    assert time.monotonic() - started < 5.0
    poll_until(lambda: b.claim("j") is not None, 10)


# -- lost answers: read back, never re-sent blindly -----------------------------------------


@pytest.mark.parametrize("apply", [True, False], ids=["applied", "not-applied"])
@pytest.mark.parametrize("limit", [None, 1], ids=["retry", "dead-letter"])
def test_lost_fail_answer_is_read_back(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session],
    raw: KazooClient, apply: bool, limit: int | None,
) -> None:
    store.enqueue("q", "j", max_attempts=limit)
    raw.ensure_path(queue_dir(backend, "q", "delayed"))  # else made first: one more multi
    a = opened("A")
    lease = a.claim_next("q")
    assert lease is not None
    calls = lose_next_multi(handle(a).client, apply)
    record = lease.fail("boom", retry_in_s=5.0)
    assert len(calls) == (1 if apply else 2)  # sent again only if it was not applied
    paths = job_paths(backend, "j")
    stat = synced(raw).exists(paths.failure)
    assert stat.version == 1  # made and written once (create + set_data)
    assert raw.exists(paths.job).version == 1
    assert record.error == "boom" and record.attempt == 1
    assert record == store.get("j")
    if limit is None:
        assert record.state is JobState.AVAILABLE
        assert record.not_before == pytest.approx((stat.mtime + 5000) / 1000)
        assert markers(raw, backend, "q", "delayed") == ["j"]
        assert markers(raw, backend, "q", "open") == ["j"]
    else:
        assert record.state is JobState.FAILED and record.not_before is None
        assert markers(raw, backend, "q", "open") == []
        assert markers(raw, backend, "q", "delayed") == []
    assert markers(raw, backend, "q", "held") == []


@pytest.mark.parametrize("apply", [True, False], ids=["applied", "not-applied"])
def test_lost_requeue_answer_is_read_back(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session],
    raw: KazooClient, apply: bool,
) -> None:
    store.enqueue("q", "j", max_attempts=1)
    a = opened("A")
    lease = a.claim_next("q")
    assert lease is not None
    assert lease.fail("boom").state is JobState.FAILED
    calls = lose_next_multi(backend._wire.reader(), apply)
    record = store.requeue("j")
    assert len(calls) == (1 if apply else 2)
    assert (record.state, record.attempt, record.error) == (JobState.AVAILABLE, 1, "boom")
    assert synced(raw).exists(job_paths(backend, "j").failure).version == 2  # written once more
    assert markers(raw, backend, "q", "open") == ["j"]
    with pytest.raises(InvalidArgument):
        store.requeue("j")  # not FAILED any more
    again = a.claim_next("q")
    assert again is not None and again.attempt == 2
    assert again.fail("twice").state is JobState.FAILED  # a budget of one attempt again


def test_lost_answer_of_the_claim_that_dead_letters_is_read_back(
    store: LeaseStore, backend: ZooKeeperBackend, opened: Callable[..., Session],
    raw: KazooClient,
) -> None:
    store.enqueue("q", "j", max_attempts=1)
    a = opened("A")
    lease = a.claim_next("q")
    assert lease is not None
    lease.release()  # the only attempt ended without completion
    calls = lose_next_multi(handle(a).client, apply=True)
    with pytest.raises(JobFailed) as refused:
        a.claim("j")
    assert len(calls) == 1 and refused.value.attempt == 1
    assert refused.value.error == "attempts exhausted: attempt 1 ended without completion"
    assert synced(raw).exists(job_paths(backend, "j").failure).version == 1
    assert markers(raw, backend, "q", "open") == []

