"""Claims: one compare-and-put transaction per job, or one transaction for a batch.

The claim transaction::

    if create_revision(PREFIX/HEX/o) == 0 and create_revision(PREFIX/HEX/c) == 0
            and create_revision(PREFIX/HEX/n) == 0 and create_revision(PREFIX/HEX/l) == 0:
        put PREFIX/HEX/o = {owner, session, nonce}   (attached to the session's lease)
        put PREFIX/HEX/h = the same value
        put PREFIX/HEX/a = ""                        (answering its previous version)
        get PREFIX/HEX/q
    else:
        get o, c, q, n, l, a, f, e                   (the job's Snapshot)

The generation is the transaction's revision, which is the owner key's create revision;
the attempt is the attempts key's new version (its previous one, answered by the put,
plus 1). A retry delay (``n``) refuses the claim like a holder does. A job with an
attempt limit (``l``) is refused by this compare, and the snapshot its ``else`` branch
answers decides the next transaction (see :mod:`._attempts`): a claim comparing the
limit and the attempt count, or making the job FAILED; so a job without a limit is
claimed in one round trip, one with a limit in two.

The nonce (random per claim request) identifies the request: after a lost answer, an
owner key carrying it is ours; a re-send carries the same nonce, so whichever copy lands
first wins and the other finds our key in its ``else`` branch.

Each claim returns an :class:`~._session.EtcdClaim` as ``ClaimResult.handle``: the
exact owner value written, which renew, complete, release and fail compare against; the
job's work queue from the queue marker ``q`` read in the same transaction, so the
completion can delete the queue's pending key without another round trip (the marker
cannot change while the job is held); the attempt and the limit, from which ``fail``
decides whether the attempts are used up.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

from pyetcd import etcdrpc

from ...errors import InvalidArgument, JobCompleted, JobFailed, OutcomeUnknown
from ...record import ClaimResult
from . import _requests as rq
from ._attempts import (
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
from ._keys import JobKeys, Owner, attempts_of, limit_of, queue_of
from ._ops import Ops, Settled
from ._session import EtcdClaim, EtcdSession

__all__ = ["MAX_BATCH_CLAIM", "MAX_PLANS", "claim_batch", "claim_one"]

MAX_BATCH_CLAIM = 64
"""Claims per batch transaction. Each is one nested transaction of 4 compares, 3 puts
and a get (a count when refused); etcd checks a nested transaction against
``--max-txn-ops`` (default 128) minus the outer transaction's size, so 64 leaves room
under a default server's limit."""

MAX_PLANS = 8
"""Most transactions one claim sends (not counting re-sends after a lost answer) while
the job keeps changing under it; then it answers ``None``, as for a held job."""


def claim_one(ops: Ops, handle: EtcdSession, job_id: str) -> ClaimResult | None:
    """See :meth:`EtcdBackend.claim <consensus_lease.backends.etcd.EtcdBackend.claim>`."""
    keys = ops.layout.job(job_id)
    nonce = secrets.token_hex(8)
    value = Owner(handle.owner, handle.session_id, nonce).encode()
    plan = Plan()
    for _ in range(MAX_PLANS):
        outcome = _send_plan(ops, handle, keys, plan, value, nonce)
        if not isinstance(outcome, Plan):
            return outcome
        plan = outcome
    return None


def _send_plan(ops: Ops, handle: EtcdSession, keys: JobKeys, plan: Plan, value: bytes,
               nonce: str) -> ClaimResult | Plan | None:
    """Send the transaction of ``plan``; answer the claim, or the next plan."""
    job_id = keys.job_id
    request = plan_request(ops.layout, keys, plan, value, handle.lease_id, nonce)

    def decide(kvs: list[Any]) -> Settled | None:
        handle.unsettled(job_id, nonce)  # if still in flight it may land later
        outcome = assess(handle, keys, Snapshot(*kvs), nonce)  # raises if it was FAILED
        if outcome == plan:
            return None  # nothing changed: not applied (yet): send the same request again
        return Settled(outcome)

    try:
        answer = ops.send_guarded(
            request, f"claim of {job_id!r}", job_id=job_id, generation=None,
            read_back=Snapshot.keys(keys), decide=decide,
        )
    except OutcomeUnknown:
        handle.unsettled(job_id, nonce)
        raise
    if isinstance(answer, Settled):
        settled: ClaimResult | Plan | None = answer.value
        return settled
    if not answer.succeeded:
        return assess(handle, keys, Snapshot.of(answer.responses), nonce)
    if plan.exhausted:
        assert plan.snapshot is not None
        raise job_failed(job_id, dead_letter(plan.snapshot, nonce)[0])
    attempt = claimed_attempt(answer.responses[2])
    limit = None if plan.snapshot is None else limit_of(plan.snapshot.limit)
    known = EtcdClaim(handle.lease_id, job_id, value, True,
                      queue_of(rq.kv_of(answer.responses[3])), attempt, limit)
    return ClaimResult(int(answer.header.revision), attempt=attempt, handle=known)


def _claim_or_none(ops: Ops, handle: EtcdSession, job_id: str) -> ClaimResult | None:
    """:func:`claim_one`, with a finished job as ``None`` (a batch's answer)."""
    try:
        return claim_one(ops, handle, job_id)
    except (JobCompleted, JobFailed):
        return None


def claim_batch(ops: Ops, handle: EtcdSession,
                job_ids: Sequence[str]) -> list[ClaimResult | None] | None:
    """Claim ``job_ids`` (at most :data:`MAX_BATCH_CLAIM`, no duplicates) in one
    transaction of nested claim transactions; a held, delayed, completed or FAILED job
    yields ``None``. A job with an attempt limit is refused by its nested compare and
    then claimed on its own (:func:`claim_one`). Returns ``None`` when the server allows
    fewer operations per transaction (the caller then claims one by one)."""
    all_keys = [ops.layout.job(j) for j in job_ids]
    nonce = secrets.token_hex(8)
    value = Owner(handle.owner, handle.session_id, nonce).encode()
    request = rq.txn(success=[
        etcdrpc.RequestOp(request_txn=rq.txn(
            compare=unlimited(k), success=claiming(k, value, handle.lease_id),
            failure=[rq.count(k.limit)],
        ))
        for k in all_keys
    ])
    try:
        answer = ops.send_guarded(
            request, f"batch claim of {len(job_ids)} jobs", job_id=job_ids[0], generation=None,
            read_back=[k.owner for k in all_keys],
            decide=lambda kvs: _settle_batch(ops, handle, all_keys, nonce, kvs),
        )
    except OutcomeUnknown:
        for keys in all_keys:
            handle.unsettled(keys.job_id, nonce)
        raise
    except InvalidArgument as exc:
        if "too many operations" in str(exc):
            return None
        raise
    results: list[ClaimResult | None]
    limited: list[int]
    if isinstance(answer, Settled):
        results, limited = answer.value
    else:
        results, limited = _batch_answer(handle, all_keys, value, answer)
    for i in limited:
        results[i] = _claim_or_none(ops, handle, job_ids[i])
    return results


def _batch_answer(handle: EtcdSession, all_keys: list[JobKeys], value: bytes,
                  answer: Any) -> tuple[list[ClaimResult | None], list[int]]:
    """The claims of a batch's answer, and the indexes of the jobs it refused for their
    attempt limit."""
    generation = int(answer.header.revision)
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
        known = EtcdClaim(handle.lease_id, keys.job_id, value, True, queue_of(marker_kv),
                          attempt, None)
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
    mine = []
    for keys, kv in zip(all_keys, owner_kvs, strict=True):
        handle.unsettled(keys.job_id, nonce)
        mine.append(kv is not None and handle.is_ours(
            keys.job_id, Owner.decode(kv.value, kv.key), nonce))
    if not any(mine):
        return None
    extra = ops.read_keys(
        [k.attempts if m else k.limit for k, m in zip(all_keys, mine, strict=True)],
        "reading back a batch claim's attempts",
        time.monotonic() + ops.config.connect_timeout_s, all_keys[0].job_id,
    )
    results: list[ClaimResult | None] = []
    limited: list[int] = []
    for i, (keys, kv, ours, more) in enumerate(zip(all_keys, owner_kvs, mine, extra,
                                                   strict=True)):
        if not ours:
            results.append(None)
            if more is not None:
                limited.append(i)
            continue
        attempt = attempts_of(more)
        known = EtcdClaim(handle.lease_id, keys.job_id, bytes(kv.value), False, None,
                          attempt, None)
        results.append(ClaimResult(int(kv.create_revision), attempt=attempt, handle=known))
    return Settled((results, limited))

