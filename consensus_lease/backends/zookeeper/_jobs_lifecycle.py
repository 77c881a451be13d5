"""The job lifecycle beyond claim and release: the claim that finds a job's attempts used
up, ``requeue``, the store's clock, and when retry delays end. The protocol (where the
attempt, the limit and the failure znode live, the multis of ``fail``, of the exhausted
claim and of ``requeue``, retry delays measured on the store's clock only) is told once,
in the package docstring ("Job lifecycle"); the znodes are in :mod:`._layout`;
``fail()`` itself is in :mod:`._jobs`.

What is specific to this module: :meth:`Lifecycle.store_now_ms` reads the store's clock
as the mtime of a write of its own (``set_data`` of ``{chroot}/jobs``, which changes
nothing that matters: :func:`._transport.clock_ms`), made again after ``{chroot}/jobs``
was deleted by hand; the exhausted claim's and ``requeue``'s multis are sent again
without a marker found missing (or made) by hand, and read back through the failure
znode's nonce; the worker's clock never decides, it only times waits
(:class:`DelayHints`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import BackendUnavailable, InvalidArgument, JobFailed
from ...record import JobState, LeaseRecord
from ._layout import (
    Failure,
    JobPaths,
    QueueTag,
    Tally,
    dump_failure,
    new_nonce,
    parse_failure,
    parse_job,
    to_record,
    token,
    written_by,
)
from ._sessions import ZkSession
from ._transport import Read, Wire, clock_ms
from ._transport_multi import Op, Transaction, add_ops, marker_trouble

__all__ = ["MAX_HINTS", "DelayHints", "Exhausted", "Lifecycle", "job_failed"]

MAX_HINTS = 100_000
"""Delay ends remembered per backend; beyond that, those already passed are dropped."""

WRITE_ATTEMPTS = 4
"""Most multis one requeue (or one claim finding the attempts used up) sends."""


class DelayHints:
    """When retry delays this process has seen end, as ``time.monotonic()`` deadlines
    computed from the store's clock (the delay's end less a fresh write's mtime, counted
    from when that write was answered). Only for deciding how long a waiter sleeps:
    whether a job may be claimed is decided by the store's clock alone. Keyed by job id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ends: dict[str, float] = {}

    def note(self, job_id: str, remaining_s: float) -> None:
        """The delay of ``job_id`` ends ``remaining_s`` seconds from now (0: passed)."""
        now = time.monotonic()
        with self._lock:
            if len(self._ends) >= MAX_HINTS:
                self._ends = {j: end for j, end in self._ends.items() if end > now}
                if len(self._ends) >= MAX_HINTS:
                    self._ends.clear()
            self._ends[job_id] = now + max(0.0, remaining_s)

    def remaining(self, job_id: str) -> float | None:
        """Seconds until the delay of ``job_id`` ends (0.0: passed), or ``None``: not seen."""
        with self._lock:
            end = self._ends.get(job_id)
        return None if end is None else max(0.0, end - time.monotonic())

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._ends.pop(job_id, None)


def job_failed(job_id: str, generation: int, attempt: int, error: str | None) -> JobFailed:
    return JobFailed(f"{job_id!r} FAILED after {attempt} attempt(s): {error}",
                     job_id=job_id, generation=generation, attempt=attempt, error=error)


@dataclass(frozen=True, slots=True)
class Exhausted:
    """A claim found the job unheld with its attempts used up (``attempt - base >=
    max_attempts``): it is to become FAILED instead, at the job znode's ``version``."""

    paths: JobPaths
    version: int
    attempt: int
    failure: Failure | None
    open: str | None  # a queued job's open marker
    epoch: int = 0  # the epoch of the job's last claim (its token's high part)
    failed: str | None = None  # a queued job's failed marker (layout 2)
    tally: Tally | None = None  # a queued job's tally entries (layout 2)

    def ops(self, nonce: str) -> tuple[list[Op], list[Op], str]:
        """The multi (core, markers) and the error it records."""
        error = (self.failure.error if self.failure is not None else None) or (
            f"attempts exhausted: attempt {self.attempt} ended without completion"
        )
        base = 0 if self.failure is None else self.failure.base
        data = dump_failure(Failure(True, self.version, base, 0.0, error, nonce))
        core: list[Op] = [("check", self.paths.job, b"", self.version)]
        if self.failure is None:
            core += [("create", self.paths.failure, b"", None),
                     ("set", self.paths.failure, data, 0)]
        else:
            core.append(("set", self.paths.failure, data, self.failure.version))
        markers: list[Op] = [] if self.open is None else [("delete", self.open, b"", None)]
        if self.failed is not None:
            markers.append(("create", self.failed, b"", None))
        if self.tally is not None:
            markers.append(("create", self.tally.failed, b"", None))
        return core, markers, error


class Lifecycle:
    """Requeue, the FAILED transition of a claim, and the store's clock, for one backend.

    Args:
        wire: the round trips.
        job_paths: job id -> its znode paths.
    """

    def __init__(self, wire: Wire, job_paths: Callable[[str], JobPaths]) -> None:
        self.wire = wire
        self.job_paths = job_paths
        self.base = wire.config.base
        self.queues_base = wire.config.queues_base
        self.hints = DelayHints()

    def store_now_ms(self, h: ZkSession, what: str) -> int:
        """The store's clock now (ms since the epoch): the mtime of a write on ``h``'s
        client (see :func:`._transport.clock_ms`)."""
        for _ in range(2):
            stat = self.wire.session_read(h, [("clock", self.base)], f"{what} (store clock)")[0]
            if stat is not None:
                return clock_ms(stat)
            self.wire.ensure_path(h.client, self.base, what)  # {chroot}/jobs deleted by hand
        raise BackendUnavailable(f"{what}: {self.base} keeps disappearing")

    def exhaust(self, h: ZkSession, job: Exhausted) -> JobFailed | None:
        """One multi making the job FAILED (check of the job znode's version, the
        failure znode's versioned write, deleting the open marker). Returns the JobFailed
        to raise, or ``None`` if the job changed meanwhile (the claim reads it again)."""
        nonce = new_nonce()
        job_id = job.paths.job_id
        skip: set[str] = set()

        def landed(deadline: float) -> bool:
            answer = self.wire.read(
                h.client, [("barrier", self.base), ("get", job.paths.failure)], deadline,
                "claim (reading back)", job_id=job_id,
            )[1]
            return written_by(answer, job.paths.failure, nonce)

        for _ in range(WRITE_ATTEMPTS):
            core, markers, error = job.ops(nonce)
            markers = [m for m in markers if m[1] not in skip]

            def build(tx: Transaction, todo: list[Op] = core + markers) -> None:
                add_ops(tx, todo)

            multi = self.wire.commit(h, build, landed, "claim", job_id,
                                    token(job.epoch, job.version))
            if multi.applied:
                return job_failed(job_id, token(job.epoch, job.version), job.attempt, error)
            trouble = marker_trouble(multi.results, len(core), markers)
            if not trouble.only:
                return None
            skip |= trouble.skip
        return None

    def requeue(self, job_id: str) -> LeaseRecord:
        """See :meth:`ZooKeeperBackend.requeue
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.requeue>`."""
        paths = self.job_paths(job_id)
        skip: set[str] = set()
        for _ in range(WRITE_ATTEMPTS):
            reads: list[Read] = [("barrier", self.base), ("get", paths.job),
                                 ("get", paths.owner), ("get", paths.tag),
                                 ("get", paths.failure)]
            _, job, owner, tag, failure = self.wire.reader_read(reads, "requeue", job_id)
            record = to_record(paths, job, owner, failure)
            if record is None or record.state is not JobState.FAILED:
                state = "unknown" if record is None else record.state.value
                raise InvalidArgument(
                    f"only a FAILED job can be requeued; {job_id!r} is {state}", job_id=job_id
                )
            done = self._requeue_once(paths, job, tag, failure, skip)
            if done:
                return LeaseRecord(job_id, record.owner, None, record.generation,
                                   JobState.AVAILABLE, None, record.attempt, record.error,
                                   None, record.max_attempts)
        raise BackendUnavailable(f"requeue: {job_id!r} kept changing; nothing was applied",
                                 job_id=job_id)

    def _requeue_once(
        self, paths: JobPaths, job: Any, tag: Any, failure: Any, skip: set[str]
    ) -> bool:
        """One multi: the failure znode (not FAILED, attempt base = the attempt now) at
        its version read, a check of the job znode's version, and the open marker made
        again. ``False``: not applied (read again; ``skip`` grows by markers found made)."""
        old = parse_failure(failure, paths.failure)
        assert old is not None
        nonce = new_nonce()
        attempt = parse_job(job[0], paths.job).attempt
        data = dump_failure(Failure(False, old.generation, attempt, 0.0, old.error, nonce))
        core: list[Op] = [("set", paths.failure, data, old.version),
                          ("check", paths.job, b"", job[1].version)]
        markers: list[Op] = []
        if tag is not None:
            queue_tag = QueueTag.parse(tag[0], paths.tag)
            marker = queue_tag.marker(self.queues_base)
            failed = queue_tag.failed(self.queues_base)
            tally = queue_tag.tally(self.queues_base)
            markers = [] if marker in skip else [("create", marker, b"", None)]
            for path in (failed, None if tally is None else tally.failed):
                if path is not None and path not in skip:
                    markers.append(("delete", path, b"", None))

        def build(tx: Any) -> None:
            add_ops(tx, core + markers)

        def landed(deadline: float) -> bool:
            answer = self.wire.read(
                self.wire.reader(), [("barrier", self.base), ("get", paths.failure)],
                deadline, "requeue (reading back)", worker=False, job_id=paths.job_id,
            )[1]
            return written_by(answer, paths.failure, nonce)

        multi = self.wire.reader_commit(build, landed, "requeue", paths.job_id)
        if not multi.applied:
            trouble = marker_trouble(multi.results, len(core), markers)
            skip |= trouble.skip
            for parent in trouble.parents:
                self.wire.ensure_path(self.wire.reader(), parent, "requeue", worker=False)
        return multi.applied
