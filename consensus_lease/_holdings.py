"""The leases a session holds, and the one path every operation on them takes.

A :class:`~consensus_lease.Lease` never talks to the backend or to its session's
internals: ``renew``, ``complete``, ``release``, ``fail`` and the rest come here, where
each becomes one backend call (through :meth:`Liveness.call`, so a ``SessionExpired``
loses the whole session; ``complete_many``, ``release_many`` and ``fail_many`` one per
chunk, each item settled as its lone operation is) and the store's answer is turned into
the lease's new state, the observer events and the log lines. Loss of a lease (the store
refused it, or could not say) and loss of the session (every lease at once) are handled
here and only here.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .backend import Backend
from .errors import (
    InvalidArgument,
    LeaseError,
    LeaseLost,
    LeaseNotHeld,
    OutcomeUnknown,
    SessionExpired,
    StaleLeaseError,
    StoreClosed,
    StoreInherited,
    UnsupportedOperation,
)
from .lease import Lease, finish_lease, lose_lease
from .observe import Observer, notify, outcome_of
from .record import ClaimResult, LeaseRecord
from .retry import RetryPolicies, RetryPolicy
from .states import LeaseState
from .transaction import LeaseTransaction, end_transaction
from .validation import check_queue_name

if TYPE_CHECKING:
    from ._liveness import Liveness
    from .session import Session

__all__ = ["Holdings", "item_error"]

T = TypeVar("T")
L = TypeVar("L", bound="Lease")
_Answer = LeaseRecord | LeaseError | None
"""A store's answer to one item of a batch ending: the record (complete, fail), ``None``
(release), or the item's refusal."""

log = logging.getLogger("consensus_lease")


class Holdings:
    """Job id -> :class:`Lease` for one session, and the operations on those leases."""

    def __init__(self, liveness: Liveness, policies: RetryPolicies) -> None:
        self.liveness = liveness
        self.policies = policies
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        # (id(lease), thread id) of each lease.transaction() block open on a thread: the
        # lease's own store calls from inside it would wait on the block's own lock
        self._blocks: set[tuple[int, int]] = set()
        liveness.on_loss(self.lose_all)

    @property
    def scheme(self) -> str:
        return self.liveness.backend.scheme

    # -- the registry ----------------------------------------------------------------

    def leases(self) -> list[Lease]:
        with self._lock:
            return list(self._leases.values())

    def check_not_held(self, job_ids: list[str]) -> None:
        """Raise ``InvalidArgument`` if this session already holds one of ``job_ids``."""
        with self._lock:
            held = [self._leases[j] for j in job_ids if j in self._leases]
        if held:
            lease = held[0]
            raise InvalidArgument(
                f"this session already holds {lease.job_id!r} at generation "
                f"{lease.generation}",
                job_id=lease.job_id, generation=lease.generation,
            )

    def holds(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._leases

    def held(self, job_id: str) -> Lease | None:
        """The lease this session holds on ``job_id``, if any."""
        with self._lock:
            return self._leases.get(job_id)

    def adopt(self, session: Session, job_id: str, result: ClaimResult,
              payload: bytes | None = None, queue: str | None = None) -> Lease:
        """Wrap a claim the store granted in a HELD lease and register it."""
        return self.register(Lease(session, self, job_id, result, payload, queue))

    def register(self, lease: L) -> L:
        """Register a HELD lease made from a claim the store granted (a
        :class:`~consensus_lease.Lease`, or a :class:`~consensus_lease.Leadership`)."""
        with self._lock:
            self._leases[lease.job_id] = lease
        job_id, owner, generation = lease.job_id, lease.owner, lease.generation
        log.info("claimed", extra={"job_id": job_id, "generation": generation, "owner": owner})
        if self.liveness.observer is not None:  # none: not even the event is made
            notify(self.liveness.observer,
                   lambda o: o.claimed(self.scheme, job_id, generation, owner))
        return lease

    def _forget(self, lease: Lease) -> None:
        with self._lock:
            if self._leases.get(lease.job_id) is lease:
                del self._leases[lease.job_id]

    # -- operations on one lease -------------------------------------------------------

    def check_usable(self) -> None:
        """``StoreInherited`` in a fork's child, ``StoreClosed`` once the store closed."""
        self.liveness.check_usable()

    def renew(self, lease: Lease) -> None:
        """See :meth:`Lease.renew`."""
        self.check_usable()
        lease.ensure_held()
        live = self.liveness
        send = live.clock.monotonic()
        ttl = self._guarded(lease, lambda: live.backend.renew(
            live.handle, lease.job_id, lease.claim_result))
        live.renewed(send, ttl)

    def complete(self, lease: Lease, result: bytes) -> LeaseRecord:
        """See :meth:`Lease.complete`: ``result`` is already checked."""
        live = self.liveness
        record = self._timed("complete", lease, lambda: self._guarded(
            lease, lambda: live.backend.complete(
                live.handle, lease.job_id, lease.claim_result, result)))
        self._completed(lease, record, result)
        return record

    def _completed(self, lease: Lease, record: LeaseRecord, result: bytes) -> None:
        """The store recorded ``lease``'s completion: the lease's state, the registry,
        the observer and the log."""
        finish_lease(lease, LeaseState.COMPLETED, record, result)
        self._forget(lease)
        job_id, generation, owner = lease.job_id, lease.generation, lease.owner
        notify(self.liveness.observer,
               lambda o: o.completed(self.scheme, job_id, generation, owner))
        log.info("completed", extra={"job_id": job_id, "generation": generation, "owner": owner})

    def complete_many(
        self, pairs: list[tuple[Lease, bytes]]
    ) -> list[LeaseRecord | LeaseError]:
        """See :meth:`Session.complete_many`: ``pairs`` are checked (this session's
        leases, distinct, not ended, results valid)."""
        backend = self.liveness.backend
        return cast("list[LeaseRecord | LeaseError]", self._many(
            "complete", pairs, backend.capabilities.max_complete_batch,
            lambda chunk: backend.complete_many(self.liveness.handle, [
                (lease.job_id, lease.claim_result, result) for lease, result in chunk]),
            lambda pair, record: self._completed(pair[0], record, pair[1])))

    def release_many(self, leases: list[Lease]) -> list[LeaseError | None]:
        """See :meth:`Session.release_many`: ``leases`` are checked (this session's,
        distinct, not ended)."""
        backend = self.liveness.backend
        return cast("list[LeaseError | None]", self._many(
            "release", [(lease,) for lease in leases], backend.capabilities.max_end_batch,
            lambda chunk: backend.release_many(self.liveness.handle, [
                (lease.job_id, lease.claim_result) for (lease,) in chunk]),
            lambda one, _none: self._released(one[0])))

    def fail_many(
        self, items: list[tuple[Lease, str, float]]
    ) -> list[LeaseRecord | LeaseError]:
        """See :meth:`Session.fail_many`: ``items`` are checked (this session's leases,
        distinct, not ended, errors and delays valid)."""
        backend = self.liveness.backend
        return cast("list[LeaseRecord | LeaseError]", self._many(
            "fail", items, backend.capabilities.max_end_batch,
            lambda chunk: backend.fail_many(self.liveness.handle, [
                (lease.job_id, lease.claim_result, error, delay)
                for lease, error, delay in chunk]),
            lambda item, record: self._failed(item[0], record, item[1])))

    def _many(self, op: str, entries: Sequence[tuple[Any, ...]], step: int,
              send: Callable[[list[Any]], Sequence[_Answer]],
              applied: Callable[[Any, Any], None]) -> list[_Answer]:
        """The one path of ``complete_many``, ``release_many`` and ``fail_many``:
        ``entries`` (``(lease, *arguments)``, checked) sent in chunks of ``step`` by
        ``send`` (one backend call each, through :meth:`Liveness.call`: a
        ``SessionExpired`` of the whole chunk loses the session), each answer settled
        as the lone operation ``op`` settles it: ``applied(entry, answer)`` for an item
        the store ended, :meth:`_refused` for one it refused."""
        for index, entry in enumerate(entries):
            try:
                self._refuse_inside_block(entry[0])
            except InvalidArgument as exc:
                raise item_error(index, entry[0], exc) from None
        live = self.liveness
        step = max(1, step)
        outcomes: list[_Answer] = []
        for start in range(0, len(entries), step):
            chunk = list(entries[start : start + step])
            begin = live.clock.monotonic()
            answers: list[_Answer]
            try:
                answers = list(live.call(lambda c=chunk: send(c)))  # type: ignore[misc]
            except (StoreClosed, StoreInherited):
                raise
            except LeaseError as exc:  # the whole chunk's outcome
                answers = [exc] * len(chunk)
            answers = [live.told_closed(a) if isinstance(a, SessionExpired) else a
                       for a in answers]
            latency = live.clock.monotonic() - begin
            # Each refusal as its own error, naming its item's index and job, whatever
            # the store said (a refusal of the whole chunk names none).
            items = [item_error(start + k, entry[0], answer)
                     if isinstance(answer, LeaseError) else answer
                     for k, (entry, answer) in enumerate(zip(chunk, answers, strict=True))]
            settled = list(zip(chunk, answers, items, strict=True))
            # Applied items first: a refusal that loses the session then loses only the
            # leases the store did not end.
            settled.sort(key=lambda s: isinstance(s[1], LeaseError))
            for entry, answer, item in settled:
                self._report(op, entry[0], answer, latency)
                if isinstance(answer, LeaseError) and isinstance(item, LeaseError):
                    self._refused(entry[0], answer, item)
                else:
                    applied(entry, answer)
            outcomes.extend(items)
        return outcomes

    def _report(self, op: str, lease: Lease, answer: _Answer, latency: float) -> None:
        """One item of :meth:`_many`, to the observer as ``operation(op, ...)``."""
        observer = self.liveness.observer
        if observer is not None:
            scheme, job_id, generation = self.scheme, lease.job_id, lease.generation
            outcome = outcome_of(answer) if isinstance(answer, LeaseError) else "ok"
            notify(observer, lambda o: o.operation(scheme, op, job_id, generation,
                                                   outcome, latency))

    def _refused(self, lease: Lease, answer: LeaseError, item: LeaseError) -> None:
        """An item of :meth:`_many` the store refused (``answer``; ``item``: the same,
        naming the item, as returned): the state changes of :meth:`_guarded` for the
        lone operation's refusal (a ``BackendUnavailable``: nothing applied, still held).
        The session is lost with the store's own words, the lease with ``item``."""
        if isinstance(answer, SessionExpired):
            self.liveness.mark_lost(answer)
        if isinstance(item, (LeaseLost, OutcomeUnknown)):
            self.lease_failed(lease, item)

    def complete_and_claim_next(
        self, lease: Lease, result: bytes, queue: str
    ) -> tuple[LeaseRecord, Lease | None]:
        """See :meth:`Lease.complete_and_claim_next`: ``result`` is checked, the lease
        not ended by this process."""
        check_queue_name(queue)
        live = self.liveness
        backend = live.backend
        if not backend.capabilities.queues:
            raise UnsupportedOperation(f"the {backend.scheme} backend has no work queues")
        session = lease.session
        try:
            session.ensure_alive()
        except LeaseNotHeld:  # cannot claim now: the completion alone, as complete()
            return self.complete(lease, result), None
        start = live.clock.monotonic() if live.observer is not None else 0.0
        record, picked = self._timed("complete", lease, lambda: self._guarded(
            lease, lambda: backend.complete_and_claim_next(
                live.handle, lease.job_id, lease.claim_result, result, queue)))
        self._completed(lease, record, result)
        nxt = None
        if picked is not None:
            job_id, claim, payload = picked
            nxt = self.adopt(session, job_id, claim, payload, queue)
        self._report_fused_claim(nxt, start)
        return record, nxt

    def _report_fused_claim(self, lease: Lease | None, start: float) -> None:
        """The claim half of a fused call, reported as the ``claim_next`` it replaces
        (outcome ``ok`` with the new lease, ``empty`` without; latency: the whole call),
        so claim counts and rates stay right for workers that use it."""
        self.report_queue_claims([] if lease is None else [lease], start)

    def claim_started(self) -> float | None:
        """The session clock's monotonic time, to report a claim from; ``None`` without
        an observer (no clock is read)."""
        live = self.liveness
        return None if live.observer is None else live.clock.monotonic()

    def report_queue_claims(self, leases: Sequence[Lease], start: float | None,
                            error: BaseException | None = None) -> None:
        """Claims of a queue made by one call (``claim_next_many``, a fused call), each
        reported to the observer as the ``claim_next`` it replaces: ``ok`` per lease,
        ``empty`` when there is none, or the outcome of ``error`` (latency: the whole
        call, from ``start``, as :meth:`claim_started` gave it)."""
        observer = self.liveness.observer
        if observer is None or start is None:
            return
        latency = self.liveness.clock.monotonic() - start
        scheme = self.scheme
        if error is not None or not leases:
            outcome = "empty" if error is None else outcome_of(error)
            notify(observer, lambda o: o.operation(scheme, "claim_next", None, None,
                                                   outcome, latency))
            return
        for lease in leases:
            _report_claim(observer, scheme, lease, latency)

    def release(self, lease: Lease) -> None:
        """See :meth:`Lease.release`."""
        live = self.liveness
        self._timed("release", lease, lambda: self._guarded(
            lease, lambda: live.backend.release(live.handle, lease.job_id, lease.claim_result)))
        self._released(lease)

    def _released(self, lease: Lease) -> None:
        """The store ended ``lease``'s hold (a release): the lease's state, the registry,
        the observer and the log."""
        finish_lease(lease, LeaseState.RELEASED, None)
        self._forget(lease)
        job_id, generation, owner = lease.job_id, lease.generation, lease.owner
        notify(self.liveness.observer,
               lambda o: o.released(self.scheme, job_id, generation, owner))
        log.info("released", extra={"job_id": job_id, "generation": generation,
                                    "owner": owner})

    def set_value(self, lease: Lease, value: bytes) -> None:
        """See :meth:`Leadership.proclaim <consensus_lease.Leadership.proclaim>`:
        ``value`` is already checked."""
        live = self.liveness
        self._guarded(lease, lambda: live.backend.set_value(
            live.handle, lease.job_id, lease.claim_result, value))
        log.info("value set", extra={"job_id": lease.job_id, "generation": lease.generation,
                                     "owner": lease.owner})

    @contextmanager
    def transaction(self, lease: Lease, conn: object,
                    lock_timeout_s: float | None) -> Iterator[LeaseTransaction]:
        """See :meth:`Lease.transaction`: ``lock_timeout_s`` is already checked. The
        store's refusal at the start of the block takes the path of every other
        operation (:meth:`_guarded`): a ``StaleLeaseError`` loses the lease, a
        ``SessionExpired`` the whole session, exactly as through ``renew()``."""
        live = self.liveness
        backend = live.backend
        if not backend.capabilities.transactions:  # the base's UnsupportedOperation
            Backend.lock_in(backend, live.handle, lease.job_id, lease.claim_result, conn,
                            lock_timeout_s)
        lease.ensure_held()
        locked = backend.lock_in(live.handle, lease.job_id, lease.claim_result, conn,
                                 lock_timeout_s)
        with ExitStack() as stack:  # its exit commits, or rolls back on an error
            once = self._guarded(lease, lambda: stack.enter_context(locked))
            tx = LeaseTransaction(lease.job_id, lease.generation, conn, once)
            block = (id(lease), threading.get_ident())
            self._blocks.add(block)
            try:
                yield tx
            finally:
                self._blocks.discard(block)
                end_transaction(tx)

    def retry_policy(self, queue: str | None) -> RetryPolicy:
        return self.policies.get(queue)

    def fail(self, lease: Lease, error: str, retry_in_s: float) -> LeaseRecord:
        """See :meth:`Lease.fail`: ``error`` and ``retry_in_s`` are already checked."""
        live = self.liveness
        record = self._timed("fail", lease, lambda: self._guarded(
            lease, lambda: live.backend.fail(
                live.handle, lease.job_id, lease.claim_result, error, retry_in_s)))
        self._failed(lease, record, error)
        return record

    def _failed(self, lease: Lease, record: LeaseRecord, error: str) -> None:
        """The store recorded ``lease``'s failure (``record``, after it): the lease's
        state, the registry, the observer and the log."""
        finish_lease(lease, LeaseState.FAILED, record)
        self._forget(lease)
        job_id, generation, owner = lease.job_id, lease.generation, lease.owner
        state = record.state.value
        notify(self.liveness.observer,
               lambda o: o.failed(self.scheme, job_id, generation, owner, state))
        log.warning("failed", extra={"job_id": lease.job_id, "generation": lease.generation,
                                     "owner": lease.owner, "attempt": lease.attempt,
                                     "error": error[:200], "state": record.state.value})

    def _timed(self, op: str, lease: Lease, call: Callable[[], T]) -> T:
        """``call()``, reported to the observer as ``operation(op, ...)`` with its
        latency and outcome; without an observer, just ``call()`` (no clock read)."""
        observer = self.liveness.observer
        if observer is None:
            return call()
        clock, scheme = self.liveness.clock, self.scheme
        job_id, generation = lease.job_id, lease.generation
        start = clock.monotonic()
        try:
            out = call()
        except BaseException as exc:
            outcome, latency = outcome_of(exc), clock.monotonic() - start
            notify(observer, lambda o: o.operation(scheme, op, job_id, generation, outcome,
                                                   latency))
            raise
        latency = clock.monotonic() - start
        notify(observer, lambda o: o.operation(scheme, op, job_id, generation, "ok", latency))
        return out

    def timed_claim(self, op: str, job_id: str | None,
                    call: Callable[[], Lease | None]) -> Lease | None:
        """``call()`` (one claim attempt), reported as ``operation(op, ...)``: outcome
        ``ok`` with the lease's job id and generation, ``held`` when it returned
        ``None``; without an observer, just ``call()``."""
        observer = self.liveness.observer
        if observer is None:
            return call()
        clock, scheme = self.liveness.clock, self.scheme
        start = clock.monotonic()
        try:
            lease = call()
        except BaseException as exc:
            outcome, latency = outcome_of(exc), clock.monotonic() - start
            notify(observer, lambda o: o.operation(scheme, op, job_id, None, outcome,
                                                   latency))
            raise
        latency = clock.monotonic() - start
        if lease is None:
            none = "held" if job_id is not None else "empty"  # a named job, or a queue
            notify(observer, lambda o: o.operation(scheme, op, job_id, None, none, latency))
        else:
            got, generation = lease.job_id, lease.generation
            notify(observer, lambda o: o.operation(scheme, op, got, generation, "ok", latency))
        return lease

    def _guarded(self, lease: Lease, call: Callable[[], T]) -> T:
        """Run a store call on ``lease``: a refusal (or an outcome nobody can tell)
        loses the lease, a ``SessionExpired`` loses the session too. Refused with
        ``InvalidArgument`` (nothing sent, still held) from inside the lease's own
        ``transaction()`` block on this thread: the call would wait for the lock the
        block holds (SQLite: the store's write lock until the busy timeout; PostgreSQL:
        the job's row lock, with no timeout of its own)."""
        self._refuse_inside_block(lease)
        try:
            return self.liveness.call(call)
        except (LeaseLost, OutcomeUnknown) as exc:
            self.lease_failed(lease, exc)
            raise

    def _refuse_inside_block(self, lease: Lease) -> None:
        """``InvalidArgument`` if ``lease``'s own ``transaction()`` block is open on this
        thread (see :meth:`_guarded`)."""
        if (id(lease), threading.get_ident()) in self._blocks:
            raise InvalidArgument(
                f"{lease.job_id!r}: this lease's transaction() block is open on this "
                "thread; end, renew or change the lease after the block (the call would "
                "wait for the block's own lock)", job_id=lease.job_id,
                generation=lease.generation)

    def lease_failed(self, lease: Lease, exc: LeaseLost | OutcomeUnknown) -> None:
        """The store refused (or could not confirm) an operation on ``lease``."""
        if isinstance(exc, StaleLeaseError):
            job_id, generation = lease.job_id, lease.generation
            notify(self.liveness.observer,
                   lambda o: o.stale_rejected(self.scheme, "store", job_id, generation))
        self._lose(lease, exc)

    def _lose(self, lease: Lease, reason: LeaseLost | OutcomeUnknown) -> None:
        self._forget(lease)
        if not lose_lease(lease, reason):
            return
        job_id, generation = lease.job_id, lease.generation
        notify(self.liveness.observer,
               lambda o: o.lost(self.scheme, job_id, generation, str(reason)))
        log.warning("lease lost", extra={"job_id": job_id, "generation": generation,
                                         "owner": lease.owner, "reason": str(reason)})

    # -- the whole session -------------------------------------------------------------

    def lose_all(self, reason: LeaseLost, *, closing: bool = False) -> None:
        """The session is lost, or ``closing`` by its worker: every lease with it. A
        close hands the jobs back: the observer hears ``released``, not ``lost``."""
        for lease in self.leases():
            if closing:
                self._hand_back(lease, reason)
            else:
                self._lose(lease, reason)

    def _hand_back(self, lease: Lease, reason: LeaseLost) -> None:
        """``lease``'s session is being closed by its worker: the job goes back."""
        self._forget(lease)
        if not lose_lease(lease, reason):
            return
        job_id, generation, owner = lease.job_id, lease.generation, lease.owner
        notify(self.liveness.observer,
               lambda o: o.released(self.scheme, job_id, generation, owner))
        log.info("lease handed back: session closed",
                 extra={"job_id": job_id, "generation": generation, "owner": owner})

    def reconfirm(self) -> None:
        """After a reconnect, re-confirm every lease in the store, then resume the
        session (SUSPENDED -> ACTIVE). A lease the store no longer gives us is LOST; if
        the store cannot be asked, the session stays SUSPENDED and its deadline decides.
        """
        live = self.liveness
        if not live.is_suspended():
            return
        try:
            send = live.clock.monotonic()
            ttl = live.backend.keepalive(live.handle)
            for lease in self.leases():
                try:
                    live.backend.renew(live.handle, lease.job_id, lease.claim_result)
                except SessionExpired:
                    raise
                except LeaseLost as exc:
                    self._lose(lease, exc)
        except SessionExpired as exc:
            live.mark_lost(exc)
            return
        except LeaseError as exc:
            log.warning("re-confirming leases failed", extra={"error": str(exc)})
            return
        live.resume(send, ttl)


def item_error(index: int, lease: Lease, error: LeaseError) -> LeaseError:
    """``error`` about item ``index`` (``lease``) of a batch ending, as that item's own:
    the same type and attributes, its message led by ``item INDEX: `` and naming the
    job (``lease on 'JOB': `` unless it does already), ``job_id`` and ``generation``
    the lease's where ``error`` has none or is about another job; chained to ``error``.
    One error per item, so a refusal of a whole chunk is not one shared object."""
    text = str(error)
    if text.startswith(f"item {index}: "):
        return error
    named = text if repr(lease.job_id) in text else f"lease on {lease.job_id!r}: {text}"
    try:
        item = copy.copy(error)
    except Exception:  # a third-party error type that cannot be remade from its args
        return error
    item.args = (f"item {index}: {named}",)
    if error.job_id != lease.job_id:
        item.job_id, item.generation = lease.job_id, lease.generation
    elif error.generation is None:
        item.generation = lease.generation
    item.__cause__ = error
    return item


def _report_claim(observer: Observer, scheme: str, lease: Lease, latency_s: float) -> None:
    """One lease of :meth:`Holdings.report_queue_claims`, as a ``claim_next``."""
    job_id, generation = lease.job_id, lease.generation
    notify(observer, lambda o: o.operation(scheme, "claim_next", job_id, generation, "ok",
                                           latency_s))
