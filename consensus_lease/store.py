"""The user-facing store: open one from a URL, open worker sessions from it."""

from __future__ import annotations

import os
import socket
import threading
import uuid
import weakref
from collections.abc import Iterable
from importlib.metadata import entry_points
from types import TracebackType
from typing import cast

from ._election import election_key
from ._extras import BACKEND_EXTRAS, DISTRIBUTION, install_hint, missing_dependency
from ._fork import Origin, abandon
from ._liveness import EventRelay
from ._renewer import Renewer
from ._waiting import Waiters
from .backend import Backend, Capabilities
from .clock import Clock, SystemClock
from .election import LeaderRecord, leader_record, require_elections
from .errors import (
    BackendUnavailable,
    InvalidArgument,
    QueueFull,
    StoreClosed,
    UnsupportedBackend,
    UnsupportedOperation,
)
from .leader_watch import LeaderWatch
from .observe import Observer, default_observer, notify
from .options import merge_options, redact_url
from .record import EnqueueItem, LeaseRecord, QueuedJob, QueueStats
from .retry import DEFAULT_RETRY, RetryPolicies, RetryPolicy, check_max_attempts
from .session import Session, close_with_store
from .validation import (
    check_election_name,
    check_job_id,
    check_limit,
    check_owner,
    check_queue_name,
    check_ttl,
    check_wait,
)

__all__ = ["DEFAULT_TTL_S", "ENTRY_POINT_GROUP", "LeaseStore", "default_owner", "open_store"]

ENTRY_POINT_GROUP = "consensus_lease.backends"
DEFAULT_TTL_S = 10.0


def default_owner() -> str:
    """``host:pid:random`` — unique per session, readable in ``inspect``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def available_schemes() -> list[str]:
    """URL schemes served by the installed backends."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def open_store(
    url: str,
    *,
    clock: Clock | None = None,
    observer: Observer | None = None,
    retry: RetryPolicy | None = None,
    **options: object,
) -> LeaseStore:
    """Open a lease store from a URL.

    ==========================================================  =====================
    URL                                                          backend
    ==========================================================  =====================
    ``sqlite:////abs/path/jobs.db`` (``sqlite:///rel.db``)       embedded (default)
    ``memory://``                                                in-process, tests
    ``etcd://127.0.0.1:2379,127.0.0.2:2379/prefix``              etcd v3
    ``zk://127.0.0.1:2181,127.0.0.2:2181/chroot``                ZooKeeper
    ``postgresql://user:password@host:5432/db?schema=jobs``      PostgreSQL
    ==========================================================  =====================

    Backends are found through the ``consensus_lease.backends`` entry-point group, keyed
    by scheme, so a third-party package can add one. Options come from the URL's query
    string and from keyword arguments (keyword arguments win); each backend documents
    its own in its module docstring. Backends share one vocabulary (``timeout_s``,
    ``connect_timeout_s``, ``ca_file``, ``cert_file``, ``key_file``, ``user``,
    ``password``) and one parser: see :mod:`consensus_lease.options`.

    Args:
        url: the store URL.
        clock: clock for local deadlines and waiting in sessions of this store
            (default: the system monotonic clock). Never used to decide ownership.
        observer: receives lease events for metrics (see :mod:`consensus_lease.observe`);
            default: the one set by :func:`consensus_lease.observe.set_default_observer`
            (e.g. by :func:`consensus_lease.otel.instrument`), else none.
        **options: backend options.

    Raises:
        UnsupportedBackend: malformed URL or unknown scheme (the message lists the
            installed schemes), or the backend's client library is not installed (the
            message names the extra: ``pip install 'consensus_lease[etcd]'``).
        InvalidArgument: an unknown or renamed option (the message lists the accepted
            names, or names the new one), a bad value, or a name given twice in the
            query string.
        BackendUnavailable / AuthenticationFailed: the store cannot be reached or used:
            ``open_store`` connects (SQLite opens the file; etcd, ZooKeeper and
            PostgreSQL answer within ``connect_timeout_s``).
    """
    backend_cls = backend_class(url)
    backend = backend_cls.from_url(url, merge_options(url, options))
    if observer is None:
        observer = default_observer()
    return LeaseStore(backend, clock=clock, observer=observer, retry=retry)


def backend_class(url: str) -> type[Backend]:
    """The backend class that serves ``url``'s scheme (its entry point, loaded), without
    connecting: its ``capabilities`` (a class attribute) say, before a store is opened,
    what it accepts (e.g. the TTL range the worker command checks ``--ttl-s`` against).

    Raises:
        UnsupportedBackend: as :func:`open_store` does for a malformed URL, an unknown
            scheme, or a backend whose client library is not installed.
    """
    if not isinstance(url, str) or "://" not in url:
        raise UnsupportedBackend(
            f"not a store URL: {redact_url(url)!r}; expected SCHEME://..., with SCHEME one of "
            f"{', '.join(available_schemes())}"
        )
    scheme = url.split("://", 1)[0].lower()
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == scheme]
    if not matches:
        base, plus, _ = scheme.partition("+")
        hint = (f" ({scheme!r} is SQLAlchemy's dialect+driver form: the store URL is the "
                f"same with {base + '://'!r})"
                if plus and any(ep.name == base for ep in entry_points(group=ENTRY_POINT_GROUP))
                else "")
        raise UnsupportedBackend(
            f"no backend for scheme {scheme!r} in {redact_url(url)!r}; installed: "
            f"{', '.join(available_schemes()) or 'none (is consensus_lease installed?)'}"
            f"{hint}"
        )
    try:
        backend_cls = matches[0].load()
    except ImportError as exc:
        raise UnsupportedBackend(_missing_client(scheme, matches[0].value, exc)) from exc
    return cast("type[Backend]", backend_cls)


def _missing_client(scheme: str, target: str, exc: ImportError) -> str:
    """What to tell a user whose backend module for ``scheme`` (entry point ``target``)
    failed to import with ``exc``: the extra to install when it is one of ours."""
    missing = missing_dependency(exc)
    if missing is None:
        return f"the {scheme} backend ({target}) cannot be imported: {exc}"
    ours = target.startswith(f"{DISTRIBUTION}.")
    extra = BACKEND_EXTRAS.get(scheme) if ours else None
    if extra is None:
        return (f"the {scheme} backend ({target}) needs the {missing!r} module, "
                f"which is not installed")
    return f"the {scheme} backend needs: {install_hint(extra)} (no module {missing!r})"


class LeaseStore:
    """A lease store: where job lease records live. Thread-safe, not fork-safe: a store
    belongs to the process that opened it. In a child made by ``fork()`` every use of it
    (and of its sessions and leases) raises ``StoreInherited``, and ``close()`` only
    forgets it, leaving the parent's sessions alone: open a store in the child.

    Args:
        backend: the driver (usually made by :func:`open_store`).
        clock: default clock for sessions' local deadlines and waits.
        observer: receives lease events of every session of this store.
        retry: the default :class:`~consensus_lease.RetryPolicy` of this store's work
            queues and named jobs (per queue: :meth:`set_retry_policy`).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        clock: Clock | None = None,
        observer: Observer | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        if clock is not None and not isinstance(clock, Clock):
            raise InvalidArgument(f"clock must be a consensus_lease.Clock, not {clock!r}")
        if observer is not None and not isinstance(observer, Observer):
            raise InvalidArgument(
                f"observer must be a consensus_lease.observe.Observer, not {observer!r}"
            )
        self.backend = backend
        self.clock: Clock = clock or SystemClock()
        self.observer = observer
        if observer is not None:
            backend.observer = observer  # for the driver's own measurements
            notify(observer, lambda o: o.attached(backend.scheme))
        self.retry_policies = RetryPolicies(DEFAULT_RETRY if retry is None else retry)
        self._closed = False
        self._origin = Origin()
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        self._sessions_lock = threading.Lock()
        self._renewers: list[tuple[Clock, Renewer]] = []
        """Keepalives and deadlines of the store's sessions, one renewer per clock
        (threads shared by the sessions on that clock: see :mod:`._renewer`)."""
        self._watchers = Waiters()

    def check_open(self) -> None:
        """Raise unless the store may be used: ``StoreInherited`` in a child made by
        ``fork()``, ``StoreClosed`` once closed. A local check, no round trip."""
        self._origin.check("LeaseStore")
        if self._closed:
            raise StoreClosed("this LeaseStore is closed; open a new one")

    @property
    def capabilities(self) -> Capabilities:
        return self.backend.capabilities

    @property
    def watchers(self) -> Waiters:
        """The wake-ups of this store's open leader watches (``watch_leader``, sync and
        asyncio), which closing the store wakes. The watches register themselves
        (:class:`~consensus_lease.leader_watch.LeaderWatch`); read
        ``len(store.watchers)``, how many are open, and leave the rest to them."""
        return self._watchers

    @property
    def closed(self) -> bool:
        """``True`` once :meth:`close` has been called (then every call raises
        :class:`~consensus_lease.errors.StoreClosed`). A read of local state, no round
        trip."""
        return self._closed

    def session(
        self,
        owner: str | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        *,
        safety_margin_s: float | None = None,
        keepalive: bool = True,
        clock: Clock | None = None,
    ) -> Session:
        """Open a worker session (etcd lease, ZooKeeper session, SQLite session row).

        Args:
            owner: label recorded with every claim (default ``host:pid:random``).
            ttl_s: requested TTL in seconds (float); the store may grant another within
                its rules (etcd's minimum, ZooKeeper's 2-20 x tickTime): read
                ``session.granted_ttl_s``. Must be within ``capabilities``' range.
            safety_margin_s: taken off the local deadline to cover clock-rate drift and
                scheduling delay (default 10% of the granted TTL).
            keepalive: renew every granted TTL / 3 (default), on the store's shared
                renewal threads (see ``consensus_lease._renewer``).
                With ``False`` the worker calls ``session.keepalive()`` itself.
            clock: overrides the store's clock for this session.

        Raises:
            InvalidArgument: bad owner, TTL or margin; nothing created.
            BackendUnavailable / AuthenticationFailed: no session was created.
            StoreClosed / StoreInherited: the store is closed, or was opened by the
                process this one was forked from.
        """
        self.check_open()
        if clock is not None and not isinstance(clock, Clock):
            raise InvalidArgument(f"clock must be a consensus_lease.Clock, not {clock!r}")
        owner = default_owner() if owner is None else check_owner(owner)
        caps = self.backend.capabilities
        ttl = check_ttl(ttl_s, min_s=caps.min_ttl_s, max_s=caps.max_ttl_s)
        use_clock = clock or self.clock
        events = EventRelay()  # events before the Session exists are replayed to it
        send = use_clock.monotonic()
        handle = self.backend.open_session(owner, ttl, events)
        try:
            session = Session(
                self.backend,
                handle,
                clock=use_clock,
                send_time=send,
                safety_margin_s=safety_margin_s,
                keepalive=keepalive,
                observer=self.observer,
                events=events,
                retry=self.retry_policies,
                renewer=self._renewer_for(use_clock),
            )
        except BaseException:
            self.backend.close_session(handle)
            raise
        with self._sessions_lock:
            self._sessions.add(session)
            closed = self._closed
        if closed:  # close() ran while this session was being opened: it missed it
            close_with_store(session)
            raise StoreClosed("this LeaseStore was closed while the session was opened")
        return session

    def _renewer_for(self, clock: Clock) -> Renewer:
        with self._sessions_lock:
            if self._closed:
                raise StoreClosed("this LeaseStore is closed; open a new one")
            for known, renewer in self._renewers:
                if known is clock:
                    return renewer
            renewer = Renewer(clock)
            self._renewers.append((clock, renewer))
            return renewer

    def get(self, job_id: str) -> LeaseRecord | None:
        """The job's lease record as the store has it now, or ``None`` if never seen.

        Raises:
            InvalidArgument: bad job id.
            BackendUnavailable: see :mod:`consensus_lease.errors`.
        """
        self.check_open()
        return self.backend.get(check_job_id(job_id))

    def records(self, limit: int | None = None) -> list[LeaseRecord]:
        """Every job's record, ordered by job id (at most ``limit``, an int >= 0), for
        inspection."""
        self.check_open()
        return self.backend.records(check_limit(limit))

    # -- elections -----------------------------------------------------------------

    def leader(self, name: str) -> LeaderRecord | None:
        """The leader of the election ``name`` as the store has it now (one read), or
        ``None`` if nobody leads it (never campaigned, resigned, or the leader's session
        expired in the store).

        Raises:
            InvalidArgument: bad name.
            UnsupportedOperation: the backend has no elections.
            BackendUnavailable / StoreClosed / StoreInherited: see :mod:`consensus_lease.errors`.
        """
        self.check_open()
        check_election_name(name)
        require_elections(self.backend)
        return leader_record(name, self.backend.get(election_key(name)))

    def watch_leader(self, name: str, *, timeout_s: float | None = None) -> LeaderWatch:
        """Follow the election ``name``: an iterator of its leader now (a
        :class:`~consensus_lease.LeaderRecord`, or ``None`` when nobody leads), then of
        each change: a new leader, a new value (``proclaim``), nobody. Woken by the
        store (etcd and ZooKeeper watches, PostgreSQL's ``LISTEN`` with a poll as
        fallback; SQLite and memory poll, every ``poll_interval_s``), reading the leader
        after each wake-up.

        Never goes back: a read older than one already yielded (a lower generation, or
        a leader already reported gone) is skipped. Changes faster than the reads
        coalesce (a resignation and the next leader's claim between two reads yield
        the next leader only), in generation order.

        ::

            with store.watch_leader("scheduler", timeout_s=60) as leaders:
                for leader in leaders:
                    route_to(None if leader is None else leader.value)

        Args:
            name: the election's name.
            timeout_s: end the iteration this many seconds (>= 0) after this call;
                ``None``: until closed.

        Returns:
            A :class:`~consensus_lease.leader_watch.LeaderWatch`: an iterator that
            ``close()`` (any thread) or the store's close ends, usable as a context
            manager. Its ``next()`` raises ``BackendUnavailable`` if a read fails.

        Raises:
            InvalidArgument: bad name or timeout.
            UnsupportedOperation: the backend has no elections.
            StoreClosed / StoreInherited: see :mod:`consensus_lease.errors`.
        """
        self.check_open()
        check_election_name(name)
        require_elections(self.backend)
        timeout = None if timeout_s is None else check_wait(timeout_s, "timeout_s")
        return LeaderWatch(self, name, timeout)

    # -- work queues ---------------------------------------------------------------

    def _require_queues(self) -> None:
        self.check_open()
        if not self.backend.capabilities.queues:
            raise UnsupportedOperation(f"the {self.backend.scheme} backend has no work queues")

    def set_retry_policy(self, queue: str, policy: RetryPolicy) -> None:
        """Use ``policy`` for ``queue`` in this process: its ``max_attempts`` for jobs
        enqueued here from now on (recorded with each job, so every worker applies the
        same limit), and its delays for ``lease.fail()`` without ``retry_in_s`` on leases
        from ``claim_next(queue)``. Set the same policy in producers and workers.

        Raises:
            InvalidArgument: bad queue name or policy.
        """
        check_queue_name(queue)
        self.retry_policies.set(queue, policy)

    def epoch(self) -> int:
        """The store's epoch (0 until ``bump_epoch`` was first run); every token is
        ``epoch * 2**backend.epoch_shift + the store's own counter``.

        Raises:
            UnsupportedOperation / BackendUnavailable: see :mod:`consensus_lease.errors`.
        """
        self.check_open()
        return self.backend.epoch()

    def bump_epoch(self, above: int | None = None) -> int:
        """Raise the store's epoch so that every fencing token handed out from now on
        exceeds every token handed out before — and ``above``, the highest token any of
        your destinations has accepted (which also covers a store that lost its epoch in
        a wipe). Run it after restoring the store from a backup, with every worker
        stopped (README: "Restoring a store"). One atomic store operation; returns the
        new epoch.

        Raises:
            InvalidArgument: ``above`` is not an int >= 0, or the epoch would leave the
                int64 token range; nothing changed.
            UnsupportedOperation / BackendUnavailable / OutcomeUnknown: see
                :mod:`consensus_lease.errors`.
        """
        self.check_open()
        if above is not None and (isinstance(above, bool) or not isinstance(above, int)
                                  or not 0 <= above < 2**63):
            raise InvalidArgument(f"above must be a token (an int from 0 to 2**63-1), not "
                                  f"{above!r}")
        return self.backend.bump_epoch(above)

    def requeue(self, job_id: str) -> LeaseRecord:
        """Put a FAILED job back: claimable at once, with a fresh budget of
        ``max_attempts`` attempts (``attempt`` keeps counting, so the next claim is
        attempt + 1; the last error is kept for inspection). One atomic store operation.

        Returns:
            The job's record after the requeue (AVAILABLE).

        Raises:
            InvalidArgument: bad id, or the job is unknown or not FAILED; nothing changed.
            BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
        """
        self.check_open()
        return self.backend.requeue(check_job_id(job_id))

    def enqueue(
        self, queue: str, job_id: str, payload: bytes = b"", *, max_attempts: int | None = None
    ) -> bool:
        """Add a job to a work queue, to be claimed with ``session.claim_next(queue)``.

        Idempotent: enqueueing a job already in the queue changes nothing and returns
        ``False``. The job is an ordinary job otherwise (``claim(job_id)``, ``get``).

        Args:
            queue: the queue's name (same rules as job ids).
            job_id: the job (non-empty str, at most 256 UTF-8 bytes, no NUL), unique in
                the store. Do not reuse the id of a purged job: its generation would
                start again, and a destination fenced by that id would (safely) reject
                the new holder's effects.
            payload: bytes, at most ``capabilities.max_payload_bytes``.
            max_attempts: how many claims the job may get (int >= 1); ``None`` takes the
                queue's :class:`RetryPolicy` (unlimited by default). Recorded with the job.
                A failed last attempt makes it FAILED at once; a last attempt that ends
                without completion (expiry, release) makes it FAILED at its next claim.

        Returns:
            ``True`` if added, ``False`` if already queued.

        Raises:
            InvalidArgument: bad name or id, payload not bytes or over the store's size
                limit (checked before sending), or the job exists outside this queue.
            UnsupportedOperation: the backend has no work queues.
            BackendUnavailable / OutcomeUnknown: see :mod:`consensus_lease.errors`.
        """
        check_queue_name(queue)
        check_job_id(job_id)
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"payload must be bytes, not {type(payload).__name__}")
        self._require_queues()
        limit = self.backend.capabilities.max_payload_bytes
        if (size := memoryview(payload).nbytes) > limit:
            raise InvalidArgument(
                f"payload is {size} bytes; the {self.backend.scheme} store accepts at "
                f"most {limit} in one request",
                job_id=job_id,
            )
        if max_attempts is None:
            max_attempts = self.retry_policies.get(queue).max_attempts
        else:
            check_max_attempts(max_attempts)
        return self.backend.enqueue(queue, job_id, bytes(payload), max_attempts)

    def enqueue_many(
        self, queue: str, items: Iterable[EnqueueItem | tuple[str, bytes] | str]
    ) -> list[bool]:
        """Add many jobs to a work queue with the store's native batch: one round trip
        per ``capabilities.max_enqueue_batch`` jobs (etcd: one txn, after one read of the
        queue's counters the first time this process enqueues into it; ZooKeeper: one
        multi; SQLite and PostgreSQL: one transaction).

        Idempotent like :meth:`enqueue`: a job already in the queue is left unchanged.
        Each chunk of at most ``max_enqueue_batch`` jobs is atomic (ZooKeeper splits a
        chunk whose payloads exceed its multi's byte budget into several atomic multis,
        after checking every job of the chunk first, and etcd one that exceeds a server's
        lower ``--max-txn-ops`` into several atomic transactions; see their backend
        docs); chunks are
        sent in order, so after an error the earlier chunks are enqueued and the rest are
        not — calling again with the same items is safe and adds only what is missing.

        Args:
            queue: the queue's name.
            items: :class:`EnqueueItem`, ``(job_id, payload)`` or a bare ``job_id``
                (empty payload), each checked as :meth:`enqueue` checks it; job ids must
                be distinct within the call.

        Returns:
            ``list[bool]``, one per item in order: ``True`` if added, ``False`` if
            already queued.

        Raises:
            InvalidArgument: a bad item or duplicate job id (nothing sent), or a job
                that exists outside this queue (its chunk is not added).
            QueueFull: the queue is at ``capabilities.max_queue_jobs`` (that chunk is
                not added).
            UnsupportedOperation: the backend has no work queues.
            BackendUnavailable / OutcomeUnknown: a chunk's outcome; earlier chunks are in.
        """
        check_queue_name(queue)
        if isinstance(items, (str, bytes, bytearray, memoryview)):
            raise InvalidArgument(
                "enqueue_many takes an iterable of items (EnqueueItem, (job_id, payload) or "
                f"job_id), not a single {type(items).__name__}: wrap one job in a list")
        self._require_queues()
        limit = self.backend.capabilities.max_payload_bytes
        default_attempts = self.retry_policies.get(queue).max_attempts
        batch: list[EnqueueItem] = []
        seen: set[str] = set()
        for raw in items:
            if isinstance(raw, str):
                item = EnqueueItem(raw)
            elif isinstance(raw, tuple) and len(raw) == 2:
                item = EnqueueItem(raw[0], raw[1])
            elif isinstance(raw, EnqueueItem):
                item = raw
            else:
                raise InvalidArgument(
                    "enqueue_many items are EnqueueItem, (job_id, payload) or job_id, "
                    f"not {type(raw).__name__}")
            check_job_id(item.job_id)
            if item.job_id in seen:
                raise InvalidArgument("job id given twice to enqueue_many",
                                      job_id=item.job_id)
            seen.add(item.job_id)
            payload = item.payload
            if not isinstance(payload, (bytes, bytearray, memoryview)):
                raise InvalidArgument(
                    f"payload must be bytes, not {type(payload).__name__}",
                    job_id=item.job_id)
            if (size := memoryview(payload).nbytes) > limit:
                raise InvalidArgument(
                    f"payload is {size} bytes; the {self.backend.scheme} store "
                    f"accepts at most {limit} in one request",
                    job_id=item.job_id,
                )
            attempts = item.max_attempts
            if attempts is None:
                attempts = default_attempts
            else:
                check_max_attempts(attempts)
            batch.append(EnqueueItem(item.job_id, bytes(payload), attempts))
        size = max(1, self.backend.capabilities.max_enqueue_batch)
        added: list[bool] = []
        for start in range(0, len(batch), size):
            try:
                added.extend(self.backend.enqueue_many(queue, batch[start:start + size]))
            except (InvalidArgument, QueueFull, BackendUnavailable) as exc:
                if not start:
                    raise
                raise type(exc)(
                    f"{exc} (the first {start} items, in earlier chunks of {size}, were "
                    "enqueued; calling again with the same items adds only what is missing)",
                    job_id=exc.job_id, generation=exc.generation,
                ) from exc
        return added

    def queue_jobs(self, queue: str, limit: int | None = None) -> list[QueuedJob]:
        """The jobs of ``queue``, oldest enqueued first (an unknown queue is empty)."""
        check_queue_name(queue)
        self._require_queues()
        return self.backend.queue_jobs(queue, check_limit(limit))

    def queue_stats(self, queue: str) -> QueueStats:
        """Counts of ``queue``'s jobs by state, and the earliest lease end among held
        ones (store clock). Each backend documents its cost and how the counts relate to
        concurrent claims (see its ``queue_stats``)."""
        check_queue_name(queue)
        self._require_queues()
        return self.backend.queue_stats(queue)

    def purge(self, queue: str) -> int:
        """Delete the records of ``queue``'s COMPLETED jobs (result included); return how
        many. Held and available jobs are untouched. Until purged, completed jobs stay
        recorded with their generation and result. SQLite and PostgreSQL delete in one
        transaction; etcd and ZooKeeper in steps of up to 64 and 100 jobs, each step bounded by
        the store's timeout on its own, so a large queue is purged whole.

        Raises:
            UnsupportedOperation / BackendUnavailable: see :mod:`consensus_lease.errors`.
                On etcd and ZooKeeper the jobs of the steps done before it stay purged:
                call again for the rest.
        """
        check_queue_name(queue)
        self._require_queues()
        return self.backend.purge(queue)

    def close(self) -> None:
        """Close every session opened from this store (their jobs are handed back and
        their leases become LOST), then the driver. Later operations on the store, its
        sessions and their leases raise ``StoreClosed`` (``ensure_held`` raises
        ``LeaseLost``). Idempotent.

        In a child made by ``fork()`` it only forgets the store: no store request (the
        sessions are the parent's), no call into the inherited client objects; see
        :class:`~consensus_lease.errors.StoreInherited`.
        """
        if self._closed:
            return
        self._closed = True
        if self._origin.inherited():
            abandon(self.backend)  # never finalised here: the parent still uses its twin
            return
        with self._sessions_lock:
            sessions = list(self._sessions)
        for session in sessions:
            close_with_store(session)
        with self._sessions_lock:
            renewers, self._renewers = self._renewers, []
        for _, renewer in renewers:
            renewer.close()
        self._watchers.close()
        self.backend.close()

    def __enter__(self) -> LeaseStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
