"""The session's keepalive, deadline and state machine, driven by a fake clock."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from consensus_lease import (
    BackendUnavailable,
    LeaseLost,
    LeaseState,
    LeaseStore,
    LeaseSuspended,
    SessionExpired,
    SessionState,
)
from consensus_lease.backend import SessionEvent, SessionHandle, StateListener
from consensus_lease.backends.memory import MemoryBackend
from consensus_lease.testing import FakeClock
from consensus_lease.testing.conformance import poll_until


class ScriptedBackend(MemoryBackend):
    """The memory backend, plus: remembers each session's event listener, counts
    keepalives, and can be told to fail them."""

    def __init__(self, store_clock: Any = None) -> None:
        super().__init__(store_clock)
        self.listeners: dict[str, StateListener] = {}
        self.keepalives = 0
        self.fail_keepalive: Exception | None = None

    def open_session(self, owner: str, ttl_s: float, on_event: StateListener | None = None
                     ) -> SessionHandle:
        handle = super().open_session(owner, ttl_s, on_event)
        assert on_event is not None
        self.listeners[handle.session_id] = on_event
        return handle

    def keepalive(self, session: SessionHandle) -> float:
        self.keepalives += 1
        if self.fail_keepalive is not None:
            raise self.fail_keepalive
        return super().keepalive(session)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(clock: FakeClock) -> ScriptedBackend:
    return ScriptedBackend(store_clock=clock)


@pytest.fixture
def store(backend: ScriptedBackend, clock: FakeClock) -> LeaseStore:
    return LeaseStore(backend, clock=clock)


def test_keepalive_every_third_of_ttl_keeps_the_lease(
    store: LeaseStore, backend: ScriptedBackend, clock: FakeClock
) -> None:
    with store.session("A", ttl_s=3.0) as session:
        lease = session.claim("job")
        assert lease is not None
        for step in range(1, 10):  # 9 s of fake time, three TTLs
            clock.advance(1.0)
            poll_until(lambda step=step: backend.keepalives >= step, 5)
        lease.ensure_held()
        assert backend.keepalives == 9
        assert lease.remaining_s() > 1.0


def test_keepalive_traffic_does_not_grow_with_leases(
    store: LeaseStore, backend: ScriptedBackend, clock: FakeClock
) -> None:
    with store.session("A", ttl_s=3.0) as session:
        assert all(session.claim_many([f"j{i}" for i in range(500)]))
        clock.advance(1.0)
        poll_until(lambda: backend.keepalives >= 1, 5)
        clock.advance(1.0)
        poll_until(lambda: backend.keepalives >= 2, 5)
        assert backend.keepalives == 2


def test_unreachable_store_loses_lease_at_the_deadline(
    store: LeaseStore, backend: ScriptedBackend, clock: FakeClock
) -> None:
    with store.session("A", ttl_s=3.0) as session:
        lease = session.claim("job")
        assert lease is not None
        lost: list[LeaseLost] = []
        session.on_lost(lambda _s, reason: lost.append(reason))
        backend.fail_keepalive = BackendUnavailable("network down")
        clock.advance(1.0)
        poll_until(lambda: backend.keepalives >= 1, 5)
        lease.ensure_held()  # one failed renewal is not a loss
        clock.advance(3.0 - session.safety_margin_s - 1.0 + 0.01)
        poll_until(lambda: session.lost.is_set(), 5)
        assert lease.state is LeaseState.LOST
        assert len(lost) == 1 and "deadline" in str(lost[0])
        with pytest.raises(LeaseLost):
            lease.ensure_held()
        # The store has not expired it yet, but the worker must not act: deadline first.
        backend.fail_keepalive = None
        with pytest.raises(LeaseLost):
            session.keepalive()


def test_store_expiry_reported_by_keepalive(
    store: LeaseStore, backend: ScriptedBackend, clock: FakeClock
) -> None:
    with store.session("A", ttl_s=3.0) as session:
        lease = session.claim("job")
        assert lease is not None
        backend.expire_session(session.session_id)
        clock.advance(1.0)
        poll_until(lambda: session.lost.is_set(), 5)
        assert isinstance(session.lost_reason, SessionExpired)
        with pytest.raises(SessionExpired):
            session.ensure_alive()


def test_suspended_then_reconfirmed(
    store: LeaseStore, backend: ScriptedBackend, clock: FakeClock
) -> None:
    with store.session("A", ttl_s=3.0, keepalive=False) as session:
        lease = session.claim("job")
        assert lease is not None
        notify = backend.listeners[session.session_id]
        notify(SessionEvent.SUSPENDED)
        assert lease.state is LeaseState.SUSPENDED
        with pytest.raises(LeaseSuspended):
            lease.ensure_held()
        notify(SessionEvent.RECONNECTED)
        poll_until(lambda: session.state is SessionState.ACTIVE, 5)
        lease.ensure_held()


def test_reconnect_finds_lease_taken_marks_it_lost(
    store: LeaseStore, backend: ScriptedBackend, clock: FakeClock
) -> None:
    with store.session("A", ttl_s=3.0, keepalive=False) as a, store.session("B") as b:
        lease = a.claim("job")
        kept = a.claim("kept")
        assert lease is not None and kept is not None
        notify = backend.listeners[a.session_id]
        notify(SessionEvent.SUSPENDED)
        # While A is disconnected, the job is released behind its back and taken.
        backend.release(a.handle, "job", lease.claim_result)
        assert b.claim("job") is not None
        notify(SessionEvent.RECONNECTED)
        poll_until(lambda: a.state is SessionState.ACTIVE, 5)
        assert lease.state is LeaseState.LOST
        kept.ensure_held()


def test_expired_event_is_final(store: LeaseStore, backend: ScriptedBackend) -> None:
    with store.session("A", ttl_s=3.0, keepalive=False) as session:
        lease = session.claim("job")
        assert lease is not None
        backend.listeners[session.session_id](SessionEvent.EXPIRED)
        backend.listeners[session.session_id](SessionEvent.RECONNECTED)
        assert session.state is SessionState.LOST
        with pytest.raises(SessionExpired):
            lease.ensure_held()


def test_callback_registered_after_loss_runs_at_once(
    store: LeaseStore, backend: ScriptedBackend
) -> None:
    session = store.session("A", ttl_s=3.0, keepalive=False)
    backend.listeners[session.session_id](SessionEvent.EXPIRED)
    called = threading.Event()
    session.on_lost(lambda _s, _r: called.set())
    assert called.is_set()
    session.close()


def test_safety_margin_must_be_below_ttl(store: LeaseStore) -> None:
    from consensus_lease import InvalidArgument

    with pytest.raises(InvalidArgument):
        store.session("A", ttl_s=3.0, safety_margin_s=3.0)
    assert store.records() == []


def test_context_manager_surfaces_loss_after_body(
    store: LeaseStore, backend: ScriptedBackend
) -> None:
    with store.session("A", ttl_s=3.0, keepalive=False) as session:
        with pytest.raises(LeaseLost):
            with session.claim("job", wait_s=0) as lease:
                backend.listeners[session.session_id](SessionEvent.EXPIRED)
        assert lease.state is LeaseState.LOST


def test_failed_keepalive_is_retried_promptly(
    store: LeaseStore, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """A failed renewal is retried 50 ms later (then backing off), not at the next tick:
    a store that answers again right after the failure renews the lease at once."""
    with store.session("A", ttl_s=3.0) as session:
        lease = session.claim("job")
        assert lease is not None
        backend.fail_keepalive = BackendUnavailable("leader election")
        clock.advance(1.0)
        poll_until(lambda: backend.keepalives >= 1, 5)
        clock.advance(0.05)
        poll_until(lambda: backend.keepalives >= 2, 5)  # first retry: 50 ms
        clock.advance(0.1)
        poll_until(lambda: backend.keepalives >= 3, 5)  # second retry: 100 ms later
        backend.fail_keepalive = None
        clock.advance(0.2)
        poll_until(lambda: backend.keepalives >= 4, 5)  # third: 200 ms later, renews
        poll_until(lambda: lease.remaining_s() > 2.5, 5)
        lease.ensure_held()


def test_ending_a_lease_after_close_says_the_session_was_closed(store: LeaseStore) -> None:
    # The store answers SessionExpired (close() ended the session there); the message
    # says why rather than suggesting the store expired a live session.
    session = store.session("A", ttl_s=3.0, keepalive=False)
    first, second = session.claim("j1"), session.claim("j2")
    session.close()
    for end in (first.complete, second.release):
        with pytest.raises(SessionExpired, match=r"was closed \(Session\.close\(\)\)"):
            end()
    record = store.get("j1")
    assert record is not None and record.state.value == "available"  # not completed


def test_batch_endings_after_close_say_the_session_was_closed(store: LeaseStore) -> None:
    session = store.session("A", ttl_s=3.0, keepalive=False)
    first, second, third = (session.claim(f"b{i}") for i in range(3))
    session.close()
    answers = [*session.release_many([first]), *session.fail_many([(second, "e")]),
               *session.complete_many([third])]
    assert all(isinstance(a, SessionExpired) for a in answers), answers
    assert all("was closed (Session.close())" in str(a) for a in answers), answers
