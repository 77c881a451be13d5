"""Operations on a held job: renew's check, complete and release.

Each starts with the ownership compare (:meth:`Ops.holds`): the owner key's create
revision is the generation's (the token below its epoch bits) and its value is ours
(which records the epoch). Then::

    renew:     (nothing)                    else get o, get c
               (sent with the session's keepalive: one round trip for both)
    complete:  put c = record, delete o, h  else get o, get c
               (+ for a queued job: delete QDIR/p/HEX and QDIR/h/HEX,
                put QDIR/k/done (in a batch: the shard of the
                item's position, QDIR/k/done/NNN), delete the
                index entry if the claim read its ordinal)
               (+ delete v for an election)
               get a, e, l (for the record it returns; only e, or
               nothing, when the claim's handle tells the rest)
    release:   delete o, put h = marker     else get o, get h, get c
               (+ delete QDIR/h/HEX for a queued job)
               (+ delete v for an election)

``fail`` is in :mod:`._jobs_fail`; ``complete_many`` (each completion above as one nested
transaction of a single transaction) in :mod:`._jobs_complete_many`; ``release_many``
(each release above likewise) here, by the batch machinery of :mod:`._jobs_batch`.

A queued job's completion also deletes its pending key in the queue, in the same
transaction, so ``queue_candidates`` never sees completed jobs. The queue comes from the
claim transaction's read of the job's queue marker, carried by the claim's
:class:`~._sessions.EtcdClaim`; when the claim has none (a claim this process did not
make) or did not read it (a batch claim settled by reading back), it is read first: one
more round trip. A claim without its handle has the epoch part of its token checked
against the owner key's value: renew reads the key in its transaction, complete with the
queue marker, release in one read first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from pyetcd import etcdrpc

from ...backend import ReleaseItem
from ...errors import LeaseError
from ...record import ClaimResult, JobState, LeaseRecord
from . import _transport_requests as rq
from ._jobs import Ops, Settled, refusal
from ._jobs_batch import MAX_END_BATCH, end_many, read_queues
from ._layout import Completion, History, JobKeys, LastError, queue_of
from ._layout_records import Lifecycle
from ._sessions import EtcdClaim, EtcdSession
from ._tokens import split

__all__ = ["Completing", "Releasing", "check_held", "complete", "completing", "release",
           "release_many", "releasing"]


def check_held(ops: Ops, handle: EtcdSession, job_id: str,
               claim: ClaimResult) -> Callable[[], None]:
    """Send one read-only transaction checking that ``handle`` holds the job at
    ``claim.generation``, without waiting: returns ``finish()``, which waits for the
    answer and raises unless it is held. Idempotent, so retried over the members within
    ``timeout_s``.

    Raises (from ``finish()``):
        StaleLeaseError / SessionExpired: not held at ``claim.generation``.
        BackendUnavailable / StoreRegressed / AuthenticationFailed: as
            :meth:`~._transport.Transport.call`.
    """
    known = EtcdClaim.of(claim, handle, job_id)
    generation = claim.generation
    keys = ops.layout.job(job_id)
    what = f"renewal of {job_id!r} generation {generation}"
    request = etcdrpc.TxnRequest()
    ops.add_holds(request.compare, handle, keys, generation, known)
    if known is None:
        rq.add_get(request.success, keys.owner)
    rq.add_get(request.failure, keys.owner)
    rq.add_get(request.failure, keys.completion)
    answered = ops.transport.start("kv", "Txn", request, what=what,
                                   budget_s=ops.config.timeout_s, job_id=job_id,
                                   generation=generation)

    def finish() -> None:
        answer = answered()
        if not answer.succeeded:
            owner_kv, completion_kv = (rq.kv_of(r) for r in answer.responses)
            raise refusal(ops, handle, keys, generation, owner_kv, completion_kv, what)
        if known is None:
            ops.check_epoch(keys, generation, rq.kv_of(answer.responses[0]), what)

    return finish


def complete(ops: Ops, handle: EtcdSession, job_id: str, claim: ClaimResult,
             result: bytes) -> LeaseRecord:
    """See :meth:`EtcdBackend.complete <consensus_lease.backends.etcd.EtcdBackend.complete>`."""
    return completing(ops, handle, job_id, claim, result).send()


def completing(ops: Ops, handle: EtcdSession, job_id: str, claim: ClaimResult,
               result: bytes) -> Completing:
    """The completion of ``job_id`` by ``claim``, not sent yet: its queue as the claim
    read it, else read now (one round trip, with the epoch check of a claim without
    its handle).

    Raises:
        InvalidArgument: ``claim.handle`` is not an :class:`EtcdClaim`.
        StaleLeaseError: (a claim without its handle) another epoch's token.
        BackendUnavailable / AuthenticationFailed: the queue could not be read.
    """
    known = EtcdClaim.of(claim, handle, job_id)
    keys = ops.layout.job(job_id)
    what = f"completion of {job_id!r} generation {claim.generation}"
    queue = _queue(ops, keys, known, job_id, claim.generation, what)
    return Completing(ops, handle, keys, claim.generation, known, queue, result)


class Completing:
    """One completion being decided (see the module docstring): :meth:`fill` writes its
    transaction, :meth:`send` sends it alone (:func:`complete`), and
    :mod:`._jobs_complete_many` sends many as the nested transactions of one; :meth:`answered`
    reads a (nested) answer. ``queue``: the job's queue (``None``: none), as the claim
    read it or as read before."""

    def __init__(self, ops: Ops, handle: EtcdSession, keys: JobKeys, generation: int,
                 known: EtcdClaim | None, queue: str | None, result: bytes) -> None:
        self.ops, self.handle, self.keys, self.known = ops, handle, keys, known
        self.generation, self.queue = generation, queue
        self.record = Completion(handle.owner, handle.session_id, generation, result)
        self.what = f"completion of {keys.job_id!r} generation {generation}"
        self.reads = _lifecycle_reads(keys, known)
        self.then: int | None = None
        """``-1`` before :meth:`fill`: it places a nested transaction in ``success``
        (and sets this to that operation's index)."""

    def fill(self, request: Any, position: int = 0) -> Any:
        """Write the completion's compares, ``success`` and ``failure`` branches into
        the empty transaction ``request``; a queued job bumps the completed counter of
        ``position`` (:meth:`~._layout.QueueKeys.done`: a key no other completion of
        the same transaction puts). Returns ``None``, or with :attr:`then` set, the
        empty nested transaction placed in ``success`` (before its reads) for the
        caller to fill: it runs only if the completion's compares pass
        (:mod:`._queues_fused`); its answer is ``answer.responses[then]``."""
        ops, keys = self.ops, self.keys
        ops.add_holds(request.compare, self.handle, keys, self.generation, self.known)
        success = request.success
        rq.add_put(success, keys.completion, self.record.encode())
        rq.add_delete(success, keys.owner)
        rq.add_delete(success, keys.history)
        if self.queue is not None:
            _leaving_queue(success, ops, self.queue, keys.job_id, self.known, position)
        if keys.is_election:
            success.extend(ops.ending(keys))
        nested = None
        if self.then is not None:
            self.then = len(success)
            nested = success.add().request_txn
        for key in self.reads:
            rq.add_get(success, key)
        rq.add_get(request.failure, keys.owner)
        rq.add_get(request.failure, keys.completion)
        return nested

    def ours(self, completion_kv: Any) -> Completion | None:
        """The completion record if this session made it at this generation."""
        if completion_kv is None:
            return None
        done = Completion.decode(completion_kv.value, completion_kv.key)
        same = done.session == self.handle.session_id and done.generation == self.generation
        return done if same else None

    def held(self, owner_kv: Any) -> bool:
        """Whether the owner key read back is still this claim's (not applied yet)."""
        return self.ops.held_by(self.handle, owner_kv, self.generation, self.known)

    @property
    def back(self) -> tuple[bytes, ...]:
        """The keys a batch reads back after a lost answer (:mod:`._jobs_batch`)."""
        keys = self.keys
        return (keys.owner, keys.completion, keys.attempts, keys.error, keys.limit)

    def from_keys(self, kvs: list[Any]) -> LeaseRecord:
        """The outcome from the :attr:`back` key-values, the batch not (or no longer)
        pending: this session's completion record at its generation, else the refusal
        (raised)."""
        owner_kv, completion_kv, attempts_kv, error_kv, limit_kv = kvs
        done = self.ours(completion_kv)
        if done is not None:
            return self.completed(done, Lifecycle.of(attempts_kv, error_kv, limit_kv))
        raise self.refused(owner_kv, completion_kv)

    def refused(self, owner_kv: Any, completion_kv: Any) -> LeaseError:
        """The error for a refused completion (:func:`~._jobs.refusal`)."""
        return refusal(self.ops, self.handle, self.keys, self.generation, owner_kv,
                       completion_kv, self.what)

    def decide(self, kvs: list[Any]) -> Settled | None:
        """After a lost answer, from the owner and completion keys read back: the
        completion record if it landed, ``None`` if still held (send again: the compare
        cannot pass twice).

        Raises:
            StaleLeaseError / SessionExpired: neither: it cannot land.
        """
        owner_kv, completion_kv = kvs
        done = self.ours(completion_kv)
        if done is not None:
            return Settled(done)
        if self.held(owner_kv):
            return None
        raise self.refused(owner_kv, completion_kv)

    def send(self) -> LeaseRecord:
        """Send the completion alone, settling a lost answer by reading back."""
        request = etcdrpc.TxnRequest()
        self.fill(request)
        keys = self.keys
        answer = self.ops.send_guarded(
            request, self.what, job_id=keys.job_id, generation=self.generation,
            read_back=(keys.owner, keys.completion), decide=self.decide,
        )
        if isinstance(answer, Settled):
            return self.settled(answer.value)
        return self.answered(answer)

    def settled(self, done: Completion) -> LeaseRecord:
        """The record of a completion settled by reading back (its lifecycle read: one
        more round trip, on that rare path only)."""
        return self.completed(done, _lifecycle(self.ops, self.keys))

    def answered(self, answer: Any, resent: bool = False) -> LeaseRecord:
        """The record from the completion's transaction response ``answer`` (top-level
        or nested): its own reads, or a repeat's record (read again; a repeat is
        recognised whether ``resent`` or not).

        Raises:
            StaleLeaseError / SessionExpired: refused, and not a repeat.
        """
        responses = answer.responses
        if answer.succeeded:
            kvs = [rq.kv_of(r) for r in responses[len(responses) - len(self.reads):]]
            return self.completed(self.record, _answered_lifecycle(self.known, kvs))
        owner_kv, completion_kv = (rq.kv_of(r) for r in responses)
        repeat = self.ours(completion_kv)  # a retry of a completion that already landed
        if repeat is None:
            raise self.refused(owner_kv, completion_kv)
        return self.completed(repeat, _lifecycle(self.ops, self.keys))

    def completed(self, done: Completion, life: Lifecycle) -> LeaseRecord:
        return LeaseRecord(self.keys.job_id, done.owner, None, done.generation,
                           JobState.COMPLETED, done.result, life.attempt, life.error,
                           max_attempts=life.max_attempts)


def _queue(ops: Ops, keys: JobKeys, known: EtcdClaim | None, job_id: str, generation: int,
           what: str) -> str | None:
    """The job's queue: as the claim read it, else read now (with the epoch check of a
    claim this process did not make)."""
    if known is not None and known.queue_known:
        return known.queue
    marker_kv, owner_kv = ops.read_keys(
        [keys.queue, keys.owner], f"reading the queue of {job_id!r}",
        time.monotonic() + ops.config.timeout_s, job_id,
    )
    if known is None:
        ops.check_epoch(keys, generation, owner_kv, what)
    return queue_of(marker_kv)


def _leaving_queue(success: Any, ops: Ops, queue: str, job_id: str,
                   known: EtcdClaim | None, position: int) -> None:
    """Add the completion's writes to the job's queue to ``success``: its pending key,
    held marker and index entry deleted, the completed counter of ``position`` bumped (a
    put: its version counts)."""
    qkeys = ops.layout.queue(queue)
    rq.add_delete(success, qkeys.pending(job_id))
    rq.add_delete(success, qkeys.held(job_id))
    rq.add_put(success, qkeys.done(position), b"")
    if known is not None and known.ordinal is not None:  # else the scan deletes it
        rq.add_delete(success, qkeys.entry(known.ordinal, job_id))


def _lifecycle_reads(keys: JobKeys, known: EtcdClaim | None) -> tuple[bytes, ...]:
    """The keys the completion's ``success`` branch reads for the record it returns:
    none when the claim's handle tells the whole lifecycle (its first attempt, no
    limit: :attr:`EtcdClaim.first_attempt`), the error key when the handle tells the
    attempt and the limit, else the attempts, error and limit keys. The handle's
    knowledge holds because the branch runs only while the owner key has the handle's
    exact value, i.e. while its claim still holds the job."""
    if known is None:
        return (keys.attempts, keys.error, keys.limit)
    if known.first_attempt:
        return ()
    return (keys.error,)


def _answered_lifecycle(known: EtcdClaim | None, kvs: list[Any]) -> Lifecycle:
    """The lifecycle from the handle and the key-values :func:`_lifecycle_reads` asked
    for (in its order)."""
    if known is None:
        return Lifecycle.of(*kvs)
    error = None if not kvs or kvs[0] is None else LastError.decode(kvs[0].value,
                                                                    kvs[0].key).error
    limit = known.limit
    return Lifecycle(known.attempt, error, None if limit is None else limit.max_attempts)


def _lifecycle(ops: Ops, keys: JobKeys) -> Lifecycle:
    """The job's attempt, error and limit, read (after a completion settled by reading
    back: one more round trip, on that rare path only)."""
    kvs = ops.read_keys((keys.attempts, keys.error, keys.limit), f"reading {keys.job_id!r}",
                        time.monotonic() + ops.config.connect_timeout_s, keys.job_id)
    return Lifecycle.of(*kvs)


def release(ops: Ops, handle: EtcdSession, job_id: str, claim: ClaimResult) -> None:
    """See :meth:`EtcdBackend.release <consensus_lease.backends.etcd.EtcdBackend.release>`."""
    item = releasing(ops, handle, job_id, claim)
    if item.known is None or not item.known.queue_known:
        marker_kv, owner_kv = ops.read_keys([item.keys.queue, item.keys.owner],
                                            f"reading {job_id!r}",
                                            time.monotonic() + ops.config.timeout_s, job_id)
        item.queue = queue_of(marker_kv)
        if item.known is None:
            ops.check_epoch(item.keys, item.generation, owner_kv, item.what)
    item.send()
    if item.queue is not None:
        ops.queues.forget_cursor(item.queue)  # its place is at the front: scan from there


def release_many(ops: Ops, handle: EtcdSession,
                 items: Sequence[ReleaseItem]) -> list[LeaseError | None]:
    """See :meth:`EtcdBackend.release_many
    <consensus_lease.backends.etcd.EtcdBackend.release_many>`: one transaction per chunk
    of nested release transactions (:mod:`._jobs_batch`); each item's outcome in its
    place (``None``: released)."""
    outcomes: list[Any] = [None] * len(items)
    batch: list[tuple[int, Releasing]] = []
    for index, (job_id, claim) in enumerate(items):
        try:
            batch.append((index, releasing(ops, handle, job_id, claim)))
        except LeaseError as exc:
            outcomes[index] = exc
    ready = read_queues(ops, batch, outcomes)
    end_many(ops, ready, outcomes, "release", MAX_END_BATCH)
    for queue in {item.queue for _, item in ready if item.queue is not None}:
        ops.queues.forget_cursor(queue)  # released jobs keep their place at the front
    return outcomes


def releasing(ops: Ops, handle: EtcdSession, job_id: str, claim: ClaimResult) -> Releasing:
    """The release of ``job_id`` by ``claim``, not sent yet; its queue as the claim read
    it (``None`` when it did not read it: read first).

    Raises:
        InvalidArgument: ``claim.handle`` is not an :class:`EtcdClaim`.
    """
    known = EtcdClaim.of(claim, handle, job_id)
    return Releasing(ops, handle, ops.layout.job(job_id), claim.generation, known,
                     None if known is None else known.queue)


class Releasing:
    """One release being decided (see the module docstring): :meth:`send` sends it
    alone (:func:`release`), :mod:`._jobs_batch` many as the nested transactions of
    one (:func:`release_many`). Its outcome is ``None`` (released), or raised. A lost
    answer is settled by the release marker in the history key (this session, the
    claim's nonce and generation)."""

    def __init__(self, ops: Ops, handle: EtcdSession, keys: JobKeys, generation: int,
                 known: EtcdClaim | None, queue: str | None) -> None:
        self.ops, self.handle, self.keys, self.known = ops, handle, keys, known
        self.generation, self.queue = generation, queue
        self.nonce = "" if known is None else known.claim_nonce
        self.what = f"release of {keys.job_id!r} generation {generation}"

    @property
    def back(self) -> tuple[bytes, ...]:
        """The keys read back after a lost answer (and by the ``else`` branch)."""
        return (self.keys.owner, self.keys.history, self.keys.completion)

    def fill(self, request: Any, position: int = 0) -> None:
        """Write the release's transaction into the empty ``request`` (it puts no
        counter: ``position`` is not used)."""
        _fill_release(request, self.ops, self.handle, self.keys, self.generation,
                      self.known, self.queue,
                      self.handle.release_marker(self.nonce, self.generation))

    def is_marker(self, history_kv: Any) -> bool:
        """Whether the history key read is this release's marker."""
        if history_kv is None:
            return False
        mine = History(None, self.handle.session_id, self.nonce, self.generation,
                       released=True)
        return History.decode(history_kv.value, history_kv.key) == mine

    def held(self, owner_kv: Any) -> bool:
        """Whether the owner key read back is still this claim's (not applied yet)."""
        return self.ops.held_by(self.handle, owner_kv, self.generation, self.known)

    def from_keys(self, kvs: list[Any]) -> None:
        """After a lost answer, the batch not pending: released if the marker is ours.

        Raises:
            StaleLeaseError / SessionExpired: not released by this claim.
        """
        owner_kv, history_kv, completion_kv = kvs
        if self.is_marker(history_kv):
            return
        raise refusal(self.ops, self.handle, self.keys, self.generation, owner_kv,
                      completion_kv, self.what)

    def answered(self, answer: Any, resent: bool) -> None:
        """From the (nested) answer: released, or (refused) released by the first copy
        of a transaction ``resent`` after a lost answer; else raise the refusal."""
        if answer.succeeded:
            return
        owner_kv, history_kv, completion_kv = (rq.kv_of(r) for r in answer.responses)
        if resent and self.is_marker(history_kv):  # the first copy landed before
            return
        raise refusal(self.ops, self.handle, self.keys, self.generation, owner_kv,
                      completion_kv, self.what)

    def send(self) -> None:
        """Send the release alone (a copy of the last kept request for this job and
        queue), a lost answer settled by reading back."""
        request = _release_request(self.ops, self.handle, self.keys, self.generation,
                                   self.known, self.queue,
                                   self.handle.release_marker(self.nonce, self.generation))
        resent = False

        def decide(kvs: list[Any]) -> Settled | None:
            nonlocal resent
            if self.held(kvs[0]) and not self.is_marker(kvs[1]):
                resent = True
                return None  # not applied: send again
            self.from_keys(kvs)
            return Settled(None)

        answer = self.ops.send_guarded(request, self.what, job_id=self.keys.job_id,
                                       generation=self.generation, read_back=self.back,
                                       decide=decide)
        if not isinstance(answer, Settled):
            self.answered(answer, resent)


def _release_request(ops: Ops, handle: EtcdSession, keys: JobKeys, generation: int,
                     known: EtcdClaim | None, queue: str | None, marker: bytes) -> Any:
    """The release transaction (see the module docstring). With the claim's handle, a
    copy of the last one built for the same job and queue (:class:`~._transport_requests.Kept`)
    with this release's three per-request fields set: the owner key's create revision
    and value compared, and the marker put."""
    key = None if known is None else (keys.base, queue)
    request = None if key is None else ops.kept_release.copy(key)
    if request is not None:
        assert known is not None
        compare = request.compare
        compare[0].create_revision = split(generation)[1]
        compare[1].value = known.owner_value
        request.success[1].request_put.value = marker
        return request
    request = etcdrpc.TxnRequest()
    _fill_release(request, ops, handle, keys, generation, known, queue, marker)
    if key is not None:
        ops.kept_release.keep(key, request)
    return request


def _fill_release(request: Any, ops: Ops, handle: EtcdSession, keys: JobKeys,
                  generation: int, known: EtcdClaim | None, queue: str | None,
                  marker: bytes) -> None:
    """Write the release transaction into the empty ``request``: the ownership
    compares; delete the owner key (and the held marker, the value key), put
    ``marker``; else read the owner, history and completion keys."""
    ops.add_holds(request.compare, handle, keys, generation, known)
    success = request.success
    rq.add_delete(success, keys.owner)
    rq.add_put(success, keys.history, marker)
    if queue is not None:
        rq.add_delete(success, ops.layout.queue(queue).held(keys.job_id))
    if keys.is_election:
        success.extend(ops.ending(keys))
    for read in (keys.owner, keys.history, keys.completion):
        rq.add_get(request.failure, read)
