"""Wait for changes to key ranges with etcd watches, then cancel them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyetcd import etcdrpc

from ._transport import Failure, Transport, rpc_failures

__all__ = ["NODELETE", "NOPUT", "WatchRange", "wait_for_event", "wait_for_events"]

NOPUT = etcdrpc.WatchCreateRequest.NOPUT
"""Watch filter: deliver no PUT events."""
NODELETE = etcdrpc.WatchCreateRequest.NODELETE
"""Watch filter: deliver no DELETE events."""


@dataclass(frozen=True, slots=True)
class WatchRange:
    """One watched range ``[key, range_end)``, with etcd's event ``filters``."""

    key: bytes
    range_end: bytes
    filters: tuple[int, ...] = ()


Wake = Callable[[int, Sequence[Any]], bool]
"""``wake(index, events)``: called with the events of one watch response for the
watched range ``index``; returns whether to stop waiting."""


def wait_for_events(
    transport: Transport,
    ranges: Sequence[WatchRange],
    start_revision: int,
    timeout_s: float,
    wake: Wake,
) -> bool:
    """Watch each of ``ranges`` from ``start_revision`` on one stream of the current
    member; return ``True`` as soon as ``wake`` accepts a response's events, ``False``
    when ``timeout_s`` passes or etcd cancels a watch (e.g. the start revision was
    compacted). The watches are cancelled on every way out.

    Starting at the revision just after a read means no change made after that read can
    be missed (etcd watch guarantee: events are delivered in revision order from
    ``start_revision`` on, none skipped, and the events of one revision arrive in one
    response). etcd answers a stream's create requests in order, which maps each watch
    id to its range.

    Raises:
        Failure: the stream broke (member down, no leader, auth); the caller may retry.
    """
    member = transport.member()
    finished = threading.Event()
    creates = [
        etcdrpc.WatchRequest(
            create_request=etcdrpc.WatchCreateRequest(
                key=r.key, range_end=r.range_end, start_revision=start_revision,
                filters=list(r.filters),
            )
        )
        for r in ranges
    ]

    def requests() -> Iterator[Any]:
        yield from creates
        finished.wait()  # keep our side open until we are done; the call is then cancelled

    index_of: dict[int, int] = {}
    call = member.watch.Watch(requests(), timeout=timeout_s, metadata=transport.metadata())
    try:
        with rpc_failures(member.target):
            for response in call:
                if response.created:
                    index_of[int(response.watch_id)] = len(index_of)
                if response.canceled:
                    return False
                if response.events and wake(index_of.get(int(response.watch_id), -1),
                                            response.events):
                    return True
    except Failure as failure:
        if failure.timed_out:
            return False
        if failure.transient:
            transport.rotate(member)
        raise
    finally:
        finished.set()
        call.cancel()
    return False


def wait_for_event(
    transport: Transport, key: bytes, range_end: bytes, start_revision: int, timeout_s: float
) -> bool:
    """Watch ``[key, range_end)`` from ``start_revision``; return ``True`` at the first
    event, ``False`` when ``timeout_s`` passes or etcd cancels the watch. See
    :func:`wait_for_events`.

    Raises:
        Failure: the stream broke (member down, no leader, auth); the caller may retry.
    """
    return wait_for_events(
        transport, [WatchRange(key, range_end)], start_revision, timeout_s, lambda _i, _e: True
    )
