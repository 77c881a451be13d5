"""Fork safety on the in-process stores (memory, SQLite): a child made by fork() never
acts for its parent. The same scenario runs on every backend in the conformance suite
(``UsageConformance``); here, what only a spy can show: the child makes no store call
at all, not even when its frozen copy of the session's deadline has passed."""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from consensus_lease import JobState, LeaseStore, StoreInherited, open_store
from consensus_lease._callsite import entered_by_with
from consensus_lease._fork import Origin
from consensus_lease.backend import SessionHandle
from consensus_lease.backends.memory import MemoryBackend
from consensus_lease.states import SessionState
from consensus_lease.store import LeaseStore as Store

WAIT_S = 30.0


def in_child(action: Callable[[], object], fork: Callable[[], int] = os.fork) -> object:
    """Run ``action`` in a child made by ``fork`` (os.fork() by default); return what it
    returned (JSON), or ``"<TypeName>: message"`` for what it raised."""
    read_end, write_end = os.pipe()
    pid = fork()
    if pid == 0:  # the child: report, then leave without running anything of pytest's
        os.close(read_end)
        try:
            try:
                result: object = action()
            except BaseException as exc:
                result = f"{type(exc).__name__}: {exc}"
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as reader:
        while chunk := reader.read():
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    return json.loads(b"".join(chunks))


class SpyBackend(MemoryBackend):
    """The memory store, logging every call that would end a session or the driver."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def close_session(self, session: SessionHandle) -> None:
        self.calls.append("close_session")
        super().close_session(session)

    def keepalive(self, session: SessionHandle) -> float:
        self.calls.append("keepalive")
        return super().keepalive(session)

    def close(self) -> None:
        self.calls.append("close")
        super().close()


@pytest.fixture
def spy() -> Iterator[Store]:
    store = Store(SpyBackend())
    yield store
    store.close()


def spy_calls(store: LeaseStore) -> list[str]:
    assert isinstance(store.backend, SpyBackend)
    return store.backend.calls


def test_origin_knows_a_forked_child() -> None:
    origin = Origin()
    assert not origin.inherited()
    origin.check("thing")
    assert in_child(origin.inherited) is True
    assert str(in_child(lambda: origin.check("thing"))).startswith(
        f"StoreInherited: this thing was opened by process {os.getpid()}"
    )
    assert in_child(lambda: Origin().inherited()) is False  # made in the child: its own


def test_origin_knows_a_child_forked_past_the_interpreter() -> None:
    """libc's fork() called through ctypes runs none of Python's after-fork hooks (as a C
    extension that skips PyOS_AfterFork_Child): the pid still tells the child."""
    libc_fork = ctypes.CDLL(None).fork
    origin = Origin()
    assert in_child(origin.inherited, fork=libc_fork) is True
    assert str(in_child(lambda: origin.check("thing"), fork=libc_fork)).startswith(
        "StoreInherited: this thing was opened by process"
    )


def test_close_in_the_child_sends_nothing(spy: LeaseStore) -> None:
    session = spy.session("parent", ttl_s=30)
    assert session.claim("job") is not None

    def child() -> object:
        before = list(spy_calls(spy))
        session.close()
        spy.close()
        return spy_calls(spy)[len(before):]

    assert in_child(child) == []
    record = spy.get("job")
    assert record is not None and record.state is JobState.HELD


def test_a_frozen_deadline_in_the_child_ends_nothing(spy: LeaseStore) -> None:
    """The child's copy of the deadline stands still (the parent renews its own): once
    it has passed, reading the state in the child must not end the parent's session."""
    session = spy.session("parent", ttl_s=0.3)

    def child() -> object:
        before = len(spy_calls(spy))
        until = time.monotonic() + WAIT_S
        while session.remaining_s() > 0 and time.monotonic() < until:
            time.sleep(0.02)  # waiting for the child's copy of the deadline to pass
        state = session.state
        time.sleep(0.1)  # real time passes: an absence (no thread ending the session) cannot be polled for
        return [state.value, *spy_calls(spy)[before:]]

    assert in_child(child) == [SessionState.ACTIVE.value]
    assert "close_session" not in spy_calls(spy)
    assert session.state is SessionState.ACTIVE
    session.keepalive()


def test_with_blocks_left_in_the_child_are_quiet_but_a_lease_is_not(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/leases.db"
    with open_store(url) as store, store.session("parent", ttl_s=30) as session:
        lease = session.claim("job", wait_s=0)

        def leave_store_and_session() -> object:
            with store, session:
                pass
            return "ok"

        def leave_lease() -> object:
            with lease:
                pass
            return "released"

        assert in_child(leave_store_and_session) == "ok"
        assert str(in_child(leave_lease)).startswith("StoreInherited:")
        with open_store(url) as other:
            record = other.get("job")
        assert record is not None and record.state is JobState.HELD
        assert record.owner == "parent"
        lease.renew()


def test_the_error_is_exported_and_says_what_to_do() -> None:
    import consensus_lease

    assert consensus_lease.StoreInherited is StoreInherited
    with open_store("memory://") as store:
        message = str(in_child(lambda: store.get("x")))
    assert message.startswith("StoreInherited: this LeaseStore was opened by process")
    assert "Open a store in this process" in message


def test_entered_by_with_tells_a_with_statement_from_an_assignment() -> None:
    def probe() -> object:
        return entered_by_with(sys._getframe(1))

    assigned = probe()
    entered: list[object] = []

    class Probe:
        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    def probe_cm() -> Probe:
        entered.append(entered_by_with(sys._getframe(1)))
        return Probe()

    with probe_cm():
        pass
    with Probe(), probe_cm():
        pass
    nested = [Probe() for _ in range(1) if probe()]
    assert assigned is False and nested == []
    assert entered == [True, True]
    assert entered_by_with(None) is False
