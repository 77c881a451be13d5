"""Log records an operator must see even when the application configures no logging.

The package puts a ``NullHandler`` on the ``consensus_lease`` logger (the standard
library's advice for libraries: an application that configures no logging is not shown
the library's internals). That handler also hides :data:`logging.lastResort`, which
Python otherwise uses to show WARNING and above on stderr when no handler is found.

A few records are not internals but signals the operator must act on: a failed loss
notification (the application's own callback raised), a SQLite WAL that checkpoints
cannot shrink, an etcd lease ended before the TTL it was granted. :func:`log_visible`
logs such a record as usual and, when no handler other than a ``NullHandler`` would
receive it (logging left unconfigured), also hands it to :data:`logging.lastResort`
(stderr, WARNING and above): exactly where Python shows it for code without a library's
``NullHandler``. An application that configures logging gets it once, through its own
handlers only; one that disables the logger or filters the record out gets nothing.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["log_visible"]


def log_visible(logger: logging.Logger, level: int, msg: str, *args: object,
                exc_info: bool = False, extra: Mapping[str, Any] | None = None) -> None:
    """``logger.log(level, msg, *args, exc_info=..., extra=...)``, and the record on
    :data:`logging.lastResort` too when only ``NullHandler`` s would receive it (see the
    module docstring). ``exc_info=True``: the exception being handled, as
    :meth:`logging.Logger.exception`. Never raises for a logging reason (the handlers'
    own ``handleError`` applies)."""
    if logger.disabled or not logger.isEnabledFor(level):
        return
    fn, lno, func, sinfo = logger.findCaller(False, 2)  # the caller of log_visible
    record = logger.makeRecord(
        logger.name, level, fn, lno, msg, args, sys.exc_info() if exc_info else None,
        func, extra, sinfo)
    if not logger.filter(record):
        return
    logger.handle(record)
    resort = logging.lastResort
    if resort is not None and level >= resort.level and not _handled(logger, level):
        resort.handle(record)


def _handled(logger: logging.Logger, level: int) -> bool:
    """Whether a record of ``level`` reaches a handler other than a ``NullHandler``."""
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if not isinstance(handler, logging.NullHandler) and level >= handler.level:
                return True
        if not current.propagate:
            return False
        current = current.parent
    return False
