"""A worker's handle on one claimed job."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING

from ._callbacks import check_callback, run_callback
from .errors import (
    BackendUnavailable,
    InvalidArgument,
    LeaseLost,
    LeaseNotHeld,
    OutcomeUnknown,
    StoreClosed,
    StoreInherited,
)
from .record import ClaimResult, LeaseRecord
from .states import LeaseState, SessionState
from .validation import check_retry_in, check_wait, error_text

if TYPE_CHECKING:
    from ._holdings import Holdings
    from .session import Session
    from .transaction import LeaseTransaction

__all__ = ["Lease"]

log = logging.getLogger("consensus_lease")


class Lease:
    """Temporary ownership of one job, with its fencing token.

    A lease is *not* exactly-once: the store guarantees that at most one live holder has
    the job at any store time, and that a stale holder's renew/complete/release is
    rejected. It cannot stop a request already in flight from a paused holder, so every
    effect must carry :attr:`generation` to a destination that fences it (see
    :mod:`consensus_lease.fencing`) or dedupes it by ``(job_id, generation, effect)``.

    The race this prevents, step by step::

        t0  A claims job 42 -> generation 7; A's process is then paused (GC, SIGSTOP)
        t1  A's session TTL runs out in the store; B claims job 42 -> generation 8
        t2  A resumes. A.ensure_held() raises LeaseLost: its local deadline (send time of
            its last renewal + TTL - margin) passed while it was paused
        t3  A ignores that and writes "charge card" with token 7: the fence has seen 8
            and rejects it (FenceRejected)
        t4  A calls complete(): the store compares owner+generation in the same atomic
            operation, finds 8, and raises StaleLeaseError. B completes with 8.

    Use it as a context manager: on exit without ``complete()`` the lease is released so
    the job is claimable at once.

    A lease ends once, one way: :meth:`complete`, :meth:`release` or :meth:`fail`.
    Repeating ``release`` or ``complete`` is harmless (``release`` again does nothing;
    ``complete`` again with the same result returns the record); ending it another way
    afterwards (``release`` or ``fail`` after ``complete``, a ``complete`` with a
    different result, ...) or failing it twice is a mistake and raises
    ``InvalidArgument``, sending nothing. After
    ``store.close()`` every operation raises ``StoreClosed`` (``ensure_held``:
    ``LeaseLost``); in a child made by ``fork()``, ``StoreInherited``.

    Attributes:
        job_id (str): the job.
        generation (int): the fencing token; strictly increasing per job across claims.
        owner (str): the owner label of the holding session.
        session (Session): the worker session the lease lives under.
        claim_result (ClaimResult): the store's answer to the claim, carrying the
            backend's opaque per-claim handle (for drivers and tests).

    Leases are made by :meth:`Session.claim` and its siblings, never directly.
    """

    __slots__ = (
        "_holdings", "_listeners", "_lock", "_lost_reason", "_record", "_result", "_state",
        "claim_result", "generation", "job_id", "payload", "queue", "session",
    )

    def __init__(
        self, session: Session, holdings: Holdings, job_id: str, claim: ClaimResult,
        payload: bytes | None = None, queue: str | None = None,
    ) -> None:
        self.session = session
        self._holdings = holdings
        self.job_id = job_id
        self.claim_result = claim
        """The store's answer to the claim, with the backend's opaque per-claim handle,
        passed back to the backend with every operation on this lease."""
        self.generation = claim.generation
        self.payload = payload
        """The queue payload, for leases from ``claim_next``; ``None`` otherwise."""
        self.queue = queue
        """The work queue, for leases from ``claim_next``; ``None`` otherwise."""
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Lease, LeaseLost], None]] = []
        self._state = LeaseState.HELD
        self._lost_reason: LeaseLost | None = None
        self._record: LeaseRecord | None = None
        self._result: bytes | None = None  # what complete() recorded

    # -- introspection --------------------------------------------------------------

    @property
    def fencing_token(self) -> int:
        """Alias of :attr:`generation`: the token to send with every effect."""
        return self.generation

    @property
    def attempt(self) -> int:
        """This claim's attempt number: 1 for the job's first claim, +1 per claim (also
        after a requeue). Use it to give up on, or log, jobs that keep failing."""
        return self.claim_result.attempt

    @property
    def owner(self) -> str:
        return self.session.owner

    @property
    def granted_ttl_s(self) -> float:
        """The TTL the store granted the session, in seconds."""
        return self.session.granted_ttl_s

    @property
    def deadline(self) -> float:
        """Monotonic time (the session clock's ``monotonic()``) after which this worker
        must assume the lease lost: send time of the last successful renewal + granted
        TTL - safety margin."""
        return self.session.deadline

    def remaining_s(self) -> float:
        """Seconds until :attr:`deadline` (negative once passed)."""
        return self.session.remaining_s()

    @property
    def state(self) -> LeaseState:
        """The lease's state now; LOST as soon as the local deadline has passed."""
        with self._lock:
            if self._state is not LeaseState.HELD:
                return self._state
        session_state = self.session.state
        if session_state is SessionState.SUSPENDED:
            return LeaseState.SUSPENDED
        if session_state is not SessionState.ACTIVE or self.session.remaining_s() <= 0:
            return LeaseState.LOST
        return LeaseState.HELD

    @property
    def lost_reason(self) -> LeaseLost | None:
        """Why the lease was lost, once it is."""
        with self._lock:
            return self._lost_reason or self.session.lost_reason

    def __repr__(self) -> str:
        return (
            f"Lease(job_id={self.job_id!r}, generation={self.generation}, "
            f"owner={self.owner!r}, state={self.state.value})"
        )

    # -- the check before every effect ------------------------------------------------

    def ensure_held(self) -> None:
        """Raise unless this worker may still produce effects under the lease.

        A local check, no round trip: call it before each effect. It compares the
        monotonic clock with :attr:`deadline`, so a worker paused past its TTL finds out
        on its first instruction after resuming.

        Raises:
            LeaseLost: the lease is lost, released or completed (final); also once the
                store was closed.
            LeaseSuspended: the session cannot currently prove ownership (may recover).
            StoreInherited: this is a child made by ``fork()``: the lease is the
                parent's, not this process's.
        """
        origin = self._holdings.liveness.origin
        if origin.inherited():
            origin.check(f"lease on {self.job_id!r}")
        with self._lock:
            state, reason = self._state, self._lost_reason
        if state is LeaseState.LOST:
            lost_cls = type(reason) if isinstance(reason, LeaseLost) else LeaseLost
            raise lost_cls(
                f"lease on {self.job_id!r} generation {self.generation} is lost: {reason}",
                job_id=self.job_id,
                generation=self.generation,
            ) from reason
        if state in (LeaseState.RELEASED, LeaseState.COMPLETED, LeaseState.FAILED):
            raise LeaseLost(
                f"lease on {self.job_id!r} generation {self.generation} was {state.value}",
                job_id=self.job_id,
                generation=self.generation,
            )
        try:
            self.session.ensure_alive()
        except LeaseNotHeld as exc:
            raise type(exc)(
                f"lease on {self.job_id!r} generation {self.generation}: {exc}",
                job_id=self.job_id,
                generation=self.generation,
            ) from exc

    # -- transactional fencing (the store's own database) ----------------------------

    @contextmanager
    def transaction(self, conn: object, *,
                    lock_timeout_s: float | None = None) -> Iterator[LeaseTransaction]:
        """Run a transaction on ``conn`` that commits only ahead of any later claim of
        this job, with once-per-job effect records::

            with lease.transaction(conn) as tx:
                if tx.once("charge"):   # False: some generation of this job did it
                    conn.execute(...)

        Only where the lease store and the effect share a database
        (``capabilities.transactions``): ``postgresql://`` with your own psycopg 3
        connection to its database, ``sqlite://`` with your own ``sqlite3`` connection
        to its file. It begins a transaction (PostgreSQL: ``conn.transaction()``, which
        it wraps, a savepoint inside your own ``with conn.transaction():``, which then
        commits it; SQLite: ``BEGIN IMMEDIATE``), checks and locks the lease's hold as
        its first statement, and commits at the end of the block (rolls back on an
        error). A transaction opened implicitly (psycopg: a statement on a connection
        without ``autocommit=True``, not yet committed; SQLite: any open transaction) is
        refused: the block could not commit it.

        Guarantee, per generation: the block runs only if the store says this session
        holds the job at :attr:`generation` when the lock is taken (store clock); until
        the transaction ends no claim of the job can commit (it waits), so the effects
        commit before the next generation exists and its holder sees them — even if this
        worker was paused past its TTL inside the block. So the block alone is once per
        *generation*: the next generation runs the job again. Per job: ``tx.once(id)``
        (:class:`~consensus_lease.transaction.LeaseTransaction`) is ``True`` in exactly
        one committed transaction of all the job's generations; write the effect only
        then. Effects elsewhere still need a fence. Cost: a claim of the job waits for
        the open transaction (SQLite: every write to the store does); keep it short.
        Details: :mod:`consensus_lease.transaction`,
        :mod:`consensus_lease.backends.postgresql`,
        :mod:`consensus_lease.backends.sqlite._transport_txn`.

        Args:
            conn: a ``psycopg.Connection`` to the lease store's database, or a
                ``sqlite3.Connection`` to the store's file.
            lock_timeout_s: most seconds taking the lock may wait (float >= 0); ``None``:
                the connection's ``lock_timeout`` (SQLite: its busy timeout).

        Yields:
            A :class:`~consensus_lease.transaction.LeaseTransaction` (``tx.once``).

        Raises:
            UnsupportedOperation: the store has no transactions (etcd, ZooKeeper,
                memory); nothing was sent.
            InvalidArgument: ``conn`` is not a connection to the store's database (or
                file), has an implicit or aborted transaction open, or a bad
                ``lock_timeout_s``; rolled back (nothing sent for an open transaction);
                still held. Also from inside the block: a store call on this lease on
                the block's thread (``complete``, ``renew``, ``release``, ``fail``,
                ``proclaim``, a nested ``transaction``) is refused at once, nothing
                sent (it would wait for the block's own lock: end the lease after the
                block); and at the block's end on SQLite when the block committed or
                rolled back the transaction itself (``conn.commit()`` inside it): what
                it wrote after that is rolled back, what it committed before stays.
            LeaseLost (StaleLeaseError, SessionExpired): not held (locally or in the
                store); rolled back; the lease is LOST, and after ``SessionExpired`` the
                session too — exactly as after the same error from :meth:`renew`.
            LeaseSuspended: ownership cannot be proven now; nothing was sent.
            BackendUnavailable: the lock was not granted in time or no answer; rolled
                back; the lease is still held until its deadline.
            OutcomeUnknown: the connection broke while committing (PostgreSQL): the
                effects may or may not have committed (if they did, before any later
                claim); the lease is still held until its deadline.
            StoreClosed / StoreInherited: the store was closed / this is a fork's child;
                nothing was sent.
        """
        timeout = None if lock_timeout_s is None else check_wait(lock_timeout_s,
                                                                 "lock_timeout_s")
        with self._holdings.transaction(self, conn, timeout) as tx:
            yield tx

    # -- store round trips -----------------------------------------------------------

    def renew(self) -> None:
        """Confirm in the store that this session still holds the job at this generation
        and extend the session's TTL. SQLite, PostgreSQL, memory and ZooKeeper do both in
        one atomic store operation; etcd sends two requests in one round trip (a read-only
        transaction comparing the owner key, and a keepalive of the session's lease sent
        during its round trip; the check's verdict is raised first), which is safe because
        the first proves ownership and the second can only extend the session that owns
        it.
        The session's deadline moves to the *send* time of the request + granted TTL -
        margin.

        The session's background keepalive already renews every lease it holds; call
        this to re-check one lease explicitly (e.g. before a long effect).

        Raises:
            LeaseLost (StaleLeaseError, SessionExpired): the store says it is not held;
                the lease is LOST.
            LeaseSuspended: the session is SUSPENDED; nothing was sent.
            BackendUnavailable: no answer; the lease is still held until its deadline.
            StoreClosed / StoreInherited: the store was closed / this is a fork's child;
                nothing was sent.
        """
        self._holdings.renew(self)

    def complete(self, result: bytes = b"") -> LeaseRecord:
        """Record the job as completed at this generation and end the hold, in one atomic
        store operation that first compares owner and generation. A completed job is
        never claimed again (unless ``store.purge`` deleted its record).

        The store, not the local deadline, decides: the request is sent even when this
        worker already believes the lease lost, so a stale holder learns the truth
        (``StaleLeaseError``) instead of guessing. Calling it again after success returns
        the same record without a round trip; with a *different* result it raises
        ``InvalidArgument`` (the first result stays). A retry that reaches the store
        after an ambiguous failure is recognised by the store, not applied twice.

        Args:
            result: bytes to store with the completion record.

        Returns:
            The COMPLETED record.

        Raises:
            InvalidArgument: ``result`` is not bytes or is larger than the store accepts
                in one request (``capabilities.max_payload_bytes``); nothing sent, lease
                still held. Also: this lease already completed with another result, or
                was released or failed (by this process); nothing sent.
            StaleLeaseError: another generation holds or completed the job, or it was
                released; this lease is LOST.
            SessionExpired: the session is gone; this lease is LOST.
            OutcomeUnknown: the store may or may not have applied it and reading back
                could not tell; the lease is treated as LOST (read ``store.get``).
            BackendUnavailable: nothing was applied; the lease is still held until its
                deadline and ``complete`` may be called again.
            StoreClosed / StoreInherited: the store was closed / this is a fork's child;
                nothing was sent.
        """
        self._holdings.check_usable()
        data = self._check_result(result)
        with self._lock:
            state, record, recorded = self._state, self._record, self._result
        if state is LeaseState.COMPLETED and record is not None:
            if recorded != data:
                raise self._ended("completed with another result", "complete")
            return record
        if state in (LeaseState.RELEASED, LeaseState.FAILED):
            raise self._ended(state.value, "complete")
        return self._holdings.complete(self, data)

    def _check_result(self, result: object) -> bytes:
        """``result`` as bytes, or ``InvalidArgument`` (not bytes, or too large)."""
        if not isinstance(result, (bytes, bytearray, memoryview)):
            raise InvalidArgument(
                f"result must be bytes, not {type(result).__name__}",
                job_id=self.job_id,
                generation=self.generation,
            )
        limit = self.session.backend.capabilities.max_payload_bytes
        if limit and (size := memoryview(result).nbytes) > limit:
            raise InvalidArgument(
                f"result is {size} bytes; the {self.session.backend.scheme} store "
                f"accepts at most {limit} in one request",
                job_id=self.job_id,
                generation=self.generation,
            )
        return bytes(result)

    def _check_not_ended(self, call: str) -> None:
        """``InvalidArgument`` if this process already ended the lease (completed,
        released or failed)."""
        with self._lock:
            state = self._state
        if state in (LeaseState.COMPLETED, LeaseState.RELEASED, LeaseState.FAILED):
            raise self._ended(state.value, call)

    def complete_and_claim_next(
        self, result: bytes = b"", queue: str | None = None
    ) -> tuple[LeaseRecord, Lease | None]:
        """Complete this job and claim the next claimable job of ``queue`` for the same
        session, in one atomic store operation where the store can
        (``capabilities.fused_claim_next``: one SQL transaction on SQLite and
        PostgreSQL, memory under its lock, on etcd one transaction with the claim of a
        candidate from the driver's last scan nested in the completion's, plus a
        read-only scan when none is left, on ZooKeeper one multi with the claim of a job
        read ahead, the completion sent alone if another worker took that job first):
        one round trip per job instead of two.

        The completion is the one :meth:`complete` makes (owner and generation compared
        by the store in the same operation); the claim is the one
        :meth:`Session.claim_next <consensus_lease.Session.claim_next>` makes without
        waiting (oldest claimable job first, the same fencing guarantees), and the new
        lease is held by this lease's session like any other. When no job of ``queue`` is
        claimable the completion still commits and no lease is returned. A refused
        completion claims nothing. Stores without ``fused_claim_next`` send the
        completion, then the claim (and etcd does so after its fused transaction when
        the candidate it nested was taken meanwhile); there an error of the claim after
        the completion committed is not raised: no lease is returned (call
        ``claim_next``).

        When the session cannot claim (SUSPENDED, or past its local deadline) only the
        completion is sent, as :meth:`complete` would, and no lease is returned.

        Args:
            result: bytes to store with the completion record (as :meth:`complete`).
            queue: the queue to claim from; ``None``: this lease's own :attr:`queue`.

        Returns:
            ``(record, lease)``: the COMPLETED record of this job, and a HELD
            :class:`Lease` on the next job (its :attr:`payload` and :attr:`queue` set), or
            ``None`` when none was claimable.

        Raises:
            InvalidArgument: bad ``result`` or ``queue`` (or ``None`` for a lease not
                from a queue), or this lease already completed, was released or failed
                (by this process); nothing sent, lease as it was.
            UnsupportedOperation: the backend has no work queues; nothing sent, still
                held.
            StaleLeaseError: another generation holds or completed the job, or it was
                released; this lease is LOST and nothing was claimed.
            SessionExpired: the session is gone; this lease (and every other of the
                session) is LOST, nothing was claimed.
            OutcomeUnknown: as for :meth:`complete` (the lease is treated as LOST);
                nothing was claimed that this process knows of (a claim the store may
                have applied keeps that job until the session ends).
            BackendUnavailable: nothing was applied; still held until its deadline.
            StoreClosed / StoreInherited: as for :meth:`complete`.
        """
        self._holdings.check_usable()
        data = self._check_result(result)
        target = self.queue if queue is None else queue
        if target is None:
            raise InvalidArgument(
                f"lease on {self.job_id!r} is not from a queue: name the queue to claim from",
                job_id=self.job_id, generation=self.generation,
            )
        self._check_not_ended("complete_and_claim_next")
        return self._holdings.complete_and_claim_next(self, data, target)

    def fail(self, error: str | BaseException, retry_in_s: float | None = None) -> LeaseRecord:
        """Give the job up as failed: end the hold and record ``error``, in one atomic
        store operation that first compares owner and generation (as :meth:`release`).

        If the job was enqueued with ``max_attempts`` and this was its last attempt, the
        job becomes FAILED (dead letter: never claimed again until
        ``store.requeue(job_id)``). Otherwise it becomes claimable again once
        ``retry_in_s`` seconds of the *store's* time have passed, never earlier (never
        decided by this worker's clock; etcd rounds the delay up to whole seconds, at
        least its minimum lease TTL, 2 s by default, and frees the job up to about 0.5 s
        late).

        Args:
            error: what went wrong: text (at most 64 KiB of UTF-8), or an exception
                (recorded as ``"TypeName: message"``, cut to 64 KiB).
            retry_in_s: seconds (float >= 0) before the next attempt; ``None`` takes the
                delay for this attempt from the queue's :class:`~consensus_lease.RetryPolicy`
                (``open_store(..., retry=...)``, ``store.set_retry_policy``).

        Returns:
            The job's record after the operation (AVAILABLE with ``not_before``, or FAILED).

        Raises:
            InvalidArgument: bad ``error`` or ``retry_in_s``; nothing sent, still held.
                Also: this lease already completed, was released or failed; nothing sent.
            StaleLeaseError / SessionExpired: it was no longer held; the lease is LOST.
            OutcomeUnknown: as for :meth:`complete`.
            BackendUnavailable: nothing applied; still held until the deadline.
            StoreClosed / StoreInherited: as for :meth:`complete`.
        """
        self._holdings.check_usable()
        self._check_not_ended("fail")
        text, delay = self._check_failure(error, retry_in_s)
        return self._holdings.fail(self, text, delay)

    def _check_failure(self, error: object, retry_in_s: object) -> tuple[str, float]:
        """``(error text, retry delay)`` for :meth:`fail`'s arguments, or
        ``InvalidArgument``; ``retry_in_s`` ``None``: the queue's retry policy."""
        text = error_text(error, job_id=self.job_id, generation=self.generation)
        if retry_in_s is None:
            return text, self._holdings.retry_policy(self.queue).delay_s(self.attempt)
        return text, check_retry_in(retry_in_s)

    def release(self) -> None:
        """Hand the job back: end the hold iff this session still holds it at this
        generation (one atomic store operation). The job is claimable at once, at a
        higher generation. Releasing twice is a no-op.

        Raises:
            InvalidArgument: the lease already completed or failed (the job was not
                handed back: it is completed, or waits for its retry); nothing sent.
            StaleLeaseError / SessionExpired: it was no longer held; the lease is LOST.
            OutcomeUnknown: as for :meth:`complete`.
            BackendUnavailable: nothing applied; still held until the deadline.
            StoreClosed / StoreInherited: as for :meth:`complete`.
        """
        self._holdings.check_usable()
        with self._lock:
            state = self._state
        if state is LeaseState.RELEASED:
            return
        if state in (LeaseState.COMPLETED, LeaseState.FAILED):
            raise self._ended(state.value, "release")
        self._holdings.release(self)

    def _ended(self, how: str, call: str) -> InvalidArgument:
        return InvalidArgument(
            f"lease on {self.job_id!r} generation {self.generation} already {how}: "
            f"{call}() cannot end it again; nothing was sent",
            job_id=self.job_id, generation=self.generation,
        )

    # -- context manager -------------------------------------------------------------

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release unless completed. If the body raised, a failure to release is added
        to that exception as a note and the body's exception propagates; otherwise a
        lost lease surfaces here as ``LeaseLost`` (the body ran under a lease that was
        lost at some point: its effects must have been fenced)."""
        with self._lock:
            state = self._state
        if state in (LeaseState.COMPLETED, LeaseState.RELEASED, LeaseState.FAILED):
            return
        if exc is None:
            if state is LeaseState.LOST:
                self.ensure_held()  # raises LeaseLost with the reason
            self.release()
            return
        try:
            self.release()
        except (LeaseLost, BackendUnavailable, StoreClosed, StoreInherited) as release_exc:
            exc.add_note(f"consensus_lease: releasing {self.job_id!r} failed: {release_exc!r}")

    # -- state changes, made by the session's holdings only (see finish_lease) -------

    def _finish(
        self, state: LeaseState, record: LeaseRecord | None, result: bytes | None = None
    ) -> None:
        with self._lock:
            self._state = state
            self._record = record
            self._result = result

    def _set_lost(self, reason: LeaseLost | OutcomeUnknown) -> bool:
        """HELD -> LOST, then the :meth:`on_lost` callbacks; returns False if the lease
        was already over."""
        with self._lock:
            if self._state is not LeaseState.HELD:
                return False
            self._state = LeaseState.LOST
            lost = (
                reason
                if isinstance(reason, LeaseLost)
                else LeaseLost(str(reason), job_id=self.job_id, generation=self.generation)
            )
            self._lost_reason = lost
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            self._run_callback(listener, lost)
        return True

    def _run_callback(self, callback: Callable[[Lease, LeaseLost], None],
                      reason: LeaseLost) -> None:
        session = self.session
        run_callback(callback, (self, reason), "Lease.on_lost", session.observer,
                     session.backend.scheme, job_id=self.job_id)

    def on_lost(self, callback: Callable[[Lease, LeaseLost], None]) -> Callable[[], None]:
        """Register ``callback(lease, reason)``, called once, from the thread that saw
        it, when this lease becomes LOST: the store refused it, its session was lost or
        closed, or its store was closed. Not called when the holder itself completes,
        releases or fails it. Called at once if the lease is already LOST.

        An exception from the callback is not raised: it is logged at ERROR on
        ``consensus_lease.callbacks`` (on stderr when logging is not configured) and
        counted (``Observer.callback_failed``).

        Returns:
            A function that unregisters the callback (a no-op once it ran).

        Raises:
            InvalidArgument: ``callback`` is not callable, is an ``async def``
                (called, never awaited, it would never run: see :mod:`consensus_lease.aio`),
                or cannot be called with two
                positional arguments (its signature); nothing registered.
        """
        check_callback(callback, 2, "Lease.on_lost", "callback(lease, reason)")
        with self._lock:
            if self._state is not LeaseState.LOST:
                self._listeners.append(callback)
                return lambda: self._remove_listener(callback)
            reason = self._lost_reason
        if reason is not None:
            self._run_callback(callback, reason)
        return lambda: None

    def _remove_listener(self, callback: Callable[[Lease, LeaseLost], None]) -> None:
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)


def finish_lease(
    lease: Lease, state: LeaseState, record: LeaseRecord | None, result: bytes | None = None
) -> None:
    """For the session's holdings (:mod:`consensus_lease._holdings`) only: the store
    ended ``lease`` (``state`` COMPLETED, RELEASED or FAILED, with the store's ``record``
    and the completion's ``result``). The one way a lease's state is set to an end."""
    lease._finish(state, record, result)


def lose_lease(lease: Lease, reason: LeaseLost | OutcomeUnknown) -> bool:
    """For the session's holdings (:mod:`consensus_lease._holdings`) only: HELD -> LOST
    for ``reason`` (an ``OutcomeUnknown`` becomes a ``LeaseLost`` saying it), then
    ``lease``'s :meth:`~Lease.on_lost` callbacks, on this thread. ``False`` (nothing
    done) if the lease was no longer HELD."""
    return lease._set_lost(reason)


def checked_completion(lease: Lease, result: object, call: str) -> bytes:
    """For :meth:`Session.complete_many <consensus_lease.Session.complete_many>`:
    ``result`` as bytes for ``lease``'s completion by ``call``, with the checks
    :meth:`Lease.complete` makes before sending anything.

    Raises:
        InvalidArgument: ``result`` is not bytes or too large, or this process already
            completed, released or failed the lease; nothing sent, still as it was.
    """
    data = lease._check_result(result)
    lease._check_not_ended(call)
    return data


def check_not_ended(lease: Lease, call: str) -> None:
    """For :meth:`Session.release_many <consensus_lease.Session.release_many>`:
    ``InvalidArgument`` (nothing sent) if this process already completed, released or
    failed ``lease``."""
    lease._check_not_ended(call)


def checked_failure(
    lease: Lease, error: object, retry_in_s: object, call: str
) -> tuple[str, float]:
    """For :meth:`Session.fail_many <consensus_lease.Session.fail_many>`: ``(error text,
    retry delay in seconds)`` for ``lease``'s failure by ``call``, with the checks
    :meth:`Lease.fail` makes before sending anything (``retry_in_s`` ``None``: the
    delay of the lease's queue's retry policy for its attempt).

    Raises:
        InvalidArgument: bad ``error`` or ``retry_in_s``, or this process already
            completed, released or failed the lease; nothing sent, still as it was.
    """
    checked = lease._check_failure(error, retry_in_s)
    lease._check_not_ended(call)
    return checked
