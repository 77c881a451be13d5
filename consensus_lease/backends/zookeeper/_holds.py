"""Holding a claimed job: renew (a read), complete and release (one multi each).

Each first verifies, on the session's own connection, that the job znode's version is the
generation and that the owner znode's ``ephemeralOwner`` is this session. The multi then
repeats the version condition in the store, atomically with its writes; and while that
version stands, the owner znode can only be the one created with it, by this session
(a new owner znode comes only with a new claim, which bumps the version).

For a queued job (one with a ``queue`` tag, read in the same round trip) the release
multi also deletes the job's held marker, and the completion multi its held and open
markers, so a queue's ``held`` and ``open`` children stay exactly its held jobs and its
jobs not completed (see :mod:`._queues`).
"""

from __future__ import annotations

from typing import Any

from kazoo.exceptions import NoNodeError

from ...errors import BackendUnavailable, SessionExpired, StaleLeaseError
from ...record import JobState, LeaseRecord
from ._layout import JobPaths, QueueTag, dump_completed, new_nonce, parse_job, to_record
from ._session import ZkSession
from ._wire import Read, Wire

__all__ = ["WRITE_ATTEMPTS", "Holds"]

WRITE_ATTEMPTS = 3
"""Multis complete/release send when reading back showed the previous one was not applied."""


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
        if self.check(h, paths, generation, job, owner_stat, "renew") is not None:
            raise StaleLeaseError(
                f"renew: {paths.job_id!r} was completed at generation {generation}",
                job_id=paths.job_id, generation=generation, current_generation=generation,
            )

    def complete(
        self, h: ZkSession, paths: JobPaths, generation: int, result: bytes
    ) -> LeaseRecord:
        """One multi: ``set_data`` of the completion record at version == generation (so
        the version moves on and any claim prepared earlier fails) + ``delete`` of the
        owner znode. Recognises this session's own earlier completion."""
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

    def _complete(
        self, h: ZkSession, paths: JobPaths, generation: int, result: bytes
    ) -> LeaseRecord:
        job_id = paths.job_id
        missing: set[str] = set()
        for attempt in range(WRITE_ATTEMPTS):
            job, owner_stat, tag = self._read_holder(h, paths, "complete", attempt > 0)
            done = self.check(h, paths, generation, job, owner_stat, "complete")
            if done is not None:
                return done
            markers = self._markers(paths, tag, True, missing)
            nonce = new_nonce()
            data = dump_completed(h.owner, h.session_id, generation, nonce, result)

            def build(tx: Any, data: bytes = data, owner_version: int = owner_stat.version,
                      markers: list[str] = markers) -> None:
                tx.set_data(paths.job, data, generation)
                tx.delete(paths.owner, owner_version)
                for marker in markers:
                    tx.delete(marker)

            def landed(deadline: float, nonce: str = nonce) -> bool:
                answer = self.wire.read(h.client, [("barrier", self.base), ("get", paths.job)],
                                        deadline, "complete (reading back)", job_id=job_id)[1]
                parsed = None if answer is None else parse_job(answer[0], paths.job)
                return parsed is not None and parsed.completed and parsed.nonce == nonce

            multi = self.wire.commit(h, build, landed, "complete", job_id, generation)
            if multi.applied:
                return LeaseRecord(job_id, h.owner, None, generation, JobState.COMPLETED, result)
            missing |= self._missing(multi.results, 2, markers)
        raise BackendUnavailable(
            f"complete: {job_id!r} kept changing under this session; nothing was applied",
            job_id=job_id, generation=generation,
        )

    def release(self, h: ZkSession, paths: JobPaths, generation: int) -> None:
        """One multi: ``check`` version == generation + ``delete`` of the owner znode
        (and of a queued job's held marker)."""
        job_id = paths.job_id
        missing: set[str] = set()
        for attempt in range(WRITE_ATTEMPTS):
            job, owner_stat, tag = self._read_holder(h, paths, "release", attempt > 0)
            if self.check(h, paths, generation, job, owner_stat, "release") is not None:
                raise StaleLeaseError(f"release: {job_id!r} is completed", job_id=job_id,
                                      generation=generation, current_generation=generation)
            markers = self._markers(paths, tag, False, missing)

            def build(tx: Any, owner_version: int = owner_stat.version,
                      markers: list[str] = markers) -> None:
                tx.check(paths.job, generation)
                tx.delete(paths.owner, owner_version)
                for marker in markers:
                    tx.delete(marker)

            def landed(deadline: float) -> bool:
                owner = self.wire.read(h.client, [("barrier", self.base), ("exists", paths.owner)],
                                       deadline, "release (reading back)", job_id=job_id)[1]
                return owner is None or owner.ephemeralOwner != h.sid

            multi = self.wire.commit(h, build, landed, "release", job_id, generation)
            if multi.applied:
                return
            missing |= self._missing(multi.results, 2, markers)
        raise BackendUnavailable(
            f"release: {job_id!r} kept changing under this session; nothing was applied",
            job_id=job_id, generation=generation,
        )
