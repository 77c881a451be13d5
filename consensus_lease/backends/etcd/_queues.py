"""Work queues: enqueue, the listing and purge (the candidate scan, counters and
statistics are in :mod:`._queues_index`, waiting in :mod:`._watches_queue`).

Keys (see :mod:`._layout`): the job's queue marker ``PREFIX/HEX/q``, and in the queue's
directory ``QDIR = PREFIX/q/QHEX/`` a member key ``QDIR/j/HEX`` (value: the payload;
its create revision is ``seq``), a pending key ``QDIR/p/HEX`` (value: the job's
ordinal; deleted by the completion transaction and by the one making the job FAILED, put
back by requeue with a new ordinal) and an index entry ``QDIR/i/ORD/HEX``. The enqueue
transaction of a chunk of jobs (one job for ``enqueue``)::

    if QDIR/k/seq == S (or absent, for the queue's first job)
            and, per new job, no key in PREFIX/HEX/[a .. q]   (one range compare)
            and, per job already in this queue, mod_revision(q) is as read:
        per new job i, a nested transaction:
            put PREFIX/HEX/q = {queue, nonce}, QDIR/j/HEX = payload, QDIR/p/HEX = S+i,
                QDIR/i/S+i/HEX = "", PREFIX/HEX/l = {max_attempts, base 0, nonce}
                (the last with max_attempts only)
        put QDIR/k/seq = S + new jobs   (and QDIR/k/low = 0 with the queue's first job)
    else:
        get QDIR/k/seq, base, requeued, purged

The driver caches ``seq``, so a producer alone on a queue sends one transaction per
chunk. Refused with ``seq`` as cached, a read of the jobs' markers tells which are
already in this queue (left unchanged, ``False``; their markers compared in the next
round) and which exist outside it (``InvalidArgument``: nothing of the chunk is
written). Concurrent producers of one queue conflict on ``seq`` and go round again (at
most :data:`ENQUEUE_ROUNDS` times).

A queued job is otherwise an ordinary job: ``claim_next`` claims it with the ordinary
claim transaction (:mod:`._jobs_claim`), with the same compares and fencing token.

The transactions whose size grows with the jobs (enqueue chunks, the candidates' check,
the listing's reads, purge) are built for etcd's default ``--max-txn-ops`` (128) and
split to a smaller server limit once a refusal taught it (:mod:`._transport_txn_limit`); enqueue
and purge split only between jobs, so each job's writes stay one transaction.

**Capacity.** :data:`MAX_QUEUE_JOBS` jobs per queue (any state, until purged), checked
from the counters before an enqueue is sent (``QueueFull``); see its docstring for why.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from pyetcd import etcdrpc

from ...errors import BackendUnavailable, InvalidArgument, OutcomeUnknown, QueueFull
from ...record import EnqueueItem, LeaseRecord, QueuedJob
from . import _queues_index
from . import _transport_requests as rq
from ._jobs import Ops, Settled
from ._layout import (
    Limit,
    QueueKeys,
    QueueMarker,
    ordinal_bytes,
    ordinal_of,
    pair_bytes,
    pair_of,
    queue_of,
)
from ._layout_records import job_record, kinds_of
from ._queues_index import read_counters
from ._queues_state import Counters
from ._transport import Failure
from ._transport_txn_limit import needed_ops, too_many_ops

__all__ = [
    "ENQUEUE_BATCH",
    "MAX_PAYLOAD_BYTES",
    "MAX_QUEUE_JOBS",
    "MAX_QUEUE_PAYLOAD_BYTES",
    "candidates",
    "enqueue_items",
    "list_jobs",
    "page_jobs",
    "purge",
]

log = logging.getLogger("consensus_lease.etcd")

MAX_PAYLOAD_BYTES = 1024 * 1024
"""Largest payload: 1 MiB. etcd refuses requests over ``--max-request-bytes`` (1.5 MiB by
default); the enqueue transaction also carries three keys of up to ~1 KiB each, the
marker and the framing. A server configured lower refuses larger enqueues with
``InvalidArgument``; nothing is written then."""

ENQUEUE_BATCH = 100
"""Jobs per enqueue transaction (``capabilities.max_enqueue_batch``): a new job is one
compare (a range compare: no key in its directory) and one nested transaction of up to 5
puts; etcd checks a nested transaction against ``--max-txn-ops`` (128 by default) minus
the enclosing list's length, so 100 jobs need 101 compares and 102 + 5 operations."""

ENQUEUE_ROUNDS = 16
"""Most transactions one enqueue chunk sends while other producers take ordinals or
its jobs change under it."""

MAX_QUEUE_JOBS = 250_000
"""Jobs one queue may hold (any state, until purged): ``capabilities.max_queue_jobs``.

Why: etcd refuses every write once its backend reaches ``--quota-backend-bytes`` (2 GB
by default; 8 GB is the documented ceiling), and needs an operator to compact, defrag
and disarm the alarm then. A job with a 100-byte payload costs about 0.55 KB of the
backend once enqueued and 1.8 KB once claimed and completed (its keys and the old
revisions kept until compaction; measured on etcd 3.4 with 20,000 jobs), so 250,000
jobs are about 0.45 GB: a quarter of the default quota for one queue, leaving room for
other queues, revisions awaiting compaction (run etcd with ``--auto-compaction-*``) and
payloads. Payloads count on top: 250,000 jobs of 4 KB are another 1 GB, so queues with
large payloads need a larger quota (or fewer jobs: purge completed ones) -- each
payload is at most :data:`MAX_PAYLOAD_BYTES`. The counters make the check free: no
read beyond what enqueue does anyway."""

MAX_QUEUE_PAYLOAD_BYTES = 256 * 1024 * 1024
"""Payload bytes one queue may hold (until purged): 256 MiB, an eighth of etcd's default
quota, so that with :data:`MAX_QUEUE_JOBS` jobs' own keys (about 0.45 GB) one full queue
stays under half of it. Checked from the counters with the job count (``QueueFull``);
payloads of jobs enqueued by the first layout are not counted."""

LISTING_JOBS = 32
"""Jobs per read transaction in ``queue_jobs`` (2 range reads each: the payload and
the job's keys)."""

KEYS_PAGE = 512
"""Keys per range read when listing a queue's member or pending keys."""

PURGE_ROUNDS = 8
"""Most transactions one purge batch sends while a concurrent purge changes it."""

PURGE_BATCH = 64
"""Completed jobs deleted per purge transaction: each is one compare (its completion
record exists) and a nested transaction of eight deletes; with the counter's compare and
put, 64 jobs need 65 compares and 65 operations, and etcd checks a nested transaction
against ``--max-txn-ops`` (128 by default) minus the outer list's size (fewer jobs per
transaction on a server that allows fewer)."""


def page_jobs(qkeys: QueueKeys, kvs: Sequence[Any]) -> list[tuple[str, int]]:
    """``(job_id, create_revision)`` of each queue key in ``kvs`` (foreign keys skipped)."""
    out = []
    for kv in kvs:
        job_id = qkeys.job_of(bytes(kv.key))
        if job_id is not None:
            out.append((job_id, int(kv.create_revision)))
    return out


# -- enqueue ----------------------------------------------------------------------------


def enqueue_items(ops: Ops, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
    """See :meth:`EtcdBackend.enqueue_many
    <consensus_lease.backends.etcd.EtcdBackend.enqueue_many>`: one transaction per
    chunk of at most :data:`ENQUEUE_BATCH` jobs (fewer on a server allowing fewer
    operations per transaction)."""
    qkeys = ops.layout.queue(queue)
    what = (f"enqueue of {items[0].job_id!r} in queue {queue!r}" if len(items) == 1
            else f"enqueue of {len(items)} jobs in queue {queue!r}")
    blank = Counters(0, False, 0, 0, 0)

    def sizing(chunk: Sequence[EnqueueItem]) -> Any:
        return _enqueue_request(ops, qkeys, chunk, {}, blank, "")

    out: list[bool] = []
    start = 0
    while start < len(items):
        window = items[start : start + ENQUEUE_BATCH]
        chunk = window[: ops.txn_limit.fitting(window, sizing, what)]
        try:
            out += _enqueue_chunk(ops, qkeys, chunk, what)
        except InvalidArgument as exc:
            if not too_many_ops(exc):
                raise
            ops.txn_limit.refused(ops, sizing(chunk), what)
            if len(chunk) == 1:
                raise ops.txn_limit.too_large(needed_ops(sizing(chunk)), what) from exc
            continue
        start += len(chunk)
    return out


def _enqueue_request(ops: Ops, qkeys: QueueKeys, new: Sequence[EnqueueItem],
                     known: dict[str, int], counters: Counters, nonce: str) -> Any:
    """The enqueue transaction (see the module docstring): one compare per job (no key
    in its directory, or its marker unchanged) and one nested transaction of puts per
    new job, so a chunk of 100 needs 107 of etcd's 128 operations per transaction."""
    compare = [counters.same_seq(qkeys)]
    success: list[Any] = []
    for i, item in enumerate(new):
        keys = ops.layout.job(item.job_id)
        ordinal = counters.seq + i
        compare.append(rq.none_in(*keys.directory))
        puts = [
            rq.put(keys.queue, QueueMarker(qkeys.queue, nonce, len(item.payload)).encode()),
            rq.put(qkeys.member(item.job_id), item.payload),
            rq.put(qkeys.pending(item.job_id), ordinal_bytes(ordinal)),
            rq.put(qkeys.entry(ordinal, item.job_id), b""),
        ]
        if item.max_attempts is not None:
            puts.append(rq.put(keys.limit, Limit(item.max_attempts, 0, nonce).encode()))
        success.append(etcdrpc.RequestOp(request_txn=rq.txn(success=puts)))
    compare += [rq.mod_is(ops.layout.job(job_id).queue, revision)
                for job_id, revision in known.items()]
    success += counters.taking(qkeys, len(new), sum(len(item.payload) for item in new))
    return rq.txn(compare=compare, success=success, failure=Counters.reads(qkeys))


def _classify(ops: Ops, qkeys: QueueKeys, items: Sequence[EnqueueItem], known: dict[str, int],
              what: str) -> None:
    """Read each job's queue marker and key count (read-only transactions of 64 jobs):
    note in ``known`` those already in this queue (their marker's mod revision).

    Raises:
        InvalidArgument: a job exists outside this queue.
    """
    def reads(chunk: Sequence[EnqueueItem]) -> Any:
        found = []
        for item in chunk:
            keys = ops.layout.job(item.job_id)
            found += [rq.get(keys.queue), rq.span_count(*keys.directory)]
        return rq.txn(success=found)

    for chunk, answer in ops.txn_limit.read_split(ops, items, 64, reads, what):
        for i, item in enumerate(chunk):
            marker_kv = rq.kv_of(answer.responses[2 * i])
            found = queue_of(marker_kv)
            if found == qkeys.queue and marker_kv is not None:
                known[item.job_id] = int(marker_kv.mod_revision)
            elif found is not None or answer.responses[2 * i + 1].response_range.count > 0:
                where = "a job claimed by name" if found is None else f"in queue {found!r}"
                raise InvalidArgument(
                    f"{what}: {item.job_id!r} already exists outside this queue ({where}); "
                    f"nothing of this chunk was written", job_id=item.job_id)
            else:
                known.pop(item.job_id, None)  # purged meanwhile: new again


def _enqueue_chunk(ops: Ops, qkeys: QueueKeys, items: Sequence[EnqueueItem],
                   what: str) -> list[bool]:
    """One atomic chunk: every new job of ``items`` added in one transaction, or none.
    The transaction compares ``seq`` (taken from the cache, or read) and that each new
    job has no key; its ``else`` branch answers the counters. Refused with ``seq`` as
    expected, the jobs' markers are read: those already in this queue are left alone
    (their markers compared unchanged in the next round), one outside it raises; with
    ``seq`` moved (another producer), the next round takes the new one.

    Raises:
        InvalidArgument: a job exists outside this queue; nothing was written.
        QueueFull: the queue would exceed :data:`MAX_QUEUE_JOBS`; nothing was written.
        OutcomeUnknown / BackendUnavailable / AuthenticationFailed.
    """
    cache = ops.queues
    queue = qkeys.queue
    counters = cache.counters(queue) or read_counters(ops, qkeys, what)
    known: dict[str, int] = {}
    for _ in range(ENQUEUE_ROUNDS):
        new = [item for item in items if item.job_id not in known]
        if not new:
            return [False] * len(items)
        size = sum(len(item.payload) for item in new)
        if _over(counters, len(new), size):
            counters = read_counters(ops, qkeys, what)  # the cached ones may be old
            cache.set_counters(queue, counters)
            if _over(counters, len(new), size):
                raise QueueFull(
                    f"{what}: queue {queue!r} holds {counters.jobs} jobs with "
                    f"{counters.payload_bytes} payload bytes; {len(new)} more with {size} "
                    f"bytes would exceed the etcd backend's capacity of {MAX_QUEUE_JOBS} "
                    f"jobs (capabilities.max_queue_jobs) and {MAX_QUEUE_PAYLOAD_BYTES} "
                    f"payload bytes per queue; nothing of this chunk was written. Purge "
                    f"completed jobs, or spread the work over more queues or stores")
        nonce = secrets.token_hex(8)
        request = _enqueue_request(ops, qkeys, new, known, counters, nonce)
        mine = QueueMarker(queue, nonce)

        def decide(kvs: list[Any], mine: QueueMarker = mine) -> Settled | None:
            marker_kv = kvs[0]
            found = None if marker_kv is None else QueueMarker.decode(marker_kv.value,
                                                                      marker_kv.key)
            if found is not None and (found.queue, found.nonce) == (mine.queue, mine.nonce):
                return Settled(True)  # ours landed (the whole chunk: one transaction)
            return None  # not applied (yet): the same request again (compared)

        answer = ops.send_guarded(request, what, job_id=new[0].job_id, generation=None,
                                  read_back=[ops.layout.job(new[0].job_id).queue],
                                  decide=decide)
        added = {item.job_id for item in new}
        if isinstance(answer, Settled):
            cache.set_counters(queue, None)  # read them again next time
            return [item.job_id in added for item in items]
        if answer.succeeded:
            cache.set_counters(queue, counters.after(len(new), size))
            cache.mark_current(queue)
            return [item.job_id in added for item in items]
        fresh = Counters.of(*(rq.kv_of(r) for r in answer.responses))
        cache.set_counters(queue, fresh)
        if fresh.seq == counters.seq and fresh.exists == counters.exists:
            _classify(ops, qkeys, items, known, what)  # refused for a job, not for seq
        counters = fresh
    raise BackendUnavailable(f"{what}: the queue kept changing; try again",
                             job_id=items[0].job_id)


def _over(counters: Counters, jobs: int, size: int) -> bool:
    """Whether ``jobs`` more jobs with ``size`` payload bytes exceed the capacity."""
    return (counters.jobs + jobs > MAX_QUEUE_JOBS
            or counters.payload_bytes + size > MAX_QUEUE_PAYLOAD_BYTES)


# -- claimable candidates ----------------------------------------------------------------


def candidates(ops: Ops, queue: str, limit: int) -> list[tuple[str, bytes]]:
    """See :meth:`EtcdBackend.queue_candidates
    <consensus_lease.backends.etcd.EtcdBackend.queue_candidates>` and
    :func:`._queues_index.candidates`."""
    return _queues_index.candidates(ops, queue, limit)


# -- listing ---------------------------------------------------------------------------


def _all_keys(ops: Ops, span: tuple[bytes, bytes], revision: int,
              what: str, keys_only: bool = True) -> tuple[int, list[Any]]:
    """Every key (keys only, unless not ``keys_only``) of ``span`` at ``revision`` (0:
    now), in key order; returns the revision read and the key-values."""
    start, end = span
    out: list[Any] = []
    while True:
        page = ops.read(
            etcdrpc.RangeRequest(key=start, range_end=end, limit=KEYS_PAGE,
                                 keys_only=keys_only, revision=revision),
            what,
        )
        revision = revision or int(page.header.revision)
        out.extend(page.kvs)
        if not page.more or not page.kvs:
            return revision, out
        start = bytes(page.kvs[-1].key) + b"\x00"


def list_jobs(ops: Ops, queue: str, limit: int | None) -> list[QueuedJob]:
    """See :meth:`EtcdBackend.queue_jobs <consensus_lease.backends.etcd.EtcdBackend.queue_jobs>`."""
    qkeys = ops.layout.queue(queue)
    what = f"listing queue {queue!r}"
    revision, members = _all_keys(ops, qkeys.members, 0, what)
    jobs = sorted(page_jobs(qkeys, members), key=lambda job: job[1])[:limit]
    out: list[QueuedJob] = []
    lease_until: dict[int, float | None] = {}

    def reads(chunk: Sequence[tuple[str, int]]) -> Any:
        gets = []
        for job_id, _ in chunk:  # at the members' snapshot
            gets += [rq.span(qkeys.member(job_id), qkeys.member(job_id) + b"\x00", revision),
                     rq.span(*ops.layout.job(job_id).directory, revision=revision)]
        return rq.txn(success=gets)

    for chunk, answer in ops.txn_limit.read_split(ops, jobs, LISTING_JOBS, reads, what):
        for i, (job_id, seq) in enumerate(chunk):
            member_kv = rq.kv_of(answer.responses[2 * i])
            kinds = kinds_of(ops, answer.responses[2 * i + 1].response_range.kvs)
            record: LeaseRecord | None = job_record(ops, job_id, kinds, lease_until)
            if member_kv is None or record is None:
                continue  # cannot happen at one revision; never invent a job
            out.append(QueuedJob(queue, record, bytes(member_kv.value), seq))
    return out


# -- purge -----------------------------------------------------------------------------


def purge(ops: Ops, queue: str) -> int:
    """See :meth:`EtcdBackend.purge <consensus_lease.backends.etcd.EtcdBackend.purge>`.
    Also deletes the queue's stale index entries (those of jobs no longer open, or open
    under a later ordinal, at the revision read)."""
    qkeys = ops.layout.queue(queue)
    what = f"purging queue {queue!r}"
    bounded = ops.transport.bounded  # each step its own deadline (EtcdBackend.purge)
    with bounded():
        revision, members = _all_keys(ops, qkeys.members, 0, what)
        _, pendings = _all_keys(ops, qkeys.pendings, revision, what, keys_only=False)
    open_jobs = {qkeys.job_of(bytes(kv.key)): ordinal_of(kv) for kv in pendings}
    done = [job_id for job_id, _ in sorted(page_jobs(qkeys, members), key=lambda j: j[1])
            if job_id not in open_jobs]
    with bounded():
        _, entries = _all_keys(ops, qkeys.entries(0, 10**20 - 1), revision, what)
    stale = [bytes(kv.key) for kv in entries
             if (e := qkeys.entry_of(bytes(kv.key))) is not None and open_jobs.get(e[1]) != e[0]]
    with bounded():
        _queues_index.delete_stale(ops, qkeys, stale)
    purged, start = 0, 0
    while start < len(done):
        window = done[start : start + PURGE_BATCH]
        batch = window[: ops.txn_limit.fitting(
            window, lambda ids: _purge_request(ops, qkeys, ids), what)]
        try:
            with bounded():
                purged += _purge_batch(ops, qkeys, batch, what)
        except InvalidArgument as exc:  # refused as a whole: nothing of it was written
            if not too_many_ops(exc):
                raise
            ops.txn_limit.refused(ops, _purge_request(ops, qkeys, batch), what)
            continue
        start += len(batch)
    return purged


def _purge_request(ops: Ops, qkeys: QueueKeys, job_ids: Sequence[str],
                   purged_kv: Any = None, size: int = 0) -> Any:
    """One transaction: if every job of ``job_ids`` is still completed and the purge
    counter is as read (``purged_kv``), delete each job's keys (a nested transaction per
    job, so a batch fits ``--max-txn-ops``) and add ``len(job_ids)`` jobs and ``size``
    payload bytes (from their queue markers) to the counter; else answer which are still
    completed."""
    counter = qkeys.counter("purged")
    compare = [rq.mod_is(counter, 0 if purged_kv is None else int(purged_kv.mod_revision))]
    nested = []
    for job_id in job_ids:
        keys = ops.layout.job(job_id)
        compare.append(rq.exists(keys.completion))
        doomed = (keys.completion, keys.history, keys.queue, keys.attempts, keys.error,
                  keys.limit, qkeys.member(job_id), qkeys.pending(job_id))
        nested.append(etcdrpc.RequestOp(request_txn=rq.txn(
            success=[rq.delete(k) for k in doomed])))
    jobs, before = pair_of(purged_kv)
    nested.append(rq.put(counter, pair_bytes(jobs + len(job_ids), before + size)))
    failure = [rq.count(ops.layout.job(j).completion) for j in job_ids]
    return rq.txn(compare=compare, success=nested, failure=failure)


def _purge_batch(ops: Ops, qkeys: QueueKeys, job_ids: list[str], what: str) -> int:
    """Delete the keys of those of ``job_ids`` that are completed, in one transaction
    that also counts them in ``QDIR/k/purged`` (:func:`_purge_request`); return how
    many. A job no longer completed (purged meanwhile) is left out and the rest sent
    again. Each round first reads the counter and the jobs' queue markers (their payload
    sizes). After a lost answer the member keys are read back: the members gone means it
    landed (or a concurrent purge took them); the members still there are sent again."""
    purged = 0
    deadline = time.monotonic() + ops.config.connect_timeout_s
    counter = qkeys.counter("purged")
    for _ in range(PURGE_ROUNDS):
        if not job_ids:
            break
        purged_kv, *markers = ops.read_keys(
            [counter, *(ops.layout.job(j).queue for j in job_ids)], what, deadline, job_ids[0])
        size = sum(QueueMarker.decode(kv.value, kv.key).size for kv in markers if kv is not None)
        request = _purge_request(ops, qkeys, job_ids, purged_kv, size)
        try:
            answer = ops.transport.send("kv", "Txn", request, what=what, job_id=job_ids[0])
        except Failure as failure:
            log.warning("etcd: %s: no answer (%s); reading back", what, failure)
            try:
                found = ops.read(rq.txn(success=[rq.count(qkeys.member(j)) for j in job_ids]),
                                 f"reading back {what}",
                                 budget_s=max(0.05, deadline - time.monotonic()),
                                 job_id=job_ids[0]).responses
            except BackendUnavailable as exc:
                raise OutcomeUnknown(f"{what}: sent but not answered ({failure}), and reading "
                                     f"back failed: {exc}", job_id=job_ids[0]) from exc
            left = [j for j, r in zip(job_ids, found, strict=True) if r.response_range.count]
            purged += len(job_ids) - len(left)
            job_ids = left
            if job_ids and time.monotonic() >= deadline:
                raise OutcomeUnknown(f"{what}: not applied when read back, and no time left",
                                     job_id=job_ids[0]) from failure.__cause__
            continue
        if answer.succeeded:
            return purged + len(job_ids)
        job_ids = [j for j, r in zip(job_ids, answer.responses, strict=True)
                   if r.response_range.count]
    return purged
