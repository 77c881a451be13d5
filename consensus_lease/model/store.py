"""The store's side of the protocol, as pure functions on one job's record.

The same rules the drivers implement (:class:`consensus_lease.backend.Backend`), written
once over integers: ``now`` and ``lease_until`` are store-clock ticks, an owner is a
worker number (:data:`NO_OWNER` for none), a generation is the fencing token. Each
function returns the record after the request and the store's answer; none reads a
worker's clock. The checker (:mod:`.checker`) and the differential test
(:mod:`consensus_lease.testing.differential`) both use them.

A *mutation* (:class:`Mutation`) switches off one rule, to show the checker finds what
goes wrong without it.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = [
    "NO_OWNER",
    "Answer",
    "Mutation",
    "Record",
    "claim",
    "complete",
    "end_hold",
    "holds",
    "renew",
]

NO_OWNER = -1
"""``Record.owner`` of a job nobody holds."""


class Mutation(enum.Enum):
    """A deliberately broken protocol rule (each a flag of the model)."""

    RENEW_WITHOUT_GENERATION = "renew-without-generation"
    """renew compares the owner only, not the generation."""
    COMPLETE_WITHOUT_GENERATION = "complete-without-generation"
    """complete (and release, fail) compare the owner only."""
    DEADLINE_FROM_RECEIVE = "deadline-from-receive"
    """The worker's local deadline counts from when the answer *arrived*, not from when
    the request was sent (the flaw of etcd's Go client)."""
    CLAIM_IGNORES_EXPIRY = "claim-ignores-expiry"
    """A claim takes a job another worker holds with an unexpired lease."""
    CLAIM_IGNORES_COMPLETION = "claim-ignores-completion"
    """A claim takes a completed job."""
    NO_GENERATION_BUMP = "no-generation-bump"
    """A re-claim keeps the previous generation (token) instead of adding 1."""
    NO_FENCE = "no-fence"
    """The destination accepts an effect whatever its token."""
    MARGIN_BELOW_DRIFT = "margin-below-drift"
    """The safety margin is one tick below the clock-drift bound."""
    WRITE_ONLY_FENCED = "write-only-fenced"
    """Read-modify-write client: the read is not fenced (only the write is)."""


class Answer(enum.IntEnum):
    """The store's answer to a request (what the real call returns or raises)."""

    OK = 0
    """claim: claimed (a new generation); renew/complete/release/fail: done."""
    HELD = 1
    """claim: ``None``, a live lease holds the job."""
    COMPLETED = 2
    """claim: ``JobCompleted``."""
    STALE = 3
    """``StaleLeaseError``: owner or generation do not match (or another holder)."""
    EXPIRED = 4
    """``SessionExpired``: this holder's lease ran out and nobody claimed since."""


class Record(NamedTuple):
    """One job's record in the store.

    Attributes:
        owner: the holder (worker number), or :data:`NO_OWNER`.
        generation: the fencing token of the last claim (0: never claimed).
        lease_until: store tick at which the holder's lease expires (held while
            ``now < lease_until``).
        completed: a completion record exists (``owner`` is who completed it).
    """

    owner: int = NO_OWNER
    generation: int = 0
    lease_until: int = 0
    completed: bool = False


def holds(rec: Record, owner: int, generation: int, now: int) -> bool:
    """Whether ``owner`` holds the job at ``generation`` at store tick ``now``."""
    return (rec.owner == owner and rec.generation == generation and not rec.completed
            and now < rec.lease_until)


def claim(rec: Record, owner: int, now: int, ttl: int,
          mutations: frozenset[Mutation]) -> tuple[Record, Answer]:
    """Claim the job: only when unowned or expired and not completed; the generation
    goes up by 1 (the fencing token)."""
    if rec.completed and Mutation.CLAIM_IGNORES_COMPLETION not in mutations:
        return rec, Answer.COMPLETED
    live = rec.owner != NO_OWNER and now < rec.lease_until and not rec.completed
    if live and Mutation.CLAIM_IGNORES_EXPIRY not in mutations:
        return rec, Answer.HELD
    bump = 0 if Mutation.NO_GENERATION_BUMP in mutations and rec.generation else 1
    return Record(owner, rec.generation + bump, now + ttl, False), Answer.OK


def _refusal(rec: Record, owner: int, generation: int, now: int, compare_generation: bool,
             alive: bool | None) -> Answer | None:
    """``None`` if the request matches the hold, else the error the store answers: the
    rule of :meth:`consensus_lease.backend.Backend.complete`. A newer generation or a
    completion is the reason: stale. Else, if the requester's session is over (``alive``;
    ``None``: its lease on this record ran out), ``SessionExpired``. Else (released, or
    another's): stale."""
    if rec.completed or (compare_generation and rec.generation != generation):
        return Answer.STALE
    if alive is None:
        alive = rec.owner == owner and now < rec.lease_until
    if not alive:
        return Answer.EXPIRED
    if rec.owner != owner:
        return Answer.STALE
    return None


def renew(rec: Record, owner: int, generation: int, now: int, ttl: int,
          mutations: frozenset[Mutation], alive: bool | None = None
          ) -> tuple[Record, Answer]:
    """Extend the lease to ``now + ttl`` iff owner and generation match, unexpired
    (``alive``: whether the requester's session is live, if the caller tracks sessions)."""
    compare = Mutation.RENEW_WITHOUT_GENERATION not in mutations
    refused = _refusal(rec, owner, generation, now, compare, alive)
    if refused is not None:
        return rec, refused
    return rec._replace(lease_until=now + ttl), Answer.OK


def complete(rec: Record, owner: int, generation: int, now: int,
             mutations: frozenset[Mutation], alive: bool | None = None
             ) -> tuple[Record, Answer]:
    """Record completion iff owner and generation match, unexpired; a repeat of this
    holder's own completion answers OK again and changes nothing."""
    if rec.completed and rec.owner == owner and rec.generation == generation:
        return rec, Answer.OK
    compare = Mutation.COMPLETE_WITHOUT_GENERATION not in mutations
    refused = _refusal(rec, owner, generation, now, compare, alive)
    if refused is not None:
        return rec, refused
    return rec._replace(completed=True, lease_until=0), Answer.OK


def end_hold(rec: Record, owner: int, generation: int, now: int,
             mutations: frozenset[Mutation], alive: bool | None = None
             ) -> tuple[Record, Answer]:
    """release, or fail with no retry delay: end the hold iff owner and generation
    match, unexpired; the job is claimable at once."""
    compare = Mutation.COMPLETE_WITHOUT_GENERATION not in mutations
    refused = _refusal(rec, owner, generation, now, compare, alive)
    if refused is not None:
        return rec, refused
    return Record(NO_OWNER, rec.generation, 0, False), Answer.OK
