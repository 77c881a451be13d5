"""Destination-side fencing in a real SQL database (PostgreSQL, SQLite, ...) via SQLAlchemy.

The rule is the one :mod:`consensus_lease.fencing` explains: accept an effect on RESOURCE
with TOKEN only if TOKEN >= the highest token accepted for RESOURCE, record TOKEN in the
same transaction as the effect, and make a repeat of ``(resource, token, effect_id)`` a
no-op. :class:`SqlFence` does it inside *your* transaction, so your own writes commit
with the token check or not at all::

    fence = SqlFence(engine)                     # creates its two tables if missing
    with engine.begin() as conn:                 # one transaction
        fence.apply("invoice-42", lease.generation, "charge", b"$10", conn=conn)
        conn.execute(text("UPDATE accounts SET ..."))   # commits only if the token passed
    # FenceRejected propagates out of the block: the transaction, your UPDATE included,
    # is rolled back.

or, when there is nothing else to write, ``fence.apply_now(resource, token, effect_id)``
(its own transaction, retried on serialization failures and deadlocks).

The arguments are :class:`~consensus_lease.SqliteFence`'s, in its order, plus ``conn=``
(the order ``apply(conn, resource, ...)`` of earlier versions still works, with a
``DeprecationWarning``).

Once per job: ``apply(resource, token, effect_id, once_per_job=True, conn=conn)`` applies an
effect at most once per ``(resource, effect_id)`` across all tokens, so the next holder
of a job skips the steps a lost holder already did (ALREADY_APPLIED) instead of doing
them again, while a stale token is still rejected; the takeover race it closes is told
step by step in :mod:`consensus_lease.fencing`. ``applied(resource)`` shows what was done.

Why it is correct under concurrency, step by step (two appliers of one resource)::

    A: INSERT token row ... ON CONFLICT (resource) DO UPDATE SET highest = :token
       WHERE highest <= :token                          -> A holds the row lock
    B: the same statement for the same resource           -> blocks on A's row lock
    A: insert the effect row; COMMIT                      -> lock released
    B: re-evaluated on A's committed row: a lower token fails the WHERE -> no row
       returned -> FenceRejected; a higher one updates -> B goes on holding the lock

The *first* insert race (no token row yet): PostgreSQL's ``ON CONFLICT`` makes the second
inserter wait for the first one's transaction and then take the conflict path against
the committed row (https://www.postgresql.org/docs/current/sql-insert.html#SQL-ON-CONFLICT);
SQLite serialises writers on the database lock, and the upsert is the first statement
of the fence's work, so the lock is held from the check to the commit. For dialects
without ``ON CONFLICT`` the ``"lock"`` strategy inserts the row inside a SAVEPOINT
(ignoring the unique-key error of a concurrent first insert), then ``SELECT ... FOR
UPDATE``, compares, updates.

Once per job, under the same lock: the "applied before?" query on ``(resource,
effect_id)`` runs after the token statement, so it waits for any concurrent applier of
the resource and then (READ COMMITTED: a fresh snapshot per statement) sees the effect
row it committed; the second of two racers gets ALREADY_APPLIED. The token statement
always writes the row in this mode (even for an equal token), so under REPEATABLE READ
or SERIALIZABLE a racer whose snapshot predates the other's commit is aborted
(:class:`FenceRetryable`) rather than answered from a stale snapshot. On SQLite the
database write lock serialises the same way.

Effects of one resource are totally ordered by ``seq`` (every applier of a resource holds
its row lock while it takes a sequence number); across resources ``seq`` order is not
commit order.

Isolation: READ COMMITTED (PostgreSQL's default) is enough. Under REPEATABLE READ or
SERIALIZABLE the database may abort a racing transaction; :class:`FenceRetryable` then
says "roll back and run the whole transaction again" (``apply_now`` does so itself).

SQLite: an engine made from a URL by :class:`SqlFence` opens every transaction with
``BEGIN IMMEDIATE`` (WAL mode, busy timeout), so a transaction that reads before it
calls ``apply`` cannot fail on a stale snapshot. Pass your own engine and you keep its
behaviour: ``apply`` is still atomic (its first statement is a write), but SQLite may
answer ``database is locked`` for a transaction that read first (``FenceRetryable``).
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    case,
    create_engine,
    event,
    exc,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url

from .errors import BackendUnavailable, FenceRejected, InvalidArgument
from .fencing import (
    MAX_EFFECT_ID_CHARS,
    Effect,
    FencedRead,
    FenceOutcome,
    check_effect_id,
    check_once_per_job,
    check_token,
    first_by_effect_id,
    rejection_message,
)
from .options import redact_url
from .validation import check_job_id

__all__ = ["FenceRetryable", "SqlFence", "Strategy"]

T = TypeVar("T")

Strategy = Literal["auto", "upsert", "lock"]
"""``upsert``: one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` (PostgreSQL, SQLite).
``lock``: insert-if-missing in a SAVEPOINT, then ``SELECT ... FOR UPDATE`` (any dialect
with row locks or a database lock). ``auto``: ``upsert`` where supported, else ``lock``."""

_UPSERT_DIALECTS = frozenset({"postgresql", "sqlite"})
_RETRYABLE_SQLSTATES = {"40001", "40P01", "55P03"}  # serialization, deadlock, lock timeout


class FenceRetryable(BackendUnavailable):
    """The database aborted the transaction (serialization failure, deadlock, lock
    timeout, SQLite busy). Nothing was applied: roll the transaction back and run it
    again from the start."""


class SqlFence:
    """A fenced destination in a SQL database reached through SQLAlchemy.

    Args:
        engine: an :class:`sqlalchemy.Engine`, or a URL to build one from (e.g.
            ``postgresql+psycopg://user:pw@127.0.0.1:5432/db``, ``sqlite:////abs/f.db``).
            An engine built here is disposed by :meth:`close`.
        table_prefix: the tables are ``<prefix>tokens``, ``<prefix>effects`` and
            ``<prefix>values`` (:meth:`read_fenced` / :meth:`write_fenced`).
        enforce_tokens: ``False`` turns the token check off (idempotency keys still
            dedupe) — only to show what goes wrong without a fence.
        create_tables: create the tables if missing (safe to race from several
            processes: a concurrent creation is retried once).
        strategy: see :data:`Strategy`.
        max_attempts: attempts of :meth:`apply_now` on :class:`FenceRetryable`.
        busy_timeout_s: SQLite only, engines built from a URL: how long a transaction
            waits for another writer (seconds).

    Raises:
        InvalidArgument: bad arguments, or ``upsert`` on a dialect without it.
        BackendUnavailable: the database cannot be reached or the tables created.
    """

    def __init__(
        self,
        engine: Engine | str,
        *,
        table_prefix: str = "cl_fence_",
        enforce_tokens: bool = True,
        create_tables: bool = True,
        strategy: Strategy = "auto",
        max_attempts: int = 5,
        busy_timeout_s: float = 10.0,
    ) -> None:
        if max_attempts < 1:
            raise InvalidArgument(f"max_attempts must be >= 1, got {max_attempts}")
        self._owns_engine = isinstance(engine, str)
        self.engine: Engine = (
            _make_engine(engine, busy_timeout_s) if isinstance(engine, str) else engine
        )
        dialect = self.engine.dialect.name
        if strategy == "auto":
            strategy = "upsert" if dialect in _UPSERT_DIALECTS else "lock"
        if strategy == "upsert" and dialect not in _UPSERT_DIALECTS:
            raise InvalidArgument(
                f"strategy 'upsert' needs ON CONFLICT (postgresql, sqlite); {dialect!r} "
                "has no such statement: use strategy='lock'"
            )
        if strategy not in ("upsert", "lock"):
            raise InvalidArgument(f"unknown strategy {strategy!r}")
        self.strategy: Strategy = strategy
        self.enforce_tokens = enforce_tokens
        self.max_attempts = max_attempts
        metadata = MetaData()
        self.tokens = Table(
            f"{table_prefix}tokens",
            metadata,
            Column("resource", String(1024), primary_key=True),
            Column("highest", BigInteger, nullable=False),
        )
        self.effects_table = Table(
            f"{table_prefix}effects",
            metadata,
            Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                   autoincrement=True),
            Column("resource", String(1024), nullable=False),
            Column("token", BigInteger, nullable=False),
            Column("effect_id", String(MAX_EFFECT_ID_CHARS), nullable=False),
            Column("payload", LargeBinary, nullable=False),
            UniqueConstraint("resource", "token", "effect_id"),
            sqlite_autoincrement=True,
        )
        self.values_table = Table(
            f"{table_prefix}values",
            metadata,
            Column("resource", String(1024), primary_key=True),
            Column("value", LargeBinary, nullable=False),
            Column("version", BigInteger, nullable=False),
            Column("token", BigInteger, nullable=False),
        )
        self._metadata = metadata
        if create_tables:
            self.create_tables()

    # -- set-up ---------------------------------------------------------------------

    def create_tables(self) -> None:
        """Create the fence's tables if missing. A creation racing another process's is
        retried once (PostgreSQL reports such a race as a unique violation).

        Raises:
            BackendUnavailable: the database refused.
        """
        for attempt in (1, 2):
            try:
                self._metadata.create_all(self.engine, checkfirst=True)
                return
            except exc.SQLAlchemyError as error:
                if attempt == 2:
                    raise BackendUnavailable(f"creating fence tables: {error}") from error

    # -- the fence ------------------------------------------------------------------

    @overload
    def apply(
        self, resource: str, token: int, effect_id: str, payload: bytes = b"", *,
        conn: Connection, once_per_job: bool = False,
    ) -> FenceOutcome: ...

    @overload
    def apply(  # deprecated: the order before SqliteFence's (warns)
        self, conn: Connection, resource: str, token: int, effect_id: str,
        payload: bytes = b"", *, once_per_job: bool = False,
    ) -> FenceOutcome: ...

    def apply(self, *args: Any, conn: Connection | None = None,
              once_per_job: bool = False, **named: Any) -> FenceOutcome:
        """Inside the caller's open transaction on ``conn``: accept the effect iff
        ``token`` >= the highest token accepted for ``resource``, recording the token
        and the effect. Nothing is committed here: the caller's transaction commits
        them together with its own writes (and a rollback undoes all of it).

        Until that transaction ends it holds the resource's token row lock (SQLite: the
        database write lock), so other appliers of the same resource wait.

        The token check comes first, in both modes, as in :class:`SqliteFence
        <consensus_lease.SqliteFence>`: a token below the highest accepted raises
        FenceRejected even for an effect that was applied (the caller no longer holds
        the job; ``effects()`` tells whether its effect exists). A repeat of
        ``(resource, token, effect_id)`` at a current token returns ``DUPLICATE``.

        With ``once_per_job=True`` the key is ``(resource, effect_id)`` across all
        tokens: a current token whose effect was applied before, by this token or an
        older one,
        returns ``ALREADY_APPLIED`` and records ``token`` as the highest (fencing out
        older holders: the new holder has acted on the resource).

        The arguments are :meth:`SqliteFence.apply <consensus_lease.SqliteFence.apply>`'s,
        in its order, plus ``conn=`` (keyword): ``fence.apply(resource, token, effect_id,
        payload, conn=conn)``. The earlier order ``apply(conn, resource, token, ...)``
        still works and warns (``DeprecationWarning``).

        Args:
            resource: what the effect changes, usually the job id (same rules as job ids).
            token: the lease's generation, an int >= 1.
            effect_id: the caller's name for the effect, 1-256 characters
                (:data:`~consensus_lease.fencing.MAX_EFFECT_ID_CHARS`, as ``SqliteFence``), no NUL.
            payload: bytes stored with the effect.
            once_per_job: apply at most once per ``(resource, effect_id)`` (see above).
            conn: a connection in a transaction (``with engine.begin() as conn:``).

        Returns:
            ACCEPTED; DUPLICATE (default mode); ALREADY_APPLIED (``once_per_job``).

        Raises:
            FenceRejected: a higher token was accepted (``highest_seen`` set). Let it
                propagate so the transaction rolls back.
            FenceRetryable: the database aborted the transaction; retry it whole.
            InvalidArgument: bad arguments (``once_per_job`` not a bool, no ``conn``, ...);
                nothing executed.
            BackendUnavailable: any other database error (the transaction is unusable).
        """
        if args and isinstance(args[0], Connection):
            warnings.warn(
                "SqlFence.apply(conn, resource, token, effect_id, ...) is deprecated: use "
                "apply(resource, token, effect_id, payload, conn=conn), SqliteFence's order",
                DeprecationWarning, stacklevel=2,
            )
            if conn is not None:
                raise InvalidArgument("SqlFence.apply: conn given twice")
            conn, args = args[0], args[1:]
        resource, token, effect_id, payload = _bind(args, named)
        if not isinstance(conn, Connection):
            raise InvalidArgument(
                "SqlFence.apply needs conn=, a connection in your open transaction (with "
                f"engine.begin() as conn:), not {type(conn).__name__}; for a transaction "
                "of its own use apply_now(resource, token, effect_id)", job_id=str(resource),
            )
        return self._apply(conn, resource, token, effect_id, payload, once_per_job)

    def _apply(self, conn: Connection, resource: str, token: int, effect_id: str,
               payload: bytes, once_per_job: bool) -> FenceOutcome:
        """:meth:`apply`, the arguments bound."""
        _check(resource, token, effect_id, payload, once_per_job)
        try:
            if self.strategy == "upsert":
                highest = self._lock_upsert(conn, resource, token)
            else:
                highest = self._lock_select(conn, resource, token, always_write=once_per_job)
            # The token check comes first, in both modes (as SqliteFence's).
            if highest is not None and self.enforce_tokens and token < highest:
                raise FenceRejected(
                    rejection_message(resource, token, effect_id, highest),
                    job_id=resource,
                    generation=token,
                    highest_seen=highest,
                )
            if not once_per_job and self._is_duplicate(conn, resource, token, effect_id):
                return FenceOutcome.DUPLICATE
            if once_per_job and self._applied_before(conn, resource, effect_id):
                return FenceOutcome.ALREADY_APPLIED
            conn.execute(
                insert(self.effects_table).values(
                    resource=resource, token=token, effect_id=effect_id, payload=bytes(payload)
                )
            )
        except exc.DBAPIError as error:
            raise _translate(error, f"fence apply on {resource!r}") from error
        return FenceOutcome.ACCEPTED

    def _lock_upsert(self, conn: Connection, resource: str, token: int) -> int | None:
        """Raise the token row to ``token`` (or create it) and lock it in one statement.
        Returns ``None`` when accepted, else the (higher) highest token."""
        tokens = self.tokens
        stmt = _dialect_insert(conn.dialect.name, tokens).values(resource=resource, highest=token)
        if self.enforce_tokens:
            upsert = stmt.on_conflict_do_update(
                index_elements=[tokens.c.resource],
                set_={"highest": stmt.excluded.highest},
                where=tokens.c.highest <= stmt.excluded.highest,
            )
        else:
            upsert = stmt.on_conflict_do_update(
                index_elements=[tokens.c.resource],
                set_={"highest": _max(tokens.c.highest, stmt.excluded.highest)},
            )
        if conn.execute(upsert.returning(tokens.c.highest)).first() is not None:
            return None
        # WHERE was false: the row exists, is locked by us, and is higher than ``token``.
        return int(conn.execute(select(tokens.c.highest).where(tokens.c.resource == resource))
                   .scalar_one())

    def _lock_select(
        self, conn: Connection, resource: str, token: int, *, always_write: bool = False
    ) -> int | None:
        """Portable: lock the row (creating it if missing), compare, raise it.
        ``always_write``: write the row even when its value does not change (so a
        concurrent applier under REPEATABLE READ conflicts instead of reading a stale
        snapshot). Returns ``None`` when accepted, else the (higher) highest token."""
        tokens = self.tokens
        locked = select(tokens.c.highest).where(tokens.c.resource == resource).with_for_update()
        row = conn.execute(locked).first()
        if row is None:
            try:
                with conn.begin_nested():  # a racing first insert must not abort us
                    conn.execute(insert(tokens).values(resource=resource, highest=0))
            except exc.IntegrityError:
                pass  # a concurrent transaction created it first and has committed
            row = conn.execute(locked).first()
        if row is None:  # committed concurrently but invisible to this snapshot
            raise FenceRetryable(
                f"token row of {resource!r} not visible to this transaction's snapshot"
            )
        highest = int(row[0])
        if self.enforce_tokens and token < highest:
            return highest
        if token > highest or always_write:
            conn.execute(update(tokens).where(tokens.c.resource == resource)
                         .values(highest=max(token, highest)))
        return None

    def _is_duplicate(self, conn: Connection, resource: str, token: int, effect_id: str) -> bool:
        effects = self.effects_table
        found = conn.execute(
            select(effects.c.seq).where(
                effects.c.resource == resource,
                effects.c.token == token,
                effects.c.effect_id == effect_id,
            )
        ).first()
        return found is not None

    def _applied_before(self, conn: Connection, resource: str, effect_id: str) -> bool:
        effects = self.effects_table
        found = conn.execute(
            select(effects.c.seq)
            .where(effects.c.resource == resource, effects.c.effect_id == effect_id)
            .limit(1)
        ).first()
        return found is not None

    def read_fenced(self, conn: Connection, resource: str, token: int) -> FencedRead:
        """Inside the caller's open transaction on ``conn``: record ``token`` as
        ``resource``'s highest (refused when below it) and read the value, so a stale
        holder's write cannot land between this read and the write-back
        (:mod:`consensus_lease.fencing`: read-modify-write). The read and the write-back
        may be two transactions: the recorded token keeps older holders out in between.

        Args:
            conn: a connection in a transaction (``with engine.begin() as conn:``).
            resource: what to read, usually the job id (same rules as job ids).
            token: the lease's generation, an int >= 1.

        Returns:
            The value (``None`` if never written), its version and the token.

        Raises:
            FenceRejected: a higher token was recorded (``highest_seen`` set); let it
                propagate so the transaction rolls back. The caller no longer holds the
                job.
            FenceRetryable: the database aborted the transaction; retry it whole.
            InvalidArgument: bad arguments; nothing executed.
            BackendUnavailable: any other database error.
        """
        check_job_id(resource)
        check_token(token)
        try:
            self._record_token(conn, resource, token, "fenced read")
            values = self.values_table
            row = conn.execute(select(values.c.value, values.c.version)
                               .where(values.c.resource == resource)).first()
        except exc.DBAPIError as error:
            raise _translate(error, f"fenced read of {resource!r}") from error
        if row is None:
            return FencedRead(resource, token, None, 0)
        return FencedRead(resource, token, bytes(row[0]), int(row[1]))

    def write_fenced(self, conn: Connection, read: FencedRead, value: bytes) -> FencedRead:
        """Inside the caller's open transaction on ``conn``: write ``value`` back iff no
        higher token than ``read.token`` was recorded since the read and the value is
        still at ``read.version``.

        Returns:
            The state after the write (``version`` + 1).

        Raises:
            FenceRejected: a higher token was recorded since, or the value was written
                since the read; nothing written (let it propagate: the transaction
                rolls back).
            FenceRetryable / BackendUnavailable: as :meth:`apply`.
            InvalidArgument: ``read`` not a FencedRead or ``value`` not bytes.
        """
        if not isinstance(read, FencedRead):
            raise InvalidArgument(f"read must be a FencedRead, not {type(read).__name__}")
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"value must be bytes, not {type(value).__name__}")
        values, resource = self.values_table, read.resource
        try:
            self._record_token(conn, resource, read.token, "fenced write")
            new = {"value": bytes(value), "version": read.version + 1, "token": read.token}
            if read.version == 0:
                try:
                    with conn.begin_nested():
                        conn.execute(insert(values).values(resource=resource, **new))
                    written = 1
                except exc.IntegrityError:
                    written = 0
            else:
                written = conn.execute(update(values).where(
                    values.c.resource == resource, values.c.version == read.version,
                ).values(**new)).rowcount
        except exc.DBAPIError as error:
            raise _translate(error, f"fenced write of {resource!r}") from error
        if written != 1:
            raise FenceRejected(
                f"fenced write on {resource!r} refused: written since the read "
                f"(read version {read.version})",
                job_id=resource, generation=read.token, highest_seen=read.token)
        return FencedRead(resource, read.token, bytes(value), read.version + 1)

    def _record_token(self, conn: Connection, resource: str, token: int, what: str) -> None:
        """Lock the token row and raise it to ``token``; FenceRejected when below."""
        if self.strategy == "upsert":
            highest = self._lock_upsert(conn, resource, token)
        else:
            highest = self._lock_select(conn, resource, token, always_write=True)
        if highest is not None and self.enforce_tokens and token < highest:
            raise FenceRejected(rejection_message(resource, token, what, highest),
                                job_id=resource, generation=token, highest_seen=highest)

    def apply_now(
        self,
        resource: str,
        token: int,
        effect_id: str,
        payload: bytes = b"",
        *,
        once_per_job: bool = False,
    ) -> FenceOutcome:
        """:meth:`apply` in a transaction of its own, committed before returning;
        retried (up to ``max_attempts``, jittered backoff) on :class:`FenceRetryable`.

        Raises:
            FenceRejected, InvalidArgument, BackendUnavailable: as :meth:`apply`;
            FenceRetryable: still aborted after ``max_attempts``. Nothing applied.
        """
        _check(resource, token, effect_id, payload, once_per_job)
        return self._retrying(
            lambda conn: self._apply(conn, resource, token, effect_id, payload, once_per_job)
        )

    def _retrying(self, work: Callable[[Connection], T]) -> T:
        for attempt in range(1, self.max_attempts + 1):
            try:
                with self.engine.begin() as conn:
                    return work(conn)
            except FenceRetryable:
                if attempt == self.max_attempts:
                    raise
            except exc.DBAPIError as error:  # raised by BEGIN or COMMIT
                translated = _translate(error, "fence transaction")
                if not isinstance(translated, FenceRetryable) or attempt == self.max_attempts:
                    raise translated from error
            time.sleep(random.uniform(0, 0.01 * 2**attempt))  # backoff before a retry
        raise AssertionError("unreachable")  # pragma: no cover

    def as_fence(self) -> _OwnTransactionFence:
        """This fence as a :class:`consensus_lease.fencing.Fence`:
        ``apply(resource, token, effect_id, payload, *, once_per_job)`` runs
        :meth:`apply_now`."""
        return _OwnTransactionFence(self)

    # -- reading ----------------------------------------------------------------------

    def highest_token(self, resource: str) -> int | None:
        """The highest token accepted for ``resource``, or ``None``.

        Raises:
            BackendUnavailable: see :mod:`consensus_lease.errors`.
        """
        try:
            with self.engine.connect() as conn:
                value = conn.execute(
                    select(self.tokens.c.highest).where(self.tokens.c.resource == resource)
                ).scalar()
        except exc.DBAPIError as error:
            raise _translate(error, "reading the fence") from error
        return None if value is None else int(value)

    def applied(self, resource: str) -> dict[str, Effect]:
        """What was applied to ``resource``: ``effect_id`` -> the first accepted
        :class:`Effect` with that id, in acceptance order (iterate it to see where the
        last holder stopped; ``step in applied`` to test one step). Read in a
        transaction of its own: :meth:`apply` with ``once_per_job`` is the atomic
        check, this is for showing progress and choosing where to resume.

        Raises:
            InvalidArgument: bad ``resource``.
            BackendUnavailable: see :mod:`consensus_lease.errors`.
        """
        check_job_id(resource)
        return first_by_effect_id(self.effects(resource))

    def effects(self, resource: str | None = None) -> list[Effect]:
        """Accepted effects ordered by ``seq`` (acceptance order within a resource),
        optionally only those of ``resource``.

        Raises:
            BackendUnavailable: see :mod:`consensus_lease.errors`.
        """
        e = self.effects_table
        query = select(e.c.seq, e.c.resource, e.c.token, e.c.effect_id, e.c.payload)
        if resource is not None:
            query = query.where(e.c.resource == resource)
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(query.order_by(e.c.seq)).all()
        except exc.DBAPIError as error:
            raise _translate(error, "reading the fence") from error
        return [Effect(int(s), str(r), int(t), str(i), bytes(p)) for s, r, t, i, p in rows]

    def drop_tables(self) -> None:
        """Drop both tables (tests and throw-away runs)."""
        self._metadata.drop_all(self.engine, checkfirst=True)

    def close(self) -> None:
        """Dispose the engine if this fence built it from a URL."""
        if self._owns_engine:
            self.engine.dispose()


class _OwnTransactionFence:
    """Adapter: the :class:`~consensus_lease.fencing.Fence` protocol over ``apply_now``."""

    def __init__(self, fence: SqlFence) -> None:
        self.fence = fence

    def apply(
        self,
        resource: str,
        token: int,
        effect_id: str,
        payload: bytes = b"",
        *,
        once_per_job: bool = False,
    ) -> FenceOutcome:
        return self.fence.apply_now(
            resource, token, effect_id, payload, once_per_job=once_per_job
        )

    def applied(self, resource: str) -> dict[str, Effect]:
        return self.fence.applied(resource)


_ARGUMENTS = ("resource", "token", "effect_id", "payload")


def _bind(args: tuple[Any, ...], named: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """``apply``'s ``resource, token, effect_id, payload`` from positions and names."""
    if len(args) > len(_ARGUMENTS) or set(named) - set(_ARGUMENTS):
        raise InvalidArgument(
            "SqlFence.apply(resource, token, effect_id, payload=b'', *, conn, "
            f"once_per_job=False): unexpected {args[4:] or sorted(set(named) - set(_ARGUMENTS))}"
        )
    values = dict(zip(_ARGUMENTS, args, strict=False))
    for name, value in named.items():
        if name in values:
            raise InvalidArgument(f"SqlFence.apply: {name} given twice")
        values[name] = value
    missing = [name for name in _ARGUMENTS[:3] if name not in values]
    if missing:
        raise InvalidArgument(f"SqlFence.apply: missing {', '.join(missing)}")
    return values["resource"], values["token"], values["effect_id"], values.get("payload", b"")


def _dialect_insert(dialect: str, table: Table) -> postgresql.Insert | sqlite.Insert:
    """``INSERT`` with ``ON CONFLICT`` support for the two dialects that have it."""
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


def _max(a: Any, b: Any) -> Any:
    """Portable ``GREATEST(a, b)`` (SQLite has ``max``, PostgreSQL ``GREATEST``)."""
    return case((a > b, a), else_=b)


def _check(
    resource: str, token: int, effect_id: str, payload: bytes, once_per_job: bool
) -> None:
    check_once_per_job(once_per_job)
    check_job_id(resource)
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise InvalidArgument(f"token must be an int >= 1, got {token!r}")
    if token >= 2**63:  # as SqliteFence: the token columns are signed 64-bit integers
        raise InvalidArgument(f"token {token} does not fit a signed 64-bit integer")
    check_effect_id(effect_id)  # at most MAX_EFFECT_ID_CHARS, as SqliteFence
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"payload must be bytes, not {type(payload).__name__}")


def _translate(error: exc.DBAPIError, what: str) -> BackendUnavailable:
    """Map a driver error to FenceRetryable (transaction aborted, retry) or
    BackendUnavailable."""
    orig = error.orig
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    message = str(orig)
    if sqlstate in _RETRYABLE_SQLSTATES or "database is locked" in message:
        return FenceRetryable(f"{what}: {message.strip()}")
    return BackendUnavailable(f"{what}: {message.strip()}")


def _check_url_values(url: str) -> None:
    """Refuse a URL with a part the driver cannot carry, before anything is sent: a NUL
    character (also as ``%00``, which SQLAlchemy decodes) makes libpq stop reading its
    connection string there and connect with its defaults for the rest (another host,
    port or database); sqlite3 raises a raw ``ValueError``; a lone surrogate cannot be
    encoded.

    Raises:
        InvalidArgument: naming the part (never the password's value).
    """
    try:
        parsed = make_url(url)
    except exc.ArgumentError:
        return  # create_engine says what is wrong
    parts: list[tuple[str, object]] = [
        ("user name", parsed.username), ("password", parsed.password),
        ("host", parsed.host), ("database", parsed.database),
    ]
    for name, given in parsed.query.items():
        parts.append(("query option name", name))
        parts.extend((f"query option {name[:32]!r}", v)
                     for v in (given if isinstance(given, tuple) else (given,)))
    for what, value in parts:
        if not isinstance(value, str):
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"SQL fence URL's {what} contains a character UTF-8 "
                                  "cannot encode (a lone surrogate)") from None
        if "\x00" in value:
            raise InvalidArgument(
                f"SQL fence URL's {what} contains a NUL character (%00): the driver would "
                "stop reading the connection parameters there and use its defaults"
            )


def _make_engine(url: str, busy_timeout_s: float) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and BEGIN IMMEDIATE.

    Raises:
        InvalidArgument: a URL SQLAlchemy cannot use, or with a part the driver cannot
            carry (:func:`_check_url_values`).
    """
    _check_url_values(url)
    try:
        if not url.startswith("sqlite"):
            return create_engine(url, pool_pre_ping=True)
        engine = create_engine(url, connect_args={"timeout": busy_timeout_s})
    except (exc.ArgumentError, ImportError) as error:
        raise InvalidArgument(f"cannot build an engine for {redact_url(url)!r}: {error}") from error

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (pysqlite recipe)
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
