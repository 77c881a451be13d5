"""etcd's native ``complete_many``: a batch is one transaction holding a nested
transaction per item (each with its own compares), a stale item is refused alone, the
completed counter is sharded by the item's position in the batch and ``queue_stats``
sums the shards; lost answers, ``--max-txn-ops`` and large results split it.

The rules every backend shares are in the conformance suite (``test_complete_many_*``,
run on etcd by ``test_etcd_conformance.py``). One local member (exact revisions).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from etcd_local import LocalEtcd, Sent, backend_of, local_members, lose_answers
from pyetcd import etcdrpc

from consensus_lease import JobState, LeaseStore, open_store
from consensus_lease.backends.etcd._tokens_history import Mark
from consensus_lease.backends.etcd._transport_txn_limit import TxnLimit
from consensus_lease.errors import StaleLeaseError, StoreRegressed
from consensus_lease.lease import Lease
from consensus_lease.record import ClaimResult, LeaseRecord
from consensus_lease.session import Session

SMALL_TXN_OPS = 24
"""``--max-txn-ops`` of the small server: a batch of at most a few completions."""


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=90)


@pytest.fixture
def store(etcd_server: LocalEtcd) -> Iterator[LeaseStore]:
    with open_store(etcd_server.url_with_prefix(f"cm-{uuid.uuid4().hex[:12]}")) as store:
        yield store


def _keys(store: LeaseStore, under: bytes = b"") -> dict[bytes, Any]:
    """The key-values under the store's prefix (and ``under`` below it), by key below
    the prefix."""
    backend = backend_of(store)
    start = backend._layout.root + under
    answer = backend._transport.member().kv.Range(
        etcdrpc.RangeRequest(key=start, range_end=start[:-1] + bytes([start[-1] + 1])),
        timeout=5,
    )
    return {bytes(kv.key)[len(backend._layout.root):]: kv for kv in answer.kvs}


def _queued(store: LeaseStore, session: Session, queue: str, count: int) -> list[Lease]:
    """``count`` jobs enqueued in ``queue`` and claimed by ``session`` by name (the
    claims read each job's queue marker)."""
    ids = [f"{queue}-{i:03d}" for i in range(count)]
    store.enqueue_many(queue, ids)
    leases = [lease for lease in session.claim_many(ids) if lease is not None]
    assert len(leases) == count
    return leases


def _completed(out: list[LeaseRecord | Any]) -> list[str]:
    return [r.job_id for r in out if isinstance(r, LeaseRecord) and r.state is JobState.COMPLETED]


def test_a_batch_with_a_stale_item_is_one_transaction_and_the_others_commit(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with store.session("A", 30) as a, store.session("B", 30) as b:
        leases = _queued(store, a, "q", 6)
        stale = leases[2]
        store.backend.release(a.handle, stale.job_id, stale.claim_result)
        newer = b.claim(stale.job_id)
        assert newer is not None
        sent = Sent(store, monkeypatch)
        out = a.complete_many([(lease, b"r") for lease in leases])
        assert sent.writes == ["completion of 6 jobs"] and sent.attempts == ["Txn"]
        assert isinstance(out[2], StaleLeaseError)
        assert out[2].current_generation == newer.generation
        assert _completed(out) == [lease.job_id for lease in leases if lease is not stale]
        job_keys = _keys(store)
        completions = [job_keys[lease.job_id.encode().hex().encode() + b"/c"]
                       for lease in leases if lease is not stale]
        assert len({kv.mod_revision for kv in completions}) == 1  # one transaction
        stats = store.queue_stats("q")
        assert (stats.available, stats.held, stats.completed, stats.failed) == (0, 1, 5, 0)
        qdir = b"q/" + b"q".hex().encode() + b"/k/"
        shards = sorted(k for k in _keys(store, qdir) if k.startswith(qdir + b"done"))
        assert shards == [qdir + b"done"] + [qdir + b"done/%03d" % i for i in (1, 3, 4, 5)]
        newer.complete(b"")  # a lone completion bumps k/done
        stats = store.queue_stats("q")
        assert (stats.available, stats.held, stats.completed) == (0, 0, 6)
        assert backend_of(store).queue_candidates("q", 10) == []


def test_stats_count_batches_and_lone_completions_of_one_queue(store: LeaseStore) -> None:
    """Shards are bumped again by later batches, lone completions bump ``k/done``: the
    count is the sum of their versions, and purge takes the purged jobs off it."""
    with store.session("A", 30) as a:
        total = 0
        leases = _queued(store, a, "one", 20)
        for chunk in (leases[:8], leases[8:11], leases[11:12]):
            assert len(_completed(a.complete_many(chunk))) == len(chunk)
            total += len(chunk)
            assert store.queue_stats("one").completed == total
        for lease in leases[12:15]:
            lease.complete(b"")
        total += 3
        stats = store.queue_stats("one")
        assert (stats.available, stats.held, stats.completed) == (0, 5, total)
        assert len(_completed(a.complete_many(leases[15:]))) == 5
        assert store.queue_stats("one").completed == 20
        assert store.purge("one") == 20
        stats = store.queue_stats("one")
        assert (stats.available, stats.held, stats.completed) == (0, 0, 0)


@pytest.mark.parametrize("applied", [True, False], ids=["landed", "not-landed"])
def test_a_lost_answer_is_read_back_and_counted_once(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    """Landed: every item's completion record settles it, nothing is sent again. Not
    landed: the items are still held, the same transaction is sent again. Either way
    each job is completed once and counted once."""
    with store.session("A", 30) as a:
        leases = _queued(store, a, "q", 5)
        leases[1].fail("once", retry_in_s=0)  # a second attempt: its record tells the last error
        again = a.claim(leases[1].job_id)
        assert again is not None
        leases[1] = again
        dropped = lose_answers(store, monkeypatch, applied=applied)
        sent = Sent(store, monkeypatch)
        out = a.complete_many([(lease, b"r") for lease in leases])
        assert dropped == ["completion of 5 jobs"]
        assert len(sent.writes) == (1 if applied else 2)  # landed: read back, not re-sent
        assert _completed(out) == [lease.job_id for lease in leases]
        record = out[1]
        assert isinstance(record, LeaseRecord)
        assert (record.attempt, record.error, record.result) == (2, "once", b"r")
        stats = store.queue_stats("q")
        assert (stats.available, stats.held, stats.completed) == (0, 0, 5)
        again_out = store.backend.complete_many(
            a.handle, [(lease.job_id, lease.claim_result, b"r") for lease in leases])
        assert [r.job_id for r in again_out if isinstance(r, LeaseRecord)] == [
            lease.job_id for lease in leases]  # repeats: their records, nothing written
        assert store.queue_stats("q").completed == 5


def test_claims_without_their_handle_read_their_queues_in_one_transaction(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims rebuilt from their generations (as another process would have them): one
    read of every queue marker and owner key, then the batch transaction."""
    backend = backend_of(store)
    store.enqueue_many("q", ["a", "b", "c"])
    handle = backend.open_session("W", 30)
    try:
        claims = [backend.claim(handle, job_id) for job_id in ("a", "b", "c", "plain")]
        sent = Sent(store, monkeypatch)
        out = backend.complete_many(handle, [
            (job_id, ClaimResult(claim.generation), job_id.encode())
            for job_id, claim in zip(("a", "b", "c", "plain"), claims, strict=True)
            if claim is not None])
        assert sent.attempts == ["Txn", "Txn"]  # the queue markers, then the batch
        assert [(r.job_id, r.result) for r in out if isinstance(r, LeaseRecord)] == [
            ("a", b"a"), ("b", b"b"), ("c", b"c"), ("plain", b"plain")]
    finally:
        backend.close_session(handle)
    assert backend.queue_candidates("q", 10) == []
    stats = store.queue_stats("q")
    assert (stats.available, stats.held, stats.completed) == (0, 0, 3)


def test_large_results_split_the_batch_by_size(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Results of 300 KiB (400 KiB in base64): two per transaction under 1 MiB."""
    with store.session("A", 30) as a:
        leases = _queued(store, a, "big", 5)
        sent = Sent(store, monkeypatch)
        results = [bytes([i]) * (300 * 1024) for i in range(5)]
        out = a.complete_many(list(zip(leases, results, strict=True)))
        assert len(sent.writes) == 3  # 2 + 2 + 1 (the last alone)
        assert [r.result for r in out if isinstance(r, LeaseRecord)] == results
        assert store.queue_stats("big").completed == 5


@pytest.fixture(scope="module")
def small_txn_server() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=95, extra_args=("--max-txn-ops", str(SMALL_TXN_OPS)))


def test_a_server_allowing_fewer_operations_gets_smaller_batches(
    small_txn_server: LocalEtcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch is refused as too large for ``--max-txn-ops`` (nothing applied);
    the limit is learnt and the batch split into transactions that fit it."""
    url = small_txn_server.url_with_prefix(f"small-{uuid.uuid4().hex[:8]}")
    with open_store(url) as store, store.session("A", 30) as a:
        leases = _queued(store, a, "q", 30)  # the claims taught the driver the limit:
        ops = backend_of(store)._ops
        monkeypatch.setattr(ops, "txn_limit", TxnLimit())  # forget it
        sent = Sent(store, monkeypatch)
        out = a.complete_many(leases)
        assert _completed(out) == [lease.job_id for lease in leases]
        assert ops.txn_limit.max_ops == SMALL_TXN_OPS
        # 30 nested transactions refused; then 18 + 6 (the largest nested: 2 compares,
        # 6 writes) = 24 operations, and the other 12.
        assert sent.writes == [f"completion of {n} jobs" for n in (30, 18, 12)]
        stats = store.queue_stats("q")
        assert (stats.available, stats.held, stats.completed) == (0, 0, 30)


def test_a_history_gone_back_refuses_every_item_of_the_batch(store: LeaseStore) -> None:
    """The batch's answer comes from a history below one already seen (a restore): every
    item is ``StoreRegressed``, and so is the session afterwards."""
    a = store.session("A", 30)
    leases = _queued(store, a, "q", 3)
    guard = backend_of(store)._transport.guard
    guard._high += 10_000  # to it, the next answers come from a history gone back
    guard._mark = Mark(guard._era, guard._high)
    out = a.complete_many(leases)
    assert all(isinstance(r, StoreRegressed) for r in out), out
    again = store.backend.complete_many(
        a.handle, [(lease.job_id, lease.claim_result, b"") for lease in leases])
    assert all(isinstance(r, StoreRegressed) for r in again), again
