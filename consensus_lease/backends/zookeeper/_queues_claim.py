"""Claims from a queue in few round trips: ``claim_from_queue_many`` (a batch of a
queue's oldest claimable jobs in one claim multi) and ``complete_and_claim_next`` (a
completion and the next job's claim in one multi). The multis are the ones the package
docstring tells ("How leases map onto ZooKeeper", "Work queues": the claim multi, the
completion multi); this module only chooses the jobs and puts the operations together.

What is specific to this module:

* A batch: the candidates (:meth:`._queues.Queues.candidates`: the queue's oldest
  claimable-looking jobs, one listing), then :meth:`._jobs_claim.Claims.claim` of all of
  them: one pipelined read of the jobs, and **one claim multi** (split by size as
  ``claim_many``'s). A multi is all or nothing: when a candidate was taken meanwhile,
  its per-operation results say which one (``Claims`` reads that job again, and the
  others, rolled back, are sent again without it; at most ``CLAIM_ATTEMPTS`` rounds).
  If fewer than asked were claimed because some were taken, the queue is listed again,
  at most :data:`PASSES` times in all. A candidate whose attempts are used up is made
  FAILED by the claim's read (one multi of its own: ``_jobs_lifecycle``), and a listing
  that made one FAILED is not counted: the queue is listed again while each listing
  ends a job for good, so any number of exhausted jobs at the head is walked past (a
  listing, a read and one multi per ``n`` of them). A candidate the 32-bit version guard
  refuses (``TokenSpaceExhausted``: logged at ERROR, nothing written) is left out of
  the later listings of the call.
* A fused completion: one multi of the completion's operations (those of ``complete``,
  sent from the claim's hold) followed by a claim of one job read ahead: a random one of
  the oldest :data:`SPREAD` kept from this backend's last look at the queue (the
  candidates and their read, :data:`READ_AHEAD` of them, kept :data:`AHEAD_TTL_S`), so
  a worker draining a queue sends one multi per job, and lists and reads the queue once
  every few jobs. The claim's versioned ``set_data`` (at the version read) and its
  ``create`` of the owner znode are the compare: a job claimed, completed or changed
  since the read fails the multi, and nothing of it is written. Then the completion is
  sent alone (a second round trip, only under contention or with a stale read), and
  the next job is claimed as a batch of one; a multi that failed on the completion's
  operations is the completion refused: it is sent alone after reading (the error
  ``complete`` raises, or its marker troubles handled), and only if that commits is the
  next job claimed. A lost answer is read back through the completion record's nonce:
  the multi applied whole or not at all, so that answers for the claim too.
* Not fused (``complete`` then a batch claim of one): a claim without its hold (read
  first by ``complete``), a result over :data:`FUSED_RESULT_BYTES` (with the claim it
  could pass ``jute.maxbuffer``), a version out of the 32-bit range (refused before
  anything is sent by the multi's version guard), or no job read ahead (the queue empty,
  or its candidates exhausted, delayed or held: the batch claim of one that follows
  decides those, making the exhausted ones FAILED and walking past them). A job read
  ahead is one the read could plan a claim of: exhausted jobs among the candidates are
  passed over by a fused claim (left for a batch claim to make FAILED).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ...backend import QueuePick
from ...errors import (
    JobFailed,
    LeaseError,
    OutcomeUnknown,
    SessionExpired,
    TokenSpaceExhausted,
)
from ...record import ClaimResult, LeaseRecord
from ._jobs import Completion, Hold, Holds, completed_record, mark_ended
from ._jobs_claim import Claims, Plan
from ._layout import JobPaths, new_nonce
from ._queues import Queues
from ._sessions import ZkSession
from ._tokens import Epochs
from ._transport import Wire
from ._transport_multi import Transaction, add_ops, first_error, marker_trouble

__all__ = ["AHEAD_TTL_S", "FUSED_RESULT_BYTES", "PASSES", "READ_AHEAD", "SPREAD", "QueueClaims"]

PASSES = 3
"""Listings of the queue one ``claim_from_queue_many`` makes while others take some of
its candidates first. A listing whose claim made (or found) a job FAILED that this call
had not met yet (its attempts used up) is not one of these: the queue is listed again as
long as each listing ends a job for good, so any number of exhausted jobs at the head is
walked past, and fewer than asked means no more were claimable."""

READ_AHEAD = 16
"""Candidates ``complete_and_claim_next`` lists and reads when it has none read ahead."""

SPREAD = 8
"""The fused claim takes a random one of the oldest this-many jobs read ahead, so that
workers completing at once do not all collide on the head of the queue (as
``claim_next``)."""

AHEAD_TTL_S = 1.0
"""How long a job read ahead is used for a fused claim (monotonic seconds since its
read): an older read is more likely stale, and a stale one costs a failed multi."""

FUSED_RESULT_BYTES = 512 * 1024
"""Largest result sent in a fused multi; a larger one is completed alone (the claim's
operations, up to ~10 KB with the longest ids, must fit beside it in jute.maxbuffer)."""


@dataclass(frozen=True, slots=True)
class _Ahead:
    """A job read ahead: its claim's plan (as read), payload, and when it was read."""

    plan: Plan
    payload: bytes
    read_at: float


class QueueClaims:
    """Batch and fused queue claims for one backend (see the module docstring).

    Args:
        wire: the round trips.
        claims: the claim multis (reads, plans, the failures of a multi).
        holds: the completion multi.
        queues: the candidates.
        epochs: the store epoch, cached (its check heads every claim's operations).
    """

    def __init__(
        self, wire: Wire, claims: Claims, holds: Holds, queues: Queues, epochs: Epochs
    ) -> None:
        self.wire = wire
        self.claims = claims
        self.holds = holds
        self.queues = queues
        self.epochs = epochs
        self._lock = threading.Lock()
        self._ahead: dict[str, list[_Ahead]] = {}

    # -- a batch ---------------------------------------------------------------------

    def claim_many(self, h: ZkSession, queue: str, n: int) -> list[QueuePick]:
        """See :meth:`ZooKeeperBackend.claim_from_queue_many
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.claim_from_queue_many>`."""
        picks: list[QueuePick] = []
        failed: set[str] = set()  # made (or found) FAILED by this call
        refused: set[str] = set()  # TokenSpaceExhausted: still listed, not tried again
        passes = 0
        try:
            while passes < PASSES:
                want = n - len(picks)
                listed = self.queues.candidates(queue, want + len(refused))
                candidates = [c for c in listed if c[0] not in refused][:want]
                self.claims.known.seen(job_id for job_id, _ in candidates)
                before, known = len(picks), len(failed)
                self._claim(h, candidates, picks, failed, refused)
                if len(picks) - before == len(candidates) or len(candidates) < want:
                    break  # n reached, or the queue has no more that look claimable
                if len(failed) == known:  # a pass that ended no job counts (see PASSES)
                    passes += 1
        except SessionExpired:
            raise
        except LeaseError:  # the jobs claimed so far are held: hand them over
            if not picks:
                raise
        return picks

    def _claim(
        self, h: ZkSession, candidates: list[tuple[str, bytes]], picks: list[QueuePick],
        failed: set[str], refused: set[str],
    ) -> None:
        """Claim ``candidates`` (one multi per size chunk), adding each claimed one to
        ``picks`` in the candidates' order (oldest first), the ids of those that are
        FAILED (most often their attempts used up: made FAILED by this claim) to
        ``failed``, and those the 32-bit version guard refused to ``refused``."""
        payloads = dict(candidates)
        for chunk in self.claims.size_chunks(h, list(payloads)):
            outcomes = self.claims.claim(h, chunk, queued=True)
            for job_id, outcome in zip(chunk, outcomes, strict=True):
                if isinstance(outcome, ClaimResult):
                    picks.append((job_id, outcome, payloads[job_id]))
                elif isinstance(outcome, JobFailed):
                    failed.add(job_id)
                elif isinstance(outcome, TokenSpaceExhausted):
                    refused.add(job_id)

    def _claim_one(self, h: ZkSession, queue: str) -> QueuePick | None:
        """The next job after a completion that committed: a batch of one; an error is
        not raised (the completion stands), it is no next job."""
        try:
            picks = self.claim_many(h, queue, 1)
        except LeaseError:
            return None
        return picks[0] if picks else None

    # -- a completion and the next claim ---------------------------------------------

    def complete_and_claim(
        self, h: ZkSession, paths: JobPaths, claim: ClaimResult, result: bytes, queue: str
    ) -> tuple[LeaseRecord, QueuePick | None]:
        """See :meth:`ZooKeeperBackend.complete_and_claim_next
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.complete_and_claim_next>`."""
        completion = None
        if len(result) <= FUSED_RESULT_BYTES:
            completion = self.holds.completion(h, paths, claim, result,
                                               "complete_and_claim_next")
        ahead, listed = (None, False) if completion is None else self._next(h, queue,
                                                                            paths.job_id)
        if completion is None or ahead is None:
            record = self.holds.complete(h, paths, claim, result)
            # listed, nothing read ahead: its candidates need a claim to decide them
            return record, (self._claim_one(h, queue) if completion is None or listed
                            else None)
        return self._fused(h, paths, claim, result, queue, completion, ahead)

    def _fused(
        self, h: ZkSession, paths: JobPaths, claim: ClaimResult, result: bytes, queue: str,
        completion: Completion, ahead: _Ahead,
    ) -> tuple[LeaseRecord, QueuePick | None]:
        """One multi: ``completion``'s operations, then the claim of ``ahead``."""
        epoch = self.epochs.cached(h)
        plan = dataclasses.replace(ahead.plan, nonce=new_nonce())
        ending = completion.core + completion.markers

        def build(tx: Transaction) -> None:
            add_ops(tx, ending)
            self.claims.add_ops(tx, h, [plan], epoch)

        try:
            multi = self.wire.commit(h, build, completion.landed, "complete_and_claim_next",
                                     paths.job_id, claim.generation)
        except TokenSpaceExhausted:  # a version out of range: nothing was sent
            return self.holds.complete(h, paths, claim, result), self._claim_one(h, queue)
        except SessionExpired:  # a completion this session made is still recognised
            return self.holds.complete(h, paths, claim, result), None
        except OutcomeUnknown:
            self.claims.note_uncertain(h, [plan], epoch[0])
            raise
        self.claims.known.stale([plan.paths.job_id])
        if multi.applied:
            mark_ended(completion.hold)
            record = completed_record(h, paths, claim.generation, result, completion.hold)
            try:
                h.check_alive()  # a claim applied as the session ended is no claim
            except SessionExpired:
                return record, None
            return record, (plan.paths.job_id, plan.result(h, epoch[0]), ahead.payload)
        self.forget(queue)  # what was read ahead is likely stale too
        index = first_error(multi.results)[0] if multi.results else len(ending)
        if index < len(ending):  # the completion's operations: refused, or a marker
            trouble = marker_trouble(multi.results, len(completion.core), completion.markers)
            record = self.holds.complete(h, paths, claim, result, read_first=not trouble.only)
        else:  # the claim's (or the answer was lost and it was not applied)
            if multi.results and index == len(ending):
                self.epochs.refresh(h)  # the epoch znode's check: bumped since
            record = self.holds.complete(h, paths, claim, result)
        return record, self._claim_one(h, queue)

    def _next(self, h: ZkSession, queue: str, job_id: str) -> tuple[_Ahead | None, bool]:
        """A job of ``queue`` read ahead (not ``job_id``), taken from what was kept or
        from a new listing and read; and whether that listing found candidates (which
        none was read ahead from: held, exhausted or delayed). ``(None, False)`` also
        when the listing or the read failed: the completion is then sent alone."""
        now = time.monotonic()
        with self._lock:
            kept = [a for a in self._ahead.pop(queue, ())
                    if now - a.read_at < AHEAD_TTL_S and a.plan.paths.job_id != job_id]
            if kept:
                pick = kept.pop(random.randrange(min(len(kept), SPREAD)))
                if kept:
                    self._ahead[queue] = kept
                return pick, True
        try:
            candidates = [c for c in self.queues.candidates(queue, READ_AHEAD)
                          if c[0] != job_id and c[0] not in h.uncertain]
            self.claims.known.seen(c[0] for c in candidates)
            if not candidates:
                return None, False
            decided = self.claims.prepare(h, [c[0] for c in candidates], lean=True)
        except LeaseError:
            return None, False
        read_at = time.monotonic()
        _keep_uncertain(h, candidates, decided)
        ready = [_Ahead(plan, payload, read_at)
                 for (_, payload), plan in zip(candidates, decided, strict=True)
                 if isinstance(plan, Plan) and plan.version is not None
                 and plan.not_before_ms is None and not plan.drop_delayed]
        if not ready:
            return None, True
        pick = ready.pop(random.randrange(min(len(ready), SPREAD)))
        with self._lock:
            if ready:
                self._ahead[queue] = ready
        return pick, True

    def forget(self, queue: str) -> None:
        """Drop what was read ahead of ``queue``."""
        with self._lock:
            self._ahead.pop(queue, None)


def _keep_uncertain(
    h: ZkSession, candidates: list[tuple[str, bytes]], decided: Sequence[object]
) -> None:
    """A read ahead that adopted a claim of unknown outcome (made by another thread of
    this session since the candidates were filtered) does not use it: it stays
    uncertain, for a later claim of the job to adopt or keepalive to hand back."""
    for (job_id, _), outcome in zip(candidates, decided, strict=True):
        if isinstance(outcome, ClaimResult) and isinstance(outcome.handle, Hold):
            with h.uncertain_lock:
                h.uncertain[job_id] = (outcome.generation, outcome.handle.nonce or "")
