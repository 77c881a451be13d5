"""Upgrading a work queue written by the first queue layout to the FIFO index.

The first layout had no ordinals: an open job's pending key ``QDIR/p/HEX`` was empty and
candidates were found by a range sorted by its create revision (O(queue depth) per
claim, see :mod:`._queues_index`). This version refuses such a queue
(:func:`._queues_index.layout_refused`) until :func:`upgrade_queue` has run once:

1. list the queue's member and pending keys at one revision; the open jobs (with a
   pending key) get ordinals 0, 1, ... in their old order (the pending key's create
   revision), the others are counted as completed or FAILED;
2. per 40 open jobs, one transaction comparing each pending key's create revision (the
   job is still open, not requeued) puts its ordinal in it and its index entry;
3. one transaction, if ``QDIR/k/seq`` is still absent, puts ``seq``, ``low`` and
   ``base`` (the completed and FAILED count): from then on the queue is served.

Run it with the queue's workers and producers stopped: a job that changes meanwhile
makes it stop with an error (run it again: it starts over, deleting the entries a broken
run left). Jobs held by a session that is still alive are counted as available by
``queue_stats`` until their hold ends (their held markers are not written), and their
payloads are not counted against the queue's payload budget.
"""

from __future__ import annotations

from typing import Any

from ...errors import BackendUnavailable
from . import _transport_requests as rq
from ._jobs import Ops
from ._layout import ordinal_bytes, pair_bytes, pair_of
from ._queues import _all_keys, page_jobs
from ._queues_index import delete_stale
from ._queues_state import Base

__all__ = ["UPGRADE_JOBS", "upgrade_queue"]

UPGRADE_JOBS = 40
"""Open jobs per upgrade transaction: a compare and two puts each."""


def upgrade_queue(ops: Ops, queue: str) -> int:
    """See :meth:`EtcdBackend.upgrade_queue
    <consensus_lease.backends.etcd.EtcdBackend.upgrade_queue>`."""
    qkeys = ops.layout.queue(queue)
    what = f"upgrading queue {queue!r}"
    seq = qkeys.counter("seq")
    if ops.read(rq.txn(success=[rq.count(seq)]), what).responses[0].response_range.count:
        ops.queues.mark_current(queue)
        return 0
    revision, members = _all_keys(ops, qkeys.members, 0, what)
    if not members:  # no such queue: nothing to upgrade, and nothing is written
        return 0
    _, pendings = _all_keys(ops, qkeys.pendings, revision, what)
    opened = sorted((int(kv.create_revision), job_id) for kv in pendings
                     if (job_id := qkeys.job_of(bytes(kv.key))) is not None)
    open_ids = {job_id for _, job_id in opened}
    closed = [job_id for job_id, _ in page_jobs(qkeys, members) if job_id not in open_ids]
    base = _count_closed(ops, closed, revision, what)
    _, entries = _all_keys(ops, qkeys.entries(0, 10**20 - 1), revision, what)
    delete_stale(ops, qkeys, [bytes(kv.key) for kv in entries])
    for start in range(0, len(opened), UPGRADE_JOBS):
        chunk = opened[start : start + UPGRADE_JOBS]
        compare, success = [], []
        for i, (created, job_id) in enumerate(chunk, start):
            pending = qkeys.pending(job_id)
            compare.append(rq.create_is(pending, created))
            success += [rq.put(pending, ordinal_bytes(i)), rq.put(qkeys.entry(i, job_id), b"")]
        _write(ops, rq.txn(compare=compare, success=success), what)
    final = rq.txn(compare=[rq.create_is(seq, 0)],
                   success=[rq.put(seq, pair_bytes(len(opened), 0)),
                            rq.put(qkeys.counter("low"), ordinal_bytes(0)),
                            rq.put(qkeys.counter("base"), base.encode())],
                   failure=[rq.get(seq), rq.get(qkeys.counter("base"))])
    answer = ops.transport.call("kv", "Txn", final, what=what, budget_s=ops.config.timeout_s,
                                job_id=None)
    if not answer.succeeded:  # ours, re-sent after a lost answer, or another writer's
        seq_kv, base_kv = (rq.kv_of(r) for r in answer.responses)
        if pair_of(seq_kv)[0] != len(opened) or Base.of(base_kv) != base:
            raise _changed(what)
    ops.queues.mark_current(queue)
    ops.queues.set_counters(queue, None)
    return len(opened)


def _count_closed(ops: Ops, closed: list[str], revision: int, what: str) -> Base:
    """How many of ``closed`` (jobs without a pending key) are completed and FAILED, at
    ``revision``.

    Raises:
        BackendUnavailable: a job is neither (not a queue of the first layout).
    """
    def reads(chunk: Any) -> Any:
        out = []
        for job_id in chunk:
            keys = ops.layout.job(job_id)
            out += [rq.span(keys.completion, keys.completion + b"\x00", revision),
                    rq.span(keys.failed, keys.failed + b"\x00", revision)]
        return rq.txn(success=out)

    done = failed = 0
    for chunk, answer in ops.txn_limit.read_split(ops, closed, 64, reads, what):
        for i, job_id in enumerate(chunk):
            if answer.responses[2 * i].response_range.kvs:
                done += 1
            elif answer.responses[2 * i + 1].response_range.kvs:
                failed += 1
            else:
                raise BackendUnavailable(f"{what}: job {job_id!r} has no pending key but is "
                                         f"neither completed nor FAILED; nothing was changed",
                                         job_id=job_id)
    return Base(done, failed)


def _write(ops: Ops, request: Any, what: str) -> None:
    """Send one transaction writing ordinals; re-sent after a lost answer (its compares
    still pass once it landed: a put keeps the create revision).

    Raises:
        BackendUnavailable: its compare failed: the queue changed during the upgrade.
    """
    answer = ops.transport.call("kv", "Txn", request, what=what, budget_s=ops.config.timeout_s,
                                job_id=None)
    if not answer.succeeded:
        raise _changed(what)


def _changed(what: str) -> BackendUnavailable:
    return BackendUnavailable(
        f"{what}: the queue changed while upgrading (a worker or producer is still "
        f"running); stop them and run it again (consensus-lease upgrade-queue)")
