"""The etcd session watch (``_sessions_revocation.SessionWatch``) with a fake hub and store: a
deleted session key ends its session; watch trouble (compaction) reads the keys again
instead of assuming anything; a failed read never ends a session."""

from __future__ import annotations

import threading
from typing import Any

from pyetcd import etcdrpc

from consensus_lease.backend import SessionEvent
from consensus_lease.backends.etcd._layout import Layout
from consensus_lease.backends.etcd._sessions import EtcdSession
from consensus_lease.backends.etcd._sessions_revocation import SessionWatch
from consensus_lease.backends.etcd._watches_hub import Watch
from consensus_lease.errors import BackendUnavailable
from consensus_lease.testing.conformance import poll_until

LAYOUT = Layout(b"/p")


class _Hub:
    member_target = "127.0.0.11:2379"

    def __init__(self) -> None:
        self.watches: list[Watch] = []

    def add(self, watch: Watch) -> None:
        self.watches.append(watch)

    def remove(self, watch: Watch) -> None:
        self.watches.remove(watch)


class _Ops:
    """Answers a listing of the session keys with ``present`` at ``revision``; fails
    ``failures`` times first."""

    layout = LAYOUT

    def __init__(self) -> None:
        self.present: set[int] = set()
        self.revision = 100
        self.failures = 0
        self.reads = 0

    def read(self, request: Any, what: str, budget_s: float | None = None) -> Any:
        self.reads += 1
        if self.failures:
            self.failures -= 1
            raise BackendUnavailable("no member answered")
        answer = etcdrpc.RangeResponse()
        answer.header.revision = self.revision
        for lease_id in sorted(self.present):
            answer.kvs.add(key=LAYOUT.session(lease_id))
        return answer


class _Ended:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ended: list[tuple[int, str, str, int]] = []

    def __call__(self, handle: EtcdSession, how: str, member: str, revision: int) -> None:
        with self.lock:
            self.ended.append((handle.lease_id, how, member, revision))

    def ids(self) -> list[int]:
        with self.lock:
            return sorted(e[0] for e in self.ended)


def _deleted(lease_id: int, revision: int, key: bytes | None = None) -> Any:
    event = etcdrpc.WatchResponse().events.add()
    event.type = event.DELETE
    event.kv.key = LAYOUT.session(lease_id) if key is None else key
    event.kv.mod_revision = revision
    return event


def _setup() -> tuple[SessionWatch, _Hub, _Ops, _Ended]:
    hub, ops, ended = _Hub(), _Ops(), _Ended()
    return SessionWatch(ops, hub, ended), hub, ops, ended  # type: ignore[arg-type]


def _session(lease_id: int) -> EtcdSession:
    return EtcdSession(lease_id, "w", 10.0)


def test_one_watch_for_every_session_from_the_first_key() -> None:
    watch, hub, _ops, _ended = _setup()
    a, b = _session(1), _session(2)
    for handle, revision in ((a, 10), (b, 11)):
        watch.expect(handle)
        watch.armed(handle, revision)
    assert len(hub.watches) == 1
    (w,) = hub.watches
    assert (w.key, w.next_revision) == (b"/p/sessions/", 11)
    watch.forget(a)
    assert len(hub.watches) == 1
    watch.forget(b)
    assert hub.watches == []  # the last session cancels it


def test_a_deleted_key_ends_its_session_only() -> None:
    watch, hub, ops, ended = _setup()
    mine = _session(7)
    watch.expect(mine)
    watch.armed(mine, 10)
    (w,) = hub.watches
    w.deliver([_deleted(8, 12), _deleted(7, 12, key=b"/p/sessions/7"),  # not ours
               _deleted(7, 13)])
    poll_until(lambda: ended.ids() == [7], 5.0)
    assert ended.ended[0][1:] == ("its session key was deleted (watch)", "127.0.0.11:2379", 13)
    w.deliver([_deleted(7, 14)])  # once
    assert ended.ids() == [7] and ops.reads == 0


def test_a_deletion_before_the_put_answered_is_not_missed() -> None:
    watch, hub, _ops, ended = _setup()
    first, late = _session(1), _session(2)
    watch.expect(first)
    watch.armed(first, 10)
    watch.expect(late)  # its put is on the way
    hub.watches[0].deliver([_deleted(2, 12)])
    poll_until(lambda: ended.ids() == [2], 5.0)


def test_compaction_reads_again_and_ends_only_sessions_whose_key_is_gone() -> None:
    watch, hub, ops, ended = _setup()
    alive, gone = _session(1), _session(2)
    for handle, revision in ((alive, 10), (gone, 11)):
        watch.expect(handle)
        watch.armed(handle, revision)
    ops.present = {1}
    ops.failures = 2  # the store does not answer at first: nothing is assumed
    hub.watches[0].lost()
    poll_until(lambda: ended.ids() == [2], 10.0)
    assert ops.reads == 3
    assert "read again" in ended.ended[0][1]
    watch.close()


def test_a_failed_read_ends_no_session() -> None:
    watch, hub, ops, ended = _setup()
    handle = _session(1)
    watch.expect(handle)
    watch.armed(handle, 10)
    ops.failures = 1_000_000
    hub.watches[0].lost()
    poll_until(lambda: ops.reads >= 2, 5.0)
    watch.close()  # stops the retries
    assert ended.ids() == []


def test_a_key_put_before_the_watch_started_is_read_again() -> None:
    """Another session's put started the watch at 21; this one's key was put at 10: a
    deletion in between would be missed, so the keys are read (here: it is there)."""
    watch, _hub, ops, ended = _setup()
    a, b = _session(1), _session(2)
    watch.expect(a)
    watch.expect(b)
    watch.armed(b, 20)
    ops.present = {1, 2}
    watch.armed(a, 10)
    poll_until(lambda: ops.reads == 1, 5.0)
    assert ended.ids() == []


def test_end_by_store_tells_the_listener_once() -> None:
    events: list[SessionEvent] = []
    handle = EtcdSession(5, "w", 10.0, events.append)
    handle.end_by_store("gone")
    handle.end_by_store("gone again")
    assert events == [SessionEvent.EXPIRED]
    assert handle.expiry is not None and "gone" in str(handle.expiry)


def test_ended_early_compares_with_the_promise() -> None:
    handle = _session(5)
    handle.promised(100.0, 3.0, "id 1")
    handle.promised(99.0, 3.0, "id 2")  # an older promise does not shorten it
    assert handle.ended_early(101.5) == (100.0, 3.0, "id 1")
    assert handle.ended_early(101.5) is None  # once
    late = _session(6)
    late.promised(100.0, 3.0, "id 1")
    assert late.ended_early(103.0) is None  # after the deadline: an ordinary expiry
    expected = _session(7)
    expected.promised(100.0, 3.0, "id 1")
    expected.end_expected()
    assert expected.ended_early(100.5) is None
