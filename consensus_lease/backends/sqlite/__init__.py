"""The embedded default: a SQLite file shared by worker processes on one machine.

``open_store("sqlite:///jobs.db")`` (relative path) or ``open_store("sqlite:////var/lib/jobs.db")``
(absolute: four slashes), the same convention as SQLAlchemy. No server to run.

How the protocol maps onto SQLite:

* A worker session is a row in ``cl_sessions`` with ``expires_at`` on the **database's
  clock**: every statement computes "now" inside SQL (``julianday('now')``), so a worker
  whose clock is wrong cannot extend or steal anything. One keepalive is one ``BEGIN
  IMMEDIATE`` transaction: the regression check's read (:mod:`._tokens`) and one
  ``UPDATE`` of that row, however many jobs the session holds (:mod:`._sessions`).
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
  False): one thread per store object (the subscription poller) reads which of the jobs
  and queues its claims wait for have become claimable
  (:func:`._watches.claimable_hint`: one read per 500 jobs waited for, one more per 500
  of them that are election keys, and one per queue) and wakes just those. It reads
  every ``poll_interval_s`` (expiries and retry delays end without a write), at once
  after a change made by this process, and within about ``watch_interval_s`` (5 ms)
  after another process's commit: while claims wait, a second thread reads ``PRAGMA
  data_version`` (no table read, no lock) 1 ms after a change, backing off to
  ``watch_interval_s`` while nothing changes (:mod:`._watches`). Measured on a busy
  2-core machine: graceful handover to a claim waiting in another process in about 5 ms
  (p99 under 10 ms); the watch adds about 1.5-2 % of a core to a process whose claims
  wait on a quiet store, however many claims wait (100 claims: 2.5-3 % in all, 1 %
  without the watch).
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
  hold on the row (release, complete, fail, a claim); a holder whose session expired or
  was closed leaves it in the row, not reported: a record shows it only while HELD.
  The poller also wakes subscribers of an election key when its holder or value changed.
* **Transactional fencing** (``capabilities.transactions``):
  :meth:`~consensus_lease.Lease.transaction` runs ``BEGIN IMMEDIATE`` on your own
  ``sqlite3`` connection to this file, checks the hold in it, and ``tx.once(effect_id)``
  inserts into ``cl_effects`` (key ``(job_id, effect_id)``, deleted with the job by a
  trigger) in that transaction: once per job across generations. The block holds the
  file's write lock: every other write waits for it (:mod:`._transport_txn`).
* A file restored from an older copy, replaced or wiped while workers run is noticed
  (``StoreRegressed`` for every session of the store) where the file shows it: see
  :mod:`consensus_lease.backends.sqlite._tokens_history` for what is and is not detected.
* Queues: ``queue_candidates`` reads the oldest open jobs through the partial index
  ``cl_jobs_open (queue, seq) WHERE completed_at IS NULL AND failed_at IS NULL AND queue
  IS NOT NULL``, so a
  claim costs the same at any depth and whatever number of COMPLETED or FAILED jobs
  (it skips only held jobs, and jobs in a retry delay, at the head). ``enqueue_many`` is one
  transaction per ``max_enqueue_batch`` (10,000) jobs, atomic; ``claim_many`` one
  transaction per ``max_batch_claim`` (1,000) jobs; ``complete_many`` one ``BEGIN
  IMMEDIATE`` transaction per ``max_complete_batch`` (1,000) completions, each by the
  statement ``complete`` runs with its own outcome; ``release_many`` and ``fail_many``
  one ``BEGIN IMMEDIATE`` transaction per ``max_end_batch`` (1,000) leases, each by the
  statement ``release`` / ``fail`` runs with its own outcome (a refusal explained in the
  same transaction); ``complete_and_claim_next`` one
  transaction: the completion, then the claim statement on the oldest claimable job of
  the queue (``fused_claim_next``); ``claim_from_queue_many`` (``claim_next_many``) one
  transaction per ``max_queue_claim_batch`` (1,000) jobs: the oldest claimable ones read
  and claimed by the claim statement, with the write lock held; ``claim_from_queue``
  (``claim_next``) reads the 8 oldest candidates (no lock) and runs the claim statement
  alone on a random one of them, or, if one of them is exhausted or the claim lost a
  race, ``claim_from_queue_many``'s transaction for one job. Those transactions make
  FAILED, in one ``UPDATE``, every exhausted job ahead of the last job they claim
  (about 5 µs of write lock each: 10,000 took about 50 ms, once), so a claimable job is
  found however many exhausted ones sit before it. ``queue_stats`` is one
  statement: the per-queue counts of jobs, COMPLETED and FAILED ones in ``cl_queue_counts``, kept
  by triggers in the same statements that change them (an earlier version's writers
  keep them too; a file without the table gets it, counted once, on first open), plus
  the jobs of the live sessions (O(jobs held), not O(depth)).
* Capacity (``capabilities.max_queue_jobs`` is ``None``): no limit is enforced; a queue
  is bounded by the file's disk (about 100 bytes per job plus its payload and result,
  payloads up to ``max_payload_bytes``, 16 MiB). Claims and ``queue_stats`` stay flat
  with depth (measured to 100,000 open jobs); ``purge`` drops COMPLETED jobs.
* Every operation on a held job (renew, complete, release, fail, ``set_value``) runs in
  one transaction whose ``UPDATE ... WHERE`` does the owner + generation comparison, so
  the check and the write are one atomic step (SQLite serialises writers:
  https://www.sqlite.org/lang_transaction.html). The file uses WAL
  mode and a busy timeout so processes wait for each other instead of failing.
* The claim+complete cycle is two statements, each its own (autocommit) transaction,
  which takes the write lock as it starts: the claim's upsert (:data:`CLAIM_SQL`: it
  also checks the session, the store's identity and its claim count, and the count goes
  +1 by trigger, :data:`CLAIM_TRIGGERS`) and the complete's ``UPDATE``. Neither has a
  ``RETURNING`` clause (SQLite builds a temporary B-tree for one, about as much CPU as a
  whole raw transaction): what they wrote is handed over, inside the statement, by TEMP
  triggers of the store's own connection (:data:`CLAIM_CAPTURES`,
  :data:`COMPLETED_CAPTURE`); renew and release are one statement too. Only a refused
  one opens a ``BEGIN IMMEDIATE`` transaction to find out why (and to retry a claim once). The
  secondary indexes are partial (:data:`PARTIAL_INDEXES`): a cycle writes 4 WAL pages
  (the job row's twice, its primary key's and ``cl_meta``'s once; a raw insert + update
  writes 3), a queue job's about 7 (also ``cl_jobs_by_session``, ``cl_jobs_open`` and
  ``cl_queue_counts``). Other writing operations take one ``BEGIN IMMEDIATE`` transaction
  each; a read (``get``, ``records``, ``queue_stats``, ``queue_candidates``, ``epoch``,
  ``store_time``) is one statement, its own read transaction.
* The WAL stays under ``wal_limit_bytes`` (16 MiB) while no reader keeps an old snapshot
  open: ``PRAGMA journal_size_limit``, and a thread per store object that checks the
  ``-wal`` file's size every ``wal_interval_s`` and checkpoints (PASSIVE, then
  TRUNCATE if that copied every page) when it is above, never waiting for a lock. A
  read transaction left open (by any process) stops every checkpoint: the WAL then
  grows with each commit, a WARNING names its size and what to do, and the observer's
  :meth:`~consensus_lease.observe.Observer.wal_measured` reports it
  (:mod:`._transport_wal`).

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
                           watches: ``capabilities.store_watch`` is False); per
                           interval per store object one read per 500 jobs (and
                           per 500 election keys) and one per queue waited for,
                           however many claims wait on each
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

from ._config import OPTIONS as OPTIONS
from ._jobs_claim import CLAIM_SQL as CLAIM_SQL
from ._layout import CLAIM_OBJECTS as CLAIM_OBJECTS
from ._layout import PARTIAL_INDEXES as PARTIAL_INDEXES
from ._layout import QUEUE_OBJECTS as QUEUE_OBJECTS
from .driver import SqliteBackend

__all__ = ["SqliteBackend"]
