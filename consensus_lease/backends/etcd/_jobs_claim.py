"""Claims: one compare-and-put transaction per job, built, sent and answered here (a batch
of them nested in one transaction: :mod:`._jobs_claim_many`).

The claim transaction::

    if create_revision(PREFIX/HEX/c) == 0
            and no key in [PREFIX/HEX/l, PREFIX/HEX/o]     (l, n, o: one range compare)
            and PREFIX/epoch is as cached (absent, or the exact value seen):
        put PREFIX/HEX/o = {owner, session, nonce, epoch}  (on the session's lease)
        put PREFIX/HEX/h = the same value
        put PREFIX/HEX/a = epoch ("" for 0)                (answering its previous version)
        get PREFIX/HEX/q
        put QDIR/h/HEX (on the lease), get QDIR/p/HEX      (a job lately a queue candidate)
    else:
        range PREFIX/HEX/a .. q, get PREFIX/epoch          (the job's Snapshot)

The generation (fencing token) is ``epoch * 2**44 + the transaction's revision``, the
revision being the owner key's create revision; with epoch 0 it is the revision itself.
A claim refused only because the epoch changed since it was cached (a ``bump_epoch``)
caches the new one from its ``else`` branch and is sent again: one more round trip, once
per driver after each bump. The attempt is the attempts key's new version (its previous
one, answered by the put, plus 1). A retry delay (``n``) refuses the claim like a holder
does. A job with an attempt limit (``l``) is refused by this compare, and the
:class:`Snapshot` its ``else`` branch answers decides the next transaction
(:func:`assess`; the compares and writes of :mod:`._jobs_attempts`): a claim comparing
the limit and the attempt count, or making the job FAILED; so a job
without a limit is claimed in one round trip, one with a limit in two (plus one, best
effort, for a queued job whose queue this driver did not know: :func:`fix_held` puts its
held marker).

The nonce (random per claim request) identifies the request: after a lost answer, an
owner key carrying it is ours; a re-send carries the same nonce, so whichever copy lands
first wins and the other finds our key in its ``else`` branch.

A claim answered from a history older than one this driver has seen (the store was
restored from an older snapshot; :mod:`._tokens_history`) is handed back (its owner key
deleted, best effort) and raises ``StoreRegressed``; so is one whose revision reached
2**44 (:class:`~._tokens.TokenOverflow`).

Each claim returns an :class:`~._sessions.EtcdClaim` as ``ClaimResult.handle``: the
exact owner value written, which renew, complete, release and fail compare against; the
job's work queue from the queue marker ``q`` read in the same transaction, so the
completion can delete the queue's pending key without another round trip (the marker
cannot change while the job is held); the attempt and the limit, from which ``fail``
decides whether the attempts are used up.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyetcd import etcdrpc

from ...errors import JobCompleted, LeaseError, OutcomeUnknown, StoreRegressed
from ...record import ClaimResult
from . import _transport_requests as rq
from ._jobs import Ops, Settled
from ._jobs_attempts import dead_letter, exhausted, job_failed, limited
from ._layout import (
    ATTEMPTS,
    COMPLETION,
    ERROR,
    FAILED,
    LIMIT,
    NOT_BEFORE,
    OWNER,
    QUEUE,
    Completion,
    DeadLetter,
    JobKeys,
    Layout,
    Limit,
    Owner,
    attempts_of,
    attempts_value,
    free_range,
    limit_of,
    ordinal_of,
    queue_of,
)
from ._sessions import EtcdClaim, EtcdSession
from ._tokens import TokenOverflow, compose
from ._transport import Failure

__all__ = [
    "MAX_PLANS",
    "Claimant",
    "Plan",
    "Snapshot",
    "assess",
    "claim_one",
    "claimant_for",
    "claimed_attempt",
    "claiming",
    "fix_held",
    "hand_back",
    "landed",
    "new_nonce",
    "plan_request",
    "queued_keys",
    "unlimited",
]

log = logging.getLogger("consensus_lease.etcd")

MAX_PLANS = 8
"""Most transactions one claim sends (not counting re-sends after a lost answer) while
the job (or the store epoch) keeps changing under it; then it answers ``None``, as for
a held job."""

_FIELD_KINDS = (OWNER, COMPLETION, QUEUE, NOT_BEFORE, LIMIT, ATTEMPTS, FAILED, ERROR)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A job's keys and the store's epoch key as one claim sees them (key-values,
    ``None`` when absent), read in one transaction: the claim's ``else`` branch or a
    read-back."""

    owner: Any
    completion: Any
    marker: Any
    not_before: Any
    limit: Any
    attempts: Any
    dead: Any
    error: Any
    epoch: Any

    @staticmethod
    def reads(keys: JobKeys) -> list[Any]:
        """The reads that answer a snapshot inside a transaction: the job's directory
        (one range) and the epoch key."""
        return [rq.span(*keys.directory), rq.get(keys.epoch)]

    @staticmethod
    def add_reads(ops: Any, keys: JobKeys) -> None:
        """Append :meth:`reads` to the repeated ``ops`` field of a transaction being
        built."""
        rq.add_span(ops, *keys.directory)
        rq.add_get(ops, keys.epoch)

    @classmethod
    def of(cls, keys: JobKeys, responses: Any) -> Snapshot:
        """From the responses of :meth:`reads`."""
        kinds: dict[bytes, Any] = {}
        for kv in responses[0].response_range.kvs:
            kind = keys.kind_of(bytes(kv.key))
            if kind is not None:
                kinds[kind] = kv
        owner, completion, marker, not_before, limit, attempts, dead, error = (
            kinds.get(k) for k in _FIELD_KINDS)
        return cls(owner, completion, marker, not_before, limit, attempts, dead, error,
                   rq.kv_of(responses[1]))

    @property
    def attempt(self) -> int:
        return attempts_of(self.attempts)


@dataclass(frozen=True, slots=True)
class Plan:
    """The claim transaction to send: without a limit (``snapshot is None``: the
    common one), or comparing the limit and attempts of ``snapshot``, then claiming or
    (``exhausted``) making the job FAILED (:mod:`._jobs_attempts`)."""

    snapshot: Snapshot | None = None
    exhausted: bool = False


@dataclass(frozen=True, slots=True)
class Claimant:
    """What a claim transaction writes: the owner value (which records ``epoch``), on
    the session's lease, while the epoch key passes ``same_epoch``."""

    value: bytes
    lease_id: int
    epoch: int
    same_epoch: Any
    queued: tuple[bytes, bytes] | None = None

    @property
    def held(self) -> bytes | None:
        """The held marker the claim puts (``None``: the job's queue is not known)."""
        return None if self.queued is None else self.queued[0]


def claim_one(ops: Ops, handle: EtcdSession, job_id: str) -> ClaimResult | None:
    """See :meth:`EtcdBackend.claim <consensus_lease.backends.etcd.EtcdBackend.claim>`."""
    keys = ops.layout.job(job_id)
    nonce = new_nonce()
    plan = Plan()
    for _ in range(MAX_PLANS):
        outcome = _send_plan(ops, handle, keys, plan, nonce)
        if not isinstance(outcome, Plan):
            return outcome
        plan = outcome
    return None


def new_nonce() -> str:
    """A claim request's nonce: 16 hex digits, random. It only has to differ from this
    session's other claims of the job (an owner value is ours by session id *and*
    nonce), not be unpredictable: the module ``random`` (reseeded in a fork's child)
    instead of a system call per claim."""
    return f"{random.getrandbits(64):016x}"


def claimant_for(ops: Ops, handle: EtcdSession, nonce: str, job_id: str | None = None) -> Claimant:
    """What a claim request writes, in the epoch cached now; for a job that was a
    candidate of a queue lately, that queue's held marker too."""
    epoch, same_epoch = ops.epochs.current()
    value = handle.owner_value(nonce, epoch)
    return Claimant(value, handle.lease_id, epoch, same_epoch,
                    None if job_id is None else queued_keys(ops, job_id))


def queued_keys(ops: Ops, job_id: str) -> tuple[bytes, bytes] | None:
    """The held marker and pending key of ``job_id`` in the queue it was lately a
    candidate of (``None``: not known)."""
    queue = ops.queues.queue_hint(job_id)
    if queue is None:
        return None
    qkeys = ops.layout.queue(queue)
    return qkeys.held(job_id), qkeys.pending(job_id)


def fix_held(ops: Ops, claims: Sequence[tuple[JobKeys, bytes, bytes | None, str | None]],
             lease_id: int) -> None:
    """Best effort, one transaction: for each ``(keys, owner value, held marker put,
    queue read)`` of a claim that landed whose held marker is missing (the job's queue
    was not known when claiming) or misplaced, put the right one on the lease (and
    delete the wrong one) while the owner key still has the claim's value. Failures
    are logged: only ``queue_stats`` counts the job as available while held."""
    nested = []
    for keys, value, put, queue in claims:
        right = None if queue is None else ops.layout.queue(queue).held(keys.job_id)
        if right == put:
            continue
        success = [] if put is None else [rq.delete(put)]
        if right is not None:
            success.append(rq.put(right, b"", lease_id))
        nested.append(etcdrpc.RequestOp(request_txn=rq.txn(
            compare=[rq.value_is(keys.owner, value)], success=success)))
    if not nested:
        return
    what = f"marking the claim of {claims[0][0].job_id!r} held in its queue"
    try:
        ops.transport.send("kv", "Txn", rq.txn(success=nested), what=what,
                           job_id=claims[0][0].job_id)
    except (LeaseError, Failure) as exc:
        log.warning("etcd: %s failed: %s", what, exc)


def _send_plan(ops: Ops, handle: EtcdSession, keys: JobKeys, plan: Plan,
               nonce: str) -> ClaimResult | Plan | None:
    """Send the transaction of ``plan``; answer the claim, or the next plan."""
    job_id = keys.job_id
    claimant = claimant_for(ops, handle, nonce, job_id)
    request = _request(ops, keys, plan, claimant, nonce)

    def read_back(deadline: float) -> list[Any]:
        return ops.read_ops(Snapshot.reads(keys), f"reading back the claim of {job_id!r}",
                            deadline, job_id)

    def decide(responses: list[Any]) -> Settled | None:
        handle.unsettled(job_id, nonce)  # if still in flight it may land later
        snap = Snapshot.of(keys, responses)
        changed = ops.epochs.update(snap.epoch)
        outcome = assess(handle, keys, snap, nonce)  # raises if it was FAILED
        if outcome == plan and not changed:
            return None  # nothing changed: not applied (yet): send the same request again
        return Settled(outcome)

    try:
        answer = ops.send_guarded(request, f"claim of {job_id!r}", job_id=job_id,
                                  generation=None, read_back=read_back, decide=decide)
        if isinstance(answer, Settled):
            settled: ClaimResult | Plan | None = answer.value
            return settled
        if not answer.succeeded:
            snap = Snapshot.of(keys, answer.responses)
            ops.epochs.update(snap.epoch)  # refused for the epoch alone: the same plan again
            return assess(handle, keys, snap, nonce)
        if plan.exhausted:
            assert plan.snapshot is not None
            raise job_failed(job_id, dead_letter(plan.snapshot, nonce)[0])
        limit = None if plan.snapshot is None else limit_of(plan.snapshot.limit)
        return landed(ops, handle, keys, claimant, answer.responses,
                      int(answer.header.revision), nonce, limit)
    except OutcomeUnknown:
        handle.unsettled(job_id, nonce)
        raise
    except (StoreRegressed, TokenOverflow):
        hand_back(ops, [keys], claimant.value)
        raise


def assess(handle: EtcdSession, keys: JobKeys, snap: Snapshot,
           nonce: str) -> ClaimResult | Plan | None:
    """What a claim with ``nonce`` makes of ``snap``: its own claim (landed), ``None``
    (held, or a retry delay runs), or the :class:`Plan` to send.

    Raises:
        JobCompleted / JobFailed: the job is finished.
    """
    if snap.completion is not None:
        done = Completion.decode(snap.completion.value, snap.completion.key)
        raise JobCompleted(f"{keys.job_id!r} was completed at generation {done.generation}",
                           job_id=keys.job_id, generation=done.generation)
    if snap.dead is not None:
        raise job_failed(keys.job_id, DeadLetter.decode(snap.dead.value, snap.dead.key))
    limit = limit_of(snap.limit)
    if snap.owner is not None:
        if not handle.is_ours(keys.job_id, Owner.decode(snap.owner.value, snap.owner.key),
                              nonce):
            return None
        # This request (re-sent or landed late) or an unsettled one of this session.
        epoch = Owner.decode(snap.owner.value, snap.owner.key).epoch
        known = EtcdClaim(handle.lease_id, keys.job_id, bytes(snap.owner.value), True,
                          queue_of(snap.marker), snap.attempt, limit, epoch)
        return ClaimResult(compose(epoch, int(snap.owner.create_revision)),
                           attempt=snap.attempt, handle=known)
    if snap.not_before is not None:
        return None
    if limit is None:
        return Plan()
    return Plan(snap, limit.exhausted(snap.attempt))


def _request(ops: Ops, keys: JobKeys, plan: Plan, claimant: Claimant, nonce: str) -> Any:
    """The transaction of ``plan``: for the common one (no snapshot), a copy of the last
    one built if that was for the same job, lease, epoch and queue, with this claim's
    owner value (the only per-request part: it holds the nonce) put in the owner and
    history puts (:func:`claiming`'s first two operations)."""
    if plan.snapshot is not None:
        return plan_request(ops.layout, keys, plan, claimant, nonce)
    key = (keys.base, claimant.lease_id, claimant.epoch, claimant.same_epoch,
           claimant.queued)
    request = ops.kept_claim.copy(key)
    if request is None:
        request = plan_request(ops.layout, keys, plan, claimant, nonce)
        ops.kept_claim.keep(key, request)
        return request
    success = request.success
    value = claimant.value
    success[0].request_put.value = value
    success[1].request_put.value = value
    return request


def claiming(success: Any, keys: JobKeys, value: bytes, lease_id: int, epoch: int,
             queued: tuple[bytes, bytes] | None = None) -> None:
    """Append the claim's writes to the repeated ``success`` field of a transaction
    being built: the owner key (on the lease) and the history key, both ``value``, the
    attempts key (``epoch``, answering its previous version); then the queue marker
    read; last, for a job known to be queued (``queued``: its held marker and pending
    key there), put the held marker (on the lease) and read the pending key (the job's
    ordinal)."""
    rq.add_put(success, keys.owner, value, lease_id)
    rq.add_put(success, keys.history, value)
    rq.add_put(success, keys.attempts, attempts_value(epoch), prev_kv=True)
    rq.add_get(success, keys.queue)
    if queued is not None:
        rq.add_put(success, queued[0], b"", lease_id)
        rq.add_get(success, queued[1])


def claimed_attempt(put_response: Any) -> int:
    """The attempt number from the answer to the attempts key's put in :func:`claiming`."""
    return int(put_response.response_put.prev_kv.version) + 1


def unlimited(compare: Any, keys: JobKeys) -> None:
    """Append the common claim's compares to the repeated ``compare`` field: not
    completed (``c`` absent), and not limited, delayed or held: no key from ``l`` to
    ``o`` (:func:`~._layout.free_range`: exactly the limit, not-before and owner keys of
    the job's kinds; one range compare instead of three, which etcd checks key by key:
    etcd's ``Compare.range_end``, API reference "Compare"). A job with a limit key takes
    a :class:`Plan` with a snapshot instead; it cannot be FAILED without one."""
    base = keys.base
    rq.add_create_is(compare, base + COMPLETION, 0)
    rq.add_none_in(compare, *free_range(base))


def plan_request(layout: Layout, keys: JobKeys, plan: Plan, claimant: Claimant,
                 nonce: str) -> Any:
    """The transaction of ``plan`` (see the module docstring; a job with a limit takes
    the compares and writes of :mod:`._jobs_attempts`); its ``else`` branch answers a
    fresh :class:`Snapshot`."""
    snap = plan.snapshot
    if snap is not None and plan.exhausted:
        compare, success = exhausted(layout, keys, snap, nonce)
        return rq.txn(compare=compare, success=success, failure=Snapshot.reads(keys))
    request = etcdrpc.TxnRequest()
    claiming(request.success, keys, claimant.value, claimant.lease_id, claimant.epoch,
             claimant.queued)
    Snapshot.add_reads(request.failure, keys)
    if snap is None:
        unlimited(request.compare, keys)
    else:
        request.compare.extend(limited(keys, snap))
    request.compare.append(claimant.same_epoch)
    return request


def landed(ops: Ops, handle: EtcdSession, keys: JobKeys, claimant: Claimant,
           responses: Any, revision: int, nonce: str, limit: Limit | None = None) -> ClaimResult:
    """The claim from the ``responses`` of a claiming transaction (top-level or nested:
    :func:`claiming`'s operations first) that applied at ``revision``: its token,
    attempt and handle. A held marker put in the wrong queue (or none, the queue not
    known) is fixed (:func:`fix_held`; the handle then knows no ordinal), and the job
    is no longer one of this driver's offered candidates.

    Raises:
        TokenOverflow: the revision reached 2**44 (nothing fixed yet).
    """
    token = compose(claimant.epoch, revision)
    attempt = claimed_attempt(responses[2])
    queue = queue_of(rq.kv_of(responses[3]))
    right = None if queue is None else ops.layout.queue(queue).held(keys.job_id)
    ordinal = None
    if right != claimant.held:  # the queue was not known, or not the hinted one
        fix_held(ops, [(keys, claimant.value, claimant.held, queue)], claimant.lease_id)
    elif len(responses) >= 6:
        ordinal = ordinal_of(rq.kv_of(responses[5]))
    ops.queues.taken([keys.job_id])
    known = EtcdClaim(handle.lease_id, keys.job_id, claimant.value, True, queue, attempt,
                      limit, claimant.epoch, ordinal, nonce)
    return ClaimResult(token, attempt=attempt, handle=known)


def hand_back(ops: Ops, all_keys: Sequence[JobKeys], value: bytes) -> None:
    """Best effort, in one transaction: delete each owner key of ``all_keys`` whose value
    is ``value`` (what one claim request wrote; its nonce makes it unique). Failures
    are logged: the session is over, and ending it revokes its lease, which deletes
    them too."""
    request = rq.txn(success=[
        etcdrpc.RequestOp(request_txn=rq.txn(compare=[rq.value_is(k.owner, value)],
                                             success=[rq.delete(k.owner)]))
        for k in all_keys
    ])
    what = f"handing back the claim of {all_keys[0].job_id!r}"
    try:
        ops.transport.send("kv", "Txn", request, what=what, job_id=all_keys[0].job_id)
    except (LeaseError, Failure) as exc:
        log.warning("etcd: %s failed (the session's lease takes it when it ends): %s",
                    what, exc)
