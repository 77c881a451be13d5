"""The embedded default: a SQLite file shared by worker processes on one machine.

``open_store("sqlite:///jobs.db")`` (relative path) or ``open_store("sqlite:////var/lib/jobs.db")``
(absolute: four slashes), the same convention as SQLAlchemy. No server to run.

How the protocol maps onto SQLite:

* A worker session is a row in ``cl_sessions`` with ``expires_at`` on the **database's
  clock**: every statement computes "now" inside SQL (``julianday('now')``), so a worker
  whose clock is wrong cannot extend or steal anything. One keepalive is one ``UPDATE``
  of that row, however many jobs the session holds.
* A job is a row in ``cl_jobs``: ``generation`` (the fencing token, +1 per claim),
  ``session_id`` of the holder, and the completion record (``completed_at``,
  ``completed_session``, ``result``). A job is held iff its session row is alive.
* Job lifecycle: ``attempt`` (+1 in the claim's own ``UPDATE``), ``max_attempts`` and
  ``attempt_base`` (moved to ``attempt`` by ``requeue``) are columns of the job row. A
  claim's ``WHERE`` refuses a job whose budget is used up, which the same transaction then
  marks FAILED (``failed_at``). ``fail()`` sets ``not_before = now + retry_in_s`` on the
  database clock, and every claim compares ``not_before <= now`` inside its statement,
  so the retry delay is the store's, never a worker's.
* Waiting claims (SQLite cannot notify another process: ``capabilities.store_watch`` is
  False): one thread per process reads which of the jobs and queues its claims wait for
  have become claimable (:meth:`SqliteBackend.claimable_hint`) and wakes just those. It
  reads every ``poll_interval_s`` (expiries and retry delays end without a write), at
  once after a change made by this process, and within about ``watch_interval_s``
  (5 ms) after another process's commit: while claims wait, a second thread reads
  ``PRAGMA data_version`` (no table read, no lock) 1 ms after a change, backing off to
  ``watch_interval_s`` while nothing changes (:mod:`._sqlite_watch`). Measured on a
  busy 2-core machine: graceful handover to a claim waiting in another process in about
  5 ms (p99 under 10 ms); the watch adds about 1.5-2 % of a core to a process whose
  claims wait on a quiet store, however many claims wait (100 claims: 2.5-3 % in all,
  1 % without the watch).
* The store epoch (``bump_epoch``) is the ``epoch`` of the one-row table ``cl_meta``.
  The claim statement reads it in a subquery and records it in the job row's ``epoch``
  column, and every token is ``epoch * 2**32 + generation`` (``epoch_shift`` 32):
  records, completions and errors report the same token later, and renew / complete /
  release / fail compare both parts. Epoch 0 leaves tokens as they always were; a file
  written by an earlier version gets ``cl_meta`` and the ``epoch`` column (default 0)
  on first open.
* Elections (``capabilities.elections``): an election key
  (:func:`consensus_lease._election.election_key`) is a row of ``cl_jobs`` like a job's,
  claimed, renewed and released by the same statements and left out of ``records()``;
  the leader's value is the row's ``value`` column, written by ``set_value`` under the
  same owner + generation compare and cleared by every statement that ends or takes the
  hold (an expired holder's value is not reported: a record shows it only while HELD).
  The poller also wakes subscribers of an election key when its holder or value changed.
* **Transactional fencing** (``capabilities.transactions``):
  :meth:`~consensus_lease.Lease.transaction` runs ``BEGIN IMMEDIATE`` on your own
  ``sqlite3`` connection to this file, checks the hold in it, and ``tx.once(effect_id)``
  inserts into ``cl_effects`` (key ``(job_id, effect_id)``, deleted with the job by a
  trigger) in that transaction: once per job across generations. The block holds the
  file's write lock: every other write waits for it (:mod:`._sqlite_txn`).
* A file restored from an older copy, replaced or wiped while workers run is noticed
  (``StoreRegressed`` for every session of the store) where the file shows it: see
  :mod:`consensus_lease.backends._sqlite_history` for what is and is not detected.
* Queues: ``queue_candidates`` reads the oldest open jobs through the partial index
  ``cl_jobs_open (queue, seq) WHERE completed_at IS NULL AND failed_at IS NULL AND queue
  IS NOT NULL``, so a
  claim costs the same at any depth and whatever number of COMPLETED or FAILED jobs
  (it skips only held jobs, and jobs in a retry delay, at the head). ``enqueue_many`` is one
  transaction per ``max_enqueue_batch`` (10,000) jobs, atomic; ``claim_many`` one
  transaction per ``max_batch_claim`` (1,000) jobs; ``complete_many`` one ``BEGIN
  IMMEDIATE`` transaction per ``max_complete_batch`` (1,000) completions, each by the
  statement ``complete`` runs with its own outcome; ``complete_and_claim_next`` one
  transaction: the completion, then the claim statement on the oldest claimable job of
  the queue (``fused_claim_next``). ``queue_stats`` is one statement:
  the per-queue counts of jobs, COMPLETED and FAILED ones in ``cl_queue_counts``, kept
  by triggers in the same statements that change them (an earlier version's writers
  keep them too; a file without the table gets it, counted once, on first open), plus
  the jobs of the live sessions (O(jobs held), not O(depth)).
* Capacity (``capabilities.max_queue_jobs`` is ``None``): no limit is enforced; a queue
  is bounded by the file's disk (about 100 bytes per job plus its payload and result,
  payloads up to ``max_payload_bytes``, 16 MiB). Claims and ``queue_stats`` stay flat
  with depth (measured to 100,000 open jobs); ``purge`` drops COMPLETED jobs.
* Every operation runs in one transaction whose ``UPDATE ... WHERE`` does the owner +
  generation comparison, so the check and the write are one atomic step (SQLite
  serialises writers: https://www.sqlite.org/lang_transaction.html). The file uses WAL
  mode and a busy timeout so processes wait for each other instead of failing.
* The claim+complete cycle is two statements, each its own (autocommit) transaction,
  which takes the write lock as it starts: the claim's upsert (:data:`CLAIM_SQL`: it
  also checks the session, the store's identity and its claim count, and the count goes
  +1 by trigger, :data:`CLAIM_TRIGGERS`) and the complete's ``UPDATE``. Neither has a
  ``RETURNING`` clause (SQLite builds a temporary B-tree for one, about as much CPU as a
  whole raw transaction): what they wrote is handed over, inside the statement, by TEMP
  triggers of the store's own connection (:data:`CLAIM_CAPTURES`,
  :data:`COMPLETED_CAPTURE`); renew and release are one statement too. Only a refused one opens a
  ``BEGIN IMMEDIATE`` transaction to find out why (and to retry a claim once). The
  secondary indexes are partial (:data:`PARTIAL_INDEXES`): a cycle writes 4 WAL pages
  (the job row's twice, its primary key's and ``cl_meta``'s once; a raw insert + update
  writes 3), a queue job's about 7 (also ``cl_jobs_by_session``, ``cl_jobs_open`` and
  ``cl_queue_counts``). Other operations take one ``BEGIN IMMEDIATE`` transaction each.
* The WAL stays under ``wal_limit_bytes`` (16 MiB) while no reader keeps an old snapshot
  open: ``PRAGMA journal_size_limit``, and a thread per store object that checks the
  ``-wal`` file's size every ``wal_interval_s`` and checkpoints (PASSIVE, then
  TRUNCATE) when it is above, never waiting for a lock. A read transaction left open
  (by any process) stops every checkpoint: the WAL then grows with each commit, a
  WARNING names its size and what to do, and the observer's
  :meth:`~consensus_lease.observe.Observer.wal_measured` reports it
  (:mod:`._sqlite_wal`).

Options (URL query string or keyword arguments of ``open_store``; keyword arguments win;
parsed as every backend's, see :mod:`consensus_lease.options`: an unknown name, a name
given twice in the query string or a value that is not a finite number of seconds > 0 is
``InvalidArgument``):

================  =======  ==========================================================
option            default  meaning
================  =======  ==========================================================
busy_timeout_s    5.0      how long an operation waits for the write lock (another
                           process's, or this process's other threads') before
                           ``BackendUnavailable``
poll_interval_s   0.05     waiting claims re-check at this interval (SQLite has no
                           watches: ``capabilities.store_watch`` is False); one read
                           per interval per process, however many claims wait
watch_interval_s  0.005    longest interval between two checks (``PRAGMA
                           data_version``) for another process's change while claims
                           of this process wait; larger costs less CPU when idle and
                           wakes later
create            true     create the file and the store's tables if missing. With
                           ``false`` a missing file, or one without the tables, is
                           ``InvalidArgument`` and nothing is created: the admin
                           commands (``inspect``, ``requeue``) open stores so, and a
                           typo in their URL is reported instead of creating an empty
                           store
wal_limit_bytes   16 MiB   bound of the ``-wal`` file, bytes (int >= 1 MiB): above it
                           the store checkpoints, and warns if a reader blocks that
wal_interval_s    1.0      seconds between two checks of the WAL's size (float >=
                           0.01; one ``os.stat``, a checkpoint only when above the
                           bound)
================  =======  ==========================================================

A locked, unreadable or corrupt file raises ``BackendUnavailable``, never a raw
``sqlite3`` error.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Any
from urllib.parse import quote

from .._election import ELECTION_PREFIX, ChangeTracker, is_election_key
from .._epoch import compose, next_epoch, split
from .._subscriptions import Unsubscribe, WakeCallback
from ..backend import (
    Backend,
    Capabilities,
    CompleteItem,
    OnceCheck,
    QueuePick,
    SessionHandle,
    StateListener,
)
from ..errors import (
    BackendUnavailable,
    InvalidArgument,
    JobCompleted,
    JobFailed,
    LeaseError,
    SessionExpired,
    StaleLeaseError,
    StoreRegressed,
)
from ..observe import notify
from ..options import Option, OptionTable
from ..record import ClaimResult, EnqueueItem, LeaseRecord, QueuedJob, QueueStats
from ._sql_row import record_of_row
from ._sqlite_history import (
    MARKER_CHECK,
    MARKER_EXISTS,
    MARKER_TABLE,
    MARKER_WRITE,
    SESSION_GC_S,
    History,
    marker_error,
)
from ._sqlite_txn import EFFECT_OBJECTS, EFFECT_SCHEMA, lease_transaction
from ._sqlite_wal import DEFAULT_LIMIT_BYTES, WalGuard
from ._sqlite_watch import ChangeWatch

__all__ = ["SqliteBackend"]

log = logging.getLogger("consensus_lease.sqlite")

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

QUEUE_PICK_TRIES = 32
"""Most jobs ``complete_and_claim_next`` tries in its transaction (each one it cannot
claim has used up its attempts and becomes FAILED) before it returns no next job."""

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
"""The claim count (``cl_meta.claims``, see :mod:`._sqlite_history`) goes +1 in the very
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

HISTORY_ROW = (
    f"SELECT identity, claims, epoch, {NOW}, "
    "(SELECT expires_at FROM cl_sessions WHERE session_id = ?) FROM cl_meta WHERE id = 1"
)
"""What the regression check compares (see :meth:`History.check`)."""

WATCH_MIN_S = 0.001
"""Seconds between two ``PRAGMA data_version`` reads right after a change was seen (the
schedule then doubles up to ``watch_interval_s``; see :mod:`._sqlite_watch`)."""

HINT_CHUNK = 500
"""Job ids per statement of :meth:`SqliteBackend.claimable_hint` (SQLite limits the
number of parameters of one statement)."""

NOT_ELECTION = f"substr(j.job_id, 1, {len(ELECTION_PREFIX)}) <> ?"
"""A ``cl_jobs j`` row that is a job, not an election (bind :data:`ELECTION_PREFIX`)."""

ALIVE_J = (
    f"EXISTS (SELECT 1 FROM cl_sessions s WHERE s.session_id = j.session_id "
    f"AND s.expires_at > {NOW})"
)
"""The holder of the ``cl_jobs j`` row is alive."""

ALIVE = f"EXISTS (SELECT 1 FROM cl_sessions s WHERE s.session_id = ? AND s.expires_at > {NOW})"

CLAIM_SQL = (
    "INSERT OR IGNORE INTO cl_jobs (job_id, generation, owner, session_id, attempt, epoch) "
    "VALUES (?, (SELECT 1 FROM cl_meta m WHERE m.id = 1 AND m.identity = ? "
    f"AND m.claims >= ? AND {ALIVE}), ?, ?, 1, (SELECT epoch FROM cl_meta WHERE id = 1)) "
    "ON CONFLICT (job_id) DO UPDATE SET generation = cl_jobs.generation + 1, "
    "attempt = cl_jobs.attempt + 1, not_before = NULL, epoch = excluded.epoch, "
    "owner = excluded.owner, session_id = excluded.session_id, value = NULL "
    "WHERE excluded.generation IS NOT NULL "
    "AND cl_jobs.completed_at IS NULL AND cl_jobs.failed_at IS NULL "
    f"AND NOT {EXHAUSTED} "
    f"AND (cl_jobs.not_before IS NULL OR cl_jobs.not_before <= {NOW}) "
    "AND NOT EXISTS (SELECT 1 FROM cl_sessions s "
    f"WHERE s.session_id = cl_jobs.session_id AND s.expires_at > {NOW})"
)
"""The claim: insert the job's row, or take it over if claimable (not completed, FAILED,
out of attempts, in a retry delay, nor held by a live session), with the store's epoch
and only if the claiming session is alive and ``cl_meta`` still has the identity and at
least the claim count this process saw (bind job id, identity, claims seen, session id,
owner, session id). Those store conditions make the new row's ``generation`` 1, or
``NULL`` if any fails: a ``NULL`` row is never inserted (``generation`` is ``NOT NULL``
and ``OR IGNORE`` skips the row; the table's only other constraints are ``NOT NULL``
ones, met by every claim, and the primary key, which the upsert handles) and never
takes a row over (``excluded.generation IS NOT NULL`` in the upsert's ``WHERE``). A
``VALUES`` row, not ``INSERT ... SELECT ... WHERE``: SQLite copies a ``SELECT``'s rows
through a temporary B-tree when the table has triggers (about 18,000 instructions per
claim). It changes one row iff it applied. The count goes +1 by trigger
(:data:`CLAIM_TRIGGERS`). No ``RETURNING`` (see :data:`COMPLETED_CAPTURE`): the row as
the claim wrote it (generation, attempt, epoch, the session's expiry) and the count
after it are handed over by :data:`CLAIM_CAPTURES`."""

CLAIMED_READ = (
    "SELECT j.job_id, j.generation, j.attempt, j.epoch, s.expires_at, m.claims "
    "FROM cl_jobs j JOIN cl_sessions s ON s.session_id = j.session_id "
    "JOIN cl_meta m ON m.id = 1 WHERE j.job_id = ? AND j.session_id = ?"
)
"""What a claim wrote, read back if :data:`CLAIM_CAPTURES` did not hand it over."""

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


COMPLETE_SQL = (
    f"UPDATE cl_jobs SET completed_at = {NOW}, completed_session = session_id, "
    "result = ?, session_id = NULL, value = NULL "
    "WHERE job_id = ? AND session_id = ? AND generation = ? AND epoch = ? "
    f"AND completed_at IS NULL AND {ALIVE}"
)
"""The complete: the owner + generation compare and the write in one statement (bind
result, job id, session id, generation, epoch, session id). No ``RETURNING``: what the
record needs from the row is handed over by :data:`COMPLETED_CAPTURE`."""

CAPTURE_FUNCTION = "cl_completed_row"

COMPLETED_CAPTURE = (
    "CREATE TEMP TRIGGER IF NOT EXISTS cl_completed_capture AFTER UPDATE OF completed_at "
    "ON main.cl_jobs WHEN OLD.completed_at IS NULL AND NEW.completed_at IS NOT NULL BEGIN "
    f"SELECT {CAPTURE_FUNCTION}(NEW.job_id, NEW.owner, NEW.completed_at, NEW.failed_at, "
    "NEW.attempt, NEW.error, NEW.max_attempts); END"
)
"""How :meth:`SqliteBackend.complete` learns the completed row: a trigger of this
connection only (``TEMP``: in its own temp schema, never in the file, so other processes
and other versions neither see nor run it) that passes the row, as the very statement
that completed it wrote it, to a function of this connection (``create_function``), in
that statement. A ``RETURNING`` clause would give the same values but costs SQLite a
temporary B-tree per statement: about 45,000 instructions, the CPU of a whole raw
transaction. The values are used only if the statement then returned without error
(it committed)."""


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
"""The options of ``sqlite://`` URLs (see the module docstring)."""


class SqliteBackend(Backend):
    """A lease store in one SQLite file. See the module docstring.

    Args:
        path: the database file, or ``":memory:"``.
        busy_timeout_s: seconds to wait for another writer.
        poll_interval_s: seconds between re-checks while waiting for a job.
        watch_interval_s: longest seconds between two ``PRAGMA data_version`` reads while
            claims wait (:mod:`._sqlite_watch`).
        create: create the file and the tables if missing; with ``False`` open only an
            existing store.
        wal_limit_bytes: the ``-wal`` file's bound in bytes (:mod:`._sqlite_wal`).
        wal_interval_s: seconds between two checks of the WAL's size.

    Raises:
        InvalidArgument: ``create`` is false and the file does not exist or holds no
            store; nothing was created.
        BackendUnavailable: the file cannot be opened, is not a database, or stays locked.
    """

    scheme = "sqlite"
    capabilities = Capabilities(
        cross_process=True,
        store_watch=False,
        consecutive_generations=True,
        min_ttl_s=0.05,
        max_ttl_s=7 * 24 * 3600.0,
        max_batch_claim=1000,
        max_complete_batch=1000,
        fused_claim_next=True,
        queues=True,
        max_payload_bytes=16 * 1024 * 1024,
        description="embedded SQLite file (one machine, many processes; waiting claims "
                    "woken within ~5 ms by a data_version watch)",
        epoch=True,
        regression_refusal=True,
        elections=True,
        max_enqueue_batch=10_000,
        max_queue_jobs=None,
        transactions=True,
    )

    def __init__(
        self, path: str, *, busy_timeout_s: float = 5.0, poll_interval_s: float = 0.05,
        create: bool = True, watch_interval_s: float = 0.005,
        wal_limit_bytes: int = DEFAULT_LIMIT_BYTES, wal_interval_s: float = 1.0,
    ) -> None:
        self.path = path
        self.wal_limit_bytes = wal_limit_bytes
        self._wal: WalGuard | None = None  # started once the file is prepared
        self.poll_interval_s = poll_interval_s
        self._watch = None if path in ("", ":memory:") else ChangeWatch(
            path, self.wake_subscribers, self._claims_wait, min_interval_s=WATCH_MIN_S,
            max_interval_s=watch_interval_s, busy_timeout_s=busy_timeout_s,
        )
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._history = History(path)
        self._elections = ChangeTracker()
        self._completed: list[tuple[Any, ...]] = []  # rows COMPLETED_CAPTURE handed over
        self._claimed: list[tuple[Any, ...]] = []  # and CLAIM_CAPTURES
        self._counted: list[int] = []
        create = create or path == ":memory:"
        self._db = self._connect(path, busy_timeout_s, create)
        self._busy_ms = int(busy_timeout_s * 1000)  # the connection's busy_timeout now
        try:
            with self._translate():
                self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
                self._prepare(create)
        except BaseException:
            self.close()
            raise
        if path not in ("", ":memory:"):
            self._wal = WalGuard(path, limit_bytes=wal_limit_bytes,
                                 interval_s=wal_interval_s, report=self._wal_measured)
            self._wal.start()

    def _wal_measured(self, wal_bytes: int, blocked: bool) -> None:
        """A WAL check's result, to the store's observer (:mod:`._sqlite_wal`)."""
        notify(self.observer, lambda o: o.wal_measured(self.scheme, self.path, wal_bytes,
                                                        blocked))

    @staticmethod
    def _connect(path: str, busy_timeout_s: float, create: bool) -> sqlite3.Connection:
        """Open the file; without ``create`` only if it exists (``mode=rw``: SQLite
        itself refuses to create it, so a file deleted meanwhile is not made either)."""
        target, uri = path, False
        if not create:
            if not os.path.isfile(path):
                raise InvalidArgument(
                    f"no SQLite store at {path!r} ({os.path.abspath(path)}): the file does "
                    f"not exist and create=false; check the URL (sqlite:////abs/path.db, "
                    f"sqlite:///relative.db), or open it with create=true"
                )
            target, uri = f"file:{quote(os.path.abspath(path))}?mode=rw", True
        try:
            return sqlite3.connect(target, timeout=busy_timeout_s, isolation_level=None,
                                   check_same_thread=False, uri=uri)
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot open SQLite database {path!r}: {exc}") from exc

    def _prepare(self, create: bool) -> None:
        """WAL mode, and the schema: created if missing (``create``), else refused."""
        # Opening an existing store takes no write lock: another process may hold it
        # (even a paused one) and opening must not wait for it.
        try:
            mode = self._db.execute("PRAGMA journal_mode").fetchone()[0]
            definitions = dict(self._db.execute(
                "SELECT name, sql FROM sqlite_master WHERE type IN ('table', 'index', 'trigger')"
            ).fetchall())
            present = set(definitions)
        except sqlite3.DatabaseError as exc:
            if create:
                raise
            raise InvalidArgument(
                f"{self.path!r} is not a consensus_lease store ({exc}) and create=false; "
                f"nothing was changed"
            ) from exc
        if not create and not STORE_TABLES.issubset(present):
            raise InvalidArgument(
                f"{self.path!r} is not a consensus_lease store (no "
                f"{' or '.join(sorted(STORE_TABLES - present))} table) and create=false; "
                f"nothing was changed"
            )
        if self.path != ":memory:" and str(mode).lower() != "wal":
            self._db.execute("PRAGMA journal_mode = WAL")
        # a writer that starts the WAL over truncates a larger file to the bound
        self._db.execute(f"PRAGMA journal_size_limit = {int(self.wal_limit_bytes)}")
        if not SCHEMA_OBJECTS.issubset(present):
            with self._transaction() as db:
                for statement in filter(str.strip, SCHEMA.split(";")):
                    db.execute(statement)
                db.execute(META_INSERT, (uuid.uuid4().hex,))
        self._migrate()
        if not QUEUE_OBJECTS.issubset(present):
            self._add_queue_objects()
        if not EFFECT_OBJECTS.issubset(present):
            with self._transaction() as db:
                for statement in EFFECT_SCHEMA:
                    db.execute(statement)
        stale = [name for name, sql in PARTIAL_INDEXES.items()
                 if _words(definitions.get(name)) != _words(sql)]
        if stale or not CLAIM_OBJECTS.issubset(present):
            self._upgrade_indexes(stale)
        identity, claims = self._db.execute(
            "SELECT identity, claims FROM cl_meta WHERE id = 1").fetchone()
        self._history.baseline(str(identity), int(claims))
        completed, claimed = self._completed, self._claimed
        self._db.create_function(CAPTURE_FUNCTION, 7, lambda *row: completed.append(row))
        self._db.create_function(CLAIMED_FUNCTION, 5, lambda *row: claimed.append(row))
        self._db.create_function(COUNTED_FUNCTION, 1, self._counted.append)
        for statement in (COMPLETED_CAPTURE, *CLAIM_CAPTURES):
            self._db.execute(statement)

    def _migrate(self) -> None:
        """Add the columns and the ``cl_meta`` row a store written by an earlier version
        lacks (one transaction; nothing to do, and no write lock taken, if up to date)."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(cl_jobs)")}
        missing = [name for name in ADDED_COLUMNS if name not in columns]
        has_meta = self._db.execute("SELECT 1 FROM cl_meta WHERE id = 1").fetchone()
        if not missing and has_meta is not None:
            return
        with self._transaction() as db:
            columns = {row[1] for row in db.execute("PRAGMA table_info(cl_jobs)")}
            for name in missing:
                if name not in columns:
                    db.execute(f"ALTER TABLE cl_jobs ADD COLUMN {name} {ADDED_COLUMNS[name]}")
            db.execute(META_INSERT, (uuid.uuid4().hex,))

    def _add_queue_objects(self) -> None:
        """Create :data:`QUEUE_SCHEMA`'s index, ``cl_queue_counts`` and its triggers,
        counting the jobs already there (a store written by an earlier version), in one
        transaction."""
        with self._transaction() as db:
            had = db.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'cl_queue_counts'").fetchone()
            for statement in QUEUE_SCHEMA:
                db.execute(statement)
            if had is None:
                db.execute(COUNTS_FILL)

    def _upgrade_indexes(self, stale: list[str]) -> None:
        """Rebuild the indexes of ``stale`` as :data:`PARTIAL_INDEXES` defines them (a
        store written by an earlier version) and add :data:`CLAIM_TRIGGERS`, in one
        transaction; an index another process rebuilt meanwhile is left alone."""
        with self._transaction() as db:
            for name in stale:
                row = db.execute("SELECT sql FROM sqlite_master WHERE name = ?",
                                 (name,)).fetchone()
                if row is None or _words(row[0]) != _words(PARTIAL_INDEXES[name]):
                    db.execute(f"DROP INDEX IF EXISTS {name}")
                    db.execute(PARTIAL_INDEXES[name])
            for statement in CLAIM_TRIGGERS:
                db.execute(statement)

    @classmethod
    def from_url(cls, url: str, options: Mapping[str, object]) -> SqliteBackend:
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
        return cls(
            path,
            busy_timeout_s=parsed.seconds("busy_timeout_s"),
            poll_interval_s=parsed.seconds("poll_interval_s"),
            watch_interval_s=parsed.seconds("watch_interval_s"),
            create=parsed.flag("create"),
            wal_limit_bytes=parsed.integer("wal_limit_bytes"),
            wal_interval_s=parsed.seconds("wal_interval_s"),
        )

    # -- plumbing --------------------------------------------------------------------

    def _unavailable(self, exc: sqlite3.DatabaseError, job_id: str | None) -> BackendUnavailable:
        what = "unavailable" if isinstance(exc, sqlite3.OperationalError) else "unusable"
        return BackendUnavailable(f"SQLite database {self.path!r} {what}: {exc}", job_id=job_id)

    @contextmanager
    def _translate(self, job_id: str | None = None) -> Iterator[None]:
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise self._unavailable(exc, job_id) from exc

    def _acquire(self, job_id: str | None) -> None:
        """This process's turn on the connection, within one ``busy_timeout_s`` budget:
        waiting for the other threads of this process, then (SQLite's busy timeout, set
        to what is left) for other processes' locks. The caller releases ``_lock``."""
        full_ms = int(self.busy_timeout_s * 1000)
        if self._lock.acquire(blocking=False):  # no other thread: the whole budget
            left_ms = full_ms
        else:
            deadline = time.monotonic() + self.busy_timeout_s
            if not self._lock.acquire(timeout=self.busy_timeout_s):
                raise BackendUnavailable(
                    f"SQLite database {self.path!r}: other threads of this process kept it "
                    f"busy for busy_timeout_s ({self.busy_timeout_s:g} s)", job_id=job_id,
                )
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
        if abs(left_ms - self._busy_ms) > 50:  # waited for a thread: less is left
            try:
                self._db.execute(f"PRAGMA busy_timeout = {left_ms}")
            except sqlite3.DatabaseError as exc:
                self._lock.release()
                raise self._unavailable(exc, job_id) from exc
            self._busy_ms = left_ms

    @contextmanager
    def _turn(self, job_id: str | None = None) -> Iterator[None]:
        """:meth:`_acquire` for a ``with`` block (sqlite3 errors in it translated)."""
        self._acquire(job_id)
        try:
            with self._translate(job_id):
                yield
        finally:
            self._lock.release()

    @contextmanager
    def _transaction(
        self, job_id: str | None = None, *, check_file: bool = False
    ) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: takes the write lock up front, so the
        compare and the write below cannot interleave with another process. With
        ``check_file``, first StoreRegressed if the path now names another file."""
        with self._turn(job_id), self._translate(job_id):
            if check_file:
                self._history.check_file()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except StoreRegressed:
                self._db.execute("ROLLBACK")
                self._mark_regressed()
                raise
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _mark_regressed(self) -> None:
        """Write the regression marker (``_lock`` held, outside a transaction) if this
        process noticed a regression and has not written it (:mod:`._sqlite_history`).
        Best effort: the refusal here does not depend on it."""
        noticed = self._history.to_mark()
        if noticed is None:
            return
        why, epoch = noticed
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(MARKER_TABLE)
                self._db.execute(MARKER_WRITE, (why, epoch))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            log.warning("SQLite store %r: writing the regression marker failed (%s); "
                        "processes opened later may not refuse sessions", self.path, exc)
            return
        self._history.marked()

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._turn(), self._translate():
            return self._db.execute(sql, params).fetchall()

    def _write(
        self, sql: str, params: tuple[Any, ...], job_id: str | None = None
    ) -> list[tuple[Any, ...]]:
        """One writing statement as its own transaction (SQLite's autocommit: the write
        lock is taken when it starts, waiting up to the busy timeout, and it commits when
        it has returned every row). For a compare-and-write whose ``WHERE`` is the whole
        check: no ``BEGIN``/``COMMIT`` round trips. Never inside :meth:`_transaction`."""
        self._acquire(job_id)  # no context managers on the hot path: each costs µs
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._unavailable(exc, job_id) from exc
        finally:
            self._lock.release()

    @staticmethod
    def _alive(db: sqlite3.Connection, session_id: str) -> bool:
        return bool(db.execute(f"SELECT {ALIVE}", (session_id,)).fetchone()[0] == 1)

    def _reject(
        self, db: sqlite3.Connection, session: SessionHandle, job_id: str, generation: int
    ) -> Exception:
        """Explain why an owner+generation compare failed (inside the same transaction):
        ``SessionExpired`` while the job is still at ``generation`` with no other holder
        and the session is over (expired, or closed: ``close_session`` clears a queued
        job's holder), else ``StaleLeaseError`` (see
        :meth:`consensus_lease.backend.Backend.complete`)."""
        row = db.execute(
            "SELECT generation, session_id, completed_at, epoch FROM cl_jobs WHERE job_id = ?",
            (job_id,),
        ).fetchone()
        current = None if row is None else compose(int(row[3]), int(row[0]), self.epoch_shift)
        if (
            row is not None
            and current == generation
            and row[1] in (session.session_id, None)
            and row[2] is None
            and not self._alive(db, session.session_id)
        ):
            return SessionExpired(
                    f"session {session.session_id} expired in the store",
                    job_id=job_id,
                    generation=generation,
                )
        what = "completed" if row is not None and row[2] is not None else "held or released"
        return StaleLeaseError(
            f"{job_id!r} is not held by session {session.session_id} at generation "
            f"{generation}: the store has generation {current} ({what})",
            job_id=job_id,
            generation=generation,
            current_generation=current,
        )

    # -- sessions --------------------------------------------------------------------

    def open_session(
        self, owner: str, ttl_s: float, on_event: StateListener | None = None
    ) -> SessionHandle:
        session_id = uuid.uuid4().hex
        with self._transaction(check_file=True) as db:
            self._history.check(db.execute(HISTORY_ROW, (None,)).fetchone(), None)
            exists = db.execute(MARKER_EXISTS).fetchone() is not None
            marker = db.execute(MARKER_CHECK).fetchone() if exists else None
            if marker is not None:  # another process noticed; no bump since
                raise marker_error(self.path, str(marker[0]))
            # Sessions expired a minute ago hold nothing any more: drop their rows.
            db.execute(f"DELETE FROM cl_sessions WHERE expires_at < {NOW} - {SESSION_GC_S}")
            expires_at = db.execute(
                f"INSERT INTO cl_sessions VALUES (?, ?, ?, {NOW} + ?) RETURNING expires_at",
                (session_id, owner, ttl_s, ttl_s),
            ).fetchone()[0]
            self._history.note_session(session_id, float(expires_at))
        return SessionHandle(session_id, owner, ttl_s)

    def keepalive(self, session: SessionHandle) -> float:
        """Extend the session (see :meth:`Backend.keepalive`), first checking that the
        store did not go back (:mod:`._sqlite_history`).

        Raises:
            StoreRegressed: the file was restored from an older copy, replaced or wiped.
            SessionExpired / BackendUnavailable.
        """
        sid = session.session_id
        with self._transaction(check_file=True) as db:
            self._history.check(db.execute(HISTORY_ROW, (sid,)).fetchone(), sid)
            row = db.execute(
                f"UPDATE cl_sessions SET expires_at = {NOW} + ttl_s "
                f"WHERE session_id = ? AND expires_at > {NOW} RETURNING ttl_s, expires_at",
                (sid,),
            ).fetchone()
            if row is None:
                self._history.forget_session(sid)
            else:
                self._history.note_session(sid, float(row[1]))
        if row is None:
            raise SessionExpired(f"session {sid} expired in the store")
        return float(row[0])

    def close_session(self, session: SessionHandle) -> None:
        with self._lock:
            self._history.forget_session(session.session_id)
        with self._transaction() as db:
            db.execute("DELETE FROM cl_sessions WHERE session_id = ?", (session.session_id,))
            # Its other jobs (and election keys) keep the id of a session that is no more,
            # as an expired session's do: no index to find them by (PARTIAL_INDEXES).
            db.execute(
                "UPDATE cl_jobs SET session_id = NULL, value = NULL WHERE session_id = ? "
                "AND queue IS NOT NULL", (session.session_id,),
            )
        self.wake_subscribers()

    def expire_session(self, session_id: str) -> None:
        """Test hook: make the store expire a session now, as its TTL running out would."""
        with self._transaction() as db:
            db.execute(
                f"UPDATE cl_sessions SET expires_at = {NOW} - 0.001 WHERE session_id = ?",
                (session_id,),
            )
        self.wake_subscribers()

    # -- jobs ------------------------------------------------------------------------

    def claim(self, session: SessionHandle, job_id: str) -> ClaimResult | None:
        """Claim ``job_id`` (see :meth:`Backend.claim`); the token carries the store's
        epoch, read in the claim statement itself.

        A claim that applies is one statement (its own transaction): the upsert whose
        ``WHERE`` checks that the session is alive and the store is the one this process
        saw (identity, claim count not below the last seen), raises the claim count by
        trigger and returns the new count. Only a claim it refuses takes the diagnosing
        ``BEGIN IMMEDIATE`` transaction, which tries once more and tells why.

        Raises:
            StoreRegressed: the store went back (:mod:`._sqlite_history`); nothing claimed.
            JobCompleted / JobFailed / SessionExpired / BackendUnavailable.
        """
        claimed = self._claim_alone(session, job_id)
        if claimed is None:
            with self._transaction(job_id, check_file=True) as db:
                self._claim_checks(db, session, job_id)
                claimed = self._claim_one(db, session, job_id)
                refusal = None if claimed else self._refusal(db, job_id)  # after COMMIT
                if claimed is not None:
                    self._count_claims(db)
            if refusal is not None:
                raise refusal
        if claimed is not None and is_election_key(job_id):
            self.wake_subscribers()  # this process's observers learn the new leader now
        return claimed

    def claim_many(
        self, session: SessionHandle, job_ids: Sequence[str]
    ) -> list[ClaimResult | None]:
        """Claim each of ``job_ids`` (at most ``capabilities.max_batch_claim``) in one
        ``BEGIN IMMEDIATE`` transaction, each by the statement :meth:`claim` runs: same
        generation, attempt, epoch and exhausted-budget rules; a completed or FAILED job
        yields ``None`` (a job whose attempts are used up is marked FAILED, as by
        ``claim``).

        Raises:
            StoreRegressed: the store went back; nothing of the batch is claimed.
            SessionExpired / BackendUnavailable: nothing of the batch is claimed.
        """
        if not job_ids:
            return []
        with self._transaction(job_ids[0], check_file=True) as db:
            self._claim_checks(db, session, job_ids[0])
            results: list[ClaimResult | None] = []
            for job_id in job_ids:
                claimed = self._claim_one(db, session, job_id)
                if claimed is None:
                    self._refusal(db, job_id)  # marks a used-up job FAILED, as claim does
                results.append(claimed)
            if any(r is not None for r in results):
                self._count_claims(db)
        if any(r is not None and is_election_key(j) for j, r in zip(job_ids, results, strict=True)):
            self.wake_subscribers()
        return results

    def _claim_alone(self, session: SessionHandle, job_id: str) -> ClaimResult | None:
        """The claim statement as a transaction of its own; ``None`` if it applied
        nothing (or cannot be used: a regressed store)."""
        self._acquire(job_id)
        try:
            self._history.check_file()
            if self._history.regressed:
                return None
            claimed = self._run_claim(self._db, session, job_id)
            if claimed is None:
                return None
            result, count = claimed
            # the WHERE compared identity and count: this notes the count, never raises
            self._history.claimed(self._history.identity, count,
                                  split(result.generation, self.epoch_shift)[0])
            return result
        except sqlite3.DatabaseError as exc:
            raise self._unavailable(exc, job_id) from exc
        finally:
            self._lock.release()

    def _run_claim(
        self, db: sqlite3.Connection, session: SessionHandle, job_id: str
    ) -> tuple[ClaimResult, int] | None:
        """Run :data:`CLAIM_SQL` (``_lock`` held): ``None`` if it applied nothing, else
        the claim as the statement wrote it and the claim count after it."""
        claimed, counted = self._claimed, self._counted
        claimed.clear()
        counted.clear()
        try:
            applied = db.execute(CLAIM_SQL, self._claim_params(session, job_id)).rowcount == 1
            row = claimed[-1] if claimed else None
            count = counted[-1] if counted else None
        finally:
            claimed.clear()
            counted.clear()
        if not applied:
            return None
        if row is None or row[0] != job_id or count is None:
            # not handed over (the triggers always run): read back what was claimed
            row = db.execute(CLAIMED_READ, (job_id, session.session_id)).fetchone()
            if row is None:
                raise sqlite3.DatabaseError(f"the claim of {job_id!r} applied but its row "
                                            "is no longer this session's")
            count = row[5]
        return self._to_claim(row[1:5]), int(count)

    def _claim_checks(self, db: sqlite3.Connection, session: SessionHandle, job_id: str) -> None:
        """Before a claim, in its transaction: StoreRegressed if the store went back and
        was not bumped since, SessionExpired if the session is not alive in the store."""
        self._history.check(db.execute(HISTORY_ROW, (None,)).fetchone(), None)
        if not self._alive(db, session.session_id):
            raise SessionExpired(
                f"session {session.session_id} expired in the store", job_id=job_id
            )

    def _claim_params(self, session: SessionHandle, job_id: str) -> tuple[Any, ...]:
        return (job_id, self._history.identity, self._history.claims_seen,
                session.session_id, session.owner, session.session_id)

    def _claim_one(
        self, db: sqlite3.Connection, session: SessionHandle, job_id: str
    ) -> ClaimResult | None:
        """The claim statement in a transaction (the claim count is read after it, by
        :meth:`_count_claims`)."""
        claimed = self._run_claim(db, session, job_id)
        return None if claimed is None else claimed[0]

    def _to_claim(self, row: tuple[Any, ...]) -> ClaimResult:
        """``row`` is ``(generation, attempt, epoch, the session's expires_at)``."""
        token = compose(int(row[2]), int(row[0]), self.epoch_shift)
        return ClaimResult(token, float(row[3]), int(row[1]))

    def _count_claims(self, db: sqlite3.Connection) -> None:
        """After claims in this transaction (each raised ``cl_meta.claims`` by trigger):
        note the count; StoreRegressed if the store went back (rolls the claims back)."""
        meta = db.execute("SELECT identity, claims, epoch FROM cl_meta WHERE id = 1").fetchone()
        if meta is None:
            self._history.check(None, None)
        else:
            self._history.claimed(str(meta[0]), int(meta[1]), int(meta[2]))

    def _refusal(self, db: sqlite3.Connection, job_id: str) -> LeaseError | None:
        """After a claim did not apply: JobCompleted / JobFailed if that is why (else
        ``None``); moves a job whose attempts are used up, and which nobody holds, to
        FAILED first."""
        db.execute(
            f"UPDATE cl_jobs SET failed_at = {NOW}, session_id = NULL, error = coalesce(error, "
            "'attempts exhausted: attempt ' || attempt || ' ended without completion') "
            f"WHERE job_id = ? AND completed_at IS NULL AND failed_at IS NULL AND {EXHAUSTED} "
            "AND NOT EXISTS (SELECT 1 FROM cl_sessions s "
            f"WHERE s.session_id = cl_jobs.session_id AND s.expires_at > {NOW})",
            (job_id,),
        )
        row = db.execute(
            "SELECT generation, completed_at, failed_at, attempt, error, epoch FROM cl_jobs "
            "WHERE job_id = ?", (job_id,),
        ).fetchone()
        if row is None:
            return None
        local, completed_at, failed_at, attempt, error, epoch = row
        generation = compose(int(epoch), int(local), self.epoch_shift)
        if completed_at is not None:
            return JobCompleted(
                f"{job_id!r} was completed at generation {generation}",
                job_id=job_id, generation=int(generation),
            )
        if failed_at is not None:
            return JobFailed(
                f"{job_id!r} FAILED after {attempt} attempt(s): {error}",
                job_id=job_id, generation=int(generation), attempt=int(attempt), error=error,
            )
        return None

    def renew(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> float:
        generation = claim.generation
        epoch, local = split(generation, self.epoch_shift)
        rows = self._write(
            f"UPDATE cl_sessions SET expires_at = {NOW} + ttl_s "
            f"WHERE session_id = ? AND expires_at > {NOW} AND EXISTS (SELECT 1 FROM cl_jobs j "
            "WHERE j.job_id = ? AND j.session_id = ? AND j.generation = ? AND j.epoch = ? "
            "AND j.completed_at IS NULL) RETURNING ttl_s",
            (session.session_id, job_id, session.session_id, local, epoch), job_id,
        )
        if not rows:
            with self._transaction(job_id) as db:
                raise self._reject(db, session, job_id, generation)
        return float(rows[0][0])

    def complete(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes
    ) -> LeaseRecord:
        """Complete the job (see :meth:`Backend.complete`): one ``UPDATE`` (its own
        transaction) whose ``WHERE`` makes the owner + generation compare; the record is
        the row that statement wrote, handed over by :data:`COMPLETED_CAPTURE`. Only a
        refused one reads back, in a transaction, whether this session completed it
        already (idempotent) or why not.

        Raises:
            StaleLeaseError / SessionExpired / BackendUnavailable.
        """
        generation = claim.generation
        epoch, local = split(generation, self.epoch_shift)
        captured = self._completed
        self._acquire(job_id)  # as _write does, the row handed over by the trigger kept
        try:
            captured.clear()
            applied = self._db.execute(
                COMPLETE_SQL,
                (result, job_id, session.session_id, local, epoch, session.session_id),
            ).rowcount == 1
            row = captured[0] if applied and len(captured) == 1 else None
            captured.clear()
        except sqlite3.DatabaseError as exc:
            captured.clear()
            raise self._unavailable(exc, job_id) from exc
        finally:
            self._lock.release()
        if row is not None and row[0] == job_id:
            _, owner, completed_at, failed_at, attempt, error, max_attempts = row
            record = self._to_record((job_id, owner, None, local, completed_at, result, 0,
                                      failed_at, attempt, error, None, max_attempts, epoch,
                                      None))
        elif applied:  # completed, but its row was not handed over: read it back
            found = self.get(job_id)
            assert found is not None
            record = found
        else:
            with self._transaction(job_id) as db:
                again = db.execute(
                    "SELECT 1 FROM cl_jobs WHERE job_id = ? AND generation = ? AND epoch = ? "
                    "AND completed_session = ?",
                    (job_id, local, epoch, session.session_id),
                ).fetchone()
                if again is None:
                    raise self._reject(db, session, job_id, generation)
                found = self._get(db, job_id)
            assert found is not None
            record = found
        self.wake_subscribers()
        return record

    def _complete_in(
        self, db: sqlite3.Connection, session: SessionHandle, job_id: str,
        claim: ClaimResult, result: bytes,
    ) -> LeaseRecord | LeaseError:
        """:data:`COMPLETE_SQL` for one job inside an open transaction: the COMPLETED
        record (also for a repeat of this session's completion), or the refusal
        :meth:`Backend.complete` would raise, returned."""
        epoch, local = split(claim.generation, self.epoch_shift)
        try:
            applied = db.execute(
                COMPLETE_SQL,
                (result, job_id, session.session_id, local, epoch, session.session_id),
            ).rowcount == 1
        finally:
            self._completed.clear()  # the row handed over is read back below instead
        if not applied:
            again = db.execute(
                "SELECT 1 FROM cl_jobs WHERE job_id = ? AND generation = ? AND epoch = ? "
                "AND completed_session = ?",
                (job_id, local, epoch, session.session_id),
            ).fetchone()
            if again is None:
                refusal = self._reject(db, session, job_id, claim.generation)
                assert isinstance(refusal, LeaseError)
                return refusal
        found = self._get(db, job_id)
        assert found is not None
        return found

    def complete_many(
        self, session: SessionHandle, items: Sequence[CompleteItem]
    ) -> list[LeaseRecord | LeaseError]:
        """Every item by the statement :meth:`complete` runs, in one ``BEGIN
        IMMEDIATE`` transaction (at most ``max_complete_batch`` items): each its own
        outcome, all committed at once.

        Raises:
            BackendUnavailable: nothing of the batch applied (the transaction rolled back).
        """
        if not items:
            return []
        with self._transaction(items[0][0]) as db:
            outcomes = [self._complete_in(db, session, job_id, claim, result)
                        for job_id, claim, result in items]
        self.wake_subscribers()
        return outcomes

    def complete_and_claim_next(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes,
        queue: str,
    ) -> tuple[LeaseRecord, QueuePick | None]:
        """The completion of :meth:`complete` and the claim of the oldest claimable job of
        ``queue`` (the statement :meth:`claim` runs, with its generation, attempt, epoch
        and exhausted-budget rules), in one ``BEGIN IMMEDIATE`` transaction: a refused
        completion rolls everything back; no claimable job leaves the completion alone.

        Raises:
            StaleLeaseError / SessionExpired: the completion was refused; nothing changed.
            StoreRegressed: the store went back; nothing changed.
            BackendUnavailable: nothing applied.
        """
        picked: QueuePick | None = None
        with self._transaction(job_id, check_file=True) as db:
            record = self._complete_in(db, session, job_id, claim, result)
            if not isinstance(record, LeaseRecord):
                raise record
            self._history.check(db.execute(HISTORY_ROW, (None,)).fetchone(), None)
            tries = QUEUE_PICK_TRIES if self._alive(db, session.session_id) else 0
            for _ in range(tries):
                row = db.execute(
                    "SELECT j.job_id, j.payload FROM cl_jobs j INDEXED BY cl_jobs_open "
                    "WHERE j.queue = ? AND j.completed_at IS NULL AND j.failed_at IS NULL "
                    f"AND (j.not_before IS NULL OR j.not_before <= {NOW}) "
                    "AND NOT EXISTS (SELECT 1 FROM cl_sessions s "
                    f"WHERE s.session_id = j.session_id AND s.expires_at > {NOW}) "
                    "ORDER BY j.seq LIMIT 1",
                    (queue,),
                ).fetchone()
                if row is None:
                    break
                got = self._claim_one(db, session, row[0])
                if got is not None:
                    picked = (row[0], got, bytes(row[1] or b""))
                    self._count_claims(db)
                    break
                self._refusal(db, row[0])  # a used-up job becomes FAILED: the next one
        self.wake_subscribers()
        return record, picked

    def release(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> None:
        generation = claim.generation
        epoch, local = split(generation, self.epoch_shift)
        rows = self._write(
            "UPDATE cl_jobs SET session_id = NULL, owner = NULL, value = NULL "
            "WHERE job_id = ? AND session_id = ? AND generation = ? AND epoch = ? "
            f"AND completed_at IS NULL AND {ALIVE} RETURNING 1",
            (job_id, session.session_id, local, epoch, session.session_id), job_id,
        )
        if not rows:
            with self._transaction(job_id) as db:
                raise self._reject(db, session, job_id, generation)
        self.wake_subscribers()

    def set_value(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, value: bytes
    ) -> None:
        """Write an election leader's value (see :meth:`Backend.set_value`): one
        ``UPDATE`` whose ``WHERE`` makes the owner + generation compare of ``release``.

        Raises:
            StaleLeaseError / SessionExpired / BackendUnavailable.
        """
        epoch, local = split(claim.generation, self.epoch_shift)
        with self._transaction(job_id) as db:
            row = db.execute(
                "UPDATE cl_jobs SET value = ? "
                "WHERE job_id = ? AND session_id = ? AND generation = ? AND epoch = ? "
                f"AND completed_at IS NULL AND {ALIVE} RETURNING 1",
                (value, job_id, session.session_id, local, epoch, session.session_id),
            ).fetchone()
            if row is None:
                raise self._reject(db, session, job_id, claim.generation)
        self.wake_subscribers()

    def fail(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, error: str,
        retry_in_s: float,
    ) -> LeaseRecord:
        generation = claim.generation
        epoch, local = split(generation, self.epoch_shift)
        with self._transaction(job_id) as db:
            row = db.execute(
                f"UPDATE cl_jobs SET session_id = NULL, value = NULL, error = ?, "
                f"failed_at = CASE WHEN {EXHAUSTED} THEN {NOW} END, "
                f"not_before = CASE WHEN NOT {EXHAUSTED} AND ? > 0 THEN {NOW} + ? END "
                "WHERE job_id = ? AND session_id = ? AND generation = ? AND epoch = ? "
                f"AND completed_at IS NULL AND {ALIVE} RETURNING 1",
                (error, retry_in_s, retry_in_s, job_id, session.session_id, local, epoch,
                 session.session_id),
            ).fetchone()
            if row is None:
                raise self._reject(db, session, job_id, generation)
            record = self._get(db, job_id)
        assert record is not None
        self.wake_subscribers()
        return record

    def requeue(self, job_id: str) -> LeaseRecord:
        with self._transaction(job_id) as db:
            row = db.execute(
                "UPDATE cl_jobs SET failed_at = NULL, not_before = NULL, attempt_base = attempt "
                "WHERE job_id = ? AND failed_at IS NOT NULL RETURNING 1",
                (job_id,),
            ).fetchone()
            record = self._get(db, job_id)
        if row is None or record is None:
            state = "unknown" if record is None else record.state.value
            raise InvalidArgument(
                f"only a FAILED job can be requeued; {job_id!r} is {state}", job_id=job_id
            )
        self.wake_subscribers()
        return record

    # -- work queues -------------------------------------------------------------------

    def enqueue(
        self, queue: str, job_id: str, payload: bytes, max_attempts: int | None = None
    ) -> bool:
        with self._transaction(job_id) as db:
            row = db.execute("SELECT queue FROM cl_jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is not None:
                if row[0] != queue:
                    raise InvalidArgument(
                        f"{job_id!r} already exists outside queue {queue!r}", job_id=job_id
                    )
                return False
            seq = db.execute(
                "INSERT INTO cl_seq VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET last = last + 1 "
                "RETURNING last"
            ).fetchone()[0]
            db.execute(
                "INSERT INTO cl_jobs (job_id, generation, queue, payload, seq, max_attempts) "
                "VALUES (?, 0, ?, ?, ?, ?)",
                (job_id, queue, payload, seq, max_attempts),
            )
        self.wake_subscribers()
        return True

    def enqueue_many(self, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
        """Enqueue ``items`` (see :meth:`Backend.enqueue_many`) in one ``BEGIN IMMEDIATE``
        transaction: one lookup of the ids already present per :data:`HINT_CHUNK` of them,
        one ``seq`` reservation, one ``executemany`` insert. Atomic: all new jobs are
        added, or (on any error) none.

        Raises:
            InvalidArgument: a job exists outside ``queue``; nothing was added.
            BackendUnavailable.
        """
        if not items:
            return []
        ids = [item.job_id for item in items]
        with self._transaction(ids[0]) as db:
            present: dict[str, str | None] = {}
            for start in range(0, len(ids), HINT_CHUNK):
                chunk = ids[start : start + HINT_CHUNK]
                present.update(db.execute(
                    f"SELECT job_id, queue FROM cl_jobs WHERE job_id IN "
                    f"({', '.join('?' * len(chunk))})", chunk).fetchall())
            for job_id, where in present.items():
                if where != queue:
                    raise InvalidArgument(
                        f"{job_id!r} already exists outside queue {queue!r}; nothing of "
                        f"this chunk was enqueued", job_id=job_id)
            new = [item for item in items if item.job_id not in present]
            if new:
                last = int(db.execute(
                    "INSERT INTO cl_seq VALUES (1, ?) ON CONFLICT (id) DO UPDATE "
                    "SET last = last + excluded.last RETURNING last", (len(new),)
                ).fetchone()[0])
                db.executemany(
                    "INSERT INTO cl_jobs (job_id, generation, queue, payload, seq, max_attempts) "
                    "VALUES (?, 0, ?, ?, ?, ?)",
                    [(item.job_id, queue, item.payload, last - len(new) + 1 + i,
                      item.max_attempts) for i, item in enumerate(new)],
                )
        if new:
            self.wake_subscribers()
        return [job_id not in present for job_id in ids]

    def queue_stats(self, queue: str) -> QueueStats:
        """Counts of ``queue``'s jobs by state in one statement (one snapshot of the
        file): the totals from ``cl_queue_counts`` (kept by triggers in every statement
        that adds, ends or deletes a job), the held jobs by walking the live sessions'
        jobs (``cl_jobs_by_session``). Cost O(session rows + jobs the live ones hold), not
        O(queue depth). ``available`` includes jobs waiting out a retry delay.

        Raises:
            BackendUnavailable.
        """
        row = self._read(
            "SELECT coalesce(c.jobs, 0), coalesce(c.completed, 0), coalesce(c.failed, 0), "
            "h.held, h.until FROM (SELECT count(*) AS held, min(s.expires_at) AS until "
            "FROM cl_sessions s CROSS JOIN cl_jobs j INDEXED BY cl_jobs_by_session "
            "ON j.session_id = s.session_id "
            f"WHERE s.expires_at > {NOW} AND j.queue = ? AND j.completed_at IS NULL "
            "AND j.failed_at IS NULL) h LEFT JOIN cl_queue_counts c ON c.queue = ?",
            (queue, queue),
        )[0]
        jobs, completed, failed, held = (int(v) for v in row[:4])
        until = row[4]
        return QueueStats(
            queue=queue, available=jobs - completed - failed - held, held=held,
            completed=completed, failed=failed,
            oldest_held_lease_until=None if until is None else float(until),
        )

    def queue_candidates(self, queue: str, limit: int) -> list[tuple[str, bytes]]:
        rows = self._read(
            "SELECT j.job_id, j.payload FROM cl_jobs j INDEXED BY cl_jobs_open WHERE j.queue = ? "
            "AND j.completed_at IS NULL AND j.failed_at IS NULL "
            f"AND (j.not_before IS NULL OR j.not_before <= {NOW}) "
            "AND NOT EXISTS (SELECT 1 FROM cl_sessions s "
            f"WHERE s.session_id = j.session_id AND s.expires_at > {NOW}) "
            "ORDER BY j.seq LIMIT ?",
            (queue, int(limit)),
        )
        return [(r[0], bytes(r[1] or b"")) for r in rows]

    def queue_jobs(self, queue: str, limit: int | None = None) -> list[QueuedJob]:
        sql = (
            self._SELECT.replace(" FROM cl_jobs j", ", j.payload, j.seq FROM cl_jobs j")
            + " WHERE j.queue = ? ORDER BY j.seq"
        )
        params: tuple[Any, ...] = (queue,)
        if limit is not None:
            sql += " LIMIT ?"
            params = (queue, int(limit))
        return [
            QueuedJob(queue, self._to_record(row[:-2]), bytes(row[-2] or b""), int(row[-1]))
            for row in self._read(sql, params)
        ]

    def wait_for_queue(self, queue: str, timeout_s: float) -> None:
        time.sleep(max(0.0, min(timeout_s, self.poll_interval_s)))

    def purge(self, queue: str) -> int:
        with self._transaction() as db:
            return db.execute(
                "DELETE FROM cl_jobs WHERE queue = ? AND completed_at IS NOT NULL", (queue,)
            ).rowcount

    # -- reading -----------------------------------------------------------------------

    _SELECT = (
        "SELECT j.job_id, j.owner, s.expires_at, j.generation, j.completed_at, j.result, "
        f"(s.expires_at > {NOW}), j.failed_at, j.attempt, j.error, "
        f"CASE WHEN j.not_before > {NOW} THEN j.not_before END, j.max_attempts, j.epoch, "
        "j.value FROM cl_jobs j LEFT JOIN cl_sessions s ON s.session_id = j.session_id"
    )

    @classmethod
    def _to_record(cls, row: tuple[Any, ...]) -> LeaseRecord:
        return record_of_row(row, cls.epoch_shift)

    def _get(self, db: sqlite3.Connection, job_id: str) -> LeaseRecord | None:
        row = db.execute(self._SELECT + " WHERE j.job_id = ?", (job_id,)).fetchone()
        return None if row is None else self._to_record(row)

    def get(self, job_id: str) -> LeaseRecord | None:
        rows = self._read(self._SELECT + " WHERE j.job_id = ?", (job_id,))
        return self._to_record(rows[0]) if rows else None

    def records(self, limit: int | None = None) -> list[LeaseRecord]:
        sql = self._SELECT + f" WHERE {NOT_ELECTION} ORDER BY j.job_id"
        params: tuple[Any, ...] = (ELECTION_PREFIX,)
        if limit is not None:
            sql += " LIMIT ?"
            params = (ELECTION_PREFIX, int(limit))
        return [self._to_record(r) for r in self._read(sql, params)]

    def store_time(self) -> float | None:
        """The database clock now, seconds since the epoch."""
        return float(self._read(f"SELECT {NOW}")[0][0])

    # -- the store epoch ---------------------------------------------------------------

    def epoch(self) -> int:
        rows = self._read("SELECT epoch FROM cl_meta WHERE id = 1")
        return int(rows[0][0]) if rows else 0

    def bump_epoch(self, above: int | None = None) -> int:
        """Raise ``cl_meta.epoch`` in one ``BEGIN IMMEDIATE`` transaction (see
        :meth:`Backend.bump_epoch`); sessions of this store object that saw the store go
        back are trusted again afterwards (new ones may be opened).

        Raises:
            InvalidArgument: bad ``above``, or the epoch would leave the int64 range;
                nothing changed.
            StoreRegressed: the path now names another file than the one this object
                opened: open the store again and bump through it.
            BackendUnavailable.
        """
        with self._transaction(check_file=True) as db:
            row = db.execute("SELECT epoch FROM cl_meta WHERE id = 1").fetchone()
            new = next_epoch(0 if row is None else int(row[0]), above, self.epoch_shift)
            if row is None:
                db.execute(META_INSERT, (uuid.uuid4().hex,))
            db.execute("UPDATE cl_meta SET epoch = ? WHERE id = 1", (new,))
        return new

    def subscribe_job(self, job_id: str, callback: WakeCallback) -> Unsubscribe:
        """See :meth:`Backend.subscribe_job`: the default poller, woken also by the
        change watch (:mod:`._sqlite_watch`) when another process changed the file."""
        if self._watch is not None:
            self._watch.ensure()
        return super().subscribe_job(job_id, callback)

    def subscribe_queue(self, queue: str, callback: WakeCallback) -> Unsubscribe:
        """See :meth:`Backend.subscribe_queue` and :meth:`subscribe_job`."""
        if self._watch is not None:
            self._watch.ensure()
        return super().subscribe_queue(queue, callback)

    def _claims_wait(self) -> bool:
        poller = self._poller
        return poller is not None and len(poller) > 0

    def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        # SQLite cannot notify another process: poll (capabilities.store_watch is False).
        time.sleep(max(0.0, min(timeout_s, self.poll_interval_s)))

    def claimable_hint(
        self, job_ids: Sequence[str], queues: Sequence[str]
    ) -> tuple[Collection[str], Collection[str]] | None:
        """One read per poll for every waiting claim of this process: the subscribed jobs
        that are not held by a live session nor in a retry delay (completed and FAILED
        ones included: their waiters must learn it), the subscribed election keys whose
        holder, liveness or value changed since the last poll (an election becomes
        claimable no other way), and the queues with a claimable job.
        Expiry and retry delays are compared with the database's clock."""
        blocked: set[str] = set()
        for start in range(0, len(job_ids), HINT_CHUNK):
            chunk = tuple(job_ids[start : start + HINT_CHUNK])
            rows = self._read(
                f"SELECT j.job_id FROM cl_jobs j WHERE j.job_id IN "
                f"({', '.join('?' * len(chunk))}) "
                "AND j.completed_at IS NULL AND j.failed_at IS NULL "
                f"AND ((j.not_before IS NOT NULL AND j.not_before > {NOW}) "
                "OR EXISTS (SELECT 1 FROM cl_sessions s "
                f"WHERE s.session_id = j.session_id AND s.expires_at > {NOW}))",
                chunk,
            )
            blocked.update(row[0] for row in rows)
        ready = [q for q in queues if self.queue_candidates(q, 1)]
        states = self._election_states(job_ids)
        changed = self._elections.changed(states)
        return [j for j in job_ids if j in changed
                or (j not in states and j not in blocked)], ready

    def _election_states(self, job_ids: Sequence[str]) -> dict[str, tuple[Any, ...] | None]:
        """Election key -> what changes with its leader or value (``None``: no row)."""
        keys = tuple(j for j in job_ids if is_election_key(j))
        states: dict[str, tuple[Any, ...] | None] = dict.fromkeys(keys)
        for start in range(0, len(keys), HINT_CHUNK):
            chunk = keys[start : start + HINT_CHUNK]
            rows = self._read(
                f"SELECT j.job_id, j.epoch, j.generation, j.session_id, j.value, {ALIVE_J} "
                f"FROM cl_jobs j WHERE j.job_id IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            states.update((row[0], tuple(row[1:])) for row in rows)
        return states

    # -- transactional fencing -----------------------------------------------------------

    def lock_in(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, conn: object,
        lock_timeout_s: float | None,
    ) -> AbstractContextManager[OnceCheck]:
        """See :meth:`consensus_lease.Lease.transaction` and :mod:`._sqlite_txn`."""
        return lease_transaction(self, session, job_id, claim, conn, lock_timeout_s, NOW)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        if self._wal is not None:
            self._wal.close()
        self.close_subscriptions()
        with self._lock:
            with suppress(sqlite3.Error):  # a broken handle: nothing left to release
                self._db.close()
