"""Jobs on the PostgreSQL store: claim, renew, complete, release, fail, requeue and
``set_value`` of one job or a batch, and reading them (what each statement is and why it
is safe: the package docstring, :mod:`consensus_lease.backends.postgresql`; the
statements: :mod:`._layout_sql`).

:func:`refusal` is the one rule that turns an owner + generation compare the store
refused into the :class:`~consensus_lease.errors.LeaseError` raised; a claim that did not
apply is explained by :func:`_claim_refusal` (completed, FAILED, the session over).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..._election import ELECTION_PREFIX, is_election_key
from ..._epoch import compose, split
from ...backend import Backend, CompleteItem, FailItem, ReleaseItem, SessionHandle
from ...errors import (
    BackendUnavailable,
    InvalidArgument,
    JobCompleted,
    JobFailed,
    LeaseError,
    StaleLeaseError,
    StoreRegressed,
)
from ...record import ClaimResult, JobState, LeaseRecord
from .._groups import size_groups
from .._sql_row import requeued
from . import _config, _tokens
from ._config import MAX_BATCH_CLAIM
from ._layout import to_record
from ._transport import unless_locked

if TYPE_CHECKING:
    import psycopg

    from .driver import PostgresBackend

__all__ = [
    "byte_groups", "claim", "claim_many", "complete", "complete_many", "completed_record", "fail",
    "fail_many", "get", "records", "refusal", "refused_completion", "release",
    "release_many", "renew", "requeue", "set_value",
]

Row = tuple[Any, ...]


def _params(b: PostgresBackend, session: SessionHandle, job_id: str,
            claim: ClaimResult | None = None, **more: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"job": job_id, "sid": session.session_id,
                              "owner": session.owner, "chan": b.names.channel}
    if claim is not None:
        params["epoch"], params["gen"] = split(claim.generation, b.epoch_shift)
    params.update(more)
    return params


def refusal(b: PostgresBackend, session: SessionHandle, job_id: str,
            generation: int) -> LeaseError:
    """Why an owner + generation compare failed (one read after it; one more when the
    session is not alive: why, :func:`._tokens.expired`)."""
    found = b.client.one(
        f"SELECT j.generation, j.session_id, j.completed_at, j.epoch, {b.sql.my_alive} "
        f"FROM (SELECT 1) one LEFT JOIN {b.names.jobs} j ON j.job_id = %(job)s",
        {"job": job_id, "sid": session.session_id}, job_id,
    )
    assert found is not None  # the statement always returns its one row
    # The session not alive (here): a failover tells first.
    expired = None if found[4] else _tokens.expired(b, session.session_id, job_id,
                                                    generation)
    if isinstance(expired, StoreRegressed):
        return expired
    row = None if found[0] is None else found
    current = None if row is None else compose(int(row[3]), int(row[0]), b.epoch_shift)
    # At the lease's generation with no other holder (this session's, or released:
    # a claim since would have a newer generation) and the session over: its end is
    # why (the rule of Backend.complete).
    if (row is not None and row[1] in (session.session_id, None) and row[2] is None
            and current == generation and expired is not None):
        return expired
    what = "completed" if row is not None and row[2] is not None else "held or released"
    return StaleLeaseError(
        f"{job_id!r} is not held by session {session.session_id} at generation "
        f"{generation}: the store has generation {current} ({what})",
        job_id=job_id, generation=generation, current_generation=current,
    )


def _held_now(b: PostgresBackend, session: SessionHandle, job_id: str,
              claim: ClaimResult) -> bool:
    row = b.client.one(f"SELECT 1 FROM {b.names.jobs} j WHERE {b.sql.held}",
                       _params(b, session, job_id, claim), job_id)
    return row is not None


def claim(b: PostgresBackend, session: SessionHandle, job_id: str) -> ClaimResult | None:
    """Claim ``job_id`` (see :meth:`Backend.claim`): one statement when it applies; the
    token carries the epoch read in it. A claim that did not apply costs one more
    statement, which tells why and fails a job whose attempts are used up
    (:func:`_claim_refusal`). A lost answer is settled by reading the row back (held by
    this session: it was applied). A job row locked by an open ``lease.transaction`` for
    longer than the connections' ``lock_timeout`` (:meth:`Client.lock_wait_ms`) is
    reported as held (``None``): a waiting claim tries again when woken.

    Raises:
        JobCompleted / JobFailed / SessionExpired / BackendUnavailable.
    """
    election = is_election_key(job_id)
    sql = b.sql.claim_notify if election else b.sql.claim
    # Built here, not by _params (W1's hot path); chan is for an election's notify. Rows
    # in binary: no number formatting on the server, no parsing here.
    params = {"job": job_id, "sid": session.session_id, "owner": session.owner,
              "chan": b.names.channel}

    def run(c: psycopg.Connection[Row]) -> Row | None:
        # () when the row is locked (an open lease.transaction): held
        return unless_locked(b.client.cursor(c), sql, params, (), binary=True)

    def settle() -> Row | None:
        row = b.client.one(
            f"SELECT j.generation, j.attempt, j.epoch, s.expires_at FROM {b.names.jobs} "
            f"j JOIN {b.names.sessions} s ON s.session_id = j.session_id "
            "WHERE j.job_id = %(job)s AND j.session_id = %(sid)s", params, job_id)
        if row is not None:
            return row  # it was applied
        return b.client.write(job_id, run)  # it was not: once more

    row = b.client.write(job_id, run, settle)
    if row == ():
        return None
    if row is not None:
        if election:
            b.wake_subscribers()
        return ClaimResult(compose(int(row[2]), int(row[0]), b.epoch_shift),
                           float(row[3]), int(row[1]))
    refused = _claim_refusal(b, session, job_id)
    if refused is not None:
        raise refused
    return None


def _claim_rows(b: PostgresBackend, session: SessionHandle, ids: list[str]) -> list[Row] | None:
    """The rows of the ``claim_many`` statement; ``None``: rolled back (a row locked by a
    ``lease.transaction``, or a deadlock with a concurrent ``close_session``)."""
    params = {"jobs": ids, "sid": session.session_id, "owner": session.owner}
    sql = b.sql.claim_many

    def run(c: psycopg.Connection[Row]) -> list[Row] | None:
        # Prepared at its first run (psycopg waits for prepare_threshold runs): the
        # statement is long, its parse a good part of a batch's time. Binary rows: no
        # text to parse for the 128 x 6 values of a full batch. None: rolled back.
        return unless_locked(
            b.client.cursor(c), sql, params, None, fetch_all=True, deadlock=True,
            prepare=c.prepare_threshold is not None or None, binary=True)

    def settle() -> list[Row] | None:
        rows = b.client.read(b.sql.claimed_many, params, ids[0])
        if rows:  # it was applied (the session alive then)
            return [(*r, True) for r in rows]
        return b.client.write(ids[0], run)  # it was not: once more

    return b.client.write(ids[0], run, settle)


def claim_many(
    b: PostgresBackend, session: SessionHandle, job_ids: Sequence[str]
) -> list[ClaimResult | None]:
    """Claim each of ``job_ids`` (distinct, at most ``capabilities.max_batch_claim``)
    in **one statement** (one round trip, one transaction; one read more when the
    session is found not alive: why): for each id the claim of :func:`claim` (own
    generation +1, attempt counted, epoch read in it), then the jobs whose attempts are
    used up and which nobody holds are marked FAILED, as :func:`claim`'s refusal does.
    Element ``i`` answers ``job_ids[i]``: a ``ClaimResult``, or ``None`` (held
    elsewhere, delayed, completed or FAILED). The job rows are locked in job-id order,
    so concurrent batches do not deadlock on them. A lost answer is settled by reading
    back which of the ids this session now holds (none: the statement did not apply,
    and runs once more).

    Batches with an election key, and a batch that meets a job row locked by an
    open ``lease.transaction`` (``lock_timeout``) or a deadlock with a concurrent
    ``close_session``, are claimed one job at a time by :func:`claim` (the same
    answers; a round trip per job, two for a job that is not claimed).

    Raises:
        InvalidArgument: duplicate ids; nothing is claimed.
        SessionExpired: the session is not alive in the store; nothing is claimed.
        BackendUnavailable / OutcomeUnknown: as :func:`claim`.
    """
    ids = list(job_ids)
    if not ids:
        return []
    if len(set(ids)) != len(ids):
        raise InvalidArgument("claim_many: job_ids contains duplicates")
    if len(ids) > MAX_BATCH_CLAIM:
        raise InvalidArgument(
            f"claim_many: at most {MAX_BATCH_CLAIM} job ids per call, got {len(ids)}"
        )
    if any(is_election_key(j) for j in ids):
        return Backend.claim_many(b, session, ids)
    rows = _claim_rows(b, session, ids)
    if rows is None:
        return Backend.claim_many(b, session, ids)
    got: dict[str, ClaimResult] = {}
    for row in rows:
        if row[0] is not None:
            got[row[0]] = ClaimResult(compose(int(row[3]), int(row[1]), b.epoch_shift),
                                      float(row[4]), int(row[2]))
    if not got and rows and not rows[0][5]:
        raise _tokens.expired(b, session.session_id, ids[0])
    return [got.get(j) for j in ids]


def _claim_refusal(b: PostgresBackend, session: SessionHandle,
                   job_id: str) -> LeaseError | None:
    """After a claim did not apply: SessionExpired, JobCompleted or JobFailed if that
    is why (else ``None``); first moves a job whose attempts are used up, and which
    nobody holds, to FAILED (one statement)."""
    params = {"job": job_id, "sid": session.session_id}

    def run(c: psycopg.Connection[Row]) -> Row | None:
        # None: an exhausted job locked by an open lease.transaction: held
        return unless_locked(c.cursor(), b.sql.refusal, params, None)

    row = b.client.write(job_id, run, lambda: None)
    if row is None:
        return None
    local, completed_at, failed_at, attempt, error, epoch, alive = row
    if not alive:
        return _tokens.expired(b, session.session_id, job_id)
    if local is None:
        return None
    generation = compose(int(epoch), int(local), b.epoch_shift)
    if completed_at is not None:
        return JobCompleted(f"{job_id!r} was completed at generation {generation}",
                            job_id=job_id, generation=generation)
    if failed_at is not None:
        return JobFailed(f"{job_id!r} FAILED after {attempt} attempt(s): {error}",
                         job_id=job_id, generation=generation, attempt=int(attempt),
                         error=error)
    return None


def renew(b: PostgresBackend, session: SessionHandle, job_id: str,
          claim: ClaimResult) -> float:
    """One ``UPDATE`` of the session's row, applied only while it holds the job at this
    generation; the TTL granted."""
    params = _params(b, session, job_id, claim)
    row = b.client.one(b.sql.renew, params, job_id)  # idempotent: read() retries once
    if row is None:
        raise refusal(b, session, job_id, claim.generation)
    return float(row[0])


def completed_record(job_id: str, claim: ClaimResult, result: bytes,
                     row: Sequence[Any]) -> LeaseRecord:
    """The COMPLETED record from what the completion returned (owner, attempt,
    error, max_attempts) and what the caller knows."""
    owner, attempt, error, max_attempts = row
    return LeaseRecord(
        job_id=job_id, owner=owner, lease_until=None, generation=claim.generation,
        state=JobState.COMPLETED, result=bytes(result), attempt=int(attempt),
        error=error, not_before=None,
        max_attempts=None if max_attempts is None else int(max_attempts), value=None,
    )


def refused_completion(b: PostgresBackend, session: SessionHandle, job_id: str,
                       claim: ClaimResult) -> LeaseRecord | LeaseError:
    """A completion that did not apply: this session's earlier completion at this
    generation (a repeat: its record), else why not (:func:`refusal`)."""
    epoch, gen = split(claim.generation, b.epoch_shift)
    params = {"job": job_id, "sid": session.session_id, "gen": gen, "epoch": epoch}
    if b.client.one(b.sql.completed_by_me, params, job_id) is None:
        return refusal(b, session, job_id, claim.generation)
    record = get(b, job_id)
    assert record is not None
    return record


def complete(b: PostgresBackend, session: SessionHandle, job_id: str, claim: ClaimResult,
             result: bytes) -> LeaseRecord:
    """One ``UPDATE`` (owner + generation compare, the session alive), no notification;
    a refused one is read again (:func:`refused_completion`)."""
    epoch, gen = split(claim.generation, b.epoch_shift)
    params = {"job": job_id, "sid": session.session_id, "gen": gen, "epoch": epoch,
              "result": result}

    def run(c: psycopg.Connection[Row]) -> Row | None:
        return b.client.cursor(c).execute(b.sql.complete, params, binary=True).fetchone()

    # A lost answer: once more on another connection (a repeat finds its own
    # completion below, so the result is applied at most once).
    row = b.client.write(job_id, run, lambda: b.client.write(job_id, run))
    b.wake_subscribers()
    if row is not None:  # the COMPLETED record: what the statement returns + ours
        return completed_record(job_id, claim, result, row)
    outcome = refused_completion(b, session, job_id, claim)
    if isinstance(outcome, LeaseError):
        raise outcome
    return outcome  # a repeat of this session's completion


_G = TypeVar("_G", bound=tuple[Any, ...])
_O = TypeVar("_O")
_T = TypeVar("_T")


def byte_groups(items: Sequence[_T], cost: Callable[[_T], int]) -> list[list[_T]]:
    """``items`` in order, cut into groups of at most :data:`._config.MAX_BATCH_BYTES`
    (``cost(item)`` bytes each); an item larger than that is a group of its own."""
    return size_groups(items, cost, _config.MAX_BATCH_BYTES)


def _by_bytes(items: Sequence[_G], cost: Callable[[_G], int],
              run: Callable[[Sequence[_G]], list[_O]]) -> list[_O | LeaseError]:
    """``run(group)`` (one batch statement) for each group of :func:`byte_groups`, the
    outcomes in the items' order. One group: what ``run`` raises is raised. More: a
    group that raises ``BackendUnavailable`` / ``OutcomeUnknown`` has that error as each
    of its items' outcome, and the groups after it are not sent (each of their items a
    ``BackendUnavailable``: nothing applied, still held), so an unreachable server costs
    one timeout, not one per group."""
    groups = byte_groups(items, cost)
    if len(groups) == 1:
        return list(run(groups[0]))
    outcomes: list[_O | LeaseError] = []
    for k, group in enumerate(groups):
        try:
            outcomes.extend(run(group))
        except BackendUnavailable as exc:
            outcomes.extend([exc] * len(group))
            outcomes.extend(
                BackendUnavailable(
                    f"not sent: an earlier statement of the same batch failed ({exc}); "
                    "nothing applied", job_id=item[0])
                for later in groups[k + 1:] for item in later)
            break
    return outcomes


def _text_bytes(text: str) -> int:
    """``text``'s length in UTF-8 (its length when ASCII, without encoding it)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def complete_many(
    b: PostgresBackend, session: SessionHandle, items: Sequence[CompleteItem]
) -> list[LeaseRecord | LeaseError]:
    """Every item's completion (the compare and write of :func:`complete`) in **one
    statement** per up to :data:`._config.MAX_BATCH_BYTES` of results (one round trip,
    one transaction, when every item applies; at most ``max_complete_batch`` items; the
    rows locked in job-id order; :func:`_by_bytes`): each item its own outcome. A batch
    that meets a row locked by an open ``lease.transaction`` (``lock_timeout``) or a
    deadlock is completed one job at a time by :func:`complete`. Only refused items are
    read again, each alone (a repeat of this session's completion, or why not:
    :func:`refused_completion`). A lost answer is settled by reading back which items
    this session completed; none: the statement did not apply and runs once more.

    Raises:
        BackendUnavailable / OutcomeUnknown: nothing known to be applied (one statement;
            with several, a statement's error is each of its items' outcome).
    """
    if not items:
        return []
    return _by_bytes(items, lambda it: len(it[2]),
                     lambda group: _complete_statement(b, session, group))


def _complete_statement(
    b: PostgresBackend, session: SessionHandle, items: Sequence[CompleteItem]
) -> list[LeaseRecord | LeaseError]:
    """One ``complete_many`` statement on ``items`` (see :func:`complete_many`)."""
    ids = [it[0] for it in items]
    splits = [split(it[1].generation, b.epoch_shift) for it in items]
    params = {"jobs": ids, "gens": [g for _, g in splits],
              "epochs": [e for e, _ in splits], "results": [it[2] for it in items],
              "sid": session.session_id}

    def run(c: psycopg.Connection[Row]) -> list[Row] | None:
        # None: rolled back (a lock not granted, or a deadlock): one at a time below
        return unless_locked(
            b.client.cursor(c), b.sql.complete_many, params, None, fetch_all=True,
            deadlock=True, binary=True)

    def settle() -> list[Row] | None:
        if not b.client.read(b.sql.completed_many_by_me, params, ids[0]):
            return b.client.write(ids[0], run)  # it was not applied: once more
        return []  # each item read again below

    rows = b.client.write(ids[0], run, settle)
    if rows is None:  # a row locked by a lease.transaction, or a deadlock
        return Backend.complete_many(b, session, items)
    b.wake_subscribers()
    done = {row[0]: row for row in rows}  # a row per item that applied
    outcomes: list[LeaseRecord | LeaseError] = []
    for job_id, claim, result in items:
        row = done.get(job_id)
        if row is not None:
            outcomes.append(completed_record(job_id, claim, result, row[1:5]))
        else:
            outcomes.append(refused_completion(b, session, job_id, claim))
    return outcomes


def release(b: PostgresBackend, session: SessionHandle, job_id: str,
            claim: ClaimResult) -> None:
    """One ``UPDATE`` with the owner + generation compare, notifying."""
    params = _params(b, session, job_id, claim)

    def run(c: psycopg.Connection[Row]) -> Row | None:
        return c.execute(b.sql.release, params).fetchone()

    def settle() -> Row | None:
        if _held_now(b, session, job_id, claim):  # not applied: once more
            return b.client.write(job_id, run)
        return (1,)  # not held by us any more: released (or lost), either way ended

    row = b.client.write(job_id, run, settle)
    if row is None:
        raise refusal(b, session, job_id, claim.generation)
    b.wake_subscribers()


def _batch_params(b: PostgresBackend, session: SessionHandle,
                  items: Sequence[tuple[Any, ...]], **more: Any) -> dict[str, Any]:
    """The parameters of a batch statement on ``items`` (``(job_id, claim, ...)``)."""
    splits = [split(it[1].generation, b.epoch_shift) for it in items]
    return {"jobs": [it[0] for it in items], "gens": [g for _, g in splits],
            "epochs": [e for e, _ in splits], "sid": session.session_id,
            "chan": b.names.channel, **more}


def _run_batch(b: PostgresBackend, sql: str, params: dict[str, Any],
               lost: Callable[[], list[Row] | None]) -> list[Row] | None:
    """``sql`` (a batch statement) in one round trip: its rows, ``None`` when rolled back
    (a row locked by a ``lease.transaction``, or a deadlock); a lost answer settled by
    ``lost()`` when this session still holds none of the items at their generation
    (the statement applied, or held none of them), else run once more."""
    first = params["jobs"][0]

    def run(c: psycopg.Connection[Row]) -> list[Row] | None:
        return unless_locked(b.client.cursor(c), sql, params, None, fetch_all=True,
                             deadlock=True, binary=True)

    def settle() -> list[Row] | None:
        if b.client.read(b.sql.held_many, params, first):
            return b.client.write(first, run)  # it was not applied: once more
        return lost()

    return b.client.write(first, run, settle)


def release_many(
    b: PostgresBackend, session: SessionHandle, items: Sequence[ReleaseItem]
) -> list[LeaseError | None]:
    """Every item's release (the compare and write of :func:`release`) in **one
    statement** (one round trip, one transaction, one notification; at most
    ``max_end_batch`` items; the rows locked in job-id order): each item its own
    outcome, a refused one explained by :func:`refusal` (one read each). A batch that
    meets a row locked by an open ``lease.transaction`` (``lock_timeout``) or a deadlock
    is released one job at a time by :func:`release`. A lost answer is settled by
    reading back which items this session still holds: some, the statement did not
    apply and runs once more; none, every item is taken as released, as
    :func:`release` settles (not held by this session any more: ended either way).

    Raises:
        BackendUnavailable / OutcomeUnknown: nothing known to be applied.
    """
    if not items:
        return []
    params = _batch_params(b, session, items)
    rows = _run_batch(b, b.sql.release_many, params,
                      lambda: [(j,) for j in params["jobs"]])
    if rows is None:  # a row locked by a lease.transaction, or a deadlock
        return Backend.release_many(b, session, items)
    b.wake_subscribers()
    released = {row[0] for row in rows}  # a row per item that applied
    return [None if job_id in released else refusal(b, session, job_id, claim.generation)
            for job_id, claim in items]


def fail_many(
    b: PostgresBackend, session: SessionHandle, items: Sequence[FailItem]
) -> list[LeaseRecord | LeaseError]:
    """Every item's failure (the compare and write of :func:`fail`, each with its own
    error and retry delay) in **one statement** per up to :data:`._config.MAX_BATCH_BYTES`
    of error texts (:func:`_by_bytes`), returning each record (one round trip,
    one transaction, one notification, where :func:`fail` reads the record in a
    second; at most ``max_end_batch`` items; the rows locked in job-id order): each item
    its own outcome, a refused one explained by :func:`refusal`. A batch that meets a
    row locked by an open ``lease.transaction`` or a deadlock is failed one job at a
    time by :func:`fail`. A lost answer is settled by reading back which items this
    session still holds (some: not applied, once more); none: each item is read again,
    as :func:`fail` settles (its failure is there: its record; else why not).

    Raises:
        BackendUnavailable / OutcomeUnknown: nothing known to be applied (one statement;
            with several, a statement's error is each of its items' outcome).
    """
    if not items:
        return []
    return _by_bytes(items, lambda it: _text_bytes(it[2]),
                     lambda group: _fail_statement(b, session, group))


def _fail_statement(
    b: PostgresBackend, session: SessionHandle, items: Sequence[FailItem]
) -> list[LeaseRecord | LeaseError]:
    """One ``fail_many`` statement on ``items`` (see :func:`fail_many`)."""
    params = _batch_params(b, session, items, errors=[it[2] for it in items],
                           retries=[float(it[3]) for it in items])
    lost = False

    def each_read_below() -> list[Row]:
        nonlocal lost
        lost = True
        return []

    rows = _run_batch(b, b.sql.fail_many, params, each_read_below)
    if rows is None:  # a row locked by a lease.transaction, or a deadlock
        return Backend.fail_many(b, session, items)
    b.wake_subscribers()
    failed = {row[0]: row for row in rows}  # a row per item that applied: its record
    outcomes: list[LeaseRecord | LeaseError] = []
    for job_id, claim, error, _ in items:
        row = failed.get(job_id)
        if row is not None:
            outcomes.append(to_record(row[:14], b.epoch_shift))
        elif lost:
            outcomes.append(_settled_failure(b, session, job_id, claim, error))
        else:
            outcomes.append(refusal(b, session, job_id, claim.generation))
    return outcomes


def _settled_failure(b: PostgresBackend, session: SessionHandle, job_id: str,
                     claim: ClaimResult, error: str) -> LeaseRecord | LeaseError:
    """After a lost answer of :func:`fail_many`: the item's failure is in the store (its
    record, as :func:`fail` settles) or it was refused (:func:`refusal`)."""
    epoch, gen = split(claim.generation, b.epoch_shift)
    params = {"job": job_id, "gen": gen, "epoch": epoch, "error": error}
    if b.client.one(b.sql.failed_by_me, params, job_id) is None:
        return refusal(b, session, job_id, claim.generation)
    record = get(b, job_id)
    assert record is not None
    return record


def set_value(b: PostgresBackend, session: SessionHandle, job_id: str, claim: ClaimResult,
              value: bytes) -> None:
    """Write an election leader's value: one ``UPDATE`` with the owner + generation
    compare of ``release`` (see :meth:`Backend.set_value`).

    Raises:
        StaleLeaseError / SessionExpired / BackendUnavailable / OutcomeUnknown.
    """
    params = _params(b, session, job_id, claim, value=value)

    def run(c: psycopg.Connection[Row]) -> Row | None:
        return c.execute(b.sql.set_value, params).fetchone()

    row = b.client.write(job_id, run, lambda: b.client.write(job_id, run))
    if row is None:
        raise refusal(b, session, job_id, claim.generation)
    b.wake_subscribers()


def fail(b: PostgresBackend, session: SessionHandle, job_id: str, claim: ClaimResult,
         error: str, retry_in_s: float) -> LeaseRecord:
    """One ``UPDATE`` with the owner + generation compare, notifying; then the record is
    read (a second round trip)."""
    params = _params(b, session, job_id, claim, error=error, retry=retry_in_s)

    def run(c: psycopg.Connection[Row]) -> Row | None:
        return c.execute(b.sql.fail, params).fetchone()

    def settle() -> Row | None:
        if _held_now(b, session, job_id, claim):
            return b.client.write(job_id, run)  # not applied: once more
        done = b.client.one(b.sql.failed_by_me, params, job_id)
        return done  # None: not held and not our failure: rejected below

    row = b.client.write(job_id, run, settle)
    if row is None:
        raise refusal(b, session, job_id, claim.generation)
    b.wake_subscribers()
    record = get(b, job_id)
    assert record is not None
    return record


def requeue(b: PostgresBackend, job_id: str) -> LeaseRecord:
    """One ``UPDATE`` of a FAILED job, notifying; then the record is read (a second
    round trip)."""
    n = b.names
    row = b.client.write(job_id, lambda c: c.execute(
        f"WITH u AS (UPDATE {n.jobs} SET failed_at = NULL, "
        "closed = CASE WHEN queue IS NULL THEN true END, "
        "not_before = NULL, "
        "attempt_base = attempt WHERE job_id = %s AND failed_at IS NOT NULL RETURNING 1) "
        "SELECT pg_notify(%s, '') FROM u", (job_id, n.channel)).fetchone())
    record = get(b, job_id)
    record = requeued(job_id, row, record)
    b.wake_subscribers()
    return record


def get(b: PostgresBackend, job_id: str) -> LeaseRecord | None:
    row = b.client.one(b.sql.select + " WHERE j.job_id = %s", (job_id,), job_id)
    return None if row is None else to_record(row, b.epoch_shift)


def records(b: PostgresBackend, limit: int | None = None) -> list[LeaseRecord]:
    sql = (b.sql.select + " WHERE left(j.job_id, %s) <> %s ORDER BY j.job_id COLLATE "
           '"C"')
    params: tuple[Any, ...] = (len(ELECTION_PREFIX), ELECTION_PREFIX)
    if limit is not None:
        sql += " LIMIT %s"
        params = (*params, int(limit))
    return [to_record(r, b.epoch_shift) for r in b.client.read(sql, params)]
