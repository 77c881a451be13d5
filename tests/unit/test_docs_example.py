"""The worked example test shown on the docs' "Testing your service" page (included from
this file, so the page shows a test that runs): a worker paused past its TTL loses the job
to another, and its late write is rejected by the fence. No sleep: the store's clock and
the workers' clocks are one FakeClock, and the test moves it."""

from __future__ import annotations

from pathlib import Path

import pytest

# --8<-- [start:example]
from consensus_lease import FenceOutcome, FenceRejected, LeaseLost, SqliteFence, open_store
from consensus_lease.testing import FakeClock


def test_a_worker_paused_past_its_ttl_cannot_write(tmp_path: Path) -> None:
    clock = FakeClock()                                    # time moves only on advance()
    fence = SqliteFence(str(tmp_path / "effects.db"))      # the destination under test
    with open_store("memory://", store_clock=clock) as store:
        a = store.session(owner="A", ttl_s=2.0, clock=clock)
        lease_a = a.claim("invoice-42")
        assert lease_a is not None
        assert fence.apply("invoice-42", lease_a.generation, "reserve") is FenceOutcome.ACCEPTED

        clock.advance(3.0)                                 # A is "paused" past its TTL

        b = store.session(owner="B", ttl_s=2.0, clock=clock)
        lease_b = b.claim("invoice-42")                    # the store gave the job to B
        assert lease_b is not None and lease_b.generation > lease_a.generation
        assert fence.apply("invoice-42", lease_b.generation, "reserve") is FenceOutcome.ACCEPTED

        with pytest.raises(LeaseLost):                     # A's local check says so ...
            lease_a.ensure_held()
        with pytest.raises(FenceRejected):                 # ... and its late write is refused
            fence.apply("invoice-42", lease_a.generation, "charge")

        lease_b.complete(b"paid")
        record = store.get("invoice-42")
        assert record is not None and record.owner == "B" and record.result == b"paid"
        a.close()
        b.close()
# --8<-- [end:example]
