"""Waiting for an owner znode to go away, woken by a ZooKeeper watch (not by polling).

One watch per owner path at a time, shared by every waiter in this process: a waiter that
times out leaves no callback behind to pile up on a job held for a long time. kazoo fires
(and drops) every watch when its connection is lost, which wakes the waiters early: a
spurious return, which the caller's claim loop allows.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any

from ._transport_errors import answer_or_none
from ._transport_gate import Gate

__all__ = ["OwnerWatches", "SharedWatches"]


class OwnerWatches:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, threading.Event] = {}

    def wait_gone(self, gate: Gate, path: str, timeout_s: float, read_deadline: float) -> None:
        """Return once ``path`` does not exist, was deleted or changed, or after
        ``timeout_s`` seconds. The ``exists`` read goes through ``gate`` and ends by
        ``read_deadline`` (``time.monotonic()`` seconds). Raises kazoo's exceptions
        from it."""
        with self._lock:
            event = self._armed.get(path)
        if event is None:
            event = threading.Event()

            def fire(_watched: Any, event: threading.Event = event) -> None:
                event.set()
                with self._lock:
                    if self._armed.get(path) is event:
                        del self._armed[path]

            arm = partial(gate.client.exists_async, path, watch=fire)
            answer = gate.start(arm, read_deadline).get(
                timeout=max(0.0, read_deadline - time.monotonic())
            )
            if answer is None:
                return  # no holder now (the watch left behind fires on the next claim)
            with self._lock:
                # Armed only while the node exists: an unfired watch then means "still there".
                if not event.is_set():
                    event = self._armed.setdefault(path, event)
        event.wait(timeout_s)


class SharedWatches:
    """One-shot ZooKeeper watches shared by many waiters, each waiting on several at once.

    A watch is *armed* per ``(kind, path)`` by the first waiter that needs it; later
    waiters join it instead of registering another callback with kazoo. When ZooKeeper
    fires it (or kazoo drops it on a lost connection, which kazoo reports as a fired
    watch), every waiter that joined is woken and the entry goes. A waiter that times out
    only leaves: the armed watch stays until it fires, one per path however many waiters
    come and go, which is all kazoo allows (it has no call to remove a watch).

    Kinds: ``"children"`` (``get_children`` watch: a child added or removed; armed while
    the path exists), ``"deleted"`` (``exists`` watch, armed while the path exists) and
    ``"created"`` (``exists`` watch, armed while the path is absent).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[tuple[str, str], set[threading.Event]] = {}

    def armed(self) -> int:
        """How many watches are armed now (for tests)."""
        with self._lock:
            return len(self._armed)

    def _fire(self, key: tuple[str, str], but: threading.Event | None = None) -> None:
        with self._lock:
            waiters = self._armed.pop(key, set())
        if but is not None:
            waiters.discard(but)  # the caller itself knows: it is not woken
        for event in waiters:
            event.set()

    def join(
        self, gate: Gate, kind: str, paths: list[str], event: threading.Event,
        read_deadline: float,
    ) -> list[Any]:
        """Join ``event`` to the watch ``kind`` on each of ``paths``, arming those not
        armed yet with one pipelined round trip (through ``gate``, by ``read_deadline``,
        ``time.monotonic()`` seconds). Element ``i`` answers ``paths[i]``:

        * ``True``: joined a watch that is armed (the condition it waits on still held
          when it was armed, and nothing fired since);
        * for a watch this call armed, the read's answer (children names or a stat; ``True``
          for a ``"created"`` watch);
        * ``None``: the condition is not met (a ``"children"`` or ``"deleted"`` path that
          does not exist, a ``"created"`` path that does); nothing is joined then.

        Raises kazoo's exceptions from the reads; watches it armed are then dropped (and
        their waiters woken: spurious).
        """
        keys = [(kind, path) for path in paths]
        answers: list[Any] = [True] * len(paths)
        mine: list[int] = []
        with self._lock:
            for i, key in enumerate(keys):
                waiters = self._armed.get(key)
                if waiters is not None:
                    waiters.add(event)
                else:
                    self._armed[key] = {event}
                    mine.append(i)
        pending = []
        try:
            for i in mine:
                key = keys[i]

                def fire(_watched: Any, key: tuple[str, str] = key) -> None:
                    self._fire(key)

                read = (gate.client.get_children_async if kind == "children"
                        else gate.client.exists_async)
                pending.append(gate.start(partial(read, paths[i], watch=fire), read_deadline))
            for i, result in zip(mine, pending, strict=False):
                # None: get_children of a missing path (no watch registered)
                answers[i] = answer_or_none(
                    result, timeout=max(0.0, read_deadline - time.monotonic()))
        except BaseException:
            for i in mine:
                self._fire(keys[i], but=event)
            raise
        for i in mine:
            exists = answers[i] is not None
            if exists == (kind == "created"):
                # Condition not met. An exists watch stays registered with kazoo until the
                # path is created or deleted; when it fires it wakes whoever joined this
                # key meanwhile: a spurious return, which waiters allow.
                answers[i] = None
                self._fire(keys[i], but=event)
            elif not exists:
                answers[i] = True  # a "created" watch armed on an absent path
        return answers

    def leave(self, keys: list[tuple[str, str]], event: threading.Event) -> None:
        """Stop waking ``event`` for ``keys``; the armed watches stay until they fire."""
        with self._lock:
            for key in keys:
                waiters = self._armed.get(key)
                if waiters is not None:
                    waiters.discard(event)
