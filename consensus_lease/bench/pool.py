"""A pool of worker processes for W1 (see :mod:`.cycler` for what each one does)."""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from .cycler import serve

__all__ = ["PoolError", "WorkerPool"]


class PoolError(RuntimeError):
    """A worker failed, died, or did not answer in time."""


class WorkerPool:
    """``size`` spawned worker processes, each with its own pipe.

    Spawned (a fresh interpreter each), never forked: the parent may already hold gRPC
    channels or kazoo clients, which must not cross a fork.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[tuple[Any, Any]] = []

    def start(self) -> WorkerPool:
        for index in range(self.size):
            parent, child = self._context.Pipe()
            process = self._context.Process(
                target=serve, args=(child, index), name=f"clbench-worker-{index}", daemon=True
            )
            process.start()
            child.close()
            self._workers.append((process, parent))
        return self

    def call(self, messages: Sequence[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
        """Send ``messages[i]`` to worker ``i`` (all at once), then wait for every reply.

        Raises:
            PoolError: a worker replied ``ok: false``, died, or passed the deadline.
        """
        if len(messages) > len(self._workers):
            raise PoolError(f"{len(messages)} messages for {len(self._workers)} workers")
        for (_, conn), message in zip(self._workers, messages, strict=False):
            conn.send(message)
        deadline = time.monotonic() + timeout_s
        replies = []
        for process, conn in self._workers[: len(messages)]:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise PoolError(f"{process.name} did not answer in {timeout_s:.0f} s "
                                f"(alive: {process.is_alive()})")
            try:
                reply: dict[str, Any] = conn.recv()
            except EOFError as exc:
                raise PoolError(f"{process.name} exited ({process.exitcode})") from exc
            replies.append(reply)
        failed = [r for r in replies if not r.get("ok")]
        if failed:
            raise PoolError(f"worker {failed[0].get('worker')}: {failed[0].get('error')}")
        return replies

    def close(self) -> None:
        """Ask every worker to exit; kill those that do not within 5 s. Idempotent."""
        for _, conn in self._workers:
            with contextlib.suppress(OSError, ValueError):
                conn.send({"op": "exit"})
        deadline = time.monotonic() + 5.0
        for process, conn in self._workers:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(5.0)
            conn.close()
        self._workers = []

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
