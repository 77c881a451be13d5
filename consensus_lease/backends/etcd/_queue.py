"""Work queues: enqueue, the claimable candidates, the listing, and purge (waiting is in
:mod:`._queue_wait`).

Keys (see :mod:`._keys`): the job's queue marker ``PREFIX/HEX/q``, and in the queue's
directory ``QDIR = PREFIX/q/QHEX/`` a member key ``QDIR/j/HEX`` (value: the payload;
its create revision is ``seq``) and a pending key ``QDIR/p/HEX`` (empty; deleted by the
completion transaction and by the one making the job FAILED, put back by requeue). The
enqueue transaction::

    if create_revision(o) == 0 and create_revision(h) == 0
            and create_revision(c) == 0 and create_revision(q) == 0:
        put PREFIX/HEX/q = {queue, nonce}, put QDIR/j/HEX = payload, put QDIR/p/HEX = ""
        put PREFIX/HEX/l = {max_attempts, base 0, nonce}   (only with max_attempts)
    else:
        get PREFIX/HEX/q

A queued job is otherwise an ordinary job: ``claim_next`` claims it with the ordinary
claim transaction (:mod:`._claim`), with the same compares and fencing token.

``queue_candidates`` is two linearizable reads: the queue's pending keys sorted by create
revision (FIFO), keys only, then one read-only transaction asking, per job, whether its
owner key, not-before key (a retry delay runs) and pending key exist, and its payload.
etcd sorts a range by create revision by reading every key of the range and truncating
afterwards, so one call costs the server O(open jobs of the queue) small-key reads; the
pending keys are empty, and completed and FAILED jobs are not among them.

The transactions whose size grows with the jobs (the candidates' check, the listing's
reads, purge) are built for etcd's default ``--max-txn-ops`` (128) and split to a
smaller server limit once a refusal taught it (:mod:`._txn_limit`); purge splits only
between jobs, each job's deletion stays one nested transaction.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from pyetcd import etcdrpc

from ...errors import BackendUnavailable, InvalidArgument, OutcomeUnknown
from ...record import LeaseRecord, QueuedJob
from . import _requests as rq
from ._keys import Limit, QueueKeys, QueueMarker, queue_of
from ._ops import Ops, Settled
from ._records import job_record, kinds_of
from ._transport import Failure
from ._txn_limit import needed_ops, too_many_ops

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "candidates",
    "enqueue",
    "list_jobs",
    "page_jobs",
    "purge",
    "sorted_pending",
]

log = logging.getLogger("consensus_lease.etcd")

MAX_PAYLOAD_BYTES = 1024 * 1024
"""Largest payload: 1 MiB. etcd refuses requests over ``--max-request-bytes`` (1.5 MiB by
default); the enqueue transaction also carries three keys of up to ~1 KiB each, the
marker and the framing. A server configured lower refuses larger enqueues with
``InvalidArgument``; nothing is written then."""

CANDIDATES_PAGE = 32
"""Pending keys per candidates page: the check transaction makes 4 gets per job and
etcd allows 128 operations per transaction by default (``--max-txn-ops``; split further
on a server that allows fewer)."""

LISTING_JOBS = 32
"""Jobs per read transaction in ``queue_jobs`` (2 range reads each: the payload and
the job's keys)."""

KEYS_PAGE = 512
"""Keys per range read when listing a queue's member or pending keys."""

PURGE_BATCH = 64
"""Completed jobs deleted per purge transaction: each is a nested transaction of one
compare and eight deletes; etcd checks a nested transaction against ``--max-txn-ops``
(128 by default) minus the outer transaction's size (fewer jobs per transaction on a
server that allows fewer)."""


def sorted_pending(qkeys: QueueKeys, limit: int, min_create: int) -> Any:
    """A range read of the queue's pending keys (keys only) in create-revision order,
    from ``min_create`` on."""
    key, end = qkeys.pendings
    return etcdrpc.RangeRequest(
        key=key, range_end=end, limit=limit, keys_only=True,
        sort_order=etcdrpc.RangeRequest.ASCEND, sort_target=etcdrpc.RangeRequest.CREATE,
        min_create_revision=min_create,
    )


def page_jobs(qkeys: QueueKeys, kvs: Sequence[Any]) -> list[tuple[str, int]]:
    """``(job_id, create_revision)`` of each queue key in ``kvs`` (foreign keys skipped)."""
    out = []
    for kv in kvs:
        job_id = qkeys.job_of(bytes(kv.key))
        if job_id is not None:
            out.append((job_id, int(kv.create_revision)))
    return out


# -- enqueue ----------------------------------------------------------------------------


def enqueue(ops: Ops, queue: str, job_id: str, payload: bytes,
            max_attempts: int | None = None) -> bool:
    """See :meth:`EtcdBackend.enqueue <consensus_lease.backends.etcd.EtcdBackend.enqueue>`."""
    keys = ops.layout.job(job_id)
    qkeys = ops.layout.queue(queue)
    marker = QueueMarker(queue, secrets.token_hex(8))
    job_keys = (keys.owner, keys.history, keys.completion, keys.queue)
    success = [
        rq.put(keys.queue, marker.encode()),
        rq.put(qkeys.member(job_id), payload),
        rq.put(qkeys.pending(job_id), b""),
    ]
    if max_attempts is not None:
        success.append(rq.put(keys.limit, Limit(max_attempts, 0, marker.nonce).encode()))
    request = rq.txn(
        compare=[rq.create_is(k, 0) for k in job_keys], success=success,
        failure=[rq.get(keys.queue)],
    )
    what = f"enqueue of {job_id!r} in queue {queue!r}"

    def exists(marker_kv: Any) -> bool:
        """``False`` if the job is already in this queue; else the job exists elsewhere."""
        found = queue_of(marker_kv)
        if found == queue:
            return False
        where = "a job claimed by name" if found is None else f"in queue {found!r}"
        raise InvalidArgument(
            f"{what}: {job_id!r} already exists outside this queue ({where})", job_id=job_id
        )

    def decide(kvs: list[Any]) -> Settled | None:
        marker_kv = kvs[3]
        if marker_kv is not None:
            if QueueMarker.decode(marker_kv.value, marker_kv.key) == marker:
                return Settled(True)  # ours landed
            return Settled(exists(marker_kv))
        if any(kv is not None for kv in kvs[:3]):
            return Settled(exists(None))
        return None  # not applied (yet): the same request again (its compare is guarded)

    ops.txn_limit.check(request, what)
    try:
        answer = ops.send_guarded(request, what, job_id=job_id, generation=None,
                                  read_back=job_keys, decide=decide)
    except InvalidArgument as exc:
        if not too_many_ops(exc):
            raise
        ops.txn_limit.refused(ops, request, what)
        raise ops.txn_limit.too_large(needed_ops(request), what) from exc
    if isinstance(answer, Settled):
        added: bool = answer.value
        return added
    if answer.succeeded:
        return True
    return exists(rq.kv_of(answer.responses[0]))


# -- claimable candidates ----------------------------------------------------------------


def candidates(ops: Ops, queue: str, limit: int) -> list[tuple[str, bytes]]:
    """See :meth:`EtcdBackend.queue_candidates
    <consensus_lease.backends.etcd.EtcdBackend.queue_candidates>`."""
    qkeys = ops.layout.queue(queue)
    out: list[tuple[str, bytes]] = []
    min_create = 0
    what = f"listing the candidates of queue {queue!r}"
    while len(out) < limit:
        page = ops.read(sorted_pending(qkeys, CANDIDATES_PAGE, min_create), what)
        jobs = page_jobs(qkeys, page.kvs)
        checked = ops.txn_limit.read_split(
            ops, jobs, CANDIDATES_PAGE, lambda chunk: _candidate_checks(ops, qkeys, chunk), what
        )
        for chunk, answer in checked:
            found = answer.responses
            for i, (job_id, _) in enumerate(chunk):
                owner, delay, pending, member = found[4 * i : 4 * i + 4]
                member_kv = rq.kv_of(member)
                if (owner.response_range.count == 0 and delay.response_range.count == 0
                        and pending.response_range.count > 0 and member_kv is not None):
                    out.append((job_id, bytes(member_kv.value)))
        if not page.more or not page.kvs:
            break
        min_create = int(page.kvs[-1].create_revision) + 1
    return out[:limit]


def _candidate_checks(ops: Ops, qkeys: QueueKeys, jobs: Sequence[tuple[str, int]]) -> Any:
    """The read-only transaction asking, per job, whether its owner, not-before and
    pending keys exist, and its payload (4 operations per job)."""
    checks = []
    for job_id, _ in jobs:
        keys = ops.layout.job(job_id)
        checks += [
            rq.count(keys.owner),
            rq.count(keys.not_before),
            rq.count(qkeys.pending(job_id)),
            rq.get(qkeys.member(job_id)),
        ]
    return rq.txn(success=checks)


# -- listing ---------------------------------------------------------------------------


def _all_keys(ops: Ops, span: tuple[bytes, bytes], revision: int,
              what: str) -> tuple[int, list[Any]]:
    """Every key (keys only) of ``span`` at ``revision`` (0: now), in key order; returns
    the revision read and the key-values."""
    start, end = span
    out: list[Any] = []
    while True:
        page = ops.read(
            etcdrpc.RangeRequest(key=start, range_end=end, limit=KEYS_PAGE, keys_only=True,
                                 revision=revision),
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
    """See :meth:`EtcdBackend.purge <consensus_lease.backends.etcd.EtcdBackend.purge>`."""
    qkeys = ops.layout.queue(queue)
    what = f"purging queue {queue!r}"
    revision, members = _all_keys(ops, qkeys.members, 0, what)
    _, pendings = _all_keys(ops, qkeys.pendings, revision, what)
    open_jobs = {job_id for job_id, _ in page_jobs(qkeys, pendings)}
    done = [job_id for job_id, _ in sorted(page_jobs(qkeys, members), key=lambda j: j[1])
            if job_id not in open_jobs]
    purged, start = 0, 0
    while start < len(done):
        window = done[start : start + PURGE_BATCH]
        batch = window[: ops.txn_limit.fitting(
            window, lambda ids: _purge_request(ops, qkeys, ids), what)]
        try:
            purged += _purge_batch(ops, qkeys, batch, what)
        except InvalidArgument as exc:  # refused as a whole: nothing of it was written
            if not too_many_ops(exc):
                raise
            ops.txn_limit.refused(ops, _purge_request(ops, qkeys, batch), what)
            continue
        start += len(batch)
    return purged


def _purge_request(ops: Ops, qkeys: QueueKeys, job_ids: Sequence[str]) -> Any:
    """One transaction with a nested one per job: if its completion record exists,
    delete its keys."""
    nested = []
    for job_id in job_ids:
        keys = ops.layout.job(job_id)
        doomed = (keys.completion, keys.history, keys.queue, keys.attempts, keys.error,
                  keys.limit, qkeys.member(job_id), qkeys.pending(job_id))
        nested.append(etcdrpc.RequestOp(request_txn=rq.txn(
            compare=[rq.exists(keys.completion)], success=[rq.delete(k) for k in doomed],
        )))
    return rq.txn(success=nested)


def _purge_batch(ops: Ops, qkeys: QueueKeys, job_ids: list[str], what: str) -> int:
    """Delete the keys of those of ``job_ids`` that are completed, in one transaction
    (a nested one per job, guarded by its completion record existing: a FAILED job, also
    without a pending key, is left alone); return how many. After a lost answer the
    member keys are read back: those gone were purged (by this request, or a concurrent
    purge), the rest are sent again (a FAILED job's nested compare fails again)."""
    purged = 0
    deadline = time.monotonic() + ops.config.connect_timeout_s
    while job_ids:
        try:
            answer = ops.transport.send("kv", "Txn", _purge_request(ops, qkeys, job_ids),
                                        what=what, job_id=job_ids[0])
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
        return purged + sum(bool(r.response_txn.succeeded) for r in answer.responses)
    return purged
