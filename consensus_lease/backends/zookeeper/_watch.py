"""Waiting for an owner znode to go away, woken by a ZooKeeper watch (not by polling).

One watch per owner path at a time, shared by every waiter in this process: a waiter that
times out leaves no callback behind to pile up on a job held for a long time. kazoo fires
(and drops) every watch when its connection is lost, which wakes the waiters early: a
spurious return, which the caller's claim loop allows.
"""

from __future__ import annotations

import threading
from typing import Any

from kazoo.client import KazooClient

__all__ = ["OwnerWatches"]


class OwnerWatches:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, threading.Event] = {}

    def wait_gone(
        self, client: KazooClient, path: str, timeout_s: float, read_timeout_s: float
    ) -> None:
        """Return once ``path`` does not exist, was deleted or changed, or after
        ``timeout_s`` seconds. Raises kazoo's exceptions from the ``exists`` read."""
        with self._lock:
            event = self._armed.get(path)
        if event is None:
            event = threading.Event()

            def fire(_watched: Any, event: threading.Event = event) -> None:
                event.set()
                with self._lock:
                    if self._armed.get(path) is event:
                        del self._armed[path]

            if client.exists_async(path, watch=fire).get(timeout=read_timeout_s) is None:
                return  # no holder now (the watch left behind fires on the next claim)
            with self._lock:
                # Armed only while the node exists: an unfired watch then means "still there".
                if not event.is_set():
                    event = self._armed.setdefault(path, event)
        event.wait(timeout_s)
