"""``LeaseKeepAlive`` streams shared by every session of a driver, one per member.

pyetcd's ``refresh_lease`` opens a new stream per keepalive. Here one long-lived
bidirectional stream per member carries the keepalives of every session of the driver,
as etcd's Go client (its ``lessor``) does: a keepalive is one request message and one
response message. Streams are opened when first needed.

**Sharing a stream, not its failures.** etcd handles the requests of one stream one at a
time and answers them in order, so answers are matched to requests first-in first-out
per lease id. A request that gets no answer in time is *abandoned*, never taken out of
that order: it keeps its place, and its late answer is dropped when it comes, so an
answer is only ever taken by the request it answers and always proves the lease alive
*after* that request's send time (which is what the session's local deadline assumes:
the send time of the keepalive call, before any of its requests). One slow answer ends
nothing but its own wait: the stream and every other session's request on it go on.
Only a stream that breaks (the member closed it, the connection died, etcd refused it)
or that stalls (requests wait on it and nothing at all was answered for ``stall_s``,
see below) is dropped, and each request on it fails over at once.

**Failover within a small part of the TTL.** One keepalive call (:meth:`KeepAliveStreams.
keepalive`) sends its request on the preferred member's stream. When that request's
stream fails, the request is sent at once on the next member's; when the stream is
silent — nothing answered on it, for this request or any other, for ``attempt_s`` since
the request was sent — a hedged request goes to the next member as well, without
abandoning the first. Whichever answers first ends the call; the call fails once
``budget_s`` has passed. A stream that keeps answering others (a busy host, a busy
member) is waited on: its answers are late, not lost, and more requests would only queue
behind them. The member that answers a hedge becomes the preferred one for the next
calls; a member whose stream broke is left (the transport moves to the next member too).
A stream is reopened on a member after a pause only if its last one died without
answering: 25 ms, doubling up to 100 ms per member, so sessions retrying together during
an outage open about ten streams a second per member.

Worst case of one renewal (the formula behind the headroom; ``TTL`` the granted TTL):
a keepalive is sent every ``TTL/3`` and the local deadline is its send time ``+ TTL -
margin``, so a renewal answered ``d`` seconds after it was due leaves ``TTL - margin -
TTL/3 - d`` seconds (``0.567 TTL - d`` with the default 10% margin). Here ``d`` is at
most one round trip when the member in use refuses or dies (the failover is immediate),
``attempt_s`` (``max(0.15, TTL/20)``, at most ``stall_s``) per silent member before a live
one, and, when the leader dies, the cluster's own election: no member renews a lease
until a new leader exists, and a request held by a follower meanwhile is answered as soon
as one does. So ``d <= max(E, attempt_s) + RTT`` with one member down, where ``E`` is the
election's length (about 1-2 x etcd's ``--election-timeout``): headroom stays at or above
40% of the TTL while ``E <= TTL/6 - RTT``, e.g. an election under 0.8 s at TTL 5 s. A
call gives up after ``budget_s`` (``min(timeout_s, max(0.2, 2 TTL/3))``), and the session
retries until its local deadline; a stream that answers nothing for ``stall_s``
(``min(timeout_s, max(0.2, TTL/3))``) is dropped and its calls move to the next member.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
from pyetcd import etcdrpc

from ._transport import Failure, Member, Transport

__all__ = ["KeepAliveCall", "KeepAliveStreams"]

log = logging.getLogger("consensus_lease.etcd")

FIRST_REOPEN_PAUSE_S = 0.025
"""Pause before reopening on a member after a stream there died without answering;
doubled after each such stream in a row."""
MAX_REOPEN_PAUSE_S = 0.1
"""Longest pause before reopening a stream on a member."""


class _Renewal:
    """One keepalive call: its requests, one per member at most; the first answer wins.

    ``changed`` is set at every answer or failure of one of its requests (an event
    shared by the calls one thread runs together)."""

    __slots__ = ("answer", "changed", "failed", "finished")

    def __init__(self, changed: threading.Event) -> None:
        self.changed = changed
        self.answer: tuple[int, Any, _Stream] | None = None
        self.failed: list[tuple[_Stream, Failure]] = []
        self.finished = False  # the call returned: later answers are dropped

    def answered(self, stream: _Stream, ttl: int, header: Any) -> None:
        if self.answer is None and not self.finished:
            self.answer = (ttl, header, stream)
        self.changed.set()

    def broke(self, stream: _Stream, failure: Failure) -> None:
        self.failed.append((stream, failure))
        self.changed.set()


class KeepAliveCall:
    """One lease's keepalive call (see :meth:`KeepAliveStreams.keepalive`) and its state
    while it runs; ``result`` is the TTL and header answered, or the ``Failure`` it
    ended with."""

    __slots__ = ("asked", "attempt_s", "budget_s", "deadline", "last", "lease_id",
                 "reauthenticated", "renewal", "result", "seen", "stall_s", "tried")

    def __init__(self, lease_id: int, budget_s: float, attempt_s: float,
                 stall_s: float | None = None, tried: list[Failure] | None = None) -> None:
        self.lease_id = lease_id
        self.budget_s = budget_s
        self.attempt_s = attempt_s
        self.stall_s = stall_s
        self.tried = tried
        self.result: tuple[int, Any] | Failure | None = None
        self.renewal = _Renewal(threading.Event())
        self.deadline = 0.0  # monotonic; set when it starts
        self.asked: dict[int, tuple[_Stream, float]] = {}  # id(member) -> its request
        self.seen = 0  # failures of renewal.failed handled
        self.reauthenticated = False
        self.last: Failure | None = None


class _Stream:
    """One open LeaseKeepAlive call on one member, with its reader thread."""

    def __init__(self, member: Member, metadata: tuple[tuple[str, str], ...]) -> None:
        self.member = member
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending: dict[int, collections.deque[_Renewal]] = {}
        self._waiting = 0  # requests sent and not answered
        self.failure: Failure | None = None
        self.answered = False  # carried at least one answer
        self.last_answer = time.monotonic()  # monotonic; the open time until an answer
        try:
            self._call = member.lease.LeaseKeepAlive(self._request_iter(), metadata=metadata)
        except ValueError as exc:  # grpc: "Cannot invoke RPC on closed channel!"
            self.failure = Failure(member.target, None, str(exc))
            return
        self._reader = threading.Thread(
            target=self._read, name=f"consensus-lease-etcd-keepalive-{member.target}", daemon=True
        )
        self._reader.start()

    def _request_iter(self) -> Iterator[Any]:
        while True:
            item = self._requests.get()
            if item is None:
                return
            yield item

    def request(self, lease_id: int, renewal: _Renewal) -> None:
        """Queue one keepalive for ``lease_id``, answered to ``renewal``. Raises the
        stream's Failure if it is dead."""
        with self._lock:  # queue order == request order, per lease id
            if self.failure is not None:
                raise self.failure
            if not self._waiting:
                self.last_answer = time.monotonic()  # silence is counted from here
            self._pending.setdefault(lease_id, collections.deque()).append(renewal)
            self._waiting += 1
            self._requests.put(etcdrpc.LeaseKeepAliveRequest(ID=lease_id))

    def silent_s(self, now: float) -> float:
        """Seconds for which requests have waited on this stream and nothing was
        answered (0 while none waits)."""
        with self._lock:
            return now - self.last_answer if self._waiting else 0.0

    def _read(self) -> None:
        try:
            for response in self._call:
                with self._lock:
                    self.answered = True
                    self.last_answer = time.monotonic()
                    pending = self._pending.get(response.ID)
                    renewal = pending.popleft() if pending else None
                    if renewal is not None:
                        self._waiting -= 1
                        if not pending:
                            del self._pending[response.ID]
                if renewal is not None:  # an abandoned one drops it (finished)
                    renewal.answered(self, int(response.TTL), response.header)
            failure = Failure(self.member.target, grpc.StatusCode.UNAVAILABLE, "stream ended")
        except grpc.RpcError as exc:
            failure = Failure.from_rpc(self.member.target, exc)
        except Exception as exc:  # never leave waiters hanging on a reader crash
            log.exception("etcd keepalive reader crashed")
            failure = Failure(self.member.target, None, f"keepalive reader crashed: {exc!r}")
        self.fail(failure)

    def fail(self, failure: Failure) -> None:
        """Mark the stream dead, tell every renewal waiting on it, cancel the call."""
        with self._lock:
            if self.failure is None:
                self.failure = failure
            renewals = [r for pending in self._pending.values() for r in pending]
            self._pending.clear()
            self._waiting = 0
        for renewal in renewals:
            renewal.broke(self, self.failure)
        if hasattr(self, "_call"):
            self._requests.put(None)
            self._call.cancel()


class _Slot:
    """A member's stream, and the pause before the next one is opened there."""

    __slots__ = ("failure", "open_at", "pause_s", "stream")

    def __init__(self) -> None:
        self.stream: _Stream | None = None
        self.failure: Failure | None = None  # of the last stream retired
        self.pause_s = 0.0
        self.open_at = 0.0  # monotonic time before which no stream is opened


class KeepAliveStreams:
    """Keepalives over one shared stream per member; see the module docstring."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._lock = threading.Lock()
        self._slots = {id(member): _Slot() for member in transport.members}
        self._preferred: Member | None = None  # default: the transport's current member
        self._closed = threading.Event()

    # -- streams ------------------------------------------------------------------------

    def _order(self) -> list[Member]:
        """Every member, the preferred one first, then in URL order after it."""
        members = self._transport.members
        with self._lock:
            first = self._preferred
        if first is None:
            first = self._transport.member()
        start = members.index(first)
        return members[start:] + members[:start]

    def _stream(self, member: Member, now: float) -> _Stream | float:
        """The member's open stream, or a new one; else the monotonic time at which one
        may be opened (after a stream there died without answering)."""
        with self._lock:
            slot = self._slots[id(member)]
            stream = slot.stream
            if stream is not None and stream.failure is None:
                return stream
            if stream is not None:
                self._retire(slot, stream, stream.failure or Failure(member.target, None, "?"))
            if now < slot.open_at:
                return slot.open_at
            slot.stream = _Stream(member, self._transport.metadata())
            return slot.stream

    def _retire(self, slot: _Slot, stream: _Stream, failure: Failure) -> None:
        """Forget a dead stream (with ``_lock`` held): leave its member, and set the
        pause before the next stream is opened there."""
        if slot.stream is not stream:
            return  # another thread already did
        slot.stream = None
        slot.failure = failure
        if failure.transient:
            self._transport.rotate(stream.member)
            if self._preferred is stream.member:
                members = self._transport.members
                self._preferred = members[(members.index(stream.member) + 1) % len(members)]
        if stream.answered:
            slot.pause_s = 0.0
        else:
            slot.pause_s = min(max(2 * slot.pause_s, FIRST_REOPEN_PAUSE_S), MAX_REOPEN_PAUSE_S)
        slot.open_at = time.monotonic() + slot.pause_s

    def _drop(self, stream: _Stream, failure: Failure) -> None:
        stream.fail(failure)
        with self._lock:
            self._retire(self._slots[id(stream.member)], stream, stream.failure or failure)

    def _prefer(self, member: Member) -> None:
        with self._lock:
            self._preferred = member

    # -- keepalive ----------------------------------------------------------------------

    def keepalive(
        self,
        lease_id: int,
        budget_s: float,
        attempt_s: float,
        tried: list[Failure] | None = None,
        stall_s: float | None = None,
    ) -> tuple[int, Any]:
        """Keep ``lease_id`` alive: one request on the preferred member's stream, moved
        to the next member at once when its stream fails, hedged on the next member
        when its stream is silent for ``attempt_s`` seconds, until an answer or until
        ``budget_s`` seconds have passed (see the module docstring). Returns the TTL
        etcd answered, in seconds (<= 0: the lease is gone), and the answer's header
        (revision and cluster id of the member that answered; not linearizable). Every
        failed request is appended to ``tried``. A stream on which requests waited and
        nothing was answered for ``stall_s`` seconds (default ``budget_s``) is dropped.

        Raises:
            Failure: a refusal not worth retrying (at once), or, once ``budget_s`` has
                passed or the store is closed, the last failure (DEADLINE_EXCEEDED for a
                request still unanswered); the lease may still be alive.
        """
        call = KeepAliveCall(lease_id, budget_s, attempt_s, stall_s, tried)
        self.keepalive_many([call])
        if isinstance(call.result, Failure):
            raise call.result
        assert call.result is not None
        return call.result

    def keepalive_many(
        self, calls: Sequence[KeepAliveCall],
        on_result: Callable[[KeepAliveCall], None] | None = None,
    ) -> None:
        """Run every call as :meth:`keepalive` runs one, all at once from this thread:
        their requests are sent together (pipelined on the streams) and each call ends
        on its own answer, failure or budget, setting its ``result``;
        ``on_result(call)`` is called as each one ends (not when the last one does),
        from this thread."""
        changed = threading.Event()  # shared by the calls' renewals: one thread waits
        now = time.monotonic()
        for call in calls:
            call.renewal = _Renewal(changed)
            call.deadline = now + call.budget_s
        pending = list(calls)
        try:
            while pending:
                changed.clear()
                wake = float("inf")
                still: list[KeepAliveCall] = []
                for call in pending:
                    at = self._step(call)
                    if at is None:
                        call.renewal.finished = True
                        if on_result is not None:
                            on_result(call)
                    else:
                        still.append(call)
                        wake = min(wake, at)
                pending = still
                if pending:
                    changed.wait(max(0.0, wake - time.monotonic()))
        finally:
            for call in calls:
                call.renewal.finished = True

    def _step(self, call: KeepAliveCall) -> float | None:
        """Look at one call after something changed: ``None`` once it has its result,
        else the monotonic time at which to look again."""
        renewal = call.renewal
        if renewal.answer is not None:
            ttl, header, stream = renewal.answer
            first = self._order()[0]
            if stream.member is not first and id(first) in call.asked:
                self._prefer(stream.member)  # it answered, the preferred did not
            call.result = (ttl, header)
            return None
        for stream, failure in renewal.failed[call.seen:]:
            call.seen += 1
            call.asked.pop(id(stream.member), None)
            self._drop(stream, failure)
            call.last = failure
            if call.tried is not None:
                call.tried.append(failure)
            if failure.token_rejected and not call.reauthenticated:
                call.reauthenticated = True
                self._transport.authenticate()
            elif not failure.transient:
                call.result = failure
                return None
        if self._closed.is_set():
            call.result = Failure(self._transport.config.describe(),
                                  grpc.StatusCode.CANCELLED, "the store is closed")
            return None
        now = time.monotonic()
        if now >= call.deadline:
            call.result = self._timed_out(call.asked, now, call.last, call.tried)
            return None
        wake = self._send(call.lease_id, renewal, call.asked, call.attempt_s,
                          call.budget_s if call.stall_s is None else call.stall_s, now)
        return min(wake, call.deadline)

    def _send(self, lease_id: int, renewal: _Renewal, asked: dict[int, tuple[_Stream, float]],
              attempt_s: float, stall_s: float, now: float) -> float:
        """Send the renewal's request on the next member if none asked so far can still
        answer in time (see the module docstring); returns when to look again
        (monotonic)."""
        hedge_at = float("inf")
        for stream, sent in list(asked.values()):
            silent = stream.silent_s(now)
            if silent >= stall_s:  # stalled for everyone: drop it
                self._drop(stream, Failure(
                    stream.member.target, grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"nothing answered on the keepalive stream for {silent:.3g} s"))
                return now  # its failure reaches the renewal
            hedge_at = min(hedge_at, max(now - silent, sent) + attempt_s)
        if asked and hedge_at > now:
            return hedge_at  # one of them may still answer
        open_at = float("inf")  # of a member not asked yet, after a pause
        for member in self._order():
            if id(member) in asked:
                continue
            opened = self._stream(member, now)
            if isinstance(opened, float):
                open_at = min(open_at, opened)
                continue
            try:
                opened.request(lease_id, renewal)
            except Failure as failure:
                renewal.broke(opened, failure)
                return now
            asked[id(member)] = (opened, now)
            return now + attempt_s
        return open_at  # every member asked (wait for an answer), or paused

    def _timed_out(self, asked: dict[int, tuple[_Stream, float]], now: float,
                   last: Failure | None, tried: list[Failure] | None) -> Failure:
        for stream, sent in asked.values():
            last = Failure(stream.member.target, grpc.StatusCode.DEADLINE_EXCEEDED,
                           f"no keepalive answer within {now - sent:.3g} s")
            if tried is not None:
                tried.append(last)
        if last is None:  # other calls' streams failed while this one waited to open
            with self._lock:
                last = next((slot.failure for slot in self._slots.values() if slot.failure),
                            None)
        return last or Failure(self._transport.config.describe(),
                               grpc.StatusCode.UNAVAILABLE, "no keepalive stream")

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            streams = [slot.stream for slot in self._slots.values() if slot.stream]
            for slot in self._slots.values():
                slot.stream = None
        for stream in streams:
            stream.fail(Failure(stream.member.target, grpc.StatusCode.CANCELLED, "closed"))
