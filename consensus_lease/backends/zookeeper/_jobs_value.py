"""The value kept with a hold (``set_value``; an election's leader value), in the hold's
EPHEMERAL owner znode, so it ends with the hold. The multi (``check`` of the job znode at
version == generation, versioned ``set_data`` of the owner znode: the checks of a
release) and why those two checks are exactly "this session holds the job at
``generation``" are told in the package docstring ("Leader elections", and completion
and release under "How leases map onto ZooKeeper"); the owner znode's data is in
:mod:`._layout`.

What is specific to this module: the owner znode keeps the claim's nonce (how a claim's
lost answer is read back) and gets the call's own nonce (``vnonce``), through which a
lost answer of this multi is read back: never re-sent blindly. The multi is sent at once
for a claim whose hold this session made (:func:`._jobs.own_hold`) and that knows its
nonce; otherwise, and after a multi that failed (or whose answer was lost and reading
back showed it was not applied), only once a read (after a ``sync``) showed the job held
by this session at ``generation`` (:func:`._jobs.refusal`): the owner znode's version and
claim nonce are taken from that read. A ``set_value`` through the hold moves the owner
znode's version on, and the hold with it, so release, completion and fail still delete
it at the version they send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import BackendUnavailable, StaleLeaseError
from ...record import ClaimResult
from ._jobs import WRITE_ATTEMPTS, Hold, local, mark_ended, own_hold, refusal
from ._layout import JobPaths, dump_owner, new_nonce, parse_owner
from ._sessions import ZkSession
from ._transport import Read, Wire
from ._transport_multi import Transaction

__all__ = ["Values"]


@dataclass(frozen=True, slots=True)
class _Owner:
    """The owner znode as the next multi expects it: its version and its claim nonce."""

    version: int
    nonce: str


def _known(hold: Hold | None) -> _Owner | None:
    if hold is None or hold.nonce is None:
        return None
    return _Owner(hold.owner_version, hold.nonce)


class Values:
    """``set_value`` for one backend.

    Args:
        wire: the round trips.

    The ownership check is the one of renew/complete/release (:func:`._jobs.refusal`).
    """

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.base = wire.config.base

    def set_value(self, h: ZkSession, paths: JobPaths, claim: ClaimResult, value: bytes) -> None:
        """Write ``value`` into the owner znode iff ``h`` holds the job at
        ``claim.generation`` (see the module docstring). A hold ``claim`` carries gets
        the owner znode's new version.

        Raises:
            StaleLeaseError / SessionExpired: not held (any more); the lease is lost.
            BackendUnavailable: nothing was applied. OutcomeUnknown: the answer was lost
                and reading back failed.
        """
        job_id, generation = paths.job_id, claim.generation
        nonce = new_nonce()  # one per call: at most one of its multis can apply
        hold = own_hold(h, paths, claim)
        current = _known(hold)
        written: list[Any] = []  # the owner znode's stat, however it became known
        for _attempt in range(WRITE_ATTEMPTS):
            if current is None:
                try:
                    current = self._read(h, paths, generation)
                except StaleLeaseError:
                    mark_ended(hold)  # final: not held at generation any more
                    raise
            data = dump_owner(h.owner, h.session_id, current.nonce, value, nonce)

            def build(tx: Transaction, version: int = current.version, data: bytes = data) -> None:
                tx.check(paths.job, local(generation))
                tx.set_data(paths.owner, data, version)

            def landed(deadline: float) -> bool:
                reads: list[Read] = [("barrier", self.base), ("get", paths.owner)]
                owner = self.wire.read(h.client, reads, deadline, "set_value (reading back)",
                                       job_id=job_id)[1]
                if owner is None or owner[1].ephemeralOwner != h.sid \
                        or parse_owner(owner[0], paths.owner).value_nonce != nonce:
                    return False
                written.append(owner[1])
                return True

            multi = self.wire.commit(h, build, landed, "set_value", job_id, generation)
            if multi.applied:
                stat = multi.results[1] if multi.results else written[-1]
                if hold is not None:  # set_values racing on one hold: the highest wins
                    hold.owner_version = max(hold.owner_version, stat.version)
                return
            current = None  # read, to say why (or to find the owner znode's version)
        raise BackendUnavailable(
            f"set_value: {job_id!r} kept changing under this session; nothing was applied",
            job_id=job_id, generation=generation,
        )

    def _read(self, h: ZkSession, paths: JobPaths, generation: int) -> _Owner:
        """Read the job znode and the owner znode (after a ``sync``); raise unless ``h``
        holds the job at ``generation`` (see :func:`._jobs.refusal`)."""
        _, job, owner = self.wire.session_read(
            h, [("sync", self.base), ("get", paths.job), ("get", paths.owner)], "set_value",
            paths.job_id,
        )
        stat = None if owner is None else owner[1]
        if refusal(h, paths, generation, job, stat, "set_value") is not None:
            raise StaleLeaseError(
                f"set_value: {paths.job_id!r} was completed at generation {generation}",
                job_id=paths.job_id, generation=generation, current_generation=generation,
            )
        assert owner is not None  # held: refusal raised otherwise
        return _Owner(owner[1].version, parse_owner(owner[0], paths.owner).nonce)
