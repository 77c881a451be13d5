"""Reading lease records: one job (``get``) or the whole prefix (``records``).

A job's state follows from which of its keys exist: the completion record wins, then
the owner key (HELD), then the history key (AVAILABLE: released, or its holder's lease
ended), then the queue marker (AVAILABLE at generation 0: enqueued, never claimed);
none means never seen.

``lease_until`` (HELD only) is this machine's wall clock + the holder lease's remaining
TTL from ``LeaseTimeToLive`` (whole seconds, for display; ``None`` when etcd does not
answer). ``records`` looks up at most :data:`LEASE_LOOKUPS` distinct leases.
"""

from __future__ import annotations

import time
from typing import Any

from pyetcd import etcdrpc

from ...record import JobState, LeaseRecord
from ._keys import COMPLETION, HISTORY, OWNER, QUEUE, Completion, History, Owner
from ._ops import Ops

__all__ = ["LEASE_LOOKUPS", "RECORDS_PAGE", "job_record", "list_records", "read_record"]

RECORDS_PAGE = 512
"""Keys per range read when listing."""

LEASE_LOOKUPS = 64
"""Most ``LeaseTimeToLive`` lookups one ``records()`` makes."""


def job_record(ops: Ops, job_id: str, owner_kv: Any, history_kv: Any, completion_kv: Any,
               lease_until: dict[int, float | None], queued: bool) -> LeaseRecord | None:
    """The record from a job's keys (``None``: no key, never seen). ``lease_until``
    caches lease lookups by lease id; ``queued``: the job has a queue marker."""
    if completion_kv is not None:
        done = Completion.decode(completion_kv.value, completion_kv.key)
        return LeaseRecord(job_id, done.owner, None, done.generation, JobState.COMPLETED,
                           done.result)
    if owner_kv is not None:
        held = Owner.decode(owner_kv.value, owner_kv.key)
        lease_id = int(owner_kv.lease)
        if lease_id not in lease_until and len(lease_until) < LEASE_LOOKUPS:
            ttl = ops.lease_ttl(lease_id)
            lease_until[lease_id] = time.time() + ttl if ttl is not None and ttl > 0 else None
        return LeaseRecord(job_id, held.owner, lease_until.get(lease_id),
                           int(owner_kv.create_revision), JobState.HELD)
    if history_kv is not None:
        past = History.decode(history_kv.value, history_kv.key)
        # Written by a claim: its mod revision is that claim's generation.
        generation = past.generation or int(history_kv.mod_revision)
        return LeaseRecord(job_id, None if past.released else past.owner, None, generation,
                           JobState.AVAILABLE)
    if queued:
        return LeaseRecord(job_id, None, None, 0, JobState.AVAILABLE)
    return None


def read_record(ops: Ops, job_id: str) -> LeaseRecord | None:
    """The job's record from one linearizable read of its keys."""
    keys = ops.layout.job(job_id)
    owner_kv, history_kv, completion_kv, marker_kv = ops.read_keys(
        (keys.owner, keys.history, keys.completion, keys.queue), f"reading {job_id!r}",
        time.monotonic() + ops.config.connect_timeout_s, job_id,
    )
    return job_record(ops, job_id, owner_kv, history_kv, completion_kv, {},
                      marker_kv is not None)


def list_records(ops: Ops, limit: int | None) -> list[LeaseRecord]:
    """Every job under the prefix in job-id order (hex keys sort as the ids do), from
    key-ordered range reads of :data:`RECORDS_PAGE` job keys (never the queues' keys,
    which carry payloads), all at the first page's revision (one consistent snapshot);
    stops once ``limit`` jobs are known."""
    out: list[LeaseRecord] = []
    lease_until: dict[int, float | None] = {}
    job_id: str | None = None
    kinds: dict[bytes, Any] = {}
    start, revision = ops.layout.root, 0

    def flush() -> None:
        if job_id is not None:
            record = job_record(ops, job_id, kinds.get(OWNER), kinds.get(HISTORY),
                                kinds.get(COMPLETION), lease_until, QUEUE in kinds)
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
            if parsed is None:
                continue  # not ours (e.g. a nested prefix's key)
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
