"""The transactional-fencing part of the conformance suite: ``lease.transaction(conn)``
and its once-per-job records ``tx.once(effect_id)``, on every store that declares
``capabilities.transactions`` (PostgreSQL, SQLite); the others must refuse it with
``UnsupportedOperation`` (checked, never skipped).

* A holder stopped (SIGSTOP) inside its block past its TTL, the job re-claimed at the
  next generation after the holder resumed and committed, both running the documented
  handler: exactly one effect row for the job.
* A ``StaleLeaseError`` or ``SessionExpired`` at the start of the block leaves the lease
  and the session exactly as the same refusal through ``renew()`` does.
* ``leadership.transaction``: ``tx.once`` is once per *election* across its leaders.
* asyncio: ``await lease.run_in_transaction(conn, block)`` runs the same handler on the
  store's threads, once per job across generations, and an error in ``block`` rolls
  back.

Hook (with ``capabilities.transactions``): ``effect_target(store)``, an
:class:`EffectTarget` naming how a caller connects to the store's database and a table
of the test's own there. Mixed into
:class:`~consensus_lease.testing.conformance.BackendConformance`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from ..errors import (
    InvalidArgument,
    LeaseLost,
    SessionExpired,
    StaleLeaseError,
    UnsupportedOperation,
)
from ..lease import Lease
from ..record import JobState
from ..session import Session
from ..states import LeaseState, SessionState
from ..store import LeaseStore

__all__ = ["EffectTarget", "TransactionConformance", "charge_once", "connect_effects"]

WAIT_S = 30.0
"""Upper bound for any wait in these tests."""


@dataclass(frozen=True)
class EffectTarget:
    """Where the test's effects go: the store's own database.

    Attributes:
        driver: ``"psycopg"`` (``dsn`` is a libpq URL) or ``"sqlite3"`` (``dsn`` is the
            store's file).
        dsn: what the driver connects with.
        table: a table name (qualified if need be) the test may create there.
    """

    driver: str
    dsn: str
    table: str


def connect_effects(target: EffectTarget) -> Any:
    """A new connection of the caller's to the store's database, outside a transaction
    (psycopg: ``autocommit=True``; sqlite3: ``isolation_level=None``)."""
    if target.driver == "psycopg":
        import psycopg

        return psycopg.connect(target.dsn, autocommit=True, connect_timeout=10)
    if target.driver == "sqlite3":
        return sqlite3.connect(target.dsn, isolation_level=None, timeout=WAIT_S,
                               check_same_thread=False)  # asyncio: used on a pool thread
    raise ValueError(f"unknown effect driver {target.driver!r}")


def _effects_table(target: EffectTarget) -> str:
    """The store's once records, named as ``target.table`` is qualified."""
    schema, dot, _ = target.table.rpartition(".")
    return f"{schema}{dot}cl_effects"


def _mark(target: EffectTarget) -> str:
    return "%s" if target.driver == "psycopg" else "?"


def charge_once(lease: Lease, conn: Any, target: EffectTarget, who: str) -> bool:
    """The documented handler: the effect is written only if ``tx.once`` says no
    generation of this job wrote it. Returns whether this call wrote it."""
    mark = _mark(target)
    with lease.transaction(conn) as tx:
        if not tx.once("charge"):
            return False
        conn.execute(f"INSERT INTO {target.table} VALUES ({mark}, {mark}, {mark})",
                     (lease.job_id, lease.generation, who))
        return True


HOLDER = r"""
import json, sys
from consensus_lease import LeaseLost, open_store
from consensus_lease.testing.conformance_transactions import EffectTarget, connect_effects
url, driver, dsn, table, job, ttl = sys.argv[1:7]
target = EffectTarget(driver, dsn, table)
mark = "%s" if driver == "psycopg" else "?"
def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n"); sys.stdout.flush()
store = open_store(url)
session = store.session("A", ttl_s=float(ttl))
lease = session.claim(job)
conn = connect_effects(target)
try:
    with lease.transaction(conn) as tx:
        if tx.once("charge"):
            conn.execute(f"INSERT INTO {table} VALUES ({mark}, {mark}, {mark})",
                         (job, lease.generation, "A"))
        say(step="written", generation=lease.generation)
        sys.stdin.readline()   # stopped here by the test, past the TTL, then let go on
    say(step="committed")
except Exception as exc:
    say(step="commit-failed", error=type(exc).__name__)
try:
    lease.complete(b"A")
    say(step="complete", lost=False)
except Exception as exc:
    say(step="complete", lost=isinstance(exc, LeaseLost), error=type(exc).__name__)
conn.close()
store.close()
"""


class TransactionConformance:
    """Mixed into the suite; uses its hooks (``open``, ``process_url``, ``expire``)."""

    short_ttl_s: float
    long_ttl_s: float

    def open(self, store: LeaseStore, owner: str, ttl_s: float | None = None,
             **kw: Any) -> Session:
        raise NotImplementedError

    def process_url(self, store: LeaseStore) -> str | None:
        raise NotImplementedError

    def expire(self, store: LeaseStore, session: Session) -> None:
        raise NotImplementedError

    def effect_target(self, store: LeaseStore) -> EffectTarget | None:
        """Hook: required with ``capabilities.transactions`` (module docstring)."""
        return None

    def _target(self, store: LeaseStore) -> EffectTarget | None:
        target = self.effect_target(store)
        if store.capabilities.transactions:
            assert target is not None, "capabilities.transactions needs effect_target()"
        return target

    def _effects(self, target: EffectTarget) -> list[tuple[Any, ...]]:
        conn = connect_effects(target)
        try:
            return [tuple(row) for row in conn.execute(
                f"SELECT job_id, generation, who FROM {target.table} ORDER BY generation"
            ).fetchall()]
        finally:
            conn.close()

    def _create_table(self, target: EffectTarget) -> None:
        conn = connect_effects(target)
        try:
            conn.execute(f"CREATE TABLE {target.table} "
                         "(job_id text, generation bigint, who text)")
        finally:
            conn.close()

    def test_transactions_capability_is_true(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Without ``transactions`` the block is refused before anything is checked or
        sent; with it, the documented handler writes its effect once per job."""
        lease = self.open(store, "A").claim("txn-cap")
        assert lease is not None
        target = self._target(store)
        if target is None:
            with pytest.raises(UnsupportedOperation):
                with lease.transaction(object()):
                    pytest.fail("the block must not run")
            lease.ensure_held()
            return
        self._create_table(target)
        conn = connect_effects(target)
        try:
            assert charge_once(lease, conn, target, "A") is True
            assert charge_once(lease, conn, target, "A") is False  # same generation
            lease.release()
            again = self.open(store, "B").claim("txn-cap")
            assert again is not None and again.generation > lease.generation
            assert charge_once(again, conn, target, "B") is False  # any generation
            again.complete()
        finally:
            conn.close()
        assert self._effects(target) == [("txn-cap", lease.generation, "A")]

    def test_holder_paused_in_the_block_past_its_ttl_effect_once_per_job(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """The issue-31 run in small: A is stopped inside its block past its TTL, the
        store expires it, A resumes and commits; B claims the next generation and runs
        the same handler, which skips the effect: one row for the job."""
        target, url = self._target(store), self.process_url(store)
        if target is None or url is None:
            return  # no transactions: test_transactions_capability_is_true covers it
        self._create_table(target)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, url, target.driver, target.dsn, target.table,
             "invoice-1", str(self.short_ttl_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ},
        )
        assert holder.stdin is not None and holder.stdout is not None
        try:
            said = json.loads(holder.stdout.readline() or "{}")
            assert said == {"step": "written", "generation": said.get("generation")}, said
            first = int(said["generation"])
            os.kill(holder.pid, signal.SIGSTOP)
            from .conformance import poll_until

            def expired() -> bool:  # on the store's clock, A's hold ran out
                record = store.get("invoice-1")
                return record is not None and record.state is JobState.AVAILABLE

            poll_until(expired, WAIT_S, interval_s=0.05)
            holder.stdin.write("go\n")
            holder.stdin.flush()
            os.kill(holder.pid, signal.SIGCONT)
            assert json.loads(holder.stdout.readline()) == {"step": "committed"}
            b = self.open(store, "B")
            lease = b.claim("invoice-1", wait_s=WAIT_S)
            assert lease is not None and lease.generation > first
            conn = connect_effects(target)
            try:
                assert charge_once(lease, conn, target, "B") is False
            finally:
                conn.close()
            lease.complete(b"B")
            said = json.loads(holder.stdout.readline())
            assert (said["step"], said["lost"]) == ("complete", True), said
            assert holder.wait(WAIT_S) == 0
        finally:
            if holder.poll() is None:
                os.kill(holder.pid, signal.SIGCONT)
                holder.kill()
                holder.wait(WAIT_S)
        assert self._effects(target) == [("invoice-1", first, "A")]

    def test_purge_drops_the_effect_records_with_their_jobs(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """The once records live as long as their job's record: ``purge`` of COMPLETED
        jobs deletes them in the same transaction; other jobs' records stay."""
        target = self._target(store)
        if target is None or not store.capabilities.queues:
            return  # no transactions: test_transactions_capability_is_true covers it
        self._create_table(target)
        session = self.open(store, "A")
        store.enqueue("txn-q", "done")
        store.enqueue("txn-q", "open")
        conn = connect_effects(target)
        try:
            for _ in range(2):
                lease = session.claim_next("txn-q", wait_s=WAIT_S)
                assert lease is not None
                assert charge_once(lease, conn, target, lease.job_id)
                if lease.job_id == "done":
                    lease.complete()
            effects = f"SELECT job_id FROM {_effects_table(target)} ORDER BY job_id"
            assert [r[0] for r in conn.execute(effects).fetchall()] == ["done", "open"]
            assert store.purge("txn-q") == 1
            assert [r[0] for r in conn.execute(effects).fetchall()] == ["open"]
        finally:
            conn.close()

    def test_leadership_transaction_is_once_per_election(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """A Leadership is a Lease: its block commits only while it leads, and ``tx.once``
        is True for one leader of the election only."""
        target = self._target(store)
        if target is None or not store.capabilities.elections:
            return  # no transactions: test_transactions_capability_is_true covers it
        self._create_table(target)
        conn = connect_effects(target)
        wrote = []
        try:
            for owner in ("leader-1", "leader-2"):
                leadership = self.open(store, owner).campaign("txn-election", wait_s=WAIT_S)
                assert leadership is not None
                wrote.append(charge_once(leadership, conn, target, owner))
                leadership.resign()
        finally:
            conn.close()
        assert wrote == [True, False]
        rows = self._effects(target)
        assert [row[2] for row in rows] == ["leader-1"], rows

    def test_async_run_in_transaction_is_once_per_job(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """asyncio: the handler as a block run on the store's threads; a raising block
        commits nothing (its once record included)."""
        target = self._target(store)
        if target is None:
            return  # no transactions: test_transactions_capability_is_true covers it
        from ..aio import AsyncLeaseStore
        from ..transaction import LeaseTransaction

        self._create_table(target)
        mark = _mark(target)

        async def main(conn: Any) -> list[int]:
            astore = AsyncLeaseStore(store)
            session = await astore.session("A", self.long_ttl_s)
            generations: list[int] = []
            try:
                for _ in range(2):
                    lease = await session.claim("async-job", wait_s=WAIT_S)
                    assert lease is not None

                    def fail(tx: LeaseTransaction, first: bool = not generations) -> None:
                        assert tx.once("charge") is first
                        raise RuntimeError("the block failed")

                    def charge(tx: LeaseTransaction, lease: Any = lease) -> bool:
                        if not tx.once("charge"):
                            return False
                        conn.execute(
                            f"INSERT INTO {target.table} VALUES ({mark}, {mark}, {mark})",
                            (lease.job_id, lease.generation, "async"))
                        return True

                    with pytest.raises(RuntimeError, match="the block failed"):
                        await lease.run_in_transaction(conn, fail)
                    wrote = await lease.run_in_transaction(conn, charge, lock_timeout_s=10.0)
                    assert wrote is (not generations)  # only the first generation writes
                    generations.append(lease.generation)
                    await lease.release()
            finally:
                await session.close()
                await astore.workers.run(lambda: None)  # the pool still answers
                astore.workers.shutdown()
            return generations

        conn = connect_effects(target)
        try:
            first, second = asyncio.run(asyncio.wait_for(main(conn), WAIT_S * 2))
        finally:
            conn.close()
        assert second > first
        assert self._effects(target) == [("async-job", first, "async")]

    def test_refusal_at_the_block_leaves_the_state_renew_leaves(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """StaleLeaseError: the lease LOST and forgotten, the session ACTIVE (as through
        renew); SessionExpired: the session LOST with every lease (as through renew)."""
        target = self._target(store)
        if target is None:
            return  # no transactions: test_transactions_capability_is_true covers it
        conn = connect_effects(target)
        try:
            a = self.open(store, "A")
            by_txn, by_renew = a.claim("txn-stale"), a.claim("renew-stale")
            assert by_txn is not None and by_renew is not None
            for lease in (by_txn, by_renew):  # ended in the store behind the core's back
                store.backend.release(a.handle, lease.job_id, lease.claim_result)
                assert self.open(store, "B").claim(lease.job_id) is not None
            with pytest.raises(StaleLeaseError):
                with by_txn.transaction(conn):
                    pytest.fail("the block must not run")
            with pytest.raises(StaleLeaseError):
                by_renew.renew()
            for lease in (by_txn, by_renew):
                assert lease.state is LeaseState.LOST
                assert lease not in a.leases()
            assert a.state is SessionState.ACTIVE
            assert a.claim("txn-stale") is None  # held by B; not "already holds"

            for how in ("transaction", "renew"):
                s = self.open(store, f"C-{how}", keepalive=False)
                held = s.claim(f"expired-{how}")
                assert held is not None
                self.expire(store, s)
                with pytest.raises(SessionExpired):
                    if how == "renew":
                        held.renew()
                    else:
                        with held.transaction(conn):
                            pytest.fail("the block must not run")
                assert s.state is SessionState.LOST, how
                assert held.state is LeaseState.LOST and s.leases() == []
                with pytest.raises(LeaseLost):
                    held.ensure_held()
        finally:
            conn.close()

    def test_ending_the_lease_or_committing_inside_the_block_is_refused(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """Inside its own block a lease's store calls would wait for the block's lock
        (SQLite's write lock, PostgreSQL's row lock): refused at once, nothing sent, still
        held, and the block still commits. A block that commits its transaction itself
        is told at the block's end: SQLite raises InvalidArgument and rolls back what
        was written after the commit; psycopg refuses the commit itself."""
        target = self._target(store)
        if target is None:
            return  # no transactions: test_transactions_capability_is_true covers it
        self._create_table(target)
        mark = _mark(target)
        insert = f"INSERT INTO {target.table} VALUES ({mark}, {mark}, {mark})"
        lease = self.open(store, "A").claim("txn-misuse")
        assert lease is not None
        conn = connect_effects(target)
        try:
            with lease.transaction(conn):
                conn.execute(insert, (lease.job_id, lease.generation, "in-block"))
                for call in (lambda: lease.complete(b"x"), lease.renew, lease.release,
                             lambda: lease.fail("x"),
                             lambda: lease.session.complete_many([lease]),
                             lambda: lease.transaction(conn).__enter__()):
                    with pytest.raises(InvalidArgument, match="block is open"):
                        call()
                assert lease.state is LeaseState.HELD
            lease.ensure_held()
            if target.driver == "sqlite3":
                refused: type[BaseException] = InvalidArgument
                match = "ended the transaction itself"
            else:
                import psycopg

                refused, match = psycopg.ProgrammingError, "commit"
            with pytest.raises(refused, match=match) as raised:
                with lease.transaction(conn):
                    conn.execute(insert, (lease.job_id, lease.generation, "before"))
                    conn.commit()
                    conn.execute(insert, (lease.job_id, lease.generation, "after"))
            lease.ensure_held()
            lease.complete()
        finally:
            conn.close()
        who = [row[2] for row in self._effects(target)]
        assert "in-block" in who, who
        if target.driver == "sqlite3":  # sqlite3's default mode: the rest is rolled back
            legacy = sqlite3.connect(target.dsn, timeout=WAIT_S)
            again = self.open(store, "B").claim("txn-misuse-legacy")
            assert again is not None
            try:
                with pytest.raises(InvalidArgument, match="after was rolled back"):
                    with again.transaction(legacy):
                        legacy.execute(insert, (again.job_id, 0, "legacy-before"))
                        legacy.commit()
                        legacy.execute(insert, (again.job_id, 0, "legacy-after"))
            finally:
                legacy.close()
            more = [row[2] for row in self._effects(target)]
            assert "legacy-before" in more and "legacy-after" not in more, more
            again.complete()
        # sqlite3 with isolation_level=None commits each statement after the block's own
        # commit at once; the error says so ("WITHOUT the hold check")
        assert ("after" in who) == ("WITHOUT" in str(raised.value)), (who, raised.value)
