"""The server's ``--max-txn-ops``: learnt from its first refusal, then requests split to it.

etcd refuses, before applying anything, a transaction with more operations than
``--max-txn-ops`` (128 by default) in its compare, success or failure list ("too many
operations in txn request"); a nested transaction is checked against the limit minus the
size of the list around it (:func:`needed_ops`). The driver builds the requests whose
size grows with a number of jobs for the default. When a server refuses one, the exact
limit is found with read-only probes (a binary search over transactions of ``count``
reads of the prefix key: about seven round trips, once per backend instance, logged)
and remembered, and the work is sent again in transactions that fit it: reads split
anywhere, writes only between jobs, so each job's write stays one atomic transaction.
When one job's transaction alone needs more, the error is an ``InvalidArgument`` naming
``--max-txn-ops``, the limit and what would be needed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ...errors import InvalidArgument
from . import _transport_requests as rq

if TYPE_CHECKING:
    from ._jobs import Ops

__all__ = ["DEFAULT_MAX_TXN_OPS", "TxnLimit", "needed_ops", "too_many_ops"]

log = logging.getLogger("consensus_lease.etcd")

T = TypeVar("T")

DEFAULT_MAX_TXN_OPS = 128
"""etcd's default ``--max-txn-ops``, assumed until a server refuses a transaction."""

_TOO_MANY = "too many operations in txn request"


def too_many_ops(exc: BaseException) -> bool:
    """Whether ``exc`` is etcd's refusal of a transaction over ``--max-txn-ops``."""
    return isinstance(exc, InvalidArgument) and _TOO_MANY in str(exc)


def needed_ops(request: Any) -> int:
    """The smallest ``--max-txn-ops`` that accepts the transaction ``request``: its
    longest list, plus what its largest nested transaction needs (etcd checks a nested
    transaction against the limit minus the enclosing list's length)."""
    lists = (request.compare, request.success, request.failure)
    nested = [op.request_txn for ops in lists[1:] for op in ops if op.HasField("request_txn")]
    return max(len(ops) for ops in lists) + max(map(needed_ops, nested), default=0)


class TxnLimit:
    """What one backend instance knows of its server's ``--max-txn-ops``. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._max_ops = DEFAULT_MAX_TXN_OPS
        self._learnt = False

    @property
    def max_ops(self) -> int:
        """The most operations per transaction: learnt, or etcd's default before."""
        return self._max_ops

    def too_large(self, need: int, what: str) -> InvalidArgument:
        """The error for one job's transaction that cannot be split to fit."""
        return InvalidArgument(
            f"etcd cannot take {what}: one job's transaction needs {need} operations and "
            f"this server allows {self._max_ops} per transaction (its --max-txn-ops); "
            f"start etcd with --max-txn-ops {need} or more; nothing was written"
        )

    def check(self, request: Any, what: str) -> None:
        """Raise :meth:`too_large` if the learnt limit is below what ``request`` (one
        job's transaction) needs; never before a refusal taught the limit."""
        need = needed_ops(request)
        if self._learnt and need > self._max_ops:
            raise self.too_large(need, what)

    def fitting(self, items: Sequence[T], build: Callable[[Sequence[T]], Any], what: str) -> int:
        """How many of ``items``, from the front, fit one transaction built by ``build``
        under the learnt limit (all of them before a refusal taught it).

        Raises:
            InvalidArgument: not even one fits (see :meth:`too_large`).
        """
        size = len(items)
        while self._learnt:
            need = needed_ops(build(items[:size]))
            if need <= self._max_ops:
                break
            if size <= 1:
                raise self.too_large(need, what)
            size = max(1, min(size - 1, size * self._max_ops // need))
        return size

    def refused(self, ops: Ops, request: Any, what: str) -> None:
        """The server refused ``request`` as too large: learn the exact limit (unless a
        smaller one is known already). Afterwards the limit is below what ``request``
        needs, so splitting by :meth:`fitting` always makes progress.

        Raises:
            BackendUnavailable / AuthenticationFailed: a probe got no answer.
        """
        need = needed_ops(request)
        with self._lock:
            if self._learnt and self._max_ops < need:
                return  # another thread learnt it meanwhile
            fits, refused = 0, need
            while refused - fits > 1:
                middle = (fits + refused) // 2
                if self._probe(ops, middle, what):
                    fits = middle
                else:
                    refused = middle
            self._max_ops, self._learnt = fits, True
        log.warning("etcd: the server allows %d operations per transaction (--max-txn-ops); "
                    "splitting larger requests", fits)

    @staticmethod
    def _probe(ops: Ops, size: int, what: str) -> bool:
        """Whether the server accepts a read-only transaction of ``size`` operations."""
        try:
            ops.read(rq.txn(success=[rq.count(ops.layout.root)] * size),
                     f"probing --max-txn-ops for {what}")
        except InvalidArgument as exc:
            if too_many_ops(exc):
                return False
            raise
        return True

    def read_split(
        self,
        ops: Ops,
        items: Sequence[T],
        most: int,
        build: Callable[[Sequence[T]], Any],
        what: str,
        budget_s: float | None = None,
    ) -> list[tuple[Sequence[T], Any]]:
        """Read-only transactions ``build(chunk)`` over ``items`` in chunks of at most
        ``most``, smaller where the server's limit requires (learnt from the first
        refusal); returns each chunk with its answer, in order.

        Raises:
            InvalidArgument: one item alone needs more than the limit.
            BackendUnavailable / AuthenticationFailed.
        """
        out: list[tuple[Sequence[T], Any]] = []
        start = 0
        while start < len(items):
            window = items[start : start + most]
            chunk = window[: self.fitting(window, build, what)]
            request = build(chunk)
            try:
                answer = ops.read(request, what, budget_s=budget_s)
            except InvalidArgument as exc:
                if not too_many_ops(exc):
                    raise
                self.refused(ops, request, what)
                continue
            out.append((chunk, answer))
            start += len(chunk)
        return out
