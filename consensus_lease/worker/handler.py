"""The handler contract: what a worker calls for each job, and how it says "retry".

A handler is ``handler(lease, payload) -> bytes | None``, a plain function or an
``async def`` (run to completion on an event loop owned by the worker thread calling it;
one loop per thread, reused for every job of that thread):

* returns bytes (or ``None``, meaning ``b""``): the worker completes the job with them;
* raises :class:`Retry`: the worker fails the attempt with the delay the handler chose;
* raises anything else: the worker fails the attempt with the retry policy's delay
  (after the job's last attempt the store makes it FAILED, a dead letter);
* raises ``LeaseLost`` (``lease.ensure_held()`` does, once the lease is gone): the worker
  logs it and moves on without completing: another worker has or will get the job.

``lease`` is the HELD :class:`~consensus_lease.Lease` (call ``lease.ensure_held()``
before each effect and send ``lease.generation`` with it); ``payload`` is the bytes given
to ``enqueue``. Handlers of a process run concurrently in ``concurrency`` threads.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from ..errors import InvalidArgument
from ..lease import Lease
from ..validation import check_retry_in

__all__ = ["Handler", "HandlerCall", "Retry", "check_handler", "load_handler"]

HandlerResult: TypeAlias = "bytes | bytearray | memoryview | None"
Handler: TypeAlias = Callable[[Lease, bytes], "HandlerResult | Awaitable[HandlerResult]"]
"""``handler(lease, payload)``: see the module docstring."""


class Retry(Exception):
    """Raise from a handler to fail this attempt and retry the job after ``delay_s``
    seconds of the *store's* time (instead of the retry policy's delay). The attempt
    still counts: after the job's last attempt it becomes FAILED all the same.

    Args:
        delay_s: seconds before the next attempt (float >= 0, at most a year).
        reason: what to record as the job's error (default: this exception's text).

    Raises:
        InvalidArgument: ``delay_s`` out of range.
    """

    def __init__(self, delay_s: float, reason: str | BaseException | None = None) -> None:
        self.delay_s = check_retry_in(delay_s)
        self.reason = reason
        text = f"retry in {self.delay_s:g} s"
        super().__init__(text if reason is None else f"{text}: {reason}")

    @property
    def error(self) -> str | BaseException:
        """What ``lease.fail()`` records."""
        return self if self.reason is None else self.reason


def load_handler(spec: str) -> Handler:
    """Import ``"package.module:function"`` (``function`` may be dotted: ``Class.method``).
    The current directory is searched first, as with ``python -m``.

    Raises:
        InvalidArgument: malformed spec, the module cannot be imported (the message says
            why: not found, or the exception its own code raised as it was imported,
            type and message), no such attribute, or it is not callable.
    """
    module_name, sep, attr = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not sep or not module_name or not attr:
        raise InvalidArgument(f"handler must be 'package.module:function', not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import the handler's module {module_name!r}: {exc}"
                              ) from exc
    except Exception as exc:  # the module's own code failed as it ran (or a SyntaxError)
        raise InvalidArgument(
            f"cannot import the handler's module {module_name!r}: importing it raised "
            f"{type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidArgument(f"{module_name!r} has no attribute {attr!r}") from None
    return check_handler(target)


def check_handler(handler: object) -> Handler:
    """Return ``handler`` if callable; else ``InvalidArgument``."""
    if not callable(handler):
        raise InvalidArgument(f"handler must be callable, not {type(handler).__name__}")
    return handler


class HandlerCall:
    """Calls a handler from one worker thread, and turns its value into result bytes.

    Owns that thread's event loop for ``async`` handlers (created on first use; a
    handler that returns any awaitable is run the same way). Close it from the same
    thread.
    """

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._runner: asyncio.Runner | None = None

    def __call__(self, lease: Lease, payload: bytes) -> bytes:
        """Run the handler; its exceptions propagate.

        Raises:
            InvalidArgument: the handler returned something other than bytes or None.
        """
        value: object = self._handler(lease, payload)
        if inspect.isawaitable(value):
            if self._runner is None:
                self._runner = asyncio.Runner()
            value = self._runner.run(_wait_for(value))
        if value is None:
            return b""
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise InvalidArgument(
            f"the handler returned {type(value).__name__}; it must return bytes or None",
            job_id=lease.job_id, generation=lease.generation,
        )

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None


async def _wait_for(awaitable: Awaitable[object]) -> object:
    return await awaitable
