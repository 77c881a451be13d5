"""``complete_and_claim_next``: a completion and the claim of the next job of a queue in
one transaction, the claim nested inside the completion's ``success`` branch.

The transaction::

    if the owner key of the completed job is ours at its generation:   (as complete)
        the completion's writes (record, owner and history deleted, the queue's
            pending key, held marker and index entry deleted, completed counter)
        nested: if the candidate is neither completed, held, delayed nor limited
                and PREFIX/epoch is as cached:
            the claim's writes (:func:`~._jobs_claim.claiming`: owner key on the
                session's lease, history, attempts, held marker; its queue marker
                and ordinal read)
        else:
            count the candidate's limit key
        the completion's reads
    else:
        get the owner key, get the completion record                   (as complete)

A nested transaction runs only in the branch that holds it, so a refused completion
claims nothing; etcd decides the nested claim by its own compares (against the store as
it was before the transaction), so when the candidate was taken meanwhile the
completion commits alone. The two share no key (etcd refuses a transaction that puts or
deletes one key twice, also across nested transactions): they are different jobs, and
the claim puts no queue counter.

The candidate is one of those the driver's last scan of the queue offered and no claim
of this driver took since (:meth:`~._queues_state.QueueCache.take`: a random one of the
oldest few, offered less than :data:`~._queues_state.RESCAN_S` ago); with none left the
scan runs first (read-only, two round trips per page of 32 entries), and an empty
queue gets the completion alone. So a worker draining a queue pays one round trip per
job, plus a scan per 32 jobs (or per second). When the nested claim does not apply (the
candidate was taken or has an attempt limit, the epoch changed, or the completion was a
repeat), the completion stands and the next job is claimed as ``claim_next`` claims it
(:func:`claim_after`: the candidate first if it has a limit or may be ours, then
a fresh scan's), each claim settling its own lost answer; a claim that makes an
exhausted job FAILED does not count as one of the :data:`FALLBACK_TRIES`, so any number
of them at the head is walked past; an error there is not raised: no next job.

A lost answer is settled by reading back the completed job's owner key and completion
record and the candidate's owner, attempts and queue marker keys, in one read: the
completion record ours means it landed, and the candidate's owner key carrying this
request's nonce that the claim did too; the completed job still held by the claim means
nothing landed, and the same transaction (whose compares cannot pass twice) is sent
again; the candidate is remembered as possibly ours (:meth:`EtcdSession.unsettled`), so
a copy landing late is adopted by :func:`claim_after`.
"""

from __future__ import annotations

import logging
from typing import Any

from pyetcd import etcdrpc

from ...backend import QueuePick
from ...errors import (
    InvalidArgument,
    JobCompleted,
    JobFailed,
    LeaseError,
    OutcomeUnknown,
    StoreRegressed,
)
from ...record import ClaimResult, LeaseRecord
from . import _transport_requests as rq
from ._jobs import Ops, Settled
from ._jobs_claim import (
    Claimant,
    claim_one,
    claimant_for,
    claiming,
    hand_back,
    landed,
    new_nonce,
    unlimited,
)
from ._jobs_hold import Completing, completing
from ._layout import JobKeys, Owner, attempts_of, queue_of
from ._queues_index import candidates
from ._sessions import EtcdClaim, EtcdSession
from ._tokens import TokenOverflow, compose
from ._transport_txn_limit import too_many_ops

__all__ = ["FALLBACK_TRIES", "SCAN", "claim_after", "complete_and_claim_next"]

log = logging.getLogger("consensus_lease.etcd")

SCAN = 32
"""Candidates one scan asks for when no offered one is left (``claim_next``'s count)."""

FALLBACK_TRIES = 3
"""Most lone claims :func:`claim_after` sends that find the job held or delayed, when
the nested claim did not apply (those finding it finished, e.g. made FAILED, are not
counted)."""

Outcome = tuple[LeaseRecord, QueuePick | None, bool]
"""The completion's record, the job claimed with it, and whether :func:`claim_after`
should try the candidate itself (it has a limit, a lost answer may have claimed it, or
its claim was not sent)."""


def complete_and_claim_next(ops: Ops, handle: EtcdSession, job_id: str, claim: ClaimResult,
                            result: bytes, queue: str) -> tuple[LeaseRecord, QueuePick | None]:
    """See :meth:`EtcdBackend.complete_and_claim_next
    <consensus_lease.backends.etcd.EtcdBackend.complete_and_claim_next>`."""
    done = completing(ops, handle, job_id, claim, result)
    try:
        pick = next_candidate(ops, queue, job_id)
    except InvalidArgument:  # a queue of the first layout: nothing to claim from it
        pick = None
    if pick is None:
        return done.send(), None  # nothing claimable: the completion alone
    record, picked, again = _send_fused(ops, handle, done, queue, pick)
    if picked is None:
        picked = claim_after(ops, handle, queue, job_id, pick if again else None)
    return record, picked


def next_candidate(ops: Ops, queue: str, exclude: str) -> tuple[str, bytes] | None:
    """An offered candidate of ``queue`` (not ``exclude``), else one of a fresh scan's
    oldest few (``None``: the queue has nothing claimable).

    Raises:
        InvalidArgument: the queue was written by the first queue layout.
        BackendUnavailable / AuthenticationFailed: the scan failed.
    """
    pick = ops.queues.take(queue, exclude)
    if pick is None:
        candidates(ops, queue, SCAN)  # offers what it finds
        pick = ops.queues.take(queue, exclude)
    return pick


def claim_after(ops: Ops, handle: EtcdSession, queue: str, exclude: str,
                first: tuple[str, bytes] | None) -> QueuePick | None:
    """The next job of ``queue`` claimed as ``claim_next`` claims it, after a fused
    transaction whose nested claim did not apply: ``first`` (if given), then offered or
    freshly scanned candidates, at most :data:`FALLBACK_TRIES` lone claims that find
    the job held or delayed; a claim that finds it finished (COMPLETED, or FAILED: its
    attempts used up, maybe by this claim) does not count, so any number of exhausted
    jobs at the head is walked past (two round trips each, and a scan per
    :data:`SCAN`). ``None`` when none was claimed; an error is logged, not raised (the
    completion committed)."""
    pick = first
    ended: set[str] = set()
    tries = 0
    try:
        while tries < FALLBACK_TRIES:
            pick = pick or next_candidate(ops, queue, exclude)
            if pick is None:
                return None
            (job_id, payload), pick = pick, None
            if job_id in ended:  # offered again (a scan does not offer a finished job)
                tries += 1
                continue
            try:
                got = claim_one(ops, handle, job_id)
            except (JobCompleted, JobFailed):
                ended.add(job_id)  # finished for good: not one of the tries
                continue
            if got is not None:
                return job_id, got, payload
            tries += 1
    except LeaseError as exc:
        log.info("etcd: claiming the next job of queue %r after a completion failed "
                 "(no next job): %s", queue, exc)
    return None


def _send_fused(ops: Ops, handle: EtcdSession, done: Completing, queue: str,
                pick: tuple[str, bytes]) -> Outcome:
    """Send the fused transaction (module docstring); a server allowing fewer
    operations gets the completion alone (its limit learnt).

    Raises:
        StaleLeaseError / SessionExpired: the completion was refused; nothing claimed.
        OutcomeUnknown / BackendUnavailable / StoreRegressed / InvalidArgument: as
            ``complete`` (a claim that may have landed is handed back, or adopted by
            this session's next claim of the job).
    """
    keys = ops.layout.job(pick[0])
    nonce = new_nonce()
    claimant = claimant_for(ops, handle, nonce, keys.job_id)
    request = etcdrpc.TxnRequest()
    done.then = -1
    _nested_claim(done.fill(request), keys, claimant)
    what = f"{done.what} and claim of {keys.job_id!r}"
    if not _fits(ops, request, what):  # the completion alone; the candidate untried
        return done.send(), None, True
    try:
        answer = ops.send_guarded(
            request, what, job_id=done.keys.job_id, generation=done.generation,
            read_back=[done.keys.owner, done.keys.completion, keys.owner, keys.attempts,
                       keys.queue],
            decide=lambda kvs: _settle(done, handle, keys, nonce, kvs))
    except InvalidArgument as exc:
        if not too_many_ops(exc):
            raise
        ops.txn_limit.refused(ops, request, what)
        return done.send(), None, True  # nothing applied: the completion alone
    except OutcomeUnknown:
        handle.unsettled(keys.job_id, nonce)  # if it lands later, adopt the claim
        raise
    except StoreRegressed:
        hand_back(ops, [keys], claimant.value)
        raise
    if isinstance(answer, Settled):
        done_record, claimed = answer.value
        picked = None if claimed is None else (keys.job_id, claimed, pick[1])
        return done.settled(done_record), picked, claimed is None
    return _answered(ops, done, keys, claimant, answer, nonce, (queue, pick))


def _fits(ops: Ops, request: Any, what: str) -> bool:
    """Whether ``request`` fits the server's ``--max-txn-ops`` as far as it is known."""
    try:
        ops.txn_limit.check(request, what)
    except InvalidArgument:
        return False
    return True


def _nested_claim(nested: Any, keys: JobKeys, claimant: Claimant) -> None:
    """Fill the empty nested transaction ``nested`` with the common claim of ``keys``
    (its compares and the epoch's, its writes, and a count of its limit key when
    refused)."""
    unlimited(nested.compare, keys)
    nested.compare.append(claimant.same_epoch)
    claiming(nested.success, keys, claimant.value, claimant.lease_id, claimant.epoch,
             claimant.queued)
    nested.failure.append(rq.count(keys.limit))


def _answered(ops: Ops, done: Completing, keys: JobKeys, claimant: Claimant, answer: Any,
              nonce: str, target: tuple[str, tuple[str, bytes]]) -> Outcome:
    """The outcome of the fused transaction's answer (``target``: the queue and the
    candidate ``(job_id, payload)``).

    Raises:
        StaleLeaseError / SessionExpired: the completion was refused.
    """
    queue, pick = target
    record = done.answered(answer)
    if not answer.succeeded:  # a repeat of a completion that landed: no claim ran
        return record, None, True
    assert done.then is not None
    nested = answer.responses[done.then].response_txn
    if not nested.succeeded:
        limited = nested.responses[0].response_range.count > 0
        if not limited:
            ops.queues.drop_offers(queue)  # taken by another claimer: the offers are old
        return record, None, limited
    try:
        claimed = landed(ops, done.handle, keys, claimant, nested.responses,
                         int(answer.header.revision), nonce)
    except TokenOverflow:
        hand_back(ops, [keys], claimant.value)
        return record, None, False
    return record, (keys.job_id, claimed, pick[1]), False


def _settle(done: Completing, handle: EtcdSession, keys: JobKeys, nonce: str,
            kvs: list[Any]) -> Settled | None:
    """After a lost answer, from the keys read back (the completed job's owner and
    completion, the candidate's owner, attempts and queue marker): ``None`` if the
    completion is not applied yet (send again), else ``Settled((completion, claim or
    None))``.

    Raises:
        StaleLeaseError / SessionExpired: the completion cannot land.
    """
    handle.unsettled(keys.job_id, nonce)  # if still in flight it may land later
    settled = done.decide(kvs[:2])
    if settled is None:
        return None
    owner_kv, attempts_kv, marker_kv = kvs[2:]
    owner = None if owner_kv is None else Owner.decode(owner_kv.value, owner_kv.key)
    if owner is None or not handle.is_ours(keys.job_id, owner, nonce):
        return Settled((settled.value, None))
    attempt = attempts_of(attempts_kv)
    known = EtcdClaim(handle.lease_id, keys.job_id, bytes(owner_kv.value), True,
                      queue_of(marker_kv), attempt, None, owner.epoch, None, owner.nonce)
    token = compose(owner.epoch, int(owner_kv.create_revision))
    return Settled((settled.value, ClaimResult(token, attempt=attempt, handle=known)))
