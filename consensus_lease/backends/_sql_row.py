"""The one row shape both SQL stores (SQLite, PostgreSQL) read a job in, turned into a
:class:`~consensus_lease.record.LeaseRecord`, and the answer both give a requeue. Shared so
the two stores cannot disagree on what a row means; neither store imports the other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._epoch import compose
from ..errors import InvalidArgument
from ..record import JobState, LeaseRecord

__all__ = ["record_of_row", "requeued"]


def record_of_row(row: Sequence[Any], epoch_shift: int) -> LeaseRecord:
    """``row`` is ``(job_id, owner, expires_at, generation, completed_at, result, alive,
    failed_at, attempt, error, not_before, max_attempts, epoch, value)``; ``alive`` is
    whether the holding session is alive on the store's clock (decided by the query)."""
    (job_id, owner, expires_at, generation, completed_at, result, alive, failed_at,
     attempt, error, not_before, max_attempts, epoch, value) = row
    if completed_at is not None:
        state = JobState.COMPLETED
    elif failed_at is not None:
        state = JobState.FAILED
    elif alive:
        state = JobState.HELD
    else:
        state = JobState.AVAILABLE
    return LeaseRecord(
        job_id=job_id,
        owner=owner,
        lease_until=float(expires_at) if state is JobState.HELD else None,
        generation=compose(int(epoch), int(generation), epoch_shift),
        state=state,
        result=None if result is None else bytes(result),
        attempt=int(attempt),
        error=error,
        not_before=float(not_before) if state is JobState.AVAILABLE and not_before else None,
        max_attempts=None if max_attempts is None else int(max_attempts),
        value=bytes(value) if value is not None and state is JobState.HELD else None,
    )


def requeued(job_id: str, updated: object, record: LeaseRecord | None) -> LeaseRecord:
    """The record a requeue returns: ``record``, read after the ``UPDATE`` that made the
    FAILED job ``job_id`` claimable again (``updated``: its ``RETURNING`` row, ``None``
    when no FAILED row matched).

    Raises:
        InvalidArgument: the job is not FAILED (or does not exist); nothing changed.
    """
    if updated is None or record is None:
        state = "unknown" if record is None else record.state.value
        raise InvalidArgument(
            f"only a FAILED job can be requeued; {job_id!r} is {state}", job_id=job_id
        )
    return record
