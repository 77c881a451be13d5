"""The ZooKeeper backend's part of leader election: election keys live under
``{chroot}/elections`` (never in ``records()`` or queues), and ``set_value`` keeps the
leader's value in the hold's ephemeral owner znode (one multi with the ownership checks
of a release; a lost answer read back; gone with the hold).

Driven through the backend itself, with election keys as the core passes them; the
election conformance suite (through ``session.campaign``) runs in ``test_zookeeper.py``.
"""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.protocol.serialization import CheckVersion
from zk_local import (  # noqa: F401  (fixtures)
    MULTI_TYPE,
    backend,
    chroot_of,
    lose_next_answer,
    multi_op_types,
    raw_client,
    store,
    zk_target,
    zk_url,
)

from consensus_lease._election import election_key, election_name
from consensus_lease.backends.zookeeper import ZooKeeperBackend
from consensus_lease.backends.zookeeper._layout import encode_job_id, parse_owner
from consensus_lease.backends.zookeeper._sessions import ZkSession
from consensus_lease.errors import InvalidArgument, SessionExpired, StaleLeaseError
from consensus_lease.record import ClaimResult, JobState
from consensus_lease.testing.conformance import poll_until

pytestmark = pytest.mark.slow

KEY = election_key("leader/of the pack")


@pytest.fixture
def open_session(backend: ZooKeeperBackend) -> Iterator[Callable[[str], ZkSession]]:
    """``open_session(owner)``: a backend session (10 s), closed after the test."""
    opened: list[ZkSession] = []

    def open_(owner: str) -> ZkSession:
        h = backend.open_session(owner, 10.0)
        assert isinstance(h, ZkSession)
        opened.append(h)
        return h

    yield open_
    for h in opened:
        backend.close_session(h)


def claimed(backend: ZooKeeperBackend, h: ZkSession, key: str = KEY) -> ClaimResult:
    claim = backend.claim(h, key)
    assert claim is not None
    return claim


def owner_znode(zk_url: str, key: str = KEY) -> tuple[bytes, Any] | None:
    """``(data, stat)`` of the election's owner znode, read with a raw client."""
    client = raw_client(zk_url)
    try:
        path = f"{chroot_of(zk_url)}/elections/{encode_job_id(election_name(key))}/owner"
        answer = client.exists(path)
        return None if answer is None else client.get(path)
    finally:
        client.stop()
        client.close()


def count_writes(h: ZkSession) -> Callable[[], int]:
    """``writes()``: how many multis ``h``'s client started since, those of ``check``s
    alone (write barriers, renew's checks), which change nothing, left out."""
    real = h.client._call
    started: list[list[int]] = []

    def call(request: Any, async_object: Any) -> Any:
        if request.type == MULTI_TYPE:
            started.append(multi_op_types(request))
        return real(request, async_object)

    h.client._call = call
    return lambda: sum(any(t != CheckVersion.type for t in types) for types in started)


def test_value_is_kept_with_the_hold_and_read_by_get(
    backend: ZooKeeperBackend, open_session: Callable[[str], ZkSession], zk_url: str
) -> None:
    a = open_session("A")
    claim = claimed(backend, a)
    record = backend.get(KEY)
    assert record is not None and record.state is JobState.HELD and record.value is None
    writes = count_writes(a)
    backend.set_value(a, KEY, claim, b"v1\nwith a newline")
    backend.set_value(a, KEY, claim, b"v2\x00\xff")
    assert writes() == 2  # one multi each, no read first
    record = backend.get(KEY)
    assert record is not None
    assert (record.owner, record.generation, record.value) == ("A", 1, b"v2\x00\xff")
    backend.set_value(a, KEY, claim, b"")
    record = backend.get(KEY)
    assert record is not None and record.value == b""  # empty, not "never set"
    answer = owner_znode(zk_url)
    assert answer is not None and answer[1].ephemeralOwner == a.sid
    assert parse_owner(answer[0], "owner").value == b""
    backend.renew(a, KEY, claim)  # the owner znode's data does not matter to renew
    backend.release(a, KEY, claim)  # sent from the hold, at the owner znode's new version
    assert writes() == 4
    record = backend.get(KEY)
    assert record is not None and record.state is JobState.AVAILABLE and record.value is None


def test_elections_live_apart_from_jobs(
    backend: ZooKeeperBackend, open_session: Callable[[str], ZkSession], zk_url: str
) -> None:
    a = open_session("A")
    claimed(backend, a)  # the first claim of an election makes {chroot}/elections
    job = claimed(backend, a, "job")
    backend.set_value(a, "job", job, b"any hold may carry a value")
    assert [r.job_id for r in backend.records()] == ["job"]
    assert [r.job_id for r in backend.records(limit=1)] == ["job"]
    client = raw_client(zk_url)
    try:
        chroot = chroot_of(zk_url)
        assert client.get_children(f"{chroot}/jobs") == ["job"]
        assert client.get_children(f"{chroot}/elections") == ["leader%2Fof%20the%20pack"]
    finally:
        client.stop()
        client.close()
    with pytest.raises(InvalidArgument, match="election"):
        backend.enqueue("q", KEY, b"")
    assert backend.queue_jobs("q") == []


def test_stale_set_value_is_rejected(
    backend: ZooKeeperBackend, open_session: Callable[[str], ZkSession]
) -> None:
    a, b = open_session("A"), open_session("B")
    first = claimed(backend, a)
    backend.set_value(a, KEY, first, b"a")
    backend.release(a, KEY, first)
    with pytest.raises(StaleLeaseError):
        backend.set_value(a, KEY, first, b"late")  # released: its hold is over
    second = claimed(backend, b)
    with pytest.raises(StaleLeaseError) as stale:
        backend.set_value(a, KEY, ClaimResult(second.generation), b"not mine")
    assert stale.value.job_id == KEY
    backend.release(b, KEY, second)
    third = claimed(backend, a)  # same session, next generation, a new owner znode
    with pytest.raises(StaleLeaseError):
        backend.set_value(a, KEY, first, b"old generation")  # the job znode's check
    record = backend.get(KEY)
    assert record is not None and (record.generation, record.value) == (3, None)
    backend.set_value(a, KEY, ClaimResult(third.generation), b"read first")  # no handle
    record = backend.get(KEY)
    assert record is not None and record.value == b"read first"
    backend.release(a, KEY, third)


@pytest.mark.parametrize("apply", [True, False], ids=["applied", "not-applied"])
def test_lost_set_value_answer_is_read_back(
    backend: ZooKeeperBackend, open_session: Callable[[str], ZkSession], zk_url: str,
    apply: bool,
) -> None:
    a = open_session("A")
    claim = claimed(backend, a)
    lose_next_answer(a.client, apply)
    writes = count_writes(a)
    backend.set_value(a, KEY, claim, b"once")
    assert writes() == (1 if apply else 2)  # applied: never sent again
    answer = owner_znode(zk_url)
    assert answer is not None and answer[0].endswith(b"\nonce")
    assert answer[1].version == 1  # written exactly once
    record = backend.get(KEY)
    assert record is not None and record.value == b"once"
    backend.release(a, KEY, claim)
    assert owner_znode(zk_url) is None


def test_value_goes_with_the_session(
    backend: ZooKeeperBackend, open_session: Callable[[str], ZkSession]
) -> None:
    a, b = open_session("A"), open_session("B")
    claim = claimed(backend, a)
    backend.set_value(a, KEY, claim, b"leader A")
    backend.expire_session(a.session_id)
    poll_until(lambda: getattr(backend.get(KEY), "state", None) is JobState.AVAILABLE,
               timeout_s=10.0)
    record = backend.get(KEY)
    assert record is not None and record.value is None
    with pytest.raises((SessionExpired, StaleLeaseError)):
        backend.set_value(a, KEY, claim, b"after expiry")
    after = claimed(backend, b)
    assert after.generation == claim.generation + 1
    record = backend.get(KEY)
    assert record is not None and (record.owner, record.value) == ("B", None)
    backend.release(b, KEY, after)


def test_bad_values_are_refused_before_sending(
    backend: ZooKeeperBackend, open_session: Callable[[str], ZkSession]
) -> None:
    a = open_session("A")
    claim = claimed(backend, a)
    writes = count_writes(a)
    with pytest.raises(InvalidArgument, match="max_result_bytes"):
        backend.set_value(a, KEY, claim, b"x" * (backend.config.max_result_bytes + 1))
    with pytest.raises(InvalidArgument, match="bytes"):
        backend.set_value(a, KEY, claim, "text")  # type: ignore[arg-type]
    assert writes() == 0
    backend.set_value(a, KEY, claim, b"x" * backend.config.max_result_bytes)  # the limit
    record = backend.get(KEY)
    assert record is not None and record.value is not None
    assert len(record.value) == backend.config.max_result_bytes
