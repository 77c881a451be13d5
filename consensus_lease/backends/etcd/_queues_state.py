"""What a driver remembers of its work queues (:class:`QueueCache`), and the queue
counters as read (:class:`Counters`, :class:`Base`); see :mod:`._queues_index` for the
keys and how they are kept."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import BackendUnavailable
from . import _transport_requests as rq
from ._layout import QueueKeys, ordinal_bytes, pair_bytes, pair_of

__all__ = ["FLUSH_STALE", "OFFER_SPREAD", "RESCAN_S", "Base", "Counters", "QueueCache"]

FLUSH_STALE = 32
"""Stale entries remembered before they are deleted (in one transaction while they fit
half the server's ``--max-txn-ops``)."""

RESCAN_S = 1.0
"""How long a driver's scans may start at its cursor (where its last scan found a
candidate) instead of the low-water mark: the held jobs at the front of the queue (and
the gap a long hold leaves behind it) are skipped meanwhile, and a job released or
expired there is offered again within this time (at once when nothing else is)."""

_HINTS = 4096

OFFER_SPREAD = 8
""":meth:`QueueCache.take` picks a random one of the oldest this-many offered candidates
(as ``claim_next`` starts at a random one of the oldest few), so workers of one queue
fed by their own drivers' scans do not all try the same job first."""


class QueueCache:
    """What one driver remembers of its queues: whether each has the current layout,
    the low-water mark reached, stale entries not deleted yet, which queue a recent
    candidate came from (its claim then puts the held marker), and the candidates the
    last scan found and no claim of this driver took yet (*offers*, which the fused
    ``complete_and_claim_next`` claims without scanning again). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: set[str] = set()
        self._low: dict[str, int] = {}
        self._stale: dict[str, list[bytes]] = {}
        self._hints: OrderedDict[str, str] = OrderedDict()
        self._counters: dict[str, Counters] = {}
        self._cursor: dict[str, tuple[int, float]] = {}
        self._offers: dict[str, tuple[float, list[tuple[str, bytes]]]] = {}

    def counters(self, queue: str) -> Counters | None:
        """The counters last seen by an enqueue (``None``: not known)."""
        with self._lock:
            return self._counters.get(queue)

    def set_counters(self, queue: str, counters: Counters | None) -> None:
        with self._lock:
            if counters is None:
                self._counters.pop(queue, None)
            else:
                self._counters[queue] = counters

    def is_current(self, queue: str) -> bool:
        with self._lock:
            return queue in self._current

    def mark_current(self, queue: str) -> None:
        with self._lock:
            self._current.add(queue)

    def low(self, queue: str) -> int:
        with self._lock:
            return self._low.get(queue, 0)

    def raise_low(self, queue: str, low: int) -> None:
        with self._lock:
            self._low[queue] = max(low, self._low.get(queue, 0))

    def cursor(self, queue: str) -> int | None:
        """Where a scan may start: the first candidate of the last scan, unless the
        last scan from the low-water mark is :data:`RESCAN_S` old (``None``)."""
        with self._lock:
            found = self._cursor.get(queue)
            if found is None or time.monotonic() - found[1] >= RESCAN_S:
                return None
            return found[0]

    def move_cursor(self, queue: str, ordinal: int | None, rescanned: bool) -> None:
        """Remember where a scan found its first candidate (``rescanned``: it started
        at the low-water mark, now)."""
        with self._lock:
            last = self._cursor.get(queue)
            since = time.monotonic() if rescanned or last is None else last[1]
            if ordinal is None:
                self._cursor.pop(queue, None)
            else:
                self._cursor[queue] = (ordinal, since)

    def forget_cursor(self, queue: str) -> None:
        """A job of ``queue`` was released (or failed with a retry) here: the next scan
        starts at the low-water mark, where that job keeps its place (and the offered
        candidates are dropped: the next fused claim scans again)."""
        with self._lock:
            self._cursor.pop(queue, None)
            self._offers.pop(queue, None)

    def forget_cursors(self) -> None:
        """A session of this driver ended (closed, revoked or expired): its held jobs
        are claimable again at their old places, in any queue: every scan starts at the
        low-water mark next (and every offer is dropped)."""
        with self._lock:
            self._cursor.clear()
            self._offers.clear()

    def offer(self, queue: str, found: Sequence[tuple[str, bytes]]) -> None:
        """Remember the candidates ``(job_id, payload)`` a scan of ``queue`` just found,
        oldest first (replacing those of the last scan), for :meth:`take`."""
        with self._lock:
            self._offers[queue] = (time.monotonic(), list(found))

    def take(self, queue: str, exclude: str) -> tuple[str, bytes] | None:
        """Take (and forget) one of the candidates the last scan of ``queue`` offered:
        a random one of the oldest :data:`OFFER_SPREAD` left, never ``exclude``;
        ``None`` when none is left or the scan is :data:`RESCAN_S` old (no offer is
        staler than the cursor). A hint only: the claim's compares decide."""
        with self._lock:
            offered = self._offers.get(queue)
            if offered is None or time.monotonic() - offered[0] >= RESCAN_S:
                self._offers.pop(queue, None)
                return None
            left = [c for c in offered[1] if c[0] != exclude]
            if not left:
                self._offers.pop(queue, None)
                return None
            pick = left.pop(random.randrange(min(len(left), OFFER_SPREAD)))
            self._offers[queue] = (offered[0], left)
            return pick

    def drop_offers(self, queue: str) -> None:
        """The offered candidates of ``queue`` proved stale (one was taken by another
        claimer): the next fused claim scans again."""
        with self._lock:
            self._offers.pop(queue, None)

    def taken(self, job_ids: Sequence[str]) -> None:
        """This driver claimed ``job_ids``: they are no candidates any more (each is
        looked up in the queue it was a candidate of)."""
        with self._lock:
            for job_id in job_ids:
                queue = self._hints.get(job_id)
                offered = None if queue is None else self._offers.get(queue)
                if queue is not None and offered is not None:
                    left = [c for c in offered[1] if c[0] != job_id]
                    if len(left) < len(offered[1]):
                        self._offers[queue] = (offered[0], left)

    def add_stale(self, queue: str, keys: Sequence[bytes]) -> list[bytes]:
        """Remember stale entries; return (and forget) them all once there are at least
        :data:`FLUSH_STALE`, else ``[]``."""
        with self._lock:
            pile = self._stale.setdefault(queue, [])
            pile.extend(keys)
            if len(pile) < FLUSH_STALE:
                return []
            del self._stale[queue]
            return pile

    def hint(self, job_id: str, queue: str) -> None:
        with self._lock:
            self._hints[job_id] = queue
            self._hints.move_to_end(job_id)
            while len(self._hints) > _HINTS:
                self._hints.popitem(last=False)

    def queue_hint(self, job_id: str) -> str | None:
        """The queue a recent candidate ``job_id`` came from (``None``: unknown)."""
        with self._lock:
            return self._hints.get(job_id)

@dataclass(frozen=True, slots=True)
class Counters:
    """A queue's ordinal counter ``seq`` and payload bytes enqueued (``exists`` false:
    the queue has no job of the current layout yet), and the counters enqueue checks the
    capacity with; ``base`` is the jobs an upgrade from the first layout found without
    an ordinal (completed or FAILED)."""

    seq: int
    exists: bool
    requeued: int
    purged: int
    base: int
    enqueued_bytes: int = 0
    purged_bytes: int = 0

    @property
    def jobs(self) -> int:
        """Jobs in the queue: ordinals handed out (and the upgrade's base), less
        requeues (a second ordinal for one job) and purged jobs."""
        return self.seq + self.base - self.requeued - self.purged

    @property
    def payload_bytes(self) -> int:
        """Payload bytes of the jobs in the queue (those enqueued by the first layout
        not counted)."""
        return self.enqueued_bytes - self.purged_bytes

    def after(self, count: int, size: int) -> Counters:
        """These counters after ``count`` more ordinals were taken for ``size`` more
        payload bytes."""
        return dataclasses.replace(self, seq=self.seq + count, exists=True,
                                   enqueued_bytes=self.enqueued_bytes + size)

    @classmethod
    def of(cls, seq_kv: Any, base_kv: Any, requeued_kv: Any, purged_kv: Any) -> Counters:
        """From the key-values answered by :meth:`reads`."""
        seq, enqueued = pair_of(seq_kv)
        purged, purged_bytes = pair_of(purged_kv)
        return cls(seq, seq_kv is not None,
                   0 if requeued_kv is None else int(requeued_kv.version),
                   purged, Base.of(base_kv).jobs, enqueued, purged_bytes)

    @staticmethod
    def reads(qkeys: QueueKeys) -> list[Any]:
        """The reads that answer :meth:`of`."""
        return [rq.get(qkeys.counter(n)) for n in ("seq", "base", "requeued", "purged")]

    def same_seq(self, qkeys: QueueKeys) -> Any:
        """Compare: ``seq`` is still what these counters say."""
        if not self.exists:
            return rq.create_is(qkeys.counter("seq"), 0)
        return rq.value_is(qkeys.counter("seq"), pair_bytes(self.seq, self.enqueued_bytes))

    def taking(self, qkeys: QueueKeys, count: int, size: int = 0) -> list[Any]:
        """The puts that take ``count`` ordinals from ``seq`` for ``size`` more payload
        bytes (creating ``low`` with the queue's first job)."""
        puts = [rq.put(qkeys.counter("seq"),
                       pair_bytes(self.seq + count, self.enqueued_bytes + size))]
        if not self.exists:
            puts.append(rq.put(qkeys.counter("low"), ordinal_bytes(0)))
        return puts


@dataclass(frozen=True, slots=True)
class Base:
    """``QDIR/k/base``, written once by an upgrade from the first layout: the jobs it
    found completed and FAILED (which got no ordinal), added to the counters."""

    done: int = 0
    failed: int = 0

    @property
    def jobs(self) -> int:
        return self.done + self.failed

    def encode(self) -> bytes:
        return json.dumps({"done": self.done, "failed": self.failed}).encode()

    @classmethod
    def of(cls, kv: Any) -> Base:
        """From the key-value (absent: zeros).

        Raises:
            BackendUnavailable: the value does not parse.
        """
        if kv is None:
            return cls()
        try:
            obj = json.loads(kv.value)
            return cls(int(obj["done"]), int(obj["failed"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendUnavailable(
                f"corrupt queue base at etcd key {bytes(kv.key)!r}") from exc
