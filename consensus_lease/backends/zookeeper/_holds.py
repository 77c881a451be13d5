"""Holding a claimed job: renew (a read), complete and release (one multi each, sent
without reading first).

The session handle remembers what each of its own claims made (``ZkSession.remember``:
job id -> generation, owner znode and its version, a queued job's markers). Completion
and release of a ``(job, generation)`` it does not remember send nothing: only the
session whose atomic claim set the job znode's version to ``generation`` can have it
recorded. For one it remembers, the multi is sent at once::

    complete:  set_data(job, completion record, version=generation)
               delete(owner, version=remembered)  [+ delete held marker, open marker]
    release:   check(job, version=generation)
               delete(owner, version=remembered)  [+ delete held marker]

and the store checks both conditions atomically with the writes. The versioned
``set_data``/``check`` fails if anyone claimed or completed the job since (each bumps the
version). The ``delete`` fails if the owner znode is gone (released, completed, or the
session expired: ZooKeeper deletes a session's ephemerals with it) or was rewritten.
While the version is ``generation`` the owner znode can only be the one this session's
claim created with it: an owner znode is only ever created by a claim multi, which bumps
the version in the same transaction (and fails while one exists).

Only if the multi fails (or its answer was lost and reading back showed it was not
applied) does the driver read — the job znode, the owner znode's stat (its
``ephemeralOwner``) and the queue tag, after a ``sync`` — to say why: StaleLeaseError,
SessionExpired, or this session's own completion at this generation (a retry, which
returns the record). If the read shows the job still held by this session at
``generation`` (the owner znode was rewritten by hand), the multi is sent again with the
owner version read. A queued job's marker deleted by hand is tolerated: a multi failing
only on it is sent again without it, still without reading.

For a queued job (one with a ``queue`` tag) the release multi also deletes the job's held
marker, and the completion multi its held and open markers, so a queue's ``held`` and
``open`` children stay exactly its held jobs and its jobs not completed (see
:mod:`._queues`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.exceptions import NoNodeError, RolledBackError

from ...errors import BackendUnavailable, SessionExpired, StaleLeaseError
from ...record import JobState, LeaseRecord
from ._layout import JobPaths, QueueTag, dump_completed, new_nonce, parse_job, to_record
from ._session import ZkSession
from ._wire import Read, Wire

__all__ = ["WRITE_ATTEMPTS", "Holds"]

WRITE_ATTEMPTS = 4
"""Most multis one complete/release sends: the first without reading, then one per
failure that reading (or, for a marker deleted by hand, the failure itself) explained."""


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

    def renew(self, h: ZkSession, paths: JobPaths, generation: int, send: float) -> None:
        """After a write barrier (see ``keepalive``: it proves the current leader has the
        session), read the job znode's version and the owner znode's ephemeralOwner in
        one pipelined round trip. Raises unless held."""
        deadline = send + min(self.wire.config.op_timeout_s, max(1.0, h.granted_ttl_s))
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
            h.forget(paths.job_id, generation)  # final: no complete/release will follow
            raise

    def complete(
        self, h: ZkSession, paths: JobPaths, generation: int, result: bytes
    ) -> LeaseRecord:
        """One multi: ``set_data`` of the completion record at version == generation (so
        the version moves on and any claim prepared earlier fails) + ``delete`` of the
        owner znode (+ the markers). Recognises this session's own earlier completion."""
        try:
            return self._complete(h, paths, generation, result)
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

    def _not_held(
        self, h: ZkSession, paths: JobPaths, generation: int, what: str
    ) -> LeaseRecord:
        """``(job, generation)`` is not a hold this handle remembers: nothing is written.
        One read (after a ``sync``) says why — and recognises this session's own
        completion at ``generation`` (a retried complete), which is returned."""
        job, owner_stat, _ = self._read_holder(h, paths, what, synced=True)
        done = self.check(h, paths, generation, job, owner_stat, what)
        if done is not None:
            return done
        current = None if job is None else job[1].version
        raise StaleLeaseError(
            f"{what}: {paths.job_id!r} at generation {generation} is not a claim this "
            f"session handle made and still holds (store: generation {current})",
            job_id=paths.job_id, generation=generation, current_generation=current,
        )

    def _end(
        self, h: ZkSession, paths: JobPaths, generation: int, what: str,
        first: Callable[[Any], None], landed: Callable[[float], bool],
    ) -> LeaseRecord | None:
        """The completion (``first`` is its versioned ``set_data``) or release (a
        versioned ``check``) multi, with the delete of the owner znode and the markers.

        Sent at once from the hold this handle remembers; read (see :meth:`check`) only
        after it failed for another reason than a marker deleted by hand. Returns
        ``None`` once applied, or this session's completion record if the job turned out
        to be completed by this session at ``generation`` already."""
        job_id = paths.job_id
        completing = what == "complete"
        hold = h.hold(job_id, generation)
        if hold is None:
            return self._not_held(h, paths, generation, what)
        owner_version = hold.owner_version
        markers = [m for m in (hold.held, hold.open if completing else None) if m is not None]
        missing: set[str] = set()
        read = False
        for _attempt in range(WRITE_ATTEMPTS):
            if read:
                job, owner_stat, tag = self._read_holder(h, paths, what, synced=True)
                try:
                    done = self.check(h, paths, generation, job, owner_stat, what)
                except StaleLeaseError:
                    h.forget(job_id, generation)  # final: not held at generation any more
                    raise
                if done is not None:
                    h.forget(job_id, generation)
                    return done
                owner_version = owner_stat.version
                markers = self._markers(paths, tag, completing, missing)

            def build(tx: Any, owner_version: int = owner_version,
                      markers: list[str] = markers) -> None:
                first(tx)
                tx.delete(paths.owner, owner_version)
                for marker in markers:
                    tx.delete(marker)

            multi = self.wire.commit(h, build, landed, what, job_id, generation)
            if multi.applied:
                h.forget(job_id, generation)
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
        self, h: ZkSession, paths: JobPaths, generation: int, result: bytes
    ) -> LeaseRecord:
        job_id = paths.job_id
        nonce = new_nonce()  # one per call: at most one of its multis can apply
        data = dump_completed(h.owner, h.session_id, generation, nonce, result)

        def first(tx: Any) -> None:
            tx.set_data(paths.job, data, generation)

        def landed(deadline: float) -> bool:
            answer = self.wire.read(h.client, [("barrier", self.base), ("get", paths.job)],
                                    deadline, "complete (reading back)", job_id=job_id)[1]
            parsed = None if answer is None else parse_job(answer[0], paths.job)
            return parsed is not None and parsed.completed and parsed.nonce == nonce

        done = self._end(h, paths, generation, "complete", first, landed)
        if done is not None:
            return done
        return LeaseRecord(job_id, h.owner, None, generation, JobState.COMPLETED, result)

    def release(self, h: ZkSession, paths: JobPaths, generation: int) -> None:
        """One multi: ``check`` version == generation + ``delete`` of the owner znode
        (and of a queued job's held marker)."""
        job_id = paths.job_id

        def first(tx: Any) -> None:
            tx.check(paths.job, generation)

        def landed(deadline: float) -> bool:
            owner = self.wire.read(h.client, [("barrier", self.base), ("exists", paths.owner)],
                                   deadline, "release (reading back)", job_id=job_id)[1]
            return owner is None or owner.ephemeralOwner != h.sid

        if self._end(h, paths, generation, "release", first, landed) is not None:
            raise StaleLeaseError(f"release: {job_id!r} is completed", job_id=job_id,
                                  generation=generation, current_generation=generation)
