"""Noticing that the cluster's history went back (restored from an older snapshot, or
wiped and re-created), and the one rule after it: no session or claim until
``bump_epoch`` (as ``_tokens_history`` of the other drivers).

**Noticing it**, from the headers of etcd's answers (:class:`RevisionGuard`, which the
transport consults on every answer).

Every etcd answer carries a header with the cluster's ``revision`` and ``cluster_id``.
A linearizable answer (a KV ``Range`` or ``Txn`` without ``serializable``, and the
raft-applied ``LeaseGrant`` and ``LeaseRevoke``) reflects every write that completed
before its request was sent, so in a healthy cluster its revision is never below the
highest revision seen on any answer received before that request was sent. Answers of
concurrent requests may arrive in any order, which is why each request compares with
the :class:`Mark` taken when it was sent, not with whatever was seen since.

Other answers (``LeaseKeepAlive``, ``LeaseTimeToLive``, watches) are filled in by the
member that received the request from its own applied state, which may lag behind the
leader: on a keepalive answer a revision below the mark only makes the driver ask once
more with a linearizable read (see the driver's keepalive); on a ``LeaseTimeToLive``
answer only the cluster id is checked; watch responses are not checked (they only wake
callers, whose reads then are). A different ``cluster_id`` is final on any answer
checked: the endpoints now reach another cluster.

When an answer shows the history went back, the guard tells its listeners (the driver
ends every open session with ``StoreRegressed``), starts a new *era* and takes that
answer's revision and cluster id as the new baseline, so sessions opened afterwards
work on the new history (the operator is told to run ``bump-epoch`` before restarting
workers). An answer to a request sent in an earlier era is still reported as
regressed to its caller (a claim it carries is handed back), without a second round of
notifications. The transport raises ``StoreRegressed`` for a regressed answer.

**The refusal after it** (:class:`Refusal`, which the driver consults before every
session and job operation).

When the revision guard notices that the store's history went back, every session open
is ended with ``StoreRegressed``. Tokens of the restored
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from ...errors import BackendUnavailable, LeaseError, StoreRegressed
from . import _transport_requests as rq
from ._layout import StoreEpoch

if TYPE_CHECKING:
    from ._jobs import Ops

__all__ = ["ADVICE", "MARK_ROUNDS", "Mark", "Refusal", "RegressionMark", "RevisionGuard"]

log = logging.getLogger("consensus_lease.etcd")

MARK_ROUNDS = 8
"""Most read + compare-and-set rounds writing the marker while bumps keep landing."""

ADVICE = (
    "every session of this store is over: stop the workers, run `consensus-lease "
    "bump-epoch --backend URL --above HIGHEST` (HIGHEST: the highest token any "
    "destination accepted), then restart them"
)


class Mark(NamedTuple):
    """What the guard knew when a request was sent: the era and the highest revision.
    (A named tuple: one is made per write answered.)"""

    era: int
    revision: int


class RevisionGuard:
    """The highest revision seen on linearizable answers and the cluster id, per driver.
    Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._era = 0
        self._high = 0
        self._cluster = 0
        self._mark = Mark(0, 0)  # (era, high), replaced whole under the lock
        self._listeners: list[Callable[[str], None]] = []

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` once per detected regression (from the thread that
        detected it; it must not block)."""
        with self._lock:
            self._listeners.append(listener)

    def mark(self) -> Mark:
        """Take before sending a request; hand to :meth:`observe` with its answer."""
        return self._mark  # one atomic read of an immutable pair

    @property
    def high(self) -> int:
        """The highest revision seen on a linearizable answer (this era)."""
        with self._lock:
            return self._high

    def observe(self, header: Any, mark: Mark | None, member: str) -> str | None:
        """Record an answer's ``header``; ``mark`` is the request's :meth:`mark` if the
        answer is linearizable, ``None`` if not (only its cluster id is checked).
        Returns why the history went back, or ``None`` if the answer is consistent."""
        revision, cluster = int(header.revision), int(header.cluster_id)
        with self._lock:
            if cluster == self._cluster and (mark is None or revision >= mark.revision):
                # The common answer: what the checks below pass, without them.
                if mark is not None and revision > self._high:
                    self._high = revision
                    self._mark = Mark(self._era, revision)
                return None
            reason = self._diagnose(revision, cluster, mark, member)
            if reason is None:
                self._cluster = self._cluster or cluster
                if mark is not None and revision > self._high:
                    self._high = revision
                    self._mark = Mark(self._era, revision)
                return None
            fresh = mark is None or mark.era == self._era
            if fresh:
                self._era += 1
                self._high, self._cluster = revision, cluster or self._cluster
                self._mark = Mark(self._era, self._high)
                listeners = list(self._listeners)
        if fresh:
            for listener in listeners:
                listener(reason)
        return reason

    def _diagnose(self, revision: int, cluster: int, mark: Mark | None,
                  member: str) -> str | None:
        if cluster and self._cluster and cluster != self._cluster:
            return (f"etcd member {member} answered for cluster {cluster:x}, not cluster "
                    f"{self._cluster:x} as before: the store was re-created or replaced "
                    f"(its history is not the one tokens came from); {ADVICE}")
        if mark is not None and revision and revision < mark.revision:
            return (f"etcd member {member} answered at revision {revision}, below revision "
                    f"{mark.revision} seen before: the store's history went back (restored "
                    f"from an older snapshot, or wiped); {ADVICE}")
        return None


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
