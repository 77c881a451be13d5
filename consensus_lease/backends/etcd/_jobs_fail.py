"""Failing a held job, and putting a FAILED job back: one guarded transaction each.

``fail`` compares as release does (the owner key's create revision is the generation and
its value is the claim's)::

    if held at generation G:
        delete o, put h = release marker (this session, the claim's nonce, G)
        put e = {error, session, G, attempt, nonce}
        (delete v, for an election; delete QDIR/h/HEX, for a queued job)
        attempts used up (attempt - base >= max_attempts):
            put f = {G, attempt, error, nonce}, delete QDIR/p/HEX      -> FAILED
            (and put QDIR/k/failed; delete the index entry if the claim read its ordinal)
        else, retry_in_s > 0:
            put n = "" attached to a lease of its own                  -> AVAILABLE later
    else:
        get o, get c, get e

Whether the attempts are used up is decided from the claim's handle (its attempt, and
the limit it compared), or, for a claim this process did not make, from one read of the
job's attempts, limit and queue keys first.

The retry delay is a key on its **own etcd lease**, granted (``LeaseGrant``, one round
trip before the transaction) with a TTL of ``ceil(retry_in_s)`` whole seconds, at least
1: etcd's leases count whole seconds, and etcd raises a TTL below its minimum (1.5 x the
election timeout: 2 s with default settings) to that minimum. The leader deletes the key
when the lease runs out (its expiry sweep runs every 500 ms); a new leader extends every
lease by its TTL. So the job is claimable ``max(ceil(retry_in_s), minimum TTL)`` seconds
after the fail, up to about half a second later, longer across a leader change; never
earlier. ``retry_in_s == 0`` writes no key. Claims compare the key absent; waiting
claims watch it go. If the transaction does not apply, the lease is revoked (best
effort; otherwise it expires holding nothing); a lost ``LeaseGrant`` answer leaves an
orphan lease that expires the same way.

``requeue`` reads the job's keys, then::

    if mod_revision(f) == seen and QDIR/k/seq == S (read first):
        delete f, put l = {max_attempts, base = attempts so far, nonce}
        put QDIR/p/HEX = S, QDIR/i/S/HEX = ""   (pending again, at the back)
        put QDIR/k/seq = S + 1, put QDIR/k/requeued

Lost answers: a fail is recognised by its nonce in the error key ``e``, a requeue by its
nonce in the limit key ``l``; either found means it landed. Otherwise, if the compare
still holds, the same request is sent again (its compare cannot pass twice).
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any

from ...errors import BackendUnavailable, InvalidArgument, OutcomeUnknown
from ...record import ClaimResult, JobState, LeaseRecord
from . import _transport_requests as rq
from ._jobs import Ops, Settled, refusal
from ._layout import (
    ATTEMPTS,
    FAILED,
    LIMIT,
    QUEUE,
    DeadLetter,
    History,
    JobKeys,
    LastError,
    Limit,
    attempts_of,
    limit_of,
    ordinal_bytes,
    queue_of,
)
from ._layout_records import job_record, read_kinds
from ._queues_index import read_counters
from ._sessions import EtcdClaim, EtcdSession

__all__ = ["MAX_REQUEUE_ROUNDS", "delay_ttl_s", "fail", "requeue"]

MAX_REQUEUE_ROUNDS = 8
"""Most read-and-compare rounds of one requeue while the job keeps changing."""


def delay_ttl_s(retry_in_s: float) -> int:
    """The TTL (whole seconds) requested for a retry delay's lease: ``retry_in_s``
    rounded up, at least 1 (etcd may grant more: its minimum TTL)."""
    return max(1, math.ceil(retry_in_s))


def _facts(ops: Ops, keys: JobKeys, generation: int, known: EtcdClaim | None,
           what: str) -> tuple[str | None, int, Limit | None]:
    """``(queue, attempt, limit)`` of the claim: from its handle, else (a claim this
    process did not make, or one settled without reading the queue) one read, which
    also checks the epoch of a claim without its handle (:meth:`Ops.check_epoch`)."""
    if known is not None and known.queue_known:
        return known.queue, known.attempt, known.limit
    marker_kv, attempts_kv, limit_kv, owner_kv = ops.read_keys(
        (keys.queue, keys.attempts, keys.limit, keys.owner),
        f"reading the attempts of {keys.job_id!r}",
        time.monotonic() + ops.config.timeout_s, keys.job_id,
    )
    if known is not None:
        return queue_of(marker_kv), known.attempt, known.limit
    ops.check_epoch(keys, generation, owner_kv, what)
    return queue_of(marker_kv), attempts_of(attempts_kv), limit_of(limit_kv)


def fail(ops: Ops, handle: EtcdSession, job_id: str, claim: ClaimResult, error: str,
         retry_in_s: float) -> LeaseRecord:
    """See :meth:`EtcdBackend.fail <consensus_lease.backends.etcd.EtcdBackend.fail>`."""
    known = EtcdClaim.of(claim, handle, job_id)
    generation = claim.generation
    keys = ops.layout.job(job_id)
    what = f"failure of {job_id!r} generation {generation}"
    queue, attempt, limit = _facts(ops, keys, generation, known, what)
    exhausted = limit is not None and limit.exhausted(attempt)
    nonce = secrets.token_hex(8)
    claim_nonce = "" if known is None else known.claim_nonce
    marker = History(None, handle.session_id, claim_nonce, generation, released=True)
    success = [rq.delete(keys.owner), rq.put(keys.history, marker.encode()),
               rq.put(keys.error, LastError(error, handle.session_id, generation, attempt,
                                            nonce).encode()),
               *ops.ending(keys)]
    qkeys = None if queue is None else ops.layout.queue(queue)
    if qkeys is not None:
        success.append(rq.delete(qkeys.held(job_id)))
    lease_id, ttl_s = 0, 0
    if exhausted:
        success.append(rq.put(keys.failed, DeadLetter(generation, attempt, error,
                                                      nonce).encode()))
        if qkeys is not None:
            success += [rq.delete(qkeys.pending(job_id)), rq.put(qkeys.counter("failed"), b"")]
            if known is not None and known.ordinal is not None:  # else the scan does it
                success.append(rq.delete(qkeys.entry(known.ordinal, job_id)))
    elif retry_in_s > 0:
        lease_id, ttl_s = ops.grant(delay_ttl_s(retry_in_s), f"{what}: the retry delay's lease")
        success.append(rq.put(keys.not_before, b"", lease_id))
    request = rq.txn(compare=ops.holds(handle, keys, generation, known), success=success,
                     failure=[rq.get(keys.owner), rq.get(keys.completion), rq.get(keys.error)])
    try:
        _send_fail(ops, handle, keys, generation, known, request, nonce, what)
    except OutcomeUnknown:
        raise  # it may have landed, with the key on the lease
    except BaseException:
        if lease_id:
            ops.revoke(lease_id)
        raise
    if queue is not None and not exhausted:
        ops.queues.forget_cursor(queue)  # it keeps its place at the front
    state = JobState.FAILED if exhausted else JobState.AVAILABLE
    not_before = time.time() + ttl_s if lease_id else None
    return LeaseRecord(job_id, None, None, generation, state, None, attempt, error, not_before,
                       None if limit is None else limit.max_attempts)


def _send_fail(ops: Ops, handle: EtcdSession, keys: JobKeys, generation: int,
               known: EtcdClaim | None, request: Any, nonce: str, what: str) -> None:
    """Send the fail transaction; settle a lost answer from the error key's nonce."""
    resent = False

    def landed(error_kv: Any) -> bool:
        return (error_kv is not None
                and LastError.decode(error_kv.value, error_kv.key).nonce == nonce)

    def decide(kvs: list[Any]) -> Settled | None:
        nonlocal resent
        owner_kv, completion_kv, error_kv = kvs
        if landed(error_kv):
            return Settled(None)
        if ops.held_by(handle, owner_kv, generation, known):
            resent = True
            return None  # not applied: send again
        raise refusal(ops, handle, keys, generation, owner_kv, completion_kv, what)

    answer = ops.send_guarded(
        request, what, job_id=keys.job_id, generation=generation,
        read_back=(keys.owner, keys.completion, keys.error), decide=decide,
    )
    if isinstance(answer, Settled) or answer.succeeded:
        return
    owner_kv, completion_kv, error_kv = (rq.kv_of(r) for r in answer.responses)
    if resent and landed(error_kv):  # the first copy landed before the re-send
        return
    raise refusal(ops, handle, keys, generation, owner_kv, completion_kv, what)


def requeue(ops: Ops, job_id: str) -> LeaseRecord:
    """See :meth:`EtcdBackend.requeue <consensus_lease.backends.etcd.EtcdBackend.requeue>`."""
    keys = ops.layout.job(job_id)
    nonce = secrets.token_hex(8)
    what = f"requeue of {job_id!r}"
    for _ in range(MAX_REQUEUE_ROUNDS):
        kinds = read_kinds(ops, job_id, what)
        if FAILED not in kinds:
            record = job_record(ops, job_id, kinds, {})
            state = "unknown" if record is None else record.state.value
            raise InvalidArgument(
                f"only a FAILED job can be requeued; {job_id!r} is {state}", job_id=job_id
            )
        limit = limit_of(kinds.get(LIMIT))
        if limit is None:
            raise BackendUnavailable(f"{what}: corrupt job: FAILED without a limit key",
                                     job_id=job_id)
        fresh = Limit(limit.max_attempts, attempts_of(kinds.get(ATTEMPTS)), nonce)
        if _send_requeue(ops, keys, kinds, fresh, what):
            del kinds[FAILED]
            record = job_record(ops, job_id, kinds, {})
            assert record is not None
            return record
    raise BackendUnavailable(f"{what}: the job kept changing; try again", job_id=job_id)


def _send_requeue(ops: Ops, keys: JobKeys, kinds: dict[bytes, Any], fresh: Limit,
                  what: str) -> bool:
    """The requeue transaction for the FAILED record in ``kinds``; whether it applied
    (``False``: the job changed since it was read)."""
    seen = int(kinds[FAILED].mod_revision)
    compare = [rq.mod_is(keys.failed, seen)]
    success = [rq.delete(keys.failed), rq.put(keys.limit, fresh.encode())]
    queue = queue_of(kinds.get(QUEUE))
    if queue is not None:  # the job takes the queue's next ordinal: to the back
        qkeys = ops.layout.queue(queue)
        counters = read_counters(ops, qkeys, what)
        compare.append(counters.same_seq(qkeys))
        success += [rq.put(qkeys.pending(keys.job_id), ordinal_bytes(counters.seq)),
                    rq.put(qkeys.entry(counters.seq, keys.job_id), b""),
                    *counters.taking(qkeys, 1), rq.put(qkeys.counter("requeued"), b"")]
        ops.queues.set_counters(queue, None)
    request = rq.txn(compare=compare, success=success)

    def decide(kvs: list[Any]) -> Settled | None:
        dead_kv, limit_kv = kvs
        if limit_kv is not None and limit_of(limit_kv) == fresh:
            return Settled(True)  # ours landed
        if dead_kv is not None and int(dead_kv.mod_revision) == seen:
            return None  # not applied: send again
        return Settled(False)

    answer = ops.send_guarded(request, what, job_id=keys.job_id, generation=None,
                              read_back=(keys.failed, keys.limit), decide=decide)
    if isinstance(answer, Settled):
        return bool(answer.value)
    return bool(answer.succeeded)
