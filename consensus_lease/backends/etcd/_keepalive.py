"""One long-lived ``LeaseKeepAlive`` stream shared by every session of a driver.

pyetcd's ``refresh_lease`` opens a new stream per keepalive. Here one bidirectional
stream per driver carries every session's keepalives, as etcd's Go client (its
``lessor``) does: a keepalive is one request message and one response message.

etcd answers the requests of one stream in order (the server handles each request
before reading the next), so answers are matched to waiters first-in first-out per lease
id. A waiter that times out tears the whole stream down, so a late answer can never be
taken for a later request: an answer always proves the lease was alive *after* its
waiter's send time, which is what the session's local deadline assumes.

One keepalive is several short attempts, not one long wait (:meth:`KeepAliveStreams.
keepalive`): an attempt that fails or gets no answer within ``attempt_s`` drops the
stream, which moves the transport to the next member, and is retried on a stream
reopened there. During a leader election no member answers (a follower refuses a new
stream at once with "no leader", or holds a forwarded renewal until a new leader takes
it), and a member can keep a renewal for seconds after the election; short attempts that
move on reach a member that answers within about ``attempt_s`` of the election's end.
Reopening is paced for the whole driver, not per session: the first reopen after a
stream that carried answers is immediate; after a stream that died without answering,
the next waits 25 ms, doubling up to 100 ms, so all sessions retrying together during
an outage open about ten streams a second. Patience is driver-wide too: after a stream
that never answered within ``attempt_s``, attempts on the next one wait twice as long
(up to 8 times ``attempt_s``, and never past the keepalive's budget), back to
``attempt_s`` once a stream answers; so a cluster that is slow rather than dead (every
answer later than ``attempt_s``) still renews, instead of every session's short attempt
tearing down the stream the others wait on.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
from pyetcd import etcdrpc

from ._transport import Failure, Member, Transport

__all__ = ["KeepAliveStreams"]

log = logging.getLogger("consensus_lease.etcd")

FIRST_REOPEN_PAUSE_S = 0.025
"""Pause before reopening after a stream that died without answering; doubled after
each such stream in a row."""
MAX_REOPEN_PAUSE_S = 0.1
"""Longest pause before reopening a stream."""
MAX_PATIENCE = 8.0
"""Most a keepalive attempt's wait is stretched (times ``attempt_s``) after streams that
timed out without answering."""


class _Waiter:
    __slots__ = ("done", "failure", "header", "ttl")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ttl = 0
        self.header: Any = None
        self.failure: Failure | None = None


class _Stream:
    """One open LeaseKeepAlive call on one member, with its reader thread."""

    def __init__(self, member: Member, metadata: tuple[tuple[str, str], ...]) -> None:
        self.member = member
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiters: dict[int, collections.deque[_Waiter]] = {}
        self.failure: Failure | None = None
        self.answered = False  # carried at least one answer
        self.patience = 1.0  # attempts on it wait this many times their attempt_s
        self._call = member.lease.LeaseKeepAlive(self._request_iter(), metadata=metadata)
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

    def request(self, lease_id: int) -> _Waiter:
        """Queue one keepalive for ``lease_id``. Raises the stream's Failure if dead."""
        waiter = _Waiter()
        with self._lock:  # waiter order == request order, per lease id
            if self.failure is not None:
                raise self.failure
            self._waiters.setdefault(lease_id, collections.deque()).append(waiter)
            self._requests.put(etcdrpc.LeaseKeepAliveRequest(ID=lease_id))
        return waiter

    def _read(self) -> None:
        try:
            for response in self._call:
                with self._lock:
                    self.answered = True
                    pending = self._waiters.get(response.ID)
                    waiter = pending.popleft() if pending else None
                if waiter is not None:
                    waiter.ttl = int(response.TTL)
                    waiter.header = response.header
                    waiter.done.set()
            failure = Failure(self.member.target, grpc.StatusCode.UNAVAILABLE, "stream ended")
        except grpc.RpcError as exc:
            failure = Failure.from_rpc(self.member.target, exc)
        except Exception as exc:  # never leave waiters hanging on a reader crash
            log.exception("etcd keepalive reader crashed")
            failure = Failure(self.member.target, None, f"keepalive reader crashed: {exc!r}")
        self.fail(failure)

    def fail(self, failure: Failure) -> None:
        """Mark the stream dead, wake every waiter with ``failure``, cancel the call."""
        with self._lock:
            if self.failure is None:
                self.failure = failure
            waiters = [w for pending in self._waiters.values() for w in pending]
            self._waiters.clear()
        for waiter in waiters:
            waiter.failure = self.failure
            waiter.done.set()
        self._requests.put(None)
        self._call.cancel()


class KeepAliveStreams:
    """Keepalives over one shared stream, reopened on the next member after a failure."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._lock = threading.Lock()
        self._stream: _Stream | None = None
        self._closed = threading.Event()
        self._pause_s = 0.0  # before the next reopen, after streams that never answered
        self._patience = 1.0  # of the next stream (see _Stream.patience)
        self._last_failure: Failure | None = None  # of the last stream retired
        self._open_at = 0.0  # monotonic time before which no stream is opened

    def _current(self, until: float) -> _Stream:
        """The open stream, or a new one on the transport's current member once the
        reopen pause has passed. Raises :class:`Failure` if closed, or (the last
        stream's failure) if the pause lasts past ``until`` (monotonic)."""
        while True:
            with self._lock:
                stream = self._stream
                if stream is not None and stream.failure is not None:
                    self._retire(stream, stream.failure)
                    stream = None
                if stream is not None:
                    return stream
                wait_s = self._open_at - time.monotonic()
                if wait_s <= 0 and not self._closed.is_set():
                    self._stream = _Stream(self._transport.member(), self._transport.metadata())
                    self._stream.patience = self._patience
                    return self._stream
            if self._closed.is_set() or time.monotonic() + wait_s > until:
                raise self._gate_failure()
            if self._closed.wait(wait_s):
                raise self._gate_failure()

    def _gate_failure(self) -> Failure:
        if self._closed.is_set():
            return Failure(self._transport.config.describe(), grpc.StatusCode.CANCELLED,
                           "the store is closed")
        with self._lock:
            last = self._last_failure
        return last or Failure(self._transport.config.describe(),
                               grpc.StatusCode.UNAVAILABLE, "no keepalive stream")

    def _retire(self, stream: _Stream, failure: Failure) -> None:
        """Forget a dead current stream (with ``_lock`` held): move to the next member
        and set the pause before the next reopen."""
        if self._stream is not stream:
            return  # another thread already did
        self._stream = None
        self._last_failure = failure
        if failure.transient:
            self._transport.rotate(stream.member)
        if stream.answered:
            self._pause_s, self._patience = 0.0, 1.0
        else:
            self._pause_s = min(max(2 * self._pause_s, FIRST_REOPEN_PAUSE_S), MAX_REOPEN_PAUSE_S)
            if failure.code is grpc.StatusCode.DEADLINE_EXCEEDED:  # silent, not refused
                self._patience = min(2 * stream.patience, MAX_PATIENCE)
        self._open_at = time.monotonic() + self._pause_s

    def _drop(self, stream: _Stream, failure: Failure) -> None:
        stream.fail(failure)
        with self._lock:
            self._retire(stream, stream.failure or failure)

    def keepalive(
        self,
        lease_id: int,
        budget_s: float,
        attempt_s: float,
        tried: list[Failure] | None = None,
    ) -> tuple[int, Any]:
        """Keep ``lease_id`` alive: attempts on the shared stream, each waiting
        ``attempt_s`` seconds for its answer (longer on a stream opened after silent
        ones), retried on the next member while less than ``budget_s`` seconds have
        passed (so it returns within about ``budget_s + attempt_s``; see the module
        docstring). Returns the TTL etcd answered, in seconds (<= 0: the lease is gone),
        and the answer's header (revision and cluster id of the member that answered;
        not linearizable). Every failed attempt is appended to ``tried``.

        Raises:
            Failure: the last attempt's failure once the budget is spent or the store is
                closed (at once if it is not worth retrying); the lease may still be
                alive.
        """
        deadline = time.monotonic() + budget_s
        while True:
            left_s = max(attempt_s, deadline - time.monotonic())
            try:
                return self._attempt(lease_id, attempt_s, left_s)
            except Failure as exc:
                failure = exc
            if tried is not None:
                tried.append(failure)
            if not failure.transient or self._closed.is_set() or time.monotonic() >= deadline:
                raise failure

    def _attempt(self, lease_id: int, attempt_s: float, most_s: float) -> tuple[int, Any]:
        """One keepalive on the current stream, waiting ``attempt_s`` times the stream's
        patience, but not past ``most_s`` from now (unless reopening took that long:
        then ``attempt_s``). Raises :class:`Failure`: no answer in time, or the stream
        broke (the stream is then dropped)."""
        until = time.monotonic() + most_s
        for retry_auth in (True, False):
            stream = self._current(until)
            timeout_s = min(attempt_s * stream.patience, max(attempt_s, until - time.monotonic()))
            try:
                waiter = stream.request(lease_id)
            except Failure as failure:
                self._drop(stream, failure)
                raise
            if not waiter.done.wait(timeout_s):
                timed_out = Failure(
                    stream.member.target,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"no keepalive answer within {timeout_s:.3g} s",
                )
                self._drop(stream, timed_out)
                raise timed_out
            if waiter.failure is None:
                return waiter.ttl, waiter.header
            self._drop(stream, waiter.failure)
            if retry_auth and waiter.failure.token_rejected:
                self._transport.authenticate()
                continue
            raise waiter.failure
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.fail(Failure(stream.member.target, grpc.StatusCode.CANCELLED, "closed"))
