"""One rule after a regression: no session or claim until ``bump_epoch``.

When the revision guard (:mod:`._tokens_regression`) notices that the store's history went
back, every session open is ended with ``StoreRegressed``. Tokens of the restored
history are below tokens already handed out, so nothing may claim on it until the
operator raises the epoch (``consensus-lease bump-epoch --above HIGHEST``): the driver
that noticed refuses ``open_session`` and every job operation with ``StoreRegressed``
from then on, and so does every driver opened on the store afterwards, in any process.

What the store holds that tells: the **regression marker**, the key
``PREFIX/regressed`` (:class:`RegressionMark`: the store epoch when it was written and
the reason). The driver that noticed writes it (from a background thread at once, and
again before any refusal if that has not landed yet) with one compare-and-set
transaction on the epoch key's mod revision, so it carries the epoch in effect when it
landed. The store is regressed while the marker's epoch is at least the store epoch:
``bump_epoch`` raises the epoch above it, which ends the refusal everywhere without
deleting anything. A driver opening the store reads the marker in its connect read (no
extra round trip); a refused driver reads the epoch and the marker again (one
linearizable read) on each refused call, so it works again as soon as any process has
bumped.

A bump that lands before the marker (the detecting driver's write is a round trip
behind the detection) is recognised by an epoch above the one cached when the
regression was noticed; a restored history whose epoch is lower than that cached one,
bumped by another process before the marker landed, may need a second bump (the
runbook's ``--above HIGHEST`` makes that one enough).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from ...errors import BackendUnavailable, LeaseError, StoreRegressed
from . import _transport_requests as rq
from ._jobs import Ops
from ._layout import StoreEpoch

__all__ = ["MARK_ROUNDS", "Refusal", "RegressionMark"]

log = logging.getLogger("consensus_lease.etcd")

MARK_ROUNDS = 8
"""Most read + compare-and-set rounds writing the marker while bumps keep landing."""


@dataclass(frozen=True, slots=True)
class RegressionMark:
    """The marker's value: the store epoch when it was written, and why."""

    epoch: int
    reason: str

    def encode(self) -> bytes:
        return json.dumps({"epoch": self.epoch, "reason": self.reason},
                          separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes, key: bytes) -> RegressionMark:
        try:
            obj = json.loads(raw)
            epoch = obj["epoch"]
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise ValueError(epoch)
            return cls(epoch, str(obj["reason"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendUnavailable(
                f"corrupt regression marker at etcd key {key!r}") from exc


@dataclass
class _Noticed:
    reason: str
    known_epoch: int  # the epoch cached when it was noticed
    marked: bool = False  # the marker is in the store (ours or another driver's)


class Refusal:
    """Whether this driver must refuse sessions and claims. Thread-safe.

    Args:
        ops: the driver's shared context (its layout names the marker key).
    """

    def __init__(self, ops: Ops) -> None:
        self.ops = ops
        self.key = ops.layout.root + b"regressed"
        self._lock = threading.Lock()  # serialises reads and writes of the marker
        self._noticed: _Noticed | None = None

    @property
    def refusing(self) -> bool:
        return self._noticed is not None  # one attribute read

    def adopt(self, epoch_kv: Any, marker_kv: Any) -> None:
        """At connect: the epoch key and the marker as read (``None``: absent)."""
        with self._lock:
            mark = self._regressed_by(epoch_kv, marker_kv)
            if mark is not None:
                self._noticed = _Noticed(mark.reason, self.ops.epochs.epoch, marked=True)

    def noticed(self, reason: str) -> None:
        """The guard found the history went back: refuse from now on, and write the
        marker from a background thread (the guard's listener must not block)."""
        with self._lock:
            if self._noticed is None:
                self._noticed = _Noticed(reason, self.ops.epochs.epoch)
        threading.Thread(target=self._mark_quietly, name="etcd-regression-marker",
                         daemon=True).start()

    def bumped(self) -> None:
        """This driver raised the epoch: the operator's answer."""
        with self._lock:
            self._noticed = None

    def check(self) -> None:
        """Raise ``StoreRegressed`` while refusing. Free when not; else one linearizable
        read of the epoch and the marker (and the marker's write, if not done yet).

        Raises:
            StoreRegressed: the store's history went back and the epoch has not been
                raised since.
            BackendUnavailable: the store could not be read (still refusing).
        """
        if self._noticed is None:
            return
        with self._lock:
            noticed = self._noticed
            if noticed is None:
                return
            for _ in range(MARK_ROUNDS):
                epoch_kv, marker_kv = self.ops.read_keys(
                    [self.ops.layout.epoch, self.key], "checking the regression marker",
                    time.monotonic() + self.ops.config.timeout_s, None)
                self.ops.epochs.update(epoch_kv)
                epoch = _epoch_of(epoch_kv)
                mark = self._regressed_by(epoch_kv, marker_kv)
                if mark is not None:
                    noticed.marked = True
                    raise StoreRegressed(noticed.reason)
                if noticed.marked or epoch > noticed.known_epoch:
                    self._noticed = None  # bumped since
                    log.warning("etcd: store epoch raised to %d after a regression: "
                                "sessions and claims work again", epoch)
                    return
                if self._write(epoch_kv, marker_kv, RegressionMark(epoch, noticed.reason)):
                    noticed.marked = True
                    raise StoreRegressed(noticed.reason)
            raise BackendUnavailable("writing the etcd regression marker: the epoch kept "
                                     "changing; still refusing (StoreRegressed)")

    # -- helpers ----------------------------------------------------------------------------

    def _regressed_by(self, epoch_kv: Any, marker_kv: Any) -> RegressionMark | None:
        """The marker, if it says the store is regressed now (its epoch >= the store's)."""
        if marker_kv is None:
            return None
        mark = RegressionMark.decode(bytes(marker_kv.value), self.key)
        return mark if mark.epoch >= _epoch_of(epoch_kv) else None

    def _write(self, epoch_kv: Any, marker_kv: Any, mark: RegressionMark) -> bool:
        """One compare-and-set of the marker, while the epoch key and the marker are as
        read. Returns whether it landed (a lost answer re-sent whose first copy landed
        fails its compare: the next read finds the marker)."""
        epoch_key = self.ops.layout.epoch
        compare = [rq.mod_is(epoch_key, 0 if epoch_kv is None else int(epoch_kv.mod_revision)),
                   rq.mod_is(self.key, 0 if marker_kv is None else int(marker_kv.mod_revision))]
        answer = self.ops.read(rq.txn(compare=compare, success=[rq.put(self.key, mark.encode())]),
                               "writing the regression marker",
                               budget_s=self.ops.config.timeout_s)
        if answer.succeeded:
            log.error("etcd: regression marker written at epoch %d: every store opened on "
                      "this prefix refuses sessions and claims until bump-epoch", mark.epoch)
        return bool(answer.succeeded)

    def _mark_quietly(self) -> None:
        try:
            self.check()
        except StoreRegressed:
            pass  # the marker is in the store
        except LeaseError as exc:  # retried before the next refusal
            log.warning("etcd: writing the regression marker failed (written before the "
                        "next refusal instead): %s", exc)


def _epoch_of(kv: Any) -> int:
    return 0 if kv is None else StoreEpoch.decode(bytes(kv.value), bytes(kv.key)).epoch
