"""Failover to a lagging asynchronous standby is detected: a real primary, its streaming
standby (``pg_basebackup -R``), replication cut so that the standby misses the last
claims and completions, the primary killed, the standby promoted (its own throw-away
cluster on 127.0.0.81/82, see :mod:`tests.backends.pg_standby`; a few seconds).

Without ``bump-epoch`` every session and claim reports ``StoreRegressed`` (the holder's
background keepalive ends its session, a newly opened store cannot open one); after it
every token is above every token handed out before, and the completions the standby had
stay, those it had not are lost (their jobs claimable again, above every earlier token).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from pg_standby import StandbyPair, standby_pair

from consensus_lease import JobCompleted, SessionExpired, StoreRegressed, open_store
from consensus_lease.backends.postgresql import PostgresBackend
from consensus_lease.record import ClaimResult
from consensus_lease.testing.conformance import poll_until

TTL_S = 9.0
"""The holder's TTL: its keepalive runs every 3 s, and its session row (replicated)
is still alive on the standby when it is promoted."""


@pytest.fixture
def pair() -> Iterator[StandbyPair]:
    with standby_pair() as started:
        yield started


def regressed(fn: object) -> bool:
    """``fn()`` raises StoreRegressed (anything else, or no error, fails the test)."""
    with pytest.raises(StoreRegressed):
        fn()  # type: ignore[operator]
    return True


def test_a_promoted_lagging_standby_is_store_regressed_until_bump_epoch(
    pair: StandbyPair,
) -> None:
    url = pair.url(schema="cl", timeout_s="2", connect_timeout_s="2")
    store = open_store(url)
    stores = [store]
    try:
        b = store.backend
        assert isinstance(b, PostgresBackend)
        holder = store.session("holder", ttl_s=TTL_S)
        worker = store.session("worker", ttl_s=60.0, keepalive=False)
        tokens: list[int] = []

        def cycle(job: str, end: str) -> None:
            lease = worker.claim(job)
            assert lease is not None
            tokens.append(lease.generation)
            lease.complete(b"r") if end == "complete" else lease.release()

        # Replicated: 5 completions, a job claimed 3 times, the holder's lease, a queue job.
        for i in range(5):
            cycle(f"kept{i}", "complete")
        for _ in range(3):
            cycle("busy", "release")
        held = holder.claim("held")
        assert held is not None
        tokens.append(held.generation)
        store.enqueue("q", "queued")
        pair.wait_replayed()
        pair.cut_replication()
        # Lost with the primary: 5 completions, 3 more claims of "busy" (tokens 4..6).
        for i in range(5):
            cycle(f"lost{i}", "complete")
        for _ in range(3):
            cycle("busy", "release")
        pair.kill_primary()
        pair.promote()
        promoted = time.monotonic()
        assert pair.standby_sql("SELECT generation FROM cl.cl_jobs WHERE job_id = 'busy'") == 3

        # The holder's background keepalive ends its session: ensure_held() says why.
        def holder_lost() -> bool:
            try:
                held.ensure_held()
            except StoreRegressed:
                return True
            return False

        poll_until(holder_lost, 4 * TTL_S)
        detected_after_s = time.monotonic() - promoted
        assert detected_after_s < 4 * TTL_S  # reported (one keepalive: TTL / 3, + reconnect)

        # Every claim and session operation of this store object is refused, on the store.
        h, lease_claim = worker.handle, ClaimResult(tokens[0], 0.0, 1)
        assert regressed(lambda: b.claim(h, "new"))
        assert regressed(lambda: b.claim(h, "lost0"))
        assert regressed(lambda: b.claim_many(h, ["new", "lost1", "busy"]))
        assert regressed(lambda: b.claim_from_queue(h, "q"))
        assert regressed(lambda: b.claim_from_queue_many(h, "q", 3))
        assert regressed(lambda: b.keepalive(h))
        assert regressed(lambda: b.complete(holder.handle, "held", held.claim_result, b"late"))
        assert regressed(lambda: b.renew(holder.handle, "held", held.claim_result))
        assert regressed(lambda: b.release(h, "kept0", lease_claim))
        assert regressed(lambda: worker.claim("other"))
        assert regressed(lambda: b.open_session("again", 30.0))

        # ... and of a store object opened after the promotion.
        fresh = open_store(url)
        stores.append(fresh)
        assert regressed(lambda: fresh.session("new", ttl_s=30.0))
        fb = fresh.backend
        assert regressed(lambda: fb.claim(h, "new"))
        assert regressed(lambda: fb.claim_from_queue(h, "q"))
        assert regressed(lambda: fb.claim_from_queue_many(h, "q", 3))
        assert regressed(lambda: fb.claim_many(h, ["new", "lost2"]))

        # bump-epoch (as the command does it: a store opened on the URL, bump_epoch).
        highest = max(tokens)
        with open_store(url) as admin:
            admin.bump_epoch()
        after = fresh.session("after", ttl_s=30.0)
        for i in range(5):  # completed on the standby too: still completed
            with pytest.raises(JobCompleted):
                after.claim(f"kept{i}")
        new_tokens = []
        for job in [f"lost{i}" for i in range(5)] + ["busy", "held"]:
            lease = after.claim(job)  # lost completions, and the ended holder's job
            assert lease is not None, job
            new_tokens.append(lease.generation)
        nxt = after.claim_next("q")
        assert nxt is not None
        new_tokens.append(nxt.generation)
        assert min(new_tokens) > highest
        with pytest.raises(StoreRegressed):  # the holder's session stays over
            held.ensure_held()
        # the bump deleted the session rows of before the failover: over, not regressed
        with pytest.raises(SessionExpired) as ended:
            b.claim(h, "new")
        assert not isinstance(ended.value, StoreRegressed)
        print(f"failover detected {detected_after_s:.2f} s after promotion")
    finally:
        for s in stores:
            s.close()
