"""The reconnection pacer of a store's ZooKeeper session clients (no server needed)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("kazoo")

from kazoo.client import KazooState

from consensus_lease.backends.zookeeper._transport_reconnect import (
    MAX_SPREAD_S,
    STOP_POLL_S,
    ReconnectPacer,
)
from consensus_lease.testing.conformance import poll_until


class FakeConnection:
    """What the pacer uses of kazoo's connection handler: ``zk_loop``, the function its
    connection thread runs (the pacer wraps it to learn the thread as it starts)."""

    def __init__(self) -> None:
        self.loop: Any = lambda: None

    def zk_loop(self) -> None:
        self.loop()


class FakeClient:
    """What the pacer uses of a kazoo client: listeners, the stop event, the connection."""

    def __init__(self) -> None:
        self._stopped = threading.Event()
        self._connection = FakeConnection()
        self.listeners: list[Any] = []

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def tell(self, state: str) -> None:
        for listener in self.listeners:
            listener(state)


class Connection(threading.Thread):
    """A client's connection thread, running the client's ``zk_loop`` as kazoo does: it
    connects once (unless ``never_connects``), loses the connection, then does rounds (a
    sleep through the pacer, then a failed round) until ``until``, like kazoo's
    connection loop."""

    def __init__(self, pacer: ReconnectPacer, until: float, backoff_s: float = 0.0,
                 together: threading.Barrier | None = None,
                 never_connects: bool = False) -> None:
        super().__init__(daemon=True)
        self.pacer, self.until, self.backoff_s = pacer, until, backoff_s
        self.together, self.never_connects = together, never_connects
        self.client = FakeClient()
        self.client._connection.loop = self.loop
        self.sleeper = pacer.follow(self.client)
        self.rounds = 0
        self.ended_at: float | None = None

    def run(self) -> None:
        self.client._connection.zk_loop()  # (the pacer's wrapper, then self.loop)

    def loop(self) -> None:
        if not self.never_connects:
            self.client.tell(KazooState.CONNECTED)
            if self.together is not None:  # every client connected, then every one lost
                self.together.wait(10.0)
            self.client.tell(KazooState.SUSPENDED)
            if self.together is not None:
                self.together.wait(10.0)
        while time.monotonic() < self.until and not self.client._stopped.is_set():
            self.pacer.sleep(self.backoff_s)
            self.rounds += 1
        self.ended_at = time.monotonic()


def run_all(threads: list[Connection], timeout_s: float) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    assert not any(thread.is_alive() for thread in threads)


def lost_together(turn_interval_s: float, clients: int) -> tuple[ReconnectPacer, list[Connection]]:
    """``clients`` connections that all connect, then all lose their connection, then do
    rounds for a second with no client of the store connected."""
    pacer = ReconnectPacer(turn_interval_s=turn_interval_s)
    together = threading.Barrier(clients)
    until = time.monotonic() + 1.0
    threads = [Connection(pacer, until, together=together) for _ in range(clients)]
    run_all(threads, 10.0)
    return pacer, threads


def test_no_client_connected_the_store_gets_one_round_per_turn() -> None:
    pacer, threads = lost_together(0.05, 30)
    rounds = sum(thread.rounds for thread in threads)
    # unpaced, 30 loops of a zero back-off make many thousands of rounds in a second;
    # paced, the store gets one per 50 ms (20), plus one per client to end: each loop's
    # last sleep waits for a turn after the second is over
    assert rounds == pacer.turns <= 1.0 / 0.05 + 30 + 5, rounds


def test_turns_go_round_in_order_of_arrival() -> None:
    _, threads = lost_together(0.02, 5)
    assert min(thread.rounds for thread in threads) >= 3  # about 10 each: nobody starves


@pytest.mark.parametrize("never_connected", [False, True])
def test_while_one_client_is_connected_the_others_sleep_their_own_back_off(
        never_connected: bool) -> None:
    """Also those that have never connected (sessions being opened)."""
    pacer = ReconnectPacer(turn_interval_s=10.0)  # a turn would take 10 s
    up = FakeClient()
    pacer.follow(up)
    up.tell(KazooState.CONNECTED)
    started = time.monotonic()
    threads = [Connection(pacer, started + 0.3, backoff_s=0.05, never_connects=never_connected)
               for _ in range(3)]
    run_all(threads, 10.0)
    assert time.monotonic() - started < 2.0
    assert all(thread.rounds >= 2 for thread in threads)  # 50 ms back-offs, not 10 s turns
    assert pacer.turns == 0


def test_clients_that_never_connected_are_paced_too() -> None:
    """Sessions opened while no member serves (a worker's slots opening new sessions
    after an outage longer than their TTL) wait for turns like the clients that lost
    their connection: kazoo's connection thread is known to the pacer from its start."""
    pacer = ReconnectPacer(turn_interval_s=0.05)
    until = time.monotonic() + 1.0
    threads = [Connection(pacer, until, never_connects=True) for _ in range(30)]
    run_all(threads, 10.0)
    rounds = sum(thread.rounds for thread in threads)
    assert rounds == pacer.turns <= 1.0 / 0.05 + 30 + 5, rounds  # as for those that lost it
    assert not pacer._by_thread  # each thread forgotten as it ended


def test_a_sleep_off_a_followed_connection_thread_is_a_plain_sleep() -> None:
    pacer = ReconnectPacer(turn_interval_s=60.0)
    started = time.monotonic()
    pacer.sleep(0.01)  # this thread is no client's connection thread
    assert time.monotonic() - started < 1.0 and pacer.turns == 0


def test_a_client_connecting_releases_every_waiting_client_within_the_spread() -> None:
    pacer = ReconnectPacer(turn_interval_s=60.0)  # after the first turn, none for a minute
    waiting = [Connection(pacer, time.monotonic() + 3600.0) for _ in range(20)]
    for thread in waiting:
        thread.start()
    poll_until(lambda: len(pacer._queue) == 20, 5.0, interval_s=0.01)  # all wait a turn
    assert len(pacer._queue) == 20 and pacer.turns == 1
    up = FakeClient()
    pacer.follow(up)
    released = time.monotonic()
    up.tell(KazooState.CONNECTED)
    # every one starts its next round within the spread; that round "fails" and, a client
    # being connected now, the next sleep is its own zero back-off: they spin until
    # stopped, which shows that nothing holds them any more
    poll_until(lambda: all(thread.rounds >= 3 for thread in waiting), MAX_SPREAD_S + 5.0,
               interval_s=0.01)
    assert time.monotonic() - released < MAX_SPREAD_S + 2.0
    for thread in waiting:
        thread.client._stopped.set()
    run_all([], 0.0)
    for thread in waiting:
        thread.join(STOP_POLL_S + 5.0)
    assert not any(thread.is_alive() for thread in waiting)


def test_a_stopped_client_stops_waiting() -> None:
    pacer = ReconnectPacer(turn_interval_s=60.0)
    far = time.monotonic() + 3600.0
    first, second, third = (Connection(pacer, far) for _ in range(3))
    for thread in (first, second, third):
        thread.start()
    poll_until(lambda: len(pacer._queue) == 3, 5.0, interval_s=0.01)  # all wait a turn
    assert len(pacer._queue) == 3
    waiting = list(pacer._queue)[1:]  # (the head waits for the turn a minute away)
    stopped = time.monotonic()
    waiting[0]._client._stopped.set()  # what kazoo's stop() sets first
    waiting[1].cancel()  # what the session's stop_client does first
    by_sleeper = {thread.sleeper: thread for thread in (first, second, third)}
    for sleeper in waiting:
        by_sleeper[sleeper].client._stopped.set()  # (ends the loop after the sleep)
        by_sleeper[sleeper].join(STOP_POLL_S + 5.0)
        ended = by_sleeper[sleeper].ended_at
        assert ended is not None and ended - stopped < STOP_POLL_S + 1.0
    assert len(pacer._queue) == 1
    for thread in (first, second, third):
        thread.client._stopped.set()
        thread.sleeper.cancel()
        thread.join(STOP_POLL_S + 5.0)
