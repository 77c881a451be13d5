"""``complete_many``: many completions decided in one transaction, each by its own compares.

A batch is one transaction of nested transactions, one per item, each the transaction a
lone completion sends (:class:`~._jobs_hold.Completing`); how batches are cut, sent and
settled after a lost answer is shared with ``release_many`` and ``fail_many``
(:mod:`._jobs_batch`). What is particular to completions:

* the completed counter: the item at position ``i`` puts the counter's shard ``i``
  (:meth:`~._layout.QueueKeys.done`), and ``queue_stats`` sums the shards.
* ``--max-txn-ops``: one completion needs at most 11 operations (2 compares; 3 writes,
  4 for its queue or 1 for an election, at most 3 reads; a failure branch of 2 reads),
  so :data:`MAX_COMPLETE_BATCH` items need at most 111 of etcd's default 128.
* a claim whose handle did not read the job's queue (made by another process, or a
  batch claim settled by reading back) has its queue marker and owner key read first,
  for all such items in read-only transactions of up to 125 reads
  (:func:`~._jobs_batch.read_queues`; the epoch check of :meth:`~._jobs.Ops.check_epoch`
  for a claim without its handle).
* a lost answer reads back each item's owner, completion, attempts, error and limit
  keys: this session's completion record at its generation, or the refusal rule
  (:func:`~._jobs.refusal`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...backend import CompleteItem
from ...errors import LeaseError
from ...record import LeaseRecord
from ._jobs import Ops
from ._jobs_batch import end_many, read_queues
from ._jobs_hold import Completing
from ._sessions import EtcdClaim, EtcdSession

__all__ = ["MAX_COMPLETE_BATCH", "complete_many"]

MAX_COMPLETE_BATCH = 100
"""Completions per ``complete_many`` call and transaction (``capabilities
.max_complete_batch``): at most 111 operations of etcd's default ``--max-txn-ops`` 128."""


def complete_many(ops: Ops, handle: EtcdSession,
                  items: Sequence[CompleteItem]) -> list[LeaseRecord | LeaseError]:
    """See :meth:`EtcdBackend.complete_many
    <consensus_lease.backends.etcd.EtcdBackend.complete_many>`: one transaction per
    chunk (see the module docstring); each item's outcome in its place."""
    outcomes: list[Any] = [None] * len(items)
    batch: list[tuple[int, Completing]] = []
    for index, (job_id, claim, result) in enumerate(items):
        try:
            known = EtcdClaim.of(claim, handle, job_id)
            keys = ops.layout.job(job_id)
            batch.append((index, Completing(ops, handle, keys, claim.generation, known,
                                            None if known is None else known.queue,
                                            bytes(result))))
        except LeaseError as exc:
            outcomes[index] = exc
    end_many(ops, read_queues(ops, batch, outcomes), outcomes, "completion",
             MAX_COMPLETE_BATCH)
    assert all(outcome is not None for outcome in outcomes)
    return outcomes
