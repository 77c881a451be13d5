"""etcd's native ``claim_next_many`` (the scan, then one transaction of nested claims)
and fused ``complete_and_claim_next`` (the claim nested in the completion's ``success``
branch): each is one transaction; a candidate taken meanwhile fails its own compare; a
refused completion claims nothing; lost answers are settled by reading back; a server
allowing fewer operations gets smaller batches.

The rules every backend shares are in the conformance suite (``test_claim_next_many_*``,
``test_fused_*``, run on etcd by ``test_etcd_conformance.py``). One local member.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from etcd_local import LocalEtcd, Sent, backend_of, local_members, lose_answers
from pyetcd import etcdrpc

from consensus_lease import EnqueueItem, JobState, LeaseStore, open_store
from consensus_lease.backends.etcd import _queues_claim, _queues_fused
from consensus_lease.backends.etcd._transport_txn_limit import TxnLimit
from consensus_lease.errors import StaleLeaseError
from consensus_lease.lease import Lease
from consensus_lease.session import Session
from consensus_lease.states import LeaseState

SMALL_TXN_OPS = 24
"""``--max-txn-ops`` of the small server: 18 nested claims per batch (each needs 6)."""


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=120)


@pytest.fixture
def url(etcd_server: LocalEtcd) -> str:
    return etcd_server.url_with_prefix(f"qc-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def store(url: str) -> Iterator[LeaseStore]:
    with open_store(url) as store:
        yield store


def _index_entries(store: LeaseStore, queue: str) -> list[bytes]:
    """The keys of the queue's FIFO index entries."""
    backend = backend_of(store)
    start = backend._layout.root + b"q/" + queue.encode().hex().encode() + b"/i/"
    answer = backend._transport.member().kv.Range(
        etcdrpc.RangeRequest(key=start, range_end=start[:-1] + b"0", keys_only=True),
        timeout=5)
    return [bytes(kv.key) for kv in answer.kvs]


def _state(store: LeaseStore, job_id: str) -> tuple[JobState, str | None, int]:
    record = store.get(job_id)
    assert record is not None
    return record.state, record.owner, record.generation


def test_a_batch_of_100_is_the_scan_and_one_transaction(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 jobs: the scan's reads and ONE write, every claim at its revision (one
    token); each lease completes and deletes its index entry (the claim read it)."""
    ids = [f"j-{i:03d}" for i in range(120)]
    assert all(store.enqueue_many("q", [(j, j.encode()) for j in ids]))
    with store.session("W", 30) as w:
        sent = Sent(store, monkeypatch)
        got = w.claim_next_many("q", 100)
        assert sent.writes == ["batch claim of 100 jobs"]
        assert sent.attempts.count("Txn") == 1 + 2 * 4  # 4 pages of 32 scanned
        assert [lease.job_id for lease in got] == ids[:100]  # oldest first
        assert len({lease.generation for lease in got}) == 1
        assert all(lease.payload == lease.job_id.encode() for lease in got)
        stats = store.queue_stats("q")
        assert (stats.available, stats.held) == (20, 100)
        out = w.complete_many(got)
        assert all(getattr(r, "state", None) is JobState.COMPLETED for r in out), out
    assert len(_index_entries(store, "q")) == 20  # the completed jobs' entries went
    stats = store.queue_stats("q")
    assert (stats.available, stats.held, stats.completed) == (20, 0, 100)


def test_candidates_lost_to_a_race_fail_their_compare_and_more_are_read(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another session takes two candidates between the scan and the batch: their
    nested claims fail, the rest commit; a second scan reads two more."""
    ids = [f"r-{i}" for i in range(8)]
    assert all(store.enqueue_many("race", ids))
    with store.session("W", 30) as w, store.session("B", 30) as b:
        scan = _queues_claim.candidates
        stolen: list[Lease] = []

        def scan_then_steal(ops: Any, queue: str, limit: int,
                            fill: bool = False) -> list[tuple[str, bytes]]:
            found = scan(ops, queue, limit, fill)
            if not stolen:
                stolen.extend(x for x in (b.claim(found[1][0]), b.claim(found[3][0])) if x)
            return found

        monkeypatch.setattr(_queues_claim, "candidates", scan_then_steal)
        sent = Sent(store, monkeypatch)
        got = w.claim_next_many("race", 5)
        assert [s for s in sent.writes if s.startswith("batch")] == [
            "batch claim of 5 jobs", "batch claim of 2 jobs"]
        assert len(got) == 5 and len(stolen) == 2
        assert {lease.job_id for lease in got}.isdisjoint(s.job_id for s in stolen)
        assert [lease.job_id for lease in got] == [
            j for j in ids if j not in {s.job_id for s in stolen}][:5]
        for lease in stolen:
            assert _state(store, lease.job_id) == (JobState.HELD, "B", lease.generation)


def test_jobs_with_attempt_limits_are_claimed_after_the_batch(store: LeaseStore) -> None:
    """A job with an attempt limit fails the batch's compare and is claimed on its own;
    one whose attempts are used up becomes FAILED and is not returned."""
    store.enqueue_many("lim", [EnqueueItem("spent", b"", 1), EnqueueItem("l-1", b"", 3),
                               "u-1", EnqueueItem("l-2", b"", 3), "u-2"])
    with store.session("A", 30) as a, store.session("W", 30) as w:
        spent = a.claim("spent")
        assert spent is not None
        spent.release()
        got = w.claim_next_many("lim", 10)
        assert [lease.job_id for lease in got] == ["l-1", "u-1", "l-2", "u-2"]
        assert all(lease.attempt == 1 for lease in got)
        assert _state(store, "spent")[0] is JobState.FAILED
        for lease in got:
            lease.complete(b"")
    stats = store.queue_stats("lim")
    assert (stats.available, stats.held, stats.completed, stats.failed) == (0, 0, 4, 1)


@pytest.fixture(scope="module")
def small_txn_server() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=125, extra_args=("--max-txn-ops", str(SMALL_TXN_OPS)))


def test_a_server_allowing_fewer_operations_gets_smaller_batches(
    small_txn_server: LocalEtcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = small_txn_server.url_with_prefix(f"small-{uuid.uuid4().hex[:8]}")
    with open_store(url) as store, store.session("W", 30) as w:
        store.enqueue_many("q", [f"s-{i:02d}" for i in range(30)])
        ops = backend_of(store)._ops
        monkeypatch.setattr(ops, "txn_limit", TxnLimit())  # forget what enqueue taught
        sent = Sent(store, monkeypatch)
        got = w.claim_next_many("q", 30)
        assert sorted(lease.job_id for lease in got) == [f"s-{i:02d}" for i in range(30)]
        assert ops.txn_limit.max_ops == SMALL_TXN_OPS
        batches = [int(s.split()[3]) for s in sent.writes if s.startswith("batch")]
        assert batches[-2:] == [18, 12]  # 18 nested claims of 6 operations: 24
        store.enqueue("q", "s-30")
        record, nxt = got[0].complete_and_claim_next(b"r")  # 8 + 6 operations: fits
        assert record.state is JobState.COMPLETED
        assert nxt is not None and nxt.job_id == "s-30"


# -- complete_and_claim_next ----------------------------------------------------------


def _draining(store: LeaseStore, w: Session, queue: str, count: int) -> Lease:
    """``count`` jobs enqueued; the first claimed by ``claim_next`` (its scan offers the
    others)."""
    store.enqueue_many(queue, [(f"{queue}-{i:02d}", b"p%d" % i) for i in range(count)])
    first = w.claim_next(queue)
    assert first is not None
    return first


def test_a_drain_loop_is_one_transaction_per_job(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the last scan's candidates last, each fused call is ONE request: the
    completion, and the next job's claim nested in it (same revision); the last one,
    with nothing left, is the scan and the completion alone."""
    with store.session("W", 30) as w:
        lease = _draining(store, w, "d", 10)
        sent = Sent(store, monkeypatch)
        seen = [lease.job_id]
        for _ in range(9):
            sent.clear()
            record, nxt = lease.complete_and_claim_next(b"r")
            assert nxt is not None and record.state is JobState.COMPLETED
            assert sent.attempts == ["Txn"]
            assert sent.writes == [f"completion of {lease.job_id!r} generation "
                                   f"{lease.generation} and claim of {nxt.job_id!r}"]
            done = store.get(lease.job_id)
            assert done is not None and nxt.generation > lease.generation
            assert (nxt.state, nxt.queue, nxt.payload) == (
                LeaseState.HELD, "d", b"p%d" % int(nxt.job_id[-2:]))
            seen.append(nxt.job_id)
            lease = nxt
        sent.clear()
        record, nxt = lease.complete_and_claim_next(b"r")
        assert nxt is None and record.state is JobState.COMPLETED
        assert sent.writes == [f"completion of {lease.job_id!r} generation {lease.generation}"]
    assert sorted(seen) == [f"d-{i:02d}" for i in range(10)]
    stats = store.queue_stats("d")
    assert (stats.available, stats.held, stats.completed) == (0, 0, 10)
    assert _index_entries(store, "d") == []


def test_a_stale_completion_is_refused_and_claims_nothing(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The completion's compares fail: the nested claim (inside its ``success``
    branch) never runs; one request, the candidate untouched."""
    with store.session("A", 30) as a, store.session("B", 30) as b:
        lease = _draining(store, a, "s", 3)
        store.backend.release(a.handle, lease.job_id, lease.claim_result)
        newer = b.claim(lease.job_id)
        assert newer is not None
        # Offer the others again (the release dropped this driver's offers).
        assert len(backend_of(store).queue_candidates("s", 32)) == 2
        sent = Sent(store, monkeypatch)
        with pytest.raises(StaleLeaseError):
            lease.complete_and_claim_next(b"late")
        others = sorted({"s-00", "s-01", "s-02"} - {lease.job_id})
        assert len(sent.writes) == 1
        assert sent.writes[0].endswith(tuple(f"and claim of {j!r}" for j in others))
        assert lease.state is LeaseState.LOST and a.leases() == []
        for job_id in others:
            record = store.get(job_id)
            assert record is not None
            assert (record.state, record.attempt) == (JobState.AVAILABLE, 0)
        assert _state(store, lease.job_id) == (JobState.HELD, "B", newer.generation)


def test_a_candidate_taken_meanwhile_lets_the_completion_commit_alone(
    store: LeaseStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offered candidate was taken by another process's session: its nested claim
    fails, the completion commits, and the next job is claimed as claim_next does (a
    fresh scan, then a lone claim)."""
    with (store.session("W", 30) as w, open_store(url) as elsewhere,
          elsewhere.session("B", 30) as b):
        lease = _draining(store, w, "t", 2)
        other = "t-01" if lease.job_id == "t-00" else "t-00"
        taken = b.claim(other)
        assert taken is not None
        store.enqueue("t", "t-02")
        sent = Sent(store, monkeypatch)
        record, nxt = lease.complete_and_claim_next(b"r")
        assert record.state is JobState.COMPLETED
        assert nxt is not None and nxt.job_id == "t-02"
        assert sent.writes == [
            f"completion of {lease.job_id!r} generation {lease.generation} and claim of "
            f"{other!r}", "claim of 't-02'"]
        assert _state(store, other) == (JobState.HELD, "B", taken.generation)


@pytest.mark.parametrize("applied", [True, False], ids=["landed", "not-landed"])
def test_a_lost_fused_answer_is_read_back(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    """Landed: the completion record and the candidate's owner key (this request's
    nonce) settle it, nothing is sent again. Not landed: the same transaction is sent
    again. Either way one completion and one claim."""
    with store.session("W", 30) as w:
        lease = _draining(store, w, "l", 3)
        dropped = lose_answers(store, monkeypatch, applied=applied)
        sent = Sent(store, monkeypatch)
        record, nxt = lease.complete_and_claim_next(b"r")
        assert len(dropped) == 1 and dropped[0].startswith("completion of")
        assert len(sent.writes) == (1 if applied else 2)
        assert record.state is JobState.COMPLETED and record.result == b"r"
        assert nxt is not None and nxt.state is LeaseState.HELD
        assert _state(store, nxt.job_id) == (JobState.HELD, "W", nxt.generation)
        nxt.renew()
        assert nxt.complete(b"ok").state is JobState.COMPLETED
        stats = store.queue_stats("l")
        assert (stats.available, stats.held, stats.completed) == (1, 0, 2)


def test_the_fused_capability_is_declared(store: LeaseStore) -> None:
    caps = store.capabilities
    assert caps.fused_claim_next is True
    assert caps.max_queue_claim_batch == _queues_claim.QUEUE_CLAIM_BATCH == 100
    assert _queues_fused.SCAN == 32


def test_a_candidate_with_an_attempt_limit_is_claimed_after_the_completion(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nested claim is the common one (no limit key): a limited candidate fails it,
    the completion commits, and the candidate is claimed on its own (its two
    transactions)."""
    store.enqueue_many("al", [EnqueueItem(f"al-{i}", b"", 2) for i in range(2)])
    with store.session("W", 30) as w:
        lease = w.claim_next("al")
        assert lease is not None
        other = "al-1" if lease.job_id == "al-0" else "al-0"
        sent = Sent(store, monkeypatch)
        record, nxt = lease.complete_and_claim_next(b"r")
        assert record.state is JobState.COMPLETED
        assert nxt is not None and (nxt.job_id, nxt.attempt) == (other, 1)
        assert sent.writes == [
            f"completion of {lease.job_id!r} generation {lease.generation} and claim of "
            f"{other!r}", f"claim of {other!r}", f"claim of {other!r}"]
        assert nxt.complete(b"").state is JobState.COMPLETED
