"""Claiming from a work queue: :meth:`Session.claim_next` and
:meth:`Session.claim_next_many`.

The claim itself is the same atomic store operation as a named claim; this module only
chooses which job to try, or lets a driver pick and claim in one statement
(:meth:`consensus_lease.backend.Backend.claim_from_queue`; a batch:
:meth:`~consensus_lease.backend.Backend.claim_from_queue_many`). Candidates come
oldest-enqueued first; each claimer starts at a random one of the oldest
:data:`QUEUE_SPREAD`, so concurrent workers do not all collide on the head of the queue.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from ._waiting import wait_and_claim
from .backend import Backend
from .errors import (
    ClaimTimeout,
    JobCompleted,
    JobFailed,
    LeaseError,
    LeaseLost,
    StoreClosed,
    StoreInherited,
    UnsupportedOperation,
)
from .validation import check_count, check_queue_name, check_wait

if TYPE_CHECKING:
    from ._holdings import Holdings
    from .lease import Lease
    from .session import Session

__all__ = ["QUEUE_CANDIDATES", "QUEUE_READS", "QUEUE_RETRIES", "QUEUE_SPREAD", "claim_next",
           "claim_next_many"]

QUEUE_CANDIDATES = 32
"""How many claimable-looking jobs ``claim_next`` asks the store for at a time."""

QUEUE_SPREAD = 8
"""``claim_next`` starts at a random one of the oldest this-many candidates."""

QUEUE_RETRIES = 3
"""Reads of the candidates, one after the other, while others take every candidate
first, before the claim waits (or returns ``None``)."""

QUEUE_READS = 32
"""Most reads of the candidates by one claim attempt that end no job. A read whose list
turned out stale (a candidate completed or FAILED meanwhile: another worker finished it,
or its attempts were used up and this claim made it FAILED) is read again without
counting as one of :data:`QUEUE_RETRIES`, nor as one of these: each such read ended a
job for good, so any number of exhausted jobs at the head is walked past and ``None``
means "nothing claimable", not "others were quick" (cost: one claim round trip per
exhausted job, and a read per :data:`QUEUE_CANDIDATES` of them)."""

_NONE, _TAKEN, _STALE = "none", "taken", "stale"


def claim_next(
    session: Session, holdings: Holdings, queue: str, wait_s: float | None
) -> Lease | None:
    """See :meth:`Session.claim_next`."""
    check_queue_name(queue)
    wait = None if wait_s is None else check_wait(wait_s)
    backend = session.backend
    if not backend.capabilities.queues:
        raise UnsupportedOperation(f"the {backend.scheme} backend has no work queues")
    def once(woken: bool = False) -> Lease | None:
        return holdings.timed_claim("claim_next", None,
                                    lambda: _claim_once(session, holdings, queue, woken))

    if wait is None:
        return once()
    return wait_and_claim(
        session, lambda wake: backend.subscribe_queue(queue, wake), once, wait,
        lambda: ClaimTimeout(f"no job of queue {queue!r} became claimable in {wait} s"),
        again=lambda: once(woken=True),
    )


def claim_next_many(session: Session, holdings: Holdings, queue: str, n: int) -> list[Lease]:
    """See :meth:`Session.claim_next_many`: one call of the driver per
    ``capabilities.max_queue_claim_batch`` jobs, until ``n`` are claimed or a call
    returns fewer than it was asked for."""
    check_queue_name(queue)
    count = check_count(n, "n")
    backend = session.backend
    if not backend.capabilities.queues:
        raise UnsupportedOperation(f"the {backend.scheme} backend has no work queues")
    step = max(1, backend.capabilities.max_queue_claim_batch)
    start = holdings.claim_started()
    leases: list[Lease] = []
    try:
        _claim_batches(session, holdings, queue, count, step, leases)
    except BaseException as exc:
        holdings.report_queue_claims([], start, exc)
        raise
    holdings.report_queue_claims(leases, start)
    return leases


def _claim_batches(session: Session, holdings: Holdings, queue: str, count: int, step: int,
                   leases: list[Lease]) -> None:
    """The calls of :func:`claim_next_many`, appending to ``leases``."""
    backend, handle = session.backend, session.handle
    while len(leases) < count:
        want = min(step, count - len(leases))
        try:
            session.ensure_alive()
            picks = holdings.liveness.call(
                lambda w=want: backend.claim_from_queue_many(handle, queue, w))  # type: ignore[misc]
        except (LeaseLost, StoreClosed, StoreInherited):
            raise  # the session is over (with the leases of earlier calls), or unusable
        except LeaseError:
            if not leases:
                raise
            break  # the leases of earlier calls are held: hand them over
        leases.extend(holdings.adopt(session, job_id, claim, payload, queue)
                      for job_id, claim, payload in picks)
        if len(picks) < want:
            break


def _claim_once(session: Session, holdings: Holdings, queue: str,
                woken: bool = False) -> Lease | None:
    """Claim a job of ``queue`` without waiting: read the candidates and try them,
    reading again (up to :data:`QUEUE_RETRIES` times) while others take every one, and
    while reads end jobs (COMPLETED or FAILED: never tried again by this call).
    ``woken``: a waiting claim's try once subscribed to the queue, which reads them with
    :meth:`Backend.queue_candidates_after_wake
    <consensus_lease.backend.Backend.queue_candidates_after_wake>`."""
    taken = idle = 0
    ended: set[str] = set()
    while idle < QUEUE_READS:
        session.ensure_alive()
        known = len(ended)
        lease, outcome = _try_candidates(session, holdings, queue, ended, woken)
        if lease is not None or outcome == _NONE:
            return lease
        if len(ended) == known:
            idle += 1
        if outcome == _TAKEN:
            taken += 1
            if taken >= QUEUE_RETRIES:
                return None
    return None


def _try_candidates(
    session: Session, holdings: Holdings, queue: str, ended: set[str], woken: bool = False
) -> tuple[Lease | None, str]:
    """Try the queue's current candidates once: ``(lease, _NONE)`` on success,
    ``(None, _NONE)`` if there were none, ``(None, _TAKEN)`` if others held every one,
    ``(None, _STALE)`` if one had been completed or FAILED meanwhile (read again). The
    ids of jobs found COMPLETED or FAILED are added to ``ended``; those already in it are
    not tried. A FAILED one (most often a job whose attempts were used up, made FAILED
    by this claim) does not end the walk of the list: its neighbours are worth trying."""
    backend, handle = session.backend, session.handle
    if type(backend).claim_from_queue is not Backend.claim_from_queue:
        picked = holdings.liveness.call(lambda: backend.claim_from_queue(handle, queue))
        if picked is None:
            return None, _NONE
        job_id, result, payload = picked
        if result is None:
            return None, _TAKEN
        return holdings.adopt(session, job_id, result, payload, queue), _NONE
    list_candidates = backend.queue_candidates_after_wake if woken else backend.queue_candidates
    listed = list_candidates(queue, QUEUE_CANDIDATES)
    candidates = [c for c in listed if not holdings.holds(c[0]) and c[0] not in ended]
    if not candidates:  # ended ones still listed (a hint lags): read again, bounded
        return None, _STALE if any(c[0] in ended for c in listed) else _NONE
    start = random.randrange(min(len(candidates), QUEUE_SPREAD))
    known = len(ended)
    for job_id, payload in candidates[start:] + candidates[:start]:
        try:
            result = holdings.liveness.call(lambda j=job_id: backend.claim(handle, j))  # type: ignore[misc]
        except JobFailed:
            ended.add(job_id)
            continue
        except JobCompleted:
            ended.add(job_id)
            return None, _STALE  # the list is stale: read a fresh one rather than walk it
        if result is not None:
            return holdings.adopt(session, job_id, result, payload, queue), _NONE
    return None, _STALE if len(ended) > known else _TAKEN
