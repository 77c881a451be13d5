"""Reading lease records: one job (``get``) or the whole prefix (``records``).

A job's state follows from which of its keys exist: the completion record wins, then
the FAILED record, then the owner key (HELD), then the history key (AVAILABLE:
released, failed with a retry, or its holder's lease ended), then the queue marker
(AVAILABLE at generation 0: enqueued, never claimed); none means never seen. The
generation is the claim's token: ``epoch * 2**44 +`` the owner key's create revision
(or the history key's mod revision), the epoch from the value the claim wrote. Every
state shows ``attempt`` (the attempts key's version), ``error`` (the last-error key)
and ``max_attempts`` (the limit key); HELD also ``value``, from the value key if it was
set at the holder's generation (a value of an older hold is stale: ``None``).

Elections (keys under ``PREFIX/elections/``) are no jobs: ``records`` leaves them out.

``lease_until`` (HELD only) is this machine's wall clock + the holder lease's remaining
TTL from ``LeaseTimeToLive`` (whole seconds, for display; ``None`` when etcd does not
answer); ``not_before`` (AVAILABLE with a retry delay running) likewise from the
not-before key's lease. ``records`` looks up at most :data:`LEASE_LOOKUPS` distinct
leases.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from pyetcd import etcdrpc

from ..._election import is_election_key
from ...record import JobState, LeaseRecord
from ._jobs import Ops
from ._layout import (
    ATTEMPTS,
    COMPLETION,
    ERROR,
    FAILED,
    HISTORY,
    LIMIT,
    NOT_BEFORE,
    OWNER,
    QUEUE,
    VALUE,
    Completion,
    DeadLetter,
    HeldValue,
    History,
    LastError,
    Owner,
    attempts_of,
    limit_of,
)
from ._tokens import compose

__all__ = [
    "LEASE_LOOKUPS",
    "RECORDS_PAGE",
    "Lifecycle",
    "job_record",
    "kinds_of",
    "list_records",
    "read_kinds",
    "read_record",
]

RECORDS_PAGE = 512
"""Keys per range read when listing."""

LEASE_LOOKUPS = 64
"""Most ``LeaseTimeToLive`` lookups one ``records()`` makes."""


class Lifecycle(NamedTuple):
    """The lifecycle fields every record shows."""

    attempt: int
    error: str | None
    max_attempts: int | None

    @classmethod
    def of(cls, attempts_kv: Any, error_kv: Any, limit_kv: Any) -> Lifecycle:
        error = None if error_kv is None else LastError.decode(error_kv.value, error_kv.key)
        limit = limit_of(limit_kv)
        return cls(attempts_of(attempts_kv), None if error is None else error.error,
                   None if limit is None else limit.max_attempts)


def _until(ops: Ops, lease_id: int, lease_until: dict[int, float | None]) -> float | None:
    """Local wall clock + the lease's remaining TTL (cached in ``lease_until``)."""
    if lease_id not in lease_until and len(lease_until) < LEASE_LOOKUPS:
        ttl = ops.lease_ttl(lease_id)
        lease_until[lease_id] = time.time() + ttl if ttl is not None and ttl > 0 else None
    return lease_until.get(lease_id)


def held_value(value_kv: Any, generation: int) -> bytes | None:
    """The value set during the hold at ``generation``, from the value key (``None``:
    absent, or set during an older hold)."""
    if value_kv is None:
        return None
    held = HeldValue.decode(value_kv.value, value_kv.key)
    return held.value if held.generation == generation else None


def job_record(ops: Ops, job_id: str, kinds: Mapping[bytes, Any],
               lease_until: dict[int, float | None]) -> LeaseRecord | None:
    """The record from a job's keys, by kind (``None``: no key, never seen).
    ``lease_until`` caches lease lookups by lease id."""
    life = Lifecycle.of(kinds.get(ATTEMPTS), kinds.get(ERROR), kinds.get(LIMIT))
    completion_kv, dead_kv = kinds.get(COMPLETION), kinds.get(FAILED)
    owner_kv, history_kv = kinds.get(OWNER), kinds.get(HISTORY)
    if completion_kv is not None:
        done = Completion.decode(completion_kv.value, completion_kv.key)
        return LeaseRecord(job_id, done.owner, None, done.generation, JobState.COMPLETED,
                           done.result, life.attempt, life.error,
                           max_attempts=life.max_attempts)
    if dead_kv is not None:
        dead = DeadLetter.decode(dead_kv.value, dead_kv.key)
        return LeaseRecord(job_id, None, None, dead.generation, JobState.FAILED, None,
                           dead.attempt, dead.error, None, life.max_attempts)
    if owner_kv is not None:
        held = Owner.decode(owner_kv.value, owner_kv.key)
        token = compose(held.epoch, int(owner_kv.create_revision))
        return LeaseRecord(job_id, held.owner, _until(ops, int(owner_kv.lease), lease_until),
                           token, JobState.HELD, None, life.attempt, life.error,
                           max_attempts=life.max_attempts,
                           value=held_value(kinds.get(VALUE), token))
    delay_kv = kinds.get(NOT_BEFORE)
    not_before = None if delay_kv is None else _until(ops, int(delay_kv.lease), lease_until)
    if history_kv is not None:
        past = History.decode(history_kv.value, history_kv.key)
        # Written by a claim: its mod revision is that claim's (with its epoch).
        generation = past.generation or compose(past.epoch, int(history_kv.mod_revision))
        return LeaseRecord(job_id, None if past.released else past.owner, None, generation,
                           JobState.AVAILABLE, None, life.attempt, life.error, not_before,
                           life.max_attempts)
    if QUEUE in kinds:
        return LeaseRecord(job_id, None, None, 0, JobState.AVAILABLE, None, life.attempt,
                           life.error, not_before, life.max_attempts)
    return None


def kinds_of(ops: Ops, kvs: Any) -> dict[bytes, Any]:
    """One job's key-values (a range read of its directory) by kind."""
    out: dict[bytes, Any] = {}
    for kv in kvs:
        parsed = ops.layout.parse(bytes(kv.key))
        if parsed is not None:
            out[parsed[1]] = kv
    return out


def read_kinds(ops: Ops, job_id: str, what: str) -> dict[bytes, Any]:
    """The job's keys by kind (its value included), from one linearizable range read."""
    start, end = ops.layout.job(job_id).record_range
    page = ops.read(etcdrpc.RangeRequest(key=start, range_end=end), what, job_id=job_id)
    return kinds_of(ops, page.kvs)


def read_record(ops: Ops, job_id: str) -> LeaseRecord | None:
    """The job's record from one linearizable range read of its keys."""
    return job_record(ops, job_id, read_kinds(ops, job_id, f"reading {job_id!r}"), {})


def list_records(ops: Ops, limit: int | None) -> list[LeaseRecord]:
    """Every job under the prefix in job-id order (hex keys sort as the ids do), from
    key-ordered range reads of :data:`RECORDS_PAGE` job keys (never the queues' keys,
    which carry payloads), all at the first page's revision (one consistent snapshot);
    stops once ``limit`` jobs are known. Elections' keys are skipped."""
    out: list[LeaseRecord] = []
    lease_until: dict[int, float | None] = {}
    job_id: str | None = None
    kinds: dict[bytes, Any] = {}
    start, revision = ops.layout.root, 0

    def flush() -> None:
        if job_id is not None:
            record = job_record(ops, job_id, kinds, lease_until)
            if record is not None:
                out.append(record)

    while limit is None or len(out) < limit:
        page = ops.read(
            etcdrpc.RangeRequest(key=start, range_end=ops.layout.jobs_range_end,
                                 limit=RECORDS_PAGE, revision=revision),
            "listing records",
        )
        revision = revision or int(page.header.revision)
        for kv in page.kvs:
            parsed = ops.layout.parse(bytes(kv.key))
            if parsed is None or is_election_key(parsed[0]):
                continue  # not ours (e.g. a nested prefix's key), or no job
            if parsed[0] != job_id:
                flush()
                if limit is not None and len(out) >= limit:
                    return out
                job_id, kinds = parsed[0], {}
            kinds[parsed[1]] = kv
        if not page.more or not page.kvs:
            flush()
            break
        start = bytes(page.kvs[-1].key) + b"\x00"
    return out[:limit]

