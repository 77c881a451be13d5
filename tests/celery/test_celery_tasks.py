"""FencedTask (consensus_lease/celery.py): the steps of a delivery, eagerly in this
process, then the acceptance run with a real Redis broker and worker processes
(tests/celery/redelivery.py; the full 100-task run is committed under
benchmarks/results/celery_redelivery.json)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consensus_lease import (
    BackendUnavailable,
    InvalidArgument,
    JobState,
    LeaseLost,
    OutcomeUnknown,
    SessionState,
    open_store,
)
from consensus_lease.observe import Observer
from consensus_lease.testing.conformance import poll_until

celery = pytest.importorskip("celery")  # the [celery] extra
from celery import Celery  # noqa: E402

from consensus_lease.celery import FencedTask, current_lease  # noqa: E402


class Skips(Observer):
    def __init__(self) -> None:
        self.skipped: list[tuple[str, str, str]] = []

    def delivery_skipped(self, store: str, job_id: str, reason: str) -> None:
        self.skipped.append((store, job_id, reason))


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[Celery, Any, Skips]]:
    skips = Skips()
    store = open_store(f"sqlite:///{tmp_path}/leases.db", observer=skips)
    app = Celery("eager-test", broker="memory://", set_as_current=False)
    app.conf.update(task_always_eager=False, consensus_lease_store=lambda: store)
    yield app, store, skips
    from consensus_lease import celery as integration

    integration._close_process()  # the sessions and stores this process opened


def test_success_completes_and_a_redelivery_does_not_run(app: Any) -> None:
    app, store, skips = app
    ran: list[int] = []

    @app.task(bind=True, base=FencedTask, shared=False)
    def job(self: Any, x: int) -> int:
        assert current_lease() is self.lease
        self.lease.ensure_held()
        ran.append(self.lease.generation)
        return x * 2

    task_id = str(uuid.uuid4())
    assert job.apply((21,), task_id=task_id).get() == 42
    record = store.get(f"celery:{task_id}")
    assert record is not None and record.state is JobState.COMPLETED
    again = job.apply((21,), task_id=task_id)  # the same message delivered again
    assert again.state == "IGNORED"
    assert ran == [record.generation]
    assert skips.skipped == [("sqlite", f"celery:{task_id}", "completed")]


def test_held_elsewhere_does_not_run(app: Any) -> None:
    app, store, skips = app
    ran: list[str] = []

    @app.task(bind=True, base=FencedTask, shared=False,
              lease_key=lambda order: f"order:{order}")
    def job(self: Any, order: str) -> None:
        ran.append(order)

    with store.session("other-worker", ttl_s=10) as other:
        lease = other.claim("order:7")
        assert lease is not None
        assert job.apply(("7",)).state == "IGNORED"
        assert ran == []
        assert skips.skipped == [("sqlite", "order:7", "held")]
        lease.release()
    assert job.apply(("7",)).state == "SUCCESS"
    assert ran == ["7"]


def test_error_records_a_failed_attempt_and_reraises(app: Any) -> None:
    app, store, _ = app

    @app.task(bind=True, base=FencedTask, shared=False)
    def job(self: Any) -> None:
        raise ValueError("card declined")

    task_id = str(uuid.uuid4())
    result = job.apply(task_id=task_id)
    assert result.state == "FAILURE" and isinstance(result.result, ValueError)
    record = store.get(f"celery:{task_id}")
    assert record is not None and record.state is JobState.AVAILABLE
    assert record.attempt == 1 and "card declined" in (record.error or "")
    assert record.not_before is not None  # the store's retry policy: a delay before the next


def test_lease_lost_while_running_drops_the_result(app: Any) -> None:
    app, store, _ = app

    @app.task(bind=True, base=FencedTask, shared=False)
    def job(self: Any) -> str:
        self.lease.session.close()  # the session ends under the running body
        with pytest.raises(LeaseLost):
            self.lease.ensure_held()
        return "late"

    task_id = str(uuid.uuid4())
    assert job.apply(task_id=task_id).state == "IGNORED"
    record = store.get(f"celery:{task_id}")
    assert record is not None and record.state is not JobState.COMPLETED


@pytest.mark.parametrize("error", [BackendUnavailable, OutcomeUnknown])
def test_a_claim_without_an_answer_does_not_run(app: Any, monkeypatch: Any,
                                                error: type[Exception]) -> None:
    app, store, skips = app
    ran: list[int] = []

    @app.task(bind=True, base=FencedTask, shared=False)
    def job(self: Any) -> None:
        ran.append(self.lease.generation)

    assert job.apply().state == "SUCCESS"  # opens this process's session

    def no_answer(*args: Any, **kwargs: Any) -> None:
        raise error("no answer from the store")

    from consensus_lease import celery as integration

    session = next(iter(integration._this_process().sessions.values()))
    monkeypatch.setattr(store.backend, "claim", no_answer)
    task_id = str(uuid.uuid4())
    assert job.apply(task_id=task_id).state == "IGNORED"
    assert ran == [1]
    assert skips.skipped[-1] == ("sqlite", f"celery:{task_id}", "unavailable")
    # An unknown outcome ends the session (a claim it may hold expires in the store);
    # no answer at all changes nothing.
    closed = session.state is SessionState.CLOSED
    assert closed is (error is OutcomeUnknown)
    monkeypatch.undo()
    assert job.apply(task_id=task_id).state == "SUCCESS"  # the re-check copy
    assert len(ran) == 2


def test_a_completion_without_an_answer_leaves_no_orphan_claim(app: Any,
                                                                monkeypatch: Any) -> None:
    app, store, _ = app
    ran: list[int] = []

    @app.task(bind=True, base=FencedTask, shared=False, lease_ttl_s=0.5)
    def job(self: Any) -> None:
        ran.append(self.lease.generation)

    def no_answer(*args: Any, **kwargs: Any) -> None:
        raise BackendUnavailable("no answer from the store")

    monkeypatch.setattr(store.backend, "complete", no_answer)
    task_id = str(uuid.uuid4())
    assert job.apply(task_id=task_id).state == "IGNORED"  # the result was not recorded
    monkeypatch.undo()
    # The session that held the claim was closed: its claim ends in the store, and the
    # re-check copy runs the task (instead of finding it held by an idle session forever).
    assert poll_until(lambda: job.apply(task_id=task_id).state == "SUCCESS" or None, 10)
    assert len(ran) >= 2 and ran[-1] > ran[0]
    record = store.get(f"celery:{task_id}")
    assert record is not None and record.state is JobState.COMPLETED


def test_bad_configuration_is_invalid_argument(app: Any) -> None:
    app, _, _ = app

    @app.task(bind=True, base=FencedTask, shared=False)
    def job(self: Any) -> None: ...

    with pytest.raises(InvalidArgument, match="no task id"):
        job()  # a plain function call: no task id to key the lease
    bare = Celery("bare", broker="memory://", set_as_current=False)

    @bare.task(bind=True, base=FencedTask, shared=False)
    def unconfigured(self: Any) -> None: ...

    result = unconfigured.apply()
    assert isinstance(result.result, InvalidArgument)
    assert "lease_store" in str(result.result)


def _needs(binary: str) -> None:
    if shutil.which(binary) is None and not Path(f"/usr/bin/{binary}").exists():
        reason = f"no {binary} (docker/install-deps.sh installs Debian's redis-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)


@pytest.mark.slow
def test_redelivery_with_a_real_broker_and_a_killed_worker(tmp_path: Path) -> None:
    _needs("redis-server")
    pytest.importorskip("redis")
    import redelivery

    settings = redelivery.Settings(tasks=8, plain_tasks=3, step_s=0.5, ttl_s=3.0,
                                   deadline_s=240)
    result = redelivery.run(settings, tmp_path)
    assert result.killed_fenced_in_flight >= 1, result  # SIGKILLed in the middle of a task
    # Each task the kill interrupted ran again elsewhere, after its lease expired.
    assert result.fenced_tasks_run_more_than_once >= result.killed_fenced_in_flight
    # Frozen past its lease mid-task, then thawed: its next write was refused (by the
    # local check, or by the fence when the freeze fell between the check and the write).
    assert result.paused_run_outcome in ("lost", "fenced"), result
    assert result.fenced_effects_wrong == []
    assert result.stale_accepted == []
    assert result.fenced_overlaps == []
    assert result.not_completed == []
    assert result.skipped_log_lines >= 1  # redelivered copies were acked, not run
    # The control: the same tasks without the lease ran again while the first ran.
    assert result.plain_tasks_with_duplicate_effects >= 1
    assert result.plain_effects > 3 * 3
