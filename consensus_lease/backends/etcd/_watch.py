"""Wait for the first change to a key range with an etcd watch, then cancel it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
from pyetcd import etcdrpc

from ._transport import Failure, Transport

__all__ = ["wait_for_event"]


def wait_for_event(
    transport: Transport, key: bytes, range_end: bytes, start_revision: int, timeout_s: float
) -> bool:
    """Watch ``[key, range_end)`` from ``start_revision``; return ``True`` at the first
    event, ``False`` when ``timeout_s`` passes or etcd cancels the watch (e.g. the start
    revision was compacted). The watch is cancelled on every way out.

    Starting at the revision just after a read means no change made after that read can
    be missed (etcd watch guarantee: events are delivered in revision order from
    ``start_revision`` on, none skipped).

    Raises:
        Failure: the stream broke (member down, no leader, auth); the caller may retry.
    """
    member = transport.member()
    finished = threading.Event()
    create = etcdrpc.WatchRequest(
        create_request=etcdrpc.WatchCreateRequest(
            key=key, range_end=range_end, start_revision=start_revision
        )
    )

    def requests() -> Iterator[Any]:
        yield create
        finished.wait()  # keep our side open until we are done; the call is then cancelled

    call = member.watch.Watch(requests(), timeout=timeout_s, metadata=transport.metadata())
    try:
        for response in call:
            if response.events:
                return True
            if response.canceled:
                return False
    except grpc.RpcError as exc:
        failure = Failure.from_rpc(member.target, exc)
        if failure.code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return False
        if failure.transient:
            transport.rotate(member)
        raise failure from exc
    finally:
        finished.set()
        call.cancel()
    return False
