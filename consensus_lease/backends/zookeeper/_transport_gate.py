"""Starting kazoo requests without ever blocking past a deadline.

kazoo queues a request and wakes its connection thread by writing one byte to a socket
pair (``KazooClient._call``: see :func:`._transport_kazoo.send_request`); the connection thread
reads that byte back when it sends the request, which it only does while connected.
While it reconnects (a member SIGKILLed) or is stuck writing to a stalled server, the
bytes pile up; once the pair's buffer is full (about 278 one-byte writes on Linux) the
caller's ``send`` blocks, inside kazoo and beyond any timeout, until a connection is
made again. A few hundred pipelined reads get there: a ``queue_stats`` of 5,000 jobs
blocked for as long as the server was down.

So every request the backend starts goes through the client's :class:`Gate`:

* at most :data:`IN_FLIGHT` of them are started and not yet answered (kazoo sets every
  queued request's result, with ``ConnectionLoss``, when the connection goes);
* none is started while the client is disconnected;
* waiting for either ends at the caller's deadline (:class:`NotSent`: nothing was sent).

The pair then holds at most ``2 x IN_FLIGHT`` bytes: those of requests in flight, and
those left by requests a lost connection failed before they were sent (drained once
connected again).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from ._transport_kazoo import AsyncResult

__all__ = ["IN_FLIGHT", "Gate", "NotSent"]

IN_FLIGHT = 100
"""Requests one client may have started and not answered. Twice this stays below the
socket pair's buffer with room to spare for kazoo's own requests (``ensure_path``'s
chained creates, a ``close``). Enough to keep a LAN round trip busy: kazoo's single
connection thread, not the window, limits throughput there."""

RECONNECT_POLL_S = 0.02
"""How often a request waiting for the client to reconnect looks again."""


class NotSent(KazooTimeoutError):  # type: ignore[misc]  # kazoo is untyped
    """The deadline passed before the request could be started: nothing was sent."""


class Gate:
    """The requests this process has in flight on one kazoo client (see the module
    docstring). Thread-safe.

    Args:
        client: the kazoo client all requests through this gate go to.
    """

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._in_flight: deque[Any] = deque()
        self._starting = 0  # slots taken by requests being started right now

    def start(self, begin: Callable[[], Any], deadline: float) -> Any:
        """Start one request with ``begin()`` (a kazoo ``*_async`` call, a transaction's
        ``commit_async``, or a packed multi queued on the client's connection: see
        ``_transport_kazoo.send_request``) and return its async result, once the client is
        connected and a slot is free, by ``deadline`` (``time.monotonic()`` seconds).

        Raises:
            NotSent: the deadline passed first (disconnected, or every slot taken).
            SessionExpiredError: the client's session is lost, or the client stopped.
            Whatever ``begin`` raises (nothing was started then).
        """
        while True:
            if time.monotonic() >= deadline:
                raise NotSent("not connected, or too many requests in flight, until the deadline")
            with self._lock:
                busy = self._busy()
                go = busy is None and self.client.connected
                if go:
                    self._starting += 1
                elif busy is None and self.client.state == KazooState.LOST:
                    raise SessionExpiredError("the ZooKeeper session of this client is lost")
            if go:  # (the start is written out here, not in a method: one call fewer)
                result = None
                try:
                    result = begin()
                    return result
                finally:
                    with self._lock:
                        self._starting -= 1
                        if isinstance(result, AsyncResult):  # (a stand-in, in tests, counts
                            self._in_flight.append(result)  # as answered)
            left = max(0.0, deadline - time.monotonic())
            if busy is not None:
                busy.wait(left)
            else:
                threading.Event().wait(min(left, RECONNECT_POLL_S))  # reconnecting

    def _busy(self) -> Any:
        """``None`` if a slot is free, else something to wait on: a request in flight
        (or a short pause while other threads are starting theirs). Under ``_lock``."""
        while self._in_flight and self._in_flight[0].ready():
            self._in_flight.popleft()
        if len(self._in_flight) + self._starting < IN_FLIGHT:
            return None
        self._in_flight = deque(r for r in self._in_flight if not r.ready())
        if len(self._in_flight) + self._starting < IN_FLIGHT:
            return None
        if not self._in_flight:
            return _Starting()
        # Answers come in order: wait for half of them, not one (fewer wake-ups).
        return self._in_flight[len(self._in_flight) // 2]

    def in_flight(self) -> int:
        """Requests started and not answered yet (for tests)."""
        with self._lock:
            return sum(not r.ready() for r in self._in_flight) + self._starting


class _Starting:
    """Stands for the requests other threads are starting right now: wait briefly."""

    @staticmethod
    def wait(timeout: float) -> None:
        threading.Event().wait(min(timeout, RECONNECT_POLL_S))
