"""``complete_many``: many completions decided in one transaction, each by its own compares.

etcd 3.4 nests transactions (``RequestOp.request_txn``; etcd 3.3 and later, see
https://etcd.io/docs/v3.4/learning/api/#transaction). A batch is one transaction without
compares whose ``success`` branch holds, per item, the transaction a lone completion
sends (:class:`~._jobs_hold.Completing`): the item's ownership compares, then its writes
and reads, or (refused) a read of its owner and completion keys. etcd decides each
nested transaction by its own compares, all evaluated on the store as it was before the
batch (the items' keys are disjoint anyway), so a stale item takes its ``else`` branch
while the others commit: one round trip and one revision for the whole batch, every
item fenced by the store.

What shapes a batch:

* etcd refuses a transaction that puts one key twice, also across sibling nested
  transactions ("duplicate key given in txn request": its ``checkIntervals`` walks the
  nested branches; verified on etcd 3.4.23). Each item's keys are its own (job ids are
  distinct) but for a queued job the completed counter, so the item at position ``i``
  puts the counter's shard ``i`` (:meth:`~._layout.QueueKeys.done`), and ``queue_stats``
  sums the shards (:mod:`._queues_index`).
* ``--max-txn-ops`` (128 by default): the outer list has one operation per item, and
  etcd checks each nested transaction against the limit minus that list's length
  (:func:`~._transport_txn_limit.needed_ops`). One completion needs at most 11
  (2 compares; 3 writes, 4 for its queue or 1 for an election, at most 3 reads; a
  failure branch of 2 reads), so :data:`MAX_COMPLETE_BATCH` items need at most 111. A
  server allowing fewer (learnt from its first refusal, :mod:`._transport_txn_limit`)
  gets smaller chunks, each still one transaction.
* ``--max-request-bytes`` (1.5 MiB by default): a chunk carries at most
  :data:`BATCH_BYTES` of nested transactions (results included, base64); an item larger
  than that goes alone. A chunk of one item is sent as a lone completion's transaction.

A claim whose handle did not read the job's queue (made by another process, or a batch
claim settled by reading back) has its queue marker and owner key read first, for all
such items in one read-only transaction (per 64; the epoch check of
:meth:`~._jobs.Ops.check_epoch` for a claim without its handle).

A lost answer (:meth:`~._jobs.Ops.send_guarded`): the batch is one atomic transaction,
so it landed for every item or for none. Each item's owner, completion, attempts, error
and limit keys are read back. If an item is still held by its claim, nothing landed and
the same transaction is sent again (never blindly: each nested compare cannot pass
twice, and an item that landed meanwhile takes its ``else`` branch, whose read of its
completion record tells it is ours); else each item's outcome is read from its keys:
this session's completion record at its generation, or the refusal rule
(:func:`~._jobs.refusal`).

A chunk etcd refuses as a whole for another reason (a request too large for a server
configured below the default, a job id given twice) applied nothing; its items are then
completed one by one, each with its own outcome.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pyetcd import etcdrpc

from ...backend import CompleteItem
from ...errors import InvalidArgument, LeaseError
from ...record import LeaseRecord
from . import _transport_requests as rq
from ._jobs import Ops, Settled
from ._jobs_hold import Completing
from ._layout import queue_of
from ._layout_records import Lifecycle
from ._sessions import EtcdClaim, EtcdSession
from ._transport_txn_limit import too_many_ops

__all__ = ["BATCH_BYTES", "MAX_COMPLETE_BATCH", "complete_many"]

MAX_COMPLETE_BATCH = 100
"""Completions per ``complete_many`` call and transaction (``capabilities
.max_complete_batch``): at most 111 operations of etcd's default ``--max-txn-ops`` 128."""

BATCH_BYTES = 1024 * 1024
"""Most bytes of nested transactions one batch transaction carries: under etcd's default
``--max-request-bytes`` of 1.5 MiB, with room for the request around them."""

_QUEUE_READS = 64
"""Items whose queue markers and owner keys one read-only transaction reads (2 each)."""

_READ_BACK = 25
"""Items one read-back transaction reads after a lost answer (5 keys each)."""

Item = tuple[int, Completing]
"""An item of the batch: its index in the call's ``items``, its completion."""


def complete_many(ops: Ops, handle: EtcdSession,
                  items: Sequence[CompleteItem]) -> list[LeaseRecord | LeaseError]:
    """See :meth:`EtcdBackend.complete_many
    <consensus_lease.backends.etcd.EtcdBackend.complete_many>`: one transaction per
    chunk (see the module docstring); each item's outcome in its place."""
    outcomes: list[LeaseRecord | LeaseError | None] = [None] * len(items)
    batch = _prepare(ops, handle, items, outcomes)
    start = 0
    while start < len(batch):
        window = batch[start : start + MAX_COMPLETE_BATCH]
        try:
            fit = ops.txn_limit.fitting(window, lambda c: _compose(c)[0],
                                        f"completion of {len(window)} jobs")
        except InvalidArgument as exc:  # one item alone is over the server's limit
            outcomes[window[0][0]] = exc
            start += 1
            continue
        request, count = _compose(window[:fit])
        if count == 1:  # exactly a lone completion
            _alone(window[0], outcomes)
            start += 1
        elif _decide(ops, request, window[:count], outcomes, f"completion of {count} jobs"):
            start += count
    done = [outcome for outcome in outcomes if outcome is not None]
    assert len(done) == len(items)
    return done


def _compose(window: Sequence[Item]) -> tuple[Any, int]:
    """The batch transaction of the items of ``window`` from the front, up to
    :data:`BATCH_BYTES` of nested transactions (at least one item), and how many it
    holds."""
    request = etcdrpc.TxnRequest()
    size = 0
    for position, (_, item) in enumerate(window):
        op = request.success.add()
        item.fill(op.request_txn, position)
        size += op.ByteSize()
        if position and size > BATCH_BYTES:
            del request.success[-1]
            return request, position
    return request, len(window)


def _decide(ops: Ops, request: Any, chunk: Sequence[Item],
            outcomes: list[LeaseRecord | LeaseError | None], what: str) -> bool:
    """Send one chunk's transaction and put each item's outcome in ``outcomes``;
    ``False``: the server's ``--max-txn-ops`` was just learnt, split again."""
    try:
        _send(ops, request, chunk, outcomes, what)
    except InvalidArgument as exc:
        if too_many_ops(exc):
            try:
                ops.txn_limit.refused(ops, request, what)
            except LeaseError as failed:
                _each(chunk, outcomes, failed)
                return True
            return False
        for entry in chunk:  # refused as a whole, nothing applied: one by one
            _alone(entry, outcomes)
    except LeaseError as exc:  # nothing of it known applied: every item's outcome
        _each(chunk, outcomes, exc)
    return True


def _alone(entry: Item, outcomes: list[LeaseRecord | LeaseError | None]) -> None:
    """Complete one item by its lone transaction (:meth:`Completing.send`)."""
    index, item = entry
    try:
        outcomes[index] = item.send()
    except LeaseError as exc:
        outcomes[index] = exc


def _each(chunk: Sequence[Item], outcomes: list[LeaseRecord | LeaseError | None],
          error: LeaseError) -> None:
    for index, _ in chunk:
        outcomes[index] = error


def _send(ops: Ops, request: Any, chunk: Sequence[Item],
          outcomes: list[LeaseRecord | LeaseError | None], what: str) -> None:
    """One batch transaction, a lost answer settled by reading back (module docstring).

    Raises:
        OutcomeUnknown: reading back failed, or the items still held when
            ``connect_timeout_s`` ran out.
        BackendUnavailable / InvalidArgument / StoreRegressed: as
            :meth:`~._jobs.Ops.send_guarded`; nothing was applied (but StoreRegressed).
    """
    def read_back(deadline: float) -> list[Any]:
        return _read_back(ops, [item for _, item in chunk], what, deadline)

    def decide(found: list[Any]) -> Settled | None:
        if any(item.held(kvs[0]) for (_, item), kvs in zip(chunk, found, strict=True)):
            return None  # not applied: send the same transaction again
        return Settled([_settled(item, kvs) for (_, item), kvs in zip(chunk, found,
                                                                       strict=True)])

    first = chunk[0][1]
    answer = ops.send_guarded(request, what, job_id=first.keys.job_id,
                              generation=first.generation, read_back=read_back,
                              decide=decide)
    if isinstance(answer, Settled):
        for (index, _), outcome in zip(chunk, answer.value, strict=True):
            outcomes[index] = outcome
        return
    for (index, item), response in zip(chunk, answer.responses, strict=True):
        try:
            outcomes[index] = item.answered(response.response_txn)
        except LeaseError as exc:
            outcomes[index] = exc


def _read_back(ops: Ops, items: Sequence[Completing], what: str,
               deadline: float) -> list[list[Any]]:
    """Per item: its owner, completion, attempts, error and limit key-values (``None``:
    absent), each item's in one linearizable read.

    Raises:
        BackendUnavailable / AuthenticationFailed / StoreRegressed.
    """
    def reads(part: Sequence[Completing]) -> Any:
        return rq.txn(success=[rq.get(key) for item in part for key in (
            item.keys.owner, item.keys.completion, item.keys.attempts, item.keys.error,
            item.keys.limit)])

    found: list[list[Any]] = []
    for part, answer in ops.txn_limit.read_split(
            ops, items, _READ_BACK, reads, f"reading back {what}",
            budget_s=max(0.05, deadline - time.monotonic())):
        kvs = [rq.kv_of(r) for r in answer.responses]
        found += [kvs[5 * n : 5 * n + 5] for n in range(len(part))]
    return found


def _settled(item: Completing, kvs: list[Any]) -> LeaseRecord | LeaseError:
    """An item's outcome from its keys read back, the batch not (or no longer) pending:
    this session's completion record at its generation, else the refusal."""
    owner_kv, completion_kv, attempts_kv, error_kv, limit_kv = kvs
    try:
        done = item.ours(completion_kv)
        if done is not None:
            return item.completed(done, Lifecycle.of(attempts_kv, error_kv, limit_kv))
        return item.refused(owner_kv, completion_kv)
    except LeaseError as exc:  # a corrupt record
        return exc


def _prepare(ops: Ops, handle: EtcdSession, items: Sequence[CompleteItem],
             outcomes: list[LeaseRecord | LeaseError | None]) -> list[Item]:
    """Each item's :class:`Completing`, in order; an item refused before anything is
    sent (a claim of another backend) has its error put in ``outcomes`` instead. The
    queues the claims did not read are read first (:func:`_read_queues`)."""
    batch: list[Item] = []
    unread: list[tuple[Item, EtcdClaim | None]] = []
    for index, (job_id, claim, result) in enumerate(items):
        try:
            known = EtcdClaim.of(claim, handle, job_id)
            keys = ops.layout.job(job_id)
            item = Completing(ops, handle, keys, claim.generation, known,
                              None if known is None else known.queue, bytes(result))
        except LeaseError as exc:
            outcomes[index] = exc
            continue
        if known is not None and known.queue_known:
            batch.append((index, item))
        else:
            unread.append(((index, item), known))
    if unread:
        batch += _read_queues(ops, unread, outcomes)
        batch.sort(key=lambda entry: entry[0])
    return batch


def _read_queues(ops: Ops, unread: Sequence[tuple[Item, EtcdClaim | None]],
                 outcomes: list[LeaseRecord | LeaseError | None]) -> list[Item]:
    """Read the queue marker and owner key of each item of ``unread`` (read-only
    transactions of :data:`_QUEUE_READS` items), set its queue and, for a claim without
    its handle, check the epoch part of its token (:meth:`~._jobs.Ops.check_epoch`).
    Returns the items that passed; the others' errors are put in ``outcomes``."""
    what = f"reading the queues of {len(unread)} jobs"

    def reads(part: Sequence[tuple[Item, EtcdClaim | None]]) -> Any:
        return rq.txn(success=[rq.get(key) for (_, item), _known in part
                               for key in (item.keys.queue, item.keys.owner)])

    try:
        answers = ops.txn_limit.read_split(ops, unread, _QUEUE_READS, reads, what,
                                           budget_s=ops.config.timeout_s)
    except LeaseError as exc:
        for (index, _), _known in unread:
            outcomes[index] = exc
        return []
    ready: list[Item] = []
    for part, answer in answers:
        for n, ((index, item), known) in enumerate(part):
            marker_kv, owner_kv = (rq.kv_of(r) for r in answer.responses[2 * n : 2 * n + 2])
            try:
                if known is None:
                    ops.check_epoch(item.keys, item.generation, owner_kv, item.what)
                item.queue = queue_of(marker_kv)
            except LeaseError as exc:
                outcomes[index] = exc
                continue
            ready.append((index, item))
    return ready
