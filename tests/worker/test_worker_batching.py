"""The worker's prefetch and batched completion (``WorkerConfig.prefetch``,
``complete_batch``, ``complete_flush_s``; :mod:`consensus_lease.worker.feeder`).

No test sleeps to synchronise: handlers poll for what they wait for, with a deadline."""

from __future__ import annotations

import argparse
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_kit import taking_over_the_first, wait_for

from consensus_lease import (
    BackendUnavailable,
    InvalidArgument,
    JobState,
    Lease,
    LeaseLost,
    LeaseState,
    LeaseStore,
    OutcomeUnknown,
    open_store,
)
from consensus_lease.testing import FakeClock
from consensus_lease.testing.postgresql import fresh_schema, postgres_url
from consensus_lease.worker import WorkerConfig, run_worker
from consensus_lease.worker.command import add_parser, settings, worker_arguments
from consensus_lease.worker.config import from_environment

FAST = {"claim_wait_s": 0.05, "ttl_s": 5.0}


@pytest.fixture
def memory() -> Iterator[LeaseStore]:
    with open_store("memory://") as opened:
        yield opened


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LeaseStore]:
    if request.param != "postgresql":
        url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 's.db'}"
        with open_store(url) as opened:
            yield opened
        return
    base = postgres_url()  # skips without a server (fails under CI=true)
    with fresh_schema(base) as schema, open_store(f"{base}?schema={schema}") as opened:
        yield opened


def _enqueue(store: LeaseStore, n: int) -> list[str]:
    jobs = [f"job-{i}" for i in range(n)]
    store.enqueue_many("q", jobs)
    return jobs


def _states(store: LeaseStore, jobs: list[str]) -> dict[str, int]:
    records = [store.get(j) for j in jobs]
    return dict(Counter(r.state.value for r in records if r is not None))


def _batch_sizes(monkeypatch: pytest.MonkeyPatch, store: LeaseStore,
                 after: Callable[[], None] | None = None) -> list[int]:
    """The item count of each ``complete_many`` the store receives."""
    sizes: list[int] = []
    original = store.backend.complete_many

    def counted(session: Any, items: Any) -> Any:
        sizes.append(len(items))
        try:
            return original(session, items)
        finally:
            if after is not None:
                after()

    monkeypatch.setattr(store.backend, "complete_many", counted)
    return sizes


# -- the knobs -------------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [
    ("prefetch", -1), ("prefetch", 257), ("prefetch", True), ("prefetch", 1.5),
    ("complete_batch", 0), ("complete_batch", 10_001), ("complete_batch", "2"),
    ("complete_flush_s", -0.1), ("complete_flush_s", 61), ("complete_flush_s", math.nan),
    ("complete_flush_s", "0.1"),
])
def test_each_knob_is_checked_and_named(field: str, value: object) -> None:
    with pytest.raises(InvalidArgument, match=field):
        WorkerConfig(queue="q", **{field: value})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=field):
        run_worker("memory://", "q", lambda lease, payload: b"", **{field: value})


def test_the_defaults_start_no_feeder(memory: LeaseStore) -> None:
    config = WorkerConfig(queue="q")
    assert (config.prefetch, config.complete_batch, config.complete_flush_s) == (0, 1, 0.01)
    assert not config.pipelined
    _enqueue(memory, 3)
    threads: list[str] = []

    def handler(lease: Lease, payload: bytes) -> bytes:
        threads.extend(t.name for t in threading.enumerate())
        return b"ok"

    stats = run_worker(memory, "q", handler, until_empty=True, **FAST)
    assert stats.completed == 3 and stats.fused_claims == 2
    assert stats.complete_batches == stats.prefetched == 0
    assert not [name for name in threads if "feeder" in name]


@pytest.mark.parametrize(("argv", "environ", "expected"), [
    ([], {}, (0, 1, 0.01)),
    (["--prefetch", "3", "--complete-batch", "50", "--complete-flush-s", "0.2"], {},
     (3, 50, 0.2)),
    ([], {"CONSENSUS_LEASE_PREFETCH": "0", "CONSENSUS_LEASE_COMPLETE_BATCH": "8",
          "CONSENSUS_LEASE_COMPLETE_FLUSH_S": "0"}, (0, 8, 0.0)),
    (["--complete-batch", "2"], {"CONSENSUS_LEASE_COMPLETE_BATCH": "9"}, (0, 2, 0.01)),
])
def test_flags_and_variables(argv: list[str], environ: dict[str, str],
                             expected: tuple[int, int, float]) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["worker", "--backend", "memory://", "--queue", "q", *argv,
                              "m:f"])
    arguments = worker_arguments(settings(args, environ))
    assert (arguments["prefetch"], arguments["complete_batch"],
            arguments["complete_flush_s"]) == expected
    WorkerConfig(**{k: v for k, v in arguments.items() if k not in ("store", "handler")})


@pytest.mark.parametrize("argv", [
    ["--prefetch", "-1"], ["--prefetch", "257"], ["--complete-batch", "0"],
    ["--complete-batch", "10001"], ["--complete-flush-s", "soon"],
    ["--complete-flush-s", "61"], ["--prefetch", "1_0"], ["--complete-batch", "\u0663"],
])
def test_bad_flags_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["worker", *argv, "m:f"])
    assert exited.value.code == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize(("variable", "value"), [
    ("CONSENSUS_LEASE_PREFETCH", "-2"), ("CONSENSUS_LEASE_PREFETCH", "1000"),
    ("CONSENSUS_LEASE_COMPLETE_BATCH", "0"), ("CONSENSUS_LEASE_COMPLETE_FLUSH_S", "nan"),
    ("CONSENSUS_LEASE_COMPLETE_FLUSH_S", "120"), ("CONSENSUS_LEASE_PREFETCH", "1_0"),
])
def test_bad_variables_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(InvalidArgument, match=variable):
        from_environment({variable: value})


# -- batched completion ----------------------------------------------------------------

@pytest.mark.parametrize("prefetch", [0, 2])
def test_every_job_is_done_once_in_batches(any_store: LeaseStore,
                                           monkeypatch: pytest.MonkeyPatch,
                                           prefetch: int) -> None:
    n = 200
    jobs = _enqueue(any_store, n)
    sizes = _batch_sizes(monkeypatch, any_store)
    worked: Counter[str] = Counter()

    def handler(lease: Lease, payload: bytes) -> bytes:
        worked[lease.job_id] += 1
        return lease.job_id.encode()

    stats = run_worker(any_store, "q", handler, until_empty=True, complete_batch=32,
                       complete_flush_s=1.0, prefetch=prefetch, concurrency=2, **FAST)
    assert stats.errors == stats.leases_lost == 0 and stats.stopped_by == "drained"
    assert worked == Counter(jobs)  # each once
    for job in jobs:
        record = any_store.get(job)
        assert record is not None and record.state is JobState.COMPLETED
        assert record.result == job.encode()
    assert stats.completed == stats.claimed == stats.batched_completions == n
    assert sum(sizes) == n and stats.complete_batches == len(sizes)
    assert max(sizes) > 1 and len(sizes) <= n // 4, sizes  # batches, not one per job
    assert stats.fused_claims == 0
    if prefetch:
        assert stats.prefetched > 0 and stats.prefetch_dropped == 0


def test_a_stale_item_is_refused_while_the_others_commit(
    memory: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _enqueue(memory, 4)
    other = memory.session("other")
    handler, taken = taking_over_the_first(memory, other)  # the first job is stale

    def then_the_other_completes() -> None:
        if taken[0].state is LeaseState.HELD:
            taken[0].complete(b"other")  # so that the queue can drain

    sizes = _batch_sizes(monkeypatch, memory, then_the_other_completes)
    stats = run_worker(memory, "q", handler, until_empty=True, complete_batch=4,
                       complete_flush_s=5.0, **FAST)
    other.close()
    assert sizes == [4]
    assert stats.complete_batches == 1 and stats.batched_completions == 4
    assert stats.leases_lost == 1 and stats.completed == 3 and stats.errors == 0
    results = Counter(r.result for r in (memory.get(j) for j in jobs) if r is not None)
    assert results == {b"other": 1, b"worker": 3}


def test_an_unknown_outcome_is_counted_lost_and_logged_as_unknown(
    memory: LeaseStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store recorded a completion but its answer was lost (``OutcomeUnknown``): the
    runner counts it in ``leases_lost`` (never ``completed``) and says the outcome is
    unknown, not that the job was not completed (it was)."""
    jobs = _enqueue(memory, 4)
    original = memory.backend.complete_many
    unknown: list[str] = []

    def first_answer_lost(session: Any, items: Any) -> Any:
        answers = original(session, items)
        if not unknown:
            unknown.append(items[0][0])
            answers[0] = OutcomeUnknown("the answer was lost (test)", job_id=items[0][0])
        return answers

    monkeypatch.setattr(memory.backend, "complete_many", first_answer_lost)
    caplog.set_level(logging.INFO, logger="consensus_lease.worker")
    stats = run_worker(memory, "q", lambda lease, payload: b"ok", until_empty=True,
                       complete_batch=4, complete_flush_s=5.0, **FAST)
    assert stats.leases_lost == 1 and stats.completed == 3 and stats.errors == 0, stats
    assert _states(memory, jobs) == {"completed": 4}  # the store had recorded it
    about = [r.getMessage() for r in caplog.records if r.name == "consensus_lease.worker"
             and getattr(r, "job_id", None) == unknown[0]]
    assert any("outcome unknown" in m for m in about), about
    assert not any("not completed" in m or m == "job completed" for m in about), about


def test_a_pending_completion_is_sent_before_the_lease_deadline(memory: LeaseStore) -> None:
    """A long flush delay, a short TTL and a slot busy with its next job: the completion
    goes out on the deadline rule (half the time its lease had left), not after 60 s."""
    _enqueue(memory, 2)
    first: list[tuple[Lease, float]] = []
    seen: list[float] = []

    def handler(lease: Lease, payload: bytes) -> bytes:
        if not first:
            first.append((lease, lease.deadline))
            return b"first"
        done = first[0][0]
        wait_for(lambda: memory.get(done.job_id).state is JobState.COMPLETED,  # type: ignore[union-attr]
                 timeout_s=10, what="the first job's completion, sent while this one runs")
        seen.append(time.monotonic())
        return b"second"

    stats = run_worker(memory, "q", handler, until_empty=True, complete_batch=100,
                       complete_flush_s=60, claim_wait_s=0.05, ttl_s=2.0)
    assert stats.completed == 2 and stats.leases_lost == 0
    assert stats.complete_batches == 2  # the first alone, on time; the second at the end
    assert seen[0] < first[0][1]  # before the deadline the lease had when it finished


def test_a_completion_the_store_did_not_answer_is_sent_again(
    memory: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _enqueue(memory, 3)
    original = memory.backend.complete_many
    calls: list[int] = []

    def once_unavailable(session: Any, items: Any) -> Any:
        calls.append(len(items))
        if len(calls) == 1:
            raise BackendUnavailable("no answer (test)")
        return original(session, items)

    monkeypatch.setattr(memory.backend, "complete_many", once_unavailable)
    stats = run_worker(memory, "q", lambda lease, payload: b"ok", until_empty=True,
                       complete_batch=8, complete_flush_s=0.5, **FAST)
    assert len(calls) >= 2 and sum(calls[1:]) == 3
    assert stats.completed == 3 and stats.leases_lost == stats.errors == 0
    assert stats.batched_completions == sum(calls)
    assert _states(memory, jobs) == {"completed": 3}


def test_completions_pending_on_a_lost_session_are_refused_and_counted() -> None:
    """The store expires the session with two completions queued: the store refuses both
    (counted in leases_lost, never swallowed), the slot opens a new session, and the jobs
    are run again and completed (at least once)."""
    store_clock = FakeClock()
    with open_store("memory://", store_clock=store_clock) as store:
        jobs = _enqueue(store, 3)
        worked: list[str] = []

        def handler(lease: Lease, payload: bytes) -> bytes:
            worked.append(lease.job_id)
            if len(worked) == 2:
                store_clock.advance(3600)  # every session expires in the store
                with pytest.raises(LeaseLost):
                    lease.session.keepalive()
            return b"ok"

        stats = run_worker(store, "q", handler, until_empty=True, complete_batch=10,
                           complete_flush_s=60, **FAST)
        assert _states(store, jobs) == {"completed": 3}
    assert stats.leases_lost == 2 and stats.sessions_lost == 1 and stats.errors == 0
    assert stats.completed == 3 and len(worked) == 5


def test_pending_completions_are_sent_at_a_stop(memory: LeaseStore) -> None:
    jobs = _enqueue(memory, 6)
    stop = threading.Event()
    worked: list[str] = []

    def handler(lease: Lease, payload: bytes) -> bytes:
        worked.append(lease.job_id)
        if len(worked) == 3:
            stop.set()
        return b"ok"

    stats = run_worker(memory, "q", handler, stop_event=stop, complete_batch=100,
                       complete_flush_s=60, **FAST)
    assert stats.stopped_by == "stop_event" and stats.errors == 0
    assert stats.completed == len(worked) == 3 and stats.batched_completions == 3
    assert _states(memory, jobs) == {"completed": 3, "available": 3}
    assert memory.queue_stats("q").held == 0


def test_a_result_too_large_fails_the_attempt_not_the_batch(memory: LeaseStore) -> None:
    limit = memory.capabilities.max_payload_bytes
    if not limit:
        pytest.skip("the memory store has no result limit")
    jobs = [f"job-{i}" for i in range(3)]
    for job in jobs:
        memory.enqueue("q", job, max_attempts=1)

    def handler(lease: Lease, payload: bytes) -> bytes:
        return b"x" * (limit + 1) if lease.job_id == jobs[0] else b"ok"

    stats = run_worker(memory, "q", handler, until_empty=True, complete_batch=8, **FAST)
    assert stats.completed == 2 and stats.dead_lettered == 1 and stats.errors == 0
    assert _states(memory, jobs) == {"completed": 2, "failed": 1}


# -- prefetch --------------------------------------------------------------------------

def _break_keepalive(store: LeaseStore, monkeypatch: pytest.MonkeyPatch,
                     session_id: str) -> None:
    original = store.backend.keepalive

    def keepalive(handle: Any) -> Any:
        if handle.session_id == session_id:
            raise BackendUnavailable("no answer (test)")
        return original(handle)

    monkeypatch.setattr(store.backend, "keepalive", keepalive)


@pytest.mark.parametrize("how", ["deadline-passed", "session-expired"])
def test_a_prefetched_lease_lost_before_its_turn_is_never_worked(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    store_clock = FakeClock()
    with open_store("memory://", store_clock=store_clock) as store:
        jobs = _enqueue(store, 3)
        worked: list[tuple[str, int, LeaseState]] = []
        ahead: list[Lease] = []

        def handler(lease: Lease, payload: bytes) -> bytes:
            worked.append((lease.job_id, lease.generation, lease.state))
            if ahead:
                return b"ok"
            others = wait_for(lambda: [x for x in lease.session.leases() if x is not lease],
                              timeout_s=10, what="a prefetched lease")
            ahead.extend(others)
            if how == "deadline-passed":  # renewals stop: the local deadline passes
                _break_keepalive(store, monkeypatch, lease.session.session_id)
                wait_for(lambda: ahead[0].state is LeaseState.LOST, timeout_s=10,
                         what="the prefetched lease's deadline")
                store_clock.advance(3600)  # and the store expires the session
            else:
                store_clock.advance(3600)  # every session expires in the store
                with pytest.raises(LeaseLost):
                    lease.session.keepalive()
            return b"ok"

        stats = run_worker(store, "q", handler, until_empty=True, prefetch=1,
                           fused_claim=False, claim_wait_s=0.05, ttl_s=1.0)
        assert all(store.get(j).state is JobState.COMPLETED for j in jobs)  # type: ignore[union-attr]
    assert len(ahead) == 1
    assert (ahead[0].job_id, ahead[0].generation) not in {(j, g) for j, g, _ in worked}
    assert all(state is LeaseState.HELD for _, _, state in worked)
    assert stats.prefetch_dropped == 1 and stats.sessions_lost == 1
    assert stats.completed == 3 and stats.errors == 0


def test_a_stop_works_the_prefetched_leases_instead_of_releasing_them(
        memory: LeaseStore) -> None:
    """A release would use up an attempt of a job that never ran: the slot works the
    leases it already holds before it stops (and claims nothing more)."""
    jobs = _enqueue(memory, 10)
    stop = threading.Event()

    def handler(lease: Lease, payload: bytes) -> bytes:
        if not stop.is_set():
            wait_for(lambda: len(lease.session.leases()) == 4, timeout_s=10,
                     what="three prefetched leases")
            stop.set()
        return b"ok"

    stats = run_worker(memory, "q", handler, stop_event=stop, prefetch=3, **FAST)
    assert stats.stopped_by == "stop_event" and stats.errors == 0
    assert stats.completed == 4 and stats.prefetched == 3 and stats.released == 0
    assert stats.prefetch_dropped == 0
    assert memory.queue_stats("q").held == 0
    assert _states(memory, jobs) == {"completed": 4, "available": 6}


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "not-fused"])
def test_prefetch_never_holds_more_than_asked(memory: LeaseStore, fused: bool) -> None:
    """Two ahead at most; with a prefetched lease ready the completion claims nothing
    (that lease is the next job), so fused claims add none."""
    _enqueue(memory, 30)
    held: list[int] = []

    def handler(lease: Lease, payload: bytes) -> bytes:
        wait_for(lambda: len(lease.session.leases()) >= 3
                 or memory.queue_stats("q").available == 0,
                 timeout_s=10, what="two leases ahead, or no more to claim")
        held.append(len(lease.session.leases()))
        return b"ok"

    stats = run_worker(memory, "q", handler, until_empty=True, prefetch=2,
                       fused_claim=fused, **FAST)
    assert stats.completed == 30 and stats.prefetched >= 20 and stats.fused_claims == 0
    assert max(held) == 3  # the job in hand and two ahead, never more


@pytest.mark.parametrize("prefetch", [0, 4])
def test_a_stop_never_makes_an_unrun_job_failed(any_store: LeaseStore, prefetch: int) -> None:
    """With ``max_attempts=1`` a job the worker released unrun would be FAILED at its
    next claim (the release ends its one attempt): a stop mid-run, then a second worker
    draining the rest, leaves every job COMPLETED and run once."""
    jobs = [f"once-{i}" for i in range(40)]
    for job in jobs:
        any_store.enqueue("q", job, b"", max_attempts=1)
    ran: Counter[str] = Counter()
    stop = threading.Event()

    def handler(lease: Lease, payload: bytes) -> bytes:
        ran[lease.job_id] += 1
        if len(ran) == 5:
            stop.set()
        return b"ok"

    first = run_worker(any_store, "q", handler, stop_event=stop, prefetch=prefetch, **FAST)
    assert first.stopped_by == "stop_event" and first.errors == 0
    run_worker(any_store, "q", handler, until_empty=True, **FAST)
    states = _states(any_store, jobs)
    unrun = [job for job in jobs if ran[job] == 0]
    # nothing is handed back unrun: not the prefetched leases, nor one claimed (or
    # fused-claimed) as the stop came
    assert states.get("failed", 0) == 0 and not unrun, (states, unrun, first)
    assert all(ran[job] <= 1 for job in jobs)


@pytest.mark.parametrize("then_raise", [False, True], ids=["returns", "raises"])
@pytest.mark.parametrize("ending", ["release", "fail"])
def test_a_handler_that_ends_its_own_lease_is_not_an_error(memory: LeaseStore,
                                                          ending: str, then_raise: bool) -> None:
    """``lease.release()`` / ``lease.fail()`` called by the handler itself: the slot
    settles nothing more (it would be refused), counts it as skipped, keeps its session
    and its prefetched leases."""
    jobs = _enqueue(memory, 12)
    seen: list[str] = []

    def handler(lease: Lease, payload: bytes) -> bytes | None:
        seen.append(lease.job_id)
        if len(seen) == 1:
            wait_for(lambda: len(lease.session.leases()) == 3, timeout_s=10,
                     what="two prefetched leases")
            if ending == "release":
                lease.release()
            else:
                lease.fail(RuntimeError("given up by the handler"), retry_in_s=0)
            if then_raise:
                raise RuntimeError("and then the handler raised")
            return None
        return b"ok"

    stats = run_worker(memory, "q", handler, until_empty=True, prefetch=2, **FAST)
    assert stats.errors == 0 and stats.prefetch_dropped == 0, stats
    assert stats.skipped >= 1
    assert _states(memory, jobs) == {"completed": 12}


def test_a_lease_claimed_as_the_stop_came_is_worked(memory: LeaseStore) -> None:
    """An idle slot's waiting claim answered after the stop: the job is worked (within the
    grace period), not released; with ``max_attempts=1`` a release would make it FAILED
    without its handler ever running."""
    stop = threading.Event()
    ran: list[str] = []

    def enqueue_after_the_stop() -> None:
        wait_for(lambda: stop.is_set(), timeout_s=10, what="the stop")
        memory.enqueue("q", "late", b"", max_attempts=1)

    def handler(lease: Lease, payload: bytes) -> bytes:
        ran.append(lease.job_id)
        return b"ok"

    threading.Timer(0.3, stop.set).start()
    feeder = threading.Thread(target=enqueue_after_the_stop)
    feeder.start()
    stats = run_worker(memory, "q", handler, stop_event=stop, claim_wait_s=2.0, ttl_s=5.0)
    feeder.join(10)
    record = memory.get("late")
    assert record is not None
    if stats.claimed:  # the waiting claim got it after the stop: it was worked
        assert ran == ["late"] and record.state is JobState.COMPLETED, (stats, record)
        assert stats.released == 0
    else:  # the slot ended before the job came: untouched, still claimable
        assert record.state is JobState.AVAILABLE and record.attempt == 0



# -- prefetch in batches (claim_next_many) ---------------------------------------------

def test_prefetch_claims_many_jobs_per_round_trip(any_store: LeaseStore,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the store batches claims, the feeder (and the slot's own non-waiting claim)
    claims with ``claim_next_many``: many leases per call, never more than ``prefetch``
    ahead of the job in hand; every job worked once."""
    n, prefetch = 300, 40
    jobs = _enqueue(any_store, n)
    calls: list[tuple[int, int]] = []
    original = any_store.backend.claim_from_queue_many

    def counted(session: Any, queue: str, k: int) -> Any:
        claimed = original(session, queue, k)
        calls.append((k, len(claimed)))
        return claimed

    monkeypatch.setattr(any_store.backend, "claim_from_queue_many", counted)
    worked: Counter[str] = Counter()
    held: list[int] = []

    def handler(lease: Lease, payload: bytes) -> bytes:
        worked[lease.job_id] += 1
        held.append(len(lease.session.leases()))
        return b"ok"

    # completions one by one, none fused: the session's leases are the one in hand and
    # those ahead, and every claim is the slot's or the feeder's
    stats = run_worker(any_store, "q", handler, until_empty=True, prefetch=prefetch,
                       fused_claim=False, **FAST)
    assert stats.errors == stats.leases_lost == stats.prefetch_dropped == 0, stats
    assert worked == Counter(jobs) and _states(any_store, jobs) == {"completed": n}
    assert max(k for k, _ in calls) <= prefetch + 1, calls
    assert max(held) <= prefetch + 1, max(held)
    claimed = sum(got for _, got in calls)
    assert claimed >= n // 2 and len(calls) <= n // 5, calls  # batches, not one per job
    assert stats.prefetch_claims >= 1 and stats.prefetched >= n // 2, stats


def test_an_unknown_prefetch_claim_replaces_the_session(
        memory: LeaseStore, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A batched claim applied by the store whose answer was lost (``OutcomeUnknown``):
    its jobs are held by the session with no lease in this process. The slot works
    what it holds, then closes the session (which hands them back) and opens a new one:
    the queue drains, every job worked once."""
    jobs = _enqueue(memory, 60)
    original = memory.backend.claim_from_queue_many
    lost: list[int] = []

    def second_answer_lost(session: Any, queue: str, k: int) -> Any:
        claimed = original(session, queue, k)
        if len(lost) < 2 and claimed:
            lost.append(len(claimed))
            if len(lost) == 2:  # claimed in the store, the answer lost
                raise OutcomeUnknown("the answer was lost (test)")
        return claimed

    monkeypatch.setattr(memory.backend, "claim_from_queue_many", second_answer_lost)
    caplog.set_level(logging.WARNING, logger="consensus_lease.worker")
    worked: Counter[str] = Counter()

    def handler(lease: Lease, payload: bytes) -> bytes:
        worked[lease.job_id] += 1
        return b"ok"

    stop = threading.Event()
    timer = threading.Timer(60, stop.set)  # a hang fails the test instead of stalling it
    timer.start()
    try:
        stats = run_worker(memory, "q", handler, until_empty=True, prefetch=4,
                           fused_claim=False, stop_event=stop, **FAST)
    finally:
        timer.cancel()
    assert stats.stopped_by == "drained" and stats.errors == 0, stats
    assert len(lost) == 2 and worked == Counter(jobs), (lost, worked)
    assert _states(memory, jobs) == {"completed": 60}
    assert any("prefetch claim's outcome was unknown" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("knobs", [{}, {"prefetch": 4, "complete_batch": 8}],
                         ids=["plain", "feeder"])
def test_until_empty_ends_without_waiting_out_a_claim(
        any_store: LeaseStore, knobs: dict[str, Any]) -> None:
    # A drained queue is noticed by a non-waiting claim and the queue's counts, not after
    # a claim_wait_s wait: with 30 s the old runner took >= 30 s to return.
    any_store.enqueue_many("q", ["a", "b", "c"])
    started = time.monotonic()
    stats = run_worker(any_store, "q", lambda lease, payload: b"", until_empty=True,
                       claim_wait_s=30.0, ttl_s=5.0, **knobs)
    took = time.monotonic() - started
    assert stats.completed == 3 and stats.stopped_by == "drained"
    assert took < 15.0, took  # half the wait: a wide margin for a busy host
