"""Where the verifier's workers write their effects: a fenced destination.

``open_destination(spec)``: a filesystem path is the library's own
:class:`~consensus_lease.fencing.SqliteFence`; a SQLAlchemy URL (``postgresql+psycopg://...``,
``sqlite:////abs/path.db``) is :class:`~consensus_lease.fencing_sql.SqlFence` with tables
``cl_verify_tokens`` / ``cl_verify_effects`` (runs share them; each run's job ids are
unique, so the checker reads only its own).

The lock-set workload (:mod:`consensus_lease.verify.lockset`) reads a value and writes it
back: :func:`read_value` / :func:`write_value` do it either with the fenced
read-modify-write (``read_fenced`` / ``write_fenced``) or as the write-only-fenced control
(the value read unfenced, as the payload of the resource's latest effect, and written back
with ``apply``); :func:`final_value` reads what a mode left, recording no token.
"""

from __future__ import annotations

import sqlite3
from typing import Literal, Protocol

from ..errors import BackendUnavailable, InvalidArgument
from ..fencing import Effect, FencedRead, FenceOutcome, SqliteFence

__all__ = ["LOCK_SET_MODES", "SQL_TABLE_PREFIX", "Destination", "LockSetMode", "final_value",
           "job_effects", "open_destination", "read_value", "write_value"]

LockSetMode = Literal["fenced", "write-only"]
LOCK_SET_MODES: tuple[LockSetMode, ...] = ("fenced", "write-only")
"""``fenced``: ``read_fenced`` / ``write_fenced``; ``write-only``: the control, an unfenced
read and a write fenced by ``apply`` (docs/model.md, the ``write-only-fenced`` mutation)."""

SQL_TABLE_PREFIX = "cl_verify_"


class Destination(Protocol):
    """A fenced destination as the verifier uses it."""

    def apply(
        self, resource: str, token: int, effect_id: str, payload: bytes = b""
    ) -> FenceOutcome:
        """Apply an effect iff ``token`` >= the highest accepted for ``resource``
        (unless the destination was opened unfenced).

        Raises:
            FenceRejected: a higher token was accepted; nothing applied.
            BackendUnavailable: nothing applied.
        """
        ...

    def highest_token(self, resource: str) -> int | None:
        """The highest token accepted for ``resource``, or ``None``."""
        ...

    def effects(self, resource: str | None = None) -> list[Effect]:
        """Accepted effects ordered by ``seq``."""
        ...

    def read_fenced(self, resource: str, token: int) -> FencedRead:
        """Record ``token`` as the highest and read the value, in one transaction.

        Raises:
            FenceRejected: a higher token was recorded; nothing recorded.
            BackendUnavailable: nothing recorded.
        """
        ...

    def write_fenced(self, read: FencedRead, value: bytes) -> FencedRead:
        """Write ``value`` back iff no higher token was recorded and nothing was written
        since ``read``.

        Raises:
            FenceRejected: nothing written. BackendUnavailable: nothing written.
        """
        ...

    def close(self) -> None: ...


class _SqlDestination:
    """A :class:`~consensus_lease.fencing_sql.SqlFence`, each effect in its own transaction."""

    def __init__(self, url: str, *, enforce_tokens: bool, create_tables: bool) -> None:
        from ..fencing_sql import SqlFence  # SQLAlchemy only when a URL is used

        self.fence = SqlFence(url, table_prefix=SQL_TABLE_PREFIX, enforce_tokens=enforce_tokens,
                              create_tables=create_tables)

    def apply(
        self, resource: str, token: int, effect_id: str, payload: bytes = b""
    ) -> FenceOutcome:
        return self.fence.apply_now(resource, token, effect_id, payload)

    def highest_token(self, resource: str) -> int | None:
        return self.fence.highest_token(resource)

    def effects(self, resource: str | None = None) -> list[Effect]:
        return self.fence.effects(resource)

    def read_fenced(self, resource: str, token: int) -> FencedRead:
        """``SqlFence.read_fenced`` in a transaction of its own."""
        with self.fence.engine.begin() as conn:
            return self.fence.read_fenced(conn, resource, token)

    def write_fenced(self, read: FencedRead, value: bytes) -> FencedRead:
        """``SqlFence.write_fenced`` in a transaction of its own."""
        with self.fence.engine.begin() as conn:
            return self.fence.write_fenced(conn, read, value)

    def latest_payload(self, resource: str) -> bytes | None:
        """The payload of ``resource``'s latest accepted effect (no token recorded)."""
        from sqlalchemy import exc, select

        e = self.fence.effects_table
        try:
            with self.fence.engine.connect() as conn:
                row = conn.execute(select(e.c.payload).where(e.c.resource == resource)
                                   .order_by(e.c.seq.desc()).limit(1)).first()
        except exc.DBAPIError as error:
            raise BackendUnavailable(f"reading the destination: {error}") from error
        return None if row is None else bytes(row[0])

    def value(self, resource: str) -> bytes | None:
        """``resource``'s value as ``write_fenced`` left it (no token recorded)."""
        from sqlalchemy import exc, select

        v = self.fence.values_table
        try:
            with self.fence.engine.connect() as conn:
                row = conn.execute(select(v.c.value).where(v.c.resource == resource)).first()
        except exc.DBAPIError as error:
            raise BackendUnavailable(f"reading the destination: {error}") from error
        return None if row is None else bytes(row[0])

    def close(self) -> None:
        self.fence.close()


def open_destination(spec: str, *, enforce_tokens: bool = True,
                     create_tables: bool = True) -> Destination:
    """Open the destination named by ``spec`` (a file path or a SQLAlchemy URL).

    Args:
        spec: ``/path/to/destination.db`` (SqliteFence) or a SQLAlchemy URL (SqlFence).
        enforce_tokens: ``False`` = unfenced (the control experiment).
        create_tables: SQL only: create the tables if missing (the verifier does it
            once before starting workers).

    Raises:
        BackendUnavailable: cannot be opened. InvalidArgument: bad URL.
    """
    if "://" in spec:
        return _SqlDestination(spec, enforce_tokens=enforce_tokens, create_tables=create_tables)
    return SqliteFence(spec, enforce_tokens=enforce_tokens)


def job_effects(destination: Destination, jobs: list[str]) -> list[Effect]:
    """The accepted effects of ``jobs`` only, ordered by ``seq``."""
    found = [e for job in jobs for e in destination.effects(job)]
    return sorted(found, key=lambda e: e.seq)


def _sqlite_one(fence: SqliteFence, sql: str, resource: str) -> bytes | None:
    """One BLOB from the fence's file, read on a connection of its own (no token recorded)."""
    try:
        db = sqlite3.connect(fence.path, timeout=5.0)
        try:
            row = db.execute(sql, (resource,)).fetchone()
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise BackendUnavailable(f"fence database {fence.path!r}: {exc}") from exc
    return None if row is None else bytes(row[0])


def read_value(destination: Destination, mode: LockSetMode, resource: str,
               token: int) -> tuple[bytes | None, FencedRead | None]:
    """Read ``resource``'s value for a read-modify-write with ``token``.

    Returns:
        ``(value, read)``: the bytes last written (``None``: never) and, in ``fenced``
        mode, the :class:`~consensus_lease.fencing.FencedRead` to hand to
        :func:`write_value` (``None`` in ``write-only`` mode, whose read records nothing).

    Raises:
        FenceRejected: ``fenced`` only: a higher token was recorded; nothing recorded.
        BackendUnavailable: the destination is unusable; nothing recorded.
        InvalidArgument: an unknown ``mode``.
    """
    if mode == "fenced":
        read = destination.read_fenced(resource, token)
        return read.value, read
    if mode != "write-only":
        raise InvalidArgument(f"mode must be one of {', '.join(LOCK_SET_MODES)}: {mode!r}")
    if isinstance(destination, _SqlDestination):
        return destination.latest_payload(resource), None
    if isinstance(destination, SqliteFence):
        return _sqlite_one(destination, "SELECT payload FROM fence_effects WHERE resource = ? "
                           "ORDER BY seq DESC LIMIT 1", resource), None
    raise InvalidArgument(f"no unfenced read on {type(destination).__name__}")


def write_value(destination: Destination, mode: LockSetMode, resource: str, token: int,
                read: FencedRead | None, item: str, value: bytes) -> None:
    """Write ``value`` (the set with ``item`` added) back to ``resource``: ``fenced``:
    ``write_fenced(read, value)``; ``write-only``: ``apply(resource, token, item, value)``,
    the token checked on the write alone.

    Raises:
        FenceRejected: a higher token was recorded (``fenced``: also a write since the
            read); nothing written.
        BackendUnavailable: nothing written (``SqlFence``: a commit's fate can be unknown).
        InvalidArgument: ``fenced`` without the ``read``, or an unknown ``mode``.
    """
    if mode == "fenced":
        if read is None:
            raise InvalidArgument("the fenced mode writes back what read_value returned")
        destination.write_fenced(read, value)
    elif mode == "write-only":
        destination.apply(resource, token, item, value)
    else:
        raise InvalidArgument(f"mode must be one of {', '.join(LOCK_SET_MODES)}: {mode!r}")


def final_value(destination: Destination, mode: LockSetMode, resource: str) -> bytes | None:
    """What ``mode`` left at ``resource``, recording no token: ``fenced``: the value
    ``write_fenced`` wrote last; ``write-only``: the latest accepted effect's payload.

    Raises:
        BackendUnavailable: the destination is unusable.
    """
    if mode == "write-only":
        return read_value(destination, mode, resource, 1)[0]
    if isinstance(destination, _SqlDestination):
        return destination.value(resource)
    if isinstance(destination, SqliteFence):
        return _sqlite_one(destination, "SELECT value FROM fence_values WHERE resource = ?",
                           resource)
    raise InvalidArgument(f"no unfenced read on {type(destination).__name__}")
