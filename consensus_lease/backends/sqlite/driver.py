"""The SQLite driver class: every :class:`~consensus_lease.backend.Backend` method, each
delegating to one module of the package, and the capabilities. The protocol is told in
the package docstring (:mod:`consensus_lease.backends.sqlite`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

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
from ...observe import notify
from ...record import ClaimResult, EnqueueItem, LeaseRecord, QueuedJob, QueueStats
from . import _config, _jobs, _jobs_claim, _layout, _queues, _sessions, _tokens, _watches
from ._tokens_history import History
from ._transport import Transport
from ._transport_txn import lease_transaction
from ._transport_wal import DEFAULT_LIMIT_BYTES, WalGuard
from ._watches import WATCH_MIN_S, ChangeWatch

__all__ = ["SqliteBackend"]


class SqliteBackend(Backend):
    """A lease store in one SQLite file. See the package docstring.

    Args:
        path: the database file, or ``":memory:"``.
        busy_timeout_s: seconds to wait for another writer.
        poll_interval_s: seconds between re-checks while waiting for a job.
        watch_interval_s: longest seconds between two ``PRAGMA data_version`` reads while
            claims wait (:mod:`._watches`).
        create: create the file and the tables if missing; with ``False`` open only an
            existing store.
        wal_limit_bytes: the ``-wal`` file's bound in bytes (:mod:`._transport_wal`).
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
        max_queue_claim_batch=1000,
        max_end_batch=1000,
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
        self._history = History(path)
        self._elections = ChangeTracker()
        self._completed: list[tuple[Any, ...]] = []  # rows COMPLETED_CAPTURE handed over
        self._claimed: list[tuple[Any, ...]] = []  # and CLAIM_CAPTURES
        self._counted: list[int] = []
        create = create or path == ":memory:"
        self._transport = Transport(path, busy_timeout_s, create, self._history)
        self._transport.on_regressed = partial(_tokens.mark_regressed, self)
        try:
            with self._transport.translate():
                self._transport.db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
                _layout.prepare(self, create)
        except BaseException:
            self.close()
            raise
        if path not in ("", ":memory:"):
            self._wal = WalGuard(path, limit_bytes=wal_limit_bytes,
                                 interval_s=wal_interval_s, report=self._wal_measured)
            self._wal.start()

    def _wal_measured(self, wal_bytes: int, blocked: bool) -> None:
        """A WAL check's result, to the store's observer (:mod:`._transport_wal`)."""
        notify(self.observer, lambda o: o.wal_measured(self.scheme, self.path, wal_bytes,
                                                        blocked))

    @classmethod
    def from_url(cls, url: str, options: Mapping[str, object]) -> SqliteBackend:
        path, kwargs = _config.parse_url(url, options)
        return cls(path, **kwargs)

    # -- sessions: _sessions -----------------------------------------------------------

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
        """The database clock now, seconds since the epoch."""
        return _sessions.store_time(self)

    # -- jobs: _jobs_claim, _jobs ----------------------------------------------------------

    def claim(self, session: SessionHandle, job_id: str) -> ClaimResult | None:
        return _jobs_claim.claim(self, session, job_id)

    def claim_many(
        self, session: SessionHandle, job_ids: Sequence[str]
    ) -> list[ClaimResult | None]:
        return _jobs_claim.claim_many(self, session, job_ids)

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
        return lease_transaction(self, session, job_id, claim, conn, lock_timeout_s)

    # -- work queues: _queues ------------------------------------------------------------

    def enqueue(
        self, queue: str, job_id: str, payload: bytes, max_attempts: int | None = None
    ) -> bool:
        return _queues.enqueue(self, queue, job_id, payload, max_attempts)

    def enqueue_many(self, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
        return _queues.enqueue_many(self, queue, items)

    def complete_and_claim_next(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes,
        queue: str,
    ) -> tuple[LeaseRecord, QueuePick | None]:
        return _queues.complete_and_claim_next(self, session, job_id, claim, result, queue)

    def claim_from_queue(
        self, session: SessionHandle, queue: str
    ) -> tuple[str, ClaimResult | None, bytes] | None:
        return _queues.claim_from_queue(self, session, queue)

    def claim_from_queue_many(
        self, session: SessionHandle, queue: str, n: int
    ) -> list[QueuePick]:
        return _queues.claim_from_queue_many(self, session, queue, n)

    def queue_stats(self, queue: str) -> QueueStats:
        return _queues.queue_stats(self, queue)

    def queue_candidates(self, queue: str, limit: int) -> list[tuple[str, bytes]]:
        return _queues.queue_candidates(self, queue, limit)

    def queue_jobs(self, queue: str, limit: int | None = None) -> list[QueuedJob]:
        return _queues.queue_jobs(self, queue, limit)

    def wait_for_queue(self, queue: str, timeout_s: float) -> None:
        _queues.wait_for_queue(self, queue, timeout_s)

    def purge(self, queue: str) -> int:
        return _queues.purge(self, queue)

    # -- the store epoch: _tokens ----------------------------------------------------------

    def epoch(self) -> int:
        return _tokens.epoch(self)

    def bump_epoch(self, above: int | None = None) -> int:
        return _tokens.bump_epoch(self, above)

    # -- waiting: _watches ---------------------------------------------------------------

    def subscribe_job(self, job_id: str, callback: WakeCallback) -> Unsubscribe:
        """See :meth:`Backend.subscribe_job`: the default poller, woken also by the
        change watch (:mod:`._watches`) when another process changed the file."""
        if self._watch is not None:
            self._watch.ensure()
        return super().subscribe_job(job_id, callback)

    def subscribe_queue(self, queue: str, callback: WakeCallback) -> Unsubscribe:
        """See :meth:`Backend.subscribe_queue` and :meth:`subscribe_job`."""
        if self._watch is not None:
            self._watch.ensure()
        return super().subscribe_queue(queue, callback)

    def _claims_wait(self) -> bool:
        return _watches.claims_wait(self)

    def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        _watches.wait_for_change(self, job_id, timeout_s)

    def claimable_hint(
        self, job_ids: Sequence[str], queues: Sequence[str]
    ) -> tuple[Collection[str], Collection[str]] | None:
        return _watches.claimable_hint(self, job_ids, queues)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        if self._wal is not None:
            self._wal.close()
        self.close_subscriptions()
        self._transport.close()
