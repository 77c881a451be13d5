"""Every error consensus_lease raises, as one tree.

::

    LeaseError                      base of everything below
    ├── LeaseNotHeld                the caller cannot prove it holds the lease: stop effects
    │   ├── LeaseSuspended          ownership unknown right now (e.g. ZooKeeper SUSPENDED);
    │   │                           may become HELD again after the store re-confirms it
    │   └── LeaseLost               final: the lease is gone and will not come back
    │       ├── SessionExpired      the store says the worker's session (etcd lease,
    │       │   │                   ZooKeeper session, SQLite session row) has expired
    │       │   └── StoreRegressed  the store's history went back (restored or wiped):
    │       │                       every session is over; bump the epoch
    │       └── StaleLeaseError     the store rejected owner/generation: another holder
    │                               claimed a newer generation, or the job was released
    ├── ClaimTimeout                ``claim(..., wait_s=...)`` ran out of time; nothing held
    ├── JobCompleted                the job has a completion record and is never claimed again
    ├── JobFailed                   the job used up its attempts (dead letter); claimed again
    │                               only after ``store.requeue(job_id)``
    ├── InvalidArgument             bad input (also a ``ValueError``); nothing was written
    │   └── UnsupportedBackend      unknown or malformed store URL
    ├── QueueFull                   the queue is at the backend's documented capacity;
    │                               nothing was enqueued
    ├── TokenSpaceExhausted         a store counter behind a job's tokens (ZooKeeper's
    │                               32-bit znode version) is at its limit; nothing was
    │                               written; the operator retires the job (see its docs)
    ├── UnsupportedOperation        the backend declares (in its Capabilities) that it
    │                               cannot do this
    ├── StoreClosed                 the LeaseStore was closed; open a new one
    ├── StoreInherited              used in a process made by fork() from the one that
    │                               opened the store; open a store in this process
    ├── BackendUnavailable          the store cannot be reached or refused service
    │   ├── AuthenticationFailed    wrong credentials / certificates
    │   └── OutcomeUnknown          a request may or may not have been applied and reading
    │                               back could not tell which
    └── FenceRejected               a fenced destination refused a token lower than one it
                                    has already accepted for the same resource

Each error carries ``job_id`` and ``generation`` where they apply (``None`` otherwise),
so a handler can log exactly which lease it concerns. Backend drivers translate their
client's exceptions (gRPC, kazoo, sqlite3) into these, chained with ``raise ... from``;
a raw client exception escaping the library is a bug.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationFailed",
    "BackendUnavailable",
    "ClaimTimeout",
    "FenceRejected",
    "InvalidArgument",
    "JobCompleted",
    "JobFailed",
    "LeaseError",
    "LeaseLost",
    "LeaseNotHeld",
    "LeaseSuspended",
    "OutcomeUnknown",
    "QueueFull",
    "SessionExpired",
    "StaleLeaseError",
    "StoreClosed",
    "StoreInherited",
    "StoreRegressed",
    "TokenSpaceExhausted",
    "UnsupportedBackend",
    "UnsupportedOperation",
]


class LeaseError(Exception):
    """Base class of every consensus_lease error.

    Attributes:
        job_id: the job concerned, or ``None`` when the error is not about one job.
        generation: the fencing token concerned, or ``None``.
    """

    def __init__(
        self, message: str, *, job_id: str | None = None, generation: int | None = None
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.generation = generation


class LeaseNotHeld(LeaseError):
    """The caller cannot prove it holds the lease. Produce no effect under it."""


class LeaseSuspended(LeaseNotHeld):
    """Ownership cannot be proven right now, but is not known to be lost.

    Raised while the session is SUSPENDED (ZooKeeper connection lost but session not yet
    expired). Effects must pause; the lease becomes HELD again only after the store has
    re-confirmed it, or LOST.
    """


class LeaseLost(LeaseNotHeld):
    """The lease is gone for good: renewal failed, the local deadline passed, or the
    store expired or reassigned it. Stop all effects; a new claim gets a new generation."""


class SessionExpired(LeaseLost):
    """The store reports the worker session expired (etcd lease TTL reached, ZooKeeper
    session expired, SQLite session row past its expiry), or no longer has it because it
    was closed (``Session.close()``), and no newer claim of the job exists (then
    ``StaleLeaseError``; see ``Backend.complete``). Every lease of the session is lost.
    Never retried away: open a new session."""


class StoreRegressed(SessionExpired):
    """The store's history went back: it was restored from an older backup or wiped
    (etcd: a response at a lower revision than one already seen, or another cluster id;
    ZooKeeper: a lower zxid, or its identity znode gone or changed; PostgreSQL: another
    WAL timeline or system identifier than the store recorded, after a standby was
    promoted or a backup restored). Tokens handed out
    from now on could be *lower* than tokens already used, so every session of this store
    is over, and a claim answered from the regressed history is handed back.

    What the operator must do: stop the workers, run ``consensus-lease bump-epoch
    --backend URL --above HIGHEST`` (the highest token any destination has accepted),
    then restart them (README: "Restoring a store").
    """


class StaleLeaseError(LeaseLost):
    """The store's compare failed: owner or generation no longer match.

    Attributes:
        current_generation: the generation the store holds now, when it told us.
    """

    def __init__(
        self,
        message: str,
        *,
        job_id: str | None = None,
        generation: int | None = None,
        current_generation: int | None = None,
    ) -> None:
        super().__init__(message, job_id=job_id, generation=generation)
        self.current_generation = current_generation


class ClaimTimeout(LeaseError):
    """``claim(job_id, wait_s=...)`` did not get the job in time. Nothing is held."""


class JobCompleted(LeaseError):
    """The job has a completion record; it is never claimed again.

    Attributes:
        generation: the generation that completed it.
    """


class JobFailed(LeaseError):
    """The job is FAILED: its attempts ran out (``max_attempts``) with a failure or a
    lease that ended without completion. It is not claimed again until an operator calls
    ``store.requeue(job_id)``.

    Attributes:
        generation: the generation of the last attempt.
        attempt: the number of attempts made.
        error: the last recorded error, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        job_id: str | None = None,
        generation: int | None = None,
        attempt: int | None = None,
        error: str | None = None,
    ) -> None:
        super().__init__(message, job_id=job_id, generation=generation)
        self.attempt = attempt
        self.error = error


class InvalidArgument(LeaseError, ValueError):
    """Bad input: job id, TTL, timeout, URL option. Raised before anything is written,
    mostly before anything is sent (a store's own refusal, e.g. etcd's of a request over
    its size or ``--max-txn-ops`` limit, comes back as one too); nothing was written and
    any lease held before the call is still held."""


class UnsupportedBackend(InvalidArgument):
    """The store URL is malformed or names a scheme no installed backend serves, or the
    backend's client library is missing (the message names the extra to install, e.g.
    ``pip install 'consensus_lease[etcd]'``)."""


class QueueFull(LeaseError):
    """The queue (or the store) is at the capacity the backend documents
    (``capabilities.max_queue_jobs``); refused before the enqueue is sent (after a read
    of the queue's counters, where the store keeps them), so the server is never pushed
    past what it can serve. Nothing was enqueued by the refused request.
    Purge completed jobs, or shard queues across stores."""


class TokenSpaceExhausted(LeaseError):
    """A counter the store compares or turns into fencing tokens is at its limit, and
    going on would wrap it: on ZooKeeper, a znode version (a signed 32-bit int; a job's
    version is its token's low part) at or above the backend's ceiling, or one that
    already wrapped (negative: written past the limit by a release without this guard).
    Refused before anything is sent: nothing was written. A lease already held is
    still held: the ceiling leaves room for its renewals, completion and release.

    Remedy (the job's tokens must go on above every earlier one): raise the store epoch
    above the job's last token, then retire the job's znode so its version starts again
    (on ZooKeeper: ``consensus-lease bump-epoch --above TOKEN``, then, while the job is
    not held, ``deleteall {chroot}/jobs/{name}`` in ``zkCli.sh``; a queued job is
    enqueued again under a new id). See the ZooKeeper store's page, "32-bit counters".

    Attributes:
        path: the znode whose counter is at the limit.
        version: its version as read (or as it would have been sent).
    """

    def __init__(
        self, message: str, *, path: str, version: int, job_id: str | None = None,
        generation: int | None = None,
    ) -> None:
        super().__init__(message, job_id=job_id, generation=generation)
        self.path = path
        self.version = version


class UnsupportedOperation(LeaseError):
    """The backend's :class:`~consensus_lease.backend.Capabilities` say it cannot do this
    (e.g. work queues on a third-party backend). Nothing was sent."""


class StoreClosed(LeaseError):
    """The :class:`~consensus_lease.LeaseStore` was closed (its sessions were closed with
    it, and their leases are LOST). Not retryable: open a new store."""


class StoreInherited(LeaseError):
    """The :class:`~consensus_lease.LeaseStore` (or a session or lease of it) was opened
    by another process and inherited through ``fork()``: multiprocessing's ``fork`` start
    method, Celery's prefork pool, gunicorn ``--preload``, PyTorch DataLoader workers.

    Its store-side sessions (etcd lease, ZooKeeper session, SQLite session row) belong
    to the parent, which still renews them: using them here would act for the parent,
    and ending them would take the parent's jobs away. Nothing was sent. Open a store in
    this process (e.g. in Celery's ``worker_process_init``, gunicorn's ``post_fork``, a
    DataLoader's ``worker_init_fn``). ``close()`` of the inherited store or session is
    allowed here and only forgets it: the parent's sessions are untouched.
    """


class BackendUnavailable(LeaseError):
    """The store could not be reached, timed out, or refused service.

    Leases are not lost by this alone: the session keeps its local deadline and reports
    loss when it passes without a successful renewal.
    """


class AuthenticationFailed(BackendUnavailable):
    """The store rejected the credentials or certificates given."""


class OutcomeUnknown(BackendUnavailable):
    """A request may or may not have been applied, and reading back could not settle it.

    Treat the lease as not held until a later read (``store.get``) shows the truth.
    """


class FenceRejected(LeaseError):
    """A fenced destination refused an effect: its token is lower than the highest token
    the destination has already accepted for that resource.

    Attributes:
        highest_seen: the highest token the destination had accepted.
    """

    def __init__(
        self,
        message: str,
        *,
        job_id: str | None = None,
        generation: int | None = None,
        highest_seen: int | None = None,
    ) -> None:
        super().__init__(message, job_id=job_id, generation=generation)
        self.highest_seen = highest_seen
