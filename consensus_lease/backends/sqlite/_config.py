"""The SQLite driver's URL and options, parsed and checked before the file is opened
(the option table with defaults and meanings is in the package docstring,
:mod:`consensus_lease.backends.sqlite`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import InvalidArgument
from ...options import Option, OptionTable
from ._transport_wal import DEFAULT_LIMIT_BYTES

__all__ = ["OPTIONS", "parse_url"]

OPTIONS = OptionTable(
    "SQLite",
    [
        Option("busy_timeout_s", "seconds", 5.0,
               "how long a statement waits for another process's write lock"),
        Option("poll_interval_s", "seconds", 0.05,
               "interval between re-checks while claim(..., wait_s=) waits"),
        Option("watch_interval_s", "seconds", 0.005,
               "longest interval between two checks for another process's change "
               "while claims wait"),
        Option("create", "bool", True,
               "create the file and the store's tables if missing (false: refuse)"),
        Option("wal_limit_bytes", "int", DEFAULT_LIMIT_BYTES,
               "bound of the -wal file in bytes: checkpoints above it, a warning if blocked",
               minimum=1024 * 1024, maximum=2**62),
        Option("wal_interval_s", "seconds", 1.0,
               "interval between two checks of the WAL's size", minimum=0.01),
    ],
)
"""The options of ``sqlite://`` URLs (the table in the package docstring)."""


def parse_url(url: str, options: Mapping[str, object]) -> tuple[str, dict[str, Any]]:
    """The file's path in ``url`` and the driver's keyword arguments from ``options``.

    Raises:
        InvalidArgument: not ``sqlite:///relative.db`` or ``sqlite:////absolute.db``, a
            NUL in the path, or a bad option (:mod:`consensus_lease.options`).
    """
    rest = url.split("://", 1)[1].split("?", 1)[0]
    if not rest.startswith("/") or rest == "/":
        raise InvalidArgument(
            f"SQLite URL must be sqlite:///relative.db or sqlite:////absolute.db, got {url!r}"
        )
    path = rest[1:]
    if "\x00" in path:  # sqlite3 would raise a bare ValueError (no file name holds one)
        raise InvalidArgument(
            f"SQLite URL's path contains a NUL character: {path!r}; the path is used "
            "as written (no percent-decoding: %00 is three characters of a file name)"
        )
    parsed = OPTIONS.parse(options)
    return path, {
        "busy_timeout_s": parsed.seconds("busy_timeout_s"),
        "poll_interval_s": parsed.seconds("poll_interval_s"),
        "watch_interval_s": parsed.seconds("watch_interval_s"),
        "create": parsed.flag("create"),
        "wal_limit_bytes": parsed.integer("wal_limit_bytes"),
        "wal_interval_s": parsed.seconds("wal_interval_s"),
    }
