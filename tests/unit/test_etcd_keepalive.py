"""The etcd driver's shared keepalive stream against scripted members (no etcd): short
attempts that move to the next member, patience with a slow cluster, paced reopening."""

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
from consensus_lease.backends.etcd._keepalive import KeepAliveStreams
from consensus_lease.backends.etcd._transport import Failure, Transport


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _Call:
    """One scripted LeaseKeepAlive call: answers each request after ``delay_s`` (never,
    if ``None``), or fails at once with ``refuse``."""

    def __init__(self, requests: Iterator[Any], delay_s: float | None,
                 refuse: str | None) -> None:
        self._answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._refuse = refuse
        self._delay_s = delay_s
        threading.Thread(target=self._serve, args=(requests,), daemon=True).start()

    def _serve(self, requests: Iterator[Any]) -> None:
        for request in requests:  # ends when the stream is failed
            if self._delay_s is not None:
                time.sleep(self._delay_s)  # the scripted member's answer time
                self._answers.put(etcdrpc.LeaseKeepAliveResponse(ID=request.ID, TTL=5))

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
    def __init__(self, delay_s: float | None, refuse: str | None = None) -> None:
        self.delay_s, self.refuse = delay_s, refuse
        self.opened = 0

    def LeaseKeepAlive(self, requests: Iterator[Any], metadata: Any) -> _Call:
        self.opened += 1
        return _Call(requests, self.delay_s, self.refuse)


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


def test_a_silent_member_costs_one_short_attempt(closing: list[Any]) -> None:
    silent, healthy = _LeaseStub(None), _LeaseStub(0.0)
    streams, transport = _streams(silent, healthy)
    closing.append((streams, transport))
    tried: list[Failure] = []
    start = time.monotonic()
    assert streams.keepalive(7, budget_s=2.0, attempt_s=0.2, tried=tried)[0] == 5
    assert time.monotonic() - start < 1.0
    assert [f.code for f in tried] == [grpc.StatusCode.DEADLINE_EXCEEDED]
    assert (silent.opened, healthy.opened) == (1, 1)


def test_a_slow_cluster_still_renews(closing: list[Any]) -> None:
    """Every answer takes longer than the attempt: after a stream that never answered,
    the next one is waited on longer (twice), instead of timing out forever."""
    streams, transport = _streams(_LeaseStub(0.3), _LeaseStub(0.3))
    closing.append((streams, transport))
    assert streams.keepalive(7, budget_s=1.0, attempt_s=0.2)[0] == 5
    assert streams.keepalive(7, budget_s=1.0, attempt_s=0.2)[0] == 5  # same stream, patient


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
    # 0.5 s of retrying by 10 sessions: the pause grows 25, 50, 100, 100, ... ms.
    assert sum(s.opened for s in stubs) <= 10
