"""etcd: a listing ends by one deadline, ``max(timeout_s, connect_timeout_s)`` from its
start, also when the member dies in the middle of it. Each of its requests used to get a
budget of its own, and a held job's lease lookup (``lease_until``), which gives ``None``
when it fails, is one request per holder: ``timeout_s`` per holder (up to 64) before the
listing even noticed. One local member of this module's own, killed and restarted here."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from etcd_local import LocalEtcd, backend_of, local_members

from consensus_lease import LeaseStore, open_store
from consensus_lease.errors import BackendUnavailable
from consensus_lease.testing.conformance import poll_until

pytestmark = pytest.mark.slow

TIMEOUT_S = 1.0
CONNECT_TIMEOUT_S = 2.0
BUDGET_S = max(TIMEOUT_S, CONNECT_TIMEOUT_S)
SLACK_S = 2.0
JOBS = 600
"""Enough for two pages of every listing (512 keys a page)."""
HOLDERS = 10
"""Sessions (leases) each holding one of the first jobs."""


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=90)


@pytest.fixture(scope="module")
def url(etcd_server: LocalEtcd) -> str:
    """A prefix holding queue ``q`` of JOBS jobs."""
    url = etcd_server.url_with_prefix(f"t-{uuid.uuid4().hex[:12]}")
    with open_store(url) as store:
        for i in range(JOBS):
            store.enqueue("q", f"job-{i:04d}", b"x" * 64)
    return url


@pytest.fixture
def store(etcd_server: LocalEtcd, url: str) -> Iterator[LeaseStore]:
    """A store with short timeouts; HOLDERS sessions of another hold job-0000, ... while
    the test runs (the member is running again after it)."""
    store = open_store(url, timeout_s=TIMEOUT_S, connect_timeout_s=CONNECT_TIMEOUT_S)
    holders = open_store(url)
    sessions = [holders.backend.open_session(f"h{i}", 60.0) for i in range(HOLDERS)]
    try:
        for i, session in enumerate(sessions):
            assert holders.backend.claim(session, f"job-{i:04d}") is not None
        yield store
    finally:
        etcd_server.restore()
        poll_until(lambda: _answers(store), 30)
        for session in sessions:
            holders.backend.close_session(session)
        holders.close()
        store.close()


def _answers(store: LeaseStore) -> bool:
    try:
        return store.get("job-0000") is not None
    except BackendUnavailable:
        return False


LISTINGS: dict[str, Callable[[LeaseStore], Any]] = {
    "queue_stats": lambda store: store.queue_stats("q"),
    "records": lambda store: store.records(),
    "get": lambda store: store.get("job-0000"),
}


@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_a_listing_ends_by_its_deadline_when_the_member_is_killed_during_it(
    etcd_server: LocalEtcd, store: LeaseStore, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = backend_of(store)._ops
    real = ops.lease_ttl
    lookups: list[int] = []

    def lease_ttl(lease_id: int) -> int | None:
        lookups.append(lease_id)
        if len(lookups) == 1:  # at the first holder: the member dies mid-listing
            etcd_server.kill(etcd_server.members[0])
        return real(lease_id)

    monkeypatch.setattr(ops, "lease_ttl", lease_ttl)
    outcome: list[BaseException | None] = []
    started = time.monotonic()

    def run() -> None:
        try:
            LISTINGS[name](store)
            outcome.append(None)
        except BaseException as exc:  # reported below
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BUDGET_S + SLACK_S + 5.0)
    elapsed = time.monotonic() - started
    assert not thread.is_alive(), f"still running {elapsed:.1f} s after the start"
    if name == "records":  # a page read after the kill
        assert isinstance(outcome[0], BackendUnavailable), outcome
    else:  # read before the kill (queue reads are one snapshot when they fit the txn
        # limit); the holders' lease_until lookups then fail, which shows as None
        assert outcome[0] is None or isinstance(outcome[0], BackendUnavailable), outcome
    assert elapsed <= BUDGET_S + SLACK_S, elapsed
    assert lookups
