"""Reconnecting a store's session clients, without a storm while no member serves.

Every worker session is a ZooKeeper session of its own, so a kazoo client and a TCP
connection of its own (:mod:`._sessions`). When one member dies, each of its clients
moves to another member at once: kazoo tries the hosts left in its current (shuffled)
pass over the connect string before it sleeps, and nothing here is involved (a client
whose dead member came last in the pass sleeps one short back-off first). When *no*
member serves (an election, the whole ensemble restarting), each client sleeps its back-off
(``_config.ZkConfig.new_client``: at most a second) and tries every host again. With
10 processes of 1,000 sessions on the kit's 3-member ensemble, that was some 7,000
rounds a second (10,000 clients, each about 1.3 s apart) against servers trying to
elect a leader. It kept the 2-core machine at
a load of 500-600, so the election that a slow disk write started took 70 s, not
seconds, and every session's local deadline passed meanwhile.

So the session clients of one store share a :class:`ReconnectPacer`. Their connection
retries sleep through its :meth:`~ReconnectPacer.sleep`, the ``sleep_func`` of their shared
handler (kazoo's handler interface; kazoo requires a client's retry to sleep with its
handler's). A sleep on a client's connection thread comes after a round in which no host
took that client:

* while any client of the store is connected, the client sleeps its own back-off and
  nothing more. A client that fails alone (its member refused it) is never held back
  by the others;
* while none is connected, after its own back-off the client also waits for a turn. The
  store hands out one turn per :data:`TURN_INTERVAL_S`, to the clients in the order
  they came, so at most 10 rounds a second are tried for the whole store, whatever
  its number of sessions;
* as soon as one client connects, every waiting client starts its next round, each at
  a random point of a spread of 1 ms per waiting client (at most
  :data:`MAX_SPREAD_S`), so that a thousand reconnects are not one burst.

A client is known to the pacer by its connection thread, learnt as that thread starts
(:meth:`ReconnectPacer.follow`, through :func:`._transport_kazoo.follow_connection_thread`),
so a client that has never connected is paced too: a session opened while no member
serves, such as a worker slot opening a new session after an outage longer than its TTL,
waits for its turns like the rest. The thread is forgotten at LOST
and when it ends. Any other sleep through the handler (a recipe's command retry, a
caller's ``KazooRetry``) is a plain ``time.sleep``.

What the clients share is the knowledge that no member answers, never a failure: no
session's deadline, keepalive or error depends on another's. A held-back client could
not have done better meanwhile, as no member served any client of the store; the first
to find one that does ends the wait for all of them within one turn and the spread.
A client that kazoo is stopping (``KazooClient._stopped``) stops waiting within
:data:`STOP_POLL_S`, well inside kazoo's own wait for its connection thread (10 s).
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque

from kazoo.client import KazooClient, KazooState

from ._transport_kazoo import client_stopping, follow_connection_thread

__all__ = [
    "MAX_SPREAD_S", "SPREAD_PER_CLIENT_S", "STOP_POLL_S", "TURN_INTERVAL_S", "ReconnectPacer",
    "Sleeper",
]

TURN_INTERVAL_S = 0.1
"""While no client of a store is connected, one reconnection round may start this often
(store-wide): at most 10 rounds a second, each trying every host once."""

SPREAD_PER_CLIENT_S = 0.001
"""Once a client connects again, the waiting clients start within this many seconds per
waiting client (1,000 waiting: within a second)."""

MAX_SPREAD_S = 1.0
"""The longest spread of the waiting clients' restart (a small part of any TTL that a
thousand sessions would use)."""

STOP_POLL_S = 1.0
"""How often a waiting client looks whether kazoo is stopping it."""


class Sleeper:
    """The pacer's view of one client: whether it is connected, whether it is being
    stopped, and the event its waits end on. Made by :meth:`ReconnectPacer.follow`."""

    def __init__(self, pacer: ReconnectPacer, client: KazooClient) -> None:
        self._pacer = pacer
        self._client = client
        self._wake = threading.Event()
        self._cancelled = False
        self._thread: int | None = None

    def cancel(self) -> None:
        """The client is being stopped: a wait in progress ends now, later ones at
        once, and the pacer forgets it."""
        self._cancelled = True
        self._pacer._forget(self)
        self._wake.set()

    def stopping(self) -> bool:
        return self._cancelled or client_stopping(self._client)

    def _on_state(self, state: str) -> None:
        """kazoo's listener, on the client's connection thread: never blocks.

        CONNECTED teaches the pacer this thread. LOST (an expiry, or the client closed:
        the last thing its connection thread does) makes it forget the client, so a
        thread that reuses the id is never taken for this one."""
        if state == KazooState.CONNECTED:
            self._pacer._connected(self, threading.get_ident())
        elif state == KazooState.SUSPENDED:
            self._pacer._disconnected(self)
        else:
            self._pacer._forget(self)

    def _sleep(self, seconds: float) -> None:
        """The client's back-off, then its turn (see the module docstring)."""
        self._wake.clear()
        if not self.stopping():
            self._wake.wait(max(0.0, seconds))
        self._pacer._turn(self)

    def _wait(self, seconds: float) -> None:
        self._wake.wait(max(0.0, min(seconds, STOP_POLL_S)))


class ReconnectPacer:
    """The reconnection turns of one store's session clients (see the module docstring).
    Thread-safe.

    Args:
        turn_interval_s: seconds between two turns while no client is connected.

    Attributes:
        turns (int): turns handed out since the pacer was made (each one round of a
            client while no client of the store was connected).
    """

    def __init__(self, turn_interval_s: float = TURN_INTERVAL_S) -> None:
        self.turn_interval_s = turn_interval_s
        self._lock = threading.Lock()
        self._up: set[Sleeper] = set()  # the sleepers whose client is connected
        self._by_thread: dict[int, Sleeper] = {}  # connection thread -> its sleeper
        self._queue: deque[Sleeper] = deque()  # waiting for a turn, first come first
        self._next_turn = 0.0
        self._released = 0  # bumped each time a client connects while none was
        self._spread_s = 0.0  # the spread of the last release
        self.turns = 0

    def follow(self, client: KazooClient) -> Sleeper:
        """Pace ``client`` (a session client of the store, not yet started, whose handler
        sleeps with :meth:`sleep`). Call the returned :meth:`Sleeper.cancel` before
        stopping the client."""
        sleeper = Sleeper(self, client)
        client.add_listener(sleeper._on_state)
        follow_connection_thread(
            client, lambda: self._started(sleeper, threading.get_ident()),
            lambda: self._forget(sleeper))
        return sleeper

    def sleep(self, seconds: float) -> None:
        """The handler's ``sleep_func``: on a followed client's connection thread, its
        back-off and then (while no client of the store is connected) its turn;
        anywhere else ``time.sleep(seconds)``."""
        sleeper = self._by_thread.get(threading.get_ident())
        if sleeper is None:
            time.sleep(seconds)
        else:
            sleeper._sleep(seconds)

    @property
    def connected_clients(self) -> int:
        with self._lock:
            return len(self._up)

    def _connected(self, sleeper: Sleeper, thread: int) -> None:
        # Every listener call of a store's clients comes here or below: when a member
        # goes, its clients all call at once, so the common case takes no lock (a set's
        # membership and an attribute are read atomically).
        if sleeper in self._up and sleeper._thread is not None:
            return
        with self._lock:
            if sleeper._cancelled:
                return
            if sleeper._thread is None:
                sleeper._thread = thread
                self._by_thread[thread] = sleeper
            first = not self._up
            self._up.add(sleeper)
            if not first:
                return
            self._released += 1
            waiting, self._queue = list(self._queue), deque()
            self._spread_s = min(MAX_SPREAD_S, SPREAD_PER_CLIENT_S * len(waiting))
        for other in waiting:
            other._wake.set()

    def _started(self, sleeper: Sleeper, thread: int) -> None:
        """``sleeper``'s connection thread started: its sleeps are paced from now on."""
        with self._lock:
            if sleeper._cancelled:
                return
            if sleeper._thread is not None and self._by_thread.get(sleeper._thread) is sleeper:
                del self._by_thread[sleeper._thread]
            sleeper._thread = thread
            self._by_thread[thread] = sleeper

    def _disconnected(self, sleeper: Sleeper) -> None:
        if sleeper not in self._up:  # (see _connected)
            return
        with self._lock:
            self._up.discard(sleeper)

    def _forget(self, sleeper: Sleeper) -> None:
        with self._lock:
            self._up.discard(sleeper)
            if sleeper._thread is not None and self._by_thread.get(sleeper._thread) is sleeper:
                del self._by_thread[sleeper._thread]
            sleeper._thread = None

    def _turn(self, sleeper: Sleeper) -> None:
        """Return when ``sleeper``'s client may start its next round (see the module
        docstring)."""
        with self._lock:
            if self._up or sleeper.stopping():
                return
            released = self._released
            self._queue.append(sleeper)
        while True:
            with self._lock:
                if sleeper.stopping():
                    self._drop(sleeper)
                    return
                if self._released != released or self._up:
                    self._drop(sleeper)  # (a release emptied the queue already)
                    spread = self._spread_s
                    break
                if sleeper not in self._queue:  # never: only a release empties it
                    return
                head = self._queue[0] is sleeper
                now = time.monotonic()
                if head and now >= self._next_turn:
                    self._queue.popleft()
                    self._next_turn = now + self.turn_interval_s
                    self.turns += 1
                    if self._queue:
                        self._queue[0]._wake.set()  # the next in line waits for its turn
                    return
                wait_s = self._next_turn - now if head else STOP_POLL_S
                sleeper._wake.clear()
            sleeper._wait(wait_s)
        # the store reconnected: start at a random point of the spread, unless stopped
        sleeper._wake.clear()
        if not sleeper.stopping():
            sleeper._wake.wait(random.uniform(0.0, spread))

    def _drop(self, sleeper: Sleeper) -> None:
        """Take ``sleeper`` out of the queue (under the lock), handing the head's wait on
        to the next in line."""
        try:
            was_head = self._queue[0] is sleeper
            self._queue.remove(sleeper)
        except (IndexError, ValueError):
            return
        if was_head and self._queue:
            self._queue[0]._wake.set()

