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
  :data:`~consensus_lease.backends._pg_schema.NOW`), so a worker whose clock is wrong
  cannot extend or steal anything. One keepalive is one ``UPDATE`` of that row, however
  many jobs the session holds.
* A job is a row of ``cl_jobs``: ``generation`` (the fencing token, +1 per claim), the
  holder's ``session_id``, the completion record, the lifecycle columns (``attempt``,
  ``max_attempts``, ``not_before``, ``failed_at``, ``error``), the ``epoch`` of its claim
  and an election leader's ``value``. A job is held iff its session row is alive; a
  job whose session row is gone is free. Closing a session deletes its row (its jobs
  are free at once, no job row written); ``open_session`` deletes the rows of sessions
  expired for a minute. No index covers a column that completing a named job changes,
  so that completion is a HOT update (no index entry written; :mod:`._pg_schema`).
* Every operation on a job is **one statement** (one round trip, its own transaction):
  a claim is one ``INSERT ... ON CONFLICT (job_id) DO UPDATE ... WHERE <claimable>
  RETURNING generation``; complete, release, fail and set_value are one ``UPDATE ...
  WHERE session_id = me AND generation = g AND <my session alive>``. PostgreSQL locks the
  job row for the ``UPDATE`` and re-checks the ``WHERE`` on its newest version after
  waiting for a concurrent writer (READ COMMITTED, https://www.postgresql.org/docs/15/
  transaction-iso.html#XACT-READ-COMMITTED), so two claims, or a claim and a
  completion, of one job are serialised and the second sees the first.
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
  process completes learns it at its next poll. One listener
  connection per process pokes the subscription poller, which then asks the database in
  one read which waited-for jobs and queues are claimable (:meth:`claimable_hint`) and
  wakes exactly those. Expiry sends nothing (nobody writes when a TTL runs out), so the
  poller also polls every ``poll_interval_s``: the bounded fallback, also while the
  listener reconnects.
* The store epoch is ``cl_meta.epoch``, read by the claim statement itself and recorded in
  the job row; tokens are ``epoch * 2**32 + generation``.
* The schema is created by the first process that opens the store and versioned
  (:mod:`consensus_lease.backends._pg_schema` has the migration path).
* **Transactional fencing**: :meth:`~consensus_lease.Lease.transaction` locks the lease's
  row inside your own transaction on this database, and ``tx.once(effect_id)`` inserts
  into ``cl_effects`` (primary key ``(job_id, effect_id)``) in that transaction: once per
  job across generations (:mod:`._pg_txn`).
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
  ``enqueue_many`` takes up to 1,000 jobs per call, one transaction.

Failover and restore are detected (schema v4, ``MIGRATIONS`` 3 -> 4 in
:mod:`._pg_schema`): ``cl_meta`` records the server the store's history is on, its
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
parameter, never a password's value (:mod:`._pg_conninfo`); a connection that breaks
after a write was sent is settled by reading back (``OutcomeUnknown`` only where that
cannot tell). No psycopg exception escapes.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .._election import ELECTION_PREFIX, ChangeTracker, is_election_key
from .._epoch import compose, next_epoch, split
from .._subscriptions import Unsubscribe, WakeCallback
from ..backend import Capabilities, OnceCheck, SessionHandle, StateListener
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
from ..options import Option, OptionTable, ParsedOptions
from ..record import ClaimResult, JobState, LeaseRecord
from ._pg_client import POOLING, Client, Listener, SentMaybe, translate
from ._pg_conninfo import check_option_values, check_url, hide_password
from ._pg_queue import QueueOps
from ._pg_schema import (
    MIGRATIONS,
    NOW,
    SCHEMA_VERSION,
    SYSTEM_ID,
    TIMELINE,
    Names,
    check_schema_name,
)
from ._pg_sql import Statements

__all__ = ["PostgresBackend", "regression"]

OPTIONS = OptionTable(
    "PostgreSQL",
    [
        Option("schema", "str", "consensus_lease", "schema holding the store's tables"),
        Option("connect_timeout_s", "seconds", 5.0, "seconds to open a connection"),
        Option("timeout_s", "seconds", 5.0, "seconds one statement may take"),
        Option("poll_interval_s", "seconds", 0.1,
               "fallback re-check interval of waiting claims (expiry)"),
        Option("pool_size", "int", 10, "most pooled connections", minimum=1, maximum=1000),
        Option("create", "bool", True, "create the schema and tables if missing"),
        Option("pooling", "str", "none", "the connection pooler in between (PgBouncer's "
               "pool_mode): none, session or transaction", choices=POOLING),
        Option("listen_url", "str", None, "postgresql:// URL of a direct connection to the "
               "same database for LISTEN (with pooling=transaction: none, waiting claims "
               "poll)", secret=True),
        Option("ca_file", "path", None, "PEM CA file to verify the server (libpq sslrootcert);"
               " sslmode verify-full unless sslmode is given"),
        Option("cert_file", "path", None, "client certificate file (libpq sslcert)"),
        Option("key_file", "path", None, "client certificate's key file (libpq sslkey)"),
        Option("user", "str", None, "user name (libpq user; overrides the URL's)"),
        Option("password", "str", None, "password (libpq password; overrides the URL's)",
               secret=True),
        Option("sslmode", "str", None, "libpq sslmode",
               choices=("disable", "allow", "prefer", "require", "verify-ca", "verify-full")),
        Option("gssencmode", "str", None, "libpq gssencmode",
               choices=("disable", "prefer", "require")),
        Option("channel_binding", "str", None, "libpq channel_binding",
               choices=("disable", "prefer", "require")),
        Option("target_session_attrs", "str", None, "libpq target_session_attrs",
               choices=("any", "read-write", "read-only", "primary", "standby",
                        "prefer-standby")),
        *(Option(name, "str", None, f"libpq {name}") for name in (
            "host", "hostaddr", "port", "sslrootcert", "sslcert", "sslkey", "sslcrl",
            "application_name", "options", "passfile")),
        Option("keepalives", "int", None, "libpq keepalives (1 on, 0 off)", minimum=0,
               maximum=1),
        *(Option(name, "int", None, f"libpq {name}", minimum=0) for name in (
            "keepalives_idle", "keepalives_interval", "keepalives_count")),
    ],
)
"""The options of ``postgresql://`` URLs (see the module docstring)."""

SECRET_OPTIONS = frozenset(o.name for o in OPTIONS.options.values() if o.secret)
"""Options whose value no error message quotes."""

LIBPQ_OPTIONS = (
    "host", "hostaddr", "port", "sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl",
    "application_name", "target_session_attrs", "options", "passfile", "channel_binding",
    "gssencmode", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
    "user", "password",
)
"""Options handed to libpq under their own name (with their libpq meaning,
https://www.postgresql.org/docs/15/libpq-connect.html#LIBPQ-PARAMKEYWORDS)."""

MAX_BATCH_CLAIM = 1000
"""Most jobs one :meth:`PostgresBackend.claim_many` statement claims
(``capabilities.max_batch_claim``; the session splits longer lists)."""

SHARED_TO_LIBPQ = {"ca_file": "sslrootcert", "cert_file": "sslcert", "key_file": "sslkey"}
"""The library's shared option names and the libpq parameter each one sets."""


def _listen_conninfo(url: str, extra: Mapping[str, str], store_url: str = "") -> str:
    """The listener's connection string: ``url`` (a libpq URI or connection string) with
    the libpq parameters given as options (credentials, TLS ...) and the ``user`` and
    ``password`` of ``store_url`` (the store's URL; options win over it) that it does not
    set itself; never the store's ``host``/``hostaddr``/``port``, which is what it
    differs in.

    Raises:
        InvalidArgument: ``url`` is malformed (the message leaves the password out).
    """
    try:
        own = conninfo_to_dict(url)
        store = conninfo_to_dict(store_url) if store_url else {}
        given = {k: str(store[k]) for k in ("user", "password") if store.get(k)}
        inherited = {k: v for k, v in {**given, **extra}.items()
                     if k not in own and k not in ("host", "hostaddr", "port")}
        return make_conninfo(url, **inherited) if inherited else url
    except psycopg.ProgrammingError:
        raise InvalidArgument("PostgreSQL option listen_url is not a valid libpq URI or "
                              "connection string") from None


def _port_option(options: Mapping[str, object]) -> Mapping[str, object]:
    """``options`` with an int ``port`` keyword (not a bool) as its text, so that
    ``port=5432`` is accepted like ``?port=5432``."""
    port = options.get("port")
    if isinstance(port, int) and not isinstance(port, bool):
        return {**options, "port": str(port)}
    return options


def _check_port(port: str | None) -> None:
    """Refuse a ``port`` option that is not a port number in 1..65535, or a
    comma-separated list of them (one per host), before libpq sees it.

    Raises:
        InvalidArgument: naming the option and the range.
    """
    if port is None:
        return
    for part in port.split(","):
        text = part.strip()
        if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
            raise InvalidArgument(
                f"PostgreSQL option port must be a port number in 1..65535, or a "
                f"comma-separated list of them (one per host), not {port!r}"
            )


def libpq_params(parsed: ParsedOptions) -> dict[str, str]:
    """The libpq connection parameters the options give (``ca_file`` ... mapped to their
    libpq names; ``ca_file`` without ``sslmode`` means ``sslmode=verify-full``).

    Raises:
        InvalidArgument: a shared name and its libpq name both given (``ca_file`` and
            ``sslrootcert``); ``connect_timeout`` (use ``connect_timeout_s``).
    """
    params = {name: str(parsed.values[name]) for name in LIBPQ_OPTIONS
              if parsed.values[name] is not None}
    for shared, libpq in SHARED_TO_LIBPQ.items():
        value = parsed.text(shared)
        if value is None:
            continue
        if libpq in params:
            raise InvalidArgument(
                f"PostgreSQL options {shared} and {libpq} are the same setting: give one"
            )
        params[libpq] = value
    if parsed.values["ca_file"] is not None and "sslmode" not in params:
        params["sslmode"] = "verify-full"
    return params


def regression(
    system_id: str | None, timeline: str | None, server_system_id: str, server_timeline: str,
    epoch: int, session_timeline: str | None = None,
) -> str | None:
    """Why the server answering is not the one the store's history is on (``cl_meta``'s
    ``system_id`` and ``timeline`` against the server's), or the session (its row's
    ``timeline``; ``None`` without a row) was opened on another timeline: a sentence, or
    ``None`` when neither."""
    if system_id != server_system_id:
        return (f"the server is another PostgreSQL cluster (system identifier "
                f"{server_system_id}) than the one the store was on ({system_id}) at epoch "
                f"{epoch}: restored into another cluster")
    if timeline != server_timeline:
        return (f"the server is on WAL timeline {int(server_timeline, 16)}, the store's "
                f"history on timeline {int(timeline or '0', 16)} (epoch {epoch}): a standby "
                "was promoted (a failover or a planned switchover) or a backup restored")
    if session_timeline != server_timeline and session_timeline is not None:
        return (f"the session was opened on WAL timeline {int(session_timeline, 16)}, the "
                f"server is on timeline {int(server_timeline, 16)}")
    return None


class PostgresBackend(QueueOps):
    """A lease store in a PostgreSQL database. See the module docstring.

    Args:
        conninfo: libpq URI or connection string (without our options).
        schema: the schema of the store's tables (a lower-case identifier).
        connect_timeout_s / timeout_s / poll_interval_s / pool_size / create: the options.

    Raises:
        InvalidArgument: bad schema name; ``conninfo`` holds a NUL or an unencodable
            character (nothing is sent); ``create`` is false and there is no store; the
            store was written by a newer version (``schema_version`` above ours).
        AuthenticationFailed: the server refused the credentials.
        BackendUnavailable: the server cannot be reached within ``connect_timeout_s``.
    """

    scheme = "postgresql"
    capabilities = Capabilities(
        cross_process=True,
        store_watch=True,
        consecutive_generations=True,
        min_ttl_s=0.05,
        max_ttl_s=7 * 24 * 3600.0,
        max_batch_claim=MAX_BATCH_CLAIM,
        max_complete_batch=MAX_BATCH_CLAIM,
        fused_claim_next=True,
        queues=True,
        max_payload_bytes=16 * 1024 * 1024,
        description="PostgreSQL database (LISTEN/NOTIFY, server clock)",
        epoch=True,
        regression_refusal=True,
        elections=True,
        max_enqueue_batch=1000,
        max_queue_jobs=None,
        transactions=True,
    )

    def __init__(
        self, conninfo: str, *, schema: str = "consensus_lease", connect_timeout_s: float = 5.0,
        timeout_s: float = 5.0, poll_interval_s: float = 0.1, pool_size: int = 10,
        create: bool = True, pooling: str = "none", listen_conninfo: str | None = None,
    ) -> None:
        self.names = Names(check_schema_name(schema))
        self.sql = Statements(self.names)
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.where = f"store {schema!r}"
        self.client = Client(conninfo, connect_timeout_s=connect_timeout_s,
                             timeout_s=timeout_s, pool_size=pool_size, where=self.where,
                             pooling=pooling, listen_conninfo=listen_conninfo)
        self.pooling = pooling
        # pooling=transaction without a direct connection: no LISTEN (it would stay on a
        # pooled server connection); waiting claims poll every poll_interval_s
        self.listens = pooling != "transaction" or listen_conninfo is not None
        self._elections = ChangeTracker()
        self._listener: Listener | None = None
        self._listener_lock = threading.Lock()
        self._closed = False
        self.identity = self._prepare(create)
        if listen_conninfo is not None:
            self._check_listen_target()
        self.client.open_pool()

    @classmethod
    def from_url(cls, url: str, options: Mapping[str, object]) -> PostgresBackend:
        conninfo = url.split("?", 1)[0]
        if conninfo[:11].lower() == "postgres://":  # libpq's other spelling (Heroku's)
            conninfo = "postgresql://" + conninfo[11:]
        if not conninfo.lower().startswith("postgresql://") or conninfo == "postgresql://":
            raise InvalidArgument(
                f"PostgreSQL URL must be postgresql://user:password@host:port/dbname, got "
                f"{conninfo.split('@')[-1]!r}"
            )
        check_url(conninfo)  # NUL, %00, unencodable: named, before libpq sees them
        try:
            conninfo_to_dict(conninfo)  # libpq's own parser
            parts = urlsplit(conninfo)
            if "," not in parts.netloc:  # one host: libpq checks its port only on connect
                _ = parts.port
        except (psycopg.ProgrammingError, ValueError) as exc:
            raise InvalidArgument(
                f"malformed PostgreSQL URL: {hide_password(str(exc), conninfo)}") from None
        if "connect_timeout" in options:
            raise InvalidArgument(
                "PostgreSQL option connect_timeout: use connect_timeout_s (seconds)"
            )
        parsed = OPTIONS.parse(_port_option(options))
        check_option_values(parsed.values, SECRET_OPTIONS)
        _check_port(parsed.text("port"))
        extra = libpq_params(parsed)
        if extra:
            try:
                conninfo = make_conninfo(conninfo, **extra)
            except psycopg.ProgrammingError as exc:
                raise InvalidArgument("malformed PostgreSQL connection options "
                                      f"({type(exc).__name__})") from None
        listen = parsed.text("listen_url")
        if listen is not None:
            if "://" in listen:
                check_url(listen.split("?", 1)[0])  # a %00 in its password: as the store's URL
            listen = _listen_conninfo(listen, extra, url.split("?", 1)[0])
        return cls(
            conninfo,
            pooling=parsed.text("pooling") or "none",
            listen_conninfo=listen,
            schema=parsed.text("schema") or "consensus_lease",
            connect_timeout_s=parsed.seconds("connect_timeout_s"),
            timeout_s=parsed.seconds("timeout_s"),
            poll_interval_s=parsed.seconds("poll_interval_s"),
            pool_size=parsed.integer("pool_size"),
            create=parsed.flag("create"),
        )

    # -- schema --------------------------------------------------------------------------

    def _prepare(self, create: bool) -> str:
        """Create or migrate the schema (see :mod:`._pg_schema`); return the store's
        identity."""
        n = self.names
        conn = self.client.connect()
        try:
            if self.client.pooling == "none":
                self.client.check_settings(conn)  # a pooler that dropped them: refused
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                             (f"consensus_lease:{n.schema}",))
                exists = conn.execute("SELECT to_regclass(%s)", (f"{n.s}.cl_meta",)).fetchone()
                if exists is None or exists[0] is None:
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
                self._mark_other_cluster(conn)
            return identity
        except psycopg.Error as exc:
            raise translate(exc, f"PostgreSQL {self.where}: preparing the schema") from exc
        finally:
            conn.close()

    def _check_listen_target(self) -> None:
        """Refuse a ``listen_url`` that does not reach this store's database (its
        notifications would never come), with the connection's own error if it cannot
        connect.

        Raises:
            InvalidArgument / AuthenticationFailed / BackendUnavailable.
        """
        conn = self.client.connect_listener()
        try:
            row = conn.execute(
                f"SELECT identity FROM {self.names.meta} WHERE id = 1").fetchone()
        except psycopg.Error:
            row = None
        finally:
            conn.close()
        if row is None or row[0] != self.identity:
            raise InvalidArgument(
                f"PostgreSQL option listen_url does not reach the database of "
                f"{self.where} (no store with its identity in schema "
                f"{self.names.schema!r} there): it must be a direct connection to the "
                "same database"
            )

    def _mark_other_cluster(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """At open: if the server is another cluster than the one ``cl_meta`` names (a
        logical dump restored into another cluster, whose timeline may be the same
        number), end every session row (its timeline set to NULL, which no server has):
        their next keepalive or claim, in any process, reports ``StoreRegressed``, as
        ``open_session`` does by itself, until ``bump-epoch``."""
        n = self.names
        row = conn.execute(f"SELECT system_id, {SYSTEM_ID} FROM {n.meta} WHERE id = 1").fetchone()
        if row is not None and row[0] is not None and row[0] != row[1]:
            conn.execute(f"UPDATE {n.sessions} SET timeline = NULL WHERE timeline IS NOT NULL")

    def _expired(self, session_id: str, job_id: str | None = None,
                 generation: int | None = None) -> SessionExpired:
        """Why a statement found the session not alive, read after it: ``StoreRegressed``
        if the server is not the one ``cl_meta`` names (another timeline: a standby
        promoted, a backup restored; another system identifier: another cluster) or the
        session was opened on another timeline than the server's; else
        ``SessionExpired``. One read, only on this path (never on a statement that
        applied)."""
        row = self._one(self.sql.identity, (session_id,), job_id)
        why = None if row is None else regression(*row)
        if why is None:
            return SessionExpired(f"session {session_id} expired in the store",
                                  job_id=job_id, generation=generation)
        return StoreRegressed(
            f"PostgreSQL {self.where}: {why}. The store's history may have gone back (an "
            "asynchronous standby loses what it had not received): every session of it is "
            "over. Stop the workers, run `consensus-lease bump-epoch --backend URL --above "
            "HIGHEST` (the highest token any destination accepted), then start them (docs: "
            "PostgreSQL store, Failover)", job_id=job_id, generation=generation,
        )

    # -- plumbing ------------------------------------------------------------------------

    def _p(self, session: SessionHandle, job_id: str, claim: ClaimResult | None = None,
           **more: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"job": job_id, "sid": session.session_id,
                                  "owner": session.owner, "chan": self.names.channel}
        if claim is not None:
            params["epoch"], params["gen"] = split(claim.generation, self.epoch_shift)
        params.update(more)
        return params

    def _reject(self, session: SessionHandle, job_id: str, generation: int) -> LeaseError:
        """Why an owner+generation compare failed (read after it)."""
        found = self._one(
            f"SELECT j.generation, j.session_id, j.completed_at, j.epoch, {self.sql.my_alive} "
            f"FROM (SELECT 1) one LEFT JOIN {self.names.jobs} j ON j.job_id = %(job)s",
            {"job": job_id, "sid": session.session_id}, job_id,
        )
        assert found is not None  # the statement always returns its one row
        # The session not alive (here): a failover tells first.
        expired = None if found[4] else self._expired(session.session_id, job_id, generation)
        if isinstance(expired, StoreRegressed):
            return expired
        row = None if found[0] is None else found
        current = None if row is None else compose(int(row[3]), int(row[0]), self.epoch_shift)
        # At the lease's generation with no other holder (this session's, or released:
        # a claim since would have a newer generation) and the session over: its end is
        # why (the rule of Backend.complete).
        if (row is not None and row[1] in (session.session_id, None) and row[2] is None
                and current == generation and expired is not None):
            return expired
        what = "completed" if row is not None and row[2] is not None else "held or released"
        return StaleLeaseError(
            f"{job_id!r} is not held by session {session.session_id} at generation "
            f"{generation}: the store has generation {current} ({what})",
            job_id=job_id, generation=generation, current_generation=current,
        )

    def _held_now(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> bool:
        row = self._one(f"SELECT 1 FROM {self.names.jobs} j WHERE {self.sql.held}",
                        self._p(session, job_id, claim), job_id)
        return row is not None

    # -- sessions ------------------------------------------------------------------------

    def open_session(
        self, owner: str, ttl_s: float, on_event: StateListener | None = None
    ) -> SessionHandle:
        session_id = uuid.uuid4().hex

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
            c.execute(self.sql.gc_sessions)
            return c.execute(self.sql.open_session, (session_id, owner, ttl_s, ttl_s)).fetchone()

        def settle() -> tuple[Any, ...] | None:
            raise BackendUnavailable(f"PostgreSQL {self.where}: opening a session got no "
                                     "answer (a session made then expires by its TTL)")

        if self.client.write(None, run, settle) is None:  # not on cl_meta's server
            raise self._expired(session_id)
        return SessionHandle(session_id, owner, ttl_s)

    def keepalive(self, session: SessionHandle) -> float:
        sid = session.session_id
        for attempt in (1, 2):
            try:
                with self.client.conn() as c:
                    row = c.execute(self.sql.keepalive, (sid,)).fetchone()
                break
            except SentMaybe as exc:  # idempotent: once more on another connection
                if attempt == 2:
                    raise translate(exc.cause, f"PostgreSQL {self.where}") from exc
        if row is None:
            raise self._expired(sid)
        return float(row[0])

    def close_session(self, session: SessionHandle) -> None:
        n = self.names

        # Deleting the session row frees every job it held (a job whose session row is
        # gone is free: the claim's check): no job row is written, none looked for.
        def run(c: psycopg.Connection[tuple[Any, ...]]) -> None:
            c.execute(f"WITH d AS (DELETE FROM {n.sessions} WHERE session_id = %s "
                      "RETURNING 1) SELECT pg_notify(%s, '')", (session.session_id, n.channel))

        with suppress(BackendUnavailable):  # best effort: the TTL ends it
            self.client.write(None, run, lambda: None)
        self.wake_subscribers()

    def expire_session(self, session_id: str) -> None:
        """Test hook: make the store expire a session now, as its TTL running out would."""
        self.client.write(None, lambda c: c.execute(
            f"WITH u AS (UPDATE {self.names.sessions} SET expires_at = {NOW} - 0.001 "
            "WHERE session_id = %s RETURNING 1) SELECT pg_notify(%s, '')",
            (session_id, self.names.channel)))
        self.wake_subscribers()

    # -- jobs ----------------------------------------------------------------------------

    def claim(self, session: SessionHandle, job_id: str) -> ClaimResult | None:
        """Claim ``job_id`` (see :meth:`Backend.claim`): one statement; the token carries
        the epoch read in it. A lost answer is settled by reading the row back (held by
        this session: it was applied). A job row locked by an open ``lease.transaction``
        for longer than the connections' ``lock_timeout`` (:meth:`Client.lock_wait_ms`)
        is reported as held (``None``): a waiting claim tries again when woken.

        Raises:
            JobCompleted / JobFailed / SessionExpired / BackendUnavailable.
        """
        election = is_election_key(job_id)
        sql = self.sql.claim_notify if election else self.sql.claim
        # Built here, not by _p (W1's hot path); chan is for an election's notify. Rows in
        # binary: no number formatting on the server, no parsing here.
        params = {"job": job_id, "sid": session.session_id, "owner": session.owner,
                  "chan": self.names.channel}

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
            try:
                return self.client.cursor(c).execute(sql, params, binary=True).fetchone()
            except pgerrors.LockNotAvailable:
                return ()  # the row is locked (an open lease.transaction): held

        def settle() -> tuple[Any, ...] | None:
            row = self._one(
                f"SELECT j.generation, j.attempt, j.epoch, s.expires_at FROM {self.names.jobs} "
                f"j JOIN {self.names.sessions} s ON s.session_id = j.session_id "
                "WHERE j.job_id = %(job)s AND j.session_id = %(sid)s", params, job_id)
            if row is not None:
                return row  # it was applied
            return self.client.write(job_id, run)  # it was not: once more

        row = self.client.write(job_id, run, settle)
        if row == ():
            return None
        if row is not None:
            if election:
                self.wake_subscribers()
            return ClaimResult(compose(int(row[2]), int(row[0]), self.epoch_shift),
                               float(row[3]), int(row[1]))
        refusal = self._refusal(session, job_id)
        if refusal is not None:
            raise refusal
        return None

    def claim_many(
        self, session: SessionHandle, job_ids: Sequence[str]
    ) -> list[ClaimResult | None]:
        """Claim each of ``job_ids`` (distinct, at most ``capabilities.max_batch_claim``)
        in **one statement** (one round trip, one transaction): for each id the claim of
        :meth:`claim` (own generation +1, attempt counted, epoch read in it), then the
        jobs whose attempts are used up and which nobody holds are marked FAILED, as
        :meth:`claim`'s refusal does. Element ``i`` answers ``job_ids[i]``: a
        ``ClaimResult``, or ``None`` (held elsewhere, delayed, completed or FAILED).
        The job rows are locked in job-id order, so concurrent batches do not deadlock
        on them. A lost answer is settled by reading back which of the ids this session
        now holds (none: the statement did not apply, and runs once more).

        Batches with an election key, and a batch that meets a job row locked by an
        open ``lease.transaction`` (``lock_timeout``) or a deadlock with a concurrent
        ``close_session``, are claimed one job at a time by :meth:`claim` (the same
        answers, one round trip per job).

        Raises:
            InvalidArgument: duplicate ids; nothing is claimed.
            SessionExpired: the session is not alive in the store; nothing is claimed.
            BackendUnavailable / OutcomeUnknown: as :meth:`claim`.
        """
        ids = list(job_ids)
        if not ids:
            return []
        if len(set(ids)) != len(ids):
            raise InvalidArgument("claim_many: job_ids contains duplicates")
        if len(ids) > MAX_BATCH_CLAIM:
            raise InvalidArgument(
                f"claim_many: at most {MAX_BATCH_CLAIM} job ids per call, got {len(ids)}"
            )
        if any(is_election_key(j) for j in ids):
            return super().claim_many(session, ids)
        params = {"jobs": ids, "sid": session.session_id, "owner": session.owner}
        sql = self.sql.claim_many

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> list[tuple[Any, ...]] | None:
            try:
                # Prepared at its first run (psycopg waits for prepare_threshold runs):
                # the statement is long, its parse a good part of a batch's time. Binary
                # rows: no text to parse for the 128 x 6 values of a full batch.
                return self.client.cursor(c).execute(
                    sql, params, prepare=c.prepare_threshold is not None or None, binary=True
                ).fetchall()
            except (pgerrors.LockNotAvailable, pgerrors.DeadlockDetected):
                return None  # rolled back: one at a time below

        def settle() -> list[tuple[Any, ...]] | None:
            rows = self.client.read(self.sql.claimed_many, params, ids[0])
            if rows:  # it was applied (the session alive then)
                return [(*r, True) for r in rows]
            return self.client.write(ids[0], run)  # it was not: once more

        rows = self.client.write(ids[0], run, settle)
        if rows is None:
            return super().claim_many(session, ids)
        got: dict[str, ClaimResult] = {}
        for row in rows:
            if row[0] is not None:
                got[row[0]] = ClaimResult(compose(int(row[3]), int(row[1]), self.epoch_shift),
                                          float(row[4]), int(row[2]))
        if not got and rows and not rows[0][5]:
            raise self._expired(session.session_id, ids[0])
        return [got.get(j) for j in ids]

    def _refusal(self, session: SessionHandle, job_id: str) -> LeaseError | None:
        """After a claim did not apply: SessionExpired, JobCompleted or JobFailed if that
        is why (else ``None``); first moves a job whose attempts are used up, and which
        nobody holds, to FAILED."""
        params = {"job": job_id, "sid": session.session_id}

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
            try:
                return c.execute(self.sql.refusal, params).fetchone()
            except pgerrors.LockNotAvailable:
                return None  # an exhausted job locked by an open lease.transaction: held

        row = self.client.write(job_id, run, lambda: None)
        if row is None:
            return None
        local, completed_at, failed_at, attempt, error, epoch, alive = row
        if not alive:
            return self._expired(session.session_id, job_id)
        if local is None:
            return None
        generation = compose(int(epoch), int(local), self.epoch_shift)
        if completed_at is not None:
            return JobCompleted(f"{job_id!r} was completed at generation {generation}",
                                job_id=job_id, generation=generation)
        if failed_at is not None:
            return JobFailed(f"{job_id!r} FAILED after {attempt} attempt(s): {error}",
                             job_id=job_id, generation=generation, attempt=int(attempt),
                             error=error)
        return None

    def renew(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> float:
        params = self._p(session, job_id, claim)
        row = self._one(self.sql.renew, params, job_id)  # idempotent: read() retries once
        if row is None:
            raise self._reject(session, job_id, claim.generation)
        return float(row[0])

    def complete(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes
    ) -> LeaseRecord:
        epoch, gen = split(claim.generation, self.epoch_shift)
        params = {"job": job_id, "sid": session.session_id, "gen": gen, "epoch": epoch,
                  "result": result}

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
            return self.client.cursor(c).execute(self.sql.complete, params, binary=True).fetchone()

        # A lost answer: once more on another connection (a repeat finds its own
        # completion below, so the result is applied at most once).
        row = self.client.write(job_id, run, lambda: self.client.write(job_id, run))
        self.wake_subscribers()
        if row is not None:  # the COMPLETED record: what the statement returns + ours
            owner, attempt, error, max_attempts = row
            return LeaseRecord(
                job_id=job_id, owner=owner, lease_until=None, generation=claim.generation,
                state=JobState.COMPLETED, result=bytes(result), attempt=int(attempt),
                error=error, not_before=None,
                max_attempts=None if max_attempts is None else int(max_attempts),
                value=None,
            )
        if self._one(self.sql.completed_by_me, params, job_id) is None:
            raise self._reject(session, job_id, claim.generation)
        record = self.get(job_id)  # a repeat of this session's completion
        assert record is not None
        return record

    def release(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> None:
        params = self._p(session, job_id, claim)

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
            return c.execute(self.sql.release, params).fetchone()

        def settle() -> tuple[Any, ...] | None:
            if self._held_now(session, job_id, claim):  # not applied: once more
                return self.client.write(job_id, run)
            return (1,)  # not held by us any more: released (or lost), either way ended

        row = self.client.write(job_id, run, settle)
        if row is None:
            raise self._reject(session, job_id, claim.generation)
        self.wake_subscribers()

    def set_value(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, value: bytes
    ) -> None:
        """Write an election leader's value: one ``UPDATE`` with the owner + generation
        compare of ``release`` (see :meth:`Backend.set_value`).

        Raises:
            StaleLeaseError / SessionExpired / BackendUnavailable / OutcomeUnknown.
        """
        params = self._p(session, job_id, claim, value=value)

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
            return c.execute(self.sql.set_value, params).fetchone()

        row = self.client.write(job_id, run, lambda: self.client.write(job_id, run))
        if row is None:
            raise self._reject(session, job_id, claim.generation)
        self.wake_subscribers()

    def fail(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, error: str,
        retry_in_s: float,
    ) -> LeaseRecord:
        params = self._p(session, job_id, claim, error=error, retry=retry_in_s)

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
            return c.execute(self.sql.fail, params).fetchone()

        def settle() -> tuple[Any, ...] | None:
            if self._held_now(session, job_id, claim):
                return self.client.write(job_id, run)  # not applied: once more
            done = self._one(
                f"SELECT 1 FROM {self.names.jobs} WHERE job_id = %(job)s AND generation = "
                "%(gen)s AND epoch = %(epoch)s AND session_id IS NULL AND error = %(error)s "
                "AND completed_at IS NULL", params, job_id)
            return done  # None: not held and not our failure: rejected below

        row = self.client.write(job_id, run, settle)
        if row is None:
            raise self._reject(session, job_id, claim.generation)
        self.wake_subscribers()
        record = self.get(job_id)
        assert record is not None
        return record

    def requeue(self, job_id: str) -> LeaseRecord:
        n = self.names
        row = self.client.write(job_id, lambda c: c.execute(
            f"WITH u AS (UPDATE {n.jobs} SET failed_at = NULL, "
            "closed = CASE WHEN queue IS NULL THEN true END, "
            "not_before = NULL, "
            "attempt_base = attempt WHERE job_id = %s AND failed_at IS NOT NULL RETURNING 1) "
            "SELECT pg_notify(%s, '') FROM u", (job_id, n.channel)).fetchone())
        record = self.get(job_id)
        if row is None or record is None:
            state = "unknown" if record is None else record.state.value
            raise InvalidArgument(
                f"only a FAILED job can be requeued; {job_id!r} is {state}", job_id=job_id
            )
        self.wake_subscribers()
        return record

    # -- reading -------------------------------------------------------------------------

    def get(self, job_id: str) -> LeaseRecord | None:
        row = self._one(self.sql.select + " WHERE j.job_id = %s", (job_id,), job_id)
        return None if row is None else self._to_record(row)

    def records(self, limit: int | None = None) -> list[LeaseRecord]:
        sql = (self.sql.select + " WHERE left(j.job_id, %s) <> %s ORDER BY j.job_id COLLATE "
               '"C"')
        params: tuple[Any, ...] = (len(ELECTION_PREFIX), ELECTION_PREFIX)
        if limit is not None:
            sql += " LIMIT %s"
            params = (*params, int(limit))
        return [self._to_record(r) for r in self.client.read(sql, params)]

    def store_time(self) -> float | None:
        """The server's clock now, seconds since the epoch."""
        row = self._one(f"SELECT {NOW}", None)
        assert row is not None
        return float(row[0])

    # -- the store epoch -----------------------------------------------------------------

    def epoch(self) -> int:
        row = self._one(f"SELECT epoch FROM {self.names.meta} WHERE id = 1", None)
        return 0 if row is None else int(row[0])

    def bump_epoch(self, above: int | None = None) -> int:
        """Raise ``cl_meta.epoch`` in one transaction that locks the row (see
        :meth:`Backend.bump_epoch`), and record the server answering as the store's
        (system identifier, timeline: the failover check, module docstring). If that
        server is another than the one recorded (a failover or restore since), every
        session row is deleted in the same transaction: the sessions of the history
        before it are over (their jobs free at once), whatever their expiry says; else
        the session rows of another timeline are (none can be alive here).

        Raises:
            InvalidArgument: bad ``above`` or the int64 range; nothing changed.
            BackendUnavailable / OutcomeUnknown (the answer was lost: read ``epoch()``).
        """
        meta, sessions = self.names.meta, self.names.sessions

        def run(c: psycopg.Connection[tuple[Any, ...]]) -> int:
            with c.transaction():
                row = c.execute(
                    f"SELECT epoch, system_id = {SYSTEM_ID} AND timeline = {TIMELINE} "
                    f"FROM {meta} WHERE id = 1 FOR UPDATE").fetchone()
                new = next_epoch(0 if row is None else int(row[0]), above, self.epoch_shift)
                c.execute(f"UPDATE {meta} SET epoch = %s, system_id = {SYSTEM_ID}, "
                          f"timeline = {TIMELINE} WHERE id = 1", (new,))
                c.execute(f"DELETE FROM {sessions}" + (
                    f" WHERE timeline IS DISTINCT FROM {TIMELINE}"
                    if row is not None and row[1] else ""))
            return new

        return int(self.client.write(None, run))

    # -- waiting -------------------------------------------------------------------------

    def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        self._wait(lambda wake: self.subscribe_job(job_id, wake), timeout_s)

    def _ensure_listener(self) -> None:
        """Start the LISTEN connection on first use; wait (bounded) until it listens so
        that a change right after the caller subscribed is not missed (if it cannot, the
        poll interval covers it)."""
        if self._listener is not None or self._closed or not self.listens:
            return
        with self._listener_lock:
            if self._listener is None and not self._closed:
                self._listener = Listener(self.client, self.names.listen,
                                          self.wake_subscribers)
        self._listener.wait_ready(self.client.connect_timeout_s)

    def subscribe_job(self, job_id: str, callback: WakeCallback) -> Unsubscribe:
        self._ensure_listener()
        return super().subscribe_job(job_id, callback)

    def subscribe_queue(self, queue: str, callback: WakeCallback) -> Unsubscribe:
        self._ensure_listener()
        return super().subscribe_queue(queue, callback)

    def claimable_hint(
        self, job_ids: Sequence[str], queues: Sequence[str]
    ) -> tuple[Collection[str], Collection[str]] | None:
        """One read for every waiting claim of this process (two with election keys):
        the subscribed jobs not held by a live session nor in a retry delay (completed and
        FAILED ones included), the election keys whose holder, liveness or value changed
        since the last poll, and the queues with a claimable job. Server clock."""
        n = self.names
        rows = self.client.read(
            f"SELECT 'j', j.job_id FROM {n.jobs} j WHERE j.job_id = ANY(%(ids)s) "
            "AND j.completed_at IS NULL AND j.failed_at IS NULL "
            f"AND ((j.not_before IS NOT NULL AND j.not_before > {NOW}) OR {self.sql.alive_j}) "
            f"UNION ALL SELECT 'q', q FROM unnest(%(queues)s::text[]) q WHERE EXISTS "
            f"(SELECT 1 FROM {n.jobs} j WHERE j.queue = q AND j.closed IS NULL "
            "AND j.completed_at IS NULL "
            f"AND j.failed_at IS NULL AND (j.not_before IS NULL OR j.not_before <= {NOW}) "
            f"AND NOT {self.sql.alive_j})",
            {"ids": list(job_ids), "queues": list(queues)},
        )
        blocked = {r[1] for r in rows if r[0] == "j"}
        ready = [r[1] for r in rows if r[0] == "q"]
        keys = [j for j in job_ids if is_election_key(j)]
        states: dict[str, tuple[Any, ...] | None] = dict.fromkeys(keys)
        if keys:
            for row in self.client.read(
                f"SELECT j.job_id, j.epoch, j.generation, j.session_id, j.value, "
                f"{self.sql.alive_j} FROM {n.jobs} j WHERE j.job_id = ANY(%s)", (keys,),
            ):
                states[row[0]] = tuple(row[1:])
        changed = self._elections.changed(states)
        return [j for j in job_ids if j in changed
                or (j not in states and j not in blocked)], ready

    # -- transactional fencing -----------------------------------------------------------

    def lock_in(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, conn: object,
        lock_timeout_s: float | None,
    ) -> AbstractContextManager[OnceCheck]:
        """See :meth:`consensus_lease.Lease.transaction` and :mod:`._pg_txn`."""
        from ._pg_txn import lease_transaction

        return lease_transaction(self, session, job_id, claim, conn, lock_timeout_s)

    def close(self) -> None:
        self._closed = True
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        self.close_subscriptions()
        self.client.close()
