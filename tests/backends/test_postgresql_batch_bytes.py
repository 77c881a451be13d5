"""PostgreSQL's ``complete_many`` and ``fail_many`` split by bytes as well as by count:
one statement per up to ``_config.MAX_BATCH_BYTES`` of results or error texts (a batch
of large results once went out as one message past libpq's 1 GiB output buffer, and
every item failed). The cap is lowered here, so nothing large is allocated."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from consensus_lease import JobState, LeaseStore, open_store
from consensus_lease.backends.postgresql import PostgresBackend, _config
from consensus_lease.errors import BackendUnavailable, InvalidArgument
from consensus_lease.states import LeaseState
from consensus_lease.testing.postgresql import fresh_schema, postgres_url


@pytest.fixture
def store() -> Iterator[LeaseStore]:
    base = postgres_url()
    with fresh_schema(base) as schema, open_store(f"{base}?schema={schema}") as s:
        yield s


def _statements(store: LeaseStore, monkeypatch: pytest.MonkeyPatch, name: str,
                fail_at: int | None = None) -> list[list[str]]:
    """The job ids of each batch statement ``name`` (``_complete_statement`` /
    ``_fail_statement``) sent; the ``fail_at``-th (0-based) raises BackendUnavailable
    instead of being sent."""
    b = store.backend
    assert isinstance(b, PostgresBackend)
    from consensus_lease.backends.postgresql import _jobs

    original = getattr(_jobs, name)
    sent: list[list[str]] = []

    def counted(backend: Any, session: Any, items: Any) -> Any:
        if fail_at is not None and len(sent) == fail_at:
            sent.append([])
            raise BackendUnavailable("connection refused (test)", job_id=items[0][0])
        sent.append([it[0] for it in items])
        return original(backend, session, items)

    monkeypatch.setattr(_jobs, name, counted)
    return sent


def test_complete_many_goes_out_as_one_statement_per_cap_of_results(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_config, "MAX_BATCH_BYTES", 100)
    session = store.session("W", 30.0)
    ids = [f"c{i}" for i in range(5)] + ["big"]
    leases = session.claim_many(ids)
    results = [bytes([65 + i]) * 40 for i in range(5)] + [b"x" * 500]
    sent = _statements(store, monkeypatch, "_complete_statement")
    out = session.complete_many(list(zip(leases, results, strict=True)))
    # two items per 100 bytes, the one above the cap alone: never split below an item
    assert sent == [["c0", "c1"], ["c2", "c3"], ["c4"], ["big"]]
    assert [o.state for o in out] == [JobState.COMPLETED] * 6  # type: ignore[union-attr]
    assert all(lease.state is LeaseState.COMPLETED for lease in leases)
    for job_id, result in zip(ids, results, strict=True):
        record = store.get(job_id)
        assert record is not None and record.result == result


def test_complete_many_under_the_cap_is_one_statement(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = store.session("W", 30.0)
    leases = session.claim_many([f"s{i}" for i in range(3)])
    sent = _statements(store, monkeypatch, "_complete_statement")
    session.complete_many([(lease, b"r" * 1000) for lease in leases])
    assert sent == [["s0", "s1", "s2"]]


def test_a_failed_statement_is_its_items_outcome_and_the_rest_are_not_sent(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_config, "MAX_BATCH_BYTES", 100)
    session = store.session("W", 30.0)
    leases = session.claim_many([f"c{i}" for i in range(6)])
    sent = _statements(store, monkeypatch, "_complete_statement", fail_at=1)
    out = session.complete_many([(lease, b"r" * 40) for lease in leases])
    assert sent == [["c0", "c1"], []]  # the third statement never sent
    assert [o.state for o in out[:2]] == [JobState.COMPLETED] * 2  # type: ignore[union-attr]
    for i, outcome in enumerate(out[2:], start=2):
        assert isinstance(outcome, BackendUnavailable)
        assert outcome.job_id == f"c{i}" and str(outcome).startswith(f"item {i}: ")
    # nothing of them applied: still held, and sent again they complete
    assert all(lease.state is LeaseState.HELD for lease in leases[2:])
    monkeypatch.undo()
    again = session.complete_many([(lease, b"r") for lease in leases[2:]])
    assert [o.state for o in again] == [JobState.COMPLETED] * 4  # type: ignore[union-attr]


def test_fail_many_goes_out_as_one_statement_per_cap_of_error_texts(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_config, "MAX_BATCH_BYTES", 100)
    session = store.session("W", 30.0)
    leases = session.claim_many([f"f{i}" for i in range(4)])
    # 40 bytes each; the last 21 three-byte characters, counted as UTF-8 (63 bytes:
    # not with the third)
    errors = ["e" * 40, "e" * 40, "e" * 40, "\u20ac" * 21]
    sent = _statements(store, monkeypatch, "_fail_statement")
    out = session.fail_many([(lease, error, 60.0) for lease, error in
                             zip(leases, errors, strict=True)])
    assert sent == [["f0", "f1"], ["f2"], ["f3"]]
    for outcome, error in zip(out, errors, strict=True):
        assert not isinstance(outcome, Exception)
        assert outcome.state is JobState.AVAILABLE and outcome.error == error
    assert all(lease.state is LeaseState.FAILED for lease in leases)


def test_enqueue_many_sends_one_insert_per_cap_of_payloads_in_one_transaction(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_config, "MAX_BATCH_BYTES", 100)
    inserts: list[int] = []  # the ids of each enqueue INSERT sent
    original = psycopg.Connection.execute

    def counted(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        if isinstance(query, str) and query.startswith("INSERT INTO") and "unnest" in query:
            inserts.append(len(params["ids"]))
        return original(self, query, params, **kw)

    monkeypatch.setattr(psycopg.Connection, "execute", counted)
    items = [(f"q{i}", bytes([65 + i]) * 40) for i in range(5)]
    assert store.enqueue_many("bytes", items) == [True] * 5
    assert inserts == [2, 2, 1]
    session = store.session("W", 30.0)
    got = [session.claim_next("bytes", wait_s=0) for _ in range(5)]
    assert [(lease.job_id, lease.payload) for lease in got if lease] == items  # in order
    # all or nothing still: one id outside the queue adds none of the batch
    store.enqueue("elsewhere", "taken")
    inserts.clear()
    with pytest.raises(InvalidArgument, match="outside queue"):
        store.enqueue_many("bytes", [("n0", b"x" * 60), ("n1", b"y" * 60), "taken"])
    assert inserts == [1, 2]  # 62 bytes, then 62 + 5
    assert store.get("n0") is None and store.get("n1") is None


def test_the_workers_batched_completion_is_split_by_bytes_too(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's ``complete_batch`` goes through ``session.complete_many``: the same
    split."""
    from consensus_lease.worker import run_worker

    monkeypatch.setattr(_config, "MAX_BATCH_BYTES", 100)
    jobs = [f"w{i}" for i in range(12)]
    store.enqueue_many("q", jobs)
    sent = _statements(store, monkeypatch, "_complete_statement")
    stats = run_worker(store, "q", lambda lease, payload: lease.job_id.encode() * 20,
                       until_empty=True, complete_batch=6, complete_flush_s=1.0,
                       claim_wait_s=0.05, ttl_s=5.0)
    assert stats.errors == stats.leases_lost == 0 and stats.completed == 12
    assert stats.complete_batches < len(sent)  # a batch went out as several statements
    assert max(len(ids) for ids in sent) == 2  # 40-60 bytes each: at most two per 100
    assert sorted(j for ids in sent for j in ids) == sorted(jobs)
    for job in jobs:
        record = store.get(job)
        assert record is not None and record.state is JobState.COMPLETED
        assert record.result == job.encode() * 20
