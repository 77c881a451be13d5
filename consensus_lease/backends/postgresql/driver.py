"""The PostgreSQL driver class: every :class:`~consensus_lease.backend.Backend` method,
each delegating to one module of the package (the template of
:mod:`consensus_lease.backends`), and the capabilities. The protocol is told in the
package docstring (:mod:`consensus_lease.backends.postgresql`).

Where each part lives: the URL and options in :mod:`._config`; connections, retries and
psycopg's exceptions in :mod:`._transport` (:mod:`._transport_txn` for
``lease.transaction`` on the caller's connection); the tables, their migration and the
row codec in :mod:`._layout` (the statements in :mod:`._layout_sql`); sessions in
:mod:`._sessions`; the job operations and :func:`._jobs.refusal` in :mod:`._jobs`; work
queues in :mod:`._queues`; ``LISTEN/NOTIFY`` and waiting in :mod:`._watches`; the epoch
and the failover check in :mod:`._tokens`.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager

from ..._election import ChangeTracker
from ..._subscriptions import Unsubscribe, WakeCallback
from ...backend import (
    Backend,
    Capabilities,
    CompleteItem,
    FailItem,
    OnceCheck,
    QueuePick,
    ReleaseItem,
    SessionHandle,
    StateListener,
)
from ...errors import LeaseError
from ...record import ClaimResult, EnqueueItem, LeaseRecord, QueuedJob, QueueStats
from . import _config, _jobs, _layout, _queues, _sessions, _tokens, _transport_txn, _watches
from ._layout import Names, check_schema_name
from ._layout_sql import Statements
from ._transport import Client, Listener

__all__ = ["PostgresBackend"]


class PostgresBackend(Backend):
    """A lease store in a PostgreSQL database. See the package docstring.

    Args:
        conninfo: libpq URI or connection string (without our options).
        schema: the schema of the store's tables (a lower-case identifier).
        connect_timeout_s / timeout_s / poll_interval_s / pool_size / create / pooling:
            the options; ``listen_conninfo``: the ``listen_url`` option's connection.

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
        max_batch_claim=_config.MAX_BATCH_CLAIM,
        max_complete_batch=_config.MAX_BATCH_CLAIM,
        fused_claim_next=True,
        max_queue_claim_batch=_config.MAX_BATCH_CLAIM,
        max_end_batch=_config.MAX_BATCH_CLAIM,
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
        self.identity = _layout.prepare(
            self.client, self.names, create,
            lambda conn: _tokens.mark_other_cluster(self.names, conn))
        if listen_conninfo is not None:
            _watches.check_listen_target(self)
        self.client.open_pool()

    @classmethod
    def from_url(cls, url: str, options: Mapping[str, object]) -> PostgresBackend:
        return cls(**_config.parse_url(url, options))

    # -- sessions: _sessions -------------------------------------------------------------

    def open_session(
        self, owner: str, ttl_s: float, on_event: StateListener | None = None
    ) -> SessionHandle:
        return _sessions.open_session(self, owner, ttl_s)

    def keepalive(self, session: SessionHandle) -> float:
        return _sessions.keepalive(self, session)

    def close_session(self, session: SessionHandle) -> None:
        _sessions.close_session(self, session)

    def expire_session(self, session_id: str) -> None:
        """Test hook: make the store expire a session now, as its TTL running out would."""
        _sessions.expire_session(self, session_id)

    def store_time(self) -> float | None:
        """The server's clock now, seconds since the epoch."""
        return _sessions.store_time(self)

    # -- jobs: _jobs ---------------------------------------------------------------------

    def claim(self, session: SessionHandle, job_id: str) -> ClaimResult | None:
        return _jobs.claim(self, session, job_id)

    def claim_many(
        self, session: SessionHandle, job_ids: Sequence[str]
    ) -> list[ClaimResult | None]:
        return _jobs.claim_many(self, session, job_ids)

    def renew(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> float:
        return _jobs.renew(self, session, job_id, claim)

    def complete(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes
    ) -> LeaseRecord:
        return _jobs.complete(self, session, job_id, claim, result)

    def complete_many(
        self, session: SessionHandle, items: Sequence[CompleteItem]
    ) -> list[LeaseRecord | LeaseError]:
        return _jobs.complete_many(self, session, items)

    def release(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> None:
        _jobs.release(self, session, job_id, claim)

    def release_many(
        self, session: SessionHandle, items: Sequence[ReleaseItem]
    ) -> list[LeaseError | None]:
        return _jobs.release_many(self, session, items)

    def set_value(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, value: bytes
    ) -> None:
        _jobs.set_value(self, session, job_id, claim, value)

    def fail(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, error: str,
        retry_in_s: float,
    ) -> LeaseRecord:
        return _jobs.fail(self, session, job_id, claim, error, retry_in_s)

    def fail_many(
        self, session: SessionHandle, items: Sequence[FailItem]
    ) -> list[LeaseRecord | LeaseError]:
        return _jobs.fail_many(self, session, items)

    def requeue(self, job_id: str) -> LeaseRecord:
        return _jobs.requeue(self, job_id)

    def get(self, job_id: str) -> LeaseRecord | None:
        return _jobs.get(self, job_id)

    def records(self, limit: int | None = None) -> list[LeaseRecord]:
        return _jobs.records(self, limit)

    def lock_in(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, conn: object,
        lock_timeout_s: float | None,
    ) -> AbstractContextManager[OnceCheck]:
        """See :meth:`consensus_lease.Lease.transaction` and :mod:`._transport_txn`."""
        return _transport_txn.lease_transaction(self, session, job_id, claim, conn,
                                                lock_timeout_s)

    # -- work queues: _queues ------------------------------------------------------------

    def enqueue(
        self, queue: str, job_id: str, payload: bytes, max_attempts: int | None = None
    ) -> bool:
        return _queues.enqueue(self, queue, job_id, payload, max_attempts)

    def enqueue_many(self, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
        return _queues.enqueue_many(self, queue, items)

    def claim_from_queue(
        self, session: SessionHandle, queue: str
    ) -> tuple[str, ClaimResult | None, bytes] | None:
        return _queues.claim_from_queue(self, session, queue)

    def claim_from_queue_many(
        self, session: SessionHandle, queue: str, n: int
    ) -> list[QueuePick]:
        return _queues.claim_from_queue_many(self, session, queue, n)

    def complete_and_claim_next(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes,
        queue: str,
    ) -> tuple[LeaseRecord, QueuePick | None]:
        return _queues.complete_and_claim_next(self, session, job_id, claim, result, queue)

    def queue_candidates(self, queue: str, limit: int) -> list[tuple[str, bytes]]:
        return _queues.queue_candidates(self, queue, limit)

    def queue_jobs(self, queue: str, limit: int | None = None) -> list[QueuedJob]:
        return _queues.queue_jobs(self, queue, limit)

    def queue_stats(self, queue: str) -> QueueStats:
        return _queues.queue_stats(self, queue)

    def purge(self, queue: str) -> int:
        return _queues.purge(self, queue)

    # -- waiting: _watches ---------------------------------------------------------------

    def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        _watches.wait_for_change(self, job_id, timeout_s)

    def wait_for_queue(self, queue: str, timeout_s: float) -> None:
        _watches.wait_for_queue(self, queue, timeout_s)

    def subscribe_job(self, job_id: str, callback: WakeCallback) -> Unsubscribe:
        return _watches.subscribe_job(self, job_id, callback)

    def subscribe_queue(self, queue: str, callback: WakeCallback) -> Unsubscribe:
        return _watches.subscribe_queue(self, queue, callback)

    def claimable_hint(
        self, job_ids: Sequence[str], queues: Sequence[str]
    ) -> tuple[Collection[str], Collection[str]] | None:
        return _watches.claimable_hint(self, job_ids, queues)

    def close(self) -> None:
        _watches.close(self)

    # -- the store epoch: _tokens --------------------------------------------------------

    def epoch(self) -> int:
        return _tokens.epoch(self)

    def bump_epoch(self, above: int | None = None) -> int:
        return _tokens.bump_epoch(self, above)
