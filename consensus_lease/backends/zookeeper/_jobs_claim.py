"""Claiming: read the job znodes (unless their state is known: see :mod:`._jobs_known`), then
one multi per batch. What the claim multi checks and writes (the epoch znode's check, the
job znode's versioned ``set_data``, the EPHEMERAL owner znode, a queued job's held marker,
the attempt, a retry delay's end on the store's clock, a job whose attempts are used up)
is told once, in the package docstring ("How leases map onto ZooKeeper", "Store epoch",
"Job lifecycle", "Work queues").

The race the versioned ``set_data`` closes, step by step::

    t0  B reads job 42: version 7, no owner znode (A released it)
    t1  C claims it (version 8, owner C) and completes it (version 9, completed)
    t2  B sends multi(set_data(job, version=7), create(owner, EPHEMERAL))
        -> BadVersion: the whole multi fails, nothing of B's is written
    t3  B reads again: completed -> JobCompleted

A completion always bumps the version, so even a claim prepared while the job was held
(version 8) fails once it is completed. Two claims prepared against the same version: one
multi wins, the other fails on the version (or on the owner znode's existence).

What is specific to this module:

* The read is one pipelined round trip per round: the job znode, the owner znode, the
  queue tag and the failure znode of every job of the batch (after a ``sync`` from the
  second round on). A queue's candidates (``claim_from_queue_many``,
  ``complete_and_claim_next``: see :mod:`._queues_claim`) are first read lean, the job
  znode and its tag alone: a job znode whose only child is the tag has no owner nor
  failure znode, so it is decided from those two (:meth:`Claims.prepare`); the others
  are read in full. A failed multi's per-operation results say which job failed and
  why (:meth:`Claims._failures`): a job rolled back for another one's failure is sent
  again, one whose version moved is read again; at most :data:`CLAIM_ATTEMPTS` rounds.
* A multi that failed on the epoch check alone is sent once more after reading the
  epoch again (:meth:`._tokens.Epochs.refresh`).
* Nothing else writes the failure znode while the job znode stays at the version read
  without an owner znode (only a claim makes an owner znode, and it bumps the version),
  so the claim multi needs no check of it.
* Every claim the store applied returns a :class:`._jobs.Hold` as its
  ``ClaimResult.handle`` (see :mod:`._jobs`). A claim whose outcome is unknown returns
  nothing: it stays in ``ZkSession.uncertain`` until a later claim adopts it (returning
  its hold) or keepalive hands it back.
* Reading first, and when not: the version alone does not say whether the job may be
  claimed. A completed job's version is as current as a held one's, and a blind
  ``set_data`` at it would overwrite the completion record; what the job znode held at
  that version (and its queue tag, for the held marker) comes from the read. Where the
  backend knows that without reading (a job it never saw: guessed new; a job it
  released: at the version it left, see :mod:`._jobs_known`) the multi is sent first,
  as it would be after such a read; the versioned ``create``/``set_data`` fails if the
  guess was wrong, nothing is written, and that job is read and decided as any other (a
  lost answer is read back as always). A job seen to exist is read first, so each poll
  of a held job stays a read any member answers rather than a failing multi that
  ZooKeeper orders through the quorum.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import (
    JobCompleted,
    JobFailed,
    LeaseError,
    OutcomeUnknown,
    StaleLeaseError,
    TokenSpaceExhausted,
)
from ...record import ClaimResult
from .._groups import size_groups
from ._jobs import Hold, make_hold
from ._jobs_known import UNSEEN, Known, Released
from ._jobs_lifecycle import Exhausted, Lifecycle, job_failed
from ._layout import (
    MAX_EPOCH,
    Failure,
    JobData,
    JobPaths,
    QueueTag,
    Tally,
    dump_claim,
    dump_owner,
    new_nonce,
    parse_failure,
    parse_job,
    parse_owner,
    token,
)
from ._sessions import ZkSession
from ._tokens import Epochs
from ._transport import Multi, Read, Wire
from ._transport_errors import translate
from ._transport_multi import (
    MAX_VERSION,
    Transaction,
    bad_version,
    exists,
    failed,
    first_error,
    missing,
)

__all__ = ["CLAIM_ATTEMPTS", "EPOCH_SENDS", "VERSION_CEILING", "Claims", "Outcome", "Plan",
           "exhausted"]

log = logging.getLogger("consensus_lease.backends.zookeeper")

CLAIM_ATTEMPTS = 8
"""Rounds of read + multi a claim makes while other clients keep changing the job."""
EPOCH_SENDS = 2
"""Times one round's multi is sent when its check of the epoch znode fails: once with the
epoch cached, once more after reading it again."""
MAX_MULTI_BYTES = 512 * 1024
"""Largest claim multi sent (estimated), well under ZooKeeper's jute.maxbuffer (1 MiB)."""

VERSION_CEILING = MAX_VERSION - 2**16
"""The highest job znode version a claim may set (the token's low part). A job znode's
version is a signed 32-bit int that ZooKeeper increments without a check; a claim from
this version on is refused with :class:`TokenSpaceExhausted` (the job is read first, so
the refusal costs no write). The 65,536 versions left above it are room to spare: a
claim at the ceiling still completes (one more), and renew and release never move it."""

Outcome = ClaimResult | JobCompleted | JobFailed | TokenSpaceExhausted | None


def exhausted(paths: JobPaths, version: int, token_now: int) -> TokenSpaceExhausted:
    """The refusal of a claim of a job whose znode is at ``version`` (at or above
    :data:`VERSION_CEILING`, or negative: wrapped by a release without this guard)."""
    return TokenSpaceExhausted(
        f"{paths.job_id!r}: its job znode {paths.job} is at version {version}, the "
        f"ceiling for claims is {VERSION_CEILING} (ZooKeeper's znode versions are 32-bit, "
        f"at most {MAX_VERSION}); nothing was written. Remedy: stop claiming the job, run "
        f"`consensus-lease bump-epoch --above {max(token_now, 0)}` (tokens go on above "
        f"every earlier one), then delete its znode while it is not held "
        f"(zkCli.sh: deleteall {paths.job}) so its version starts again, and enqueue it "
        f"again if it was queued", path=paths.job, version=version, job_id=paths.job_id,
        generation=token_now if token_now >= 0 else None)

NEVER_CLAIMED = JobData("new")


@dataclass(frozen=True, slots=True)
class Plan:
    """One claim about to be sent: the version read (``None``: no job znode yet)."""

    paths: JobPaths
    version: int | None
    nonce: str
    held: str | None = None  # a queued job's held marker
    open: str | None = None  # a queued job's open marker (its completion deletes it)
    delayed: str | None = None  # a queued job's delayed marker (a fail with a delay makes it)
    job: JobData = NEVER_CLAIMED  # what the job znode held at that version
    failure: Failure | None = None
    drop_delayed: bool = False  # the claim deletes the delayed marker (a delay was recorded)
    not_before_ms: int | None = None  # a retry delay recorded since the last claim ends then
    failed: str | None = None  # a queued job's failed marker (made when it becomes FAILED)
    tally: Tally | None = None  # a queued job's tally entries (layout 2)

    @property
    def generation(self) -> int:
        """The job znode's version once claimed (the token's local part)."""
        return 1 if self.version is None else self.version + 1

    @property
    def attempt(self) -> int:
        return self.job.attempt + 1

    @property
    def owner_op(self) -> int:
        """Index of the owner znode's create among this plan's operations (the multi's
        first operation, the epoch check, not counted)."""
        return 1 if self.version is not None else 2

    @property
    def delayed_op(self) -> int:
        """Index of the delayed marker's delete (if ``drop_delayed``)."""
        return self.owner_op + 1 + (self.held is not None) + (self.tally is not None)

    @property
    def op_count(self) -> int:
        return self.delayed_op + self.drop_delayed

    def result(self, h: ZkSession, epoch: int = 0) -> ClaimResult:
        """What this claim returns once applied in store epoch ``epoch``: the token and
        attempt, and as handle the hold it made (its owner znode is new: version 0)."""
        generation = token(epoch, self.generation)
        hold = Hold(h, generation, self.paths.owner, 0, self.held, self.open, self.delayed,
                    self.attempt, self.job.max_attempts, self.failure, nonce=self.nonce,
                    failed=self.failed, tally=self.tally)
        return ClaimResult(generation, None, self.attempt, hold)


class Claims:
    """Claims for one backend.

    Args:
        wire: the round trips.
        paths: job id -> its znode paths.
        ensure_base: (re)creates ``{chroot}/jobs`` with the session's client.
        lifecycle: the FAILED transition, the store's clock and the delay hints.
        epochs: the store epoch, cached.
    """

    def __init__(
        self, wire: Wire, paths: Callable[[str], JobPaths],
        ensure_base: Callable[[ZkSession], None], lifecycle: Lifecycle, epochs: Epochs,
    ) -> None:
        self.wire = wire
        self.paths = paths
        self.ensure_base = ensure_base
        self.lifecycle = lifecycle
        self.epochs = epochs
        self.queues_base = wire.config.queues_base
        self.known = Known()

    def size_chunks(self, h: ZkSession, job_ids: list[str]) -> list[list[str]]:
        """Split ``job_ids`` so no multi comes near jute.maxbuffer."""
        fixed = 2 * len(dump_claim(h.owner, h.session_id, 2**31, 2**31, MAX_EPOCH)) + 200
        # owner path x4, and room for a queued job's held and delayed markers (up to ~2x
        # as long each)
        return size_groups(job_ids, lambda job_id: fixed + 10 * len(
            self.paths(job_id).owner.encode()), MAX_MULTI_BYTES)

    def claim(self, h: ZkSession, job_ids: list[str], queued: bool = False) -> list[Outcome]:
        """Claim every job of ``job_ids`` it can, all in one multi per round; element ``i``
        answers ``job_ids[i]``: the new generation, JobCompleted, JobFailed, or ``None``
        (held, or its retry delay has not passed). ``queued``: the jobs are a queue's
        candidates (the first read is :meth:`prepare`'s lean one)."""
        h.check_alive()
        outcome: dict[str, Outcome] = {}
        todo = list(job_ids)
        skip: set[str] = set()  # delayed markers found missing (deleted by hand)
        guesses = self._guesses(h, todo)
        if guesses:  # sent without reading; a failed one is read below (see ._jobs_known)
            # a job released here is not guessed again after an epoch bump (see ._jobs_known)
            resend = all(plan.version is None for plan in guesses)
            self.known.stale(self.send(h, guesses, outcome, skip, resend))
            todo = [job_id for job_id in todo if job_id not in outcome]
        for round_ in range(CLAIM_ATTEMPTS):
            if not todo:
                break
            todo = self._round(h, todo, round_ > 0, outcome, skip, queued and round_ == 0)
        self.known.stale(job_ids)  # exists now (claimed, or read): read next time
        h.check_alive()  # a claim applied as the session ended is no claim
        return [outcome.get(job_id) for job_id in job_ids]  # still contended: None

    def _guesses(self, h: ZkSession, job_ids: list[str]) -> list[Plan]:
        """The claims of ``job_ids`` whose state this backend knows without reading (see
        :mod:`._jobs_known`): a job never seen (guessed new) or released here (at the version
        it left). Never a job with a claim of unknown outcome (its read may adopt it)."""
        plans: dict[str, Plan] = {}
        epoch: int | None = None
        for job_id in job_ids:
            if job_id in plans or job_id in h.uncertain:
                continue
            known = self.known.get(job_id)
            if known is None:
                continue
            if known is UNSEEN:
                plans[job_id] = Plan(self.paths(job_id), None, new_nonce())
                continue
            assert isinstance(known, Released)
            if epoch is None:
                epoch = self.epochs.cached(h)[0]
            if known.epoch != epoch:
                continue  # released before the epoch was raised: read (see ._jobs_known)
            if known.version >= VERSION_CEILING:
                continue  # at the ceiling: the read path refuses it
            failure = known.failure
            if failure is not None and (failure.failed or failure.delaying(known.version)):
                continue
            base = 0 if failure is None else failure.base
            if known.max_attempts is not None and known.attempt - base >= known.max_attempts:
                continue  # exhausted: the read path makes it FAILED
            plans[job_id] = Plan(
                self.paths(job_id), known.version, new_nonce(), known.held, known.open,
                known.delayed, JobData("held", attempt=known.attempt,
                                       max_attempts=known.max_attempts),
                failure, failed=known.failed, tally=known.tally,
            )
        return list(plans.values())

    def _round(
        self, h: ZkSession, todo: list[str], synced: bool, outcome: dict[str, Outcome],
        skip: set[str], lean: bool = False,
    ) -> list[str]:
        """Read every job of ``todo`` (after a ``sync`` if ``synced``: whatever changed
        under an earlier round must be seen), then decide and send. Returns the job ids
        to try again."""
        plans: list[Plan] = []
        again: list[str] = []
        decisions = self.prepare(h, todo, synced, skip, lean)
        for job_id, decided in zip(todo, decisions, strict=True):
            if isinstance(decided, Plan):
                plans.append(decided)
            elif isinstance(decided, Exhausted):
                try:
                    failed = self.lifecycle.exhaust(h, decided)
                except TokenSpaceExhausted as exc:  # a version out of range: nothing sent
                    log.error("job znode version out of the 32-bit range: FAILED refused",
                              extra={"job_id": job_id, "version": decided.version})
                    outcome[job_id] = exc  # this job's answer; the others go on
                    continue
                if failed is None:
                    again.append(job_id)  # changed meanwhile: read again
                else:
                    outcome[job_id] = failed
            else:
                outcome[job_id] = decided
        plans = self._due(h, plans, outcome)
        return again + (self.send(h, plans, outcome, skip) if plans else [])

    def prepare(
        self, h: ZkSession, job_ids: list[str], synced: bool = False,
        skip: set[str] | None = None, lean: bool = False,
    ) -> list[Plan | Exhausted | Outcome]:
        """Read every job of ``job_ids`` (job znode, owner znode, queue tag, failure
        znode: one pipelined round trip on the session's client, after a ``sync`` if
        ``synced``) and decide each: the :class:`Plan` of its claim, the
        :class:`._jobs_lifecycle.Exhausted` transition to make, or what a claim returns
        without sending (``JobCompleted``, ``JobFailed``, ``TokenSpaceExhausted``, an
        adopted claim of unknown outcome, ``None``: held). Sends nothing.

        ``lean`` (a queue's candidates, most of them neither held nor ever failed): read
        the job znode and the queue tag only; a job whose znode then has one child (the
        tag: no owner znode, no failure znode) is decided from those, as the full read
        would decide it (its version, read with that child count, is the claim's
        compare: only a claim makes an owner znode, and nothing makes the failure
        znode of a job at that version without one); the others are read in full in a
        second round trip."""
        if not lean:
            return self._prepare(h, job_ids, synced, skip)
        reads: list[Read] = []
        for job_id in job_ids:
            paths = self.paths(job_id)
            reads += [("get", paths.job), ("get", paths.tag)]
        answers = self.wire.session_read(h, reads, "claim", job_ids[0])
        decided: dict[str, Plan | Exhausted | Outcome] = {}
        for i, job_id in enumerate(job_ids):
            job, tag = answers[2 * i : 2 * i + 2]
            if job is not None and tag is not None and job[1].numChildren == 1:
                decided[job_id] = self._plan(h, self.paths(job_id), job, None, tag, None,
                                             set() if skip is None else skip)
        rest = [job_id for job_id in job_ids if job_id not in decided]
        if rest:
            decided.update(zip(rest, self._prepare(h, rest, synced, skip), strict=True))
        return [decided[job_id] for job_id in job_ids]

    def _prepare(
        self, h: ZkSession, job_ids: list[str], synced: bool, skip: set[str] | None,
    ) -> list[Plan | Exhausted | Outcome]:
        reads: list[Read] = [("sync", self.wire.config.base)] if synced else []
        for job_id in job_ids:
            paths = self.paths(job_id)
            reads += [("get", paths.job), ("get", paths.owner), ("get", paths.tag),
                      ("get", paths.failure)]
        answers = self.wire.session_read(h, reads, "claim", job_ids[0])[1 if synced else 0 :]
        skip = set() if skip is None else skip
        decided: list[Plan | Exhausted | Outcome] = []
        for i, job_id in enumerate(job_ids):
            job, owner, tag, failure = answers[4 * i : 4 * i + 4]
            decided.append(self._plan(h, self.paths(job_id), job, owner, tag, failure, skip))
        return decided

    def _plan(
        self, h: ZkSession, paths: JobPaths, job: tuple[bytes, Any] | None,
        owner: tuple[bytes, Any] | None, tag: tuple[bytes, Any] | None,
        failure_answer: tuple[bytes, Any] | None, skip: set[str],
    ) -> Plan | Exhausted | Outcome:
        if job is None:
            return None if owner is not None else Plan(paths, None, new_nonce())
        parsed = parse_job(job[0], paths.job)
        version = job[1].version
        if parsed.completed:
            done = parsed.token(version)
            return JobCompleted(f"{paths.job_id!r} was completed at generation {done}",
                                job_id=paths.job_id, generation=done)
        failure = parse_failure(failure_answer, paths.failure)
        if failure is not None and failure.failed:
            return job_failed(paths.job_id, parsed.token(version), parsed.attempt,
                              failure.error)
        queue_tag = None if tag is None else QueueTag.parse(tag[0], paths.tag)
        if owner is not None:
            if owner[1].ephemeralOwner == h.sid:
                return self._adopt_uncertain(h, paths, job, owner, queue_tag, failure)
            return None  # a live session holds it
        base = 0 if failure is None else failure.base
        if parsed.max_attempts is not None and parsed.attempt - base >= parsed.max_attempts:
            open_ = None if queue_tag is None else queue_tag.marker(self.queues_base)
            failed_ = None if queue_tag is None else queue_tag.failed(self.queues_base)
            tally = None if queue_tag is None else queue_tag.tally(self.queues_base)
            return Exhausted(paths, version, parsed.attempt, failure, open_, parsed.epoch,
                             failed_, tally)
        if not 0 <= version < VERSION_CEILING:  # the claim would pass it (or it wrapped)
            exhaust = exhausted(paths, version, parsed.token(version))
            log.error("job znode version at the 32-bit ceiling: claim refused",
                      extra={"job_id": paths.job_id, "version": version})
            return exhaust
        held = open_ = delayed = failed_ = None
        tally = None
        if queue_tag is not None:
            held, open_ = queue_tag.held(self.queues_base), queue_tag.marker(self.queues_base)
            delayed = queue_tag.delayed(self.queues_base)
            failed_ = queue_tag.failed(self.queues_base)
            tally = queue_tag.tally(self.queues_base)
        delaying = failure is not None and failure.delaying(version)
        return Plan(
            paths, version, new_nonce(), held, open_, delayed, parsed, failure,
            drop_delayed=delaying and delayed is not None and delayed not in skip,
            not_before_ms=failure.not_before_ms if failure is not None and delaying else None,
            failed=failed_, tally=tally,
        )

    def _due(self, h: ZkSession, plans: list[Plan], outcome: dict[str, Outcome]) -> list[Plan]:
        """The plans whose retry delay (if one was recorded since the job's last claim)
        has passed on the store's clock: one write's mtime (see :mod:`._jobs_lifecycle`), only
        if some plan has such a delay. The others answer ``None`` (not claimable now)."""
        timed = [plan for plan in plans if plan.not_before_ms is not None]
        if not timed:
            return plans
        now_ms = self.lifecycle.store_now_ms(h, "claim")
        answered = time.monotonic()
        due: list[Plan] = []
        for plan in plans:
            job_id = plan.paths.job_id
            if plan.not_before_ms is not None and now_ms <= plan.not_before_ms:
                outcome[job_id] = None
                left_s = (plan.not_before_ms + 1 - now_ms) / 1000
                self.lifecycle.hints.note(job_id, left_s - (time.monotonic() - answered))
            else:
                self.lifecycle.hints.forget(job_id)
                due.append(plan)
        return due

    def _adopt_uncertain(
        self, h: ZkSession, paths: JobPaths, job: tuple[bytes, Any],
        owner: tuple[bytes, Any], tag: QueueTag | None, failure: Failure | None,
    ) -> ClaimResult | None:
        """Our own owner znode: if it is the one a claim with an unknown outcome would
        have made (same nonce, version = its generation), that claim did apply: it is
        adopted, its hold carrying the owner znode's version as read."""
        nonce = parse_owner(owner[0], paths.owner).nonce
        parsed = parse_job(job[0], paths.job)
        with h.uncertain_lock:
            pending = h.uncertain.get(paths.job_id)
            if pending is None or pending[1] != nonce or parsed.token(job[1].version) \
                    != pending[0]:
                return None
            del h.uncertain[paths.job_id]
        hold = make_hold(h, pending[0], paths, owner[1].version, parsed.attempt,
                         parsed.max_attempts, failure, tag, self.queues_base, nonce)
        return ClaimResult(pending[0], None, parsed.attempt, hold)

    def send(
        self, h: ZkSession, plans: list[Plan], outcome: dict[str, Outcome], skip: set[str],
        resend: bool = True,
    ) -> list[str]:
        """One multi carrying every plan, headed by the check of the epoch znode at the
        version cached; if that check alone failed (a bump since), the epoch is read again
        and the multi sent once more (unless not ``resend``: the jobs are then read).
        Fills ``outcome``; returns the job ids to retry."""
        for _ in range(EPOCH_SENDS):
            epoch = self.epochs.cached(h)
            multi, landed = self._commit(h, plans, epoch)
            if multi.applied:
                for plan in plans:
                    if multi.results or plan.paths.job_id in landed:
                        outcome[plan.paths.job_id] = plan.result(h, epoch[0])
                return [p.paths.job_id for p in plans if p.paths.job_id not in outcome]
            if not multi.results:  # answer lost; reading back showed it was not applied
                return [p.paths.job_id for p in plans]
            if first_error(multi.results)[0] != 0:  # not the epoch check: a job's operation
                return self._failures(h, plans, multi.results[1:], outcome, skip)
            log.info("the store epoch changed since it was read; reading it again",
                     extra={"job_id": plans[0].paths.job_id, "session_id": h.session_id})
            self.epochs.refresh(h)
            if not resend:
                break
        return [p.paths.job_id for p in plans]

    def _commit(
        self, h: ZkSession, plans: list[Plan], epoch: tuple[int, int]
    ) -> tuple[Multi, set[str]]:
        """Send the claim multi of ``plans`` in store epoch ``epoch[0]`` (its znode at
        version ``epoch[1]``). Returns its outcome and, if its answer was lost, the job
        ids reading back found claimed."""
        def build(tx: Transaction) -> None:
            self.add_ops(tx, h, plans, epoch)

        landed: set[str] = set()

        def settle(deadline: float) -> bool:
            reads: list[Read] = [("barrier", self.wire.config.base)]
            reads += [("get", p.paths.owner) for p in plans]
            answers = self.wire.read(h.client, reads, deadline, "claim (reading back)")[1:]
            landed.update(
                plan.paths.job_id
                for plan, owner in zip(plans, answers, strict=True)
                if owner is not None and owner[1].ephemeralOwner == h.sid
                and parse_owner(owner[0], plan.paths.owner).nonce == plan.nonce
            )
            return bool(landed)

        try:
            multi = self.wire.commit(h, build, settle, "claim", plans[0].paths.job_id)
        except OutcomeUnknown:
            self.note_uncertain(h, plans, epoch[0])
            raise
        return multi, landed

    def add_ops(
        self, tx: Transaction, h: ZkSession, plans: list[Plan], epoch: tuple[int, int]
    ) -> None:
        """Add the claim multi's operations for ``plans`` to ``tx``: the check of the
        epoch znode at version ``epoch[1]``, then each plan's :attr:`Plan.op_count`
        operations (the job znode's versioned write, the owner znode, the markers)."""
        claim_data: dict[tuple[int, int | None], bytes] = {}  # alike for most plans
        tx.check(self.epochs.node, epoch[1])
        for plan in plans:
            key = (plan.attempt, plan.job.max_attempts)
            held = claim_data.get(key)
            if held is None:
                held = claim_data[key] = dump_claim(h.owner, h.session_id, *key, epoch[0])
            if plan.version is None:  # first claim: create, then bump to version 1
                tx.create(plan.paths.job, b"")
                tx.set_data(plan.paths.job, held, 0)
            else:
                tx.set_data(plan.paths.job, held, plan.version)
            tx.create(
                plan.paths.owner, dump_owner(h.owner, h.session_id, plan.nonce),
                ephemeral=True,
            )
            if plan.held is not None:
                tx.create(plan.held, b"", ephemeral=True)
            if plan.tally is not None:
                tx.create(plan.tally.held, b"", ephemeral=True)
            if plan.drop_delayed and plan.delayed is not None:
                tx.delete(plan.delayed)

    @staticmethod
    def note_uncertain(h: ZkSession, plans: list[Plan], epoch: int) -> None:
        """``plans`` were sent in store epoch ``epoch`` and their outcome is unknown:
        a later claim of each job adopts it, or keepalive hands it back."""
        with h.uncertain_lock:
            for plan in plans:
                h.uncertain[plan.paths.job_id] = (token(epoch, plan.generation), plan.nonce)

    def _failures(
        self, h: ZkSession, plans: list[Plan], results: list[Any], outcome: dict[str, Outcome],
        skip: set[str],
    ) -> list[str]:
        """A failed multi: ZooKeeper reports the first failing op; the others are rolled
        back (before it) or not run (after it)."""
        retry: list[str] = []
        offset = 0
        for plan in plans:
            mine = results[offset : offset + plan.op_count]
            offset += plan.op_count
            errors = [r for r in mine if failed(r)]
            if not errors:
                retry.append(plan.paths.job_id)  # innocent: rolled back for another job
            elif exists(mine[plan.owner_op]):
                outcome[plan.paths.job_id] = None  # the owner znode exists: held
            elif bad_version(errors[0]) or exists(errors[0]):
                retry.append(plan.paths.job_id)  # changed since our read: read again
            elif plan.drop_delayed and missing(mine[plan.delayed_op]):
                assert plan.delayed is not None
                skip.add(plan.delayed)  # deleted by hand: claim without deleting it
                retry.append(plan.paths.job_id)
            elif missing(errors[0]):
                parent = plan.paths.job.rsplit("/", 1)[0]
                if parent == self.wire.config.base:
                    self.ensure_base(h)  # {chroot}/jobs was deleted under us
                else:  # an election's first claim: {chroot}/elections
                    self.wire.ensure_path(h.client, parent, "claim")
                if plan.held is not None:  # or the queue's held container
                    self.wire.ensure_path(h.client, plan.held.rsplit("/", 1)[0], "claim")
                if plan.tally is not None:  # or its tally of held jobs
                    self.wire.ensure_path(h.client, plan.tally.held.rsplit("/", 1)[0],
                                          "claim")
                retry.append(plan.paths.job_id)
            else:
                raise translate(errors[0], "claim", self.wire.hosts, job_id=plan.paths.job_id)
        return retry

    def hand_back_uncertain(
        self, h: ZkSession, release: Callable[[ZkSession, str, ClaimResult], None]
    ) -> None:
        """Release owner znodes left by claims whose outcome was unknown and that no later
        claim adopted (best effort; called from keepalive). Holds the session's uncertain
        lock throughout, so a claim cannot adopt a znode while it is being handed back."""
        with h.uncertain_lock:
            for job_id, (generation, nonce) in list(h.uncertain.items()):
                paths = self.paths(job_id)
                try:
                    owner, tag = self.wire.session_read(
                        h, [("get", paths.owner), ("get", paths.tag)], "keepalive", job_id
                    )
                    if (
                        owner is not None and owner[1].ephemeralOwner == h.sid
                        and parse_owner(owner[0], paths.owner).nonce == nonce
                    ):
                        # Its owner znode, with the nonce: that claim made ``generation``.
                        queue_tag = None if tag is None else QueueTag.parse(tag[0], paths.tag)
                        hold = make_hold(h, generation, paths, owner[1].version, 0, None, None,
                                         queue_tag, self.queues_base)
                        hold.exact = False  # attempt, limit, failure not read
                        release(h, job_id, ClaimResult(generation, None, 0, hold))
                        log.warning("handed back a claim whose outcome had been unknown",
                                    extra={"job_id": job_id, "generation": generation})
                except StaleLeaseError:
                    pass  # not this session's any more: nothing to hand back
                except LeaseError as exc:
                    log.warning("handing back an unknown claim failed; will retry",
                                extra={"job_id": job_id, "error": str(exc)})
                    continue
                del h.uncertain[job_id]
