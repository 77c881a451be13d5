"""ZooKeeper's ``complete_many``: one multi for a batch of this session's own claims; a
stale item makes that multi apply nothing, and each item is then completed alone (its
own outcome: the others still commit)."""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

from typing import Any

import pytest
from zk_local import zk_target, zk_url  # noqa: F401  (fixtures)

from consensus_lease import open_store
from consensus_lease.errors import StaleLeaseError
from consensus_lease.record import ClaimResult, JobState, LeaseRecord

pytestmark = pytest.mark.containers


def _count_multis(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []
    wire = store.backend._wire
    inner = wire.commit

    def commit(h: Any, build: Any, settle: Any, what: str, *rest: Any) -> Any:
        sent.append(what)
        return inner(h, build, settle, what, *rest)

    monkeypatch.setattr(wire, "commit", commit)
    return sent


def test_complete_many_is_one_multi_and_a_stale_item_falls_back_alone(
    zk_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = open_store(zk_url, connect_timeout_s=30)
    try:
        store.enqueue_many("q", [f"j{i}" for i in range(10)])
        a, b = store.session("A", 30.0), store.session("B", 30.0)
        leases = [lease for lease in a.claim_many([f"j{i}" for i in range(10)]) if lease]
        assert len(leases) == 10
        sent = _count_multis(store, monkeypatch)
        out = a.complete_many([(lease, b"r") for lease in leases[:8]])
        assert sent == ["complete_many"]  # one round trip for 8 completions
        assert all(isinstance(r, LeaseRecord) and r.state is JobState.COMPLETED for r in out)
        stale, fresh = leases[8], leases[9]
        # Released behind the lease's back by a claim without its hold (handle None), so
        # the hold the lease carries still looks current: the batch multi is sent.
        store.backend.release(a.handle, stale.job_id, ClaimResult(stale.generation))
        newer = b.claim(stale.job_id)
        assert newer is not None
        sent.clear()
        out = a.complete_many([stale, fresh])
        assert isinstance(out[0], StaleLeaseError) and isinstance(out[1], LeaseRecord)
        assert sent[0] == "complete_many" and len(sent) <= 3  # the batch, then each alone
        record = store.get(fresh.job_id)
        assert record is not None and record.state is JobState.COMPLETED
        held = store.get(stale.job_id)
        assert held is not None and held.owner == "B"
        a.close()
        b.close()
    finally:
        store.close()
