"""Waiting for a job of a work queue to become claimable: a read, then etcd watches.

First the queue's open jobs (its pending keys, in key order; only the first page of them
in a queue deeper than :data:`WAIT_TRACKED`) and their owner and not-before keys are
read: if one is neither held nor in a retry delay, there is nothing to wait for.
Otherwise two watches on one stream, from the revision after that read, wake the waiter:

* PUTs under the queue's pending keys: an enqueue (or a requeue);
* DELETEs of job keys of a job held or delayed at the read: its owner key without its
  history key in the same revision (a release, a lease expiry or revoke, a fail; a
  completion also deletes the history key, and frees nothing), or its not-before key
  (the retry delay's lease ran out).

A watch from revision ``r`` delivers every later event in order, and the events of one
revision together, so nothing that happens after the read is missed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from pyetcd import etcdrpc

from ...errors import BackendUnavailable
from . import _transport_requests as rq
from ._jobs import Ops
from ._layout import HISTORY, NOT_BEFORE, OWNER, QueueKeys
from ._queues import page_jobs
from ._transport import Failure
from ._watches import NODELETE, NOPUT, WatchRange, wait_for_events

__all__ = ["WAIT_TRACKED", "wait"]

log = logging.getLogger("consensus_lease.etcd")

WAIT_TRACKED = 1024
"""Most held or delayed jobs ``wait_for_queue`` tracks by name; beyond, any owner or
not-before key deleted anywhere under the prefix wakes it (spuriously, mostly)."""

SNAPSHOT_PAGE = 64
"""Open jobs read per page before waiting: 2 operations each, within etcd's default
``--max-txn-ops`` (128; split further on a server that allows fewer)."""


def _held_snapshot(ops: Ops, qkeys: QueueKeys,
                   budget_s: float) -> tuple[int, set[str] | None, bool]:
    """``(revision, held, complete)``: the open jobs of the queue as of ``revision``
    (or later), if every one is held or delayed (``held``: their ids), else ``None``
    (one looked claimable). ``complete`` is false when more than :data:`WAIT_TRACKED`
    were held."""
    what = f"reading queue {qkeys.queue!r} before waiting"
    held: set[str] = set()
    revision = 0
    start, end = qkeys.pendings
    while True:
        page = ops.read(etcdrpc.RangeRequest(key=start, range_end=end, limit=SNAPSHOT_PAGE,
                                             keys_only=True, revision=revision),
                        what, budget_s=budget_s)
        revision = revision or int(page.header.revision)
        jobs = page_jobs(qkeys, page.kvs)
        checked = ops.txn_limit.read_split(ops, jobs, SNAPSHOT_PAGE, lambda c: _checks(ops, c),
                                           what, budget_s=budget_s)
        for chunk, answer in checked:
            for i, (job_id, _) in enumerate(chunk):
                owner, delay = answer.responses[2 * i : 2 * i + 2]
                if owner.response_range.count == 0 and delay.response_range.count == 0:
                    return revision, None, True
                held.add(job_id)
        if not page.more or not page.kvs:
            return revision, held, True
        if len(held) >= WAIT_TRACKED or page.count > WAIT_TRACKED:
            return revision, held, False
        start = bytes(page.kvs[-1].key) + b"\x00"


def _checks(ops: Ops, jobs: Sequence[tuple[str, int]]) -> Any:
    """A read-only transaction: does each job's owner key, and not-before key, exist?"""
    checks = []
    for job_id, _ in jobs:
        keys = ops.layout.job(job_id)
        checks += [rq.count(keys.owner), rq.count(keys.not_before)]
    return rq.txn(success=checks)


def _freed(ops: Ops, events: Sequence[Any]) -> set[str]:
    """The jobs that DELETE ``events`` (of one revision) may have made claimable."""
    kinds: dict[bytes, set[str]] = {OWNER: set(), HISTORY: set(), NOT_BEFORE: set()}
    for event in events:
        parsed = ops.layout.parse(bytes(event.kv.key))
        if parsed is not None and parsed[1] in kinds:
            kinds[parsed[1]].add(parsed[0])
    return (kinds[OWNER] - kinds[HISTORY]) | kinds[NOT_BEFORE]


def wait(ops: Ops, queue: str, timeout_s: float) -> None:
    """See :meth:`EtcdBackend.wait_for_queue
    <consensus_lease.backends.etcd.EtcdBackend.wait_for_queue>`."""
    deadline = time.monotonic() + timeout_s
    qkeys = ops.layout.queue(queue)
    try:
        budget_s = min(timeout_s, ops.config.timeout_s)
        with ops.transport.bounded(budget_s):  # every page read by one deadline
            revision, held, complete = _held_snapshot(ops, qkeys, budget_s)
        if held is None:
            return  # something looked claimable already
        ranges = [WatchRange(*qkeys.pendings, filters=(NODELETE,))]  # enqueues
        if held or not complete:
            # Owner keys deleted by release or lease expiry (a completion deletes the
            # history key in the same revision, and does not make anything claimable);
            # not-before keys deleted when their lease runs out.
            ranges.append(WatchRange(ops.layout.root, ops.layout.jobs_range_end, (NOPUT,)))

        def wake(index: int, events: Sequence[Any]) -> bool:
            if index != 1:
                return True  # an enqueue (or a watch we cannot place: spurious is fine)
            freed = _freed(ops, events)
            return bool(freed if not complete else freed & held)

        wait_for_events(ops.transport, ranges, revision + 1,
                        max(0.0, deadline - time.monotonic()), wake)
    except (Failure, BackendUnavailable) as exc:
        log.info("etcd: waiting on queue %r failed: %s", queue, exc)
        time.sleep(max(0.0, min(0.2, deadline - time.monotonic())))
