"""The store-wide capacity: every job and payload byte of one store (chroot), over every
queue and named job, against the options ``store_max_jobs`` and ``store_max_bytes``.

Every ZooKeeper server keeps every znode in its heap, so the ensemble, not one queue,
is what runs out: on a 256 MB-heap ensemble about 61,000 queued jobs (two full queues
and part of a third) made two of three servers exit. The per-queue capacity
(:data:`._queues.MAX_QUEUE_JOBS`) cannot see that; this check can, and refuses the
enqueue with ``QueueFull`` before anything is sent.

What is counted, and how (no counter of our own, so nothing can drift):

* jobs: the ``numChildren`` of ``{chroot}/jobs``, kept by the server itself. Every job
  znode is a child, queued or named (claimed by name), until purged; one ``exists``
  read, O(1), exact at the moment it is read whatever other processes do.
* payload bytes: the sum of the queue heads' ``bytes`` (each exact: every enqueue and
  purge multi writes its queue's head at the version read). O(queues): the queue list
  (the children of ``{chroot}/queues``) is kept and listed again only when the parent's
  ``cversion`` says a queue was made or deleted; the heads are read in the same
  pipelined round trip as the job count (the first :data:`_HEADS_CHUNK`; one more round
  trip per further chunk, and one for the heads of rotated queues). While the sum is below half of
  ``store_max_bytes`` (and was read less than :data:`BYTES_MAX_AGE_S` ago) the heads
  are not read again; above, before every enqueue multi.

The check is made before each enqueue multi (reads only, no ``sync``; one round trip
unless the queues are many, changed or rotated, as above): it
is exact for one process; enqueues of other processes in flight at that moment (at
most ``ENQUEUE_BATCH`` jobs and ``ENQUEUE_MULTI_BYTES`` each) can pass it together.
Completion results of named jobs are not payload bytes and are not counted (they are
bounded by ``max_result_bytes`` each, and by the job count).

Sizing (measured, ``docs/capacity.md``): a job (120-character id, 100-byte payload) is
about 2.8 KB of live heap on every server, a named job claimed and completed about
1.7 KB; on top, each server keeps its last 500 writes whole (the committed log, up to
about 80 MB of bytes while enqueue multis fill a queue) and ~16 MB of its own. Heap
needed ≈ 96 MB + (store_max_jobs x 3 KB + store_max_bytes) x 1.5 while those writes
are small. Measured at the limit since (2026-12-03, ``benchmarks/zk_heap_resync.py``):
the committed log takes about 3-3.5 x its bytes of the leader's heap, so 500 writes of
160 KB (the cap of one enqueue multi) need ~270 MB, and a 256 MB ensemble holding
18,000 jobs lost a rejoining member to OutOfMemoryError; for serving and rejoining
alike, heap ≈ 16 MB + 3.5 x 500 x W + 2.5 x (store_max_jobs x 3 KB + store_max_bytes),
W the largest write made in bulk (160 KB for enqueue multis): :func:`heap_needed_mb`,
≈ 550 MB for the defaults. Stock ZooKeeper's ``zkServer.sh`` gives a server 1000 MB
(``ZK_SERVER_HEAP``); the kit and ``docker/`` give theirs
``consensus_lease.testing.engine.ZOOKEEPER_HEAP_MB`` (640 MB), measured to keep the
defaults' ensemble through rejoins under 160 KB writes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ...errors import QueueFull
from . import _config
from ._layout import BUCKET_DIGITS, HEAD_DIR, CorruptData, LegacyQueueLayout, QueueHead
from ._transport import Read, Wire

__all__ = ["BYTES_MAX_AGE_S", "DEFAULT_STORE_MAX_BYTES", "DEFAULT_STORE_MAX_JOBS",
           "StoreCapacity", "heap_needed_mb"]

DEFAULT_STORE_MAX_JOBS = _config.DEFAULT_STORE_MAX_JOBS
"""Default of the option ``store_max_jobs``: jobs of every queue and named job. One full
queue (25,000) fits beside 5,000 more jobs. With :data:`DEFAULT_STORE_MAX_BYTES` and
160 KB enqueue multis in the committed log the servers need :func:`heap_needed_mb` ≈
550 MB of heap each (measured at the limit: module docstring, ``docs/capacity.md``):
stock ZooKeeper's 1000 MB fits, so do the kit's and ``docker/``'s 640 MB; 256 MB does
not."""

DEFAULT_STORE_MAX_BYTES = _config.DEFAULT_STORE_MAX_BYTES
"""Default of the option ``store_max_bytes``: payload bytes of every queue (the same as
one queue's ``MAX_QUEUE_BYTES``)."""

BYTES_MAX_AGE_S = 1.0
"""How long a sum of the queue heads' bytes below half of ``store_max_bytes`` is used
before the heads are read again."""

_HEADS_CHUNK = 64
"""Queue heads read per round trip (below the gate's cap on requests in flight)."""

COMMIT_LOG_COUNT = 500
"""Transactions each server keeps whole in memory (``zookeeper.commitLogCount``'s
default): the committed log that lets a follower catch up by DIFF."""

HEAP_BASE_MB = 16.0
"""Heap a ZooKeeper 3.8 server uses for itself, MiB (measured: GC log, empty tree)."""

HEAP_PER_LOG_BYTE = 3.5
"""Heap per byte of the committed log's transactions (measured: 3-3.5 on the leader)."""

HEAP_PER_JOB_BYTES = 3 * 1024
"""Heap per job of the tree, bytes (measured 1.7-2.8 KB with 120-character ids)."""

HEAP_TREE_FACTOR = 2.5
"""Room over the tree: the collector's, and a second tree while a member syncs by SNAP."""


def heap_needed_mb(store_max_jobs: int, store_max_bytes: int, write_bytes: int) -> float:
    """Heap, MiB, a ZooKeeper server needs to keep serving and rejoining with a store at
    these limits while transactions of ``write_bytes`` are written in bulk (an enqueue
    multi's cap ``_queues.ENQUEUE_MULTI_BYTES``, or ``max_result_bytes`` for bulk
    completions), by the rule measured at the limit (``docs/capacity.md``,
    ``benchmarks/zk_heap_resync.py``)::

        16 MiB + 3.5 x 500 x write_bytes + 2.5 x (store_max_jobs x 3 KiB + store_max_bytes)

    For the defaults and 160 KiB multis: 16 + 273.4 + 2.5 x (87.9 + 16) ≈ 549 MiB. Stores
    (chroots) sharing one ensemble share its heap: add their tree terms (and count the
    committed log once). Pure arithmetic: no errors, no store needed.
    """
    log = HEAP_PER_LOG_BYTE * COMMIT_LOG_COUNT * write_bytes
    tree = HEAP_TREE_FACTOR * (store_max_jobs * HEAP_PER_JOB_BYTES + store_max_bytes)
    return HEAP_BASE_MB + (log + tree) / (1024 * 1024)


class StoreCapacity:
    """The store-wide check before an enqueue multi. Thread-safe.

    Args:
        wire: the round trips (reads on the shared client).
        write_bytes: the largest enqueue multi, bytes: the ``W`` of the heap rule the
            refusals quote (:func:`heap_needed_mb`).
    """

    def __init__(self, wire: Wire, write_bytes: int) -> None:
        self.wire = wire
        self.config = wire.config
        self.write_bytes = write_bytes
        self._lock = threading.Lock()
        self._queues: tuple[int, tuple[str, ...]] | None = None  # (cversion, names)
        self._bytes: tuple[float, int] | None = None  # (monotonic time read, sum)

    def check(self, jobs: int, nbytes: int, what: str) -> None:
        """Refuse adding ``jobs`` jobs of ``nbytes`` payload bytes if the store would
        then hold more than ``store_max_jobs`` jobs or ``store_max_bytes`` bytes.

        Raises:
            QueueFull: it would; nothing was enqueued.
            BackendUnavailable: the counts could not be read by the call's deadline.
        """
        max_jobs, max_bytes = self.config.store_max_jobs, self.config.store_max_bytes
        with self._lock:
            known = self._bytes
        fresh = known is not None and time.monotonic() - known[0] < BYTES_MAX_AGE_S \
            and known[1] + nbytes <= max_bytes // 2
        held_jobs, held_bytes = self.usage(read_bytes=not fresh, what=what)
        if held_bytes is None:
            assert known is not None
            held_bytes = known[1]
        heap = (f"the servers' heap: ≈ {heap_needed_mb(max_jobs, max_bytes, self.write_bytes):.0f}"
                f" MB each for these limits with bulk enqueues")
        if held_jobs + jobs > max_jobs:
            raise QueueFull(
                f"{what}: the store holds {held_jobs} jobs (every queue and named job); "
                f"{jobs} more would pass its store-wide limit of {max_jobs} (option "
                f"store_max_jobs: size it, and {heap}, as docs/capacity.md says; or purge "
                f"completed jobs); nothing was enqueued")
        if held_bytes + nbytes > max_bytes:
            raise QueueFull(
                f"{what}: the store's queues hold {held_bytes} payload bytes; {nbytes} "
                f"more would pass its store-wide limit of {max_bytes} (option "
                f"store_max_bytes: size it, and {heap}, as docs/capacity.md says; or "
                f"purge completed jobs); nothing was enqueued")

    def added(self, nbytes: int) -> None:
        """An enqueue multi of this process added ``nbytes`` payload bytes."""
        with self._lock:
            if self._bytes is not None:
                self._bytes = (self._bytes[0], self._bytes[1] + nbytes)

    def usage(self, *, read_bytes: bool = True, what: str = "store usage",
              ) -> tuple[int, int | None]:
        """``(jobs, payload bytes)`` of the store now (bytes ``None`` unless
        ``read_bytes``): the ``numChildren`` of ``{chroot}/jobs`` and the sum of the
        queue heads' ``bytes``."""
        base, queues_base = self.config.base, self.config.queues_base
        for _ in range(3):
            with self._lock:
                listed = self._queues
            names = () if listed is None or not read_bytes else listed[1]
            reads: list[Read] = [("exists", base), ("exists", queues_base)]
            reads += [("get", f"{queues_base}/{name}") for name in names[:_HEADS_CHUNK]]
            answers = self.wire.reader_read(reads, what)
            jobs = 0 if answers[0] is None else int(answers[0].numChildren)
            if not read_bytes:
                return jobs, None
            parent = answers[1]
            if parent is None:
                self._store_bytes(0)
                return jobs, 0
            if listed is None or listed[0] != int(parent.cversion):
                self._list_queues()  # a queue was made or deleted: list them again
                continue
            heads = answers[2:]
            for start in range(_HEADS_CHUNK, len(names), _HEADS_CHUNK):
                heads += self.wire.reader_read(
                    [("get", f"{queues_base}/{name}")
                     for name in names[start : start + _HEADS_CHUNK]], what)
            total = self._sum_heads(names, heads, what)
            self._store_bytes(total)
            return jobs, total
        # Queues keep being made meanwhile: the heads listed last are still a sum.
        total = self._sum_listed(what)
        self._store_bytes(total)
        return jobs, total

    def _list_queues(self) -> None:
        queues_base = self.config.queues_base
        stat, names = self.wire.reader_read(
            [("exists", queues_base), ("children", queues_base)], "listing the queues")
        if stat is not None and names is not None:
            with self._lock:
                self._queues = (int(stat.cversion), tuple(sorted(names)))

    def _sum_listed(self, what: str) -> int:
        with self._lock:
            names = () if self._queues is None else self._queues[1]
        queues_base = self.config.queues_base
        total = 0
        for start in range(0, len(names), _HEADS_CHUNK):
            chunk = names[start : start + _HEADS_CHUNK]
            heads = self.wire.reader_read([("get", f"{queues_base}/{n}") for n in chunk], what)
            total += self._sum_heads(chunk, heads, what)
        return total

    def _sum_heads(self, names: tuple[str, ...], heads: list[Any], what: str) -> int:
        """The payload bytes of the queues ``names`` from their nodes' answers ``heads``;
        a rotated queue (its node says ``{"layout":3,"head":r}``) is followed to the
        znode that holds its head, ``{qname}/h/{r}``, in one more round trip for all of
        them (a rotated queue counted as 0 would let the store pass ``store_max_bytes``)."""
        queues_base = self.config.queues_base
        total, follow = 0, []
        for name, answer in zip(names, heads, strict=True):
            path = f"{queues_base}/{name}"
            rotation = _rotation(answer, path, name)
            if rotation:
                follow.append((f"{path}/{HEAD_DIR}/{rotation:0{BUCKET_DIGITS}d}", name))
            else:
                total += _head_bytes(answer, path, name)
        for start in range(0, len(follow), _HEADS_CHUNK):
            chunk = follow[start : start + _HEADS_CHUNK]
            answers = self.wire.reader_read([("get", path) for path, _ in chunk], what)
            total += sum(_head_bytes(answer, path, name)
                         for (path, name), answer in zip(chunk, answers, strict=True))
        return total

    def _store_bytes(self, total: int) -> None:
        with self._lock:
            self._bytes = (time.monotonic(), total)


def _rotation(answer: Any, path: str, name: str) -> int:
    """The rotation a queue node's answer points at (0: the head is in it, or the node is
    gone, of layout 1, or not ours)."""
    if answer is None:
        return 0
    try:
        return QueueHead.rotation(answer[0], path, name)
    except (LegacyQueueLayout, CorruptData):
        return 0


def _head_bytes(answer: Any, path: str, name: str) -> int:
    """A queue head's payload bytes (0: deleted meanwhile, layout 1, or not ours)."""
    if answer is None:
        return 0
    try:
        return QueueHead.parse(answer[0], path, name).payload_bytes
    except (LegacyQueueLayout, CorruptData):
        return 0
