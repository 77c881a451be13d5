"""A session's end from the store's own event: one watch of every session key.

Each session puts ``PREFIX/sessions/LEASE`` on its lease when it opens (see
:mod:`._layout`). etcd deletes it in the same revision as the lease's owner keys when the
lease ends, by expiry or by revoke, also when the store ends it before its TTL (a stale
leader's revoke, etcd#15247 / etcd#12528). A :class:`SessionWatch` keeps ONE watch of
the sessions directory (DELETE events only) on the driver's shared
:class:`~._watches_hub.WatchHub` stream while any session of the driver is open, and ends
a session whose key is deleted at once (``on_end``), instead of at its next keepalive.

What it can promise: the event comes after etcd committed the deletion, so another
client's claim can commit a moment before the holder hears of it (the claim needs the
same commit to be visible; the holder learns it one watch delivery after the commit,
the contender one delivery plus one round trip for its claim). So where etcd breaks a
TTL itself the overlap is not zero, only bounded by the delivery, and a fenced
destination is what rejects the stale holder's late writes.

What it never does:

* silently stop: the watch stays while sessions are open; a broken stream is resumed
  by the hub from the revision after the last event delivered (no event is missed), on
  the next member. A watch whose events were compacted meanwhile (etcd cancels it
  naming the compaction revision; the hub resumes it there) may have missed deletions:
  every session's key is then read again (one linearizable, keys-only listing of the
  sessions directory at one revision, in pages of :data:`READ_PAGE` keys), and a
  session whose key is absent at that read is ended. The
  same read covers a session registered after the watch started past its key's
  revision.
* end a session on anything but the store's own word: a deleted key (event or read),
  never a stream failure, a cancel or a timeout. A read that fails is retried.

Registration comes before the key is put (:meth:`expect`), so a deletion delivered
before the put's answer is not missed; the key's revision (:meth:`armed`) tells whether
the watch covers it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pyetcd import etcdrpc

from ...errors import LeaseError
from ._jobs import Ops
from ._sessions import EtcdSession
from ._watches import NOPUT
from ._watches_hub import Watch, WatchHub

__all__ = ["SessionWatch"]

log = logging.getLogger("consensus_lease.etcd")

READ_PAGE = 1000
"""Session keys listed per request when they are read again (keys only)."""

RETRY_PAUSES_S = (0.1, 0.2, 0.5, 1.0, 2.0)
"""Pauses between attempts to read the session keys again (the last one repeats)."""

OnEnd = Callable[[EtcdSession, str, str, int], None]
"""``on_end(handle, how, member, revision)``: etcd ended the session's lease; ``how``
says how it was seen, ``member`` which member told, ``revision`` the deletion's (0:
not known, read again)."""


class SessionWatch:
    """The watch of every session key of one driver. Thread-safe.

    Args:
        ops: the driver's shared context (transport, layout, config).
        hub: the driver's shared watch stream.
        on_end: called on a thread of its own (never the hub's) for each session whose
            key etcd deleted; must be idempotent per session (a session can be reported
            by an event and by a read).
    """

    def __init__(self, ops: Ops, hub: WatchHub, on_end: OnEnd) -> None:
        self._ops = ops
        self._hub = hub
        self._on_end = on_end
        self._layout = ops.layout
        self._lock = threading.Lock()
        self._sessions: dict[int, EtcdSession] = {}
        self._armed: dict[int, int] = {}  # lease id -> revision of its key's put
        self._watch: Watch | None = None
        self._start = 0  # the watch's first revision
        self._closed = threading.Event()
        self._reading = False  # a read of every session key runs
        self._again = False  # ... and another is wanted after it

    def __len__(self) -> int:
        """The number of sessions watched."""
        with self._lock:
            return len(self._sessions)

    def expect(self, handle: EtcdSession) -> None:
        """Register ``handle`` before its key is put: a deletion of its key from now on
        ends it."""
        with self._lock:
            self._sessions[handle.lease_id] = handle

    def armed(self, handle: EtcdSession, revision: int) -> None:
        """``handle``'s key was put at ``revision``: watch from ``revision + 1`` (the
        first session starts the watch); a watch that started later than that cannot
        have seen a deletion in between, so the keys are read again."""
        key, range_end = self._layout.sessions
        with self._lock:
            if self._closed.is_set() or handle.lease_id not in self._sessions:
                return
            self._armed[handle.lease_id] = revision
            covered = self._watch is not None and self._start <= revision + 1
            if self._watch is None:
                self._start = revision + 1
                self._watch = Watch(key, range_end, revision + 1, self._deliver, self._lost,
                                    (NOPUT,))
                watch: Watch | None = self._watch
            else:
                watch = None
        if watch is not None:
            self._hub.add(watch)
        elif not covered:
            self._reread()

    def forget(self, handle: EtcdSession) -> None:
        """Stop watching ``handle`` (closed); the last one cancels the watch."""
        with self._lock:
            self._sessions.pop(handle.lease_id, None)
            self._armed.pop(handle.lease_id, None)
            watch = None
            if not self._sessions and self._watch is not None:
                watch, self._watch = self._watch, None
        if watch is not None:
            self._hub.remove(watch)

    def close(self) -> None:
        """Stop watching; nothing is reported any more."""
        self._closed.set()
        with self._lock:
            watch, self._watch = self._watch, None
            self._sessions.clear()
            self._armed.clear()
        if watch is not None:
            self._hub.remove(watch)

    # -- the hub's thread: must not block -------------------------------------------------

    def _deliver(self, events: Sequence[Any]) -> None:
        ended: list[tuple[EtcdSession, int]] = []
        with self._lock:
            for event in events:
                lease_id = self._layout.session_lease(bytes(event.kv.key))
                handle = None if lease_id is None else self._sessions.pop(lease_id, None)
                if handle is not None:
                    self._armed.pop(handle.lease_id, None)
                    ended.append((handle, int(event.kv.mod_revision)))
        member = self._hub.member_target
        for one in ended:  # a thread each: no session waits for another's listeners
            self._spawn(self._report, [one], "its session key was deleted (watch)", member)

    def _lost(self) -> None:
        """The hub resumed the watch after a compaction: deletions may be missed."""
        log.info("etcd: the session watch was compacted; reading the session keys again")
        self._reread()

    # -- reading again --------------------------------------------------------------------

    def _reread(self) -> None:
        """Read every session key again, on a thread of its own (one at a time)."""
        with self._lock:
            if self._reading:
                self._again = True
                return
            self._reading = True
        self._spawn(self._read_loop)

    def _read_loop(self) -> None:
        attempt = 0
        while not self._closed.is_set():
            with self._lock:
                self._again = False
                if not self._armed:
                    self._reading = False
                    return
            try:
                self._read_once()
                attempt = 0
            except LeaseError as exc:
                pause = RETRY_PAUSES_S[min(attempt, len(RETRY_PAUSES_S) - 1)]
                attempt += 1
                log.warning("etcd: reading the session keys failed (retrying in %.1f s): %s",
                            pause, exc)
                if self._closed.wait(pause):
                    break
                continue
            with self._lock:
                if not self._again:
                    self._reading = False
                    return
        with self._lock:
            self._reading = False

    def _read_once(self) -> None:
        """One listing of the session keys at one revision; every armed session whose
        key was put at or before it and is absent is ended.

        Raises:
            LeaseError: the read failed (nothing is ended).
        """
        key, range_end = self._layout.sessions
        present: set[int] = set()
        start, revision, member = key, 0, ""
        while True:
            page = self._ops.read(
                etcdrpc.RangeRequest(key=start, range_end=range_end, limit=READ_PAGE,
                                     keys_only=True, revision=revision),
                "reading the session keys again")
            if not revision:
                revision = int(page.header.revision)
                member = f"id {int(page.header.member_id):x}"
            for kv in page.kvs:
                lease_id = self._layout.session_lease(bytes(kv.key))
                if lease_id is not None:
                    present.add(lease_id)
            if not page.more or not page.kvs:
                break
            start = bytes(page.kvs[-1].key) + b"\0"
        ended: list[tuple[EtcdSession, int]] = []
        with self._lock:
            for lease_id, put_at in list(self._armed.items()):
                if put_at <= revision and lease_id not in present:
                    handle = self._sessions.pop(lease_id, None)
                    del self._armed[lease_id]
                    if handle is not None:
                        ended.append((handle, 0))
        if ended:
            self._report(ended, f"its session key is gone at revision {revision} (read "
                                f"again after the watch may have missed events)", member)

    def _report(self, ended: list[tuple[EtcdSession, int]], how: str, member: str) -> None:
        for handle, revision in ended:
            try:
                self._on_end(handle, how, member, revision)
            except Exception:  # one session's listener must not stop the others
                log.exception("etcd: session %s: ending it raised", handle.session_id)

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        threading.Thread(target=target, args=args, daemon=True,
                         name="consensus-lease-etcd-session-end").start()
