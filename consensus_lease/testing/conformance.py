"""The conformance suite every backend passes. Subclass it once per backend::

    from consensus_lease.testing.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        short_ttl_s = 1.0

        def open_store_for_test(self):
            return open_store("mystore://.../fresh-prefix")   # empty, isolated

        def process_url(self):
            return "mystore://.../same-prefix"                 # other processes see the same data

Hooks a subclass provides:

* ``open_store_for_test()`` (required): a new :class:`~consensus_lease.LeaseStore` on empty,
  isolated data. Called once per test; the suite closes it.
* ``process_url(store)``: a URL with which another OS process opens the *same* data, or
  ``None`` — which must agree with ``capabilities.cross_process`` (checked).
* ``expire(store, session)``: make the store expire a session as if its TTL ran out. The
  default calls the backend's ``expire_session(session_id)`` hook (memory, SQLite, etcd:
  lease revoke, ZooKeeper: session expiry from a second client); without one it lets the
  TTL run out in real time (bounded by ``10 x short_ttl_s``).
* ``short_ttl_s``: a TTL the store grants and that tests may wait out (default 1.0 s).
* ``regress(store, between)``: make the store's history go back to before ``between()``
  ran (required with ``capabilities.regression_refusal``; see
  :mod:`.conformance_regression`).
* ``effect_target(store)``: how a caller connects to the store's own database, and a
  table of the test's there (required with ``capabilities.transactions``; see
  :mod:`.conformance_transactions`).

What a backend cannot do is declared in its
:class:`~consensus_lease.backend.Capabilities`; tests check the declaration is true
instead of skipping, so a backend never passes by doing nothing.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..clock import FakeClock, SkewedClock
from ..errors import (
    ClaimTimeout,
    InvalidArgument,
    JobCompleted,
    LeaseLost,
    SessionExpired,
    StaleLeaseError,
    UnsupportedOperation,
)
from ..lease import Lease
from ..record import ClaimResult, JobState
from ..session import Session
from ..states import LeaseState, SessionState
from ..store import LeaseStore
from ..validation import MAX_JOB_ID_BYTES
from .conformance_async import AsyncConformance
from .conformance_batch import BatchConformance
from .conformance_completion import CompletionConformance
from .conformance_depth import QueueDepthConformance
from .conformance_election import ElectionConformance
from .conformance_ending import EndingConformance
from .conformance_epoch import EpochConformance
from .conformance_lifecycle import LifecycleConformance
from .conformance_queue_batch import QueueBatchConformance
from .conformance_regression import RegressionConformance
from .conformance_transactions import TransactionConformance
from .conformance_usage import UsageConformance

__all__ = ["BackendConformance", "poll_until"]

def poll_until(predicate: Any, timeout_s: float, interval_s: float = 0.02) -> Any:
    """Call ``predicate()`` until it returns a truthy value or ``timeout_s`` passes.
    Returns the value; raises AssertionError on timeout. Bounded in time and count."""
    give_up = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= give_up:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


_valid_job_ids = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
    min_size=1,
    max_size=64,
)

_CLAIM_SCRIPT = """
import json, sys
from consensus_lease import open_store
store = open_store(sys.argv[1])
session = store.session(sys.argv[3], ttl_s=float(sys.argv[4]))
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
lease = session.claim(sys.argv[2])
print(json.dumps(None if lease is None else lease.generation), flush=True)
sys.stdin.readline()
session.close()
"""


class BackendConformance(
    LifecycleConformance, EpochConformance, UsageConformance, AsyncConformance,
    ElectionConformance, BatchConformance, QueueDepthConformance, RegressionConformance,
    TransactionConformance, CompletionConformance, QueueBatchConformance, EndingConformance,
):
    """The suite. See the module docstring for the hooks."""

    short_ttl_s: float = 1.0
    long_ttl_s: float = 30.0

    # -- hooks ---------------------------------------------------------------------

    def open_store_for_test(self) -> LeaseStore:
        raise NotImplementedError("subclasses return a store on fresh, isolated data")

    def process_url(self, store: LeaseStore) -> str | None:
        return None

    def expire(self, store: LeaseStore, session: Session) -> None:
        hook = getattr(store.backend, "expire_session", None)
        if hook is not None:
            hook(session.session_id)
            return
        give_up = time.monotonic() + 10 * self.short_ttl_s
        while time.monotonic() < give_up:
            try:
                store.backend.keepalive(session.handle)
            except SessionExpired:
                return
            time.sleep(self.short_ttl_s / 4)  # letting the store's TTL run out
        raise AssertionError("the store did not expire the session")

    # -- fixtures ------------------------------------------------------------------

    @pytest.fixture
    def store(self) -> Iterator[LeaseStore]:
        store = self.open_store_for_test()
        try:
            yield store
        finally:
            store.close()

    @pytest.fixture
    def sessions(self, store: LeaseStore) -> Iterator[list[Session]]:
        """Sessions opened through ``self.open(...)`` are closed after the test."""
        opened: list[Session] = []
        self._opened = opened
        yield opened
        for session in opened:
            session.close()

    def open(self, store: LeaseStore, owner: str, ttl_s: float | None = None, **kw: Any) -> Session:
        session = store.session(owner, self.long_ttl_s if ttl_s is None else ttl_s, **kw)
        getattr(self, "_opened", []).append(session)
        return session

    def _assert_newer(self, store: LeaseStore, old: int, new: int) -> None:
        assert new > old
        if store.capabilities.consecutive_generations:
            assert new == old + 1

    # -- the seed's worked example ---------------------------------------------------

    def test_worked_example(self, store: LeaseStore, sessions: list[Session]) -> None:
        """A claims; A's TTL runs out in the store (A stops renewing, as if paused);
        B claims a newer generation; A's renew and completion are rejected by the store;
        A can no longer pass ensure_held; B completes; nobody claims it again."""
        a = self.open(store, "worker-A", self.short_ttl_s, keepalive=False)
        b = self.open(store, "worker-B")
        lease_a = a.claim("invoice-42")
        assert lease_a is not None
        assert b.claim("invoice-42") is None
        record = store.get("invoice-42")
        assert record is not None and record.state is JobState.HELD
        assert record.owner == "worker-A" and record.generation == lease_a.generation

        # No keepalive from A: wait (bounded) until the store hands the job to B.
        lease_b = b.claim("invoice-42", wait_s=10 * self.short_ttl_s + 5)
        assert lease_b is not None
        self._assert_newer(store, lease_a.generation, lease_b.generation)

        with pytest.raises(LeaseLost):
            lease_a.renew()
        with pytest.raises(LeaseLost):
            lease_a.ensure_held()
        with pytest.raises(LeaseLost) as stale:
            lease_a.complete(b"from A")
        assert stale.value.job_id == "invoice-42"

        record = lease_b.complete(b"from B")
        assert record.state is JobState.COMPLETED
        assert record.generation == lease_b.generation
        assert record.result == b"from B"
        c = self.open(store, "worker-C")
        with pytest.raises(JobCompleted) as done:
            c.claim("invoice-42")
        assert done.value.generation == lease_b.generation

    # -- claiming --------------------------------------------------------------------

    def test_first_claim_and_record(self, store: LeaseStore, sessions: list[Session]) -> None:
        assert store.get("never-seen") is None
        a = self.open(store, "A")
        lease = a.claim("job-1")
        assert lease is not None and lease.generation >= 1
        assert lease.state is LeaseState.HELD
        assert lease.owner == "A" and lease.job_id == "job-1"
        assert 0 < lease.remaining_s() <= a.granted_ttl_s
        lease.ensure_held()
        record = store.get("job-1")
        assert record is not None
        assert (record.job_id, record.owner, record.generation, record.state) == (
            "job-1", "A", lease.generation, JobState.HELD,
        )
        assert [r.job_id for r in store.records()] == ["job-1"]

    def test_claim_held_job_returns_none(self, store: LeaseStore, sessions: list[Session]) -> None:
        a, b = self.open(store, "A"), self.open(store, "B")
        lease = a.claim("job")
        assert lease is not None
        assert b.claim("job") is None
        with pytest.raises(ClaimTimeout) as timeout:
            b.claim("job", wait_s=0.2)
        assert timeout.value.job_id == "job"
        with pytest.raises(InvalidArgument):
            a.claim("job")  # already held by this very session
        lease.ensure_held()  # nothing above disturbed the holder

    def test_threads_race_one_winner_per_generation(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        workers = [self.open(store, f"T{i}") for i in range(6)]
        for round_ in range(3):
            job = f"race-{round_}"
            barrier = threading.Barrier(len(workers))
            won: list[int] = []
            errors: list[BaseException] = []

            def attempt(session: Session, job: str = job, barrier: Any = barrier,
                        won: list[int] = won, errors: list[BaseException] = errors) -> None:
                try:
                    barrier.wait(timeout=30)
                    lease = session.claim(job)
                    if lease is not None:
                        won.append(lease.generation)
                except BaseException as exc:  # reported below
                    errors.append(exc)

            threads = [threading.Thread(target=attempt, args=(s,)) for s in workers]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert not errors, errors
            assert len(won) == 1, f"{len(won)} winners for {job}: {won}"

    def test_processes_race_one_winner(self, store: LeaseStore) -> None:
        url = self.process_url(store)
        if not store.capabilities.cross_process:
            assert url is None, "backend declares cross_process=False but gives a process URL"
            return
        assert url is not None, "backend declares cross_process=True: give process_url()"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CLAIM_SCRIPT, url, "proc-race", f"P{i}", "30"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for i in range(4)
        ]
        try:
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr
            for p in procs:  # release them as close together as we can
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            results = []
            for p in procs:
                assert p.stdout is not None
                results.append(p.stdout.readline().strip())
            winners = [r for r in results if r not in ("null", "")]
            assert len(winners) == 1, results
            record = store.get("proc-race")
            assert record is not None and record.state is JobState.HELD
            assert record.generation == int(winners[0])
        finally:
            for p in procs:
                try:
                    p.communicate("bye\n", timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()

    def test_claim_after_expiry_increments_generation(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A", self.short_ttl_s, keepalive=False)
        b = self.open(store, "B")
        first = a.claim("job")
        assert first is not None
        self.expire(store, a)
        second = poll_until(lambda: b.claim("job"), timeout_s=10 * self.short_ttl_s + 5)
        self._assert_newer(store, first.generation, second.generation)
        record = store.get("job")
        assert record is not None and record.owner == "B"
        assert record.generation == second.generation

    def test_generation_strictly_increases_over_many_claims(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A")
        seen: list[int] = []
        for _ in range(5):
            lease = a.claim("cycle")
            assert lease is not None
            seen.append(lease.generation)
            lease.release()
        assert seen == sorted(set(seen)), seen

    # -- stale holders ---------------------------------------------------------------

    def test_stale_renew_release_complete_rejected(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A", self.short_ttl_s, keepalive=False)
        b = self.open(store, "B")
        old = a.claim("job")
        assert old is not None
        self.expire(store, a)
        new = poll_until(lambda: b.claim("job"), timeout_s=10 * self.short_ttl_s + 5)
        # Straight to the backend, as a holder that ignored its local deadline would.
        backend = store.backend
        for call in (
            lambda: backend.renew(a.handle, "job", old.claim_result),
            lambda: backend.release(a.handle, "job", old.claim_result),
            lambda: backend.complete(a.handle, "job", old.claim_result, b"stale"),
        ):
            with pytest.raises(LeaseLost):
                call()
        # The new holder's generation presented by the old session: owner mismatch.
        with pytest.raises(StaleLeaseError):
            backend.complete(b.handle, "job", ClaimResult(old.generation), b"wrong generation")
        record = store.get("job")
        assert record is not None and record.state is JobState.HELD
        assert record.generation == new.generation and record.owner == "B"
        new.ensure_held()
        assert new.complete(b"ok").generation == new.generation

    def test_stale_completion_seven_after_eight(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """A completion carrying an older generation than the current claim is rejected
        even when it comes from the session that holds the newer one."""
        a = self.open(store, "A")
        first = a.claim("job")
        assert first is not None
        first.release()
        second = a.claim("job")
        assert second is not None and second.generation > first.generation
        with pytest.raises(StaleLeaseError) as exc:
            store.backend.complete(a.handle, "job", first.claim_result, b"stale")
        assert exc.value.generation == first.generation
        record = store.get("job")
        assert record is not None and record.state is JobState.HELD
        second.complete(b"fresh")

    # -- completion ------------------------------------------------------------------

    def test_completed_job_never_claimed_again(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a, b = self.open(store, "A"), self.open(store, "B")
        lease = a.claim("once")
        assert lease is not None
        record = lease.complete(b"\x00\xffresult")
        assert record.result == b"\x00\xffresult" and record.state is JobState.COMPLETED
        assert lease.state is LeaseState.COMPLETED
        for session in (a, b):
            with pytest.raises(JobCompleted):
                session.claim("once")
            with pytest.raises(JobCompleted):
                session.claim("once", wait_s=0.5)
        a.close()  # closing the completer's session changes nothing
        after = store.get("once")
        assert after is not None and after.state is JobState.COMPLETED
        assert after.generation == lease.generation and after.result == b"\x00\xffresult"

    def test_retried_completion_is_recognised(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A")
        lease = a.claim("retry")
        assert lease is not None
        first = lease.complete(b"r1")
        assert lease.complete(b"r1") == first  # local: no second round trip
        # A retry that reaches the store (the first answer was lost in transit).
        again = store.backend.complete(a.handle, "retry", lease.claim_result, b"r1")
        assert again.state is JobState.COMPLETED and again.generation == lease.generation
        assert again.result == b"r1"

    # -- release / close / context manager ------------------------------------------------

    def test_release_makes_job_claimable_at_once(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a, b = self.open(store, "A"), self.open(store, "B")
        lease = a.claim("job")
        assert lease is not None
        lease.release()
        lease.release()  # idempotent
        assert lease.state is LeaseState.RELEASED
        with pytest.raises(LeaseLost):
            lease.ensure_held()
        record = store.get("job")
        assert record is not None and record.state is JobState.AVAILABLE
        taken = b.claim("job")
        assert taken is not None
        self._assert_newer(store, lease.generation, taken.generation)

    def test_waiting_claim_takes_over_on_release(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a, b = self.open(store, "A"), self.open(store, "B")
        lease = a.claim("job")
        assert lease is not None
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(b.claim("job", wait_s=20)))
        waiter.start()
        lease.release()
        waiter.join(timeout=30)
        assert got and got[0] is not None
        self._assert_newer(store, lease.generation, got[0].generation)

    def test_context_manager(self, store: LeaseStore, sessions: list[Session]) -> None:
        a, b = self.open(store, "A"), self.open(store, "B")
        with a.claim("cm", wait_s=1) as lease:
            lease.ensure_held()
            ran = False
            with pytest.raises(ClaimTimeout):
                with b.claim("cm", wait_s=0.2):
                    ran = True
            assert not ran, "the body ran without the lease"
        record = store.get("cm")
        assert record is not None and record.state is JobState.AVAILABLE  # released on exit
        with pytest.raises(RuntimeError):
            with b.claim("cm", wait_s=1) as lease_b:
                raise RuntimeError("work failed")
        assert lease_b.state is LeaseState.RELEASED
        with b.claim("cm", wait_s=1) as lease_c:
            lease_c.complete(b"done")
        record = store.get("cm")
        assert record is not None and record.state is JobState.COMPLETED

    def test_close_session_releases_everything(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a, b = self.open(store, "A"), self.open(store, "B")
        held = [a.claim(f"job-{i}") for i in range(5)]
        assert all(held) and len(a.leases()) == 5
        a.close()
        assert a.state is SessionState.CLOSED
        for lease in held:
            assert lease is not None
            with pytest.raises(LeaseLost):
                lease.ensure_held()
        for i in range(5):
            assert b.claim(f"job-{i}") is not None

    def test_closed_session_is_reported_as_session_expired(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """After ``session.close()`` every store answers a lease of that session the same
        way (the contract in :meth:`Backend.complete <consensus_lease.backend.Backend.complete>`):
        ``SessionExpired`` while the store still shows the lease's generation (the end of
        the session is why it is not held; for a newer claim see the next test). Plain and
        queued jobs, the lease's own calls and the backend's, and ``set_value`` where the
        store has elections."""
        a = self.open(store, "A")
        plain = [a.claim(f"closed-{i}") for i in range(3)]
        queued: list[Lease] = []
        if store.capabilities.queues:
            for i in range(4):
                store.enqueue("closed-q", f"closed-q-{i}", b"p")
            queued = [lease for _ in range(4) if (lease := a.claim_next("closed-q")) is not None]
            assert len(queued) == 4
        leader = a.campaign("closed-e") if store.capabilities.elections else None
        assert all(plain)
        a.close()
        backend = store.backend
        for lease in [*plain, *queued]:
            assert lease is not None
            with pytest.raises(LeaseLost):
                lease.renew()  # a local refusal: the session is closed; nothing sent
            job_id, claim = lease.job_id, lease.claim_result
            with pytest.raises(SessionExpired):
                backend.renew(a.handle, job_id, claim)
            with pytest.raises(SessionExpired):
                backend.release(a.handle, job_id, claim)
            with pytest.raises(SessionExpired):
                backend.fail(a.handle, job_id, claim, "e", 0.0)
            with pytest.raises(SessionExpired):
                backend.complete(a.handle, job_id, claim, b"r")
        first, second, third = plain
        assert first is not None and second is not None and third is not None
        with pytest.raises(SessionExpired):
            first.complete(b"r")
        with pytest.raises(SessionExpired):
            second.release()
        with pytest.raises(SessionExpired):
            third.fail("e")
        if leader is not None:
            with pytest.raises(SessionExpired):
                backend.set_value(a.handle, leader.job_id, leader.claim_result, b"v")

    def test_released_then_closed_session_is_session_expired(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """A job released by its holder and claimed by nobody since is still at the
        lease's generation with no other holder: once the session is over, a request on
        that lease is ``SessionExpired`` (the rule of :meth:`Backend.complete
        <consensus_lease.backend.Backend.complete>`), not stale. Found by the
        differential test (:mod:`consensus_lease.testing.differential`) on PostgreSQL."""
        a = self.open(store, "A")
        lease = a.claim("released-closed")
        assert lease is not None
        backend, job_id, claim = store.backend, lease.job_id, lease.claim_result
        backend.release(a.handle, job_id, claim)
        with pytest.raises(StaleLeaseError):
            backend.renew(a.handle, job_id, claim)  # released, the session alive: stale
        a.close()
        with pytest.raises(SessionExpired):
            backend.renew(a.handle, job_id, claim)
        with pytest.raises(SessionExpired):
            backend.complete(a.handle, job_id, claim, b"r")
        with pytest.raises(SessionExpired):
            backend.fail(a.handle, job_id, claim, "e", 0.0)
        with pytest.raises(SessionExpired):
            backend.release(a.handle, job_id, claim)

    def test_closed_session_after_a_newer_claim_is_stale(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """After ``session.close()``, once another session has claimed the job the newer
        generation is the reason (``StaleLeaseError`` with ``current_generation``; the
        contract in :meth:`Backend.complete <consensus_lease.backend.Backend.complete>`),
        whether that session still holds the job, released it, or completed it."""
        a = self.open(store, "A")
        old = a.claim("closed-then-claimed")
        assert old is not None
        a.close()
        backend = store.backend
        b = self.open(store, "B")
        newer = b.claim(old.job_id)
        assert newer is not None and newer.generation > old.generation

        def stale_since(current: int) -> None:
            for call in (lambda: backend.complete(a.handle, old.job_id, old.claim_result,
                                                  b"late"),
                         lambda: backend.release(a.handle, old.job_id, old.claim_result),
                         lambda: backend.renew(a.handle, old.job_id, old.claim_result)):
                with pytest.raises(StaleLeaseError) as exc:
                    call()
                assert exc.value.current_generation == current

        with pytest.raises(StaleLeaseError) as exc:
            old.complete(b"late")
        assert exc.value.current_generation == newer.generation
        stale_since(newer.generation)  # B holds it
        record = store.get(old.job_id)
        assert record is not None and record.state is JobState.HELD
        assert record.generation == newer.generation and record.owner == "B"
        newer.release()
        stale_since(newer.generation)  # B claimed and released it: nobody holds it
        last = b.claim(old.job_id)
        assert last is not None
        last.complete(b"b's")
        stale_since(last.generation)  # B claimed and completed it

    # -- liveness --------------------------------------------------------------------

    def test_keepalive_holds_lease_past_ttl(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A", self.short_ttl_s)
        b = self.open(store, "B")
        lease = a.claim("kept")
        assert lease is not None
        end = time.monotonic() + 3 * self.short_ttl_s
        while time.monotonic() < end:  # real time must pass for a TTL to matter
            lease.ensure_held()
            assert b.claim("kept") is None
            time.sleep(self.short_ttl_s / 5)
        assert lease.state is LeaseState.HELD

    def test_store_expiry_is_reported_not_swallowed(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A", self.short_ttl_s, keepalive=False)
        lease = a.claim("job")
        assert lease is not None
        called: list[LeaseLost] = []
        a.on_lost(lambda _session, reason: called.append(reason))
        self.expire(store, a)
        with pytest.raises(SessionExpired):
            poll_until(lambda: a.keepalive() and False, timeout_s=10 * self.short_ttl_s + 5)
        assert a.state is SessionState.LOST and a.lost.is_set()
        # The callback runs in whichever thread saw the loss first (a store event may
        # beat our keepalive): wait for it, then make sure it ran exactly once.
        poll_until(lambda: called, timeout_s=5.0)
        assert len(called) == 1
        assert lease.state is LeaseState.LOST
        with pytest.raises(LeaseLost):
            lease.ensure_held()
        with pytest.raises(LeaseLost):
            a.claim("other")

    def test_local_deadline_stops_effects_without_the_store(self, store: LeaseStore) -> None:
        """A worker that cannot renew stops at send time + TTL - margin on its own
        monotonic clock, without asking the store."""
        clock = FakeClock()
        session = store.session("A", self.long_ttl_s, keepalive=False, clock=clock)
        try:
            lease = session.claim("job")
            assert lease is not None
            margin = session.safety_margin_s
            assert session.deadline == pytest.approx(
                clock.monotonic() + session.granted_ttl_s - margin
            )
            clock.advance(session.granted_ttl_s - margin - 0.01)
            lease.ensure_held()
            clock.advance(0.02)
            with pytest.raises(LeaseLost):
                lease.ensure_held()
            assert lease.state is LeaseState.LOST
        finally:
            session.close()

    def test_renewal_deadline_counts_from_send_time(self, store: LeaseStore) -> None:
        clock = FakeClock()
        session = store.session("A", self.long_ttl_s, keepalive=False, clock=clock)
        try:
            sent_at = clock.monotonic()
            real_keepalive = store.backend.keepalive

            def slow_keepalive(handle: Any) -> float:
                clock.advance(5.0)  # the answer arrives 5 s after the request was sent
                return real_keepalive(handle)

            setattr(store.backend, "keepalive", slow_keepalive)  # noqa: B010
            try:
                session.keepalive()
            finally:
                delattr(store.backend, "keepalive")
            assert session.deadline == pytest.approx(
                sent_at + session.granted_ttl_s - session.safety_margin_s
            )
        finally:
            session.close()

    @pytest.mark.parametrize("offset_s", [3600.0, -3600.0])
    def test_worker_clock_skew_changes_nothing(
        self, store: LeaseStore, sessions: list[Session], offset_s: float
    ) -> None:
        skewed = self.open(store, "skewed", clock=SkewedClock(offset_s))
        honest = self.open(store, "honest")
        lease = skewed.claim("job")
        assert lease is not None
        lease.ensure_held()
        lease.renew()
        assert honest.claim("job") is None
        assert 0 < lease.remaining_s() <= skewed.granted_ttl_s
        record = store.get("job")
        assert record is not None and record.state is JobState.HELD
        assert lease.complete(b"ok").state is JobState.COMPLETED

    def test_many_leases_one_session(self, store: LeaseStore, sessions: list[Session]) -> None:
        a = self.open(store, "A")
        leases = a.claim_many([f"m-{i}" for i in range(20)])
        assert all(lease is not None for lease in leases)
        assert len(a.leases()) == 20
        a.keepalive()  # one renewal covers all of them
        for lease in leases:
            assert lease is not None
            lease.ensure_held()
        b = self.open(store, "B")
        assert b.claim_many(["m-0", "m-1", "fresh"])[:2] == [None, None]

    # -- bad input -------------------------------------------------------------------

    @pytest.mark.parametrize(
        "bad",
        ["", "a\x00b", "x" * (MAX_JOB_ID_BYTES + 1), "é" * 129, 42, None, b"bytes", "\ud800"],
    )
    def test_bad_job_ids_rejected_and_nothing_written(
        self, store: LeaseStore, sessions: list[Session], bad: Any
    ) -> None:
        a = self.open(store, "A")
        with pytest.raises(InvalidArgument):
            a.claim(bad)
        with pytest.raises(InvalidArgument):
            store.get(bad)
        assert store.records() == []

    @pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), 1e12, "10", True])
    def test_bad_ttls_rejected(self, store: LeaseStore, bad: Any) -> None:
        with pytest.raises(InvalidArgument):
            store.session("A", bad)

    def test_bad_wait_and_result_rejected(self, store: LeaseStore, sessions: list[Session]) -> None:
        a = self.open(store, "A")
        bad_waits: list[Any] = [-1, float("nan"), "5"]
        for bad in bad_waits:
            with pytest.raises(InvalidArgument):
                a.claim("job", wait_s=bad)
        assert store.records() == []
        lease = a.claim("job")
        assert lease is not None
        with pytest.raises(InvalidArgument):
            lease.complete("not bytes")  # type: ignore[arg-type]
        lease.ensure_held()  # still held
        with pytest.raises(InvalidArgument):
            a.claim_many(["x", "x"])

    @settings(max_examples=25, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.differing_executors])
    @given(job_ids=st.lists(_valid_job_ids, min_size=1, max_size=4, unique=True))
    def test_any_valid_job_id_round_trips(
        self, store: LeaseStore, sessions: list[Session], job_ids: list[str]
    ) -> None:
        if not getattr(self, "_hypothesis_session", None):
            self._hypothesis_session = self.open(store, "H")
        session = self._hypothesis_session
        for job_id in job_ids:
            try:
                lease = session.claim(job_id)
            except JobCompleted:  # drawn (and completed) in an earlier example
                continue
            assert lease is not None
            record = store.get(job_id)
            assert record is not None and record.job_id == job_id
            assert record.generation == lease.generation
            lease.complete(job_id.encode("utf-8", "surrogatepass"))
        for job_id in job_ids:
            record = store.get(job_id)
            assert record is not None and record.state is JobState.COMPLETED
            assert record.result == job_id.encode("utf-8", "surrogatepass")

    # -- work queues -----------------------------------------------------------------

    def _queues_or_declared_absent(self, store: LeaseStore) -> bool:
        """True if the backend has queues; otherwise checks that it says so explicitly."""
        if store.capabilities.queues:
            return True
        with pytest.raises(UnsupportedOperation):
            store.enqueue("q", "job")
        return False

    def test_queue_claims_each_job_once_with_payload(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        if not self._queues_or_declared_absent(store):
            return
        for i in range(3):
            assert store.enqueue("emails", f"mail-{i}", f"payload-{i}".encode()) is True
        assert store.enqueue("emails", "mail-0", b"other") is False  # idempotent
        a = self.open(store, "A")
        got = [a.claim_next("emails") for _ in range(3)]
        assert all(lease is not None for lease in got)
        names = sorted(lease.job_id for lease in got if lease is not None)
        assert names == ["mail-0", "mail-1", "mail-2"]
        for lease in got:
            assert lease is not None
            assert lease.payload == f"payload-{lease.job_id[-1]}".encode()
        assert a.claim_next("emails") is None
        assert self.open(store, "B").claim_next("emails") is None
        assert a.claim_next("no-such-queue") is None

    def test_queue_released_job_comes_back_completed_never(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        if not self._queues_or_declared_absent(store):
            return
        store.enqueue("q", "j1")
        store.enqueue("q", "j2")
        a, b = self.open(store, "A"), self.open(store, "B")
        first = a.claim_next("q")
        second = a.claim_next("q")
        assert first is not None and second is not None
        first.release()
        second.complete(b"done")
        again = b.claim_next("q")
        assert again is not None and again.job_id == first.job_id
        self._assert_newer(store, first.generation, again.generation)
        assert b.claim_next("q") is None  # the completed one never comes back
        stats = store.queue_stats("q")
        assert (stats.available, stats.held, stats.completed) == (0, 1, 1)
        assert store.purge("q") == 1
        assert [j.record.job_id for j in store.queue_jobs("q")] == [again.job_id]
        assert store.queue_stats("q").completed == 0

    def test_queue_expired_holder_job_is_claimable(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        if not self._queues_or_declared_absent(store):
            return
        store.enqueue("q", "j")
        a = self.open(store, "A", self.short_ttl_s, keepalive=False)
        b = self.open(store, "B")
        held = a.claim_next("q")
        assert held is not None
        self.expire(store, a)
        taken = b.claim_next("q", wait_s=10 * self.short_ttl_s + 5)
        assert taken is not None and taken.job_id == "j"
        self._assert_newer(store, held.generation, taken.generation)

    def test_queue_workers_race_every_job_done_once(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        if not self._queues_or_declared_absent(store):
            return
        jobs = [f"job-{i:02d}" for i in range(24)]
        for job in jobs:
            store.enqueue("race", job)
        workers = [self.open(store, f"W{i}") for i in range(4)]
        done: dict[str, list[str]] = {w.owner: [] for w in workers}
        errors: list[BaseException] = []

        def work(session: Session) -> None:
            try:
                for _ in range(len(jobs) + 5):  # bounded
                    lease = session.claim_next("race")
                    if lease is None:
                        return
                    lease.complete(session.owner.encode())
                    done[session.owner].append(lease.job_id)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        completed = sorted(j for got in done.values() for j in got)
        assert completed == jobs  # every job exactly once
        for job in jobs:
            record = store.get(job)
            assert record is not None and record.state is JobState.COMPLETED

    def test_queue_waiter_is_woken_by_enqueue(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        if not self._queues_or_declared_absent(store):
            return
        a = self.open(store, "A")
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(a.claim_next("later", wait_s=30)))
        waiter.start()
        store.enqueue("later", "j", b"p")
        waiter.join(timeout=40)
        assert got and got[0] is not None and got[0].payload == b"p"
        with pytest.raises(ClaimTimeout):
            a.claim_next("later", wait_s=0.2)

    def test_queue_bad_input(self, store: LeaseStore, sessions: list[Session]) -> None:
        if not self._queues_or_declared_absent(store):
            return
        too_big = b"x" * (store.capabilities.max_payload_bytes + 1)
        with pytest.raises(InvalidArgument):
            store.enqueue("q", "big", too_big)
        with pytest.raises(InvalidArgument):
            store.enqueue("q", "str-payload", "text")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            store.enqueue("", "j")
        assert store.queue_jobs("q") == []
        store.enqueue("q1", "shared")
        with pytest.raises(InvalidArgument):
            store.enqueue("q2", "shared")
        empty = store.queue_stats("nothing-here")
        assert (empty.available, empty.held, empty.completed) == (0, 0, 0)

    # -- asyncio ---------------------------------------------------------------------

    def test_async_claim_complete(self, store: LeaseStore) -> None:
        from ..aio import AsyncLeaseStore

        async def main() -> None:
            astore = AsyncLeaseStore(store)
            async with astore.session("A", self.long_ttl_s) as a:
                lease = await a.claim("async-job", wait_s=5)
                assert lease is not None
                async with astore.session("B", self.long_ttl_s) as b:
                    assert await b.claim("async-job") is None
                async with lease.guard():
                    record = await lease.complete(b"async")
                assert record.state is JobState.COMPLETED

        asyncio.run(asyncio.wait_for(main(), 60))

    def test_async_work_cancelled_when_store_expires_session(self, store: LeaseStore) -> None:
        """The store expires the session while guarded work runs: the keepalive learns
        it, and the work is cancelled with LeaseLost — without the work ever checking."""
        from ..aio import AsyncLeaseStore

        async def main() -> None:
            astore = AsyncLeaseStore(store)
            session = await astore.session("A", self.short_ttl_s)
            lease = await session.claim("guarded")
            assert lease is not None
            finished = False
            with pytest.raises(LeaseLost):
                async with lease.guard():
                    await asyncio.to_thread(self.expire, store, session.sync)
                    await asyncio.sleep(10 * self.short_ttl_s + 30)  # never checks the lease
                    finished = True
            assert not finished
            await session.close()

        asyncio.run(asyncio.wait_for(main(), 10 * self.short_ttl_s + 60))
