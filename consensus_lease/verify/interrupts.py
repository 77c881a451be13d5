"""SIGTERM and SIGINT during a run: an exception at a safe point, then a full clean-up.

The verifier starts worker processes in their own sessions (a Ctrl-C on the verifier does
not reach them) and SIGSTOPs them on purpose, so a verifier that simply died would leave
them behind, one of them stopped. :func:`interruptible` (used by
:func:`~consensus_lease.verify.runner.run_verify` in the main thread) turns SIGTERM, like
SIGINT, into :class:`Interrupted` — a ``KeyboardInterrupt`` — so the run's ``finally``
clauses heal every fault (thaw stopped workers, remove iptables rules) and stop every
worker it started. Code that must not be cut in half (starting a worker and recording it;
the clean-up itself) runs inside :func:`deferred`: a signal arriving there is raised when
the block ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["SIGNALS", "Interrupted", "deferred", "interruptible"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals :func:`interruptible` handles."""

_deferring = 0
_pending: int | None = None


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal.

    Attributes:
        signum: the signal's number (``signal.SIGTERM``, ``signal.SIGINT``).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """``128 + signum``, the shell's convention (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    global _pending
    if _deferring:
        if _pending is None:
            _pending = signum
        return
    raise Interrupted(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def interruptible() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise :class:`Interrupted` in the main thread
    (deferred inside :func:`deferred`); the previous handlers are restored on exit.
    Does nothing outside the main thread (Python runs signal handlers only there)."""
    if not _in_main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    for signum in SIGNALS:
        signal.signal(signum, _on_signal)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def deferred() -> Iterator[None]:
    """A block a signal must not cut in half: one arriving inside is raised (as
    :class:`Interrupted`) when the outermost such block ends. Nests; a no-op outside
    the main thread (signals do not interrupt other threads).

    Raises:
        Interrupted: a signal arrived inside the block.
    """
    global _deferring, _pending
    if not _in_main_thread():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _pending is not None:
            signum, _pending = _pending, None
            raise Interrupted(signum)
