"""The worker's fused completion (``WorkerConfig.fused_claim``): each job is completed with
``lease.complete_and_claim_next`` and the lease it returns is the slot's next job.

Store operations are counted by wrapping the backend's methods on the slot threads (the
keepalive thread and the waiting claim's poller are left out: they run on timers, not
per job)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_kit import taking_over_the_first

from consensus_lease import JobState, Lease, LeaseStore, OutcomeUnknown, open_store
from consensus_lease.worker import run_worker

FAST = {"claim_wait_s": 0.05, "ttl_s": 5.0}

OPERATIONS = (
    "open_session", "close_session", "claim", "claim_many", "claim_from_queue",
    "queue_candidates", "complete", "complete_many", "complete_and_claim_next", "release",
    "fail", "queue_stats",
)
"""The backend calls a slot makes itself, each one store round trip (a transaction on
SQLite); keepalives and the waiting claim's poller are not among them."""


@pytest.fixture
def memory() -> Iterator[LeaseStore]:
    with open_store("memory://") as opened:
        yield opened


def _enqueue(store: LeaseStore, n: int) -> list[str]:
    jobs = [f"job-{i}" for i in range(n)]
    store.enqueue_many("q", jobs)
    return jobs


def _states(store: LeaseStore, jobs: list[str]) -> dict[str, int]:
    """How many of ``jobs`` are in each state (the memory store's claim_next picks among
    the oldest few at random: which job a slot works first is not fixed)."""
    records = [store.get(j) for j in jobs]
    return dict(Counter(r.state.value for r in records if r is not None))


def _count_slot_calls(monkeypatch: pytest.MonkeyPatch, store: LeaseStore) -> Counter[str]:
    """Count the backend's :data:`OPERATIONS` called from worker slot threads."""
    calls: Counter[str] = Counter()
    backend = store.backend
    for name in OPERATIONS:
        original = getattr(backend, name)

        def counted(*args: Any, _name: str = name, _original: Any = original,
                    **kwargs: Any) -> Any:
            if threading.current_thread().name.startswith("consensus-lease-worker-"):
                calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(backend, name, counted)
    return calls


def _wrap(monkeypatch: pytest.MonkeyPatch, store: LeaseStore, name: str,
          make: Callable[[Any], Any]) -> None:
    monkeypatch.setattr(store.backend, name, make(getattr(store.backend, name)))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "knob-off"])
def test_one_store_round_trip_per_job_on_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fused: bool
) -> None:
    """A steady queue of n jobs: n completions and a few calls around them when fused
    (the first claim, the last waiting one, the drained check); with the knob off the old
    sequence, ``claim_next`` (SQLite's ``claim_from_queue``: a read of the head, then the
    claim statement) and ``complete`` per job."""
    n = 100
    with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        jobs = _enqueue(store, n)
        calls = _count_slot_calls(monkeypatch, store)
        stats = run_worker(store, "q", lambda lease, payload: b"done", until_empty=True,
                           fused_claim=fused, **FAST)
        assert all(store.get(j).state is JobState.COMPLETED for j in jobs)  # type: ignore[union-attr]
    assert stats.completed == stats.claimed == n and stats.stopped_by == "drained"
    total = sum(calls.values())
    if fused:
        assert stats.fused_claims == n - 1
        assert calls["complete_and_claim_next"] == n and calls["complete"] == 0
        # the first job only; the other calls found the queue empty
        assert calls["claim"] == 0 and 1 <= calls["claim_from_queue"] <= 8, calls
        assert total <= n + 8, calls  # per job: one round trip
    else:
        assert stats.fused_claims == 0 and calls["complete_and_claim_next"] == 0
        assert calls["complete"] == n and calls["claim_from_queue"] >= n, calls
        assert total >= 2 * n, calls  # claim_from_queue (2 statements) + complete


def test_a_stale_fused_completion_claims_nothing_and_the_slot_goes_on(
    memory: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _enqueue(memory, 4)
    other = memory.session("other")
    handler, taken = taking_over_the_first(memory, other)  # the first job is stale
    held_after_refusal: list[int] = []

    def refused(original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except Exception:
                held_after_refusal.append(memory.queue_stats("q").held)
                taken[0].complete(b"other")  # so that the queue can drain
                raise
        return call

    _wrap(monkeypatch, memory, "complete_and_claim_next", refused)
    stats = run_worker(memory, "q", handler, until_empty=True, **FAST)
    other.close()
    assert held_after_refusal == [1]  # the other session's hold only: nothing claimed
    assert stats.leases_lost == 1 and stats.completed == 3 and stats.errors == 0
    assert stats.fused_claims == 2  # job-1 by claim_next, then job-2 and job-3 fused
    results = Counter(r.result for r in (memory.get(j) for j in jobs) if r is not None)
    assert results == {b"other": 1, b"worker": 3}
    first = memory.get(taken[0].job_id)
    assert first is not None and first.result == b"other"


def test_a_next_lease_got_as_the_stop_came_is_released(
    memory: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _enqueue(memory, 3)
    stop = threading.Event()

    def stop_after(original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            answer = original(*args, **kwargs)
            stop.set()  # the stop arrives while the fused call is in flight
            return answer
        return call

    _wrap(monkeypatch, memory, "complete_and_claim_next", stop_after)
    stats = run_worker(memory, "q", lambda lease, payload: b"done", stop_event=stop, **FAST)
    # the lease the fused call claimed is worked, not released: a release would use up an
    # attempt of a job that never ran
    assert stats.stopped_by == "stop_event" and stats.completed == 2
    assert stats.claimed == 2 and stats.fused_claims == 1 and stats.released == 0
    assert memory.queue_stats("q").held == 0
    assert _states(memory, jobs) == {"completed": 2, "available": 1}


def test_a_stopping_slot_completes_without_claiming(
    memory: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _enqueue(memory, 3)
    stop = threading.Event()
    calls = _count_slot_calls(monkeypatch, memory)

    def handler(lease: Lease, payload: bytes) -> bytes:
        stop.set()  # the stop came while the job ran
        return b"done"

    stats = run_worker(memory, "q", handler, stop_event=stop, **FAST)
    assert stats.completed == stats.claimed == 1 and stats.released == 0
    assert calls["complete"] == 1 and calls["complete_and_claim_next"] == 0
    assert _states(memory, jobs) == {"completed": 1, "available": 2}


def test_outcome_unknown_of_the_fused_call_hands_back_what_it_may_have_claimed(
    memory: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store applied the call (completed one job, claimed the next for the session)
    but the answer was lost: the slot closes its session, so that next job is claimable
    again at once rather than held, unseen, until the worker stops (the queue would never
    drain)."""
    jobs = _enqueue(memory, 3)
    stop = threading.Event()
    watchdog = threading.Timer(20, stop.set)  # a regression would never drain: end it
    failed: list[str] = []

    def lose_first_answer(original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            answer = original(*args, **kwargs)
            if not failed:
                failed.append(answer[1][0])
                raise OutcomeUnknown("the answer was lost")
            return answer
        return call

    _wrap(monkeypatch, memory, "complete_and_claim_next", lose_first_answer)
    watchdog.start()
    try:
        stats = run_worker(memory, "q", lambda lease, payload: b"done", until_empty=True,
                           stop_event=stop, **FAST)
    finally:
        watchdog.cancel()
    assert len(failed) == 1
    assert stats.stopped_by == "drained" and stats.leases_lost == 1
    assert stats.completed == 2 and stats.errors == 0
    assert all(memory.get(j).state is JobState.COMPLETED for j in jobs)  # type: ignore[union-attr]
