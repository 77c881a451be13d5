"""One shared etcd ``Watch`` stream per driver, carrying every watch of its subscriptions.

etcd multiplexes watches on one bidirectional ``Watch`` stream: each create request gets
a watch id (etcd answers a stream's create requests in the order they were sent), events
come tagged with their watch's id, and a cancel request ends one watch without touching
the others. As etcd's Go client (``clientv3``'s watcher) does, a :class:`WatchHub` keeps
ONE such stream per driver on the transport's current member, however many watches run:
opened lazily with the first watch, ended :data:`IDLE_EXIT_S` after the last one.

No event is lost when the stream breaks: each :class:`Watch` remembers the revision after
the last event it was given (``next_revision``), and the hub re-creates every watch from
there on a new stream (on the next member after a transport failure), after a pause that
grows with consecutive failed attempts. etcd delivers a watch's events in revision order
from its start revision on, none skipped, the events of one revision in one response; if
that revision has been compacted meanwhile, etcd cancels the watch naming the compaction
revision, and the hub re-creates it from there and tells the watch it may have missed
events (:attr:`Watch.lost`). A broken stream that had answered anything is reported once
to the hub's owner (``on_failure``), who wakes every subscriber: spurious, but a waiter
then re-checks the store itself instead of trusting a watch that was down for a while.

A stream that stays silent is probed: after :data:`HEARTBEAT_S` without a response the
hub sends a progress request (etcd >= 3.4), and a stream that does not answer it within
the driver's ``timeout_s`` is treated as broken (a member frozen with its sockets open
answers nothing, and gRPC's own keepalive would take 15 s to notice).

Threads: one per hub, which reads the stream's responses and reconnects, plus the one
gRPC runs to send a stream's requests; none per watch.
"""

from __future__ import annotations

import collections
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyetcd import etcdrpc

from ...errors import BackendUnavailable, LeaseError
from ._transport import Failure, Member, Transport, rpc_failures

__all__ = ["HEARTBEAT_S", "IDLE_EXIT_S", "Watch", "WatchHub"]

log = logging.getLogger("consensus_lease.etcd")

IDLE_EXIT_S = 1.0
"""Seconds the stream (and the hub's thread) stays open without any watch."""

HEARTBEAT_S = 2.0
"""Seconds of silence on the stream after which the hub sends a progress request."""

TICK_S = 0.25
"""How often the request side of a stream checks for idleness and silence (seconds)."""

RETRY_MIN_S = 0.05
RETRY_MAX_S = 2.0
"""Pause before re-opening a broken stream: doubling from the first to the second with
each failed attempt in a row (seconds)."""

_STOP = object()  # ends a stream's request iterator
_IDLE, _STALLED, _CLOSED = "idle", "stalled", "closed"  # why the hub ended a stream


class Watch:
    """One watched key range ``[key, range_end)`` with etcd's event ``filters``.

    ``deliver(events)`` gets the events of each watch response (one or more whole
    revisions, oldest first); ``lost()`` is called when events may have been missed
    (their revision was compacted). Both run on the hub's thread and must not block.
    ``next_revision`` is where the watch (re)starts: every event before it was given to
    ``deliver``.
    """

    __slots__ = ("deliver", "filters", "key", "lost", "next_revision", "range_end", "removed",
                 "watch_id")

    def __init__(self, key: bytes, range_end: bytes, next_revision: int,
                 deliver: Callable[[Sequence[Any]], None], lost: Callable[[], None],
                 filters: tuple[int, ...] = ()) -> None:
        self.key = key
        self.range_end = range_end
        self.next_revision = next_revision
        self.deliver = deliver
        self.lost = lost
        self.filters = filters
        self.watch_id: int | None = None  # etcd's id on the current stream
        self.removed = False

    def create_request(self) -> Any:
        return etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
            key=self.key, range_end=self.range_end, start_revision=self.next_revision,
            filters=list(self.filters)))


class _Stream:
    """One open ``Watch`` call on one member. Its fields are guarded by the hub's lock."""

    def __init__(self, member: Member, metadata: tuple[tuple[str, str], ...],
                 tick: Callable[[_Stream], Any]) -> None:
        self.member = member
        self.requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.pending: collections.deque[Watch] = collections.deque()  # creates not answered
        self.ids: dict[int, Watch] = {}
        self.heard = False
        self.last_heard = time.monotonic()
        self.probe_sent: float | None = None
        self.ending: str | None = None
        self._tick = tick
        self.call: Any = None
        self.call = member.watch.Watch(self._requests(), metadata=metadata)

    def _requests(self) -> Iterator[Any]:
        while True:
            try:
                item = self.requests.get(timeout=TICK_S)
            except queue.Empty:
                item = self._tick(self)
            if item is _STOP:
                return
            if item is not None:
                yield item

    def create(self, watch: Watch) -> None:
        watch.watch_id = None
        self.pending.append(watch)
        self.requests.put(watch.create_request())

    def cancel(self, watch_id: int) -> None:
        self.requests.put(etcdrpc.WatchRequest(
            cancel_request=etcdrpc.WatchCancelRequest(watch_id=watch_id)))

    def end(self) -> None:
        """Stop sending and cancel the call (``ending`` says why)."""
        self.requests.put(_STOP)
        if self.call is not None:
            self.call.cancel()


class WatchHub:
    """Every watch of one driver, on one shared stream. Thread-safe.

    Args:
        transport: the driver's transport (members, auth metadata, failover).
        on_failure: called (on the hub's thread, without blocking) when a stream that
            had answered breaks; the hub then re-creates every watch on a new one.
    """

    def __init__(self, transport: Transport, on_failure: Callable[[], None]) -> None:
        self._transport = transport
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._watches: dict[Watch, None] = {}  # insertion-ordered set
        self._stream: _Stream | None = None
        self._thread: threading.Thread | None = None
        self._idle_since: float | None = None
        self._closed = threading.Event()
        self.streams_opened = 0
        """Streams opened so far (for tests and diagnostics)."""

    def __len__(self) -> int:
        """The number of watches."""
        with self._lock:
            return len(self._watches)

    @property
    def member_target(self) -> str:
        """The member the current stream is on (``""`` if none): on the hub's thread,
        during a delivery, the member that sent the events."""
        stream = self._stream  # one atomic read
        return "" if stream is None else stream.member.target

    @property
    def watch_ids(self) -> int:
        """The number of watch ids etcd has created on the current stream."""
        with self._lock:
            return 0 if self._stream is None else len(self._stream.ids)

    # -- watches -------------------------------------------------------------------------

    def add(self, watch: Watch) -> None:
        """Start ``watch`` from its ``next_revision``: on the current stream, or on the
        one the hub's thread opens next. Never blocks on the network. No-op once closed."""
        with self._lock:
            if self._closed.is_set():
                return
            self._watches[watch] = None
            self._idle_since = None
            stream = self._stream
            if stream is not None and stream.ending is None:
                stream.create(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="consensus-lease-etcd-watch")
                self._thread.start()

    def remove(self, watch: Watch) -> None:
        """Stop ``watch``: etcd cancels its id (once created); its ``deliver`` is not
        called again. Idempotent; never blocks."""
        with self._lock:
            if self._watches.pop(watch, False) is False:
                return
            watch.removed = True
            if not self._watches:
                self._idle_since = time.monotonic()
            stream = self._stream
            if stream is not None and watch.watch_id is not None:
                stream.cancel(watch.watch_id)  # not created yet: cancelled when it is

    def close(self) -> None:
        """End the stream and forget every watch (nothing is delivered any more)."""
        with self._lock:
            self._closed.set()
            self._watches.clear()
            stream = self._stream
            if stream is not None:
                stream.ending = _CLOSED
        if stream is not None:
            stream.end()

    # -- the hub's thread ----------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while True:
            stream = self._open()
            if stream is None:
                return
            failure = self._read(stream)
            if failure is None:
                failures = 0
                continue
            log.info("etcd: watch stream failed: %s", failure)
            self._recover(stream, failure)
            if stream.heard:
                failures = 0
                self._on_failure()
            pause = min(RETRY_MAX_S, RETRY_MIN_S * 2**failures)
            self._closed.wait(pause * random.uniform(0.8, 1.0))
            failures = min(failures + 1, 16)

    def _open(self) -> _Stream | None:
        """A new stream with every watch created on it, or ``None`` when the thread
        should end (closed, or no watch left)."""
        with self._lock:
            if self._closed.is_set() or not self._watches:
                self._thread = None
                return None
        try:
            member = self._transport.member()
        except BackendUnavailable:  # the transport is closed: so is the driver
            with self._lock:
                self._thread = None
            return None
        try:
            stream = _Stream(member, self._transport.metadata(), self._tick)
        except ValueError as exc:  # grpc: "Cannot invoke RPC on closed channel!"
            log.info("etcd: cannot open a watch stream on %s: %s", member.target, exc)
            with self._lock:
                self._thread = None
            return None
        with self._lock:
            self._stream = stream
            self.streams_opened += 1
            if self._closed.is_set():
                stream.ending = _CLOSED
            for watch in self._watches:
                stream.create(watch)
        if stream.ending is not None:
            stream.end()
        return stream

    def _read(self, stream: _Stream) -> Failure | None:
        """Handle ``stream``'s responses until it ends: ``None`` if the hub ended it on
        purpose (idle, closed), else the failure."""
        target = stream.member.target
        failure: Failure | None
        try:
            with rpc_failures(target):
                for response in stream.call:
                    self._handle(stream, response)
            failure = Failure.unavailable(target, "watch stream ended")
        except Failure as exc:
            failure = exc
        except Exception as exc:  # never let a bug end the hub: reconnect instead
            log.exception("etcd: watch stream reader crashed")
            failure = Failure(target, None, f"watch reader crashed: {exc!r}")
        with self._lock:
            if self._stream is stream:
                self._stream = None
            ending = stream.ending
            stream.ending = stream.ending or "failed"
        stream.end()
        if ending in (_IDLE, _CLOSED):
            return None
        if ending == _STALLED:
            return Failure.deadline(target, "no answer to a watch progress request")
        return failure

    def _handle(self, stream: _Stream, response: Any) -> None:
        """One response: a created watch, a cancelled one, or events to deliver."""
        lost: Callable[[], None] | None = None
        deliver: Callable[[Sequence[Any]], None] | None = None
        with self._lock:
            stream.heard, stream.last_heard, stream.probe_sent = True, time.monotonic(), None
            watch_id = int(response.watch_id)
            if response.created:
                self._created(stream, response, watch_id)
            elif response.canceled:
                lost = self._cancelled(stream, response, watch_id)
            elif response.events:
                watch = stream.ids.get(watch_id)
                if watch is not None and not watch.removed:
                    last = int(response.events[-1].kv.mod_revision)
                    watch.next_revision = max(watch.next_revision, last + 1)
                    deliver = watch.deliver
        if lost is not None:
            lost()
        if deliver is not None:
            deliver(response.events)

    def _created(self, stream: _Stream, response: Any, watch_id: int) -> None:
        watch = stream.pending.popleft() if stream.pending else None
        if watch is None:
            return
        if response.canceled or watch_id < 0:
            raise Failure(stream.member.target, None,
                          f"etcd refused a watch: {response.cancel_reason or 'no reason'}")
        stream.ids[watch_id] = watch
        watch.watch_id = watch_id
        if watch.removed:
            stream.cancel(watch_id)

    def _cancelled(self, stream: _Stream, response: Any,
                   watch_id: int) -> Callable[[], None] | None:
        """etcd cancelled a watch: ours (removed), or compacted past its start (re-create
        it from the compaction revision and return its ``lost``)."""
        watch = stream.ids.pop(watch_id, None)
        if watch is None or watch.removed:
            return None
        if int(response.compact_revision) <= 0:
            raise Failure(stream.member.target, None,
                          f"etcd cancelled a watch: {response.cancel_reason or 'no reason'}")
        log.info("etcd: watch from revision %d was compacted; resuming at %d",
                 watch.next_revision, response.compact_revision)
        watch.next_revision = max(watch.next_revision, int(response.compact_revision))
        stream.create(watch)
        return watch.lost

    def _tick(self, stream: _Stream) -> Any:
        """Run by a stream's request side every :data:`TICK_S` without requests: end it
        when idle or silent, probe it when quiet; else ``None``."""
        now = time.monotonic()
        with self._lock:
            if stream.ending is not None or self._stream is not stream:
                return _STOP
            if not self._watches:
                if self._idle_since is None or now - self._idle_since < IDLE_EXIT_S:
                    return None
                stream.ending = _IDLE
            elif stream.probe_sent is not None:
                if now - stream.probe_sent < self._transport.config.timeout_s:
                    return None
                stream.ending = _STALLED
            elif now - stream.last_heard >= HEARTBEAT_S:
                stream.probe_sent = now
                return etcdrpc.WatchRequest(progress_request=etcdrpc.WatchProgressRequest())
            else:
                return None
        stream.end()
        return _STOP

    def _recover(self, stream: _Stream, failure: Failure) -> None:
        """After ``failure``: renew the auth token if it may be what was refused (a
        stream keeps the token it was opened with, and etcd refuses a watch created
        after that token expired as "permission denied"), else move to the next member."""
        if self._transport.config.user is not None and (
            failure.token_rejected or "permission denied" in failure.details
        ):
            try:
                self._transport.authenticate()
            except LeaseError as exc:
                log.info("etcd: could not renew the auth token for watching: %s", exc)
        elif failure.transient:
            self._transport.rotate(stream.member)
