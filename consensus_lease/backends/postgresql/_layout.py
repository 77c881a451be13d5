"""Where the PostgreSQL store's records live: its tables, their version and how it is
migrated (:func:`prepare`, at open), the row codec (:func:`to_record`). The statements
are in :mod:`._layout_sql`; what each table holds in the protocol is told in the package
docstring (:mod:`consensus_lease.backends.postgresql`).

Every table lives in one PostgreSQL schema (the URL's ``schema`` option, default
``consensus_lease``), so several stores can share a database and a test can drop its
store with ``DROP SCHEMA ... CASCADE``.

Versioning and the migration path
---------------------------------
``cl_meta`` (one row, ``id = 1``) carries ``schema_version``. Opening a store:

1. takes ``pg_advisory_xact_lock`` on the schema's name, so that processes opening a new
   store at once create it once;
2. creates what is missing (``CREATE ... IF NOT EXISTS``) when ``create`` is true, and
   writes ``schema_version = SCHEMA_VERSION`` into a new ``cl_meta``;
3. reads ``schema_version``: equal to :data:`SCHEMA_VERSION` is ready; lower runs
   :data:`MIGRATIONS` ``[v]`` for each ``v`` from it up to ``SCHEMA_VERSION - 1``, in the
   same transaction, and stores the new version; higher (a newer library wrote it) is
   refused with ``InvalidArgument`` and nothing is changed.

A later version that changes the tables adds one entry to :data:`MIGRATIONS` (statements
that take version ``v`` to ``v + 1``, safe while older workers are stopped) and raises
:data:`SCHEMA_VERSION`. ``consensus-lease migrate`` is not needed: the first process of
the new version that opens the store migrates it. Stop the old workers first — they do not
know the new columns.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import InvalidArgument
from ...record import LeaseRecord
from .._sql_row import record_of_row

if TYPE_CHECKING:
    import psycopg

    from ._transport import Client

__all__ = ["MIGRATIONS", "NOW", "SCHEMA_VERSION", "SYSTEM_ID", "TIMELINE", "Names",
           "check_schema_name", "prepare", "to_record"]

SCHEMA_VERSION = 5
"""The version of the tables this library reads and writes."""

TIMELINE = "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"
"""The server's current WAL timeline (8 hex digits, ``text``): it changes when a standby
is promoted (failover or planned switchover) and when a backup is restored with
point-in-time recovery. Read from shared memory (the WAL insert position and the insert
timeline), so cheap enough for every statement; ``pg_control_checkpoint()`` is not: it
reads ``pg_control`` from disk, and its ``timeline_id`` stays the old one after
``pg_promote()`` until the next checkpoint (checked on PostgreSQL 15). An error on a
server in recovery (a hot standby), where the store cannot write anyway."""

SYSTEM_ID = "(SELECT system_identifier::text FROM pg_control_system())"
"""The cluster's system identifier (``text``): set by ``initdb``, kept by physical
replicas and backups, different in another cluster (a logical dump restored into one).
Reads ``pg_control`` from disk: only at open, ``open_session`` and ``bump_epoch``."""

_EXHAUSTED_INDEX_V2 = (
    "CREATE INDEX IF NOT EXISTS cl_jobs_exhausted_by_queue ON {s}.cl_jobs (queue, seq) "
    "WHERE queue IS NOT NULL AND completed_at IS NULL AND failed_at IS NULL "
    "AND max_attempts IS NOT NULL AND attempt - attempt_base >= max_attempts"
)

_EFFECTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS {s}.cl_effects ("
    "job_id text NOT NULL REFERENCES {s}.cl_jobs (job_id) ON DELETE CASCADE, "
    "effect_id text NOT NULL, generation bigint NOT NULL, "
    "PRIMARY KEY (job_id, effect_id))"
)

_OPEN_INDEX = (
    "CREATE INDEX IF NOT EXISTS cl_jobs_open_by_queue ON {s}.cl_jobs (queue, seq) "
    "WHERE closed IS NULL"
)
_EXHAUSTED_INDEX = (
    "CREATE INDEX IF NOT EXISTS cl_jobs_exhausted_by_queue ON {s}.cl_jobs (queue, seq) "
    "WHERE closed IS NULL AND max_attempts IS NOT NULL "
    "AND attempt - attempt_base >= max_attempts"
)

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (_EXHAUSTED_INDEX_V2,),
    2: (
        "ALTER TABLE {s}.cl_jobs ADD COLUMN IF NOT EXISTS closed boolean",
        "UPDATE {s}.cl_jobs SET closed = true WHERE queue IS NULL "
        "OR completed_at IS NOT NULL OR failed_at IS NOT NULL",
        "DROP INDEX IF EXISTS {s}.cl_jobs_by_session",
        "DROP INDEX IF EXISTS {s}.cl_jobs_open_by_queue",
        "DROP INDEX IF EXISTS {s}.cl_jobs_exhausted_by_queue",
        _OPEN_INDEX,
        _EXHAUSTED_INDEX,
    ),
    3: (
        "ALTER TABLE {s}.cl_meta ADD COLUMN IF NOT EXISTS system_id text",
        "ALTER TABLE {s}.cl_meta ADD COLUMN IF NOT EXISTS timeline text",
        "ALTER TABLE {s}.cl_sessions ADD COLUMN IF NOT EXISTS timeline text",
        f"UPDATE {{s}}.cl_meta SET system_id = {SYSTEM_ID}, timeline = {TIMELINE}",
        f"UPDATE {{s}}.cl_sessions SET timeline = {TIMELINE}",
    ),
    4: (_EFFECTS_TABLE,),
}
"""``v -> statements`` taking a store from version ``v`` to ``v + 1`` (``{s}``: the
quoted schema).

* 1 -> 2: the partial index ``cl_jobs_exhausted_by_queue`` of the open jobs whose
  attempts are used up, so that ``claim_next`` finds the ones to mark FAILED without
  reading every open job of the queue (before it, a claim cost O(queue depth)).
* 2 -> 3: completing a named job is a HOT update (PostgreSQL writes no index entry for
  it, https://www.postgresql.org/docs/15/storage-hot.html: no indexed column, index
  predicates included, changes). The column ``closed`` (NULL while the job is an open
  job of a queue, neither COMPLETED nor FAILED; ``true`` for every other job, named
  ones from their first claim, so completing one writes the value it had) replaces
  ``completed_at``/``failed_at`` in the queue indexes' predicates (``IS NULL``, which
  the planner takes for selective before the table is analyzed), and the index
  ``cl_jobs_by_session`` is dropped: a job whose session row is gone counts as free, so
  closing a session deletes its row and writes no job row, and expired session rows are
  collected without looking for their jobs.
* 3 -> 4: failover detection. ``cl_meta.system_id`` and ``cl_meta.timeline`` record the
  server the store's history is on (:data:`SYSTEM_ID`, :data:`TIMELINE`; taken from the
  server that migrates), ``cl_sessions.timeline`` the timeline a session was opened on.
  Every statement that keeps or uses a session compares the session's timeline with the
  server's; ``open_session`` compares ``cl_meta``'s (and the system identifier). A
  promoted standby or a restored backup answers with another one: ``StoreRegressed``
  until ``bump-epoch`` records the new server (package docstring of
  :mod:`consensus_lease.backends.postgresql`).
* 4 -> 5: ``cl_effects (job_id, effect_id, generation)``, the once-per-job effect
  records of ``lease.transaction``'s ``tx.once(effect_id)``
  (:mod:`consensus_lease.transaction`), written in the caller's transaction; deleted
  with their job (``ON DELETE CASCADE``: ``purge``)."""

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")

NOW = "date_part('epoch', clock_timestamp())"
"""Store time, seconds since the epoch (``double precision``), read from the server's
clock *when evaluated*.

Not ``now()``: ``now()`` is the start of the transaction. A statement that waited for a
row lock (a claim waiting for a :meth:`~consensus_lease.Lease.transaction`, a keepalive
waiting for a claim) would compare expiries with a time from before its wait, and in a
transaction of several statements (``lease.transaction``) every check would use the time
of ``BEGIN``: a session could be found alive long after it expired. ``clock_timestamp()``
is read at the moment of the comparison, including when PostgreSQL re-checks a row
after waiting for its lock.

``date_part``, not ``extract(epoch FROM ...)::float8``: since PostgreSQL 14 ``extract``
computes a ``numeric`` that the cast then converts, about 1.5 % of the server's work in a
claim+complete cycle; ``date_part`` divides the microseconds as a double, the same value
(both round the exact quotient to the nearest double; checked equal on a million
timestamps)."""


def check_schema_name(name: str) -> str:
    """Return ``name`` if it is a plain lower-case identifier (letters, digits, ``_``,
    at most 48 characters, not starting with a digit) and not one of PostgreSQL's own
    schemas (``information_schema``, ``pg_*``: ``pg_catalog``, ``pg_toast``, ... which
    PostgreSQL reserves, https://www.postgresql.org/docs/15/ddl-schemas.html). Checked
    before anything is sent to the server.

    Raises:
        InvalidArgument: anything else (quoting rules are not worth a surprise).
    """
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise InvalidArgument(
            f"PostgreSQL schema must be a lower-case identifier ([a-z_][a-z0-9_]*, at most "
            f"48 characters), not {name!r}"
        )
    if name == "information_schema" or name.startswith("pg_"):
        raise InvalidArgument(
            f"PostgreSQL schema {name!r} is one of PostgreSQL's own (information_schema, "
            "pg_*): choose a schema of your own for the store's tables"
        )
    return name


class Names:
    """The quoted names of one store's objects.

    Args:
        schema: a name checked by :func:`check_schema_name`.
    """

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.s = f'"{schema}"'
        self.jobs = f"{self.s}.cl_jobs"
        self.sessions = f"{self.s}.cl_sessions"
        self.meta = f"{self.s}.cl_meta"
        self.seq = f"{self.s}.cl_seq"
        self.effects = f"{self.s}.cl_effects"
        self.channel = f"cl_{schema}"
        """The LISTEN/NOTIFY channel (a string for ``pg_notify``)."""
        self.listen = f'LISTEN "{self.channel}"'

    def ddl(self) -> list[str]:
        """The statements that create every object (idempotent)."""
        return [
            f"CREATE SCHEMA IF NOT EXISTS {self.s}",
            f"""CREATE TABLE IF NOT EXISTS {self.meta} (
                id             integer PRIMARY KEY CHECK (id = 1),
                schema_version integer NOT NULL,
                epoch          bigint  NOT NULL DEFAULT 0,
                identity       text    NOT NULL,
                system_id      text,
                timeline       text
            )""",
            f"""CREATE TABLE IF NOT EXISTS {self.sessions} (
                session_id text PRIMARY KEY,
                owner      text NOT NULL,
                ttl_s      double precision NOT NULL,
                expires_at double precision NOT NULL,
                timeline   text
            )""",
            f"""CREATE TABLE IF NOT EXISTS {self.jobs} (
                job_id            text PRIMARY KEY,
                generation        bigint  NOT NULL,
                owner             text,
                session_id        text,
                completed_at      double precision,
                completed_session text,
                result            bytea,
                queue             text,
                payload           bytea,
                seq               bigint,
                attempt           integer NOT NULL DEFAULT 0,
                attempt_base      integer NOT NULL DEFAULT 0,
                max_attempts      integer,
                error             text,
                not_before        double precision,
                failed_at         double precision,
                epoch             bigint  NOT NULL DEFAULT 0,
                value             bytea,
                closed            boolean
            )""",
            # Partial indexes: a named job (closed from its first claim) is in none of the
            # queue indexes; and no index covers a column a completion of a named job
            # changes (session_id, completed_at, result, value), so that completion is a
            # HOT update: no index entry written (MIGRATIONS, 2 -> 3).
            f"CREATE INDEX IF NOT EXISTS cl_jobs_by_queue ON {self.jobs} (queue, seq) "
            "WHERE queue IS NOT NULL",
            _OPEN_INDEX.format(s=self.s),
            _EXHAUSTED_INDEX.format(s=self.s),
            f"CREATE SEQUENCE IF NOT EXISTS {self.seq}",
            _EFFECTS_TABLE.format(s=self.s),
        ]


def to_record(row: Sequence[Any], epoch_shift: int) -> LeaseRecord:
    """The :class:`~consensus_lease.record.LeaseRecord` of a row of ``Statements.select``
    (the codec shared with the SQLite store, :mod:`consensus_lease.backends._sql_row`)."""
    return record_of_row(row, epoch_shift)


def prepare(client: Client, names: Names, create: bool,
            then: Callable[[psycopg.Connection[tuple[Any, ...]]], None]) -> str:
    """Create or migrate the store's tables (module docstring), then ``then(conn)`` in the
    same transaction (the failover check of open); return the store's identity. On a new
    connection of its own, under the schema's advisory lock.

    Raises:
        InvalidArgument: ``create`` is false and there is no store; a newer
            ``schema_version``; a pooler that dropped the store's timeouts.
        AuthenticationFailed / BackendUnavailable.
    """

    def run(conn: psycopg.Connection[tuple[Any, ...]]) -> str:
        if client.pooling == "none":
            client.check_settings(conn)  # a pooler that dropped them: refused
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                         (f"consensus_lease:{names.schema}",))
            exists = conn.execute("SELECT to_regclass(%s)",
                                  (f"{names.s}.cl_meta",)).fetchone()
            if exists is None or exists[0] is None:
                _create(conn, names, create)
            identity = _migrate(conn, names)
            then(conn)
        return identity

    return client.on_own_connection(run, "preparing the schema")


def _create(conn: psycopg.Connection[tuple[Any, ...]], n: Names, create: bool) -> None:
    """Create every object and the ``cl_meta`` row (on the server answering).

    Raises:
        InvalidArgument: ``create`` is false.
    """
    if not create:
        raise InvalidArgument(
            f"no consensus_lease store in schema {n.schema!r} of this "
            "database and create=false; check the URL's schema, or open "
            "it with create=true"
        )
    for statement in n.ddl():
        conn.execute(statement)
    conn.execute(
        f"INSERT INTO {n.meta} (id, schema_version, epoch, identity, system_id, "
        f"timeline) VALUES (1, %s, 0, %s, {SYSTEM_ID}, {TIMELINE}) "
        "ON CONFLICT (id) DO NOTHING",
        (SCHEMA_VERSION, uuid.uuid4().hex),
    )


def _migrate(conn: psycopg.Connection[tuple[Any, ...]], n: Names) -> str:
    """Take the store up to :data:`SCHEMA_VERSION` (:data:`MIGRATIONS`); its identity.

    Raises:
        InvalidArgument: no ``cl_meta`` row, or a newer ``schema_version``.
    """
    row = conn.execute(
        f"SELECT schema_version, identity FROM {n.meta} WHERE id = 1"
    ).fetchone()
    if row is None:
        raise InvalidArgument(f"schema {n.schema!r} has an empty cl_meta table")
    version, identity = int(row[0]), str(row[1])
    if version > SCHEMA_VERSION:
        raise InvalidArgument(
            f"the store in schema {n.schema!r} has schema_version {version}, "
            f"written by a newer consensus_lease (this one knows "
            f"{SCHEMA_VERSION}); upgrade this worker"
        )
    for v in range(version, SCHEMA_VERSION):
        for statement in MIGRATIONS[v]:
            conn.execute(statement.format(s=n.s))
    if version < SCHEMA_VERSION:
        conn.execute(f"UPDATE {n.meta} SET schema_version = %s",
                     (SCHEMA_VERSION,))
    return identity
