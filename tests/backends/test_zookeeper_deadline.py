"""Every public call of the ZooKeeper backend ends by its deadline: ``timeout_s`` from its
start (a write's read-back may add ``SETTLE_GRACE_S``), however many round trips it
makes, also when the server is SIGKILLed in the middle of a listing of thousands of
pipelined reads (issue 14: kazoo used to keep the caller blocked in its socket-pair
``send`` until the server was back, 41 s and more).

A local server of this module's own (it is killed and restarted here), not the container
ensemble: needs java and the Debian ``zookeeper`` package (skipped without them). The
request gate itself is tested without a server at the end.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooState
from kazoo.exceptions import SessionExpiredError
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import AsyncResult
from zk_local import LocalZooKeeper, available, backend_of

from consensus_lease import LeaseStore, open_store
from consensus_lease.backends.zookeeper import _queues
from consensus_lease.backends.zookeeper._transport import SETTLE_GRACE_S
from consensus_lease.backends.zookeeper._transport_gate import IN_FLIGHT, Gate, NotSent
from consensus_lease.errors import BackendUnavailable, OutcomeUnknown
from consensus_lease.testing.conformance import poll_until

pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0
SLACK_S = 2.0
"""A call must return or raise within TIMEOUT_S + SLACK_S of its start."""
JOBS = 2000


@pytest.fixture(scope="module")
def server() -> Iterator[LocalZooKeeper]:
    reason = available()
    if reason is not None:
        pytest.skip(f"no local ZooKeeper: {reason}")
    with LocalZooKeeper(address="127.0.250.30") as server:
        yield server


@pytest.fixture(scope="module")
def url(server: LocalZooKeeper) -> str:
    """The server's URL, with queue ``q`` of JOBS jobs."""
    url = server.url("/deadline")
    with open_store(url, connect_timeout_s=30) as store:
        store.enqueue_many("q", [(f"job-{i:05d}", b"x" * 64) for i in range(JOBS)])
    return url


@pytest.fixture
def store(server: LocalZooKeeper, url: str) -> Iterator[LeaseStore]:
    """A store with ``timeout_s=TIMEOUT_S`` whose read client is connected; the server is
    running again (and the store answering) after the test."""
    store = open_store(url, timeout_s=TIMEOUT_S, connect_timeout_s=30)
    try:
        assert store.get("job-00000") is not None  # the read client is connected
        yield store
    finally:
        server.start()
        poll_until(lambda: _answers(store), 30)
        store.close()


def _answers(store: LeaseStore) -> bool:
    try:
        return store.get("job-00000") is not None
    except BackendUnavailable:
        return False


Outcome = tuple[float, BaseException | None]
"""Seconds a call took until it returned or raised, and what it raised."""


def _timed_all(calls: dict[str, Callable[[], Any]], server: LocalZooKeeper) -> dict[str, Outcome]:
    """Run each of ``calls`` at once, each in a thread of its own. If one is still running
    TIMEOUT_S + SLACK_S + 5 s after the start, the server is started again (which is what
    used to unblock such a call) and the test fails."""
    outcomes: dict[str, Outcome] = {}
    started = time.monotonic()

    def run(name: str, call: Callable[[], Any]) -> None:
        raised: BaseException | None = None
        try:
            call()
        except BaseException as exc:  # reported to the test
            raised = exc
        outcomes[name] = (time.monotonic() - started, raised)

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in calls.items()]
    for thread in threads:
        thread.start()
    give_up = started + TIMEOUT_S + SLACK_S + 5.0
    for thread in threads:
        thread.join(max(0.0, give_up - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        blocked = sorted(set(calls) - set(outcomes))
        server.start()
        for thread in threads:
            thread.join(60)
        pytest.fail(f"still blocked {TIMEOUT_S + SLACK_S + 5.0} s after the start: {blocked}")
    return outcomes


def _timed(call: Callable[[], Any], server: LocalZooKeeper) -> Outcome:
    return _timed_all({"call": call}, server)["call"]


def _kill_on_read(
    store: LeaseStore, server: LocalZooKeeper, nth: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL the server as the store's ``nth`` batch of reads is about to be sent."""
    wire = backend_of(store)._wire
    real = wire.read
    real_window = _queues.read_window
    reads: list[int] = []

    def counted() -> None:
        reads.append(1)
        if len(reads) == nth:
            server.stop()

    def read(*args: Any, **kwargs: Any) -> Any:
        counted()
        return real(*args, **kwargs)

    def window(*args: Any, **kwargs: Any) -> Any:  # a large listing's paged reads
        counted()
        return real_window(*args, **kwargs)

    monkeypatch.setattr(wire, "read", read)
    monkeypatch.setattr(_queues, "read_window", window)


LISTINGS: dict[str, Callable[[LeaseStore], Any]] = {
    "queue_stats": lambda store: store.queue_stats("q"),
    "queue_jobs": lambda store: store.queue_jobs("q"),
    "records": lambda store: store.records(),
}


@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_a_listing_ends_by_its_deadline_when_the_server_is_killed_during_it(
    server: LocalZooKeeper, store: LeaseStore, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The second batch is the first chunk of the job reads (after the listing): hundreds
    # of requests sent while kazoo reconnects. queue_stats is one batch of five reads.
    _kill_on_read(store, server, 1 if name == "queue_stats" else 2, monkeypatch)
    elapsed, raised = _timed(lambda: LISTINGS[name](store), server)
    assert isinstance(raised, BackendUnavailable), raised
    assert "timeout_s" in str(raised)
    assert elapsed <= TIMEOUT_S + SLACK_S


def test_queue_stats_ends_by_its_deadline_when_the_server_is_killed_half_a_second_in(
    server: LocalZooKeeper, store: LeaseStore
) -> None:
    """The issue's failing input, by the clock: killed 0.5 s into a run of calls (each
    one round trip: O(1) since the bucketed layout), which ends by the deadline."""

    def stats_for(seconds: float) -> None:
        until = time.monotonic() + seconds
        for _ in range(100_000):  # bounded in count and time
            store.queue_stats("q")
            if time.monotonic() >= until:
                return

    timer = threading.Timer(0.5, server.stop)
    timer.start()
    try:
        elapsed, raised = _timed(lambda: stats_for(3.0), server)
    finally:
        timer.join()
    assert isinstance(raised, BackendUnavailable), raised
    assert elapsed <= 0.5 + TIMEOUT_S + SLACK_S


def test_every_call_on_a_dead_server_ends_by_its_deadline(
    server: LocalZooKeeper, store: LeaseStore
) -> None:
    backend = backend_of(store)
    h = backend.open_session("A", 30.0)
    claim = backend.claim(h, "held")
    assert claim is not None
    server.stop()
    calls: dict[str, Callable[[], Any]] = {
        "get": lambda: store.get("job-00001"),
        "queue_candidates": lambda: store.backend.queue_candidates("q", 32),
        "enqueue": lambda: store.enqueue("q", "late", b""),
        "purge": lambda: store.purge("q"),
        "claim": lambda: backend.claim(h, "job-00002"),
        "complete": lambda: backend.complete(h, "held", claim, b"done"),
    }
    waits: dict[str, Callable[[], Any]] = {
        "wait_for_queue": lambda: store.backend.wait_for_queue("q", 0.5),
        "wait_for_change": lambda: store.backend.wait_for_change("held", 0.5),
    }
    outcomes = _timed_all({**calls, **waits}, server)
    for name in calls:
        elapsed, raised = outcomes[name]
        assert isinstance(raised, BackendUnavailable), (name, raised)
        assert not isinstance(raised, OutcomeUnknown), (name, raised)  # nothing was sent
        assert "timeout_s" in str(raised) or "disconnected" in str(raised), (name, raised)
        assert elapsed <= TIMEOUT_S + SLACK_S, (name, elapsed)
    for name in waits:  # they wait on: the read's share of their time is timeout + 1 s
        elapsed, raised = outcomes[name]
        assert raised is None and elapsed <= 0.5 + 1.0 + SLACK_S, (name, outcomes[name])
    server.start()
    poll_until(lambda: _answers(store), 30)
    backend.close_session(h)


def test_a_write_whose_answer_is_lost_is_read_back_by_the_deadline_and_grace(
    server: LocalZooKeeper, store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server dies with the enqueue's multi in flight: reading back cannot reach it
    (OutcomeUnknown, within timeout_s + SETTLE_GRACE_S), unless its answer came first."""
    client = backend_of(store)._wire.reader()
    real = client.transaction

    def transaction() -> Any:
        tx = real()
        commit = tx.commit_async

        def commit_async() -> Any:
            result = commit()
            server.stop()
            return result

        tx.commit_async = commit_async
        return tx

    monkeypatch.setattr(client, "transaction", transaction)
    elapsed, raised = _timed(lambda: store.enqueue("w", "lost", b""), server)
    assert raised is None or isinstance(raised, OutcomeUnknown), raised
    assert elapsed <= TIMEOUT_S + SETTLE_GRACE_S + SLACK_S


# -- the gate, without a server -------------------------------------------------------------


def _result() -> AsyncResult:
    """A kazoo async result nobody answers (until the test does)."""
    return SequentialThreadingHandler().async_result()


class _Client:
    def __init__(self) -> None:
        self.connected = True
        self.state = KazooState.CONNECTED


def test_the_gate_bounds_requests_in_flight_and_waits_no_later_than_the_deadline() -> None:
    client = _Client()
    gate = Gate(client)  # type: ignore[arg-type]
    results = [gate.start(_result, time.monotonic() + 1) for _ in range(IN_FLIGHT)]
    assert gate.in_flight() == IN_FLIGHT
    started = time.monotonic()
    with pytest.raises(NotSent):
        gate.start(_result, started + 0.3)
    assert 0.3 <= time.monotonic() - started < 1.0
    threading.Timer(0.1, lambda: [r.set(None) for r in results[: IN_FLIGHT // 2 + 1]]).start()
    assert isinstance(gate.start(_result, time.monotonic() + 5), AsyncResult)  # slots freed
    assert gate.in_flight() == IN_FLIGHT // 2


def test_the_gate_sends_nothing_while_disconnected_and_says_when_the_session_is_lost() -> None:
    client = _Client()
    client.connected = False
    gate = Gate(client)  # type: ignore[arg-type]
    sent: list[int] = []
    started = time.monotonic()
    with pytest.raises(NotSent):
        gate.start(lambda: sent.append(1), started + 0.2)
    assert not sent and time.monotonic() - started < 1.0
    threading.Timer(0.1, lambda: setattr(client, "connected", True)).start()
    gate.start(lambda: sent.append(1), time.monotonic() + 5)  # reconnected: sent
    assert sent == [1]
    client.connected, client.state = False, KazooState.LOST
    with pytest.raises(SessionExpiredError):
        gate.start(lambda: sent.append(1), time.monotonic() + 5)
    with pytest.raises(NotSent):  # a deadline already passed: not even tried
        gate.start(lambda: sent.append(1), time.monotonic() - 1)
    assert sent == [1]


def test_twice_the_requests_in_flight_fit_in_a_socket_pair_without_blocking() -> None:
    """kazoo wakes its connection thread with one byte per request through a socket pair;
    the gate keeps at most 2 x IN_FLIGHT bytes there (see ``_transport_gate``)."""
    a, b = socket.socketpair()
    try:
        a.setblocking(False)
        fits = 0
        with pytest.raises(BlockingIOError):
            while fits < 10_000:
                a.send(b"\0")
                fits += 1
        assert fits >= 2 * IN_FLIGHT + 16
    finally:
        a.close()
        b.close()
