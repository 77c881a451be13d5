"""The usage-rules part of the conformance suite: what the library does with calls made
at the wrong time, the same on every backend.

* in a child made by ``fork()``, every use of an inherited store, session or lease
  raises ``StoreInherited`` and ``close()`` leaves the parent's session alone;
* after ``store.close()``, session and lease operations raise ``StoreClosed``;
* ``with session.claim(job):`` without ``wait_s`` on a held job raises ``ClaimTimeout``
  instead of entering ``None``;
* a lease ends once: ending it another way afterwards is ``InvalidArgument``.

Mixed into :class:`~consensus_lease.testing.conformance.BackendConformance`, so every
backend runs it; it uses that class's hooks (``open``, ``process_url``, fixtures).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import pytest

from ..errors import ClaimTimeout, InvalidArgument, LeaseLost, StoreClosed
from ..lease import Lease
from ..record import JobState
from ..session import Session
from ..states import LeaseState
from ..store import LeaseStore, open_store

__all__ = ["UsageConformance"]

WAIT_S = 30.0
"""Upper bound for any wait in these tests."""


def _attempts(store: LeaseStore, session: Session, lease: Lease) -> dict[str, Callable[[], Any]]:
    """Every kind of use of an inherited store, session and lease, by name."""
    job = lease.job_id
    return {
        "store.session": lambda: store.session("child"),
        "store.get": lambda: store.get(job),
        "store.records": store.records,
        "store.enqueue": lambda: store.enqueue("forked-q", "forked-job"),
        "session.claim": lambda: session.claim("forked-other"),
        "session.claim_many": lambda: session.claim_many(["forked-other"]),
        "session.keepalive": session.keepalive,
        "session.ensure_alive": session.ensure_alive,
        "lease.ensure_held": lease.ensure_held,
        "lease.renew": lease.renew,
        "lease.complete": lambda: lease.complete(b"from the child"),
        "lease.fail": lambda: lease.fail("from the child"),
        "lease.release": lease.release,
    }


def _forked_child(
    store: LeaseStore, session: Session, lease: Lease, url: str | None, out: Connection
) -> None:
    """Runs in the child: try every use, close the inherited objects, then read the job
    through a store of the child's own. Reports ``{what: outcome}``."""
    seen: dict[str, object] = {}
    for name, attempt in _attempts(store, session, lease).items():
        try:
            attempt()
            seen[name] = "no error"
        except Exception as exc:
            seen[name] = f"{type(exc).__name__}: {exc}"
    try:
        session.close()
        store.close()
        store.close()
        seen["close"] = "ok"
    except Exception as exc:
        seen["close"] = f"{type(exc).__name__}: {exc}"
    if url is not None:
        with open_store(url) as own:
            record = own.get(lease.job_id)
            seen["record"] = None if record is None else (record.state.value, record.owner)
    out.send(seen)
    out.close()


class UsageConformance:
    """Fork safety, use after close, ``with`` without a wait, ending a lease twice."""

    open: Any
    process_url: Any
    short_ttl_s: float
    long_ttl_s: float

    # -- fork ------------------------------------------------------------------------

    def test_forked_child_cannot_use_the_store_and_its_close_spares_the_parent(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """A parent holds a lease; a child made by fork() finds every use refused with
        StoreInherited, closes the inherited store and session, and opens its own. The
        parent still holds the job 2 x TTL later: renew succeeds, the record shows it."""
        parent = self.open(store, "parent", self.short_ttl_s)
        lease = parent.claim("forked")
        assert lease is not None
        url = self.process_url(store)
        ctx = multiprocessing.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_forked_child, args=(store, parent, lease, url, send))
        child.start()
        send.close()
        assert receive.poll(WAIT_S), "the child reported nothing"
        seen = receive.recv()
        child.join(WAIT_S)
        assert child.exitcode == 0
        refused = {k: v for k, v in seen.items() if k not in ("close", "record")}
        assert refused and all(str(v).startswith("StoreInherited:") for v in refused.values()), (
            refused
        )
        assert "fork()" in str(refused["session.claim"])
        assert seen["close"] == "ok"
        if url is not None:
            assert seen["record"] == (JobState.HELD.value, "parent")
        until = time.monotonic() + 2 * parent.granted_ttl_s
        while time.monotonic() < until:  # the parent's hold, checked for 2 x TTL
            record = store.get("forked")
            assert record is not None and record.state is JobState.HELD
            assert record.owner == "parent" and lease.state is LeaseState.HELD
            time.sleep(parent.granted_ttl_s / 10)
        lease.renew()
        assert lease.complete(b"parent").state is JobState.COMPLETED

    # -- after store.close() -----------------------------------------------------------

    def test_operations_after_store_close_raise_store_closed(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a = self.open(store, "A")
        leases: list[Lease] = []
        for job in ("c1", "c2", "c3", "c4", "c5"):
            lease = a.claim(job)
            assert lease is not None
            leases.append(lease)
        done = leases.pop()
        done.complete(b"ok")
        store.close()
        operations: dict[str, Callable[[], Any]] = {
            "complete": lambda: leases[0].complete(b"late"),
            "release": leases[1].release,
            "renew": leases[2].renew,
            "fail": lambda: leases[3].fail("late"),
            "complete again": lambda: done.complete(b"ok"),
            "claim": lambda: a.claim("c6"),
            "claim with wait": lambda: a.claim("c6", wait_s=0.1),
            "claim_many": lambda: a.claim_many(["c6"]),
            "keepalive": a.keepalive,
            "ensure_alive": a.ensure_alive,
            "on_lost": lambda: a.on_lost(lambda session, reason: None),
            "store.get": lambda: store.get("c1"),
            "store.session": lambda: store.session("B"),
        }
        if store.capabilities.queues:
            operations["claim_next"] = lambda: a.claim_next("q")
        for name, operation in operations.items():
            try:
                operation()
            except StoreClosed:
                continue
            except Exception as exc:
                raise AssertionError(f"{name} after store.close(): {exc!r}") from exc
            raise AssertionError(f"{name} after store.close(): no error")
        for lease in leases:
            assert lease.state is LeaseState.LOST
            with pytest.raises(LeaseLost):  # the local check keeps its contract
                lease.ensure_held()
        a.close()
        store.close()  # both idempotent

    # -- with session.claim(job) without wait_s ------------------------------------------

    def test_with_claim_without_wait_on_a_held_job_raises_claim_timeout(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        a, b = self.open(store, "A"), self.open(store, "B")
        held = a.claim("w")
        assert held is not None
        ran = False
        with pytest.raises(ClaimTimeout, match="wait_s") as timeout:
            with b.claim("w"):  # (typed code gets a mypy error here too)
                ran = True
        assert not ran and timeout.value.job_id == "w"
        assert b.claim("w") is None  # not in a with statement: None, as ever
        assert b.leases() == []
        held.release()
        with b.claim("w") as lease:  # free: claimed
            assert lease.state is LeaseState.HELD
        if store.capabilities.queues:
            with pytest.raises(ClaimTimeout, match="wait_s"):
                with b.claim_next("empty-queue"):
                    ran = True
            assert not ran and b.claim_next("empty-queue") is None

    # -- a lease ends once -------------------------------------------------------------

    def test_a_lease_ends_once(self, store: LeaseStore, sessions: list[Session]) -> None:
        a = self.open(store, "A")
        done = a.claim("ends-completed")
        assert done is not None
        record = done.complete(b"first")
        assert done.complete(b"first") == record  # same result: the record
        with pytest.raises(InvalidArgument, match="already completed with another result"):
            done.complete(b"second")
        with pytest.raises(InvalidArgument, match="already completed"):
            done.release()
        with pytest.raises(InvalidArgument, match="already completed"):
            done.fail("too late")
        after = store.get("ends-completed")
        assert after is not None and after.state is JobState.COMPLETED
        assert after.result == b"first"

        released = a.claim("ends-released")
        assert released is not None
        released.release()
        released.release()  # the same ending again: nothing
        after_release: list[Callable[[], object]] = [
            lambda: released.complete(b"x"), lambda: released.fail("x"),
        ]
        for late in after_release:
            with pytest.raises(InvalidArgument, match="already released"):
                late()

        failed = a.claim("ends-failed")
        assert failed is not None
        failed.fail("boom", retry_in_s=0)
        after_fail: list[Callable[[], object]] = [
            failed.release, lambda: failed.complete(b"x"), lambda: failed.fail("x"),
        ]
        for late in after_fail:
            with pytest.raises(InvalidArgument, match="already failed"):
                late()
        record_after = store.get("ends-failed")
        assert record_after is not None and record_after.error == "boom"
