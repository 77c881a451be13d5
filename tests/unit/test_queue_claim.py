"""``claim_next`` without waiting answers ``None`` only when nothing is claimable: a
candidate list gone stale because other workers completed its jobs is read again, not
taken for an empty queue (a "drain until None" loop stopped early on a busy deep queue)."""

from __future__ import annotations

from typing import Any

import pytest

from consensus_lease import open_store
from consensus_lease._queue_claim import QUEUE_RETRIES


def test_stale_candidate_lists_are_read_again_not_taken_for_an_empty_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with open_store("memory://") as store, store.session("w", 30) as session:
        store.enqueue_many("q", [f"job-{i}" for i in range(40)])
        for i in range(8):  # another worker finished the first eight meanwhile
            lease = session.claim(f"job-{i}")
            assert lease is not None
            lease.complete(b"")
        backend: Any = store.backend
        real = backend.queue_candidates
        stale = [(f"job-{i}", b"") for i in range(8)]
        reads = {"n": 0}

        def candidates(queue: str, limit: int) -> list[tuple[str, bytes]]:
            reads["n"] += 1
            if reads["n"] <= QUEUE_RETRIES + 2:  # more stale reads than the retry budget
                return stale
            return list(real(queue, limit))

        monkeypatch.setattr(backend, "queue_candidates", candidates)
        lease = session.claim_next("q")
        assert lease is not None and lease.job_id not in {j for j, _ in stale}
        assert reads["n"] == QUEUE_RETRIES + 3


def test_none_when_every_candidate_is_held_by_others() -> None:
    with open_store("memory://") as store:
        store.enqueue_many("q", ["a", "b"])
        with store.session("other", 30) as other, store.session("me", 30) as me:
            assert other.claim("a") is not None and other.claim("b") is not None
            assert me.claim_next("q") is None


def test_a_waiting_claim_looks_first_as_any_claim_then_as_woken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first look of a waiting ``claim_next`` is ``queue_candidates`` (every write
    completed before the call); the try right after subscribing, and each one a wake
    triggers, are ``queue_candidates_after_wake``."""
    import threading
    import time

    from consensus_lease.testing.conformance import poll_until

    with open_store("memory://") as store, store.session("w", 30) as session:
        backend: Any = store.backend
        calls: list[str] = []
        plain = backend.queue_candidates

        def first(queue: str, limit: int) -> list[tuple[str, bytes]]:
            if threading.current_thread() is waiter:  # (the store's poller reads it too)
                calls.append("plain")
            return list(plain(queue, limit))

        def after_wake(queue: str, limit: int) -> list[tuple[str, bytes]]:
            if threading.current_thread() is waiter:
                calls.append("woken")
            return list(plain(queue, limit))  # (the default calls queue_candidates)

        monkeypatch.setattr(backend, "queue_candidates", first)
        monkeypatch.setattr(backend, "queue_candidates_after_wake", after_wake)
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(
            session.claim_next("q", wait_s=10)))
        started = time.monotonic()
        waiter.start()
        poll_until(lambda: "woken" in calls, 5)  # subscribed, looked once more
        store.enqueue("q", "job")
        waiter.join(10)
        assert got and got[0] is not None and got[0].job_id == "job"
        assert time.monotonic() - started < 10
        assert calls[0] == "plain" and "plain" not in calls[1:]
        assert calls.count("woken") >= 2
