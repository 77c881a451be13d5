"""ZooKeeper's batch queue claim (``claim_next_many``: one claim multi for the batch) and
fused completion (``complete_and_claim_next``: the completion and the next claim in one
multi), including what happens when another session takes a candidate between the read
and the multi, a stale completion, and a lost answer (see ``_queues_claim``)."""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from zk_local import lose_answer, multi_op_types, store, zk_target, zk_url  # noqa: F401

from consensus_lease import LeaseStore
from consensus_lease.errors import StaleLeaseError
from consensus_lease.record import ClaimResult, JobState
from consensus_lease.states import LeaseState

pytestmark = pytest.mark.containers


class _Multis:
    """Records the ``what`` of every multi a worker session sends (``Wire.commit``), and
    runs ``before`` (once, not counted) ahead of the first multi whose ``what`` is
    ``on``: another session's claim between the read and the multi."""

    def __init__(self, store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[str] = []
        self.on: str | None = None
        self.before: Callable[[], None] | None = None
        wire = store.backend._wire  # type: ignore[attr-defined]
        inner = wire.commit
        self._busy = False

        def commit(h: Any, build: Any, settle: Any, what: str, *rest: Any) -> Any:
            if self._busy:
                return inner(h, build, settle, what, *rest)
            if what == self.on and self.before is not None:
                before, self.before = self.before, None
                self._busy = True
                try:
                    before()
                finally:
                    self._busy = False
            self.sent.append(what)
            return inner(h, build, settle, what, *rest)

        monkeypatch.setattr(wire, "commit", commit)


@pytest.fixture
def multis(store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Multis]:
    yield _Multis(store, monkeypatch)


def _held_by(store: LeaseStore, job_id: str) -> str | None:
    record = store.get(job_id)
    assert record is not None
    return record.owner if record.state is JobState.HELD else None


def test_batch_claim_is_one_multi(store: LeaseStore, multis: _Multis) -> None:
    ids = [f"j{i:02d}" for i in range(20)]
    assert all(store.enqueue_many("q", [(j, j.encode()) for j in ids]))
    a = store.session("A", 30.0)
    got = a.claim_next_many("q", 20)
    assert [lease.job_id for lease in got] == ids  # oldest first
    assert multis.sent == ["claim"]  # the whole batch in one multi
    assert all(lease.payload == lease.job_id.encode() for lease in got)
    assert [lease.generation for lease in got] == [1] * 20
    assert all(_held_by(store, j) == "A" for j in ids)
    multis.sent.clear()
    assert a.claim_next_many("q", 5) == [] and multis.sent == []
    a.close()


def test_batch_claim_with_a_candidate_taken_meanwhile(
    store: LeaseStore, multis: _Multis
) -> None:
    """B claims one of A's candidates after A read them and before A's multi: that
    multi applies nothing; the taken job is dropped, the rest claimed, and the batch
    filled from the queue; nothing is held twice."""
    ids = [f"j{i:02d}" for i in range(10)]
    store.enqueue_many("q", ids)
    a, b = store.session("A", 30.0), store.session("B", 30.0)
    taken: list[str] = []

    def b_takes() -> None:
        lease = b.claim("j02")
        assert lease is not None
        taken.append(lease.job_id)

    multis.on, multis.before = "claim", b_takes
    got = a.claim_next_many("q", 5)
    assert taken == ["j02"]
    mine = [lease.job_id for lease in got]
    assert len(mine) == 5 and len(set(mine)) == 5 and "j02" not in mine
    assert mine[:4] == ["j00", "j01", "j03", "j04"]
    assert multis.sent[0] == "claim" and len(multis.sent) <= 4  # the failed one, then again
    assert all(_held_by(store, j) == "A" for j in mine)
    assert _held_by(store, "j02") == "B"
    stats = store.queue_stats("q")
    assert (stats.held, stats.available) == (6, 4)
    for lease in got:
        lease.complete(b"ok")
    a.close()
    b.close()


def test_fused_completion_is_one_multi_per_job(store: LeaseStore, multis: _Multis) -> None:
    """A drain loop: each complete_and_claim_next is one multi, completion and claim."""
    ids = [f"j{i}" for i in range(6)]
    store.enqueue_many("q", [(j, j.encode()) for j in ids])
    a = store.session("A", 30.0)
    lease = a.claim_next("q")
    assert lease is not None
    done = [lease.job_id]
    multis.sent.clear()
    while True:
        record, nxt = lease.complete_and_claim_next(b"r")
        assert record.state is JobState.COMPLETED and lease.state is LeaseState.COMPLETED
        if nxt is None:
            break
        assert nxt.state is LeaseState.HELD and nxt.payload == nxt.job_id.encode()
        assert _held_by(store, nxt.job_id) == "A"
        done.append(nxt.job_id)
        lease = nxt
    assert sorted(done) == ids
    # one multi per job claimed on the way; the last completion (nothing left) is alone
    assert multis.sent == ["complete_and_claim_next"] * 5 + ["complete"]
    stats = store.queue_stats("q")
    assert (stats.completed, stats.held, stats.available) == (6, 0, 0)
    a.close()


def test_fused_stale_completion_claims_nothing(store: LeaseStore, multis: _Multis) -> None:
    """The lease's hold still looks current (released behind its back by a claim
    without its hold, then claimed by B): the fused multi fails on the completion's
    operations; the completion is refused and nothing is claimed."""
    store.enqueue_many("q", ["s1", "s2", "s3"])
    a, b = store.session("A", 30.0), store.session("B", 30.0)
    lease = a.claim("s1")
    assert lease is not None
    store.backend.release(a.handle, "s1", ClaimResult(lease.generation))
    newer = b.claim("s1")
    assert newer is not None
    multis.sent.clear()
    with pytest.raises(StaleLeaseError):
        lease.complete_and_claim_next(b"late", queue="q")
    assert lease.state is LeaseState.LOST and a.leases() == []
    assert multis.sent == ["complete_and_claim_next"]  # read, refused: nothing more sent
    assert _held_by(store, "s1") == "B"
    for job in ("s2", "s3"):
        record = store.get(job)
        assert record is not None and record.state is JobState.AVAILABLE
        assert record.attempt == 0
    a.close()
    b.close()


def test_fused_with_the_candidate_taken_still_commits(
    store: LeaseStore, multis: _Multis
) -> None:
    """B takes every job read ahead between A's read and A's multi: the multi applies
    nothing, the completion is sent alone and commits, and the next job is claimed from
    a fresh look at the queue (here one enqueued meanwhile)."""
    store.enqueue_many("q", ["j1", "j2", "j3"])
    a, b = store.session("A", 30.0), store.session("B", 30.0)
    lease = a.claim_next("q")
    assert lease is not None
    others = sorted({"j1", "j2", "j3"} - {lease.job_id})

    def b_takes() -> None:
        assert all(b.claim_many(others))
        store.enqueue("q", "j4", b"p4")

    multis.on, multis.before = "complete_and_claim_next", b_takes
    multis.sent.clear()
    record, nxt = lease.complete_and_claim_next(b"r")
    assert record.state is JobState.COMPLETED and record.result == b"r"
    assert nxt is not None and (nxt.job_id, nxt.payload) == ("j4", b"p4")
    assert multis.sent == ["complete_and_claim_next", "complete", "claim"]
    done = store.get(lease.job_id)
    assert done is not None and done.state is JobState.COMPLETED and done.result == b"r"
    assert all(_held_by(store, j) == "B" for j in others)
    assert _held_by(store, "j4") == "A"
    # and with nothing else claimable the completion still commits
    multis.on, multis.before = "complete_and_claim_next", None
    record, none = nxt.complete_and_claim_next(b"r4")
    assert none is None and record.state is JobState.COMPLETED
    a.close()
    b.close()


@pytest.mark.parametrize("applied", [True, False])
def test_fused_lost_answer_is_read_back(store: LeaseStore, applied: bool) -> None:
    """The fused multi's answer is lost (connection loss), applied or not: reading back
    (the completion record's nonce) settles it, never a blind re-send; applied, the job
    claimed with it is returned; not applied, the completion is sent (once) and the
    next job claimed then."""
    store.enqueue_many("q", ["j1", "j2"])
    a = store.session("A", 30.0)
    lease = a.claim_next("q")
    assert lease is not None
    other = "j2" if lease.job_id == "j1" else "j1"
    client = store.backend._handle(a.handle).client  # type: ignore[attr-defined]
    lost = lose_answer(client, applied,
                       counts=lambda request: len(multi_op_types(request)) > 1)
    record, nxt = lease.complete_and_claim_next(b"r")
    assert record.state is JobState.COMPLETED
    assert nxt is not None and nxt.job_id == other and _held_by(store, other) == "A"
    assert len(lost) == (1 if applied else 3)  # lost; (not applied: complete, claim)
    assert nxt.generation == 1 and nxt.attempt == 1
    nxt.complete(b"r2")
    stats = store.queue_stats("q")
    assert (stats.completed, stats.held) == (2, 0)
    a.close()


def test_batch_claim_reads_failed_jobs_in_full(store: LeaseStore) -> None:
    """A candidate that failed before (its failure znode: the job znode has two
    children) is read in full, not from the lean read: its attempt budget counts, and
    its last error stays; one whose budget is used up becomes FAILED."""
    from consensus_lease import EnqueueItem

    store.enqueue_many("q", [EnqueueItem("f2", b"", 2), EnqueueItem("f1", b"", 1), "plain"])
    a = store.session("A", 30.0)
    for job in ("f2", "f1"):
        lease = a.claim(job)
        assert lease is not None
        lease.fail(f"boom {job}", retry_in_s=0)
    got = {lease.job_id: lease for lease in a.claim_next_many("q", 3)}
    assert sorted(got) == ["f2", "plain"]
    assert (got["f2"].attempt, got["f2"].generation) == (2, 2)
    assert got["plain"].attempt == 1
    record = store.get("f2")
    assert record is not None and record.state is JobState.HELD and record.error == "boom f2"
    failed = store.get("f1")
    assert failed is not None and failed.state is JobState.FAILED
    a.close()


def test_fused_after_an_epoch_bump_claims_in_the_new_epoch(
    store: LeaseStore, multis: _Multis
) -> None:
    """The store epoch is bumped between the read ahead and the fused multi: the multi
    fails on the epoch znode's check (the claim's part), the completion is sent alone
    and commits, and the next job is claimed with a token of the new epoch."""
    store.enqueue_many("q", ["j1", "j2", "j3"])
    a = store.session("A", 30.0)
    lease = a.claim_next("q")
    assert lease is not None and lease.generation == 1
    bumped: list[int] = []
    multis.on = "complete_and_claim_next"
    multis.before = lambda: bumped.append(store.backend.bump_epoch())  # type: ignore[attr-defined]
    multis.sent.clear()
    record, nxt = lease.complete_and_claim_next(b"r")
    assert bumped == [1]
    assert record.state is JobState.COMPLETED and record.generation == 1
    assert nxt is not None and nxt.generation == 2**32 + 1
    assert multis.sent == ["complete_and_claim_next", "complete", "claim"]
    a.close()


def test_fused_with_a_large_result_completes_alone_then_claims(
    store: LeaseStore, multis: _Multis
) -> None:
    """A result over FUSED_RESULT_BYTES is not fused (with the claim beside it the
    multi could pass jute.maxbuffer): the completion alone, then the claim."""
    from consensus_lease.backends.zookeeper._queues_claim import FUSED_RESULT_BYTES

    store.enqueue_many("q", ["j1", "j2"])
    a = store.session("A", 30.0)
    lease = a.claim_next("q")
    assert lease is not None
    big = b"x" * (FUSED_RESULT_BYTES + 1)
    multis.sent.clear()
    record, nxt = lease.complete_and_claim_next(big)
    assert record.state is JobState.COMPLETED
    done = store.get(lease.job_id)
    assert done is not None and done.result == big
    assert nxt is not None and nxt.job_id == ({"j1", "j2"} - {lease.job_id}).pop()
    assert multis.sent == ["complete", "claim"]
    a.close()


def _spent(store: LeaseStore, queue: str, count: int) -> list[str]:
    """``count`` jobs of ``queue`` whose one attempt was used up (released), then a fresh
    one, ``f"{queue}-fresh"``."""
    from consensus_lease import EnqueueItem

    ids = [f"{queue}-spent-{i:02d}" for i in range(count)]
    assert all(store.enqueue_many(queue, [EnqueueItem(j, b"", 1) for j in ids]))
    setup = store.session("S", 30.0)
    for job_id in ids:
        lease = setup.claim(job_id)
        assert lease is not None
        lease.release()
    setup.close()
    assert store.enqueue(queue, f"{queue}-fresh", b"p")
    return ids


def test_batch_claim_walks_past_exhausted_jobs(store: LeaseStore, multis: _Multis) -> None:
    """More exhausted jobs at the head than the batch claim's listings (``PASSES``): a
    batch of one still claims the fresh job behind them, each exhausted one made FAILED
    by one multi of its own, and the fresh one claimed by one claim multi."""
    from consensus_lease.backends.zookeeper._queues_claim import PASSES

    spent = _spent(store, "walk", 3 * PASSES)
    w = store.session("W", 30.0)
    multis.sent.clear()
    got = w.claim_next_many("walk", 1)
    assert [(lease.job_id, lease.payload) for lease in got] == [("walk-fresh", b"p")]
    assert multis.sent == ["claim"] * (len(spent) + 1)  # one FAILED multi each, the claim
    stats = store.queue_stats("walk")
    assert (stats.available, stats.held, stats.failed) == (0, 1, len(spent))
    w.close()


def test_batch_claim_past_an_exhausted_job_whose_failed_write_is_refused(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exhausted job whose FAILED transition the 32-bit version guard refuses
    (``TokenSpaceExhausted``, nothing sent) is that job's answer alone: the batch goes on
    and claims the job behind it; a claim by name still raises it."""
    from consensus_lease.backends.zookeeper import _jobs_lifecycle
    from consensus_lease.errors import TokenSpaceExhausted

    spent = _spent(store, "wrap", 1)
    inner = _jobs_lifecycle.Lifecycle.exhaust

    def exhaust(self: Any, h: Any, job: Any) -> Any:
        if job.paths.job_id == spent[0]:
            raise TokenSpaceExhausted("version out of range", path=job.paths.job, version=-1)
        return inner(self, h, job)

    monkeypatch.setattr(_jobs_lifecycle.Lifecycle, "exhaust", exhaust)
    w = store.session("W", 30.0)
    got = w.claim_next_many("wrap", 1)
    assert [lease.job_id for lease in got] == ["wrap-fresh"]
    with pytest.raises(TokenSpaceExhausted):
        w.claim(spent[0])
    record = store.get(spent[0])
    assert record is not None and record.state is not JobState.FAILED
    w.close()
