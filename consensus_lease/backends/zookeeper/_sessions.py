"""One worker session = one ZooKeeper session = one kazoo client.

The handle tracks the session's connection state from kazoo's listener and relays it to
the core as :class:`~consensus_lease.backend.SessionEvent`:

=====================================  ===========================  ======================
kazoo                                  handle status                reported
=====================================  ===========================  ======================
CONNECTED (first time)                 CONNECTED                    (nothing)
SUSPENDED (connection lost)            SUSPENDED                    SUSPENDED
CONNECTED again, *same* session id     CONNECTED                    RECONNECTED
LOST (expired; or closed by us)        EXPIRED (or CLOSED)          EXPIRED (not on close)
CONNECTED with a *new* session id      unchanged (never used)       (nothing)
=====================================  ===========================  ======================

After LOST kazoo would quietly open a new session on the same client; that would be
retrying an expiry away, so the handle never uses it: the status stays EXPIRED, every
call raises ``SessionExpired`` and the client is stopped.

When the backend finds that the store's history went back (:mod:`._tokens_history`) it ends
every session with :meth:`ZkSession.expire_locally` and a ``StoreRegressed``: that error
is what every later call raises, and what the core is told (``SessionHandle.expiry``).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient, KazooState

from ...backend import SessionEvent, SessionHandle, StateListener
from ...errors import BackendUnavailable, SessionExpired
from ._transport_errors import KAZOO_ERRORS
from ._transport_kazoo import NegotiatedTimeouts

__all__ = ["NegotiatedTimeouts", "Status", "ZkSession", "session_text"]

log = logging.getLogger("consensus_lease.backends.zookeeper")


def session_text(session_id: int) -> str:
    """ZooKeeper's usual spelling of a session id: ``0x`` and 16 hex digits."""
    return f"0x{session_id & 0xFFFF_FFFF_FFFF_FFFF:016x}"


class Status(enum.Enum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    EXPIRED = "expired"
    CLOSED = "closed"


_LIVE = (Status.CONNECTING, Status.CONNECTED, Status.SUSPENDED)

LISTENER_WAIT_S = 5.0
"""Most time ``connected`` waits for kazoo to run the CONNECTED listener."""


class ZkSession(SessionHandle):
    """A worker's ZooKeeper session.

    Attributes:
        client (KazooClient): used for this session only.
        sid (int): the ZooKeeper session id (``ephemeralOwner`` of its owner znodes).
        uncertain (dict): job id -> (generation, nonce) of claims whose outcome could not
            be read back (``OutcomeUnknown``); settled by a later claim of the job, which
            adopts it, or by keepalive, which hands it back. Guarded by
            ``uncertain_lock``.

    ``uncertain`` is the only claim state a session keeps. What a claim made (its owner
    znode, its markers) travels with the claim instead, as the ``handle`` of the
    ``ClaimResult`` it returned (see :class:`._jobs.Hold`). An unanswered claim returned
    nothing for anyone to carry, so only the session can remember it: if the store did
    apply it, the session holds the job (an ephemeral owner znode with the claim's nonce)
    while no caller knows, and the session is what must either adopt it on the next claim
    or release it. It holds at most one entry per job id, and entries only live until
    settled.

    The session's lifetime is the core's to decide: kazoo pings the server by itself, so
    this session does not lapse while its process lives. The core ends it with
    ``close_session`` when its local deadline passes without a successful renewal (or it
    is lost otherwise); a handle used without the core lives until ``close_session``.

    Hooks (set by the backend; called from kazoo's or a background thread):
        on_disconnected: called when the connection is lost (must not block).
        before_stop: called once before the client is stopped (ends a reconnect wait:
            see :mod:`._transport_reconnect`; must not block).
        explain_loss: called before an expiry ZooKeeper reported is passed on; returns
            the error that explains it better (``StoreRegressed``) or ``None``.
    """

    def __init__(
        self, owner: str, client: KazooClient, timeouts: NegotiatedTimeouts,
        on_event: StateListener | None, hosts: str,
    ) -> None:
        super().__init__("", owner, 0.0)
        self.client = client
        self.hosts = hosts
        self.sid = 0
        self.passwd = b""
        self._timeouts = timeouts
        self._on_event = on_event
        self._cond = threading.Condition()
        self._status = Status.CONNECTING
        self.reason = ""
        self.error: SessionExpired | None = None
        """What ended the session, if more than an expiry (``StoreRegressed``)."""
        self.disconnected_since: float | None = None
        """``time.monotonic()`` when the connection was lost; ``None`` while connected."""
        self.recheck_identity = False
        """Set on a reconnect: the next keepalive reads the store's identity."""
        self.on_disconnected: Callable[[], None] | None = None
        self.before_stop: Callable[[], None] | None = None
        self.explain_loss: Callable[[], SessionExpired | None] | None = None
        self.uncertain: dict[str, tuple[int, str]] = {}
        self.uncertain_lock = threading.Lock()
        self._stopping = threading.Lock()
        self._stopped = False
        self.ended = threading.Event()
        """Set once an expiry has been reported to the listener and the client stopped."""
        client.add_listener(self._on_state)

    # -- state -------------------------------------------------------------------------

    @property
    def status(self) -> Status:
        with self._cond:
            return self._status

    def connected(self, requested_ttl_s: float) -> None:
        """Called once ``client.start()`` returned: record the session id and the TTL.

        kazoo lets ``start()`` return before it runs the listeners of CONNECTED (in its
        connection thread, right after): wait for ours, briefly."""
        with self._cond:
            self._cond.wait_for(lambda: self._status is not Status.CONNECTING,
                                timeout=LISTENER_WAIT_S)
            if self._status not in _LIVE or not self.sid:
                raise BackendUnavailable(
                    f"the ZooKeeper session was lost while opening it ({self.hosts})"
                )
        self.session_id = session_text(self.sid)
        granted_ms = self._timeouts.timeouts_ms.get(self.sid)
        if granted_ms is None:
            # Never guess: a guess above what the server granted would be unsafe.
            raise BackendUnavailable(
                "could not learn the session timeout the ZooKeeper server negotiated "
                "(kazoo no longer logs it?); refusing to guess the TTL"
            )
        self.granted_ttl_s = granted_ms / 1000.0
        log.debug(
            "zookeeper session opened",
            extra={"session_id": self.session_id, "requested_ttl_s": requested_ttl_s,
                   "granted_ttl_s": self.granted_ttl_s},
        )

    def current_ttl_s(self) -> float:
        ms = self._timeouts.timeouts_ms.get(self.sid)
        if ms is not None:
            self.granted_ttl_s = ms / 1000.0
        return self.granted_ttl_s

    def _on_state(self, state: str) -> None:
        """kazoo's listener, run in kazoo's connection thread: must not block."""
        event: SessionEvent | None = None
        with self._cond:
            if state == KazooState.CONNECTED:
                client_id = self.client.client_id
                same = client_id is not None and client_id[0] == self.sid
                if self._status is Status.CONNECTING and client_id is not None:
                    self._status = Status.CONNECTED
                    self.sid, self.passwd = client_id
                elif self._status is Status.SUSPENDED and same:
                    self._status = Status.CONNECTED
                    self.disconnected_since = None
                    self.recheck_identity = True
                    event = SessionEvent.RECONNECTED
            elif state == KazooState.SUSPENDED:
                if self._status is Status.CONNECTED:
                    self._status = Status.SUSPENDED
                    self.disconnected_since = time.monotonic()
                    event = SessionEvent.SUSPENDED
            elif state == KazooState.LOST and self._status in _LIVE:
                self._status = Status.EXPIRED
                self.reason = "kazoo reported the session LOST (expired by the server)"
                event = SessionEvent.EXPIRED
            self._cond.notify_all()
        if event is SessionEvent.EXPIRED:
            # Report it and stop kazoo from living on with a fresh session, from another
            # thread: neither may run in (or block) kazoo's connection thread.
            threading.Thread(target=self._ended, name="zk-session-end", daemon=True).start()
            return
        if event is SessionEvent.SUSPENDED and self.on_disconnected is not None:
            self.on_disconnected()
        if event is not None and self._on_event is not None and self.session_id:
            try:
                self._on_event(event)
            except Exception:
                log.exception("session event listener raised", extra={"event": event.value})

    def expire_locally(self, reason: str, error: SessionExpired | None = None) -> bool:
        """Mark the session EXPIRED because the backend ended it (the ``expire_session``
        test hook; a regression, with ``error`` for every later call to raise); then, in
        another thread, report it and stop the client so ZooKeeper deletes its ephemeral
        znodes. Returns False if it was already over."""
        with self._cond:
            if self._status not in _LIVE:
                return False
            self._status = Status.EXPIRED
            self.reason = reason
            self.error = error
            self.expiry = error
            self._cond.notify_all()
        log.warning("zookeeper session ended", extra={"session_id": self.session_id,
                                                      "reason": reason})
        threading.Thread(target=self._ended, name="zk-session-end", daemon=True).start()
        return True

    def _ended(self) -> None:
        try:
            if self.error is None and self.explain_loss is not None:
                try:
                    self.error = self.expiry = self.explain_loss()
                except Exception:
                    log.exception("explaining a session expiry failed")
            if self._on_event is not None and self.session_id:
                try:
                    self._on_event(SessionEvent.EXPIRED)
                except Exception:
                    log.exception("session event listener raised")
            self._stop_quietly()
        finally:
            self.ended.set()

    def mark_closed(self) -> bool:
        """Mark CLOSED (before stopping the client, so its LOST is not an expiry).
        Returns False if already closed."""
        with self._cond:
            if self._status is Status.CLOSED:
                return False
            self._status = Status.CLOSED
            self.reason = self.reason or "closed"
            self._cond.notify_all()
            return True

    def stop_client(self) -> None:
        """Stop and close the kazoo client once (closing the ZooKeeper session when the
        server can be reached). Safe from any thread but kazoo's own.

        Raises:
            BackendUnavailable: kazoo could not stop its connection cleanly.
        """
        with self._stopping:
            if self._stopped:
                return
            self._stopped = True
            if self.before_stop is not None:
                self.before_stop()
            try:
                self.client.stop()
                self.client.close()
            except KAZOO_ERRORS as exc:
                raise BackendUnavailable(
                    f"stopping the client of ZooKeeper session {self.session_id}: {exc!r}"
                ) from exc
            except Exception as exc:  # kazoo's close() raises a bare Exception("Cannot
                # close connection until it is stopped") when its connection thread has
                # not ended yet (a loaded host): the socket is left to the thread
                raise BackendUnavailable(
                    f"closing the client of ZooKeeper session {self.session_id}: {exc}"
                ) from exc

    def _stop_quietly(self) -> None:
        try:
            self.stop_client()
        except BackendUnavailable as exc:  # in a background thread: nobody to raise to
            log.warning("stopping a zookeeper client failed",
                        extra={"session_id": self.session_id, "error": str(exc)})

    # -- checks used around every call ---------------------------------------------------

    def check_alive(self) -> None:
        """Raise SessionExpired (``StoreRegressed`` if that ended it) unless the session
        may be used."""
        # Fast path without the lock: the status leaves _LIVE before (or as) an error is
        # set, and never comes back, so a live status read now is the session at this
        # moment (the locked path below only builds the error).
        if self._status in _LIVE and self.error is None:
            return
        with self._cond:
            status, reason, error = self._status, self.reason, self.error
        if error is not None:
            raise type(error)(f"ZooKeeper session {self.session_id} is over: {error}")
        if status not in _LIVE:
            raise SessionExpired(f"ZooKeeper session {self.session_id} is over: {reason}")

    def wait_connected(self, deadline: float) -> None:
        """Block until CONNECTED (through a SUSPENDED spell) or ``deadline`` (monotonic).

        Raises:
            SessionExpired: the session ended.
            BackendUnavailable: still disconnected at the deadline; nothing was sent.
        """
        if self._status is Status.CONNECTED and self.error is None:
            return  # connected and alive (read without the lock: see check_alive)
        with self._cond:
            while self._status in (Status.SUSPENDED, Status.CONNECTING):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackendUnavailable(
                        f"ZooKeeper session {self.session_id} is disconnected from {self.hosts}"
                    )
                self._cond.wait(left)
        self.check_alive()
