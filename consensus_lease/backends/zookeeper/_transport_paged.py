"""Large reads (a whole queue's listing) on the shared client: throttled and paced by
progress, so they neither take every request slot of the client nor fail for their size.

:meth:`._transport.Wire.read` starts every read at once (up to the gate's cap of
:data:`._transport_gate.IN_FLIGHT` unanswered) and the call ends by one deadline. A
``queue_jobs`` of 5,000 jobs is 20,000 reads: on a loaded ensemble they took longer than
``timeout_s`` in all, so the call failed ("not connected (or 100 requests already
unanswered)") although every answer came promptly, and while it ran it held all 100
slots of the client that enqueues, candidates and ``get`` share.

:func:`read_window` instead keeps at most :data:`READ_WINDOW` of its requests in flight
(half the cap: other callers of the client always find slots) and starts the next as
each answer comes; each answer is due ``timeout_s`` after the previous one (or the
start). So a large read fails only when the store stops answering for ``timeout_s``,
not because it is large; its length is bounded by its size (a queue holds at most
``MAX_QUEUE_JOBS`` jobs). A lost connection is ridden out as in ``reader_read``: the
reads not answered yet are sent again (reads are safe to repeat) until the one due
passes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from kazoo.exceptions import ConnectionLoss, NoNodeError

from ...errors import AuthenticationFailed, BackendUnavailable
from ._transport import Read, Wire
from ._transport_errors import KAZOO_ERRORS
from ._transport_gate import IN_FLIGHT

__all__ = ["READ_WINDOW", "read_window"]

READ_WINDOW = IN_FLIGHT // 2
"""Most requests one large read keeps in flight on the shared client (below the gate's
cap, :data:`._transport_gate.IN_FLIGHT`): 50 requests keep a loopback or LAN round trip busy."""


def read_window(wire: Wire, reads: Sequence[Read], what: str,
                window: int = READ_WINDOW) -> list[Any]:
    """Answer every read of ``reads`` ("get", "exists", "children": no writes), in order,
    on the shared client, at most ``window`` in flight; a missing node reads as ``None``.

    Raises:
        BackendUnavailable: no answer for ``timeout_s`` (not connected, or the store
            does not answer), or a kazoo error other than a lost connection.
        AuthenticationFailed.
    """
    timeout_s = wire.config.timeout_s
    out: list[Any] = [None] * len(reads)
    done = [0]  # reads[:done[0]] are answered
    while True:
        answered = done[0]
        due = time.monotonic() + timeout_s
        client = wire.reader(due)
        try:
            _pump(wire, client, reads, out, done, window, what, timeout_s)
            return out
        except BackendUnavailable as exc:
            if done[0] > answered:
                due = time.monotonic() + timeout_s  # answers came: progress
            if isinstance(exc, AuthenticationFailed) or time.monotonic() >= due \
                    or not isinstance(exc.__cause__, ConnectionLoss):
                raise
            threading.Event().wait(0.05)  # the client is reconnecting


def _pump(wire: Wire, client: Any, reads: Sequence[Read], out: list[Any], done: list[int],
          window: int, what: str, timeout_s: float) -> None:
    """Send ``reads[done[0]:]``, at most ``window`` unanswered, filling ``out`` and
    advancing ``done[0]`` as answers come (in order: ZooKeeper answers one connection's
    requests in order)."""
    start: dict[str, Callable[[str], Any]] = {
        "get": client.get_async,
        "exists": client.exists_async,
        "children": client.get_children_async,
    }
    gate = wire.gate(client)
    pending: deque[tuple[int, Any]] = deque()
    sent = done[0]
    due = time.monotonic() + timeout_s
    try:
        while done[0] < len(reads):
            while sent < len(reads) and len(pending) < window:
                kind, path = reads[sent]
                pending.append((sent, gate.start(partial(start[kind], path), due)))
                sent += 1
            index, result = pending.popleft()
            try:
                out[index] = result.get(timeout=max(0.0, due - time.monotonic()))
            except NoNodeError:
                out[index] = None
            done[0] = index + 1
            due = time.monotonic() + timeout_s  # progress: the next answer is due anew
    except KAZOO_ERRORS as exc:
        raise wire._error(exc, what, worker=False) from exc
    finally:
        if done[0] > 0:
            wire._answered(client, None, what)
