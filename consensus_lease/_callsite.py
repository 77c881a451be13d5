"""Whether a call's result goes straight into a ``with`` statement.

``session.claim(job_id)`` without ``wait_s`` returns ``None`` when the job is held, and
``with None:`` fails with a ``TypeError`` that says nothing about claims. A ``None`` is
still the right answer for ``lease = session.claim(job_id)`` (tested with ``is None``),
so the claim asks instead how its result will be used: on CPython, the caller's next
instruction after the call tells (``BEFORE_WITH`` from 3.11, ``SETUP_WITH`` before).
Elsewhere, or when the bytecode does not say, the answer is "no" and ``None`` is
returned as always: this only ever turns a ``TypeError`` into a clearer error.
"""

from __future__ import annotations

import dis
import functools
import sys
from types import CodeType, FrameType

__all__ = ["caller_enters_with", "entered_by_with"]

_WITH_OPS = frozenset({"BEFORE_WITH", "SETUP_WITH"})


@functools.lru_cache(maxsize=256)
def _with_follows(code: CodeType, lasti: int) -> bool:
    """Whether the first instruction after offset ``lasti`` in ``code`` enters a with
    (``f_lasti`` may point into the call's inline cache entries: they are skipped)."""
    for instruction in dis.get_instructions(code):
        if instruction.offset > lasti:
            return instruction.opname in _WITH_OPS
    return False


def entered_by_with(frame: FrameType | None) -> bool:
    """Whether ``frame`` (a caller, stopped at its call) passes the call's result to a
    ``with`` statement. ``False`` when it cannot tell."""
    if frame is None or sys.implementation.name != "cpython":
        return False
    return _with_follows(frame.f_code, frame.f_lasti)


def caller_enters_with(callee: FrameType | None) -> bool:
    """Whether the caller of the function running in ``callee`` (that function's own
    frame: ``inspect.currentframe()``) passes its result to a ``with`` statement.
    ``False`` when it cannot tell (``None``: a Python without frames)."""
    return entered_by_with(None if callee is None else callee.f_back)
