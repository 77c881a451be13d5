"""The regression part of the conformance suite: one rule on every store. Once a store
has reported ``StoreRegressed`` (its history went back: restored from an older backup,
wiped, a lagging standby promoted), no session or claim succeeds, on the store object
that noticed or on one opened on the store afterwards, until ``bump_epoch``; after
``bump_epoch(above=HIGHEST)`` every token is above every earlier one.

Mixed into :class:`~consensus_lease.testing.conformance.BackendConformance`. A backend
whose store can go back declares it (``Capabilities.regression_refusal``) and its suite
provides the hook ``regress(store, between)``: make the store's history go back, the
way it happens to that store, with ``between()`` run after the point it goes back to
(etcd: ``etcdctl snapshot save``, ``between()``, ``snapshot restore``; SQLite: a copy,
``between()``, the copy restored in place). A backend that declares ``False`` must not
override the hook, and its suite checks that the declaration is what it does: never a
skip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ..errors import StoreRegressed
from ..lease import Lease
from ..session import Session
from ..store import LeaseStore, open_store

__all__ = ["RegressionConformance"]


def _claim(session: Session, job_id: str) -> Lease:
    lease = session.claim(job_id)
    assert lease is not None, f"{job_id!r} could not be claimed"
    return lease


class RegressionConformance:
    """``StoreRegressed`` refuses sessions and claims until ``bump_epoch``."""

    open: Any
    process_url: Any
    long_ttl_s: float

    regression_ttl_s: float = 3.0
    """The TTL of the session that must notice the regression (by its keepalive, every
    TTL / 3) while it holds a job."""
    regression_notice_s: float = 30.0
    """How long the store object may take to notice, after ``regress`` returns."""

    def regress(self, store: LeaseStore, between: Callable[[], None]) -> None:
        """Hook: make ``store``'s history go back to before ``between()`` ran (see the
        module docstring)."""
        raise NotImplementedError(
            "a backend with Capabilities.regression_refusal provides regress(store, between)")

    def test_regressed_store_refuses_sessions_and_claims_until_bump(
        self, store: LeaseStore, sessions: list[Session]
    ) -> None:
        """A holder across a regression is lost with StoreRegressed; then a new session
        on the same object, a claim, and a store object opened afterwards on the same
        URL are all refused with StoreRegressed; after ``bump_epoch(above=HIGHEST)``
        (from another store object, as the command does it) sessions and claims work on
        both, with tokens above every earlier one."""
        if not store.capabilities.regression_refusal:
            assert type(self).regress is RegressionConformance.regress, (
                "a backend that declares regression_refusal=False cannot regress")
            lease = _claim(self.open(store, "A"), "rg-plain")
            store.bump_epoch(above=lease.generation)
            lease.renew()  # no history to go back: nothing is refused
            return
        url = self.process_url(store)
        assert url is not None, "a store that can regress is shared through a URL"
        a = self.open(store, "A", self.regression_ttl_s)
        tokens: list[int] = []
        for job in ("rg-1", "rg-2"):
            lease = _claim(a, job)
            tokens.append(lease.generation)
            lease.release()

        def after_the_backup() -> None:  # what the restored store does not have
            for _ in range(3):
                lease = _claim(a, "rg-1")
                tokens.append(lease.generation)
                lease.release()
            done = _claim(a, "rg-done")
            tokens.append(done.generation)
            done.complete(b"r")

        held = _claim(a, "rg-held")
        tokens.append(held.generation)
        self.regress(store, after_the_backup)
        held_lease = held

        def noticed() -> bool:
            try:
                held_lease.ensure_held()
            except StoreRegressed:
                return True
            return False

        from .conformance import poll_until  # (conformance imports this module)

        poll_until(noticed, self.regression_notice_s, interval_s=0.05)
        assert isinstance(a.lost_reason, StoreRegressed)
        with pytest.raises(StoreRegressed):
            store.session("B", self.long_ttl_s)
        with pytest.raises(StoreRegressed):
            a.claim("rg-new")
        with pytest.raises(StoreRegressed):
            store.backend.claim(a.handle, "rg-new")
        with open_store(url) as fresh:
            with pytest.raises(StoreRegressed):
                fresh.session("C", self.long_ttl_s)
            with pytest.raises(StoreRegressed):
                store.session("B", self.long_ttl_s)  # still: refusing is not one-shot
            highest = max(tokens)
            with open_store(url) as admin:
                admin.bump_epoch(above=highest)
            for where, job in ((store, "rg-1"), (fresh, "rg-2"), (store, "rg-held")):
                worker = self.open(where, "D")
                lease = worker.claim(job, wait_s=3 * self.regression_ttl_s + 5)
                assert lease is not None, job
                assert lease.generation > highest, (job, lease.generation, highest)
                lease.complete(b"after the bump")
