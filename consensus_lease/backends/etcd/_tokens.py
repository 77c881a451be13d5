"""Fencing tokens: the store epoch folded above the owner key's create revision.

A token is ``epoch * 2**EPOCH_SHIFT + create_revision``. etcd revisions are int64 and
only grow within one history, so ``create_revision < 2**44`` (1.7e13 revisions: 55
years at 10,000 writes per second) leaves 19 bits of epoch under the int64 limit of
fences. Epoch 0, the store's epoch until ``bump_epoch`` first runs, makes the token the
create revision itself, as before there were epochs.

The epoch lives in the key ``PREFIX/epoch`` (:class:`~._layout.StoreEpoch`; absent: 0).
Each driver caches it (:class:`EpochCache`) and every claim transaction compares the
key with the cached copy, so the epoch written into the owner value is the one in
effect at the claim's revision, without a read before the claim. When the compare
fails the transaction's ``else`` branch answers the key and the claim is sent again
with the new epoch (once per driver after each bump).
"""

from __future__ import annotations

import threading
from typing import Any

from ...errors import BackendUnavailable
from . import _transport_requests as rq
from ._layout import StoreEpoch

__all__ = [
    "EPOCH_SHIFT",
    "LOCAL_LIMIT",
    "MAX_EPOCH",
    "EpochCache",
    "TokenOverflow",
    "compose",
    "split",
]

EPOCH_SHIFT = 44
"""Bits of a token below the epoch: the create revision's room."""

LOCAL_LIMIT = 2**EPOCH_SHIFT
"""Create revisions must stay below this."""

MAX_EPOCH = 2 ** (63 - EPOCH_SHIFT) - 1
"""The largest epoch whose tokens fit a signed 64-bit integer."""


class TokenOverflow(BackendUnavailable):
    """The cluster's revision reached 2**44: no token can be made from it."""


def compose(epoch: int, local: int) -> int:
    """The token of a claim whose owner key has create revision ``local``, made in
    ``epoch``.

    Raises:
        TokenOverflow: ``local`` reached 2**44, beyond what the etcd backend's tokens
            can carry.
    """
    if not 0 <= local < LOCAL_LIMIT:
        raise TokenOverflow(
            f"etcd revision {local} is not below 2**{EPOCH_SHIFT}, the limit of the etcd "
            f"backend's fencing tokens (epoch * 2**{EPOCH_SHIFT} + create revision)"
        )
    return (epoch << EPOCH_SHIFT) | local


def split(token: int) -> tuple[int, int]:
    """``(epoch, create revision)`` of a token."""
    return token >> EPOCH_SHIFT, token & (LOCAL_LIMIT - 1)


class EpochCache:
    """The store epoch as this driver last saw it: the epoch key's exact value (``None``:
    absent, epoch 0) and the epoch it holds. Thread-safe.

    Attributes:
        key: the epoch key, ``PREFIX/epoch``.
    """

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._lock = threading.Lock()
        self._raw: bytes | None = None
        self._epoch = 0
        self._compare = rq.create_is(key, 0)

    def current(self) -> tuple[int, Any]:
        """``(epoch, compare)``: the cached epoch, and the compare that holds while the
        epoch key is exactly as cached (its value carries a per-bump nonce, so it never
        repeats). The compare is shared: put it into requests (protobuf copies it), never
        change it."""
        with self._lock:
            return self._epoch, self._compare

    def update(self, kv: Any) -> bool:
        """Cache the epoch key's key-value ``kv`` (``None``: absent); returns whether
        the cached value changed.

        Raises:
            BackendUnavailable: the key's value is corrupt.
        """
        return self.set(None if kv is None else bytes(kv.value))

    def set(self, raw: bytes | None) -> bool:
        """Cache the epoch key's value ``raw`` (``None``: absent); see :meth:`update`."""
        epoch = 0 if raw is None else StoreEpoch.decode(raw, self.key).epoch
        compare = rq.create_is(self.key, 0) if raw is None else rq.value_is(self.key, raw)
        with self._lock:
            changed = raw != self._raw
            self._raw, self._epoch, self._compare = raw, epoch, compare
        return changed

    @property
    def epoch(self) -> int:
        with self._lock:
            return self._epoch
