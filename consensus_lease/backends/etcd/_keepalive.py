"""One long-lived ``LeaseKeepAlive`` stream shared by every session of a driver.

pyetcd's ``refresh_lease`` opens a new stream per keepalive. Here one bidirectional
stream per driver carries every session's keepalives, as etcd's Go client (its
``lessor``) does: a keepalive is one request message and one response message.

etcd answers the requests of one stream in order (the server handles each request
before reading the next), so answers are matched to waiters first-in first-out per lease
id. A waiter that times out tears the whole stream down, so a late answer can never be
taken for a later request: an answer always proves the lease was alive *after* its
waiter's send time, which is what the session's local deadline assumes.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
from pyetcd import etcdrpc

from ._transport import Failure, Member, Transport

__all__ = ["KeepAliveStreams"]

log = logging.getLogger("consensus_lease.etcd")


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
    """Keepalives over one shared stream, reopened on the current member after a failure."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._lock = threading.Lock()
        self._stream: _Stream | None = None

    def _current(self) -> _Stream:
        with self._lock:
            if self._stream is None or self._stream.failure is not None:
                self._stream = _Stream(self._transport.member(), self._transport.metadata())
            return self._stream

    def _drop(self, stream: _Stream, failure: Failure) -> None:
        stream.fail(failure)
        if failure.transient:
            self._transport.rotate(stream.member)
        with self._lock:
            if self._stream is stream:
                self._stream = None

    def keepalive(self, lease_id: int, timeout_s: float) -> tuple[int, Any]:
        """Send one keepalive for ``lease_id``; return the TTL etcd answered (<= 0: the
        lease is gone) and the answer's header (revision and cluster id of the member
        that answered; not linearizable).

        Raises:
            Failure: no answer within ``timeout_s`` or the stream broke; the lease may
                still be alive.
        """
        for retry_auth in (True, False):
            stream = self._current()
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
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.fail(Failure(stream.member.target, grpc.StatusCode.CANCELLED, "closed"))
