"""Attempt limits: the claims of jobs enqueued with ``max_attempts``.

Every claim puts the job's attempts key ``a`` in its own transaction, so the key's
``version`` counts the claims (the attempt number) without a read, and its
``mod_revision`` is the last claim's generation. A job enqueued with ``max_attempts``
has a limit key ``l`` (:class:`~._layout.Limit`: the limit and ``base``, the attempt
count at the last requeue); the common claim (:mod:`._jobs_claim`) compares ``l``
absent, so a job without a limit costs nothing more. A job with one fails that
compare, and the claim's ``else`` branch answers with the job's
:class:`~._jobs_claim.Snapshot`; from it the claim sends one of::

    LIMITED (attempts - base < max_attempts):
        if o, c, n, f absent and mod_revision(l) == seen and version(a) == seen:
            the claim's puts (o, h, a) and get q
    EXHAUSTED (attempts - base >= max_attempts, nobody holds it):
        if o, c, n, f absent and mod_revision(l), version(a), mod_revision(e) == seen:
            put f = {generation, attempt, error, nonce}   -> JobFailed
            put e (if there was no error yet), delete QDIR/p/HEX

This module holds what differs between them and the common claim: their compares
(:func:`limited`), the EXHAUSTED writes (:func:`exhausted`) and the FAILED record
(:func:`dead_letter`, :func:`job_failed`); :func:`~._jobs_claim.plan_request` puts them
into the claim transaction, whose ``else`` branch answers a fresh snapshot.

Both compare exactly what the decision was made from, so a claim or requeue in between
makes them fail (and answer a fresh snapshot to decide again) instead of acting on a
stale count. A lost answer is settled by reading the snapshot's keys back: our own owner
key (nonce) or a FAILED record means it landed; an unchanged snapshot means "not
applied", and the same request is sent again (its compares cannot pass twice).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import JobFailed
from . import _transport_requests as rq
from ._layout import DeadLetter, JobKeys, LastError, Layout, attempts_epoch, queue_of
from ._tokens import compose

if TYPE_CHECKING:
    from ._jobs_claim import Snapshot

__all__ = ["dead_letter", "exhausted", "job_failed", "limited"]


def job_failed(job_id: str, dead: DeadLetter) -> JobFailed:
    return JobFailed(
        f"{job_id!r} FAILED after {dead.attempt} attempt(s): {dead.error}",
        job_id=job_id, generation=dead.generation, attempt=dead.attempt, error=dead.error,
    )


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


def limited(keys: JobKeys, snap: Snapshot) -> list[Any]:
    """The compares of both plans of a job with a limit: not held, completed, delayed
    or FAILED, and the limit key and the attempt count as ``snap`` read them."""
    free = (keys.owner, keys.completion, keys.not_before, keys.failed)
    compare = [rq.create_is(k, 0) for k in free]
    compare += [rq.mod_is(keys.limit, int(snap.limit.mod_revision)),
                rq.version_is(keys.attempts, snap.attempt)]
    return compare


def exhausted(layout: Layout, keys: JobKeys, snap: Snapshot,
              nonce: str) -> tuple[list[Any], list[Any]]:
    """``(compare, success)`` of the EXHAUSTED transaction: :func:`limited` and the
    last-error key as read; the FAILED record (and the error, if there was none), the
    job's pending key in its queue deleted and the queue's failed counter bumped."""
    compare = limited(keys, snap)
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
    return compare, success
