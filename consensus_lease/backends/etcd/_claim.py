"""Claims: one compare-and-put transaction per job, or one transaction for a batch.

The claim transaction::

    if create_revision(PREFIX/HEX/o) == 0 and create_revision(PREFIX/HEX/c) == 0:
        put PREFIX/HEX/o = {owner, session, nonce}   (attached to the session's lease)
        put PREFIX/HEX/h = the same value
        get PREFIX/HEX/q
    else:
        get PREFIX/HEX/o, get PREFIX/HEX/c, get PREFIX/HEX/q

The generation is the transaction's revision, which is the owner key's create revision.
The nonce (random per claim request) identifies the request: after a lost answer, an
owner key carrying it is ours; a re-send carries the same nonce, so whichever copy lands
first wins and the other finds our key in its ``else`` branch.

Each claim returns an :class:`~._session.EtcdClaim` as ``ClaimResult.handle``: the
exact owner value written, which renew, complete and release compare against, and the
job's work queue from the queue marker ``q`` read in the same transaction, so the
completion can delete the queue's pending key without another round trip (the marker
cannot change while the job is held).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from pyetcd import etcdrpc

from ...errors import InvalidArgument, JobCompleted, OutcomeUnknown
from ...record import ClaimResult
from . import _requests as rq
from ._keys import Completion, JobKeys, Owner, queue_of
from ._ops import Ops, Settled
from ._session import EtcdClaim, EtcdSession

__all__ = ["MAX_BATCH_CLAIM", "claim_batch", "claim_one"]

MAX_BATCH_CLAIM = 64
"""Claims per batch transaction. Each is one nested transaction of 2 compares, 2 puts
and a get; etcd checks a nested transaction against ``--max-txn-ops`` (default 128)
minus the outer transaction's size, so 64 leaves room under a default server's limit."""


def _unclaimed(keys: JobKeys) -> list[Any]:
    """The claim's compares: neither the owner key nor the completion record exists."""
    return [rq.create_is(keys.owner, 0), rq.create_is(keys.completion, 0)]


def _claiming(keys: JobKeys, value: bytes, lease_id: int) -> list[Any]:
    """The claim's writes: the owner key (on the lease) and the history key, both
    ``value``; then the queue marker read."""
    return [rq.put(keys.owner, value, lease_id), rq.put(keys.history, value),
            rq.get(keys.queue)]


def _refused(handle: EtcdSession, keys: JobKeys, owner_kv: Any, completion_kv: Any,
             marker_kv: Any, nonce: str) -> ClaimResult | None:
    """The answer when the compare failed (or after a lost answer, from a read-back)."""
    if completion_kv is not None:
        done = Completion.decode(completion_kv.value, completion_kv.key)
        raise JobCompleted(
            f"{keys.job_id!r} was completed at generation {done.generation}",
            job_id=keys.job_id, generation=done.generation,
        )
    if owner_kv is None:
        return None
    if handle.is_ours(keys.job_id, Owner.decode(owner_kv.value, owner_kv.key), nonce):
        generation = int(owner_kv.create_revision)  # this request, re-sent or landed late
        known = EtcdClaim(handle.lease_id, keys.job_id, bytes(owner_kv.value), True,
                          queue_of(marker_kv))
        return ClaimResult(generation, handle=known)
    return None


def claim_one(ops: Ops, handle: EtcdSession, job_id: str) -> ClaimResult | None:
    """See :meth:`EtcdBackend.claim <consensus_lease.backends.etcd.EtcdBackend.claim>`."""
    keys = ops.layout.job(job_id)
    nonce = secrets.token_hex(8)
    value = Owner(handle.owner, handle.session_id, nonce).encode()
    request = rq.txn(
        compare=_unclaimed(keys),
        success=_claiming(keys, value, handle.lease_id),
        failure=[rq.get(keys.owner), rq.get(keys.completion), rq.get(keys.queue)],
    )

    def decide(kvs: list[Any]) -> Settled | None:
        handle.unsettled(job_id, nonce)  # if still in flight it may land later
        owner_kv, completion_kv, marker_kv = kvs
        if owner_kv is None and completion_kv is None:
            return None  # not applied (yet): send the same request again
        return Settled(_refused(handle, keys, owner_kv, completion_kv, marker_kv, nonce))

    try:
        answer = ops.send_guarded(
            request, f"claim of {job_id!r}", job_id=job_id, generation=None,
            read_back=(keys.owner, keys.completion, keys.queue), decide=decide,
        )
    except OutcomeUnknown:
        handle.unsettled(job_id, nonce)
        raise
    if isinstance(answer, Settled):
        result: ClaimResult | None = answer.value
        return result
    if answer.succeeded:
        known = EtcdClaim(handle.lease_id, job_id, value, True,
                          queue_of(rq.kv_of(answer.responses[2])))
        return ClaimResult(int(answer.header.revision), handle=known)
    owner_kv, completion_kv, marker_kv = (rq.kv_of(r) for r in answer.responses)
    return _refused(handle, keys, owner_kv, completion_kv, marker_kv, nonce)


def claim_batch(ops: Ops, handle: EtcdSession,
                job_ids: Sequence[str]) -> list[ClaimResult | None] | None:
    """Claim ``job_ids`` (at most :data:`MAX_BATCH_CLAIM`, no duplicates) in one
    transaction of nested claim transactions; a held or completed job yields ``None``.
    Returns ``None`` when the server allows fewer operations per transaction (the
    caller then claims one by one)."""
    all_keys = [ops.layout.job(j) for j in job_ids]
    nonce = secrets.token_hex(8)
    value = Owner(handle.owner, handle.session_id, nonce).encode()
    request = rq.txn(success=[
        etcdrpc.RequestOp(request_txn=rq.txn(
            compare=_unclaimed(k), success=_claiming(k, value, handle.lease_id),
        ))
        for k in all_keys
    ])

    def decide(kvs: list[Any]) -> Settled | None:
        # One transaction: if none of its keys carries our nonce it was not applied
        # (or every compare failed): send it again.
        # The queue markers are not read back (that could exceed --max-txn-ops): the
        # completion looks the queue up instead.
        results: list[ClaimResult | None] = []
        for keys, kv in zip(all_keys, kvs, strict=True):
            handle.unsettled(keys.job_id, nonce)
            mine = kv is not None and handle.is_ours(
                keys.job_id, Owner.decode(kv.value, kv.key), nonce
            )
            if mine:
                known = EtcdClaim(handle.lease_id, keys.job_id, bytes(kv.value), False, None)
                results.append(ClaimResult(int(kv.create_revision), handle=known))
            else:
                results.append(None)
        return Settled(results) if any(results) else None

    try:
        answer = ops.send_guarded(
            request, f"batch claim of {len(job_ids)} jobs", job_id=job_ids[0], generation=None,
            read_back=[k.owner for k in all_keys], decide=decide,
        )
    except OutcomeUnknown:
        for keys in all_keys:
            handle.unsettled(keys.job_id, nonce)
        raise
    except InvalidArgument as exc:
        if "too many operations" in str(exc):
            return None
        raise
    if isinstance(answer, Settled):
        settled: list[ClaimResult | None] = answer.value
        return settled
    generation = int(answer.header.revision)
    out: list[ClaimResult | None] = []
    for keys, sub in zip(all_keys, answer.responses, strict=True):
        if sub.response_txn.succeeded:
            marker_kv = rq.kv_of(sub.response_txn.responses[2])
            known = EtcdClaim(handle.lease_id, keys.job_id, value, True, queue_of(marker_kv))
            out.append(ClaimResult(generation, handle=known))
        else:
            out.append(None)
    return out
