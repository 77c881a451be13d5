"""Log lines for people and machines: ``key=value`` pairs after the message.

The worker and the core log with record attributes (``extra={"job_id": ..., ...}``);
:class:`KeyValueFormatter` prints them, so ``grep job_id=invoice-42`` finds a job's story
across worker processes. The library itself never configures logging; the command does,
with :func:`configure_logging`.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["KeyValueFormatter", "configure_logging", "parse_level"]

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName",
}


class KeyValueFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: message key=value ...`` (values with spaces are quoted)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        extras = [f"{k}={_value(v)}" for k, v in vars(record).items() if k not in _STANDARD]
        line = super().formatMessage(record)
        return f"{line} {' '.join(extras)}" if extras else line


def _value(value: object) -> str:
    text = str(value)
    return repr(text) if (not text or any(c.isspace() or c in "\"'=" for c in text)) else text


def parse_level(text: str) -> int:
    """``"info"``, ``"DEBUG"``, ``"20"`` -> a logging level from 1 to 50 (``CRITICAL``).

    A number is ASCII digits only (``int()`` also takes ``"٣"`` and ``"1_0"``); a name is
    one :mod:`logging` knows, except ``NOTSET``, which would hand the worker's level to
    its parent logger instead of setting one.

    Raises:
        ValueError: not a level name or number, or a number outside 1 to 50.
    """
    text = text.strip(" \t")  # as the integer flags take surrounding blanks
    if text.isascii() and text.isdigit() and len(text) <= 30:
        level = int(text)
        if not 1 <= level <= logging.CRITICAL:
            raise ValueError(f"a log level number must be from 1 to {logging.CRITICAL} "
                             f"(CRITICAL), not {text!r}")
        return level
    named = logging.getLevelName(text.upper()) if text.isascii() and len(text) <= 30 else None
    if not isinstance(named, int) or named < 1:
        shown = repr(text) if len(text) <= 40 else repr(text[:36]) + "..."
        raise ValueError(f"not a log level (debug, info, warning, error, critical, or a "
                         f"number from 1 to {logging.CRITICAL}): {shown}")
    return named


def configure_logging(level: int) -> None:
    """Worker lines at ``level`` (and the core's warnings) to stderr, as key=value.
    Other libraries' loggers stay at ERROR (gRPC and kazoo log every reconnect)."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler(sys.stderr))
    for handler in root.handlers:
        handler.setFormatter(KeyValueFormatter())
    root.setLevel(logging.ERROR)
    logging.getLogger("consensus_lease").setLevel(max(logging.WARNING, level))
    logging.getLogger("consensus_lease.worker").setLevel(level)
