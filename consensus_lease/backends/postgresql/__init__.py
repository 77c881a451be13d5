"""A lease store in a PostgreSQL database you already run.

``open_store("postgresql://user:password@host:5432/dbname?schema=jobs")``: psycopg 3 with a
``psycopg_pool`` connection pool (``pip install consensus_lease[postgresql]``). The part
before ``?`` is handed to libpq as it is (any libpq URI works: percent-encoded password,
several hosts ...); the query string carries the options below: the store's own and a set
of libpq connection parameters, which are handed to libpq (``?host=/run/postgresql`` for a
Unix socket, ``?sslmode=verify-full&ca_file=/etc/ssl/db-ca.pem``). Any other name is
``InvalidArgument`` listing the accepted ones.

How the protocol maps onto PostgreSQL (the same tables as the SQLite store,
:mod:`consensus_lease.backends.sqlite`, in the URL's ``schema``):

* A worker session is a row of ``cl_sessions`` with ``expires_at`` on the **server's
  clock**. Every statement reads the time inside SQL with ``clock_timestamp()`` at the
  moment it compares (never ``now()``, the transaction's start: see
  :data:`~consensus_lease.backends.postgresql._layout.NOW`), so a worker whose clock is wrong
  cannot extend or steal anything. One keepalive is one ``UPDATE`` of that row, however
  many jobs the session holds.
* A job is a row of ``cl_jobs``: ``generation`` (the fencing token, +1 per claim), the
  holder's ``session_id``, the completion record, the lifecycle columns (``attempt``,
  ``max_attempts``, ``not_before``, ``failed_at``, ``error``), the ``epoch`` of its claim
  and an election leader's ``value``. A job is held iff its session row is alive; a
  job whose session row is gone is free. Closing a session deletes its row (its jobs
  are free at once, no job row written); ``open_session`` deletes the rows of sessions
  expired for a minute. No index covers a column that completing a named job changes,
  so that completion is a HOT update (no index entry written; :mod:`._layout`).
* Every operation on a job is decided by **one statement** (its own transaction; one
  round trip when it applies): a claim is one ``INSERT ... ON CONFLICT (job_id) DO
  UPDATE ... WHERE <claimable> RETURNING generation``; complete, release, fail and
  set_value are one ``UPDATE ... WHERE session_id = me AND generation = g AND <my
  session alive>``; ``complete_many``, ``release_many`` and ``fail_many`` are one
  ``INSERT ... ON CONFLICT (job_id) DO UPDATE ... WHERE session_id = me AND generation =
  g`` of the items (up to 1,000, and for ``complete_many`` / ``fail_many`` up to 32 MiB
  of results or error texts, :data:`._config.MAX_BATCH_BYTES`), each item's row found
  and locked by its primary key, in job-id order, whatever the table's statistics
  (``_layout_sql``). What follows is read after it: why a statement did not apply (one
  read, :func:`._jobs.refusal`; for a claim one statement that also marks a job whose
  attempts are used up FAILED; one more read when the session is not alive: expired or a
  failover, :func:`._tokens.expired`), and the record ``fail`` and ``requeue`` return (a
  second round trip). PostgreSQL locks the job row for the ``UPDATE`` and re-checks the
  ``WHERE`` on its newest version after waiting for a concurrent writer (READ COMMITTED,
  https://www.postgresql.org/docs/15/ transaction-iso.html#XACT-READ-COMMITTED), so two
  claims, or a claim and a completion, of one job are serialised and the second sees the
  first.
* "Claimable" needs the holder's session to be *visibly* expired, and locks that session
  row (``FOR SHARE``) while checking it: a keepalive of the holder that was evaluated
  before the claim but committed after the claim's snapshot makes the claim wait and then
  see the new expiry, instead of taking the job from a worker that was just renewed; a
  keepalive arriving after the claim's lock waits and then finds its session expired.
  A session row being deleted (closed) is not waited for: the claim answers "held"
  (ordered before the close) and the close's notification wakes waiting claims.
  Lock order is always the job row, then the session row.
* Waiting claims (``claim(wait_s=)``, ``claim_next(wait_s=)``) are woken by
  ``LISTEN/NOTIFY``: every statement that can make a job claimable (release, fail,
  enqueue, requeue, a closed session, an election's change) sends ``pg_notify`` on the
  store's channel in its own transaction (delivered at commit). A completion does not
  (it makes nothing claimable; PostgreSQL serialises the commits of notifying
  transactions, which would cap completions/s): a claim waiting on a job that another
  process completes learns it at its next poll. Nor does ``bump_epoch`` (run with the
  workers stopped), whose deleted session rows free their jobs: a waiting claim learns of
  those at its next poll too. One listener
  connection per process pokes the subscription poller, which then asks the database in
  one read (two with election keys) which waited-for jobs and queues are claimable
  (:func:`._watches.claimable_hint`) and wakes exactly those. Expiry sends nothing
  (nobody writes when a TTL runs out), so the poller also polls every
  ``poll_interval_s``: the bounded fallback, also while the listener reconnects.
* The store epoch is ``cl_meta.epoch``, read by the claim statement itself and recorded in
  the job row; tokens are ``epoch * 2**32 + generation``.
* The schema is created by the first process that opens the store and versioned
  (:mod:`consensus_lease.backends.postgresql._layout` has the migration path).
* **Transactional fencing**: :meth:`~consensus_lease.Lease.transaction` locks the lease's
  row inside your own transaction on this database, and ``tx.once(effect_id)`` inserts
  into ``cl_effects`` (primary key ``(job_id, effect_id)``) in that transaction: once per
  job across generations (below).
* Capacity (``capabilities.max_queue_jobs`` is ``None``): no limit is enforced; like
  SQLite, a queue is bounded by the database's disk: about 190 bytes per waiting job
  and 260 per completed one (its row and index entries; schema v3, 10-character ids,
  empty payloads, ``pg_total_relation_size`` over 100,000 jobs) plus its payload and
  result, payloads up to ``max_payload_bytes`` (16 MiB). ``claim_next`` reads the head of
  the partial index of the queue's open jobs, ``(queue, seq)``, and finds exhausted jobs
  through a partial index of their own, so its cost does not grow with the number of
  waiting jobs (it grows with the jobs held or delayed at the head, which it skips).
  ``queue_stats`` is one statement: HELD from the live sessions' jobs, the other counts
  from one pass over the queue's rows inside the server, so it is O(jobs in the queue,
  completed ones until ``purge``) — measured about 20 ms at 100,000 jobs on a 2-core VM.
  ``enqueue_many`` takes up to 1,000 jobs per call, one transaction. ``claim_next_many``
  (``claim_from_queue_many``) claims up to ``max_queue_claim_batch`` (1,000) jobs in one
  statement: ``claim_next``'s, with ``LIMIT n`` on its ``FOR UPDATE SKIP LOCKED`` pick.

What transactional fencing guarantees (effects *inside this database*; the code, and what
it costs: :mod:`._transport_txn`):

* The block runs only if, when the lock was taken, this session held the job at this
  generation on the server's clock; otherwise ``StaleLeaseError`` / ``SessionExpired``
  and the transaction is rolled back; ``StoreRegressed`` on a server that is not the
  store's any more (the session was opened on another timeline: a failover).
* From then until the transaction ends (the outer commit or rollback, savepoint or not:
  row locks are kept until then), no claim of the job can commit: a claim locks the same
  row for update (``ON CONFLICT DO UPDATE``) and waits. So the transaction's effects
  commit *before* the next generation's claim, and that claim (and its holder) sees them.
  A holder paused past its TTL in the middle of the block that resumes and commits still
  commits — but nobody claimed the job in between: the takeover happens strictly after
  the commit. The block alone is therefore once per *generation* (never after a
  takeover: a block that starts after one fails at the lock), and the next generation
  runs the job again.
* Once per job: ``tx.once(effect_id)`` is ``INSERT INTO cl_effects (job_id, effect_id,
  generation) ... ON CONFLICT DO NOTHING`` on the caller's connection, in the block's
  transaction: ``True`` iff it inserted. The primary key ``(job_id, effect_id)`` makes a
  second insert wait for an uncommitted first one and then do nothing if it committed;
  the next generation's claim comes after the block's commit (above), so it finds the
  record. Exactly one committed transaction per ``(job_id, effect_id)`` saw ``True``.
  The caller's role needs ``INSERT`` on ``cl_effects``.
* It says nothing about effects elsewhere (another database, an HTTP call): those still
  need a fence (:mod:`consensus_lease.fencing`).

Failover and restore are detected (schema v4, ``MIGRATIONS`` 3 -> 4 in
:mod:`._layout`): ``cl_meta`` records the server the store's history is on, its
**system identifier** (``pg_control_system()``: kept by physical standbys and backups,
another in another cluster) and its **WAL timeline** (``pg_walfile_name
(pg_current_wal_lsn())``: +1 at every promotion, and at the end of a point-in-time
recovery); each session row records the timeline it was opened on. Every statement that
keeps or uses a session (keepalive, renew, every claim, complete, release, fail,
set_value, ``lease.transaction``'s lock) finds its session alive only on that timeline —
one comparison inside the statement, no extra round trip (about 80 ns of server time per
statement) — and ``open_session`` opens one only on the recorded server (the system
identifier is read there, not per statement). So after a standby is promoted (a failover,
and also a **planned switchover**: the conservative choice, the store cannot tell that
nothing was lost) or a backup restored, every session and claim of the store, in this
process and in any process that opens it then, raises ``StoreRegressed``: a holder's
background keepalive ends its session within one keepalive interval (``ensure_held()``
then raises it), claims, ``claim_next``, ``claim_many``, complete and ``open_session`` are
refused, nothing applied. A logical dump restored into another cluster (another system
identifier, maybe the same timeline number) is noticed by the first process that opens
the store there, which ends every session row. Until ``consensus-lease bump-epoch`` (run
with the workers stopped: stop, bump, start), which records the server answering, raises
the epoch (every later token is above every earlier one) and deletes the session rows of
before (their jobs are free at once). What the lost history had is gone: jobs completed
on the old primary after the standby's last received WAL are claimable again, above every
earlier token; those the standby had stay completed.

Not detected: a restore that keeps system identifier and timeline — a filesystem
snapshot of the data directory restored in place (crash recovery continues the same
timeline), or a dump restored into the same cluster: the runbook's stop, restore, bump is
the safety net there (docs: Operations, Restoring a store).

Options (URL query string or keyword arguments of ``open_store``; keyword arguments win):

=================  ===============  =====================================================
option             default          meaning
=================  ===============  =====================================================
schema             consensus_lease  the PostgreSQL schema holding the store's tables
connect_timeout_s  5.0              seconds to open a connection (``open_store`` fails
                                    with ``BackendUnavailable`` after it)
timeout_s          5.0              seconds one statement may run (``statement_timeout``)
                                    or a send stay unacknowledged (``tcp_user_timeout``);
                                    also the wait for a pooled connection
poll_interval_s    0.1              the fallback poll of waiting claims (expiry; the
                                    listener being away)
pool_size          10               most pooled connections of this process (+1 listener)
create             true             create the schema and tables if missing; ``false``:
                                    a missing store is ``InvalidArgument``
pooling            none             the pooler in between: ``none`` (direct), ``session``
                                    or ``transaction`` (PgBouncer's ``pool_mode``; below);
                                    behind either nothing is prepared on the server
listen_url         none             ``postgresql://`` URL of a direct connection to the
                                    same database for ``LISTEN`` (the store URL's user
                                    and password, the credential and TLS options
                                    inherited unless it sets them); without it
                                    and with ``pooling=transaction``: polling
ca_file            none             PEM CA file verifying the server: libpq
                                    ``sslrootcert``, and ``sslmode=verify-full`` unless
                                    ``sslmode`` is given
cert_file          none             client certificate (libpq ``sslcert``)
key_file           none             its private key (libpq ``sslkey``)
user, password     from the URL     credentials (libpq ``user``/``password``), win over
                                    the URL's
libpq parameters   libpq's          ``host hostaddr port sslmode sslrootcert sslcert
                                    sslkey sslcrl application_name target_session_attrs
                                    options passfile channel_binding gssencmode
                                    keepalives keepalives_idle keepalives_interval
                                    keepalives_count``, with libpq's meaning
=================  ===============  =====================================================

``port`` is a port number in 1..65535 (a str or an int) or a comma-separated list of them,
one per host; anything else is ``InvalidArgument`` before connecting.
``connect_timeout`` is refused: use ``connect_timeout_s``. A libpq ``options`` value is
kept and the store's ``statement_timeout``/``lock_timeout`` are set after it (they win).
Without ``application_name`` the connections are named ``consensus_lease``; without the
``keepalives*`` parameters the store sets TCP keepalives from ``timeout_s``. A shared name
and its libpq name together (``ca_file`` and ``sslrootcert``) are ``InvalidArgument``.

PgBouncer (1.18 and later; session and transaction pooling, not statement pooling):
``pooling=transaction`` prepares nothing on the server (``prepare_threshold=None``),
sends no ``options`` and sets ``statement_timeout``/``lock_timeout`` with
``set_config(..., true)`` in the same pipeline (one Sync, one round trip) as each
statement, and LISTENs only on ``listen_url`` (else waiting claims poll every
``poll_interval_s``). ``pooling=session`` sets both timeouts on each new connection,
LISTENs on it, and prepares nothing on the server either: a pooler that is in fact in
transaction mode then cannot run a statement prepared by another client under the same
name (the cost: each statement is parsed and planned on every run, as with
``pooling=transaction``).
Without ``pooling`` a pooler is refused at open with ``InvalidArgument`` naming
transaction pooling and the option: PgBouncer refusing the ``options`` startup parameter
(its default), or dropping it (``ignore_startup_parameters = options``: the timeouts read
back after connecting differ from the asked ones). ``options`` with ``pooling`` other
than ``none`` is ``InvalidArgument``.

Errors: an unreachable server is ``BackendUnavailable``; bad or missing credentials
(``no password supplied``) ``AuthenticationFailed``; a database that does not exist
``InvalidArgument`` naming it (the store never creates a database); a schema of
PostgreSQL's own (``information_schema``, ``pg_*``) ``InvalidArgument`` before
connecting; so is a value libpq cannot carry, in any URL part (``user``, ``password``,
``host``, ``port``, ``dbname``, after percent-decoding) or option (query string or keyword
argument): a NUL character or ``%00`` (libpq would stop reading there and connect with its
defaults for the rest), a lone surrogate, a stray ``%`` in the URL; the error names the
parameter, never a password's value (:mod:`._config`); a connection that breaks
after a write was sent is settled by reading back (``OutcomeUnknown`` only where that
cannot tell). No psycopg exception escapes.
"""


from ..._extras import needs_extra

try:
    from .driver import PostgresBackend
except ModuleNotFoundError as exc:  # the extra is not installed
    raise needs_extra(exc, "postgresql", "the PostgreSQL backend") from exc

__all__ = ["PostgresBackend"]
