"""Reading and bumping the store epoch (the key ``PREFIX/epoch``; see :mod:`._tokens`).

``bump_epoch(above)`` reads the key, then sends one compare-and-set transaction::

    if mod_revision(PREFIX/epoch) == seen (0: absent):
        put PREFIX/epoch = {epoch: max(epoch + 1, above // 2**44 + 1), nonce}
    else:
        get PREFIX/epoch

A concurrent bump makes the compare fail; the answer carries the key as it is now, and
the bump is decided again from it (both bumps succeed, one after the other). A lost
answer is settled by reading the key back: our nonce there means it landed; the key
unchanged means it did not, and the same request is sent again (its compare cannot
pass twice).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from ...errors import BackendUnavailable, InvalidArgument
from . import _transport_requests as rq
from ._jobs import Ops, Settled
from ._layout import StoreEpoch
from ._tokens import EPOCH_SHIFT, MAX_EPOCH

__all__ = ["MAX_BUMP_ROUNDS", "bump", "read"]

MAX_BUMP_ROUNDS = 8
"""Most compare-and-set rounds of one bump while other bumps keep landing first."""


def read(ops: Ops) -> int:
    """The store epoch, from one linearizable read (also cached for claims).

    Raises:
        BackendUnavailable / AuthenticationFailed.
    """
    (kv,) = ops.read_keys([ops.layout.epoch], "reading the store epoch",
                          time.monotonic() + ops.config.connect_timeout_s, None)
    ops.epochs.update(kv)
    return 0 if kv is None else StoreEpoch.decode(kv.value, kv.key).epoch


def _target(kv: Any, above: int | None) -> int:
    """The epoch a bump from the key-value ``kv`` sets.

    Raises:
        InvalidArgument: it would not fit the int64 token range.
    """
    current = 0 if kv is None else StoreEpoch.decode(kv.value, kv.key).epoch
    epoch = max(current + 1, 0 if above is None else (above >> EPOCH_SHIFT) + 1)
    if epoch > MAX_EPOCH:
        raise InvalidArgument(
            f"cannot bump the etcd store epoch from {current} to {epoch}: tokens are epoch "
            f"* 2**{EPOCH_SHIFT} + revision and must stay below 2**63 (epoch <= {MAX_EPOCH})"
        )
    return epoch


def bump(ops: Ops, above: int | None) -> int:
    """See :meth:`EtcdBackend.bump_epoch
    <consensus_lease.backends.etcd.EtcdBackend.bump_epoch>`."""
    if above is not None and (isinstance(above, bool) or not isinstance(above, int)
                              or above < 0):
        raise InvalidArgument(f"above must be a token (an int >= 0), not {above!r}")
    key = ops.layout.epoch
    nonce = secrets.token_hex(8)
    (kv,) = ops.read_keys([key], "reading the store epoch",
                          time.monotonic() + ops.config.connect_timeout_s, None)
    for _ in range(MAX_BUMP_ROUNDS):
        fresh = StoreEpoch(_target(kv, above), nonce)
        landed, kv = _send_bump(ops, kv, fresh)
        if landed:
            ops.epochs.set(fresh.encode())
            return fresh.epoch
    raise BackendUnavailable("bumping the etcd store epoch: other bumps kept landing first; "
                             "try again")


def _send_bump(ops: Ops, seen: Any, fresh: StoreEpoch) -> tuple[bool, Any]:
    """One compare-and-set of the epoch key from ``seen`` (its key-value, ``None``:
    absent) to ``fresh``: ``(True, _)`` if it landed, else ``(False, the key now)``."""
    key = ops.layout.epoch
    seen_mod = 0 if seen is None else int(seen.mod_revision)
    request = rq.txn(compare=[rq.mod_is(key, seen_mod)], success=[rq.put(key, fresh.encode())],
                     failure=[rq.get(key)])
    what = f"bumping the etcd store epoch to {fresh.epoch}"

    def ours(kv: Any) -> bool:
        return kv is not None and StoreEpoch.decode(kv.value, kv.key) == fresh

    def decide(kvs: list[Any]) -> Settled | None:
        (now,) = kvs
        if ours(now):
            return Settled((True, now))
        if (0 if now is None else int(now.mod_revision)) == seen_mod:
            return None  # not applied: send again
        return Settled((False, now))

    answer = ops.send_guarded(request, what, job_id="", generation=None, read_back=[key],
                              decide=decide)
    if isinstance(answer, Settled):
        settled: tuple[bool, Any] = answer.value
        return settled
    if answer.succeeded:
        return True, None
    now = rq.kv_of(answer.responses[0])
    return ours(now), now  # ours: a first copy landed before a re-send
