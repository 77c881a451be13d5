"""Batch claims: one transaction of nested claim transactions, under one compare of the
store epoch.

The transaction of ``claim_many`` for several job ids (at most :data:`MAX_BATCH_CLAIM`)::

    if PREFIX/epoch is as cached:
        for each job: the claim transaction of :mod:`._jobs_claim` without its epoch
            compare, nested; its else branch counts the job's limit key
    else:
        get PREFIX/epoch

All nested claims that pass land at one revision, so they share one generation. A job
with an attempt limit fails its nested compare and is then claimed on its own
(:func:`~._jobs_claim.claim_one`); a server allowing fewer operations per transaction,
or an epoch that keeps changing, makes ``claim_many`` claim one by one
(``claim_next_many`` sends smaller batches instead: :mod:`._queues_claim`). A claim
whose job was lately a queue candidate also puts its held marker and reads its ordinal,
so its completion deletes its index entry. A lost answer is settled by reading the
owner keys back (:func:`_settle_batch`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

from pyetcd import etcdrpc

from ...errors import InvalidArgument, JobCompleted, JobFailed, OutcomeUnknown, StoreRegressed
from ...record import ClaimResult
from . import _transport_requests as rq
from ._jobs import Ops, Settled
from ._jobs_claim import (
    MAX_PLANS,
    Claimant,
    claim_one,
    claimant_for,
    claimed_attempt,
    claiming,
    fix_held,
    hand_back,
    queued_keys,
    unlimited,
)
from ._layout import JobKeys, Owner, attempts_of, ordinal_of, queue_of
from ._sessions import EtcdClaim, EtcdSession
from ._tokens import TokenOverflow, compose
from ._transport_txn_limit import too_many_ops

__all__ = ["MAX_BATCH_CLAIM", "batch_request", "claim_batch", "claim_chunk", "claim_or_none"]

MAX_BATCH_CLAIM = 64
"""Claims per batch transaction. Each is one nested transaction of 2 compares, 3 puts
and a get (a count when refused), and for a job lately offered by a queue scan one more
put (its held marker) and get (its ordinal); etcd checks a nested transaction against
``--max-txn-ops`` (default 128) minus the outer transaction's size, so 64 leaves room
under a default server's limit."""


def _held_key(ops: Ops, job_id: str) -> bytes | None:
    """The held marker of ``job_id`` in the queue it was lately a candidate of."""
    queued = queued_keys(ops, job_id)
    return None if queued is None else queued[0]


def claim_or_none(ops: Ops, handle: EtcdSession, job_id: str,
                  ended: set[str] | None = None) -> ClaimResult | None:
    """:func:`~._jobs_claim.claim_one`, with a finished job as ``None`` (a batch's
    answer), its id added to ``ended`` (if given): COMPLETED, or FAILED (maybe by this
    claim, its attempts used up)."""
    try:
        return claim_one(ops, handle, job_id)
    except (JobCompleted, JobFailed):
        if ended is not None:
            ended.add(job_id)
        return None


Batch = tuple[list[ClaimResult | None], list[int]]
"""A batch's claims, and the indexes of the jobs it refused for their attempt limit."""


def claim_batch(ops: Ops, handle: EtcdSession,
                job_ids: Sequence[str]) -> list[ClaimResult | None] | None:
    """Claim ``job_ids`` (at most :data:`MAX_BATCH_CLAIM`, no duplicates) in one
    transaction of nested claim transactions, under one compare of the store epoch; a
    held, delayed, completed or FAILED job yields ``None``. A job with an attempt limit
    is refused by its nested compare and then claimed on its own
    (:func:`~._jobs_claim.claim_one`). Returns ``None`` when the server allows fewer
    operations per transaction, or the epoch kept changing (the caller then claims one
    by one)."""
    try:
        return claim_chunk(ops, handle, job_ids)
    except InvalidArgument as exc:
        if too_many_ops(exc):
            return None
        raise


def claim_chunk(ops: Ops, handle: EtcdSession, job_ids: Sequence[str],
                ended: set[str] | None = None) -> list[ClaimResult | None] | None:
    """:func:`claim_batch`, but a transaction over the server's ``--max-txn-ops`` raises
    (nothing applied; :func:`batch_request` rebuilds it for sizing, see
    :mod:`._transport_txn_limit`); ``None``: the epoch kept changing. The jobs with an
    attempt limit found finished by their lone claim (COMPLETED, or FAILED: attempts
    used up) are added to ``ended``, if given.

    Raises:
        InvalidArgument: etcd refused the transaction (too many operations, or its
            size); nothing was claimed.
        SessionExpired / StoreRegressed / OutcomeUnknown / BackendUnavailable.
    """
    all_keys = [ops.layout.job(j) for j in job_ids]
    nonce = secrets.token_hex(8)
    outcome: Batch | None = None
    for _ in range(MAX_PLANS):
        outcome = _send_batch(ops, handle, all_keys, claimant_for(ops, handle, nonce), nonce)
        if outcome is not None:
            break
    if outcome is None:
        return None
    results, limited = outcome
    for i in limited:
        results[i] = claim_or_none(ops, handle, job_ids[i], ended)
    return results


def batch_request(ops: Ops, all_keys: Sequence[JobKeys], claimant: Claimant) -> Any:
    """The batch transaction (see the module docstring): per job, a nested claim with
    the job's held marker and ordinal read in the queue it was lately a candidate of."""
    request = etcdrpc.TxnRequest()
    request.compare.append(claimant.same_epoch)
    for k in all_keys:
        nested = request.success.add().request_txn
        unlimited(nested.compare, k)
        claiming(nested.success, k, claimant.value, claimant.lease_id, claimant.epoch,
                 queued_keys(ops, k.job_id))
        nested.failure.append(rq.count(k.limit))
    rq.add_get(request.failure, ops.layout.epoch)
    return request


def _send_batch(ops: Ops, handle: EtcdSession, all_keys: list[JobKeys], claimant: Claimant,
                nonce: str) -> Batch | None:
    """Send one batch transaction; ``None`` if the epoch had changed (now cached)."""
    request = batch_request(ops, all_keys, claimant)
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
        return _batch_answer(ops, handle, all_keys, claimant, answer, nonce)
    except OutcomeUnknown:
        for keys in all_keys:
            handle.unsettled(keys.job_id, nonce)
        raise
    except (StoreRegressed, TokenOverflow):
        hand_back(ops, all_keys, claimant.value)
        raise


def _batch_answer(ops: Ops, handle: EtcdSession, all_keys: list[JobKeys],
                  claimant: Claimant, answer: Any, nonce: str) -> Batch:
    """The claims of a batch's answer (each as :func:`~._jobs_claim.landed` makes it,
    the misplaced held markers fixed in one transaction), and the indexes of the jobs
    it refused for their attempt limit."""
    generation = compose(claimant.epoch, int(answer.header.revision))
    out: list[ClaimResult | None] = []
    limited: list[int] = []
    fixes = []
    for i, (keys, sub) in enumerate(zip(all_keys, answer.responses, strict=True)):
        nested = sub.response_txn
        if not nested.succeeded:
            out.append(None)
            if nested.responses[0].response_range.count > 0:
                limited.append(i)
            continue
        attempt = claimed_attempt(nested.responses[2])
        queue = queue_of(rq.kv_of(nested.responses[3]))
        put = _held_key(ops, keys.job_id)
        right = None if queue is None else ops.layout.queue(queue).held(keys.job_id)
        ordinal = None
        if right != put:
            fixes.append((keys, claimant.value, put, queue))
        elif len(nested.responses) >= 6:
            ordinal = ordinal_of(rq.kv_of(nested.responses[5]))
        known = EtcdClaim(handle.lease_id, keys.job_id, claimant.value, True, queue,
                          attempt, None, claimant.epoch, ordinal, nonce)
        out.append(ClaimResult(generation, attempt=attempt, handle=known))
    fix_held(ops, fixes, claimant.lease_id)
    ops.queues.taken([k.job_id for k, r in zip(all_keys, out, strict=True) if r is not None])
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
