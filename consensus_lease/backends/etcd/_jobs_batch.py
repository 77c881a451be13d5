"""Many job endings decided in one transaction, each by its own compares: the machinery
``complete_many``, ``release_many`` and ``fail_many`` share.

etcd 3.4 nests transactions (``RequestOp.request_txn``; etcd 3.3 and later, see
https://etcd.io/docs/v3.4/learning/api/#transaction). A batch is one transaction without
compares whose ``success`` branch holds, per item, the transaction the lone operation
sends (an :class:`Ending`: :class:`~._jobs_hold.Completing`,
:class:`~._jobs_hold.Releasing`, :class:`~._jobs_fail.Failing`): the item's ownership
compares, then its writes and reads, or (refused) reads of its keys. etcd decides each
nested transaction by its own compares, all evaluated on the store as it was before the
batch (the items' keys are disjoint), so a stale item takes its ``else`` branch while
the others commit: one round trip and one revision for the whole batch, every item
fenced by the store.

What shapes a batch:

* etcd refuses a transaction that puts one key twice, also across sibling nested
  transactions ("duplicate key given in txn request": its ``checkIntervals`` walks the
  nested branches; verified on etcd 3.4.23). Each item's keys are its own (job ids are
  distinct) but a queue's counters, so the item at position ``i`` puts the counter's
  shard ``i`` (:meth:`~._layout.QueueKeys.shard`), and ``queue_stats`` sums the shards
  (:mod:`._queues_index`).
* ``--max-txn-ops`` (128 by default): the outer list has one operation per item, and
  etcd checks each nested transaction against the limit minus that list's length
  (:func:`~._transport_txn_limit.needed_ops`). A server allowing fewer (learnt from its
  first refusal, :mod:`._transport_txn_limit`) gets smaller chunks, each still one
  transaction.
* ``--max-request-bytes`` (1.5 MiB by default): a chunk carries at most
  :data:`BATCH_BYTES` of nested transactions (results included, base64); an item larger
  than that goes alone. A chunk of one item is sent as the lone operation's
  transaction (:meth:`Ending.send`).

A lost answer (:meth:`~._jobs.Ops.send_guarded`): the chunk is one atomic transaction,
so it landed for every item whose compares passed or for none. Each item's keys
(:attr:`Ending.back`, the owner key first) are read back. If an item is still held by
its claim, nothing landed and the same transaction is sent again (never blindly: each
nested compare cannot pass twice, and an item that landed meanwhile takes its ``else``
branch, whose reads tell it is ours); else each item's outcome is read from its keys
(:meth:`Ending.from_keys`).

A chunk etcd refuses as a whole for another reason (a request too large for a server
configured below the default, a job id given twice) applied nothing; its items are then
sent one by one, each with its own outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from pyetcd import etcdrpc

from ...errors import InvalidArgument, LeaseError
from . import _transport_requests as rq
from ._jobs import Ops, Settled
from ._layout import JobKeys, queue_of
from ._sessions import EtcdClaim
from ._transport_txn_limit import too_many_ops

__all__ = ["BATCH_BYTES", "MAX_END_BATCH", "Ending", "Queued", "end_many", "read_first",
           "read_queues"]

BATCH_BYTES = 1024 * 1024
"""Most bytes of nested transactions one batch transaction carries: under etcd's default
``--max-request-bytes`` of 1.5 MiB, with room for the request around them."""

MAX_END_BATCH = 100
"""Releases or failures per ``release_many`` / ``fail_many`` call and transaction
(``capabilities.max_end_batch``): a release needs at most 103 operations (100 nested
transactions, each of 2 compares, 3 writes or 3 reads), a failure at most 108 (8 writes:
the owner, history, error, FAILED and held keys, the pending key, the failed counter's
shard, the index entry), of etcd's default ``--max-txn-ops`` 128."""

_READ_OPS = 125
"""Most reads of one read-only transaction before or after a batch (under 128)."""

R = TypeVar("R", covariant=True)
T = TypeVar("T")
Q = TypeVar("Q", bound="Queued")


class Ending(Protocol[R]):
    """One item of a batch: a job ending (completion, release, failure) prepared to be
    sent, its outcome an ``R`` (or a raised :class:`~consensus_lease.errors.LeaseError`)."""

    keys: JobKeys
    generation: int

    @property
    def back(self) -> tuple[bytes, ...]:
        """The keys read back after a lost answer, the owner key first."""

    def fill(self, request: Any, position: int) -> Any:
        """Write the item's compares and branches into the empty transaction
        ``request``, its queue counters the shards of ``position``."""

    def send(self) -> R:
        """Send the item alone (its lone transaction, a lost answer read back)."""

    def held(self, owner_kv: Any) -> bool:
        """Whether the owner key read back is still the claim's (not applied)."""

    def from_keys(self, kvs: list[Any]) -> R:
        """The outcome from the :attr:`back` key-values, the batch not pending."""

    def answered(self, answer: Any, resent: bool) -> R:
        """The outcome from the item's (nested) transaction response ``answer``;
        ``resent``: the chunk was sent again after a lost answer."""


Outcomes = list[Any]
"""Each item's outcome by its index in the call (``None``: not decided yet, or for a
release, released)."""


def end_many(ops: Ops, batch: Sequence[tuple[int, Ending[Any]]], outcomes: Outcomes,
             noun: str, most: int) -> None:
    """Decide the items of ``batch`` (``(index in outcomes, item)``, in order) in one
    transaction per chunk of at most ``most`` (see the module docstring), putting each
    item's outcome, or its error, at its index in ``outcomes``."""
    start = 0
    while start < len(batch):
        window = batch[start : start + most]
        what = f"{noun} of {len(window)} jobs"
        try:
            fit = ops.txn_limit.fitting(window, lambda c: _compose(c)[0], what)
        except InvalidArgument as exc:  # one item alone is over the server's limit
            outcomes[window[0][0]] = exc
            start += 1
            continue
        request, count = _compose(window[:fit])
        if count == 1:  # exactly the lone operation
            _alone(window[0], outcomes)
            start += 1
        elif _decide(ops, request, window[:count], outcomes, f"{noun} of {count} jobs"):
            start += count


def _compose(window: Sequence[tuple[int, Ending[Any]]]) -> tuple[Any, int]:
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


def _decide(ops: Ops, request: Any, chunk: Sequence[tuple[int, Ending[Any]]],
            outcomes: Outcomes, what: str) -> bool:
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


def _alone(entry: tuple[int, Ending[Any]], outcomes: Outcomes) -> None:
    """Send one item by its lone transaction (:meth:`Ending.send`)."""
    index, item = entry
    try:
        outcomes[index] = item.send()
    except LeaseError as exc:
        outcomes[index] = exc


def _each(chunk: Sequence[tuple[int, Ending[Any]]], outcomes: Outcomes,
          error: LeaseError) -> None:
    for index, _ in chunk:
        outcomes[index] = error


def _outcome(decide: Callable[..., Any], *args: Any) -> Any:
    """``decide(*args)``, or the ``LeaseError`` it raised."""
    try:
        return decide(*args)
    except LeaseError as exc:
        return exc


def _send(ops: Ops, request: Any, chunk: Sequence[tuple[int, Ending[Any]]],
          outcomes: Outcomes, what: str) -> None:
    """One batch transaction, a lost answer settled by reading back (module docstring).

    Raises:
        OutcomeUnknown: reading back failed, or the items still held when
            ``connect_timeout_s`` ran out.
        BackendUnavailable / InvalidArgument / StoreRegressed: as
            :meth:`~._jobs.Ops.send_guarded`; nothing was applied (but StoreRegressed).
    """
    resent = False
    items = [item for _, item in chunk]

    def read_back(deadline: float) -> list[Any]:
        return _read_back(ops, items, what, deadline)

    def decide(found: list[Any]) -> Settled | None:
        nonlocal resent
        if any(item.held(kvs[0]) for item, kvs in zip(items, found, strict=True)):
            resent = True
            return None  # not applied: send the same transaction again
        return Settled([_outcome(item.from_keys, kvs)
                        for item, kvs in zip(items, found, strict=True)])

    first = chunk[0][1]
    answer = ops.send_guarded(request, what, job_id=first.keys.job_id,
                              generation=first.generation, read_back=read_back,
                              decide=decide)
    if isinstance(answer, Settled):
        for (index, _), outcome in zip(chunk, answer.value, strict=True):
            outcomes[index] = outcome
        return
    for (index, item), response in zip(chunk, answer.responses, strict=True):
        outcomes[index] = _outcome(item.answered, response.response_txn, resent)


def _read_back(ops: Ops, items: Sequence[Ending[Any]], what: str,
               deadline: float) -> list[list[Any]]:
    """Per item: its :attr:`Ending.back` key-values (``None``: absent), each item's in
    one linearizable read.

    Raises:
        BackendUnavailable / AuthenticationFailed / StoreRegressed.
    """
    def reads(part: Sequence[Ending[Any]]) -> Any:
        return rq.txn(success=[rq.get(key) for item in part for key in item.back])

    most = max(1, _READ_OPS // max(len(item.back) for item in items))
    found: list[list[Any]] = []
    for part, answer in ops.txn_limit.read_split(
            ops, items, most, reads, f"reading back {what}",
            budget_s=max(0.05, deadline - time.monotonic())):
        kvs = [rq.kv_of(r) for r in answer.responses]
        at = 0
        for item in part:
            found.append(kvs[at : at + len(item.back)])
            at += len(item.back)
    return found


def read_first(ops: Ops, unread: Sequence[tuple[int, T]],
               keys_of: Callable[[T], Sequence[bytes]],
               use: Callable[[T, list[Any]], None], outcomes: Outcomes,
               what: str) -> list[tuple[int, T]]:
    """Before a batch: read the keys ``keys_of(item)`` of each item of ``unread``
    (``(index, item)``; read-only transactions of at most :data:`_READ_OPS` reads) and
    hand them to ``use(item, kvs)``, which raises ``LeaseError`` for an item refused
    (its error is put in ``outcomes``). Returns the items that passed, in order."""
    def reads(part: Sequence[tuple[int, T]]) -> Any:
        return rq.txn(success=[rq.get(key) for _, item in part for key in keys_of(item)])

    most = max(1, _READ_OPS // max(len(keys_of(item)) for _, item in unread))
    try:
        answers = ops.txn_limit.read_split(ops, unread, most, reads, what,
                                           budget_s=ops.config.timeout_s)
    except LeaseError as exc:
        for index, _ in unread:
            outcomes[index] = exc
        return []
    ready: list[tuple[int, T]] = []
    for part, answer in answers:
        kvs = [rq.kv_of(r) for r in answer.responses]
        at = 0
        for index, item in part:
            size = len(keys_of(item))
            try:
                use(item, kvs[at : at + size])
            except LeaseError as exc:
                outcomes[index] = exc
                continue
            finally:
                at += size
            ready.append((index, item))
    return ready


class Queued(Protocol):
    """An item that knows its job's queue once its claim read it (or it was read
    first: :func:`read_queues`)."""

    ops: Ops
    keys: JobKeys
    generation: int
    known: EtcdClaim | None
    queue: str | None
    what: str


def read_queues(ops: Ops, batch: Sequence[tuple[int, Q]],
                outcomes: Outcomes) -> list[tuple[int, Q]]:
    """The items of ``batch`` ready to be sent, in order: those whose claim read the
    job's queue, and the others once their queue markers and owner keys are read, in
    read-only transactions (:func:`read_first`), which sets their queue and, for a
    claim without its handle, checks the epoch part of its token
    (:meth:`~._jobs.Ops.check_epoch`). A refused item has its error put in
    ``outcomes``."""
    unread = [(index, item) for index, item in batch
              if item.known is None or not item.known.queue_known]
    if not unread:
        return list(batch)
    ready = [(index, item) for index, item in batch
             if item.known is not None and item.known.queue_known]
    ready += read_first(ops, unread, _queue_keys, _use_queue, outcomes,
                        f"reading the queues of {len(unread)} jobs")
    return sorted(ready, key=lambda entry: entry[0])


def _queue_keys(item: Queued) -> tuple[bytes, bytes]:
    return item.keys.queue, item.keys.owner


def _use_queue(item: Queued, kvs: list[Any]) -> None:
    marker_kv, owner_kv = kvs
    if item.known is None:
        item.ops.check_epoch(item.keys, item.generation, owner_kv, item.what)
    item.queue = queue_of(marker_kv)
