"""Destination-side fencing: the check a lease store cannot make for you.

The store rejects a stale holder's renew and complete, but it cannot stop a request the
stale holder already sent to some *other* system (a database, an API) before it noticed
it was paused. The destination must fence it::

    accept an effect on RESOURCE with TOKEN only if TOKEN >= the highest token it has
    accepted for RESOURCE, and record TOKEN in the same atomic step as the effect.

and should dedupe retries with an idempotency key ``(resource, token, effect_id)`` so a
write retried after a timeout is applied once. The token is the lease's ``generation``.

Once per job
------------

That key contains the token, so it dedupes one holder's retries but not a *takeover*:
the next holder of the job has a new token, and its ``(job, step)`` is a new key — it
redoes the steps the lost holder already did (a second charge). ``apply(...,
once_per_job=True)`` keys the effect by ``(resource, effect_id)`` across all tokens
instead, and still rejects stale tokens. The race it closes, step by step::

    A: claims the job, token 7
    A: apply(job, 7, "step-1", once_per_job=True)  -> ACCEPTED
    A: apply(job, 7, "step-2", once_per_job=True)  -> ACCEPTED
    A: paused (GC, VM migration); its lease expires
    B: claims the job, token 8; starts from the first step
    B: apply(job, 8, "step-1", once_per_job=True)  -> ALREADY_APPLIED (and highest := 8)
    B: apply(job, 8, "step-2", once_per_job=True)  -> ALREADY_APPLIED
    B: apply(job, 8, "step-3", once_per_job=True)  -> ACCEPTED
    A: resumes; its late apply(job, 7, "step-3", once_per_job=True)
                                                  -> FenceRejected (7 < 8), nothing applied

Each step is applied exactly once, whoever held the job when. Without ``once_per_job``
B's step-1 and step-2 would be ACCEPTED a second time.

A once-per-job repeat *records its token* (raises the resource's highest token to it)
exactly as an accepted effect does: the new holder has acted on the resource, so the old
holder is fenced out from that moment even if the new one only found work already done.
(Otherwise A could slip step-3 in with token 7 after B's two ALREADY_APPLIED answers.)
The token check comes first: a stale token is rejected even when the effect was applied —
``FenceRejected`` tells the caller it no longer holds the job, not whether the effect
exists. A worker that takes a job over can read :meth:`SqliteFence.applied` to see where
the last holder stopped, but need not: ``apply(..., once_per_job=True)`` on every step
skips the done ones atomically.

Mixing the two modes for one ``effect_id`` is allowed but rarely meant: a once-per-job
apply finds an effect applied in either mode; a default apply looks only for its own
``(resource, token, effect_id)``.

:class:`SqliteFence` implements all of this in one SQLite transaction per effect. Other
destinations implement :class:`Fence` the same way: compare-and-record inside the
destination's own transaction (:class:`consensus_lease.fencing_sql.SqlFence` does it in
any SQL database).

Read-modify-write: fence the read too
-------------------------------------

Fencing only the write is not enough when the effect is a read-modify-write (read a
set, add an item, write the set back): an old holder's write can land *after* the new
holder's read, and the new holder's write-back then drops it — an acknowledged update
lost, with every token check passing (the model checker's ``write-only-fenced``
mutation, docs/model.md)::

    A: token 7: reads {}           ; paused, its lease expires
    B: token 8: reads {}           (A's write not there yet)
    A: writes {a} with token 7     -> accepted: 7 >= 7, the highest seen so far
    B: writes {b} with token 8     -> accepted; {a} is lost

:meth:`SqliteFence.read_fenced` records the token *with the read* (a read with a token
below the highest is refused), and :meth:`SqliteFence.write_fenced` writes back only if
no higher token was recorded since and the value is still the version read. B's read
then records 8 and A's late write is ``FenceRejected``::

    read = fence.read_fenced("set-1", lease.generation)        # FencedRead
    items = set(json.loads(read.value or b"[]")) | {"a"}
    fence.write_fenced(read, json.dumps(sorted(items)).encode())  # or FenceRejected

After a restore of the lease store
----------------------------------

A lease store restored from an older backup, or wiped, hands out tokens that went back:
the fence then rejects the honest new holder (its token is below one accepted before).
``consensus-lease bump-epoch --above HIGHEST`` fixes that (README: "Restoring a store").
When a rejected token looks like that case, the ``FenceRejected`` message says so and
names the command with the resource's highest token: when the token's epoch part is
below the highest token's (``token >> 32``: the fence assumes the 32-bit split of
SQLite, PostgreSQL, memory and ZooKeeper tokens) or the token is more than ``2**31`` below the
highest (which also covers etcd's 44-bit split). A stale holder from before a bump
gets the same hint: it is a hint, not a diagnosis.
"""

from __future__ import annotations

import enum
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from .errors import BackendUnavailable, FenceRejected, InvalidArgument
from .observe import Observer, notify
from .validation import check_job_id

__all__ = ["MAX_EFFECT_ID_CHARS", "Effect", "Fence", "FenceOutcome", "FencedRead", "SqliteFence"]

HINT_EPOCH_SHIFT = 32
"""The bit split the restore hint assumes (``token >> 32`` is the store epoch)."""
FAR_BELOW = 2**31
"""A token more than this below the highest gets the restore hint whatever the split."""


class FenceOutcome(enum.Enum):
    ACCEPTED = "accepted"
    """Applied now."""
    DUPLICATE = "duplicate"
    """Already applied with this ``(resource, token, effect_id)``; nothing changed."""
    ALREADY_APPLIED = "already_applied"
    """``once_per_job``: this ``(resource, effect_id)`` was applied before, with any
    token (this holder's or an earlier one's); it is not applied again, and the token is
    recorded as the highest."""


@dataclass(frozen=True, slots=True)
class Effect:
    """One accepted effect, in the order the destination accepted it.

    Attributes:
        seq: acceptance order (1, 2, ...), across all resources.
        resource: what the effect changed (usually the job id).
        token: the fencing token it carried.
        effect_id: the caller's name for the effect (idempotency key with resource and
            token, or with resource alone for ``once_per_job`` effects).
        payload: bytes the caller attached.
    """

    seq: int
    resource: str
    token: int
    effect_id: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class FencedRead:
    """A value read with a token (:meth:`SqliteFence.read_fenced`,
    :meth:`consensus_lease.fencing_sql.SqlFence.read_fenced`): hand it back to
    ``write_fenced`` to write the new value.

    Attributes:
        resource: what was read (usually the job id).
        token: the token recorded with the read (the lease's generation).
        value: the bytes last written, or ``None`` if never written.
        version: how many times the value was written (0: never).
    """

    resource: str
    token: int
    value: bytes | None
    version: int

    def __post_init__(self) -> None:
        """One built by hand is held to what ``read_fenced`` checks: a job id, a token
        1 .. 2**63 - 1, a version >= 0 (``InvalidArgument`` otherwise)."""
        check_job_id(self.resource)
        check_token(self.token)
        if isinstance(self.version, bool) or not isinstance(self.version, int) \
                or not 0 <= self.version < 2**63:
            raise InvalidArgument(f"version must be an int >= 0, got {self.version!r}")
        if self.value is not None and not isinstance(self.value, bytes):
            raise InvalidArgument(f"value must be bytes or None, not {type(self.value).__name__}")


class Fence(Protocol):
    """A destination that fences effects by token."""

    def apply(
        self,
        resource: str,
        token: int,
        effect_id: str,
        payload: bytes = b"",
        *,
        once_per_job: bool = False,
    ) -> FenceOutcome:
        """Apply an effect iff ``token`` >= the highest accepted for ``resource``,
        recording the token in the same atomic step.

        Args:
            once_per_job: ``False``: a repeat of ``(resource, token, effect_id)`` is
                DUPLICATE. ``True``: a repeat of ``(resource, effect_id)`` with *any*
                token is ALREADY_APPLIED (nothing applied, the token still recorded).

        Raises:
            FenceRejected: a higher token was already accepted; nothing applied. The
                token is checked first: a repeat of an applied effect with a stale token
                is rejected too (it tells the caller it lost the job, not whether the
                effect exists).
            InvalidArgument: bad arguments; nothing applied.
        """
        ...

    def applied(self, resource: str) -> dict[str, Effect]:
        """``effect_id`` -> the first accepted :class:`Effect` of that id on
        ``resource``, in acceptance order: where a new holder of the job resumes."""
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
        notify(observer, lambda o: o.attached(name, "fence"))
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
            if {"fence_tokens", "fence_effects", "fence_values"} <= present:
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
                db.execute(
                    "CREATE TABLE IF NOT EXISTS fence_values (resource TEXT PRIMARY KEY, "
                    "value BLOB NOT NULL, version INTEGER NOT NULL, token INTEGER NOT NULL)"
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
        self,
        resource: str,
        token: int,
        effect_id: str,
        payload: bytes = b"",
        *,
        once_per_job: bool = False,
    ) -> FenceOutcome:
        """Apply an effect iff ``token`` >= the highest token accepted for ``resource``;
        record the token and the effect in the same transaction.

        The token check comes first in both modes: a stale token is rejected even for
        an effect that was applied before.

        Args:
            resource: what the effect changes (usually the job id); same rules as job ids.
            token: the lease's generation (int >= 1).
            effect_id: the caller's name for this effect: a non-empty str of at most
                :data:`MAX_EFFECT_ID_CHARS` (256) characters, no NUL (as ``SqlFence``).
            payload: bytes to store with the effect.
            once_per_job: ``True``: apply at most once per ``(resource, effect_id)``
                across all tokens, so the next holder of a job skips the steps a lost
                holder did (see the module docstring). A repeat still records ``token``
                as the highest, fencing out older holders.

        Returns:
            ACCEPTED; DUPLICATE if ``(resource, token, effect_id)`` was applied before
            (default mode); ALREADY_APPLIED if ``(resource, effect_id)`` was applied
            before with any token (``once_per_job``).

        Raises:
            FenceRejected: a higher token was already accepted (``highest_seen`` set);
                nothing applied or recorded.
            InvalidArgument: bad arguments (``once_per_job`` not a bool, an ``effect_id``
                past :data:`MAX_EFFECT_ID_CHARS`, ...); nothing applied.
            BackendUnavailable: the file is locked or unusable; nothing applied.
        """
        check_once_per_job(once_per_job)
        check_job_id(resource)
        if isinstance(token, bool) or not isinstance(token, int) or token < 1:
            raise InvalidArgument(f"token must be an int >= 1, got {token!r}")
        check_effect_id(effect_id)
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
                        rejection_message(resource, token, effect_id, highest),
                        job_id=resource,
                        generation=token,
                        highest_seen=highest,
                    )
                done_before = once_per_job and db.execute(
                    "SELECT 1 FROM fence_effects WHERE resource = ? AND effect_id = ? LIMIT 1",
                    (resource, effect_id),
                ).fetchone() is not None
                if done_before:
                    outcome = FenceOutcome.ALREADY_APPLIED
                else:
                    inserted = db.execute(
                        "INSERT INTO fence_effects (resource, token, effect_id, payload) "
                        "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING seq",
                        (resource, token, effect_id, bytes(payload)),
                    ).fetchone()
                    outcome = (FenceOutcome.ACCEPTED if inserted is not None
                               else FenceOutcome.DUPLICATE)
                # Recorded on ALREADY_APPLIED too: the new holder fences the old one out.
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
        return outcome

    def read_fenced(self, resource: str, token: int) -> FencedRead:
        """Read ``resource``'s value and record ``token`` as its highest, in one
        transaction: from now on a write or effect with a lower token is rejected, so a
        stale holder's write cannot land between this read and its write-back
        (the module docstring: read-modify-write).

        Args:
            resource: what to read (usually the job id); same rules as job ids.
            token: the lease's generation (int >= 1).

        Returns:
            The value (``None`` if never written), its version and the token.

        Raises:
            FenceRejected: a higher token was already recorded (``highest_seen`` set);
                nothing read or recorded. The caller no longer holds the job.
            InvalidArgument: bad arguments; nothing read.
            BackendUnavailable: the file is locked or unusable; nothing recorded.
        """
        check_job_id(resource)
        check_token(token)
        with self._fenced(resource, token, "read") as db:
            row = db.execute("SELECT value, version FROM fence_values WHERE resource = ?",
                             (resource,)).fetchone()
        value, version = (None, 0) if row is None else (bytes(row[0]), int(row[1]))
        return FencedRead(resource, token, value, version)

    def write_fenced(self, read: FencedRead, value: bytes) -> FencedRead:
        """Write ``value`` back to ``read.resource`` iff no higher token than
        ``read.token`` was recorded since the read and the value is still at
        ``read.version``; record both in one transaction.

        Args:
            read: what :meth:`read_fenced` returned.
            value: the new value (bytes).

        Returns:
            The state after the write (``version`` + 1), to write again from.

        Raises:
            FenceRejected: a higher token was recorded since (a newer holder read or
                wrote), or the value was written since the read (another writer with
                the same token); nothing written. Read again, or stop: the job may
                have moved on.
            InvalidArgument: ``read`` not a FencedRead or ``value`` not bytes.
            BackendUnavailable: the file is locked or unusable; nothing written.
        """
        if not isinstance(read, FencedRead):
            raise InvalidArgument(f"read must be a FencedRead, not {type(read).__name__}")
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"value must be bytes, not {type(value).__name__}")
        with self._fenced(read.resource, read.token, "write") as db:
            row = db.execute("SELECT version FROM fence_values WHERE resource = ?",
                             (read.resource,)).fetchone()
            version = 0 if row is None else int(row[0])
            if version != read.version:
                raise FenceRejected(
                    f"fenced write on {read.resource!r} refused: written since the read "
                    f"(version {version}, read {read.version})",
                    job_id=read.resource, generation=read.token, highest_seen=read.token)
            db.execute(
                "INSERT INTO fence_values VALUES (?, ?, ?, ?) ON CONFLICT (resource) DO "
                "UPDATE SET value = excluded.value, version = excluded.version, "
                "token = excluded.token", (read.resource, bytes(value), version + 1,
                                           read.token))
        return FencedRead(read.resource, read.token, bytes(value), version + 1)

    @contextmanager
    def _fenced(self, resource: str, token: int, what: str) -> Iterator[sqlite3.Connection]:
        """A transaction in which ``token`` passed the check and is recorded as the
        highest (FenceRejected, nothing recorded, when below it)."""
        try:
            with self._transaction() as db:
                row = db.execute("SELECT highest FROM fence_tokens WHERE resource = ?",
                                 (resource,)).fetchone()
                highest = None if row is None else int(row[0])
                if self.enforce_tokens and highest is not None and token < highest:
                    raise FenceRejected(
                        rejection_message(resource, token, f"fenced {what}", highest),
                        job_id=resource, generation=token, highest_seen=highest)
                db.execute(
                    "INSERT INTO fence_tokens VALUES (?, ?) ON CONFLICT (resource) DO "
                    "UPDATE SET highest = max(highest, excluded.highest)", (resource, token))
                yield db
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"fence database {self.path!r}: {exc}") from exc
        except FenceRejected:
            notify(self.observer, lambda o: o.stale_rejected(self.name, "fence", resource, token))
            raise

    def highest_token(self, resource: str) -> int | None:
        """The highest token accepted for ``resource``, or ``None``.

        Raises:
            InvalidArgument: bad ``resource``.
            BackendUnavailable: the file is unusable (or the fence closed).
        """
        check_job_id(resource)
        try:
            with self._lock:
                row = self._db.execute(
                    "SELECT highest FROM fence_tokens WHERE resource = ?", (resource,)
                ).fetchone()
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"fence database {self.path!r}: {exc}") from exc
        return None if row is None else int(row[0])

    def applied(self, resource: str) -> dict[str, Effect]:
        """What was applied to ``resource``: ``effect_id`` -> the first accepted
        :class:`Effect` with that id, in acceptance order (iterate it to see where the
        last holder stopped; ``step in applied`` to test one step).

        Raises:
            InvalidArgument: bad ``resource``.
            BackendUnavailable: the file is unusable.
        """
        check_job_id(resource)
        try:
            return first_by_effect_id(self.effects(resource))
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"fence database {self.path!r}: {exc}") from exc

    def effects(self, resource: str | None = None) -> list[Effect]:
        """Accepted effects in acceptance order, optionally for one resource.

        Raises:
            InvalidArgument: bad ``resource``.
            BackendUnavailable: the file is unusable (or the fence closed).
        """
        sql = "SELECT seq, resource, token, effect_id, payload FROM fence_effects"
        params: tuple[str, ...] = ()
        if resource is not None:
            check_job_id(resource)
            sql += " WHERE resource = ?"
            params = (resource,)
        try:
            with self._lock:
                rows = self._db.execute(sql + " ORDER BY seq", params).fetchall()
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"fence database {self.path!r}: {exc}") from exc
        return [Effect(int(s), r, int(t), e, bytes(p)) for s, r, t, e, p in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


MAX_EFFECT_ID_CHARS = 256
"""Longest ``effect_id`` (characters) every fence accepts: :class:`SqliteFence` and
:class:`~consensus_lease.fencing_sql.SqlFence` alike (its column is
``VARCHAR(256)``), so an id one fence takes the other takes too."""
MAX_EFFECT_ID_BYTES = 4 * MAX_EFFECT_ID_CHARS
"""Longest ``effect_id`` in UTF-8 bytes: implied by :data:`MAX_EFFECT_ID_CHARS` (at most
4 bytes a character)."""


def check_effect_id(effect_id: object) -> str:
    """``effect_id`` if it is a non-empty str of valid Unicode, without NUL, of at most
    :data:`MAX_EFFECT_ID_CHARS` characters (shared by the fences).

    Raises:
        InvalidArgument: otherwise (the message gives the limit).
    """
    if not isinstance(effect_id, str) or not effect_id:
        raise InvalidArgument("effect_id must be a non-empty str")
    try:
        effect_id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("effect_id is not valid Unicode (lone surrogate)") from None
    if "\0" in effect_id:
        raise InvalidArgument("effect_id must have no NUL")
    if len(effect_id) > MAX_EFFECT_ID_CHARS:
        raise InvalidArgument(
            f"effect_id must be at most {MAX_EFFECT_ID_CHARS} characters, not "
            f"{len(effect_id)}")
    return effect_id


def check_token(token: object) -> int:
    """``token`` if it is an int in 1 .. 2**63 - 1 (shared by the fences)."""
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise InvalidArgument(f"token must be an int >= 1, got {token!r}")
    if token >= 2**63:
        raise InvalidArgument(f"token {token} does not fit a signed 64-bit integer")
    return token


def rejection_message(resource: str, token: int, effect_id: str, highest: int) -> str:
    """The ``FenceRejected`` message for ``token`` < ``highest`` (shared by the fences):
    with a hint to run ``bump-epoch`` when the token is from an earlier store epoch or far
    below (see the module docstring)."""
    message = (f"fence rejected {effect_id!r} on {resource!r}: token {token} < highest "
               f"accepted {highest}")
    earlier_epoch = token >> HINT_EPOCH_SHIFT < highest >> HINT_EPOCH_SHIFT
    if earlier_epoch or highest - token > FAR_BELOW:
        message += (
            f". The token is {'from an earlier store epoch' if earlier_epoch else 'far below'}"
            ": if it is the current holder's, the lease store may have been restored from "
            "a backup or wiped; stop the workers and run `consensus-lease bump-epoch "
            f"--backend URL --above {highest}` (README: Restoring a store)"
        )
    return message


def check_once_per_job(once_per_job: object) -> None:
    """Raise InvalidArgument unless ``once_per_job`` is a bool (shared by the fences)."""
    if not isinstance(once_per_job, bool):
        raise InvalidArgument(
            f"once_per_job must be a bool, not {type(once_per_job).__name__}"
        )


def first_by_effect_id(effects: Iterable[Effect]) -> dict[str, Effect]:
    """``effect_id`` -> its first effect, keeping the order of ``effects`` (shared by
    the fences' ``applied``)."""
    found: dict[str, Effect] = {}
    for effect in effects:
        found.setdefault(effect.effect_id, effect)
    return found
