"""Claiming: read the job znodes, then one multi per batch that bumps each job znode's
version with a versioned ``set_data`` and creates its ephemeral owner znode.

The race this closes, step by step::

    t0  B reads job 42: version 7, no owner znode (A released it)
    t1  C claims it (version 8, owner C) and completes it (version 9, completed)
    t2  B sends multi(set_data(job, version=7), create(owner, EPHEMERAL))
        -> BadVersion: the whole multi fails, nothing of B's is written
    t3  B reads again: completed -> JobCompleted

A completion always bumps the version, so even a claim prepared while the job was held
(version 8) fails once it is completed. Two claims prepared against the same version: one
multi wins, the other fails on the version (or on the owner znode's existence).

A queued job (its ``queue`` tag is read with it, in the same round trip) also gets its
EPHEMERAL held marker in the queue, in the same multi and by the same session as the
owner znode, so the two come and go together (see :mod:`._queues`).

Every claim the store applied returns a :class:`._holds.Hold` (generation, owner znode,
markers) as its ``ClaimResult.handle``; the core keeps it with the lease and hands it
back, so completion and release send their multi without reading first (see
:mod:`._holds`). A claim whose outcome is unknown returns nothing: it stays in
``ZkSession.uncertain`` until a later claim adopts it (returning its hold) or keepalive
hands it back.

Why the claim itself still reads first: the version alone does not say whether the job
may be claimed. A completed job's version is as current as a held one's, and a blind
``set_data`` at it would overwrite the completion record; what the job znode held at that
version (and its queue tag, for the held marker) comes from the read. A version
remembered from an earlier read (a claim that found the job held, a watch) would be
exact while it stands (a znode's data at a given version never changes) but would turn
each poll of a held job, today a read any member answers, into a failing multi that
ZooKeeper still orders and logs through the quorum; and the common case, a job this
session has not seen, has nothing to remember.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)

from ...errors import JobCompleted, LeaseError, OutcomeUnknown, StaleLeaseError
from ...record import ClaimResult
from ._errors import KAZOO_ERRORS, translate
from ._holds import Hold
from ._layout import (
    JobPaths,
    QueueTag,
    dump_claim,
    dump_owner,
    new_nonce,
    parse_job,
    parse_owner,
)
from ._session import ZkSession
from ._wire import Read, Wire

__all__ = ["CLAIM_ATTEMPTS", "Claims", "Outcome", "Plan"]

log = logging.getLogger("consensus_lease.backends.zookeeper")

CLAIM_ATTEMPTS = 8
"""Rounds of read + multi a claim makes while other clients keep changing the job."""
MAX_MULTI_BYTES = 512 * 1024
"""Largest claim multi sent (estimated), well under ZooKeeper's jute.maxbuffer (1 MiB)."""

Outcome = ClaimResult | JobCompleted | None


@dataclass(frozen=True, slots=True)
class Plan:
    """One claim about to be sent: the version read (``None``: no job znode yet)."""

    paths: JobPaths
    version: int | None
    nonce: str
    held: str | None = None  # a queued job's held marker
    open: str | None = None  # a queued job's open marker (its completion deletes it)

    @property
    def generation(self) -> int:
        return 1 if self.version is None else self.version + 1

    @property
    def owner_op(self) -> int:
        """Index of the owner znode's create among this plan's operations."""
        return 1 if self.version is not None else 2

    @property
    def op_count(self) -> int:
        return self.owner_op + 1 + (self.held is not None)

    def result(self, h: ZkSession) -> ClaimResult:
        """What this claim returns once applied: the generation, and as handle the hold it
        made (its owner znode is new: version 0)."""
        hold = Hold(h, self.generation, self.paths.owner, 0, self.held, self.open)
        return ClaimResult(self.generation, None, hold)


class Claims:
    """Claims for one backend.

    Args:
        wire: the round trips.
        paths: job id -> its znode paths.
        ensure_base: (re)creates ``{chroot}/jobs`` with the session's client.
    """

    def __init__(
        self, wire: Wire, paths: Callable[[str], JobPaths],
        ensure_base: Callable[[ZkSession], None],
    ) -> None:
        self.wire = wire
        self.paths = paths
        self.ensure_base = ensure_base

    def size_chunks(self, h: ZkSession, job_ids: list[str]) -> list[list[str]]:
        """Split ``job_ids`` so no multi comes near jute.maxbuffer."""
        fixed = 2 * len(dump_claim(h.owner, h.session_id)) + 200
        chunks: list[list[str]] = []
        size = 0
        for job_id in job_ids:
            # owner path x4, and room for a queued job's held marker (up to ~2x as long)
            cost = fixed + 6 * len(self.paths(job_id).owner.encode())
            if chunks and size + cost <= MAX_MULTI_BYTES:
                chunks[-1].append(job_id)
                size += cost
            else:
                chunks.append([job_id])
                size = cost
        return chunks

    def claim(self, h: ZkSession, job_ids: list[str]) -> list[Outcome]:
        """Claim every job of ``job_ids`` it can, all in one multi per round; element ``i``
        answers ``job_ids[i]``: the new generation, JobCompleted, or ``None`` (held)."""
        h.check_alive()
        base = self.wire.config.base
        outcome: dict[str, Outcome] = {}
        todo = list(job_ids)
        synced = False
        for _round in range(CLAIM_ATTEMPTS):
            if not todo:
                break
            reads: list[Read] = [("sync", base)] if synced else []
            for job_id in todo:
                paths = self.paths(job_id)
                reads += [("get", paths.job), ("get", paths.owner), ("get", paths.tag)]
            answers = self.wire.session_read(h, reads, "claim", todo[0])[1 if synced else 0 :]
            plans: list[Plan] = []
            for i, job_id in enumerate(todo):
                decided = self._plan(h, self.paths(job_id), *answers[3 * i : 3 * i + 3])
                if isinstance(decided, Plan):
                    plans.append(decided)
                else:
                    outcome[job_id] = decided
            if not plans:
                break
            todo = self.send(h, plans, outcome)
            synced = True  # whatever changed under us, the next read must see it
        h.check_alive()  # a claim applied as the session ended is no claim
        return [outcome.get(job_id) for job_id in job_ids]  # still contended: None

    def _plan(
        self, h: ZkSession, paths: JobPaths, job: tuple[bytes, Any] | None,
        owner: tuple[bytes, Any] | None, tag: tuple[bytes, Any] | None,
    ) -> Plan | Outcome:
        if job is not None:
            parsed = parse_job(job[0], paths.job)
            if parsed.completed:
                return JobCompleted(
                    f"{paths.job_id!r} was completed at generation {parsed.generation}",
                    job_id=paths.job_id, generation=parsed.generation,
                )
        held, open_ = self._markers(paths, tag) if job is not None else (None, None)
        if owner is not None:
            if owner[1].ephemeralOwner == h.sid:
                return self._adopt_uncertain(h, paths, job, owner, held, open_)
            return None  # a live session holds it
        return Plan(paths, None if job is None else job[1].version, new_nonce(), held, open_)

    def _markers(
        self, paths: JobPaths, tag: tuple[bytes, Any] | None
    ) -> tuple[str | None, str | None]:
        """A queued job's held and open markers, from its tag (``None``: not queued)."""
        if tag is None:
            return None, None
        parsed = QueueTag.parse(tag[0], paths.tag)
        queues_base = self.wire.config.queues_base
        return parsed.held(queues_base), parsed.marker(queues_base)

    def _adopt_uncertain(
        self, h: ZkSession, paths: JobPaths, job: tuple[bytes, Any] | None,
        owner: tuple[bytes, Any], held: str | None, open_: str | None,
    ) -> ClaimResult | None:
        """Our own owner znode: if it is the one a claim with an unknown outcome would
        have made (same nonce, version = its generation), that claim did apply: it is
        adopted, its hold carrying the owner znode's version as read."""
        nonce = parse_owner(owner[0], paths.owner).nonce
        with h.uncertain_lock:
            pending = h.uncertain.get(paths.job_id)
            if pending is None or pending[1] != nonce or job is None:
                return None
            if job[1].version != pending[0]:
                return None
            del h.uncertain[paths.job_id]
        hold = Hold(h, pending[0], paths.owner, owner[1].version, held, open_)
        return ClaimResult(pending[0], None, hold)

    def send(self, h: ZkSession, plans: list[Plan], outcome: dict[str, Outcome]) -> list[str]:
        """One multi carrying every plan. Fills ``outcome``; returns the job ids to retry."""
        held = dump_claim(h.owner, h.session_id)

        def build(tx: Any) -> None:
            for plan in plans:
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
            with h.uncertain_lock:  # a later claim adopts them, or keepalive hands them back
                for plan in plans:
                    h.uncertain[plan.paths.job_id] = (plan.generation, plan.nonce)
            raise
        if multi.applied:
            for plan in plans:
                if multi.results or plan.paths.job_id in landed:
                    outcome[plan.paths.job_id] = plan.result(h)
            return [p.paths.job_id for p in plans if p.paths.job_id not in outcome]
        if not multi.results:  # answer lost; reading back showed it was not applied
            return [p.paths.job_id for p in plans]
        return self._failures(h, plans, multi.results, outcome)

    def _failures(
        self, h: ZkSession, plans: list[Plan], results: list[Any], outcome: dict[str, Outcome]
    ) -> list[str]:
        """A failed multi: ZooKeeper reports the first failing op; the others are rolled
        back (before it) or not run (after it)."""
        retry: list[str] = []
        offset = 0
        for plan in plans:
            mine = results[offset : offset + plan.op_count]
            offset += plan.op_count
            errors = [r for r in mine if isinstance(r, Exception)
                      and not isinstance(r, (RolledBackError, RuntimeInconsistency))]
            if not errors:
                retry.append(plan.paths.job_id)  # innocent: rolled back for another job
            elif isinstance(mine[plan.owner_op], NodeExistsError):
                outcome[plan.paths.job_id] = None  # the owner znode exists: held
            elif isinstance(errors[0], (BadVersionError, NodeExistsError)):
                retry.append(plan.paths.job_id)  # changed since our read: read again
            elif isinstance(errors[0], NoNodeError):
                self.ensure_base(h)  # {chroot}/jobs was deleted under us
                if plan.held is not None:  # or the queue's held container
                    self.ensure_path(h, plan.held.rsplit("/", 1)[0])
                retry.append(plan.paths.job_id)
            else:
                raise translate(errors[0], "claim", self.wire.hosts, job_id=plan.paths.job_id)
        return retry

    def ensure_path(self, h: ZkSession, path: str) -> None:
        try:
            h.client.ensure_path_async(path, acl=self.wire.config.acl_list()).get(
                timeout=self.wire.config.timeout_s
            )
        except KAZOO_ERRORS as exc:
            raise translate(exc, f"creating {path}", self.wire.hosts) from exc

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
                        held, open_ = self._markers(paths, tag)
                        hold = Hold(h, generation, paths.owner, owner[1].version, held, open_)
                        release(h, job_id, ClaimResult(generation, None, hold))
                        log.warning("handed back a claim whose outcome had been unknown",
                                    extra={"job_id": job_id, "generation": generation})
                except StaleLeaseError:
                    pass  # not this session's any more: nothing to hand back
                except LeaseError as exc:
                    log.warning("handing back an unknown claim failed; will retry",
                                extra={"job_id": job_id, "error": str(exc)})
                    continue
                del h.uncertain[job_id]
