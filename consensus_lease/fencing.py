"""Destination-side fencing: the check a lease store cannot make for you.

The store rejects a stale holder's renew and complete, but it cannot stop a request the
stale holder already sent to some *other* system (a database, an API) before it noticed
it was paused. The destination must fence it::

    accept an effect on RESOURCE with TOKEN only if TOKEN >= the highest token it has
    accepted for RESOURCE, and record TOKEN in the same atomic step as the effect.

and should dedupe retries with an idempotency key ``(resource, token, effect_id)`` so a
write retried after a timeout is applied once. The token is the lease's ``generation``.

:class:`SqliteFence` implements both in one SQLite transaction per effect. Other
destinations implement :class:`Fence` the same way: compare-and-record inside the
destination's own transaction.
"""

from __future__ import annotations

import enum
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from .errors import BackendUnavailable, FenceRejected, InvalidArgument
from .observe import Observer, notify
from .validation import check_job_id

__all__ = ["Effect", "Fence", "FenceOutcome", "SqliteFence"]


class FenceOutcome(enum.Enum):
    ACCEPTED = "accepted"
    """Applied now."""
    DUPLICATE = "duplicate"
    """Already applied with this idempotency key; nothing changed."""


@dataclass(frozen=True, slots=True)
class Effect:
    """One accepted effect, in the order the destination accepted it.

    Attributes:
        seq: acceptance order (1, 2, ...), across all resources.
        resource: what the effect changed (usually the job id).
        token: the fencing token it carried.
        effect_id: the caller's name for the effect (idempotency key with resource, token).
        payload: bytes the caller attached.
    """

    seq: int
    resource: str
    token: int
    effect_id: str
    payload: bytes


class Fence(Protocol):
    """A destination that fences effects by token."""

    def apply(
        self, resource: str, token: int, effect_id: str, payload: bytes = b""
    ) -> FenceOutcome:
        """Apply an effect iff ``token`` >= the highest accepted for ``resource``.

        Raises:
            FenceRejected: a higher token was already accepted; nothing applied.
        """
        ...


class SqliteFence:
    """A fenced destination in a SQLite file (safe across processes).

    Args:
        path: database file (created if missing).
        enforce_tokens: ``False`` turns the token check off (the idempotency key still
            dedupes) — only to show what goes wrong without a fence.
        busy_timeout_s: seconds to wait for another writer.
        observer: told of each rejection (``stale_rejected(name, "fence", ...)``).
        name: label for the observer's ``store`` argument.

    Raises:
        BackendUnavailable: the file cannot be opened or stays locked.
    """

    def __init__(
        self,
        path: str,
        *,
        enforce_tokens: bool = True,
        busy_timeout_s: float = 5.0,
        observer: Observer | None = None,
        name: str = "sqlite-fence",
    ) -> None:
        self.path = path
        self.observer = observer
        self.name = name
        self.enforce_tokens = enforce_tokens
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(
                path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            if str(self._db.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                self._db.execute("PRAGMA journal_mode = WAL")
            present = {
                row[0] for row in self._db.execute("SELECT name FROM sqlite_master")
            }
            if {"fence_tokens", "fence_effects"} <= present:
                return
            with self._transaction() as db:
                db.execute(
                    "CREATE TABLE IF NOT EXISTS fence_tokens ("
                    "resource TEXT PRIMARY KEY, highest INTEGER NOT NULL)"
                )
                db.execute(
                    "CREATE TABLE IF NOT EXISTS fence_effects (seq INTEGER PRIMARY KEY "
                    "AUTOINCREMENT, resource TEXT NOT NULL, token INTEGER NOT NULL, "
                    "effect_id TEXT NOT NULL, payload BLOB NOT NULL, "
                    "UNIQUE (resource, token, effect_id))"
                )
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"fence database {path!r} unavailable: {exc}") from exc

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def apply(
        self, resource: str, token: int, effect_id: str, payload: bytes = b""
    ) -> FenceOutcome:
        """Apply an effect iff ``token`` >= the highest token accepted for ``resource``;
        record the token and the effect in the same transaction.

        Args:
            resource: what the effect changes (usually the job id); same rules as job ids.
            token: the lease's generation (int >= 1).
            effect_id: the caller's name for this effect (non-empty str).
            payload: bytes to store with the effect.

        Returns:
            ACCEPTED, or DUPLICATE if ``(resource, token, effect_id)`` was applied before.

        Raises:
            FenceRejected: a higher token was already accepted (``highest_seen`` set).
            InvalidArgument: bad arguments; nothing applied.
            BackendUnavailable: the file is locked or unusable; nothing applied.
        """
        check_job_id(resource)
        if isinstance(token, bool) or not isinstance(token, int) or token < 1:
            raise InvalidArgument(f"token must be an int >= 1, got {token!r}")
        if not isinstance(effect_id, str) or not effect_id:
            raise InvalidArgument("effect_id must be a non-empty str")
        if token >= 2**63:
            raise InvalidArgument(f"token {token} does not fit a signed 64-bit integer")
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"payload must be bytes, not {type(payload).__name__}")
        try:
            with self._transaction() as db:
                row = db.execute(
                    "SELECT highest FROM fence_tokens WHERE resource = ?", (resource,)
                ).fetchone()
                highest = None if row is None else int(row[0])
                if self.enforce_tokens and highest is not None and token < highest:
                    raise FenceRejected(
                        f"fence rejected {effect_id!r} on {resource!r}: token {token} < "
                        f"highest accepted {highest}",
                        job_id=resource,
                        generation=token,
                        highest_seen=highest,
                    )
                inserted = db.execute(
                    "INSERT INTO fence_effects (resource, token, effect_id, payload) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING seq",
                    (resource, token, effect_id, bytes(payload)),
                ).fetchone()
                db.execute(
                    "INSERT INTO fence_tokens VALUES (?, ?) ON CONFLICT (resource) DO UPDATE "
                    "SET highest = max(highest, excluded.highest)",
                    (resource, token),
                )
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"fence database {self.path!r}: {exc}") from exc
        except FenceRejected:
            notify(self.observer, lambda o: o.stale_rejected(self.name, "fence", resource, token))
            raise
        return FenceOutcome.ACCEPTED if inserted is not None else FenceOutcome.DUPLICATE

    def highest_token(self, resource: str) -> int | None:
        """The highest token accepted for ``resource``, or ``None``."""
        with self._lock:
            row = self._db.execute(
                "SELECT highest FROM fence_tokens WHERE resource = ?", (resource,)
            ).fetchone()
        return None if row is None else int(row[0])

    def effects(self, resource: str | None = None) -> list[Effect]:
        """Accepted effects in acceptance order, optionally for one resource."""
        sql = "SELECT seq, resource, token, effect_id, payload FROM fence_effects"
        params: tuple[str, ...] = ()
        if resource is not None:
            sql += " WHERE resource = ?"
            params = (resource,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY seq", params).fetchall()
        return [Effect(int(s), r, int(t), e, bytes(p)) for s, r, t, e, p in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
