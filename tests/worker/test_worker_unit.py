"""``run_worker`` in this process, on the memory store: the handler contract, retries,
dead letters, lost leases and sessions, stopping."""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any

import pytest

from consensus_lease import (
    InvalidArgument,
    JobState,
    Lease,
    LeaseLost,
    LeaseStore,
    UnsupportedBackend,
    open_store,
)
from consensus_lease.retry import RetryPolicy
from consensus_lease.testing import FakeClock
from consensus_lease.worker import Retry, WorkerConfig, load_handler, run_worker
from consensus_lease.worker.command import add_parser, settings, worker_arguments
from consensus_lease.worker.config import from_environment

FAST = {"claim_wait_s": 0.05, "ttl_s": 5.0}


@pytest.fixture
def store() -> Any:
    with open_store("memory://") as opened:
        yield opened


def _enqueue(store: LeaseStore, n: int, max_attempts: int | None = None) -> list[str]:
    jobs = [f"job-{i}" for i in range(n)]
    for job in jobs:
        store.enqueue("q", job, job.encode(), max_attempts=max_attempts)
    return jobs


def test_returned_bytes_complete_the_job(store: LeaseStore) -> None:
    jobs = _enqueue(store, 5)

    def handler(lease: Lease, payload: bytes) -> bytes:
        lease.ensure_held()
        return payload.upper()

    stats = run_worker(store, "q", handler, concurrency=2, until_empty=True, **FAST)
    assert stats.completed == stats.claimed == 5 and stats.stopped_by == "drained"
    for job in jobs:
        record = store.get(job)
        assert record is not None and record.state is JobState.COMPLETED
        assert record.result == job.upper().encode()


def test_async_handler_runs_on_the_slots_loop(store: LeaseStore) -> None:
    _enqueue(store, 3)
    loops: set[int] = set()

    async def handler(lease: Lease, payload: bytes) -> None:
        await asyncio.sleep(0)  # yields once, as a real async handler would
        loops.add(id(asyncio.get_running_loop()))

    stats = run_worker(store, "q", handler, until_empty=True, **FAST)
    assert stats.completed == 3 and len(loops) == 1
    record = store.get("job-0")
    assert record is not None and record.result == b""


def test_always_raising_handler_is_failed_after_max_attempts(store: LeaseStore) -> None:
    _enqueue(store, 1, max_attempts=3)
    calls: list[int] = []

    def handler(lease: Lease, payload: bytes) -> bytes:
        calls.append(lease.attempt)
        raise RuntimeError("broken")

    stats = run_worker(store, "q", handler, until_empty=True,
                       retry=RetryPolicy(initial_s=0.01), **FAST)
    assert calls == [1, 2, 3]
    assert stats.retried == 2 and stats.dead_lettered == 1 and stats.completed == 0
    record = store.get("job-0")
    assert record is not None and record.state is JobState.FAILED
    assert record.attempt == 3 and record.error == "RuntimeError: broken"


def test_retry_chooses_the_delay_and_until_empty_waits_for_it(store: LeaseStore) -> None:
    _enqueue(store, 1)
    starts: list[float] = []

    def handler(lease: Lease, payload: bytes) -> bytes:
        starts.append(time.monotonic())
        if lease.attempt == 1:
            raise Retry(0.5, "not yet")
        return b"done"

    stats = run_worker(store, "q", handler, until_empty=True, **FAST)
    assert stats.retried == 1 and stats.completed == 1
    assert starts[1] - starts[0] >= 0.45  # the store's delay (its clock may tick coarser)
    record = store.get("job-0")
    assert record is not None and record.attempt == 2 and record.error == "not yet"


def test_non_bytes_result_fails_the_attempt(store: LeaseStore) -> None:
    _enqueue(store, 1, max_attempts=1)
    stats = run_worker(store, "q", lambda lease, payload: "text", until_empty=True, **FAST)
    record = store.get("job-0")
    assert stats.dead_lettered == 1 and record is not None
    assert record.state is JobState.FAILED and "must return bytes" in (record.error or "")


def test_lease_lost_in_the_handler_is_not_completed(store: LeaseStore) -> None:
    _enqueue(store, 1)

    def handler(lease: Lease, payload: bytes) -> bytes:
        if lease.attempt == 1:
            lease.release()  # as if the lease had been lost
            lease.ensure_held()  # raises LeaseLost
        return f"attempt {lease.attempt}".encode()

    stats = run_worker(store, "q", handler, until_empty=True, **FAST)
    assert stats.leases_lost == 1 and stats.completed == 1 and stats.retried == 0
    record = store.get("job-0")
    assert record is not None and record.result == b"attempt 2"


def test_lease_lost_after_the_handler_returned_says_its_effects_stand(
    store: LeaseStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler's work is done (a transaction committed, say), then the completion is
    refused: the log says the effects stand, not only "not completed" (issue 31)."""
    _enqueue(store, 1)

    def handler(lease: Lease, payload: bytes) -> bytes:
        if lease.attempt == 1:  # the store ends the hold behind the worker's back
            store.backend.release(lease.session.handle, lease.job_id, lease.claim_result)
        return f"attempt {lease.attempt}".encode()

    with caplog.at_level("WARNING", logger="consensus_lease.worker"):
        stats = run_worker(store, "q", handler, until_empty=True, **FAST)
    assert stats.leases_lost == 1 and stats.completed == 1
    said = [r.getMessage() for r in caplog.records if "not completed" in r.getMessage()]
    assert len(said) == 1 and "the handler's effects stand" in said[0], said


def test_lost_session_is_replaced_and_counted() -> None:
    store_clock = FakeClock()
    with open_store("memory://", store_clock=store_clock) as store:
        _enqueue(store, 2)

        def handler(lease: Lease, payload: bytes) -> bytes:
            if lease.job_id == "job-0" and lease.attempt == 1:
                store_clock.advance(3600)  # every session expires in the store
                with pytest.raises(LeaseLost):  # SessionExpired, or lost already
                    lease.session.keepalive()
            return b"ok"

        stats = run_worker(store, "q", handler, until_empty=True, **FAST)
    assert stats.sessions_lost == 1 and stats.leases_lost == 1
    assert stats.completed == 2 and stats.errors == 0


def test_stop_event_lets_the_job_in_flight_finish(store: LeaseStore) -> None:
    _enqueue(store, 2)
    stop, started, go = threading.Event(), threading.Event(), threading.Event()

    def handler(lease: Lease, payload: bytes) -> bytes:
        started.set()
        assert go.wait(30)
        return b"finished"

    result: list[Any] = []
    runner = threading.Thread(target=lambda: result.append(
        run_worker(store, "q", handler, stop_event=stop, grace_s=30, **FAST)))
    runner.start()
    assert started.wait(30)
    stop.set()  # the slot reads it when the handler returns: no new claim after that
    go.set()
    runner.join(30)
    assert not runner.is_alive()
    stats = result[0]
    assert stats.stopped_by == "stop_event" and stats.completed == 1 and stats.claimed == 1
    states = sorted(r.state.value for r in store.records())
    assert states == ["available", "completed"]


def test_grace_period_over_releases_the_job(store: LeaseStore) -> None:
    _enqueue(store, 1)
    stop, started, go = threading.Event(), threading.Event(), threading.Event()

    def handler(lease: Lease, payload: bytes) -> bytes:
        started.set()
        go.wait(30)
        return b"too late"

    result: list[Any] = []
    runner = threading.Thread(target=lambda: result.append(
        run_worker(store, "q", handler, stop_event=stop, grace_s=0.2, **FAST)))
    runner.start()
    assert started.wait(30)
    stop.set()
    signalled = time.monotonic()
    runner.join(30)
    assert not runner.is_alive() and time.monotonic() - signalled < 10
    go.set()
    assert result[0].released == 1 and result[0].completed == 0
    record = store.get("job-0")
    assert record is not None and record.state is JobState.AVAILABLE


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"concurrency": 0}, "concurrency"),
    ({"mode": "fork"}, "mode"),
    ({"grace_s": -1}, "grace_s"),
    ({"claim_wait_s": 0}, "claim_wait_s"),
    ({"ttl_s": float("nan")}, "ttl_s"),
    ({"mode": "process"}, "needs a store URL"),
    ({"stop_event": "yes"}, "stop_event"),
    ({"fused_claim": 1}, "fused_claim"),
])
def test_bad_arguments(store: LeaseStore, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        run_worker(store, "q", lambda lease, payload: None, **kwargs)


def test_bad_handlers(tmp_path: Any) -> None:
    with pytest.raises(InvalidArgument, match="callable"):
        run_worker("memory://", "q", 42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"package\.module:function"):
        load_handler("no_colon")
    with pytest.raises(InvalidArgument, match="cannot import"):
        load_handler("no_such_module_xyz:f")
    with pytest.raises(InvalidArgument, match="no attribute"):
        load_handler("json:no_such_function")
    assert load_handler("json:dumps") is not None
    with pytest.raises(InvalidArgument, match="importable by name"):
        run_worker(f"sqlite:///{tmp_path}/w.db", "q", lambda lease, payload: None,
                   mode="process")
    with pytest.raises(InvalidArgument, match="other processes"):
        run_worker("memory://", "q", "json:dumps", mode="process")
    with pytest.raises(UnsupportedBackend):
        run_worker("nope://", "q", "json:dumps")
    with pytest.raises(InvalidArgument, match="retry_in_s"):
        Retry(-1)


def test_signal_handlers_need_the_main_thread(store: LeaseStore) -> None:
    errors: list[BaseException] = []

    def call() -> None:
        try:
            run_worker(store, "q", lambda lease, payload: None, handle_signals=True)
        except InvalidArgument as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(30)
    assert errors and "main thread" in str(errors[0])


def test_flags_win_over_the_environment() -> None:
    env = {"CONSENSUS_LEASE_URL": "memory://", "CONSENSUS_LEASE_QUEUE": "env-q",
           "CONSENSUS_LEASE_CONCURRENCY": "3", "CONSENSUS_LEASE_PROCESSES": "true",
           "CONSENSUS_LEASE_HANDLER": "m:f", "CONSENSUS_LEASE_MAX_ATTEMPTS": "4"}
    args = argparse.Namespace(queue="flag-q", concurrency=None, processes=False,
                              handler=None, ttl_s=2.5)
    arguments = worker_arguments(settings(args, env))
    assert arguments["queue"] == "flag-q" and arguments["concurrency"] == 3
    assert arguments["mode"] == "thread" and arguments["ttl_s"] == 2.5
    assert arguments["handler"] == "m:f" and arguments["store"] == "memory://"
    assert arguments["retry"] == RetryPolicy(max_attempts=4)
    WorkerConfig(**{k: v for k, v in arguments.items() if k not in ("store", "handler")})


@pytest.mark.parametrize(("argv", "environ", "fused"), [
    ([], {}, True),
    (["--no-fused-claim"], {}, False),
    ([], {"CONSENSUS_LEASE_FUSED_CLAIM": "off"}, False),
    (["--fused-claim"], {"CONSENSUS_LEASE_FUSED_CLAIM": "0"}, True),
])
def test_fused_claim_is_on_unless_turned_off(argv: list[str], environ: dict[str, str],
                                             fused: bool) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["worker", "--backend", "memory://", "--queue", "q", *argv,
                              "m:f"])
    assert worker_arguments(settings(args, environ))["fused_claim"] is fused


@pytest.mark.parametrize(("variable", "value"), [
    ("CONSENSUS_LEASE_CONCURRENCY", "many"), ("CONSENSUS_LEASE_GRACE_S", "inf"),
    ("CONSENSUS_LEASE_UNTIL_EMPTY", "2"), ("CONSENSUS_LEASE_MAX_ATTEMPTS", "0"),
    ("CONSENSUS_LEASE_QUEUE", ""),
])
def test_bad_environment_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(InvalidArgument, match=variable):
        from_environment({variable: value})


def test_store_regression_stops_the_worker_with_an_error(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """StoreRegressed needs an operator (bump-epoch): the worker stops, exit status 1,
    instead of opening sessions again and again."""
    from consensus_lease import StoreRegressed

    _enqueue(store, 3)
    opened: list[int] = []

    def regressed(*args: Any, **kwargs: Any) -> Any:
        opened.append(1)
        raise StoreRegressed("history went back")

    monkeypatch.setattr(store, "session", regressed)
    started = time.monotonic()
    stats = run_worker(store, "q", lambda lease, payload: b"", concurrency=2, **FAST)
    assert time.monotonic() - started < 10
    assert stats.errors >= 1 and stats.exit_status == 1 and stats.completed == 0
    assert len(opened) <= 2  # once per slot, not retried


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()])
def test_a_handler_raising_systemexit_fails_the_attempt_and_the_worker_goes_on(
    store: LeaseStore, raised: BaseException
) -> None:
    jobs = _enqueue(store, 3, max_attempts=1)

    def handler(lease: Lease, payload: bytes) -> bytes:
        if lease.job_id == jobs[0]:
            raise raised
        return b"ok"

    stats = run_worker(store, "q", handler, concurrency=1, until_empty=True, **FAST)
    assert stats.completed == 2 and stats.dead_lettered == 1
    record = store.get(jobs[0])
    assert record is not None and record.state is JobState.FAILED
    assert record.error is not None and type(raised).__name__ in record.error
