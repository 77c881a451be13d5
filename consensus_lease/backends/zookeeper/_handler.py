"""kazoo's threading handler with a cheaper ``select`` for its connection thread.

kazoo's connection thread waits on its sockets through ``handler.select`` about five
times per request (for something to read or send, before each write, before reading an
answer's length and its body). kazoo's ``select`` (``kazoo.handlers.utils.selector_select``)
builds a new ``selectors.DefaultSelector`` for every one of those waits: on Linux an epoll
object made, registered, polled and closed again, some 20-30 us of Python and system
calls each, over 200 us of the connection thread's CPU per claim+complete cycle (measured
with the W1 loop: the thread's CPU per cycle 415-450 us with it).

:class:`PollHandler` answers the same question with one ``poll(2)`` (no descriptor limit,
unlike ``select(2)``), with the results ``selector_select`` gives: an object ready to
read (or hung up, in error: its next ``recv`` says so) in the first list, ready to
write (or in error) in the second, none in the third; the same ``TypeError`` for an
object without a usable file descriptor and ``ValueError`` for a negative timeout.
Where ``select.poll`` does not exist, kazoo's own ``select`` is used.
"""

from __future__ import annotations

import math
import select
import threading
from collections.abc import Sequence
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import fileobj_to_fd

__all__ = ["PollHandler", "SharedPollHandler", "poll_select"]

_READ = select.POLLIN if hasattr(select, "poll") else 1
_WRITE = select.POLLOUT if hasattr(select, "poll") else 4


def poll_select(
    rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any],
    timeout: float | None = None,
) -> tuple[list[Any], list[Any], list[Any]]:
    """``select``'s contract as kazoo's connection uses it, with one ``poll(2)``.

    Args:
        rlist: objects (sockets, or file descriptors) to wait on until readable.
        wlist: objects to wait on until writable.
        xlist: ignored, as by kazoo's own (nothing is ever reported in it).
        timeout: seconds (float) to wait at most, rounded up to whole ms; ``None``:
            no limit.

    Returns:
        The objects of ``rlist`` ready to read (or hung up, or in error), those of
        ``wlist`` ready to write (or in error), and an empty list. An object in both
        lists is reported as readable if it is, else as writable (as kazoo's).

    Raises:
        TypeError: an object has no file descriptor, or a negative one; ``timeout`` is
            not a number.
        ValueError: ``timeout`` is negative.
    """
    if timeout is not None:
        if not isinstance(timeout, (int, float)):
            raise TypeError("timeout must be a number")
        if timeout < 0:
            raise ValueError("timeout must be non-negative")
    masks: dict[int, int] = {}
    objects: dict[int, list[Any]] = {}
    for fileobj in rlist:
        fd = fileobj_to_fd(fileobj)
        if fd in masks:
            objects[fd].append(fileobj)
        else:
            masks[fd], objects[fd] = _READ, [fileobj]
    for fileobj in wlist:
        fd = fileobj_to_fd(fileobj)
        if fd in masks:
            masks[fd] |= _WRITE
            objects[fd].append(fileobj)
        else:
            masks[fd], objects[fd] = _WRITE, [fileobj]
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ready = poller.poll(None if timeout is None else math.ceil(timeout * 1000))
    readable: list[Any] = []
    writable: list[Any] = []
    for fd, event in ready:
        mask = masks[fd]
        # as selectors' PollSelector: anything but POLLOUT (input, hang-up, error) makes
        # a descriptor readable, anything but POLLIN writable, within what it waits for
        if mask & _READ and event & ~_WRITE:
            readable += objects[fd]
        elif mask & _WRITE and event & ~_READ:
            writable += objects[fd]
    return readable, writable, []


class PollHandler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's ``SequentialThreadingHandler`` whose ``select`` is :func:`poll_select`
    (see the module docstring); everything else is kazoo's."""

    if hasattr(select, "poll"):

        def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
            return poll_select(*args, **kwargs)


class SharedPollHandler(PollHandler):
    """One :class:`PollHandler` for the kazoo clients of a store's sessions: kazoo gives
    every client a handler with two worker threads (watch callbacks, completions), so
    2,000 sessions were 4,000 of them beside their 2,000 connection threads. Here each
    client's ``start()`` and ``stop()`` are counted, the threads start with the first
    client and end with the last.

    What the shared threads run is the library's own short callbacks (a watch that sets
    an event, an answer's completion): a session's state changes, and so its loss and
    the user's loss callbacks, come on its own client's connection thread, which is not
    shared.
    """

    def __init__(self) -> None:
        super().__init__()
        self._users = 0
        self._users_lock = threading.Lock()

    def start(self) -> None:
        with self._users_lock:
            self._users += 1
            if self._users == 1:
                super().start()

    def stop(self) -> None:
        with self._users_lock:
            if self._users == 0:
                return
            self._users -= 1
            if self._users == 0:
                super().stop()

