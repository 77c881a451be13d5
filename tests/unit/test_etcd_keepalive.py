"""The etcd driver's shared keepalive streams against scripted members (no etcd): a
silent member is hedged, a failed stream is left at once, a late answer ends nothing but
its own wait and is never taken for a later request, paced reopening."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from pyetcd import etcdrpc

from consensus_lease.backends.etcd._config import EtcdConfig
from consensus_lease.backends.etcd._transport import Failure, Transport
from consensus_lease.backends.etcd._transport_keepalive import KeepAliveStreams


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _Call:
    """One scripted LeaseKeepAlive call: answers its requests in order, the k-th after
    ``delays[k]`` seconds (the last delay repeats; ``None``: never), with TTL k + 1, or
    fails at once with ``refuse``."""

    def __init__(self, requests: Iterator[Any], delays: list[float | None],
                 refuse: str | None) -> None:
        self._answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._refuse = refuse
        self._delays = delays
        threading.Thread(target=self._serve, args=(requests,), daemon=True).start()

    def _serve(self, requests: Iterator[Any]) -> None:
        for k, request in enumerate(requests):  # ends when the stream is failed
            delay_s = self._delays[min(k, len(self._delays) - 1)]
            if delay_s is None:
                return
            time.sleep(delay_s)  # the scripted member's answer time
            self._answers.put(etcdrpc.LeaseKeepAliveResponse(ID=request.ID, TTL=k + 1))

    def __iter__(self) -> Iterator[Any]:
        if self._refuse is not None:
            raise _RpcError(grpc.StatusCode.UNAVAILABLE, self._refuse)
        while True:
            answer = self._answers.get()
            if answer is None:
                raise _RpcError(grpc.StatusCode.CANCELLED, "cancelled")
            yield answer

    def cancel(self) -> None:
        self._answers.put(None)


class _LeaseStub:
    def __init__(self, *delays: float | None, refuse: str | None = None) -> None:
        self.delays, self.refuse = list(delays), refuse
        self.opened = 0

    def LeaseKeepAlive(self, requests: Iterator[Any], metadata: Any) -> _Call:
        self.opened += 1
        return _Call(requests, self.delays, self.refuse)


def _streams(*stubs: _LeaseStub) -> tuple[KeepAliveStreams, Transport]:
    endpoints = tuple(f"127.0.0.1:{n}" for n in range(1, len(stubs) + 1))
    transport = Transport(EtcdConfig(endpoints=endpoints, prefix=b"/t"))
    transport._current = 0
    for member, stub in zip(transport.members, stubs, strict=True):
        member.lease = stub
    return KeepAliveStreams(transport), transport


@pytest.fixture
def closing() -> Iterator[list[tuple[KeepAliveStreams, Transport]]]:
    made: list[tuple[KeepAliveStreams, Transport]] = []
    yield made
    for streams, transport in made:
        streams.close()
        transport.close()


def test_a_silent_member_costs_one_short_wait(closing: list[Any]) -> None:
    silent, healthy = _LeaseStub(None), _LeaseStub(0.0)
    streams, transport = _streams(silent, healthy)
    closing.append((streams, transport))
    tried: list[Failure] = []
    start = time.monotonic()
    assert streams.keepalive(7, budget_s=2.0, attempt_s=0.2, tried=tried)[0] == 1
    assert time.monotonic() - start < 1.0
    assert tried == []  # hedged, not failed: the silent member's request still waits
    assert (silent.opened, healthy.opened) == (1, 1)
    # The member that answered is asked first from now on.
    start = time.monotonic()
    assert streams.keepalive(7, budget_s=2.0, attempt_s=0.2)[0] == 2
    assert time.monotonic() - start < 0.15 and silent.opened == 1


def test_a_failed_stream_moves_to_the_next_member_at_once(closing: list[Any]) -> None:
    refusing, healthy = _LeaseStub(0.0, refuse="connection refused"), _LeaseStub(0.0)
    streams, transport = _streams(refusing, healthy)
    closing.append((streams, transport))
    tried: list[Failure] = []
    start = time.monotonic()
    assert streams.keepalive(7, budget_s=2.0, attempt_s=1.0, tried=tried)[0] == 1
    assert time.monotonic() - start < 0.5  # well before the 1 s wait for a hedge
    assert [f.code for f in tried] == [grpc.StatusCode.UNAVAILABLE]
    assert transport.member() is transport.members[1]


def test_a_slow_cluster_still_renews(closing: list[Any]) -> None:
    """Every answer takes longer than ``attempt_s``: hedged, then answered in time."""
    streams, transport = _streams(_LeaseStub(0.3), _LeaseStub(0.3))
    closing.append((streams, transport))
    assert streams.keepalive(7, budget_s=1.0, attempt_s=0.2)[0] == 1
    assert streams.keepalive(7, budget_s=1.0, attempt_s=0.2)[0] >= 1


def test_a_late_answer_ends_nobody_else(closing: list[Any]) -> None:
    """Answers take 0.15 s each on the only member, longer than ``attempt_s``: twenty
    sessions' keepalives at once all get theirs, on the one stream (a late answer used
    to tear the stream down, failing every keepalive waiting on it)."""
    stub = _LeaseStub(0.15, 0.01)
    streams, transport = _streams(stub)
    closing.append((streams, transport))
    answers: list[int] = []

    def keepalive(lease_id: int) -> None:
        answers.append(streams.keepalive(lease_id, budget_s=3.0, attempt_s=0.05)[0])

    threads = [threading.Thread(target=keepalive, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(answers) == list(range(1, 21))
    assert stub.opened == 1


def test_a_late_answer_is_not_taken_for_a_later_request(closing: list[Any]) -> None:
    """The first request's answer comes after its call gave up; the next call of the
    same lease gets the answer to its own request (TTL 2), never the late one, which
    proves nothing about the time after the first request was sent."""
    stub = _LeaseStub(0.4, 0.0)
    streams, transport = _streams(stub)
    closing.append((streams, transport))
    with pytest.raises(Failure) as exc:
        streams.keepalive(7, budget_s=0.2, attempt_s=0.1)
    assert exc.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert streams.keepalive(7, budget_s=2.0, attempt_s=1.0)[0] == 2
    assert stub.opened == 1


def test_reopening_is_paced_while_every_member_refuses(closing: list[Any]) -> None:
    stubs = [_LeaseStub(0.0, refuse="etcdserver: no leader") for _ in range(3)]
    streams, transport = _streams(*stubs)
    closing.append((streams, transport))
    failures: list[Failure] = []

    def keepalive() -> None:
        with pytest.raises(Failure) as exc:
            streams.keepalive(7, budget_s=0.5, attempt_s=0.2)
        failures.append(exc.value)

    threads = [threading.Thread(target=keepalive) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(failures) == 10 and all("no leader" in f.details for f in failures)
    # 0.5 s of retrying by 10 sessions: each member's pause grows 25, 50, 100, 100, ...
    # ms, so a member sees about 7 streams, not one per session and retry.
    assert all(s.opened <= 9 for s in stubs), [s.opened for s in stubs]
