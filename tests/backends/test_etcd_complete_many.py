"""etcd's native ``complete_many``, ``release_many`` and ``fail_many``: a batch is one
transaction holding a nested transaction per item (each with its own compares), a stale
item is refused alone, the completed (failed) counter is sharded by the item's position
in the batch and ``queue_stats`` sums the shards; lost answers are settled by reading
back, ``--max-txn-ops`` and large results split it; ``fail_many``'s retry delays take a
lease per distinct TTL.

The rules every backend shares are in the conformance suite (``test_complete_many_*``,
``conformance_ending``, run on etcd by ``test_etcd_conformance.py``). One local member
(exact revisions).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from etcd_local import LocalEtcd, Sent, backend_of, local_members, lose_answers
from pyetcd import etcdrpc

from consensus_lease import EnqueueItem, JobState, LeaseStore, open_store
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


@pytest.fixture
def small_store(small_txn_server: LocalEtcd) -> Iterator[LeaseStore]:
    url = small_txn_server.url_with_prefix(f"small-{uuid.uuid4().hex[:8]}")
    with open_store(url) as store:
        yield store


def test_a_server_allowing_fewer_operations_gets_smaller_batches(
    small_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch is refused as too large for ``--max-txn-ops`` (nothing applied);
    the limit is learnt and the batch split into transactions that fit it."""
    store = small_store
    with store.session("A", 30) as a:
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


# -- release_many and fail_many: the same machinery (_jobs_batch) -------------------------


def _stale_one(store: LeaseStore, a: Session, b: Session, lease: Lease) -> int:
    """Make ``lease`` stale (released, claimed by ``b``); the newer generation."""
    store.backend.release(a.handle, lease.job_id, lease.claim_result)
    newer = b.claim(lease.job_id)
    assert newer is not None
    return newer.generation


def test_release_many_is_one_transaction_and_a_stale_item_is_refused_alone(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with store.session("A", 30) as a, store.session("B", 30) as b:
        leases = _queued(store, a, "q", 6)
        current = _stale_one(store, a, b, leases[2])
        sent = Sent(store, monkeypatch)
        out = a.release_many(leases)
        assert sent.writes == ["release of 6 jobs"] and sent.attempts == ["Txn"]
        assert isinstance(out[2], StaleLeaseError)
        assert out[2].current_generation == current
        assert [o for i, o in enumerate(out) if i != 2] == [None] * 5
        history = _keys(store)
        released = [history[lease.job_id.encode().hex().encode() + b"/h"]
                    for lease in leases if lease is not leases[2]]
        assert len({kv.mod_revision for kv in released}) == 1  # one transaction
        stats = store.queue_stats("q")
        assert (stats.available, stats.held, stats.completed) == (5, 1, 0)
        again = [b.claim(lease.job_id) for lease in leases if lease is not leases[2]]
        assert all(x is not None and x.generation > lease.generation
                   for x, lease in zip(again, [le for le in leases if le is not leases[2]],
                                       strict=True))


def test_fail_many_is_one_transaction_with_one_delay_lease_per_distinct_ttl(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAILED verdicts of one queue bump the failed counter's shards (etcd refuses one
    key put twice); the retry delays of 30 s (twice), 60 s and 45 s take three leases,
    and the one only the refused item would have used is revoked."""
    with store.session("A", 30) as a, store.session("B", 30) as b:
        store.enqueue_many("f", [EnqueueItem(f"f-{i}", b"", 1 if i < 3 else 3)
                                 for i in range(8)])
        leases = [x for x in a.claim_many([f"f-{i}" for i in range(8)]) if x is not None]
        assert len(leases) == 8
        current = _stale_one(store, a, b, leases[3])
        sent = Sent(store, monkeypatch)
        out = a.fail_many([(leases[0], "e0"), (leases[1], "e1"), (leases[2], "e2"),
                           (leases[3], "e3", 45.0), (leases[4], "e4", 30.0),
                           (leases[5], "e5", 29.5), (leases[6], "e6", 60.0),
                           (leases[7], "e7", 0.0)])
        assert sent.writes == ["failure of 8 jobs"]
        assert sorted(sent.attempts) == ["LeaseGrant"] * 3 + ["LeaseRevoke", "Txn"]
        assert isinstance(out[3], StaleLeaseError) and out[3].current_generation == current
        records = [r for r in out if isinstance(r, LeaseRecord)]
        assert [(r.job_id, r.state, r.error) for r in records] == [
            (f"f-{i}", JobState.FAILED if i < 3 else JobState.AVAILABLE, f"e{i}")
            for i in (0, 1, 2, 4, 5, 6, 7)]
        assert [r.not_before is None for r in records] == [True] * 3 + [False] * 3 + [True]
        backend = backend_of(store)
        delayed = [_keys(store)[f"f-{i}".encode().hex().encode() + b"/n"] for i in (4, 5, 6)]
        assert delayed[0].lease == delayed[1].lease != delayed[2].lease  # shared by TTL
        stats = store.queue_stats("f")
        assert (stats.available, stats.held, stats.failed) == (4, 1, 3)
        qdir = b"q/" + b"f".hex().encode() + b"/k/"
        counters = sorted(k for k in _keys(store, qdir) if k.startswith(qdir + b"failed"))
        assert counters == [qdir + b"failed", qdir + b"failed/001", qdir + b"failed/002"]
        assert b.claim("f-7") is not None  # no delay
        assert b.claim("f-4") is None  # its delay runs
        assert backend.get("f-0") is not None and backend.get("f-0").state is JobState.FAILED


@pytest.mark.parametrize("applied", [True, False], ids=["landed", "not-landed"])
def test_release_many_and_fail_many_settle_a_lost_answer_by_reading_back(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    """Landed: each item's release marker / error nonce settles it, nothing is sent
    again. Not landed: the items are still held, the same transaction is sent again."""
    with store.session("A", 30) as a:
        released, failed = _queued(store, a, "r", 4), _queued(store, a, "x", 4)
        for leases, call in ((released, lambda ls: a.release_many(ls)),
                             (failed, lambda ls: a.fail_many([(le, "boom", 0.0)
                                                              for le in ls]))):
            dropped = lose_answers(store, monkeypatch, applied=applied)
            sent = Sent(store, monkeypatch)
            out = call(leases)
            assert len(dropped) == 1 and dropped[0].endswith(" of 4 jobs")
            assert len(sent.writes) == (1 if applied else 2)  # landed: read back only
            assert all(o is None or isinstance(o, LeaseRecord) for o in out), out
            monkeypatch.undo()
        stats = store.queue_stats("r"), store.queue_stats("x")
        assert [(s.available, s.held) for s in stats] == [(4, 0), (4, 0)]
        records = [store.get(lease.job_id) for lease in failed]
        assert all(r is not None and r.error == "boom" for r in records)
        again = store.backend.release_many(
            a.handle, [(lease.job_id, lease.claim_result) for lease in released])
        assert all(isinstance(o, StaleLeaseError) for o in again)  # not a repeat


def test_release_many_and_fail_many_split_to_a_smaller_max_txn_ops(
    small_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each a chunk over the server's ``--max-txn-ops``, refused whole (nothing
    applied); the limit is learnt and the items sent in transactions that fit it."""
    store = small_store
    with store.session("A", 30) as a:
        released, failed = _queued(store, a, "r", 30), _queued(store, a, "x", 30)
        ops = backend_of(store)._ops
        monkeypatch.setattr(ops, "txn_limit", TxnLimit())  # forget what the claims taught
        sent = Sent(store, monkeypatch)
        assert a.release_many(released) == [None] * 30
        # 30 refused; then 21 + 3 (a nested release: 2 compares, 3 writes) = 24, and 9.
        assert sent.writes == [f"release of {n} jobs" for n in (30, 21, 9)]
        assert ops.txn_limit.max_ops == SMALL_TXN_OPS
        sent.clear()
        out = a.fail_many([(lease, "no", 0.0) for lease in failed])
        assert all(isinstance(r, LeaseRecord) for r in out)
        assert sent.writes == [f"failure of {n} jobs" for n in (20, 10)]  # 20 + 4 writes
        stats = store.queue_stats("r"), store.queue_stats("x")
        assert [(s.available, s.held) for s in stats] == [(30, 0), (30, 0)]
