"""Holding a claimed job: renew, complete, release and fail of one job or a batch, and
:func:`refusal`, the one rule that turns what the store holds for a job into the error
an operation it refused raises. The multis (what each checks and writes, and why the
two checks are exactly "this session holds the job at ``generation``") are told once,
in the package docstring ("How leases map onto ZooKeeper", "Job lifecycle"); the znodes
are in :mod:`._layout`.

What is specific to this module:

* Each claim of a session that the store applied returns a :class:`Hold` as its
  ``ClaimResult.handle`` (the generation, the owner znode and its version, a queued
  job's markers). The core keeps it with the lease and hands it back with every
  operation on that claim; nothing here keeps a table of claims. For a claim whose hold
  this session made (:func:`own_hold`) the multi is sent at once, without reading.
* A claim without such a hold (``handle`` ``None``: not made by this process, or a hold
  of another session, or one already released, completed or found lost) is read first —
  the job znode, the owner znode's stat (its ``ephemeralOwner``), the queue tag and the
  failure znode, after a ``sync``, in one pipelined round trip — and the multi is sent
  only if :func:`refusal` finds this session holding the job at ``generation`` (with
  the owner version and markers read). The same read follows a multi that failed (or
  whose answer was lost and reading back showed it was not applied), to say why:
  StaleLeaseError, SessionExpired, or this session's own completion at this generation
  (a retry, which returns the record). If the read shows the job still held by this
  session at ``generation`` (the owner znode was rewritten by hand), the multi is sent
  again with the owner version read. A queued job's marker deleted by hand is tolerated:
  a multi failing only on it is sent again without it, still without reading. At most
  :data:`WRITE_ATTEMPTS` multis in all.
* ``generation`` is the token, ``epoch * 2**32 + version``: the multis compare the job
  znode's version with its low part (:func:`local`), and the completion record keeps
  both parts; a claim without a hold is checked against the whole token (the job
  znode's version and the epoch its claim recorded).
* Whether a ``fail()`` makes the job FAILED is decided from what the claim read
  (attempt, limit, attempt base: :attr:`Hold.exhausted`), which no one else can change
  while the job is held; the failure znode's versioned write in the same multi would
  fail otherwise. Its lost answer is read back through the failure znode's nonce, a
  completion's through the completion record's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import BackendUnavailable, SessionExpired, StaleLeaseError
from ...record import ClaimResult, JobState, LeaseRecord
from ._layout import (
    Failure,
    JobPaths,
    QueueTag,
    Tally,
    delay_ms,
    dump_completed,
    dump_delayed,
    dump_failure,
    new_nonce,
    parse_failure,
    parse_job,
    split_token,
    to_record,
    written_by,
)
from ._sessions import ZkSession
from ._transport import Read, Wire
from ._transport_multi import Op, Transaction, add_ops, marker_trouble

__all__ = ["WRITE_ATTEMPTS", "Completion", "Hold", "Holds", "completed_record", "local",
           "make_hold", "mark_ended", "own_hold", "refusal"]

WRITE_ATTEMPTS = 4
"""Most multis one complete/release/fail sends: the first (without reading, for a claim
whose hold this session made), then one per failure that reading (or, for a marker
deleted by hand, the failure itself) explained."""


@dataclass(slots=True, eq=False)
class Hold:
    """What one claim of this session made (the ``handle`` of the ``ClaimResult`` the
    claim returned), so that its completion, release and fail need not read it back.

    Attributes:
        session: the session whose claim it is; any other session reads first.
        generation: the claim's token: the job znode's version that claim set, with the
            store epoch it was made in (see :func:`local`).
        owner: the owner znode's path the claim created in the same multi.
        owner_version: its version (0 at creation; ``set_value`` moves it on, see
            :mod:`._jobs_value`).
        held: a queued job's held marker (ephemeral, made with the owner znode).
        open: a queued job's open marker (deleted by the completion, or when FAILED).
        delayed: a queued job's delayed marker path (made by a fail with a delay).
        attempt: this claim's attempt number.
        max_attempts: the job's limit (``None``: unlimited).
        failure: the failure znode as the claim read it (``None``: none yet); nobody
            else writes it while the job is held.
        ended: released, completed, failed, or found no longer held: later calls with
            this claim read first, as for a claim without a hold.
        nonce: the claim's nonce, as its owner znode holds it (``set_value`` keeps it
            there); ``None``: not known without reading the owner znode.
        failed: a queued job's failed marker path (made when the job becomes FAILED;
            ``None``: not queued, or a layout-1 queue).
        tally: a queued job's tally entries (layout 2): held goes with the held marker,
            done is made by the completion, failed with the failed marker.
        exact: ``attempt``, ``max_attempts`` and ``failure`` are what the store holds
            (``False`` for a hold rebuilt without them), so a release may remember them
            (see :mod:`._jobs_known`).
    """

    session: ZkSession = field(repr=False)
    generation: int
    owner: str
    owner_version: int
    held: str | None = None
    open: str | None = None
    delayed: str | None = None
    attempt: int = 0
    max_attempts: int | None = None
    failure: Failure | None = None
    ended: bool = False
    nonce: str | None = None
    failed: str | None = None
    tally: Tally | None = None
    exact: bool = True

    @property
    def exhausted(self) -> bool:
        """This attempt used up the budget (``attempt - base >= max_attempts``)."""
        base = 0 if self.failure is None else self.failure.base
        return self.max_attempts is not None and self.attempt - base >= self.max_attempts


def local(generation: int) -> int:
    """The job znode's version a token stands for (its low 32 bits)."""
    return split_token(generation)[1]


def make_hold(
    h: ZkSession, generation: int, paths: JobPaths, owner_version: int, attempt: int,
    max_attempts: int | None, failure: Failure | None, tag: QueueTag | None,
    queues_base: str, nonce: str | None = None,
) -> Hold:
    """The hold of ``h``'s claim of a job at ``generation``; markers from its queue tag;
    ``nonce``: the claim's, if known."""
    if tag is None:
        return Hold(h, generation, paths.owner, owner_version, attempt=attempt,
                    max_attempts=max_attempts, failure=failure, nonce=nonce)
    return Hold(h, generation, paths.owner, owner_version, tag.held(queues_base),
                tag.marker(queues_base), tag.delayed(queues_base), attempt, max_attempts,
                failure, nonce=nonce, failed=tag.failed(queues_base),
                tally=tag.tally(queues_base))


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


def mark_ended(hold: Hold | None) -> None:
    """Mark ``hold`` (if any) over: later calls with its claim read first."""
    if hold is not None:
        hold.ended = True


def refusal(
    h: ZkSession, paths: JobPaths, generation: int, job: tuple[bytes, Any] | None,
    owner_stat: Any, what: str, failure: tuple[bytes, Any] | None = None,
) -> LeaseRecord | None:
    """The one rule that turns what the store holds for a job (read after an operation it
    refused, or before one sent without a hold) into the error raised: ``None`` if ``h``
    holds the job at ``generation``; the completion record if this session completed it
    at that generation; else raise StaleLeaseError (or SessionExpired if the session is
    the reason)."""
    job_id = paths.job_id
    if job is None:
        h.check_alive()
        raise StaleLeaseError(f"{what}: {job_id!r} does not exist in the store",
                              job_id=job_id, generation=generation)
    parsed = parse_job(job[0], paths.job)
    current = parsed.token(job[1].version)
    if parsed.completed:
        if parsed.session == h.session_id and current == generation:
            return to_record(paths, job, None, failure)
        raise StaleLeaseError(
            f"{what}: {job_id!r} was completed at generation {current}",
            job_id=job_id, generation=generation, current_generation=current,
        )
    if current == generation and owner_stat is not None and owner_stat.ephemeralOwner == h.sid:
        return None
    h.check_alive()
    holder = "nobody" if owner_stat is None else f"session 0x{owner_stat.ephemeralOwner:x}"
    raise StaleLeaseError(
        f"{what}: {job_id!r} is not held by session {h.session_id} at generation "
        f"{generation} (store: generation {current}, held by {holder})",
        job_id=job_id, generation=generation, current_generation=current,
    )


Ops = Callable[[Hold], tuple[list[Op], list[Op]]]
"""What an ending multi sends for a hold: its core operations and its marker ones."""


class Holds:
    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.base = wire.config.base
        self.queues_base = wire.config.queues_base

    def _read_holder(self, h: ZkSession, paths: JobPaths, what: str, synced: bool) -> list[Any]:
        """The job znode, the owner znode's stat, the queue tag (``None`` for a job not
        queued) and the failure znode, in one pipelined round trip (after a ``sync`` if
        ``synced``)."""
        reads: list[Read] = [("sync", self.base)] if synced else []
        reads += [("get", paths.job), ("exists", paths.owner), ("get", paths.tag),
                  ("get", paths.failure)]
        return self.wire.session_read(h, reads, what, paths.job_id)[-4:]

    def renew(self, h: ZkSession, paths: JobPaths, claim: ClaimResult, send: float) -> None:
        """With the claim's hold (see :func:`own_hold`): one multi of two ``check``s, the
        job znode at version == generation and the owner znode at the hold's version
        (while the version is the generation, that owner znode can only be this
        session's: see the module docstring). It changes nothing, but like any write it
        is ordered by the current leader (which thus has the session) and answered once
        the quorum has committed it. Without a hold, or if that multi failed (or its
        answer was lost): after a write barrier, read the job znode (its version, and the
        epoch its claim recorded) and the owner znode's ephemeralOwner in one pipelined
        round trip (and, unless held, once more after a ``sync``, to say why: see
        :func:`refusal`). Raises unless held (and then marks the claim's hold ended: no
        complete/release will follow)."""
        generation = claim.generation
        deadline = send + min(self.wire.config.timeout_s, max(1.0, h.granted_ttl_s))
        hold = own_hold(h, paths, claim)
        if hold is not None and self.wire.checks(
            h, [(paths.job, local(generation)), (paths.owner, hold.owner_version)], deadline,
            "renew",
        ):
            h.check_alive()
            return
        _, job, owner_stat = self.wire.session_read(
            h, [("barrier", self.base), ("get", paths.job), ("exists", paths.owner)],
            "renew", paths.job_id, deadline,
        )
        if (
            job is not None and parse_job(job[0], paths.job).token(job[1].version) == generation
            and owner_stat is not None and owner_stat.ephemeralOwner == h.sid
        ):
            return
        job, owner_stat, _, _ = self._read_holder(h, paths, "renew", synced=True)  # to say why
        try:
            if refusal(h, paths, generation, job, owner_stat, "renew") is not None:
                raise StaleLeaseError(
                    f"renew: {paths.job_id!r} was completed at generation {generation}",
                    job_id=paths.job_id, generation=generation, current_generation=generation,
                )
        except StaleLeaseError:
            mark_ended(own_hold(h, paths, claim))  # final: no complete/release will follow
            raise

    def complete(
        self, h: ZkSession, paths: JobPaths, claim: ClaimResult, result: bytes,
        read_first: bool = False,
    ) -> LeaseRecord:
        """One multi: ``set_data`` of the completion record at version == generation (so
        the version moves on and any claim prepared earlier fails) + ``delete`` of the
        owner znode (+ the markers). Recognises this session's own earlier completion.
        ``read_first``: read the holder before sending even with the claim's hold (a
        multi carrying these operations just failed on them)."""
        try:
            return self._complete(h, paths, claim, result, read_first)
        except SessionExpired as expired:
            # The completion record outlives the session: a retry is still recognised.
            record = self.after_expiry(h, paths, claim.generation, expired, "complete")
            if record is None:
                raise
            return record

    def after_expiry(
        self, h: ZkSession, paths: JobPaths, generation: int, expired: SessionExpired,
        what: str,
    ) -> LeaseRecord | None:
        """Why a call on ``h``'s hold of ``generation`` failed with ``expired`` (this
        session ended: expired, or closed by this process), read on the shared client
        after a write barrier (``h``'s own client can send nothing any more).

        Returns:
            This session's completion record at ``generation``, if the job has one (a
            repeated complete is recognised after the session ended); else ``None``:
            the job is still at ``generation`` and nobody else completed it, so the
            session ending is the reason (the caller re-raises ``expired``).

        Raises:
            StaleLeaseError: another session claimed the job since (a newer generation,
                in ``current_generation``), or completed it: the newer holder is the
                reason (the rule of :meth:`Backend.complete`). Chained to ``expired``.
        """
        try:
            _, job, failure = self.wire.reader_read(
                [("barrier", self.base), ("get", paths.job), ("get", paths.failure)],
                what, paths.job_id)
        except BackendUnavailable:
            return None  # the session's end is still the answer we know
        if job is None:
            return None
        parsed = parse_job(job[0], paths.job)
        current = parsed.token(job[1].version)
        if parsed.completed and parsed.session == h.session_id and current == generation:
            return to_record(paths, job, None, failure)
        if parsed.completed:
            raise StaleLeaseError(
                f"{what}: {paths.job_id!r} was completed at generation {current} (and "
                f"session {h.session_id} has ended)", job_id=paths.job_id,
                generation=generation, current_generation=current,
            ) from expired
        if current != generation:
            raise StaleLeaseError(
                f"{what}: {paths.job_id!r} was claimed again since (store: generation "
                f"{current}; session {h.session_id} has ended)", job_id=paths.job_id,
                generation=generation, current_generation=current,
            ) from expired
        return None

    def _reread(
        self, h: ZkSession, paths: JobPaths, generation: int, what: str
    ) -> LeaseRecord | Hold:
        """Read the holder (after a ``sync``) and check it (see :func:`refusal`, which raises
        unless held): this session's completion record at ``generation`` if it is one, else
        the hold as the store has it (owner version, markers, attempt, failure znode)."""
        job, owner_stat, tag, failure = self._read_holder(h, paths, what, synced=True)
        done = refusal(h, paths, generation, job, owner_stat, what, failure)
        if done is not None:
            return done
        parsed = parse_job(job[0], paths.job)
        queue_tag = None if tag is None else QueueTag.parse(tag[0], paths.tag)
        return make_hold(h, generation, paths, owner_stat.version, parsed.attempt,
                         parsed.max_attempts, parse_failure(failure, paths.failure),
                         queue_tag, self.queues_base)

    def _end(
        self, h: ZkSession, paths: JobPaths, claim: ClaimResult, what: str, ops: Ops,
        landed: Callable[[float], bool], read_first: bool = False,
    ) -> LeaseRecord | tuple[Hold, list[Any]]:
        """The completion, release or fail multi: ``ops(hold)`` (its core operations
        check the generation, and delete the owner znode; then the markers).

        Sent at once from the claim's hold if this session made it (see :func:`own_hold`);
        otherwise, and after it failed for another reason than a marker deleted by hand,
        only once a read showed the job held by this session at ``claim.generation``.
        Returns the hold it was sent for and the results of the multi's core operations
        (empty if its answer was lost and reading back showed it applied), or this
        session's completion record if the job turned out to be completed by this session
        at that generation already. ``read_first``: read even with the claim's hold."""
        job_id, generation = paths.job_id, claim.generation
        hold = own_hold(h, paths, claim)
        # None: not a claim of ours we know (or read_first): check ownership by reading
        current = None if read_first else hold
        skip: set[str] = set()
        for _attempt in range(WRITE_ATTEMPTS):
            if current is None:
                try:
                    reread = self._reread(h, paths, generation, what)
                except StaleLeaseError:
                    mark_ended(hold)  # final: not held at generation any more
                    raise
                if isinstance(reread, LeaseRecord):
                    mark_ended(hold)
                    return reread
                current = reread
            core, markers = ops(current)
            markers = [m for m in markers if m[1] not in skip]

            def build(tx: Transaction, todo: list[Op] = core + markers) -> None:
                add_ops(tx, todo)

            multi = self.wire.commit(h, build, landed, what, job_id, generation)
            if multi.applied:
                mark_ended(hold)
                return current, multi.results[: len(core)]
            trouble = marker_trouble(multi.results, len(core), markers)
            skip |= trouble.skip
            for parent in trouble.parents:
                self.wire.ensure_path(h.client, parent, what)
            if not trouble.only:
                current = None
        raise BackendUnavailable(
            f"{what}: {job_id!r} kept changing under this session; nothing was applied",
            job_id=job_id, generation=generation,
        )

    def _complete(
        self, h: ZkSession, paths: JobPaths, claim: ClaimResult, result: bytes,
        read_first: bool = False,
    ) -> LeaseRecord:
        nonce = new_nonce()  # one per call: at most one of its multis can apply

        def ops(hold: Hold) -> tuple[list[Op], list[Op]]:
            return _completion_ops(h, paths, claim.generation, result, nonce, hold)

        done = self._end(h, paths, claim, "complete", ops,
                         self._completion_landed(h, paths, nonce, "complete"), read_first)
        if isinstance(done, LeaseRecord):
            return done
        return completed_record(h, paths, claim.generation, result, done[0])

    def _completion_landed(
        self, h: ZkSession, paths: JobPaths, nonce: str, what: str
    ) -> Callable[[float], bool]:
        """Reading back a completion multi with ``nonce`` whose answer was lost (after a
        write barrier): whether the job holds that completion record."""

        def landed(deadline: float) -> bool:
            answer = self.wire.read(h.client, [("barrier", self.base), ("get", paths.job)],
                                    deadline, f"{what} (reading back)",
                                    job_id=paths.job_id)[1]
            parsed = None if answer is None else parse_job(answer[0], paths.job)
            return parsed is not None and parsed.completed and parsed.nonce == nonce

        return landed

    def completion(
        self, h: ZkSession, paths: JobPaths, claim: ClaimResult, result: bytes, what: str
    ) -> Completion | None:
        """The operations of :meth:`complete` for ``claim``, to be sent in a multi of
        the caller's (``complete_and_claim_next``), and how to read back its lost answer;
        ``None`` unless the claim carries its hold (see :func:`own_hold`): such a claim
        is read first, by :meth:`complete`."""
        hold = own_hold(h, paths, claim)
        if hold is None:
            return None
        nonce = new_nonce()
        core, markers = _completion_ops(h, paths, claim.generation, result, nonce, hold)
        return Completion(hold, core, markers, self._completion_landed(h, paths, nonce, what))

    def _end_batch(
        self, h: ZkSession, items: list[tuple[JobPaths, ClaimResult]],
        ops: Callable[[int, Hold], tuple[list[Op], list[Op]]],
        landed: Callable[[float], bool], what: str,
    ) -> tuple[list[Hold], list[list[Any]]] | None:
        """End every item's hold in **one multi**: ``ops(i, hold)`` for each item, sent
        from the holds this session's claims made. Returns the holds and each item's
        core results (all empty if the answer was lost and ``landed``, reading back the
        first item, showed the multi applied: it applied whole or not at all), or
        ``None`` when the multi applied nothing (an item not held at its generation, a
        marker missing, or an item whose hold this process does not know): the caller
        then ends each item alone, which finds each one's own outcome."""
        holds: list[Hold] = []
        for paths, claim in items:
            hold = own_hold(h, paths, claim)
            if hold is None:
                return None
            holds.append(hold)
        todo: list[Op] = []
        spans: list[tuple[int, int]] = []
        for i, hold in enumerate(holds):
            core, markers = ops(i, hold)
            spans.append((len(todo), len(todo) + len(core)))
            todo += core + markers

        def build(tx: Transaction) -> None:
            add_ops(tx, todo)

        first, claim = items[0]
        multi = self.wire.commit(h, build, landed, what, first.job_id, claim.generation)
        if not multi.applied:
            return None
        for hold in holds:
            mark_ended(hold)
        return holds, [multi.results[a:b] for a, b in spans]

    def complete_batch(
        self, h: ZkSession, items: list[tuple[JobPaths, ClaimResult, bytes]]
    ) -> list[LeaseRecord] | None:
        """Complete every item in **one multi** (see :meth:`_end_batch`): for each, the
        operations of :meth:`complete` (``set_data`` of the completion record at version
        == generation, ``delete`` of the owner znode, the markers). Returns the records,
        or ``None`` when the multi applied nothing. A lost answer is settled by reading
        back the first job's record (one nonce for the whole multi)."""
        nonce = new_nonce()

        def ops(i: int, hold: Hold) -> tuple[list[Op], list[Op]]:
            paths, claim, result = items[i]
            return _completion_ops(h, paths, claim.generation, result, nonce, hold)

        done = self._end_batch(
            h, [(paths, claim) for paths, claim, _ in items], ops,
            self._completion_landed(h, items[0][0], nonce, "complete_many"), "complete_many")
        if done is None:
            return None
        return [completed_record(h, paths, claim.generation, result, hold)
                for (paths, claim, result), hold in zip(items, done[0], strict=True)]

    def release_batch(
        self, h: ZkSession, items: list[tuple[JobPaths, ClaimResult]]
    ) -> list[Hold | None] | None:
        """Release every item in **one multi** (see :meth:`_end_batch`): for each, the
        operations of :meth:`release` (``check`` of the job znode's version ==
        generation, versioned ``delete`` of the owner znode, the held marker's).
        Returns each hold released (all ``None`` if the answer was lost and reading back
        the first item's owner znode showed the multi applied), or ``None`` when the
        multi applied nothing."""

        def ops(i: int, hold: Hold) -> tuple[list[Op], list[Op]]:
            paths, claim = items[i]
            return _release_ops(paths, claim.generation, hold)

        done = self._end_batch(h, items, ops,
                               self._release_landed(h, items[0][0], "release_many"),
                               "release_many")
        if done is None:
            return None
        holds, results = done
        return [hold if core else None for hold, core in zip(holds, results, strict=True)]

    def fail_batch(
        self, h: ZkSession, items: list[tuple[JobPaths, ClaimResult, str, float]]
    ) -> list[LeaseRecord] | None:
        """Fail every item in **one multi** (see :meth:`_end_batch`): for each, the
        operations of :meth:`fail` (``check`` of the job znode's version == generation,
        versioned ``delete`` of the owner znode, the failure znode's versioned write,
        the markers), with one nonce. Returns the records after it, or ``None`` when the
        multi applied nothing. A lost answer is settled by reading back the first job's
        failure znode; its mtime is every item's (one transaction, one time)."""
        nonce = new_nonce()
        written: list[Any] = []

        def ops(i: int, hold: Hold) -> tuple[list[Op], list[Op]]:
            paths, _, error, retry_in_s = items[i]
            return _fail_ops(paths, hold, error, retry_in_s, nonce)

        done = self._end_batch(
            h, [(paths, claim) for paths, claim, _, _ in items], ops,
            self._fail_landed(h, items[0][0], nonce, written, "fail_many"), "fail_many")
        if done is None:
            return None
        return [
            _failed_record(h, paths, claim.generation, hold, error, retry_in_s,
                           core[-1] if core else written[-1])
            for (paths, claim, error, retry_in_s), hold, core
            in zip(items, done[0], done[1], strict=True)
        ]

    def _release_landed(self, h: ZkSession, paths: JobPaths, what: str) -> Callable[[float], bool]:
        """Reading back a release multi whose answer was lost (after a write barrier):
        whether the owner znode is no longer this session's."""

        def landed(deadline: float) -> bool:
            owner = self.wire.read(h.client, [("barrier", self.base), ("exists", paths.owner)],
                                   deadline, f"{what} (reading back)", job_id=paths.job_id)[1]
            return owner is None or owner.ephemeralOwner != h.sid

        return landed

    def _fail_landed(
        self, h: ZkSession, paths: JobPaths, nonce: str, written: list[Any], what: str
    ) -> Callable[[float], bool]:
        """Reading back a fail multi with ``nonce`` whose answer was lost (after a write
        barrier): whether the failure znode holds that write (its stat is then appended
        to ``written``)."""

        def landed(deadline: float) -> bool:
            answer = self.wire.read(h.client, [("barrier", self.base), ("get", paths.failure)],
                                    deadline, f"{what} (reading back)", job_id=paths.job_id)[1]
            if not written_by(answer, paths.failure, nonce):
                return False
            written.append(answer[1])
            return True

        return landed

    def release(self, h: ZkSession, paths: JobPaths, claim: ClaimResult) -> Hold | None:
        """One multi: ``check`` version == generation + ``delete`` of the owner znode
        (and of a queued job's held marker). Returns the hold released (``None`` if its
        answer was lost and reading back showed it applied: what the job holds is then
        not known exactly)."""
        job_id, generation = paths.job_id, claim.generation

        def ops(hold: Hold) -> tuple[list[Op], list[Op]]:
            return _release_ops(paths, generation, hold)

        done = self._end(h, paths, claim, "release", ops,
                         self._release_landed(h, paths, "release"))
        if isinstance(done, LeaseRecord):
            raise StaleLeaseError(f"release: {job_id!r} is completed", job_id=job_id,
                                  generation=generation, current_generation=generation)
        return done[0] if done[1] else None

    def fail(
        self, h: ZkSession, paths: JobPaths, claim: ClaimResult, error: str, retry_in_s: float
    ) -> LeaseRecord:
        """One multi (see the module docstring): end the hold and write the failure znode
        (FAILED if this attempt used up the budget, else the retry delay, which runs from
        this write's mtime on the store's clock). Returns the record after it."""
        job_id, generation = paths.job_id, claim.generation
        nonce = new_nonce()  # one per call: at most one of its multis can apply
        written: list[Any] = []  # the failure znode's stat, however it became known

        def ops(hold: Hold) -> tuple[list[Op], list[Op]]:
            return _fail_ops(paths, hold, error, retry_in_s, nonce)

        done = self._end(h, paths, claim, "fail", ops,
                         self._fail_landed(h, paths, nonce, written, "fail"))
        if isinstance(done, LeaseRecord):
            raise StaleLeaseError(f"fail: {job_id!r} is completed", job_id=job_id,
                                  generation=generation, current_generation=generation)
        hold, results = done
        stat = results[-1] if results else written[-1]  # the failure znode's write
        return _failed_record(h, paths, generation, hold, error, retry_in_s, stat)


@dataclass(slots=True)
class Completion:
    """A completion about to be sent in a caller's multi (see :meth:`Holds.completion`).

    Attributes:
        hold: the claim's hold it ends (mark it ended once the multi applied).
        core: its core operations (the completion record's versioned ``set_data``,
            the owner znode's versioned ``delete``), first in the multi.
        markers: its marker operations, right after ``core``.
        landed: reads back a lost answer: whether the completion record is the job's.
    """

    hold: Hold
    core: list[Op]
    markers: list[Op]
    landed: Callable[[float], bool]


def completed_record(
    h: ZkSession, paths: JobPaths, generation: int, result: bytes, hold: Hold
) -> LeaseRecord:
    """The COMPLETED record of ``hold``'s completion with ``result`` at ``generation``."""
    return LeaseRecord(
        paths.job_id, h.owner, None, generation, JobState.COMPLETED, result, hold.attempt,
        None if hold.failure is None else hold.failure.error, None, hold.max_attempts,
    )


def _completion_ops(
    h: ZkSession, paths: JobPaths, generation: int, result: bytes, nonce: str, hold: Hold
) -> tuple[list[Op], list[Op]]:
    """The completion multi of ``hold`` at ``generation``: core, markers."""
    epoch, version = split_token(generation)
    data = dump_completed(h.owner, h.session_id, version, nonce, result, hold.attempt,
                          hold.max_attempts, epoch)
    core: list[Op] = [("set", paths.job, data, version),
                      ("delete", paths.owner, b"", hold.owner_version)]
    markers = _deletes(hold.held, hold.open)
    if hold.tally is not None:
        markers += [("delete", hold.tally.held, b"", None),
                    ("create", hold.tally.done, b"", None)]
    return core, markers


def _release_ops(paths: JobPaths, generation: int, hold: Hold) -> tuple[list[Op], list[Op]]:
    """The release multi of ``hold`` at ``generation``: core, markers."""
    core: list[Op] = [("check", paths.job, b"", local(generation)),
                      ("delete", paths.owner, b"", hold.owner_version)]
    return core, _deletes(hold.held, None if hold.tally is None else hold.tally.held)


def _failed_record(
    h: ZkSession, paths: JobPaths, generation: int, hold: Hold, error: str,
    retry_in_s: float, stat: Any,
) -> LeaseRecord:
    """The record after ``hold``'s failure with ``error``, whose failure znode write has
    ``stat`` (its mtime starts the retry delay, store clock)."""
    failed = hold.exhausted
    not_before = (stat.mtime + delay_ms(retry_in_s)) / 1000 \
        if not failed and retry_in_s > 0 else None
    return LeaseRecord(
        paths.job_id, h.owner, None, generation,
        JobState.FAILED if failed else JobState.AVAILABLE, None, hold.attempt, error,
        not_before, hold.max_attempts,
    )


def _deletes(*markers: str | None) -> list[Op]:
    return [("delete", m, b"", None) for m in markers if m is not None]


def _fail_ops(
    paths: JobPaths, hold: Hold, error: str, retry_in_s: float, nonce: str
) -> tuple[list[Op], list[Op]]:
    """The fail multi for ``hold``: core (the last one writes the failure znode), markers."""
    failed = hold.exhausted
    base = 0 if hold.failure is None else hold.failure.base
    version = local(hold.generation)
    data = dump_failure(Failure(failed, version, base, 0.0 if failed else retry_in_s, error,
                                nonce))
    core: list[Op] = [("check", paths.job, b"", version),
                      ("delete", paths.owner, b"", hold.owner_version)]
    if hold.failure is None:
        core += [("create", paths.failure, b"", None), ("set", paths.failure, data, 0)]
    else:
        core.append(("set", paths.failure, data, hold.failure.version))
    markers = _deletes(hold.held, None if hold.tally is None else hold.tally.held)
    if failed:
        markers += _deletes(hold.open)  # a FAILED job leaves the queue's listings
        if hold.failed is not None:  # and is counted among the bucket's failed
            markers.append(("create", hold.failed, b"", None))
        if hold.tally is not None:  # and the queue's
            markers.append(("create", hold.tally.failed, b"", None))
    elif retry_in_s > 0 and hold.delayed is not None:
        markers.append(("create", hold.delayed, dump_delayed(retry_in_s), None))
    return core, markers
