"""The leader-election part of the conformance suite: one leader per election, a fencing
token that fences a paused ex-leader, watch-driven handover, leader watches that see
every change in order, and elections that never show up as jobs.

Mixed into :class:`~consensus_lease.testing.conformance.BackendConformance`, so every
backend runs it; it uses that class's hooks (``open``, ``expire``, ``process_url``,
fixtures). A backend whose ``Capabilities.elections`` is ``False`` passes only by raising
``UnsupportedOperation`` from ``campaign``, ``leader`` and ``watch_leader`` (checked in every
test): never a skip.

Timing bounds are generous (a busy CI machine), and the measured latencies are printed
(``pytest -s``) so that a slow store shows up before it fails.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .._election import election_key
from ..election import LeaderRecord, Leadership
from ..errors import (
    ClaimTimeout,
    FenceRejected,
    InvalidArgument,
    LeaseLost,
    UnsupportedOperation,
)
from ..fencing import SqliteFence
from ..session import Session
from ..store import LeaseStore
from .workers import WorkerProcess

__all__ = ["ElectionConformance"]

WAIT_S = 30.0
"""Upper bound for any wait in these tests (they poll, never sleep blindly)."""

HANDOVER_WITHIN_S = 2.0
"""A resignation hands the election to a waiting candidate within this long (the stores
wake waiting candidates by watch or by polling every few tens of milliseconds)."""

PROCESS_TTL_S = 2.0
"""TTL of candidate processes: long enough not to be lost on a busy machine."""

BUSY_MARGIN_S = 1.5
"""Slack on top of "TTL + 1 s" for a takeover after a SIGKILL, for a loaded machine."""


def _poll(predicate: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    give_up = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= give_up:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.01)


def _summary(record: LeaderRecord | None) -> tuple[str, int, bytes] | None:
    return None if record is None else (record.owner, record.generation, record.value)


def _check_order(seen: list[LeaderRecord | None]) -> None:
    """What a leader watch yields: no repeats, generations never going back, and a leader
    reported gone never coming back."""
    highest, gone = -1, False
    for i, record in enumerate(seen):
        if i:
            assert _summary(record) != _summary(seen[i - 1]), seen
        if record is None:
            gone = True
            continue
        assert record.generation > highest if gone else record.generation >= highest, seen
        highest, gone = record.generation, False


def _race(candidates: list[Session], name: str) -> list[Leadership]:
    """Every candidate campaigns once for ``name``, all at once (threads released by a
    barrier); the leaderships won."""
    barrier = threading.Barrier(len(candidates))
    won: list[Leadership] = []
    errors: list[BaseException] = []

    def attempt(session: Session) -> None:
        try:
            barrier.wait(timeout=WAIT_S)
            leadership = session.campaign(name, session.owner.encode())
            if leadership is not None:
                won.append(leadership)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=attempt, args=(c,)) for c in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not errors, errors
    return won


class _Follower:
    """``store.watch_leader(name)`` consumed by a thread, into :attr:`seen`."""

    def __init__(self, store: LeaseStore, name: str) -> None:
        self.watch = store.watch_leader(name, timeout_s=WAIT_S * 4)
        self.seen: list[LeaderRecord | None] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for record in self.watch:
                self.seen.append(record)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def wait_for(self, want: Callable[[LeaderRecord | None], bool]) -> None:
        _poll(lambda: self.seen and want(self.seen[-1]))

    def stop(self) -> list[LeaderRecord | None]:
        self.watch.close()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "watch_leader() did not end after close()"
        assert self.error is None, self.error
        return list(self.seen)


class ElectionConformance:
    """Leader election on every backend."""

    open: Any
    expire: Any
    process_url: Any
    short_ttl_s: float
    long_ttl_s: float

    def _elections_or_declared_absent(self, store: LeaseStore, session: Session) -> bool:
        """True if the backend has elections; otherwise checks that it says so, by
        raising ``UnsupportedOperation`` (a skip would let it pass doing nothing)."""
        if store.capabilities.elections:
            return True
        with pytest.raises(UnsupportedOperation):
            session.campaign("absent")
        with pytest.raises(UnsupportedOperation):
            store.leader("absent")
        with pytest.raises(UnsupportedOperation):
            store.watch_leader("absent")
        return False

    # -- one leader ------------------------------------------------------------------

    def test_election_one_leader_among_threads(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Three candidate sessions campaign at once, five elections in a row: each time
        exactly one leads, and the store's leader record is that one."""
        candidates = [self.open(store, f"T{i}") for i in range(3)]
        if not self._elections_or_declared_absent(store, candidates[0]):
            return
        for round_ in range(5):
            name = f"race-{round_}"
            won = _race(candidates, name)
            assert len(won) == 1, won
            leader = store.leader(name)
            assert leader is not None and leader.owner == won[0].owner
            assert leader.generation == won[0].generation
            assert leader.value == won[0].owner.encode()

    def test_election_leader_record(self, store: LeaseStore, sessions: list[Session]) -> None:
        a = self.open(store, "A")
        if not self._elections_or_declared_absent(store, a):
            return
        assert store.leader("svc") is None
        leadership = a.campaign("svc", b"host-a:8080")
        assert isinstance(leadership, Leadership)
        assert (leadership.name, leadership.value, leadership.owner) == ("svc", b"host-a:8080",
                                                                         "A")
        assert leadership.generation >= 1 and leadership.fencing_token == leadership.generation
        leadership.ensure_held()
        leadership.renew()
        record = store.leader("svc")
        assert record is not None
        assert (record.name, record.owner, record.value, record.generation) == (
            "svc", "A", b"host-a:8080", leadership.generation)
        assert record.lease_until is None or isinstance(record.lease_until, float)
        assert store.leader("other") is None
        assert self.open(store, "B").campaign("svc") is None  # one leader

    # -- handover ----------------------------------------------------------------------

    def test_election_resign_hands_over_to_a_waiting_candidate(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """A leads; B and C wait. A resigns: exactly one of B and C leads, within
        HANDOVER_WITHIN_S (woken by the store, not by the end of a wait), with a higher
        token. It resigns: the other one leads."""
        a, b, c = (self.open(store, n) for n in "ABC")
        if not self._elections_or_declared_absent(store, a):
            return
        first = a.campaign("handover", b"A")
        assert first is not None
        got: list[tuple[float, Leadership]] = []
        errors: list[BaseException] = []

        def wait(session: Session) -> None:
            try:
                leadership = session.campaign("handover", session.owner.encode(), wait_s=WAIT_S)
                got.append((time.monotonic(), leadership))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=wait, args=(s,), daemon=True) for s in (b, c)]
        for t in threads:
            t.start()
        _poll(lambda: len(b.waiters) + len(c.waiters) == 2)  # both wait in the store
        resigned_at = time.monotonic()
        first.resign()
        _poll(lambda: got or errors)
        assert not errors, errors
        latency = got[0][0] - resigned_at
        print(f"\n[{store.backend.scheme}] resign -> next leader: {latency * 1000:.1f} ms")
        assert latency < HANDOVER_WITHIN_S, latency
        second = got[0][1]
        assert second.generation > first.generation
        assert len(got) == 1 and _summary(store.leader("handover")) == (
            second.owner, second.generation, second.owner.encode())
        second.resign()
        _poll(lambda: len(got) == 2 or errors)
        assert not errors, errors
        third = got[1][1]
        assert {second.owner, third.owner} == {"B", "C"}
        assert third.generation > second.generation
        third.resign()
        for t in threads:
            t.join(WAIT_S)

    def test_election_context_manager_resigns(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a, b = self.open(store, "A"), self.open(store, "B")
        if not self._elections_or_declared_absent(store, a):
            return
        with a.campaign("cm", b"v", wait_s=WAIT_S) as leadership:
            leadership.ensure_held()
            with pytest.raises(ClaimTimeout):
                with b.campaign("cm"):  # held elsewhere: no None into the with
                    pass
            with pytest.raises(ClaimTimeout):
                b.campaign("cm", wait_s=0.05)
        assert store.leader("cm") is None
        with pytest.raises(LeaseLost):
            leadership.ensure_held()
        again = b.campaign("cm")
        assert again is not None and again.generation > leadership.generation

    # -- processes -----------------------------------------------------------------------

    def _process_url(self, store: LeaseStore) -> str | None:
        url: str | None = self.process_url(store)
        if not store.capabilities.cross_process:
            assert url is None, "backend declares cross_process=False but gives a process URL"
            return None
        assert url is not None, "backend declares cross_process=True: give process_url()"
        return url

    def _candidates(self, url: str, names: list[str]) -> tuple[list[WorkerProcess], float]:
        """Worker processes with a session each; and the longest TTL granted."""
        workers = [WorkerProcess(n).start() for n in names]
        ttl = 0.0
        for worker in workers:
            reply = worker.request("open", url=url, owner=worker.name, ttl_s=PROCESS_TTL_S)
            assert reply["ok"], reply
            ttl = max(ttl, float(reply["granted_ttl_s"]))
        return workers, ttl

    def test_election_processes_one_leader_and_takeover_after_sigkill(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Three candidate processes campaign: exactly one leads, the others wait. The
        leader is SIGKILLed: one of the other two leads within TTL + 1 s (plus slack for
        a busy machine), with a higher token; still only one."""
        if not self._elections_or_declared_absent(store, self.open(store, "check")):
            return
        url = self._process_url(store)
        if url is None:
            return
        workers, ttl = self._candidates(url, ["P0", "P1", "P2"])
        try:
            sent = {w.name: w.send("campaign", name="proc", value=w.name, wait_s=120)
                    for w in workers}
            leader_record = _poll(lambda: store.leader("proc"))
            leader = next(w for w in workers if w.name == leader_record.owner)
            first = leader.reply(sent[leader.name], WAIT_S)
            assert first["ok"] and first["leader"], first
            assert first["generation"] == leader_record.generation
            others = [w for w in workers if w is not leader]
            killed_at = time.monotonic()
            leader.kill()
            record = _poll(lambda: (r := store.leader("proc")) is not None
                           and r.owner != leader.name and r)
            took = time.monotonic() - killed_at
            print(f"\n[{store.backend.scheme}] SIGKILL -> new leader: {took:.2f} s (TTL {ttl} s)")
            assert took <= ttl + 1.0 + BUSY_MARGIN_S, took
            assert record.generation > leader_record.generation
            winner = next(w for w in others if w.name == record.owner)
            reply = winner.reply(sent[winner.name], WAIT_S)
            assert reply["ok"] and reply["generation"] == record.generation, reply
            loser = next(w for w in others if w is not winner)
            assert loser.alive() and _summary(store.leader("proc")) == (
                winner.name, record.generation, winner.name.encode())
        finally:
            for worker in workers:
                worker.kill()

    def test_election_paused_leader_is_fenced(
        self, store: LeaseStore, sessions: list[Session], tmp_path: Path
    ) -> None:
        """A leads and writes to a fenced destination; A is SIGSTOPped past its TTL; B
        leads with a higher token and writes. A resumes: its ensure_held fails, and its
        late write with its old token is rejected."""
        if not self._elections_or_declared_absent(store, self.open(store, "check")):
            return
        url = self._process_url(store)
        if url is None:
            return
        fence = str(tmp_path / "effects.db")
        workers, _ = self._candidates(url, ["A", "B"])
        a, b = workers
        try:
            led = a.request("campaign", name="paused", value="A")
            assert led["ok"] and led["leader"], led
            assert a.request("fence", path=fence, job="paused", effect="a-1")["ok"]
            waiting = b.send("campaign", name="paused", value="B", wait_s=120)
            a.pause()
            took_over = b.reply(waiting, 120)
            assert took_over["ok"] and took_over["generation"] > led["generation"], took_over
            assert b.request("fence", path=fence, job="paused", effect="b-1")["ok"]
            a.resume()
            held = a.request("ensure_held", job="paused")
            assert not held["ok"] and held["error"] in (
                "LeaseLost", "SessionExpired", "StaleLeaseError"), held
            late = a.request("fence", path=fence, job="paused", effect="a-2")
            assert not late["ok"] and late["error"] == "FenceRejected", late
            proclaimed = a.request("proclaim", job="paused", value="A-again")
            assert not proclaimed["ok"], proclaimed
            assert _summary(store.leader("paused")) == ("B", took_over["generation"], b"B")
        finally:
            for worker in workers:
                worker.kill()  # SIGKILL ends a stopped process too

    # -- a stale leader, in this process (every backend) -------------------------------

    def test_election_stale_leader_rejected_by_store_and_fence(
        self, store: LeaseStore, sessions: list[Session], tmp_path: Path
    ) -> None:
        """A's session expires in the store (A stops renewing, as if paused); B leads. A's
        proclaim and renew are rejected by the store, A fails ensure_held once its local
        deadline passed, and A's late write is rejected after B's first one."""
        a = self.open(store, "A", self.short_ttl_s, keepalive=False)
        b = self.open(store, "B")
        if not self._elections_or_declared_absent(store, a):
            return
        old = a.campaign("stale", b"A")
        assert old is not None
        fence = SqliteFence(str(tmp_path / "effects.db"))
        fence.apply("stale", old.generation, "a-1")
        self.expire(store, a)
        new = b.campaign("stale", b"B", wait_s=10 * self.short_ttl_s + WAIT_S)
        assert new.generation > old.generation
        fence.apply("stale", new.generation, "b-1")
        with pytest.raises(LeaseLost):
            old.proclaim(b"A-again")
        with pytest.raises(LeaseLost):
            old.renew()
        _poll(lambda: old.remaining_s() <= 0, 10 * self.short_ttl_s + WAIT_S)
        with pytest.raises(LeaseLost):
            old.ensure_held()
        with pytest.raises(FenceRejected):
            fence.apply("stale", old.generation, "a-2")
        assert _summary(store.leader("stale")) == ("B", new.generation, b"B")

    # -- values --------------------------------------------------------------------------

    def test_election_proclaim_changes_the_value(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A")
        if not self._elections_or_declared_absent(store, a):
            return
        leadership = a.campaign("announce")
        assert leadership is not None and leadership.value == b""
        record = store.leader("announce")
        assert record is not None and record.value == b""
        for value in (b"v1", b"\x00binary\xff", b""):
            leadership.proclaim(value)
            assert leadership.value == value
            record = store.leader("announce")
            assert record is not None and record.value == value
            assert record.generation == leadership.generation  # same leader, same token
        leadership.resign()
        with pytest.raises(InvalidArgument):
            leadership.proclaim(b"after resigning")
        assert store.leader("announce") is None
        b = self.open(store, "B")
        successor = b.campaign("announce")
        assert successor is not None
        record = store.leader("announce")
        assert record is not None and record.value == b""  # not the last leader's value

    def test_election_never_completed_or_failed(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A")
        if not self._elections_or_declared_absent(store, a):
            return
        leadership = a.campaign("forever")
        assert leadership is not None
        with pytest.raises(InvalidArgument):
            leadership.complete(b"done")
        with pytest.raises(InvalidArgument):
            leadership.fail("oops")
        leadership.ensure_held()
        assert store.leader("forever") is not None

    # -- watching the leader ---------------------------------------------------------------

    def test_election_watch_leader_sees_every_change_in_order(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Nobody; A (value a1); A (a2); nobody; B (b1); nobody (B's session closed): an
        leader watch sees each, in this order, never a repeat nor an older generation."""
        a, b = self.open(store, "A"), self.open(store, "B")
        if not self._elections_or_declared_absent(store, a):
            return
        follower = _Follower(store, "watched")
        try:
            follower.wait_for(lambda r: r is None)
            lead_a = a.campaign("watched", b"a1")
            assert lead_a is not None
            follower.wait_for(lambda r: _summary(r) == ("A", lead_a.generation, b"a1"))
            lead_a.proclaim(b"a2")
            follower.wait_for(lambda r: _summary(r) == ("A", lead_a.generation, b"a2"))
            lead_a.resign()
            follower.wait_for(lambda r: r is None)
            lead_b = b.campaign("watched", b"b1")
            assert lead_b is not None
            follower.wait_for(lambda r: _summary(r) == ("B", lead_b.generation, b"b1"))
            b.close()
            follower.wait_for(lambda r: r is None)
        finally:
            seen = follower.stop()
        _check_order(seen)
        milestones = [None, ("A", lead_a.generation, b"a1"), ("A", lead_a.generation, b"a2"),
                      None, ("B", lead_b.generation, b"b1"), None]
        summaries = iter(_summary(r) for r in seen)
        assert all(m in summaries for m in milestones), seen  # in order

    def test_election_watch_leader_ends_on_timeout_and_on_store_close(
        self, store: LeaseStore
    ) -> None:
        a = store.session("A", self.long_ttl_s)
        if not self._elections_or_declared_absent(store, a):
            a.close()
            return
        started = time.monotonic()
        assert list(store.watch_leader("quiet", timeout_s=0.2)) == [None]
        assert time.monotonic() - started < WAIT_S
        follower = _Follower(store, "quiet")
        follower.wait_for(lambda r: r is None)
        store.close()
        follower._thread.join(WAIT_S)
        assert not follower._thread.is_alive(), "watch_leader() did not end when the store closed"

    # -- elections are not jobs --------------------------------------------------------------

    def test_election_names_never_show_up_as_jobs(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A")
        if not self._elections_or_declared_absent(store, a):
            return
        job = a.claim("report")
        leadership = a.campaign("report", b"v")  # same name as a job: no collision
        assert job is not None and leadership is not None
        other = self.open(store, "B").campaign("nightly")
        assert other is not None
        assert [r.job_id for r in store.records()] == ["report"]
        record = store.get("report")
        assert record is not None and record.generation == job.generation
        if store.capabilities.queues:
            assert store.enqueue("q", "job-1")
            assert [j.record.job_id for j in store.queue_jobs("q")] == ["job-1"]
            next_job = a.claim_next("q")
            assert next_job is not None and next_job.job_id == "job-1"
            assert a.claim_next("q") is None
        jobs = [r.job_id for r in store.records()]
        leadership.resign()
        other.resign()
        assert [r.job_id for r in store.records()] == jobs
        assert jobs == (["job-1", "report"] if store.capabilities.queues else ["report"])

    def test_election_reserved_job_id_prefix_rejected(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A")
        key = election_key("x")
        for call in (lambda: a.claim(key), lambda: store.get(key),
                     lambda: a.claim_many([key]), lambda: store.enqueue("q", key)):
            with pytest.raises(InvalidArgument, match="reserved"):
                call()
        assert store.records() == []

    def test_election_bad_input_rejected(self, store: LeaseStore, sessions: list[Session]) -> None:
        a = self.open(store, "A")
        if not self._elections_or_declared_absent(store, a):
            return
        for bad in ("", "a\x00b", "x" * 254, 42, None, b"bytes"):
            with pytest.raises(InvalidArgument):
                a.campaign(bad)
            with pytest.raises(InvalidArgument):
                store.leader(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            a.campaign("ok", "text")
        with pytest.raises(InvalidArgument):
            a.campaign("ok", wait_s=-1)
        with pytest.raises(InvalidArgument):
            store.watch_leader("ok", timeout_s=-1)
        assert a.campaign("x" * 253) is not None  # the longest name
        leadership = a.campaign("ok")
        assert leadership is not None
        with pytest.raises(InvalidArgument):
            a.campaign("ok")  # this session already leads it
        assert store.records() == []

    # -- asyncio ---------------------------------------------------------------------------

    def test_election_async_campaign_watch_leader_and_loss(self, store: LeaseStore) -> None:
        """asyncio: campaign, leader, watch_leader as an async iterator, and loss of the
        leadership delivered as cancellation of the guarded work."""
        from ..aio import AsyncLeaseStore

        async def main() -> None:
            astore = AsyncLeaseStore(store)
            session = await astore.session("A", self.short_ttl_s)
            if not store.capabilities.elections:
                with pytest.raises(UnsupportedOperation):
                    await session.campaign("async")
                return
            seen: list[tuple[str, int, bytes] | None] = []

            async def follow() -> None:
                async with astore.watch_leader("async", timeout_s=WAIT_S) as leaders:
                    async for leader in leaders:
                        seen.append(_summary(leader))
                        if leader is not None and leader.value == b"v2":
                            return

            watcher = asyncio.create_task(follow())
            leadership = await session.campaign("async", b"v1", wait_s=WAIT_S)
            assert leadership is not None
            assert (await astore.leader("async")) is not None
            await leadership.proclaim(b"v2")
            await asyncio.wait_for(watcher, WAIT_S)
            assert seen[-1] == ("A", leadership.generation, b"v2")
            finished = False
            with pytest.raises(LeaseLost):
                async with leadership.guard():
                    await asyncio.to_thread(self.expire, store, session.sync)
                    await asyncio.sleep(10 * self.short_ttl_s + WAIT_S)  # never checks
                    finished = True
            assert not finished
            await session.close()

        asyncio.run(asyncio.wait_for(main(), 10 * self.short_ttl_s + 2 * WAIT_S))
