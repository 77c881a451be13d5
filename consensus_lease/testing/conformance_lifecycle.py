"""The job-lifecycle part of the conformance suite: attempts, ``fail()``, retry delays
on the store's clock, FAILED (dead letter) and ``requeue``.

Mixed into :class:`~consensus_lease.testing.conformance.BackendConformance`, so every
backend runs it; it uses that class's hooks (``open``, ``expire``, fixtures).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest

from ..errors import (
    InvalidArgument,
    JobFailed,
    LeaseError,
    LeaseLost,
    SessionExpired,
    StaleLeaseError,
    UnsupportedOperation,
)
from ..lease import Lease
from ..record import JobState, LeaseRecord
from ..retry import RetryPolicy
from ..session import Session
from ..states import LeaseState
from ..store import LeaseStore

__all__ = ["LifecycleConformance"]

RETRY_IN_S = 0.5
"""The retry delay the tests ask for; a store may round it up (etcd: whole seconds)."""

WAIT_S = 30.0
"""Upper bound for any wait in these tests (they poll the store, never sleep blindly)."""


class LifecycleConformance:
    """Attempts, failure and dead letters, on every backend."""

    open: Any
    expire: Any
    process_url: Any
    short_ttl_s: float
    long_ttl_s: float

    def test_fail_retries_after_store_delay_then_dead_letters(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """A handler that always fails, max_attempts=3, retry_in_s=0.5: exactly three
        claims, each at least 0.5 s (worker-measured from the fail's send to the next
        claim's answer) after the previous failure; then FAILED with the last error and
        attempt 3; claim refuses it with JobFailed; requeue makes it attempt 4."""
        worker = self.open(store, "W")
        assert store.enqueue("lq", "always-fails", b"p", max_attempts=3)
        failed_sent_at: float | None = None
        for attempt in (1, 2, 3):
            lease = worker.claim_next("lq", wait_s=WAIT_S)
            claimed_at = time.monotonic()
            assert lease is not None and lease.attempt == attempt
            assert lease.payload == b"p"
            if failed_sent_at is not None:
                assert claimed_at - failed_sent_at >= RETRY_IN_S
            failed_sent_at = time.monotonic()
            record = lease.fail(f"boom {attempt}", retry_in_s=RETRY_IN_S)
            assert lease.state is LeaseState.FAILED
            with pytest.raises(LeaseLost):
                lease.ensure_held()
            expected = JobState.FAILED if attempt == 3 else JobState.AVAILABLE
            assert record.state is expected and record.attempt == attempt
            assert record.error == f"boom {attempt}"
        assert worker.claim_next("lq") is None
        with pytest.raises(JobFailed) as refused:
            worker.claim("always-fails")
        assert refused.value.attempt == 3 and refused.value.error == "boom 3"
        record = store.get("always-fails")
        assert record is not None and record.state is JobState.FAILED
        assert record.max_attempts == 3 and record.error == "boom 3"
        assert store.queue_stats("lq").failed == 1
        again = store.requeue("always-fails")
        assert again.state is JobState.AVAILABLE and again.attempt == 3
        lease = worker.claim_next("lq", wait_s=WAIT_S)
        assert lease is not None and lease.job_id == "always-fails" and lease.attempt == 4
        lease.complete(b"finally")

    def test_expired_attempts_count_and_dead_letter(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Leases that end without completion use up attempts: with max_attempts=2 and
        two expired holders, the next claim moves the job to FAILED (JobFailed)."""
        store.enqueue("lq", "keeps-dying", max_attempts=2)
        for attempt in (1, 2):
            dying = self.open(store, f"dying-{attempt}", self.short_ttl_s, keepalive=False)
            lease = dying.claim_next("lq", wait_s=WAIT_S)
            assert lease is not None and lease.attempt == attempt
            self.expire(store, dying)
        survivor = self.open(store, "survivor")
        deadline = time.monotonic() + WAIT_S
        with pytest.raises(JobFailed):
            while time.monotonic() < deadline:
                claimed = survivor.claim("keeps-dying")
                assert claimed is None, "a job whose attempts ran out was claimed again"
                time.sleep(0.05)  # poll interval while the store's TTL runs out
        record = store.get("keeps-dying")
        assert record is not None and record.state is JobState.FAILED
        assert record.attempt == 2 and record.error is not None
        assert "without completion" in record.error
        assert survivor.claim_next("lq") is None

    def test_retry_delay_is_on_the_store_and_waiting_claim_gets_it(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A")
        lease = a.claim("delayed")
        assert lease is not None and lease.attempt == 1
        sent = time.monotonic()
        record = lease.fail(ValueError("bad input row 7"), retry_in_s=RETRY_IN_S)
        assert record.state is JobState.AVAILABLE
        assert record.error == "ValueError: bad input row 7"
        b = self.open(store, "B")
        early = b.claim("delayed")
        if early is not None:  # only possible if the delay already passed
            assert time.monotonic() - sent >= RETRY_IN_S
            early.release()
        later = b.claim("delayed", wait_s=WAIT_S)
        assert later is not None and later.attempt >= 2
        assert time.monotonic() - sent >= RETRY_IN_S
        assert later.generation > lease.generation

    def test_zero_delay_and_unlimited_attempts(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A")
        for attempt in range(1, 5):
            lease = a.claim("unlimited", wait_s=WAIT_S)
            assert lease is not None and lease.attempt == attempt
            assert lease.fail("again", retry_in_s=0).state is JobState.AVAILABLE

    def test_policy_decides_delay_and_limit(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        store.set_retry_policy("pq", RetryPolicy(max_attempts=1, initial_s=0.0))
        store.enqueue("pq", "one-shot")
        record = store.get("one-shot")
        assert record is not None and record.max_attempts == 1
        lease = self.open(store, "A").claim_next("pq", wait_s=WAIT_S)
        assert lease is not None
        assert lease.fail("no retries").state is JobState.FAILED

    def test_stale_fail_rejected_by_store(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A", self.short_ttl_s, keepalive=False)
        old = a.claim("stale-fail")
        assert old is not None
        self.expire(store, a)
        b = self.open(store, "B")
        new = b.claim("stale-fail", wait_s=WAIT_S)
        assert new is not None
        with pytest.raises(LeaseLost):
            old.fail("too late", retry_in_s=0)
        record = store.get("stale-fail")
        assert record is not None and record.state is JobState.HELD
        assert record.generation == new.generation and record.error is None
        with pytest.raises(StaleLeaseError):
            store.backend.fail(b.handle, "stale-fail", old.claim_result, "x", 0.0)

    def test_lifecycle_bad_input_changes_nothing(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A")
        lease = a.claim("bad-input")
        assert lease is not None
        for error, retry in ((b"bytes", 0), (None, 0), ("nul\0", 0), ("x", -1),
                             ("x", float("nan")), ("x", True), ("x" * 70_000, 0)):
            with pytest.raises(InvalidArgument):
                lease.fail(error, retry_in_s=retry)
        lease.ensure_held()
        with pytest.raises(InvalidArgument):
            store.requeue("bad-input")  # held, not FAILED
        with pytest.raises(InvalidArgument):
            store.requeue("never-seen-job")
        bad: Any
        for bad in (0, -1, 1.5, True, "3", 2**40):
            with pytest.raises(InvalidArgument):
                store.enqueue("lq", "bad-limit", max_attempts=bad)
        assert store.get("bad-limit") is None
        for policy in ({"max_attempts": 0}, {"initial_s": -1.0}, {"multiplier": 0.5}):
            with pytest.raises(InvalidArgument):
                RetryPolicy(**policy)
        lease.complete(b"ok")

    # -- the worker runner and ``consensus-lease run`` on this store -------------------

    def test_worker_runner_drains_queue(self, store: LeaseStore) -> None:
        """``run_worker`` (two thread slots) over a queue with one job that always fails:
        every other job completed once, the failing one FAILED after its attempts."""
        from ..worker import run_worker

        for i in range(12):
            store.enqueue("wq", f"w-{i}", str(i).encode(), max_attempts=2)
        seen: list[tuple[str, int]] = []

        def handler(lease: Any, payload: bytes) -> bytes:
            lease.ensure_held()
            seen.append((lease.job_id, lease.attempt))
            if lease.job_id == "w-3":
                from ..worker import Retry

                raise Retry(0.0)
            return payload

        stats = run_worker(store, "wq", handler, concurrency=2, ttl_s=self.long_ttl_s,
                           until_empty=True, claim_wait_s=0.2, grace_s=5.0)
        assert stats.completed == 11 and stats.dead_lettered == 1
        assert sorted(seen).count(("w-3", 1)) == 1 and ("w-3", 2) in seen
        for i in range(12):
            record = store.get(f"w-{i}")
            assert record is not None
            if i == 3:
                assert record.state is JobState.FAILED and record.attempt == 2
            else:
                assert record.state is JobState.COMPLETED and record.result == str(i).encode()
        stats_q = store.queue_stats("wq")
        assert (stats_q.completed, stats_q.failed, stats_q.available) == (11, 1, 0)

    def test_batched_worker_runner_drains_queue(self, store: LeaseStore) -> None:
        """``run_worker`` with prefetch and batched completion (two slots, ``prefetch=4``,
        ``complete_batch=8``, ``complete_flush_s=0.1``): every job run once and COMPLETED
        once with its handler's result; completions went in ``complete_many`` batches."""
        from ..worker import run_worker

        knobs: dict[str, Any] = {"prefetch": 4, "complete_batch": 8, "complete_flush_s": 0.1}
        if not store.capabilities.queues:  # the declared capability, not a skip
            with pytest.raises(UnsupportedOperation):
                run_worker(store, "bwq", lambda lease, payload: b"", **knobs)
            return
        n = 40
        store.enqueue_many("bwq", [(f"b-{i}", str(i).encode()) for i in range(n)])
        runs: Counter[str] = Counter()
        lock = threading.Lock()

        def handler(lease: Lease, payload: bytes) -> bytes:
            lease.ensure_held()
            with lock:
                runs[lease.job_id] += 1
            # work until a lease is claimed ahead (or none is left): on a fast store the
            # slot's own claim would otherwise always come first
            give_up = time.monotonic() + WAIT_S
            while (len(lease.session.leases()) < 2
                   and store.queue_stats("bwq").available > 0):
                assert time.monotonic() < give_up, "no lease was prefetched"
                time.sleep(0.01)  # poll interval
            return b"r-" + payload

        stats = run_worker(store, "bwq", handler, concurrency=2, ttl_s=self.long_ttl_s,
                           until_empty=True, claim_wait_s=0.2, grace_s=5.0, **knobs)
        assert stats.stopped_by == "drained", stats
        assert stats.errors == stats.leases_lost == stats.skipped == 0, stats
        assert runs == Counter({f"b-{i}": 1 for i in range(n)})
        assert stats.completed == stats.claimed == stats.batched_completions == n, stats
        assert stats.prefetched > 0 and stats.prefetch_dropped == stats.released == 0, stats
        assert stats.fused_claims == 0 and 1 <= stats.complete_batches < n, stats
        for i in range(n):
            record = store.get(f"b-{i}")
            assert record is not None and record.state is JobState.COMPLETED, record
            assert record.result == f"r-{i}".encode() and record.attempt == 1
        stats_q = store.queue_stats("bwq")
        assert (stats_q.completed, stats_q.available, stats_q.held) == (n, 0, 0)

    def test_batched_worker_runner_refuses_a_taken_over_lease_at_flush(
        self, store: LeaseStore, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """The first job's hold is ended in the store behind the runner's back and
        another session claims a newer generation, before the runner's batch is
        flushed: in that ``complete_many`` the stale item is refused (StaleLeaseError)
        while the batch's other items commit; the runner counts it in ``leases_lost``
        and logs it (never ``completed``, never a "job completed" line), and the job
        keeps the newer holder's completion."""
        from ..worker import run_worker

        if not store.capabilities.queues:  # covered by the drain case above
            return
        n = 8
        store.enqueue_many("swq", [f"s-{i}" for i in range(n)])
        other = store.session("other", self.long_ttl_s)
        taken: list[Lease] = []  # [the runner's stale lease, the other's newer one]

        def handler(lease: Lease, payload: bytes) -> bytes:
            if not taken:
                store.backend.release(lease.session.handle, lease.job_id, lease.claim_result)
                newer = other.claim(lease.job_id)
                assert newer is not None and newer.generation > lease.generation
                taken.extend((lease, newer))
            return b"worker"

        flushes = _record_flushes(monkeypatch, taken)
        caplog.set_level(logging.INFO, logger="consensus_lease.worker")
        try:
            stats = run_worker(store, "swq", handler, ttl_s=self.long_ttl_s, until_empty=True,
                               claim_wait_s=0.2, grace_s=5.0, prefetch=4, complete_batch=n,
                               complete_flush_s=5.0)
        finally:
            other.close()
        stale, newer = taken
        batch = next(answers for answers in flushes if stale.job_id in answers)
        assert len(batch) > 1, flushes  # the stale item shared its batch with others
        assert isinstance(batch.pop(stale.job_id), StaleLeaseError), flushes
        assert all(isinstance(a, LeaseRecord) for a in batch.values()), flushes
        assert stats.stopped_by == "drained" and stats.errors == stats.skipped == 0, stats
        assert (stats.completed, stats.leases_lost, stats.batched_completions) == (
            n - 1, 1, n), stats
        record = store.get(stale.job_id)
        assert record is not None and record.state is JobState.COMPLETED
        assert (record.generation, record.result) == (newer.generation, b"other")
        assert stale.state is LeaseState.LOST
        about = [r for r in caplog.records if r.name == "consensus_lease.worker"
                 and getattr(r, "job_id", None) == stale.job_id
                 and getattr(r, "generation", None) == stale.generation]
        assert not [r for r in about if r.getMessage() == "job completed"], about
        lost = [r for r in about if r.levelno == logging.WARNING
                and r.getMessage().startswith("lease lost")]
        assert len(lost) == 1 and "StaleLeaseError" in str(getattr(lost[0], "reason", ""))

    def test_batched_worker_runner_refuses_completions_of_an_expired_session(
        self, store: LeaseStore, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """The store expires the runner's session while the first job's completion is
        queued and the second job runs: at the flush the store refuses both items
        (SessionExpired each), the runner counts them in ``leases_lost`` and logs them,
        counts the session lost, drops the leases it had prefetched on it, opens a new
        session and runs those two jobs again: every job COMPLETED once in the store."""
        from ..worker import run_worker

        if not store.capabilities.queues:  # covered by the drain case above
            return
        n = 8
        store.enqueue_many("ewq", [f"e-{i}" for i in range(n)])
        expired: list[Lease] = []  # the two leases of the expired session

        def handler(lease: Lease, payload: bytes) -> bytes:
            if len(expired) < 2 and not any(x.session is not lease.session for x in expired):
                expired.append(lease)
                if len(expired) == 2:
                    self.expire(store, lease.session)
                    with pytest.raises(LeaseLost):
                        lease.session.keepalive()  # the runner's session knows it now
            return lease.job_id.encode()

        flushes = _record_flushes(monkeypatch, [])
        caplog.set_level(logging.INFO, logger="consensus_lease.worker")
        stats = run_worker(store, "ewq", handler, ttl_s=self.long_ttl_s, until_empty=True,
                           claim_wait_s=0.2, grace_s=5.0, prefetch=4, complete_batch=n,
                           complete_flush_s=5.0)
        refused = {job: a for answers in flushes for job, a in answers.items()
                   if not isinstance(a, LeaseRecord)}
        assert sorted(refused) == sorted(x.job_id for x in expired), flushes
        assert all(isinstance(a, SessionExpired) for a in refused.values()), refused
        assert stats.stopped_by == "drained" and stats.errors == stats.skipped == 0, stats
        assert (stats.completed, stats.leases_lost, stats.sessions_lost) == (n, 2, 1), stats
        assert stats.claimed == n + 2, stats  # the two again; dropped ones are not worked
        for i in range(n):
            record = store.get(f"e-{i}")
            assert record is not None and record.state is JobState.COMPLETED, record
            assert record.result == f"e-{i}".encode()
        lost = [r for r in caplog.records if r.name == "consensus_lease.worker"
                and r.levelno == logging.WARNING and r.getMessage().startswith("lease lost")]
        assert sorted((getattr(r, "job_id", None), getattr(r, "generation", None))
                      for r in lost) == sorted((x.job_id, x.generation) for x in expired)

    def test_run_command_holds_the_lease(self, store: LeaseStore) -> None:
        """``consensus-lease run --complete`` runs the command with the token in its
        environment and completes the job; a second run exits 65 (completed)."""
        url = self.process_url(store)
        if not store.capabilities.cross_process:  # the declared capability, not a skip
            assert url is None, "backend declares cross_process=False but gives a process URL"
            return
        assert url is not None, "backend declares cross_process=True: give process_url()"
        import subprocess
        import sys

        child = ("import os; env = os.environ; "
                 "print(env['CONSENSUS_LEASE_TOKEN'], env['CONSENSUS_LEASE_ATTEMPT'])")
        command = [sys.executable, "-m", "consensus_lease.cli", "run", "--backend", url,
                   "--job", "cron-1", "--ttl-s", str(self.long_ttl_s), "--complete", "--",
                   sys.executable, "-c", child]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        token, attempt = done.stdout.split()
        record = store.get("cron-1")
        assert record is not None and record.state is JobState.COMPLETED
        assert record.generation == int(token) and attempt == "1"
        again = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert again.returncode == 65, again.stderr


def _record_flushes(monkeypatch: pytest.MonkeyPatch,
                    taken: list[Lease]) -> list[dict[str, LeaseRecord | LeaseError]]:
    """Record each ``Session.complete_many`` call's answers by job id; after the call
    that answered ``taken[0]`` (the stale lease), the newer holder ``taken[1]`` completes
    its job (so that the queue drains), and not before: the stale item is decided by
    the store while the newer lease still holds the job."""
    flushes: list[dict[str, LeaseRecord | LeaseError]] = []
    original = Session.complete_many

    def complete_many(session: Session, leases: Any) -> list[LeaseRecord | LeaseError]:
        answers = original(session, leases)
        items = [item[0] if isinstance(item, tuple) else item for item in leases]
        flushes.append({lease.job_id: a for lease, a in zip(items, answers, strict=True)})
        if taken and any(lease is taken[0] for lease in items):
            taken[1].complete(b"other")
        return answers

    monkeypatch.setattr(Session, "complete_many", complete_many)
    return flushes
