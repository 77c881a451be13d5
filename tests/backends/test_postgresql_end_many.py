"""PostgreSQL's ``release_many`` and ``fail_many`` when the answer of their statement is
lost (the connection broke after it was sent): settled by reading back, never by sending
blindly again. Not applied (the session still holds an item): the statement runs once
more. Applied: every item is answered from the store (released; failed with its record,
or refused with why), nothing applied twice."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from consensus_lease import JobState, LeaseStore, open_store
from consensus_lease.backends.postgresql import PostgresBackend
from consensus_lease.errors import StaleLeaseError
from consensus_lease.record import LeaseRecord
from consensus_lease.states import LeaseState
from consensus_lease.testing.postgresql import fresh_schema, postgres_url


@pytest.fixture
def store() -> Iterator[LeaseStore]:
    base = postgres_url()
    with fresh_schema(base) as schema, open_store(f"{base}?schema={schema}") as s:
        yield s


def _lose_batch_answers(store: LeaseStore, monkeypatch: pytest.MonkeyPatch,
                        applied: bool) -> list[int]:
    """Make each batch statement's answer lost: sent and committed first if ``applied``,
    else not sent at all; the driver's settle then reads back. Returns a counter of the
    statements lost."""
    b = store.backend
    assert isinstance(b, PostgresBackend)
    write = b.client.write
    lost = [0]

    def lossy(job_id: str | None, run: Any, settle: Any = None) -> Any:
        if settle is None or not run.__qualname__.startswith("_run_batch.") or lost[0]:
            return write(job_id, run, settle)
        lost[0] += 1
        if applied:
            write(job_id, run)  # committed, then the answer is lost
        return settle()

    monkeypatch.setattr(b.client, "write", lossy)
    return lost


@pytest.mark.parametrize("applied", [False, True])
def test_release_many_lost_answer_is_settled_by_reading_back(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    session = store.session("W", 30.0)
    leases = [session.claim(j) for j in ("r1", "r2", "r3")]
    assert all(leases)
    held = [lease for lease in leases if lease is not None]
    lost = _lose_batch_answers(store, monkeypatch, applied)
    assert session.release_many(held) == [None, None, None]
    assert lost == [1]
    assert all(lease.state is LeaseState.RELEASED for lease in held)
    other = store.session("O", 30.0)
    for lease in held:
        again = other.claim(lease.job_id)  # claimable at once, claimed once more only
        assert again is not None and again.generation == lease.generation + 1


@pytest.mark.parametrize("applied", [False, True])
def test_fail_many_lost_answer_is_settled_by_reading_back(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    a, b = store.session("A", 30.0), store.session("B", 30.0)
    mine, stale = a.claim("f1"), a.claim("f2")
    assert mine is not None and stale is not None
    store.backend.release(a.handle, "f2", stale.claim_result)  # behind the lease's back
    newer = b.claim("f2")
    assert newer is not None
    lost = _lose_batch_answers(store, monkeypatch, applied)
    out = a.fail_many([(mine, "boom", 60.0), (stale, "late", 0.0)])
    assert lost == [1]
    assert isinstance(out[0], LeaseRecord) and out[0].error == "boom"
    assert out[0].state is JobState.AVAILABLE and out[0].not_before is not None
    assert out[0].attempt == 1
    assert isinstance(out[1], StaleLeaseError)
    assert (mine.state, stale.state) == (LeaseState.FAILED, LeaseState.LOST)
    current = store.get("f2")
    assert current is not None and current.owner == "B" and current.error is None
    newer.ensure_held()
