"""Holding a claimed job: renew (a read), complete and release (one multi each, sent
without reading first for a claim this session made).

Each claim of a session that the store applied returns a :class:`Hold` as its
``ClaimResult.handle`` (the generation, the owner znode and its version, a queued job's
markers). The core keeps it with the lease and hands it back with every operation on
that claim; nothing here keeps a table of claims. For a claim whose hold this session
made, the multi is sent at once::

    complete:  set_data(job, completion record, version=generation)
               delete(owner, version=the hold's)  [+ delete held marker, open marker]
    release:   check(job, version=generation)
               delete(owner, version=the hold's)  [+ delete held marker]

and the store checks both conditions atomically with the writes. The versioned
``set_data``/``check`` fails if anyone claimed or completed the job since (each bumps the
version). The ``delete`` fails if the owner znode is gone (released, completed, or the
session expired: ZooKeeper deletes a session's ephemerals with it) or was rewritten.
While the version is ``generation`` the owner znode can only be the one this session's
claim created with it: an owner znode is only ever created by a claim multi, which bumps
the version in the same transaction (and fails while one exists).

A claim without such a hold (``handle`` ``None``: not made by this process, or a hold of
another session, or one already released, completed or found lost) is read first — the
job znode, the owner znode's stat (its ``ephemeralOwner``) and the queue tag, after a
``sync`` — and the multi is sent only if that shows this session holding the job at
``generation`` (with the owner version and markers read). The same read follows a multi
that failed (or whose answer was lost and reading back showed it was not applied), to
say why: StaleLeaseError, SessionExpired, or this session's own completion at this
generation (a retry, which returns the record). If the read shows the job still held by
this session at ``generation`` (the owner znode was rewritten by hand), the multi is sent
again with the owner version read. A queued job's marker deleted by hand is tolerated: a
multi failing only on it is sent again without it, still without reading.

For a queued job (one with a ``queue`` tag) the release multi also deletes the job's held
marker, and the completion multi its held and open markers, so a queue's ``held`` and
``open`` children stay exactly its held jobs and its jobs not completed (see
:mod:`._queues`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import NoNodeError, RolledBackError

from ...errors import BackendUnavailable, SessionExpired, StaleLeaseError
from ...record import ClaimResult, JobState, LeaseRecord
from ._layout import JobPaths, QueueTag, dump_completed, new_nonce, parse_job, to_record
from ._session import ZkSession
from ._wire import Read, Wire

__all__ = ["WRITE_ATTEMPTS", "Hold", "Holds"]

WRITE_ATTEMPTS = 4
"""Most multis one complete/release sends: the first (without reading, for a claim
whose hold this session made), then one per failure that reading (or, for a marker
deleted by hand, the failure itself) explained."""


@dataclass(slots=True, eq=False)
class Hold:
    """What one claim of this session made (the ``handle`` of the ``ClaimResult`` the
    claim returned), so that its completion and release need not read it back.

    Attributes:
        session: the session whose claim it is; any other session reads first.
        generation: the job znode's version that claim set.
        owner: the owner znode's path the claim created in the same multi.
        owner_version: its version (0 at creation; nothing of ours writes it later).
        held: a queued job's held marker (ephemeral, made with the owner znode).
        open: a queued job's open marker (deleted by the completion).
        ended: released, completed, or found no longer held: later calls with this
            claim read first, as for a claim without a hold.
    """

    session: ZkSession = field(repr=False)
    generation: int
    owner: str
    owner_version: int
    held: str | None = None
    open: str | None = None
    ended: bool = False


def own_hold(h: ZkSession, paths: JobPaths, claim: ClaimResult) -> Hold | None:
    """The hold ``claim`` carries, if ``h``'s own claim of this job at
    ``claim.generation`` made it and it is not known to be over; else ``None``."""
    hold = claim.handle
    if (
        isinstance(hold, Hold) and hold.session is h and hold.owner == paths.owner
        and hold.generation == claim.generation and not hold.ended
    ):
        return hold
    return None


def _mark_ended(hold: Hold | None) -> None:
    if hold is not None:
        hold.ended = True


class Holds:
    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.base = wire.config.base
        self.queues_base = wire.config.queues_base

    def check(
        self, h: ZkSession, paths: JobPaths, generation: int, job: tuple[bytes, Any] | None,
        owner_stat: Any, what: str,
    ) -> LeaseRecord | None:
        """``None`` if ``h`` holds the job at ``generation``; the completion record if this
        session completed it at that generation; else raise StaleLeaseError (or
        SessionExpired if the session is the reason)."""
        job_id = paths.job_id
        if job is None:
            h.check_alive()
            raise StaleLeaseError(f"{what}: {job_id!r} does not exist in the store",
                                  job_id=job_id, generation=generation)
        parsed = parse_job(job[0], paths.job)
        if parsed.completed:
            if parsed.session == h.session_id and parsed.generation == generation:
                return to_record(paths, job, None)
            raise StaleLeaseError(
                f"{what}: {job_id!r} was completed at generation {parsed.generation}",
                job_id=job_id, generation=generation, current_generation=parsed.generation,
            )
        version = job[1].version
        if version == generation and owner_stat is not None and owner_stat.ephemeralOwner == h.sid:
            return None
        h.check_alive()
        holder = "nobody" if owner_stat is None else f"session 0x{owner_stat.ephemeralOwner:x}"
        raise StaleLeaseError(
            f"{what}: {job_id!r} is not held by session {h.session_id} at generation "
            f"{generation} (store: generation {version}, held by {holder})",
            job_id=job_id, generation=generation, current_generation=version,
        )

    def _read_holder(
        self, h: ZkSession, paths: JobPaths, what: str, synced: bool
    ) -> tuple[tuple[bytes, Any] | None, Any, tuple[bytes, Any] | None]:
        """The job znode, the owner znode's stat and the queue tag (``None`` for a job
        not queued), in one pipelined round trip (after a ``sync`` if ``synced``)."""
        reads: list[Read] = [("sync", self.base)] if synced else []
        reads += [("get", paths.job), ("exists", paths.owner), ("get", paths.tag)]
        job, owner_stat, tag = self.wire.session_read(h, reads, what, paths.job_id)[-3:]
        return job, owner_stat, tag

    def renew(self, h: ZkSession, paths: JobPaths, claim: ClaimResult, send: float) -> None:
        """After a write barrier (see ``keepalive``: it proves the current leader has the
        session), read the job znode's version and the owner znode's ephemeralOwner in
        one pipelined round trip. Raises unless held (and then marks the claim's hold
        ended: no complete/release will follow)."""
        generation = claim.generation
        deadline = send + min(self.wire.config.timeout_s, max(1.0, h.granted_ttl_s))
        _, job_stat, owner_stat = self.wire.session_read(
            h, [("barrier", self.base), ("exists", paths.job), ("exists", paths.owner)],
            "renew", paths.job_id, deadline,
        )
        if (
            job_stat is not None and job_stat.version == generation
            and owner_stat is not None and owner_stat.ephemeralOwner == h.sid
        ):
            return
        job, owner_stat, _ = self._read_holder(h, paths, "renew", synced=True)  # to say why
        try:
            if self.check(h, paths, generation, job, owner_stat, "renew") is not None:
                raise StaleLeaseError(
                    f"renew: {paths.job_id!r} was completed at generation {generation}",
                    job_id=paths.job_id, generation=generation, current_generation=generation,
                )
        except StaleLeaseError:
            _mark_ended(own_hold(h, paths, claim))  # final: no complete/release will follow
            raise

    def complete(
        self, h: ZkSession, paths: JobPaths, claim: ClaimResult, result: bytes
    ) -> LeaseRecord:
        """One multi: ``set_data`` of the completion record at version == generation (so
        the version moves on and any claim prepared earlier fails) + ``delete`` of the
        owner znode (+ the markers). Recognises this session's own earlier completion."""
        generation = claim.generation
        try:
            return self._complete(h, paths, claim, result)
        except SessionExpired as expired:
            # The completion record outlives the session: a retry is still recognised.
            try:
                job = self.wire.reader_read([("barrier", self.base), ("get", paths.job)],
                                            "complete", paths.job_id)[1]
            except BackendUnavailable:
                raise expired from None
            parsed = None if job is None else parse_job(job[0], paths.job)
            if parsed is not None and parsed.completed and parsed.session == h.session_id \
                    and parsed.generation == generation:
                record = to_record(paths, job, None)
                assert record is not None
                return record
            raise

    def _markers(self, paths: JobPaths, tag: tuple[bytes, Any] | None,
                 completing: bool, missing: set[str]) -> list[str]:
        """A queued job's markers its multi deletes: the held marker (ephemeral, made by
        the claim with the owner znode) and, on completion, the open marker. Those found
        missing before (deleted by hand) are left out."""
        if tag is None:
            return []
        parsed = QueueTag.parse(tag[0], paths.tag)
        markers = [parsed.held(self.queues_base)]
        if completing:
            markers.append(parsed.marker(self.queues_base))
        return [m for m in markers if m not in missing]

    @staticmethod
    def _missing(results: list[Any], first: int, markers: list[str]) -> set[str]:
        """The markers a failed multi found missing (its operations from ``first`` on)."""
        return {m for m, r in zip(markers, results[first:], strict=False)
                if isinstance(r, NoNodeError)}

    @staticmethod
    def _marker_only(results: list[Any], lost: set[str]) -> bool:
        """Whether a failed multi failed on a missing marker alone: ZooKeeper reports the
        first failing operation, the ones before it as rolled back."""
        return bool(lost) and all(isinstance(r, RolledBackError) for r in results[:2])

    def _reread(
        self, h: ZkSession, paths: JobPaths, generation: int, what: str, completing: bool,
        missing: set[str],
    ) -> LeaseRecord | tuple[int, list[str]]:
        """Read the holder (after a ``sync``) and check it (see :meth:`check`, which raises
        unless held): this session's completion record at ``generation`` if it is one, else
        the owner znode's version and the markers to send the multi with."""
        job, owner_stat, tag = self._read_holder(h, paths, what, synced=True)
        done = self.check(h, paths, generation, job, owner_stat, what)
        if done is not None:
            return done
        return owner_stat.version, self._markers(paths, tag, completing, missing)

    def _end(
        self, h: ZkSession, paths: JobPaths, claim: ClaimResult, what: str,
        first: Callable[[Any], None], landed: Callable[[float], bool],
    ) -> LeaseRecord | None:
        """The completion (``first`` is its versioned ``set_data``) or release (a
        versioned ``check``) multi, with the delete of the owner znode and the markers.

        Sent at once from the claim's hold if this session made it (see :func:`own_hold`);
        otherwise, and after it failed for another reason than a marker deleted by hand,
        only once a read showed the job held by this session at ``claim.generation``.
        Returns ``None`` once applied, or this session's completion record if the job
        turned out to be completed by this session at that generation already."""
        job_id, generation = paths.job_id, claim.generation
        completing = what == "complete"
        hold = own_hold(h, paths, claim)
        read = hold is None  # not a claim of ours we know: check ownership by reading
        owner_version = 0 if hold is None else hold.owner_version
        markers = [] if hold is None else [
            m for m in (hold.held, hold.open if completing else None) if m is not None
        ]
        missing: set[str] = set()
        for _attempt in range(WRITE_ATTEMPTS):
            if read:
                try:
                    reread = self._reread(h, paths, generation, what, completing, missing)
                except StaleLeaseError:
                    _mark_ended(hold)  # final: not held at generation any more
                    raise
                if isinstance(reread, LeaseRecord):
                    _mark_ended(hold)
                    return reread
                owner_version, markers = reread

            def build(tx: Any, owner_version: int = owner_version,
                      markers: list[str] = markers) -> None:
                first(tx)
                tx.delete(paths.owner, owner_version)
                for marker in markers:
                    tx.delete(marker)

            multi = self.wire.commit(h, build, landed, what, job_id, generation)
            if multi.applied:
                _mark_ended(hold)
                return None
            lost = self._missing(multi.results, 2, markers)
            missing |= lost
            markers = [m for m in markers if m not in lost]
            read = not self._marker_only(multi.results, lost)
        raise BackendUnavailable(
            f"{what}: {job_id!r} kept changing under this session; nothing was applied",
            job_id=job_id, generation=generation,
        )

    def _complete(
        self, h: ZkSession, paths: JobPaths, claim: ClaimResult, result: bytes
    ) -> LeaseRecord:
        job_id, generation = paths.job_id, claim.generation
        nonce = new_nonce()  # one per call: at most one of its multis can apply
        data = dump_completed(h.owner, h.session_id, generation, nonce, result)

        def first(tx: Any) -> None:
            tx.set_data(paths.job, data, generation)

        def landed(deadline: float) -> bool:
            answer = self.wire.read(h.client, [("barrier", self.base), ("get", paths.job)],
                                    deadline, "complete (reading back)", job_id=job_id)[1]
            parsed = None if answer is None else parse_job(answer[0], paths.job)
            return parsed is not None and parsed.completed and parsed.nonce == nonce

        done = self._end(h, paths, claim, "complete", first, landed)
        if done is not None:
            return done
        return LeaseRecord(job_id, h.owner, None, generation, JobState.COMPLETED, result)

    def release(self, h: ZkSession, paths: JobPaths, claim: ClaimResult) -> None:
        """One multi: ``check`` version == generation + ``delete`` of the owner znode
        (and of a queued job's held marker)."""
        job_id, generation = paths.job_id, claim.generation

        def first(tx: Any) -> None:
            tx.check(paths.job, generation)

        def landed(deadline: float) -> bool:
            owner = self.wire.read(h.client, [("barrier", self.base), ("exists", paths.owner)],
                                   deadline, "release (reading back)", job_id=job_id)[1]
            return owner is None or owner.ephemeralOwner != h.sid

        if self._end(h, paths, claim, "release", first, landed) is not None:
            raise StaleLeaseError(f"release: {job_id!r} is completed", job_id=job_id,
                                  generation=generation, current_generation=generation)
