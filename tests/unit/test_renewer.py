"""The renewal scheduler shared by a store's sessions (`_renewer.py`), on a fake clock:
threads do not grow with sessions, and sharing them shares no failure."""

from __future__ import annotations

import threading
from typing import Any

from consensus_lease import LeaseLost, LeaseStore, SessionState
from consensus_lease.backend import SessionHandle
from consensus_lease.backends.memory import MemoryBackend
from consensus_lease.testing import FakeClock
from consensus_lease.testing.conformance import poll_until


class CountingBackend(MemoryBackend):
    """Memory backend counting keepalives per session; one session's can be held."""

    def __init__(self, store_clock: Any) -> None:
        super().__init__(store_clock)
        self.counts: dict[str, int] = {}
        self.hold: str | None = None  # session id whose keepalive blocks
        self.release = threading.Event()
        self._count_lock = threading.Lock()

    def keepalive(self, session: SessionHandle) -> float:
        with self._count_lock:
            self.counts[session.session_id] = self.counts.get(session.session_id, 0) + 1
        if session.session_id == self.hold:
            self.release.wait(30)
        return super().keepalive(session)


def _consensus_threads() -> int:
    return sum(t.name.startswith("consensus-lease") for t in threading.enumerate())


def test_threads_do_not_grow_with_sessions() -> None:
    clock = FakeClock()
    backend = CountingBackend(clock)
    store = LeaseStore(backend, clock=clock)
    before = _consensus_threads()
    sessions = [store.session(f"w{i}", ttl_s=3.0) for i in range(300)]
    try:
        clock.advance(1.0)  # every session is due
        poll_until(lambda: len(backend.counts) == 300, 20)
        # one scheduler, one watchdog and the runners (at most MAX_RUNNERS), never
        # two threads per session (which was 600 here)
        assert _consensus_threads() - before <= 2 + 64
        assert all(s.state is SessionState.ACTIVE for s in sessions)
    finally:
        store.close()


def test_a_stuck_keepalive_delays_no_other_session() -> None:
    clock = FakeClock()
    backend = CountingBackend(clock)
    store = LeaseStore(backend, clock=clock)
    try:
        stuck = store.session("stuck", ttl_s=3.0)
        others = [store.session(f"w{i}", ttl_s=3.0) for i in range(5)]
        backend.hold = stuck.session_id
        for step in range(1, 4):  # three keepalive intervals
            clock.advance(1.0)
            poll_until(lambda step=step: all(
                backend.counts.get(s.session_id, 0) >= step for s in others), 10)
        assert backend.counts[stuck.session_id] == 1  # still in its first call
        assert all(s.state is SessionState.ACTIVE for s in others)
        clock.advance(1.0)  # the stuck one's deadline (3 - 0.3 s) has passed
        poll_until(lambda: stuck.state is SessionState.LOST, 10)
        assert all(s.state is SessionState.ACTIVE for s in others)
    finally:
        backend.release.set()
        store.close()


def test_a_slow_loss_callback_delays_no_other_loss() -> None:
    clock = FakeClock()
    backend = CountingBackend(clock)
    store = LeaseStore(backend, clock=clock)
    slow_entered = threading.Event()
    release = threading.Event()
    heard: list[str] = []

    def slow(_session: Any, _reason: LeaseLost) -> None:
        slow_entered.set()
        release.wait(30)

    try:
        first = store.session("first", ttl_s=3.0, keepalive=False)
        first.on_lost(slow)
        second = store.session("second", ttl_s=3.0, keepalive=False)
        second.on_lost(lambda s, _r: heard.append(s.session_id))
        clock.advance(1.0)  # the second one was opened later: its deadline is not first
        clock.advance(2.0)  # both deadlines passed
        poll_until(slow_entered.is_set, 10)
        poll_until(lambda: heard == [second.session_id], 10)
    finally:
        release.set()
        store.close()


class PipeliningBackend(MemoryBackend):
    """Memory backend that says it pipelines keepalives: records each batch, answers
    every session at once except a held one, whose answer waits for ``release``."""

    keepalive_batch = 16

    def __init__(self, store_clock: Any) -> None:
        super().__init__(store_clock)
        self.batches: list[int] = []
        self.hold: str | None = None
        self.release = threading.Event()
        self.renewed: dict[str, int] = {}

    def keepalive_many(self, sessions: Any, on_result: Any) -> None:
        self.batches.append(len(sessions))
        held = []
        for i, session in enumerate(sessions):
            if session.session_id == self.hold:
                held.append(i)
                continue
            self.renewed[session.session_id] = self.renewed.get(session.session_id, 0) + 1
            on_result(i, super().keepalive(session))
        for i in held:
            self.release.wait(30)
            on_result(i, super().keepalive(sessions[i]))


def test_a_pipelining_driver_gets_the_sessions_due_together_in_one_call() -> None:
    clock = FakeClock()
    backend = PipeliningBackend(clock)
    store = LeaseStore(backend, clock=clock)
    try:
        sessions = [store.session(f"w{i}", ttl_s=3.0) for i in range(40)]
        clock.advance(1.0)
        poll_until(lambda: len(backend.renewed) == 40, 10)
        assert max(backend.batches) == 16 and len(backend.batches) <= 6
        assert all(s.state is SessionState.ACTIVE for s in sessions)
    finally:
        store.close()


def test_an_unanswered_session_in_a_batch_holds_back_no_other() -> None:
    clock = FakeClock()
    backend = PipeliningBackend(clock)
    store = LeaseStore(backend, clock=clock)
    try:
        stuck = store.session("stuck", ttl_s=3.0)
        others = [store.session(f"w{i}", ttl_s=3.0) for i in range(5)]
        backend.hold = stuck.session_id
        for step in range(1, 4):
            clock.advance(1.0)
            poll_until(lambda step=step: all(
                backend.renewed.get(s.session_id, 0) >= step for s in others), 10)
        clock.advance(1.0)  # past the stuck one's deadline only
        poll_until(lambda: stuck.state is SessionState.LOST, 10)
        assert all(s.state is SessionState.ACTIVE for s in others)
    finally:
        backend.release.set()
        store.close()


class RefusingBackend(CountingBackend):
    """Answers the keepalives of the sessions in ``refuse`` with SessionExpired."""

    def __init__(self, store_clock: Any) -> None:
        super().__init__(store_clock)
        self.refuse: set[str] = set()

    def keepalive(self, session: SessionHandle) -> float:
        if session.session_id in self.refuse:
            from consensus_lease import SessionExpired
            raise SessionExpired(f"session {session.session_id} expired in the store")
        return super().keepalive(session)


def test_slow_callbacks_of_sessions_the_store_ended_delay_no_other_session() -> None:
    """More sessions than there are runners end by their keepalive's answer, each with a
    callback that blocks: the runners hand the callbacks off, and the healthy sessions
    keep being renewed (with the callbacks on the runners, all of them were lost)."""
    clock = FakeClock()
    backend = RefusingBackend(clock)
    store = LeaseStore(backend, clock=clock)
    release = threading.Event()
    entered: list[str] = []
    try:
        doomed = [store.session(f"d{i}", ttl_s=3.0) for i in range(70)]
        healthy = [store.session(f"h{i}", ttl_s=3.0) for i in range(5)]
        for s in doomed:
            s.on_lost(lambda s, _r: (entered.append(s.session_id), release.wait(30)))
        backend.refuse = {s.session_id for s in doomed}
        for step in range(1, 4):
            clock.advance(1.0)
            poll_until(lambda step=step: all(
                backend.counts.get(s.session_id, 0) >= step for s in healthy), 10)
        poll_until(lambda: len(entered) == 70, 10)
        assert all(s.state is SessionState.LOST for s in doomed)
        assert all(s.state is SessionState.ACTIVE for s in healthy)
    finally:
        release.set()
        store.close()


def test_sessions_on_one_overriding_clock_share_threads() -> None:
    clock, other = FakeClock(), FakeClock()
    backend = CountingBackend(clock)
    store = LeaseStore(backend, clock=clock)
    before = _consensus_threads()
    try:
        sessions = [store.session(f"w{i}", ttl_s=3.0, clock=other) for i in range(100)]
        assert _consensus_threads() - before <= 2
        assert all(s.state is SessionState.ACTIVE for s in sessions)
    finally:
        store.close()


def test_a_session_opened_while_the_store_closes_is_closed_with_it() -> None:
    from consensus_lease import StoreClosed

    for _ in range(20):
        store = LeaseStore(MemoryBackend())
        opened: list[Any] = []
        errors: list[BaseException] = []

        def open_many(store: LeaseStore = store, opened: list[Any] = opened,
                      errors: list[BaseException] = errors) -> None:
            for i in range(50):
                try:
                    opened.append(store.session(f"w{i}", ttl_s=5.0))
                except BaseException as exc:  # StoreClosed, or the bug
                    errors.append(exc)
                    return

        opener = threading.Thread(target=open_many)
        opener.start()
        store.close()
        opener.join(30)
        assert all(isinstance(e, StoreClosed) for e in errors), errors
        assert all(s.state is not SessionState.ACTIVE for s in opened)
