"""``claim_next_many`` reports its claims to the observer as the ``claim_next`` calls it
replaces, so the claim metrics and spans of a worker that batches its claims are right."""

from __future__ import annotations

import pytest

from consensus_lease import InvalidArgument, open_store
from consensus_lease.observe import Observer


class _Operations(Observer):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str]] = []

    def operation(self, store: str, op: str, job_id: str | None, generation: int | None,
                  outcome: str, latency_s: float) -> None:
        assert latency_s >= 0
        self.seen.append((op, job_id, outcome))


def test_each_claimed_lease_is_one_claim_next_and_an_empty_queue_is_empty() -> None:
    observer = _Operations()
    with open_store("memory://", observer=observer) as store, \
            store.session("w", ttl_s=30) as session:
        store.enqueue_many("q", ["a", "b", "c"])
        leases = session.claim_next_many("q", 2)
        assert [(op, job, outcome) for op, job, outcome in observer.seen] == [
            ("claim_next", lease.job_id, "ok") for lease in leases]
        observer.seen.clear()
        session.claim_next_many("empty-queue", 5)
        assert observer.seen == [("claim_next", None, "empty")]
        observer.seen.clear()
        with pytest.raises(InvalidArgument):
            session.claim_next_many("q", 0)
        assert observer.seen == []  # refused before anything was sent
