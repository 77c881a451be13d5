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
