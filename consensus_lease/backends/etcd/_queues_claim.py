"""``claim_next_many`` (``Backend.claim_from_queue_many``): the candidate scan, then one
transaction of nested claims.

One call claims up to ``n`` (at most :data:`QUEUE_CLAIM_BATCH`) jobs of a queue::

    candidates = the scan of claim_next (read-only; :mod:`._queues_index`), n at most
    if PREFIX/epoch is as cached:                    (one transaction: _jobs_claim_many)
        per candidate, nested: the claim transaction of :mod:`._jobs_claim` (its
            compares: not completed, held, delayed or limited), which also puts the
            job's held marker and reads its ordinal; else count its limit key
    else:
        get PREFIX/epoch                             (cached; the batch sent again)

etcd decides each nested claim by its own compares, all evaluated against the store as
it was before the transaction, so a candidate another claimer took since the scan fails
its compare and the others are claimed, at one revision: one token for the whole batch
(distinct jobs, so every token is still above every earlier one of its job). Then, if
the scan was cut at ``n`` and some candidates were lost, the next ones are read and
claimed the same way, at most :data:`ROUNDS` rounds lost to other claimers.

A job with an attempt limit fails its nested compare (its limit key exists) and is
claimed on its own afterwards, as ``claim`` does (two round trips; a job whose attempts
are used up becomes FAILED and is not returned). A round that made jobs FAILED (or found
them COMPLETED) is followed by another scan and batch without counting as one of the
:data:`ROUNDS`: each such round ended jobs for good, so any number of exhausted jobs at
the head is walked past and ``[]`` means nothing was claimable, not "others were
quick". Without exhausted jobs this adds nothing. The batch is cut to the server's
``--max-txn-ops`` (one operation per job in the outer list, and 6 in each nested claim:
100 jobs need 106 of the default 128; a server allowing fewer gets smaller batches,
learnt from its first refusal, :mod:`._transport_txn_limit`). A lost answer is settled
by reading the owner keys back (the batch's nonce; see :mod:`._jobs_claim_many`), never
by a blind re-send.

Cost: the scan's reads (two per page of 32 entries) and one transaction per call, plus
two per job with an attempt limit (an exhausted one too, plus a scan and batch per
``n`` of them). A call that claimed every candidate it read moves the
driver's scan cursor past them, so the next call does not read them again.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...backend import QueuePick
from ...errors import InvalidArgument, LeaseError, SessionExpired
from ...record import ClaimResult
from ._jobs import Ops
from ._jobs_claim import claimant_for
from ._jobs_claim_many import batch_request, claim_chunk, claim_or_none
from ._queues_index import candidates
from ._sessions import EtcdClaim, EtcdSession
from ._transport_txn_limit import too_many_ops

__all__ = ["QUEUE_CLAIM_BATCH", "ROUNDS", "claim_queued"]

QUEUE_CLAIM_BATCH = 100
"""Most jobs one call claims (``capabilities.max_queue_claim_batch``): one nested claim
of 6 operations each, so 100 need 106 of etcd's default ``--max-txn-ops`` of 128."""

ROUNDS = 3
"""Most scans (each followed by its batch transaction) one call makes while other
claimers take candidates first; a round that ended jobs (made them FAILED) does not
count."""


def claim_queued(ops: Ops, handle: EtcdSession, queue: str, n: int) -> list[QueuePick]:
    """See :meth:`EtcdBackend.claim_from_queue_many
    <consensus_lease.backends.etcd.EtcdBackend.claim_from_queue_many>`: up to ``n``
    jobs, oldest candidates first. An error after some jobs were claimed ends the call
    with those (``SessionExpired`` excepted). A round that found jobs finished (their
    attempts used up: now FAILED) is followed by another without counting as one of
    :data:`ROUNDS`."""
    picks: list[QueuePick] = []
    tried: set[str] = set()
    lost = 0
    while lost < ROUNDS:
        want = min(n, QUEUE_CLAIM_BATCH) - len(picks)
        if want <= 0:
            break
        ended: set[str] = set()
        try:
            scanned = candidates(ops, queue, want, fill=True)
            found = [c for c in scanned if c[0] not in tried][:want]
            if not found:
                break
            tried.update(job_id for job_id, _ in found)
            results = _claim_ids(ops, handle, [job_id for job_id, _ in found], ended)
        except SessionExpired:
            raise
        except LeaseError:
            if not picks:
                raise
            break  # the jobs claimed so far are held: hand them over
        got = [(job_id, result, payload)
               for (job_id, payload), result in zip(found, results, strict=False)
               if result is not None]
        picks += got
        if len(got) == len(found):
            _past(ops, queue, got)
            break  # every candidate was claimed
        if len(scanned) < want or (len(found) < want and not ended):
            break  # the scan found all there was
        if not ended:
            lost += 1  # others took candidates first; a round that ended jobs is free
    return picks


def _past(ops: Ops, queue: str, got: Sequence[QueuePick]) -> None:
    """Every candidate of the scan was claimed: the driver's next scan may start after
    the last of them (its cursor, :meth:`~._queues_state.QueueCache.move_cursor`)
    instead of reading them again, held, from the first."""
    ordinals = [r.handle.ordinal for _, r, _ in got
                if isinstance(r.handle, EtcdClaim) and r.handle.ordinal is not None]
    if ordinals:
        ops.queues.move_cursor(queue, max(ordinals) + 1, rescanned=False)


def _claim_ids(ops: Ops, handle: EtcdSession, job_ids: Sequence[str],
               ended: set[str]) -> list[ClaimResult | None]:
    """Claim ``job_ids`` in batch transactions cut to the server's ``--max-txn-ops``
    (one, unless a refusal taught a smaller limit); one job alone by the lone claim.
    An error after some were claimed returns those (the rest ``None``, and fewer
    results than ids). The jobs found finished by their lone claim (COMPLETED, or
    FAILED: attempts used up, maybe by this claim) are added to ``ended``.

    Raises:
        SessionExpired: always.
        BackendUnavailable / OutcomeUnknown / StoreRegressed / InvalidArgument: before
            any job was claimed.
    """
    what = f"batch claim of {len(job_ids)} jobs"
    sample = claimant_for(ops, handle, "0" * 16)

    def sizing(chunk: Sequence[str]) -> object:
        return batch_request(ops, [ops.layout.job(j) for j in chunk], sample)

    out: list[ClaimResult | None] = []
    start = 0
    while start < len(job_ids):
        window = job_ids[start : start + QUEUE_CLAIM_BATCH]
        chunk = window[: ops.txn_limit.fitting(window, sizing, what)]
        try:
            if len(chunk) == 1:
                got: list[ClaimResult | None] | None = [
                    claim_or_none(ops, handle, chunk[0], ended)]
            else:
                got = claim_chunk(ops, handle, chunk, ended)
        except InvalidArgument as exc:
            if too_many_ops(exc) and len(chunk) > 1:
                ops.txn_limit.refused(ops, sizing(chunk), what)  # then fewer fit
                continue
            if any(out):
                return out
            raise
        except SessionExpired:
            raise
        except LeaseError:
            if any(out):
                return out
            raise
        if got is None:  # the epoch kept changing: one by one
            got = [claim_or_none(ops, handle, j, ended) for j in chunk]
        out += got
        start += len(chunk)
    return out
