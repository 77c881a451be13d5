"""Claims: one compare-and-put transaction per job, or one transaction for a batch.

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
does. A job with an attempt limit (``l``) is refused by this compare, and the snapshot
its ``else`` branch answers decides the next transaction (see :mod:`._jobs_attempts`): a
claim comparing the limit and the attempt count, or making the job FAILED; so a job
without a limit is claimed in one round trip, one with a limit in two (plus one, best
effort, for a queued job whose queue this driver did not know: :func:`fix_held` puts its
held marker).

The nonce (random per claim request) identifies the request: after a lost answer, an
owner key carrying it is ours; a re-send carries the same nonce, so whichever copy lands
first wins and the other finds our key in its ``else`` branch.

A claim answered from a history older than one this driver has seen (the store was
restored from an older snapshot; :mod:`._tokens_regression`) is handed back (its owner key
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

import dataclasses
import logging
import random
import secrets
import time
from collections.abc import Sequence
from typing import Any

from pyetcd import etcdrpc

from ...errors import (
    InvalidArgument,
    JobCompleted,
    JobFailed,
    LeaseError,
    OutcomeUnknown,
    StoreRegressed,
)
from ...record import ClaimResult
from . import _transport_requests as rq
from ._jobs import Ops, Settled
from ._jobs_attempts import (
    Claimant,
    Plan,
    Snapshot,
    assess,
    claimed_attempt,
    claiming,
    dead_letter,
    job_failed,
    plan_request,
    unlimited,
)
from ._layout import JobKeys, Owner, attempts_of, limit_of, ordinal_of, queue_of
from ._sessions import EtcdClaim, EtcdSession
from ._tokens import TokenOverflow, compose
from ._transport import Failure

__all__ = ["MAX_BATCH_CLAIM", "MAX_PLANS", "claim_batch", "claim_one", "fix_held", "hand_back"]

log = logging.getLogger("consensus_lease.etcd")

MAX_BATCH_CLAIM = 64
"""Claims per batch transaction. Each is one nested transaction of 2 compares, 3 puts
and a get (a count when refused), and for a job lately offered by a queue scan one more
put (its held marker) and get (its ordinal); etcd checks a nested transaction against
``--max-txn-ops`` (default 128) minus the outer transaction's size, so 64 leaves room
under a default server's limit."""

MAX_PLANS = 8
"""Most transactions one claim sends (not counting re-sends after a lost answer) while
the job (or the store epoch) keeps changing under it; then it answers ``None``, as for
a held job."""


def claim_one(ops: Ops, handle: EtcdSession, job_id: str) -> ClaimResult | None:
    """See :meth:`EtcdBackend.claim <consensus_lease.backends.etcd.EtcdBackend.claim>`."""
    keys = ops.layout.job(job_id)
    nonce = _nonce()
    plan = Plan()
    for _ in range(MAX_PLANS):
        outcome = _send_plan(ops, handle, keys, plan, nonce)
        if not isinstance(outcome, Plan):
            return outcome
        plan = outcome
    return None


def _nonce() -> str:
    """A claim request's nonce: 16 hex digits, random. It only has to differ from this
    session's other claims of the job (an owner value is ours by session id *and*
    nonce), not be unpredictable: the module ``random`` (reseeded in a fork's child)
    instead of a system call per claim."""
    return f"{random.getrandbits(64):016x}"


def _claimant(ops: Ops, handle: EtcdSession, nonce: str, job_id: str | None = None) -> Claimant:
    """What a claim request writes, in the epoch cached now; for a job that was a
    candidate of a queue lately, that queue's held marker too."""
    epoch, same_epoch = ops.epochs.current()
    value = handle.owner_value(nonce, epoch)
    return Claimant(value, handle.lease_id, epoch, same_epoch,
                    None if job_id is None else _queued(ops, job_id))


def _queued(ops: Ops, job_id: str) -> tuple[bytes, bytes] | None:
    """The held marker and pending key of ``job_id`` in the queue it was lately a
    candidate of (``None``: not known)."""
    queue = ops.queues.queue_hint(job_id)
    if queue is None:
        return None
    qkeys = ops.layout.queue(queue)
    return qkeys.held(job_id), qkeys.pending(job_id)


def _held_key(ops: Ops, job_id: str) -> bytes | None:
    """The held marker of ``job_id`` in the queue it was lately a candidate of."""
    queued = _queued(ops, job_id)
    return None if queued is None else queued[0]


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
    claimant = _claimant(ops, handle, nonce, job_id)
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
        claimed = _claimed(handle, keys, plan, claimant, answer, nonce)
        known = claimed.handle
        assert isinstance(known, EtcdClaim)
        right = None if known.queue is None else ops.layout.queue(known.queue).held(job_id)
        if right != claimant.held:  # the queue was not known, or not the hinted one
            fix_held(ops, [(keys, claimant.value, claimant.held, known.queue)],
                     claimant.lease_id)
            return ClaimResult(claimed.generation, attempt=claimed.attempt,
                               handle=dataclasses.replace(known, ordinal=None))
        return claimed
    except OutcomeUnknown:
        handle.unsettled(job_id, nonce)
        raise
    except (StoreRegressed, TokenOverflow):
        hand_back(ops, [keys], claimant.value)
        raise


def _request(ops: Ops, keys: JobKeys, plan: Plan, claimant: Claimant, nonce: str) -> Any:
    """The transaction of ``plan``: for the common one (no snapshot), a copy of the last
    one built if that was for the same job, lease, epoch and queue, with this claim's
    owner value (the only per-request part: it holds the nonce) put in the owner and
    history puts (:func:`~._jobs_attempts.claiming`'s first two operations)."""
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


def _claimed(handle: EtcdSession, keys: JobKeys, plan: Plan, claimant: Claimant,
             answer: Any, nonce: str) -> ClaimResult:
    """The claim from the answer of a claiming transaction that applied.

    Raises:
        TokenOverflow: the revision reached 2**44.
    """
    responses = answer.responses
    attempt = claimed_attempt(responses[2])
    limit = None if plan.snapshot is None else limit_of(plan.snapshot.limit)
    ordinal = None if len(responses) < 6 else ordinal_of(rq.kv_of(responses[5]))
    known = EtcdClaim(handle.lease_id, keys.job_id, claimant.value, True,
                      queue_of(rq.kv_of(responses[3])), attempt, limit, claimant.epoch,
                      ordinal, nonce)
    token = compose(claimant.epoch, int(answer.header.revision))
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


def _claim_or_none(ops: Ops, handle: EtcdSession, job_id: str) -> ClaimResult | None:
    """:func:`claim_one`, with a finished job as ``None`` (a batch's answer)."""
    try:
        return claim_one(ops, handle, job_id)
    except (JobCompleted, JobFailed):
        return None


Batch = tuple[list[ClaimResult | None], list[int]]
"""A batch's claims, and the indexes of the jobs it refused for their attempt limit."""


def claim_batch(ops: Ops, handle: EtcdSession,
                job_ids: Sequence[str]) -> list[ClaimResult | None] | None:
    """Claim ``job_ids`` (at most :data:`MAX_BATCH_CLAIM`, no duplicates) in one
    transaction of nested claim transactions, under one compare of the store epoch; a
    held, delayed, completed or FAILED job yields ``None``. A job with an attempt limit
    is refused by its nested compare and then claimed on its own (:func:`claim_one`).
    Returns ``None`` when the server allows fewer operations per transaction, or the
    epoch kept changing (the caller then claims one by one)."""
    all_keys = [ops.layout.job(j) for j in job_ids]
    nonce = secrets.token_hex(8)
    outcome: Batch | None = None
    for _ in range(MAX_PLANS):
        try:
            outcome = _send_batch(ops, handle, all_keys, _claimant(ops, handle, nonce), nonce)
        except InvalidArgument as exc:
            if "too many operations" in str(exc):
                return None
            raise
        if outcome is not None:
            break
    if outcome is None:
        return None
    results, limited = outcome
    for i in limited:
        results[i] = _claim_or_none(ops, handle, job_ids[i])
    return results


def _send_batch(ops: Ops, handle: EtcdSession, all_keys: list[JobKeys], claimant: Claimant,
                nonce: str) -> Batch | None:
    """Send one batch transaction; ``None`` if the epoch had changed (now cached)."""
    request = etcdrpc.TxnRequest()
    request.compare.append(claimant.same_epoch)
    for k in all_keys:
        nested = request.success.add().request_txn
        unlimited(nested.compare, k)
        claiming(nested.success, k, claimant.value, claimant.lease_id, claimant.epoch,
                 _queued(ops, k.job_id))
        nested.failure.append(rq.count(k.limit))
    rq.add_get(request.failure, ops.layout.epoch)
    try:
        answer = ops.send_guarded(
            request, f"batch claim of {len(all_keys)} jobs", job_id=all_keys[0].job_id,
            generation=None, read_back=[k.owner for k in all_keys],
            decide=lambda kvs: _settle_batch(ops, handle, all_keys, nonce, kvs),
        )
        if isinstance(answer, Settled):
            settled: Batch = answer.value
            return settled
        if not answer.succeeded:
            ops.epochs.update(rq.kv_of(answer.responses[0]))
            return None
        batch = _batch_answer(handle, all_keys, claimant, answer)
        fix_held(ops, [(keys, claimant.value, _held_key(ops, keys.job_id), r.handle.queue)
                       for keys, r in zip(all_keys, batch[0], strict=True)
                       if r is not None and isinstance(r.handle, EtcdClaim)],
                 claimant.lease_id)
        return batch
    except OutcomeUnknown:
        for keys in all_keys:
            handle.unsettled(keys.job_id, nonce)
        raise
    except (StoreRegressed, TokenOverflow):
        hand_back(ops, all_keys, claimant.value)
        raise


def _batch_answer(handle: EtcdSession, all_keys: list[JobKeys], claimant: Claimant,
                  answer: Any) -> Batch:
    """The claims of a batch's answer, and the indexes of the jobs it refused for their
    attempt limit."""
    generation = compose(claimant.epoch, int(answer.header.revision))
    out: list[ClaimResult | None] = []
    limited: list[int] = []
    for i, (keys, sub) in enumerate(zip(all_keys, answer.responses, strict=True)):
        nested = sub.response_txn
        if not nested.succeeded:
            out.append(None)
            if nested.responses[0].response_range.count > 0:
                limited.append(i)
            continue
        attempt = claimed_attempt(nested.responses[2])
        marker_kv = rq.kv_of(nested.responses[3])
        known = EtcdClaim(handle.lease_id, keys.job_id, claimant.value, True,
                          queue_of(marker_kv), attempt, None, claimant.epoch)
        out.append(ClaimResult(generation, attempt=attempt, handle=known))
    return out, limited


def _settle_batch(ops: Ops, handle: EtcdSession, all_keys: list[JobKeys], nonce: str,
                  owner_kvs: list[Any]) -> Settled | None:
    """A batch's lost answer, from its owner keys read back. One transaction: if none of
    them carries our nonce it was not applied (or every compare failed): send it again.
    Otherwise one more read: the attempts key of each job we claimed, the limit key of
    each other one (refused for a limit: claimed on its own afterwards). The queue
    markers are not read back (that could exceed --max-txn-ops): the completion looks
    the queue up instead."""
    owners = [None if kv is None else Owner.decode(kv.value, kv.key) for kv in owner_kvs]
    mine = []
    for keys, owner in zip(all_keys, owners, strict=True):
        handle.unsettled(keys.job_id, nonce)
        mine.append(owner is not None and handle.is_ours(keys.job_id, owner, nonce))
    if not any(mine):
        return None
    extra = ops.read_keys(
        [k.attempts if m else k.limit for k, m in zip(all_keys, mine, strict=True)],
        "reading back a batch claim's attempts",
        time.monotonic() + ops.config.connect_timeout_s, all_keys[0].job_id,
    )
    results: list[ClaimResult | None] = []
    limited: list[int] = []
    for i, (keys, kv, owner, more) in enumerate(zip(all_keys, owner_kvs, owners, extra,
                                                    strict=True)):
        if owner is None or not mine[i]:
            results.append(None)
            if more is not None:
                limited.append(i)
            continue
        attempt = attempts_of(more)
        known = EtcdClaim(handle.lease_id, keys.job_id, bytes(kv.value), False, None,
                          attempt, None, owner.epoch)
        token = compose(owner.epoch, int(kv.create_revision))
        results.append(ClaimResult(token, attempt=attempt, handle=known))
    return Settled((results, limited))
