"""Where a SQLite store's records live: the tables, indexes and triggers of the file
(created on first open, and completed on the first open of a file an earlier version
wrote), the TEMP triggers by which the store's own connection learns what a statement
wrote, and the codec of a job's row. What each is for in the protocol: the package
docstring (:mod:`consensus_lease.backends.sqlite`).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from ..._election import ELECTION_PREFIX
from ...errors import InvalidArgument
from ...record import LeaseRecord
from .._sql_row import record_of_row
from . import _transport

if TYPE_CHECKING:
    import sqlite3

    from .driver import SqliteBackend

# Store time, seconds since the epoch, read from the database's clock inside a statement.
NOW = "((julianday('now') - 2440587.5) * 86400.0)"

SCHEMA = """
CREATE TABLE IF NOT EXISTS cl_sessions (
    session_id TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    ttl_s      REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS cl_jobs (
    job_id            TEXT PRIMARY KEY,
    generation        INTEGER NOT NULL,
    owner             TEXT,
    session_id        TEXT,
    completed_at      REAL,
    completed_session TEXT,
    result            BLOB,
    queue             TEXT,
    payload           BLOB,
    seq               INTEGER,
    attempt           INTEGER NOT NULL DEFAULT 0,
    attempt_base      INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER,
    error             TEXT,
    not_before        REAL,
    failed_at         REAL,
    epoch             INTEGER NOT NULL DEFAULT 0,
    value             BLOB
);
CREATE INDEX IF NOT EXISTS cl_jobs_by_session ON cl_jobs(session_id)
    WHERE session_id IS NOT NULL AND queue IS NOT NULL;
CREATE INDEX IF NOT EXISTS cl_jobs_by_queue ON cl_jobs(queue, seq) WHERE queue IS NOT NULL;
CREATE TABLE IF NOT EXISTS cl_seq (id INTEGER PRIMARY KEY CHECK (id = 1), last INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS cl_meta (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    epoch    INTEGER NOT NULL,
    identity TEXT NOT NULL,
    claims   INTEGER NOT NULL
);
"""

SCHEMA_OBJECTS = frozenset(
    {"cl_sessions", "cl_jobs", "cl_jobs_by_session", "cl_jobs_by_queue", "cl_seq", "cl_meta"}
)

QUEUE_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS cl_jobs_open ON cl_jobs(queue, seq) "
    "WHERE completed_at IS NULL AND failed_at IS NULL AND queue IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS cl_queue_counts (queue TEXT PRIMARY KEY, "
    "jobs INTEGER NOT NULL, completed INTEGER NOT NULL, failed INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TRIGGER IF NOT EXISTS cl_count_insert AFTER INSERT ON cl_jobs "
    "WHEN NEW.queue IS NOT NULL BEGIN "
    "INSERT INTO cl_queue_counts VALUES (NEW.queue, 1, NEW.completed_at IS NOT NULL, "
    "NEW.failed_at IS NOT NULL) ON CONFLICT (queue) DO UPDATE SET jobs = jobs + 1, "
    "completed = completed + excluded.completed, failed = failed + excluded.failed; END",
    "CREATE TRIGGER IF NOT EXISTS cl_count_delete AFTER DELETE ON cl_jobs "
    "WHEN OLD.queue IS NOT NULL BEGIN "
    "UPDATE cl_queue_counts SET jobs = jobs - 1, "
    "completed = completed - (OLD.completed_at IS NOT NULL), "
    "failed = failed - (OLD.failed_at IS NOT NULL) WHERE queue = OLD.queue; END",
    # A job's queue is set once, by the INSERT of enqueue: only the two end marks move.
    "CREATE TRIGGER IF NOT EXISTS cl_count_update AFTER UPDATE OF completed_at, failed_at "
    "ON cl_jobs WHEN NEW.queue IS NOT NULL "
    "AND ((OLD.completed_at IS NULL) <> (NEW.completed_at IS NULL) "
    "OR (OLD.failed_at IS NULL) <> (NEW.failed_at IS NULL)) BEGIN "
    "UPDATE cl_queue_counts SET "
    "completed = completed + (NEW.completed_at IS NOT NULL) - (OLD.completed_at IS NOT NULL), "
    "failed = failed + (NEW.failed_at IS NOT NULL) - (OLD.failed_at IS NOT NULL) "
    "WHERE queue = NEW.queue; END",
)
"""What keeps queues fast at depth, created after the column migration (it uses
``failed_at``): ``cl_jobs_open``, the open jobs (neither COMPLETED nor FAILED) of each
queue in ``seq`` order, so ``queue_candidates`` never walks over dead letters or finished
jobs; and per-queue counts of jobs, COMPLETED and FAILED ones, kept by triggers in the very
statements that change them (so every writer keeps them, an older version of this
library included), which ``queue_stats`` reads instead of every job."""

QUEUE_OBJECTS = frozenset(
    {"cl_jobs_open", "cl_queue_counts", "cl_count_insert", "cl_count_delete",
     "cl_count_update"}
)

COUNTS_FILL = (
    "INSERT INTO cl_queue_counts SELECT queue, count(*), count(completed_at), "
    "count(failed_at) FROM cl_jobs WHERE queue IS NOT NULL GROUP BY queue"
)
"""The counts of a store written before ``cl_queue_counts`` existed (one scan, once)."""

PARTIAL_INDEXES = {
    "cl_jobs_by_session": "CREATE INDEX cl_jobs_by_session ON cl_jobs(session_id) "
                          "WHERE session_id IS NOT NULL AND queue IS NOT NULL",
    "cl_jobs_by_queue": "CREATE INDEX cl_jobs_by_queue ON cl_jobs(queue, seq) "
                        "WHERE queue IS NOT NULL",
    "cl_jobs_open": "CREATE INDEX cl_jobs_open ON cl_jobs(queue, seq) "
                    "WHERE completed_at IS NULL AND failed_at IS NULL AND queue IS NOT NULL",
}
"""The secondary indexes as this version defines them: each holds only the rows its
statements look for, so a claim+complete cycle of a job outside any queue writes no
secondary index at all (only its row, its primary key and the claim count), and
completing a queue job moves no entry of ``cl_jobs_by_queue``. ``cl_jobs_by_session``
serves ``queue_stats`` (the held jobs of a queue) and ``close_session``, which releases
the session's queue jobs by it; its other jobs keep the closed session's id, like the
jobs of a session that expired (a job is held iff its session row is alive). An
earlier version's file (whole-table indexes, ``completed_at`` in ``cl_jobs_by_queue``)
has them rebuilt once on first open (one transaction, as long as building them takes);
every query of this version and of earlier ones can use either definition, except an
earlier version's ``close_session``, which then reads the whole table."""

CLAIM_TRIGGERS = (
    "CREATE TRIGGER IF NOT EXISTS cl_claims_insert AFTER INSERT ON cl_jobs "
    "WHEN NEW.generation > 0 BEGIN "
    "UPDATE cl_meta SET claims = claims + 1 WHERE id = 1; END",
    "CREATE TRIGGER IF NOT EXISTS cl_claims_update AFTER UPDATE OF generation ON cl_jobs "
    "WHEN NEW.generation <> OLD.generation BEGIN "
    "UPDATE cl_meta SET claims = claims + 1 WHERE id = 1; END",
)
"""The claim count (``cl_meta.claims``, see :mod:`._tokens_history`) goes +1 in the very
statement that applies a claim (the row inserted with generation 1, or its generation
raised): enqueue inserts generation 0 and nothing but a claim moves ``generation``. An
earlier version's writers also add 1 themselves: +2 per claim of theirs, still never
back, which is all the regression check needs."""

CLAIM_OBJECTS = frozenset({"cl_claims_insert", "cl_claims_update"})


def _words(sql: str | None) -> str | None:
    """A definition from ``sqlite_master`` with its white space normalised."""
    return None if sql is None else " ".join(sql.split())

META_INSERT = "INSERT OR IGNORE INTO cl_meta (id, epoch, identity, claims) VALUES (1, 0, ?, 0)"
"""The store's one ``cl_meta`` row: epoch 0, a new random identity, no claims yet."""

STORE_TABLES = frozenset({"cl_sessions", "cl_jobs"})
"""A file with these tables is a store (``create=false`` opens nothing else)."""

LIFECYCLE_COLUMNS = {
    "attempt": "INTEGER NOT NULL DEFAULT 0",
    "attempt_base": "INTEGER NOT NULL DEFAULT 0",
    "max_attempts": "INTEGER",
    "error": "TEXT",
    "not_before": "REAL",
    "failed_at": "REAL",
}
"""Columns added by the job lifecycle (attempts, failure, retry delay); a store file
written by an earlier version gets them on first open (``ALTER TABLE ... ADD COLUMN``)."""

ADDED_COLUMNS = {**LIFECYCLE_COLUMNS, "epoch": "INTEGER NOT NULL DEFAULT 0", "value": "BLOB"}
"""Every column added since the first version (lifecycle; the store epoch of the job's
claim; an election leader's value), added on first open the same way."""

EXHAUSTED = "(max_attempts IS NOT NULL AND attempt - attempt_base >= max_attempts)"

HINT_CHUNK = 500
"""Job ids per statement of :func:`._watches.claimable_hint` (SQLite limits the
number of parameters of one statement)."""

NOT_ELECTION = f"substr(j.job_id, 1, {len(ELECTION_PREFIX)}) <> ?"
"""A ``cl_jobs j`` row that is a job, not an election (bind :data:`ELECTION_PREFIX`)."""

ALIVE_J = (
    f"EXISTS (SELECT 1 FROM cl_sessions s WHERE s.session_id = j.session_id "
    f"AND s.expires_at > {NOW})"
)
"""The holder of the ``cl_jobs j`` row is alive."""

ALIVE = f"EXISTS (SELECT 1 FROM cl_sessions s WHERE s.session_id = ? AND s.expires_at > {NOW})"

CLAIMED_FUNCTION = "cl_claimed_row"
COUNTED_FUNCTION = "cl_claims_counted"
_CLAIMED_ROW = (
    f"BEGIN SELECT {CLAIMED_FUNCTION}(NEW.job_id, NEW.generation, NEW.attempt, NEW.epoch, "
    "(SELECT expires_at FROM cl_sessions WHERE session_id = NEW.session_id)); END"
)

CLAIM_CAPTURES = (
    "CREATE TEMP TRIGGER IF NOT EXISTS cl_claimed_insert AFTER INSERT ON main.cl_jobs "
    f"WHEN NEW.generation > 0 {_CLAIMED_ROW}",
    "CREATE TEMP TRIGGER IF NOT EXISTS cl_claimed_update AFTER UPDATE OF generation "
    f"ON main.cl_jobs WHEN NEW.generation <> OLD.generation {_CLAIMED_ROW}",
    "CREATE TEMP TRIGGER IF NOT EXISTS cl_claims_counted AFTER UPDATE OF claims "
    f"ON main.cl_meta BEGIN SELECT {COUNTED_FUNCTION}(NEW.claims); END",
)
"""How a claim statement hands over what it wrote, as :data:`COMPLETED_CAPTURE` does
for the complete (TEMP triggers of this connection, never in the file): the claimed row,
on the same conditions as :data:`CLAIM_TRIGGERS` (the only statements that move
``generation`` are claims), and ``cl_meta.claims`` each time the claim count's trigger
raised it (so the count noted is the one after this claim, whatever order SQLite runs
the triggers in)."""

CAPTURE_FUNCTION = "cl_completed_row"

COMPLETED_CAPTURE = (
    "CREATE TEMP TRIGGER IF NOT EXISTS cl_completed_capture AFTER UPDATE OF completed_at "
    "ON main.cl_jobs WHEN OLD.completed_at IS NULL AND NEW.completed_at IS NOT NULL BEGIN "
    f"SELECT {CAPTURE_FUNCTION}(NEW.job_id, NEW.owner, NEW.completed_at, NEW.failed_at, "
    "NEW.attempt, NEW.error, NEW.max_attempts); END"
)
"""How :func:`._jobs.complete` learns the completed row: a trigger of this
connection only (``TEMP``: in its own temp schema, never in the file, so other processes
and other versions neither see nor run it) that passes the row, as the very statement
that completed it wrote it, to a function of this connection (``create_function``), in
that statement. A ``RETURNING`` clause would give the same values but costs SQLite a
temporary B-tree per statement: about 45,000 instructions, the CPU of a whole raw
transaction. The values are used only if the statement then returned without error
(it committed)."""


EFFECT_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS cl_effects (job_id TEXT NOT NULL, effect_id TEXT NOT NULL, "
    "generation INTEGER NOT NULL, PRIMARY KEY (job_id, effect_id)) WITHOUT ROWID",
    "CREATE TRIGGER IF NOT EXISTS cl_effects_purge AFTER DELETE ON cl_jobs BEGIN "
    "DELETE FROM cl_effects WHERE job_id = OLD.job_id; END",
)
"""The once-per-job effect records of ``lease.transaction()`` (:mod:`._transport_txn`),
and their deletion with their job (``purge``)."""

EFFECT_OBJECTS = frozenset({"cl_effects", "cl_effects_purge"})

SELECT_RECORD = (
    "SELECT j.job_id, j.owner, s.expires_at, j.generation, j.completed_at, j.result, "
    f"(s.expires_at > {NOW}), j.failed_at, j.attempt, j.error, "
    f"CASE WHEN j.not_before > {NOW} THEN j.not_before END, j.max_attempts, j.epoch, "
    "j.value FROM cl_jobs j LEFT JOIN cl_sessions s ON s.session_id = j.session_id"
)
"""A job's row as :func:`to_record` reads it (add the ``WHERE``)."""


def to_record(row: tuple[Any, ...], epoch_shift: int) -> LeaseRecord:
    """A row of :data:`SELECT_RECORD` as the record it is."""
    return record_of_row(row, epoch_shift)


def get_in(db: sqlite3.Connection, job_id: str, epoch_shift: int) -> LeaseRecord | None:
    """``job_id``'s record, read in the caller's transaction."""
    row = db.execute(SELECT_RECORD + " WHERE j.job_id = ?", (job_id,)).fetchone()
    return None if row is None else to_record(row, epoch_shift)


def alive(db: sqlite3.Connection, session_id: str) -> bool:
    """The session's row is there and not expired on the database's clock."""
    return bool(db.execute(f"SELECT {ALIVE}", (session_id,)).fetchone()[0] == 1)


# -- opening the file ---------------------------------------------------------------------

def prepare(backend: SqliteBackend, create: bool) -> None:
    """WAL mode, and the schema: created if missing (``create``), else refused."""
    db = backend._transport.db
    # Opening an existing store takes no write lock: another process may hold it
    # (even a paused one) and opening must not wait for it.
    with _transport.not_a_store_unless(create, backend.path):
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        definitions = dict(db.execute(
            "SELECT name, sql FROM sqlite_master WHERE type IN ('table', 'index', 'trigger')"
        ).fetchall())
        present = set(definitions)
    if not create and not STORE_TABLES.issubset(present):
        raise InvalidArgument(
            f"{backend.path!r} is not a consensus_lease store (no "
            f"{' or '.join(sorted(STORE_TABLES - present))} table) and create=false; "
            f"nothing was changed"
        )
    if backend.path != ":memory:" and str(mode).lower() != "wal":
        db.execute("PRAGMA journal_mode = WAL")
    # a writer that starts the WAL over truncates a larger file to the bound
    db.execute(f"PRAGMA journal_size_limit = {int(backend.wal_limit_bytes)}")
    transaction = backend._transport.transaction
    if not SCHEMA_OBJECTS.issubset(present):
        with transaction() as tx:
            for statement in filter(str.strip, SCHEMA.split(";")):
                tx.execute(statement)
            tx.execute(META_INSERT, (uuid.uuid4().hex,))
    _migrate(backend)
    if not QUEUE_OBJECTS.issubset(present):
        _add_queue_objects(backend)
    if not EFFECT_OBJECTS.issubset(present):
        with transaction() as tx:
            for statement in EFFECT_SCHEMA:
                tx.execute(statement)
    stale = [name for name, sql in PARTIAL_INDEXES.items()
             if _words(definitions.get(name)) != _words(sql)]
    if stale or not CLAIM_OBJECTS.issubset(present):
        _upgrade_indexes(backend, stale)
    identity, claims = db.execute(
        "SELECT identity, claims FROM cl_meta WHERE id = 1").fetchone()
    backend._history.baseline(str(identity), int(claims))
    _install_captures(backend)


def _install_captures(backend: SqliteBackend) -> None:
    """The functions and TEMP triggers by which statements of this connection hand over
    what they wrote (:data:`COMPLETED_CAPTURE`, :data:`CLAIM_CAPTURES`)."""
    db = backend._transport.db
    completed, claimed = backend._completed, backend._claimed
    db.create_function(CAPTURE_FUNCTION, 7, lambda *row: completed.append(row))
    db.create_function(CLAIMED_FUNCTION, 5, lambda *row: claimed.append(row))
    db.create_function(COUNTED_FUNCTION, 1, backend._counted.append)
    for statement in (COMPLETED_CAPTURE, *CLAIM_CAPTURES):
        db.execute(statement)


def _migrate(backend: SqliteBackend) -> None:
    """Add the columns and the ``cl_meta`` row a store written by an earlier version
    lacks (one transaction; nothing to do, and no write lock taken, if up to date)."""
    db = backend._transport.db
    columns = {row[1] for row in db.execute("PRAGMA table_info(cl_jobs)")}
    missing = [name for name in ADDED_COLUMNS if name not in columns]
    has_meta = db.execute("SELECT 1 FROM cl_meta WHERE id = 1").fetchone()
    if not missing and has_meta is not None:
        return
    with backend._transport.transaction() as tx:
        columns = {row[1] for row in tx.execute("PRAGMA table_info(cl_jobs)")}
        for name in missing:
            if name not in columns:
                tx.execute(f"ALTER TABLE cl_jobs ADD COLUMN {name} {ADDED_COLUMNS[name]}")
        tx.execute(META_INSERT, (uuid.uuid4().hex,))


def _add_queue_objects(backend: SqliteBackend) -> None:
    """Create :data:`QUEUE_SCHEMA`'s index, ``cl_queue_counts`` and its triggers,
    counting the jobs already there (a store written by an earlier version), in one
    transaction."""
    with backend._transport.transaction() as tx:
        had = tx.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'cl_queue_counts'").fetchone()
        for statement in QUEUE_SCHEMA:
            tx.execute(statement)
        if had is None:
            tx.execute(COUNTS_FILL)


def _upgrade_indexes(backend: SqliteBackend, stale: list[str]) -> None:
    """Rebuild the indexes of ``stale`` as :data:`PARTIAL_INDEXES` defines them (a
    store written by an earlier version) and add :data:`CLAIM_TRIGGERS`, in one
    transaction; an index another process rebuilt meanwhile is left alone."""
    with backend._transport.transaction() as tx:
        for name in stale:
            row = tx.execute("SELECT sql FROM sqlite_master WHERE name = ?",
                             (name,)).fetchone()
            if row is None or _words(row[0]) != _words(PARTIAL_INDEXES[name]):
                tx.execute(f"DROP INDEX IF EXISTS {name}")
                tx.execute(PARTIAL_INDEXES[name])
        for statement in CLAIM_TRIGGERS:
            tx.execute(statement)
