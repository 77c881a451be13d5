"""User callbacks (``on_lost``): refused at registration if they cannot take the
arguments they will get, and never failing silently when they run.

* **Shape**: :func:`check_callback` binds the arguments a callback will be called with
  to its :func:`inspect.signature`; one that cannot take them is refused with
  ``InvalidArgument`` (nothing registered). A callable without an inspectable signature
  (some builtins and C extensions) is accepted. A coroutine function (``async def``,
  also inside :func:`functools.partial` or as an object's ``__call__``) is refused too:
  callbacks are called, never awaited, so its body would never run (only Python's
  "coroutine was never awaited" warning); the message points at
  :mod:`consensus_lease.aio`.
* **Failure**: :func:`run_callback` calls it; an exception is logged at ERROR on the
  ``consensus_lease.callbacks`` logger, with its traceback, and counted
  (:meth:`~consensus_lease.observe.Observer.callback_failed`). The package puts a
  ``NullHandler`` on ``consensus_lease`` (the standard library's advice for libraries:
  an application that configures no logging is not shown the library's internals), which
  also hides the ``lastResort`` handler Python would otherwise use to show WARNING and
  above on stderr. A failed loss notification is the application's own bug, not the
  library's internals, and dropping it would swallow a lease loss: so when no handler
  other than a ``NullHandler`` would receive the record (logging left unconfigured), it
  goes to :data:`logging.lastResort` (stderr, WARNING and above), exactly where Python
  shows it for code without a library's ``NullHandler`` (the rule is
  :func:`consensus_lease._visible.log_visible`). An application that configures logging
  gets it through its own handlers only.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from ._visible import log_visible
from .errors import InvalidArgument
from .observe import Observer, notify

__all__ = ["check_callback", "log", "run_callback"]

log = logging.getLogger("consensus_lease.callbacks")


def check_callback(callback: object, nargs: int, what: str, shape: str) -> None:
    """Refuse ``callback`` unless it is a plain (not ``async``) callable that can be
    called with ``nargs`` positional arguments.

    Args:
        what: the registration, for the message (``"Session.on_lost"``).
        shape: the call it will get, for the message (``"callback(session, reason)"``).

    Raises:
        InvalidArgument: not callable, a coroutine function (it would never run), or its
            signature cannot take ``nargs`` positional arguments; nothing registered.
    """
    if not callable(callback):
        raise InvalidArgument(f"{what} needs a callable, not {callback!r}")
    if _is_coroutine_function(callback):
        raise InvalidArgument(
            f"{what}: {callback!r} is an async def: callbacks are called, never awaited, "
            "so it would never run; nothing was registered. For asyncio code use "
            "consensus_lease.aio, which delivers lease loss as cancellation "
            "(`async with lease.guard():`), or register a plain function that schedules "
            "a task (AsyncSession.on_lost runs it on the event loop)"
        )
    try:
        signature = inspect.signature(callback)
    except (TypeError, ValueError):
        return  # no signature to check (a builtin, a C extension): accepted
    try:
        signature.bind(*([None] * nargs))
    except TypeError as exc:
        raise InvalidArgument(
            f"{what}: {callback!r} cannot be called as {shape} (its signature is "
            f"{signature}: {exc}); nothing was registered"
        ) from None


def _is_coroutine_function(callback: object) -> bool:
    """``async def``, also wrapped in :func:`functools.partial` or as ``__call__``."""
    while isinstance(callback, functools.partial):
        callback = callback.func
    if inspect.iscoroutinefunction(callback):
        return True
    return not inspect.isroutine(callback) and inspect.iscoroutinefunction(
        inspect.getattr_static(type(callback), "__call__", None))


def run_callback(callback: Callable[..., object], args: tuple[Any, ...], what: str,
                 observer: Observer | None, store: str, **extra: Any) -> None:
    """Call ``callback(*args)``; an exception is logged (see the module docstring) and
    counted, never raised (the caller is a keepalive or a loss path)."""
    try:
        callback(*args)
    except Exception:
        report_failure(callback, what, **extra)
        notify(observer, lambda o: o.callback_failed(store, what))


def report_failure(callback: object, what: str, **extra: Any) -> None:
    """Log the exception being handled, raised by ``callback`` registered with ``what``,
    where it will be seen (see the module docstring)."""
    log_visible(
        log, logging.ERROR,
        "%s callback %r raised: the loss notification it was given did not complete",
        what, callback, exc_info=True, extra=extra or None,
    )
