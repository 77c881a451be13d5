"""Attempts: what a claim learns from a job's keys, and the claims of jobs with a limit.

Every claim puts the job's attempts key ``a`` in its own transaction, so the key's
``version`` counts the claims (the attempt number) without a read, and its
``mod_revision`` is the last claim's generation. A job enqueued with ``max_attempts``
has a limit key ``l`` (:class:`~._layout.Limit`: the limit and ``base``, the attempt
count at the last requeue); the common claim compares ``l`` absent, so a job without a
limit costs nothing more. A job with one fails that compare, and the claim's ``else``
branch answers with the job's :class:`Snapshot`; from it the claim sends one of::

    LIMITED (attempts - base < max_attempts):
        if o, c, n, f absent and mod_revision(l) == seen and version(a) == seen:
            the claim's puts (o, h, a) and get q
    EXHAUSTED (attempts - base >= max_attempts, nobody holds it):
        if o, c, n, f absent and mod_revision(l), version(a), mod_revision(e) == seen:
            put f = {generation, attempt, error, nonce}   -> JobFailed
            put e (if there was no error yet), delete QDIR/p/HEX

Claiming transactions also compare the store's epoch key with the driver's cached copy
(see :mod:`._tokens`), and every ``else`` branch answers the job's keys with one range
read of its directory and the epoch key with a get (two operations, whatever
``--max-txn-ops`` is).

Both compare exactly what the decision was made from, so a claim or requeue in between
makes them fail (and answer a fresh snapshot to decide again) instead of acting on a
stale count. A lost answer is settled by reading the snapshot's keys back: our own owner
key (nonce) or a FAILED record means it landed; an unchanged snapshot means "not
applied", and the same request is sent again (its compares cannot pass twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyetcd import etcdrpc

from ...errors import JobCompleted, JobFailed
from ...record import ClaimResult
from . import _transport_requests as rq
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
    LastError,
    Layout,
    Owner,
    attempts_epoch,
    attempts_of,
    attempts_value,
    free_range,
    limit_of,
    queue_of,
)
from ._sessions import EtcdClaim, EtcdSession
from ._tokens import compose

__all__ = [
    "Claimant",
    "Plan",
    "Snapshot",
    "assess",
    "claimed_attempt",
    "claiming",
    "dead_letter",
    "job_failed",
    "plan_request",
    "unlimited",
]


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
    (``exhausted``) making the job FAILED."""

    snapshot: Snapshot | None = None
    exhausted: bool = False


def job_failed(job_id: str, dead: DeadLetter) -> JobFailed:
    return JobFailed(
        f"{job_id!r} FAILED after {dead.attempt} attempt(s): {dead.error}",
        job_id=job_id, generation=dead.generation, attempt=dead.attempt, error=dead.error,
    )


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


def dead_letter(snap: Snapshot, nonce: str) -> tuple[DeadLetter, bool]:
    """The FAILED record a claim writes when the attempts are used up, and whether it
    must write the error too (there was none)."""
    attempt = snap.attempt
    generation = 0 if snap.attempts is None else compose(attempts_epoch(snap.attempts),
                                                        int(snap.attempts.mod_revision))
    if snap.error is not None:
        error = LastError.decode(snap.error.value, snap.error.key).error
    else:
        error = f"attempts exhausted: attempt {attempt} ended without completion"
    return DeadLetter(generation, attempt, error, nonce), snap.error is None


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


def plan_request(layout: Layout, keys: JobKeys, plan: Plan, claimant: Claimant,
                 nonce: str) -> Any:
    """The transaction of ``plan`` (see the module docstring); its ``else`` branch
    answers a fresh :class:`Snapshot`."""
    snap = plan.snapshot
    if snap is None or not plan.exhausted:
        request = etcdrpc.TxnRequest()
        claiming(request.success, keys, claimant.value, claimant.lease_id, claimant.epoch,
                 claimant.queued)
        Snapshot.add_reads(request.failure, keys)
    if snap is None:
        unlimited(request.compare, keys)
        request.compare.append(claimant.same_epoch)
        return request
    free = (keys.owner, keys.completion, keys.not_before, keys.failed)
    compare = [rq.create_is(k, 0) for k in free]
    compare += [rq.mod_is(keys.limit, int(snap.limit.mod_revision)),
                rq.version_is(keys.attempts, snap.attempt)]
    if not plan.exhausted:
        request.compare.extend([*compare, claimant.same_epoch])
        return request
    compare.append(rq.mod_is(keys.error, 0 if snap.error is None else
                             int(snap.error.mod_revision)))
    dead, with_error = dead_letter(snap, nonce)
    success = [rq.put(keys.failed, dead.encode())]
    if with_error:
        note = LastError(dead.error, "", dead.generation, dead.attempt, nonce)
        success.append(rq.put(keys.error, note.encode()))
    queue = queue_of(snap.marker)
    if queue is not None:
        qkeys = layout.queue(queue)
        success += [rq.delete(qkeys.pending(keys.job_id)), rq.put(qkeys.counter("failed"), b"")]
        # (its index entry is left stale: the scan deletes it)
    return rq.txn(compare=compare, success=success, failure=Snapshot.reads(keys))
