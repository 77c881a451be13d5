"""Work queues: enqueue (one job or many), the claimable candidates, counts, the listing,
waiting, and purge. The protocol (the enqueue multi and what it writes, the markers a
claim, release, completion, ``fail`` and ``requeue`` keep, what counts as claimable,
``queue_stats`` from the tallies, purge) is told once, in the package docstring ("Work
queues"); the znodes (layout 2, bucketed) are in :mod:`._layout`; the store-wide limits
in :mod:`._queues_capacity`.

What is specific to this module:

* Enqueue. One multi adds up to :data:`ENQUEUE_BATCH` jobs (fewer if their paths and
  payloads would pass :data:`ENQUEUE_MULTI_BYTES`, far below jute.maxbuffer). If another
  enqueue wrote the head first, it is sent again with the next seqs; if a job exists,
  its tag says whether it is in this queue (left out: ``False``) or not
  (``InvalidArgument``). Before sending, the head's counts say whether the queue would
  pass :data:`MAX_QUEUE_JOBS` or :data:`MAX_QUEUE_BYTES` (``QueueFull``): that check
  costs no request (the head is read, or cached, for its version anyway). The head is
  rotated to a fresh znode before its version reaches :data:`HEAD_VERSION_CEILING`.
* Candidates. ``queue_candidates`` reads the head and the oldest bucket not known to be
  done (its ``open``, ``held``, ``delayed`` listings) in one round trip, and newer
  buckets, :data:`SCAN_GROUP` at a time, only while it has fewer candidates than asked
  for. A bucket is *done* once it is full, has no open marker and no failed marker:
  nothing can make it claimable again (requeue applies to FAILED jobs only, enqueues go
  to newer buckets), so this process remembers where the first bucket not done is (the
  *floor*) and never reads the older ones again. The cost of a claim is the listing of
  one bucket (at most :data:`~._layout.BUCKET_JOBS` names), whatever the depth of the
  queue; it grows only with the number of jobs held or in a retry delay at the head of
  the queue. Payloads are cached (:data:`PAYLOAD_CACHE_BYTES`).
* Ordering: candidates come oldest seq first across the buckets read, so a claim takes
  one of the :data:`~consensus_lease._queue_claim.QUEUE_SPREAD` oldest jobs that looked
  claimable when its listing was read (FIFO-ish, as with a single list). Jobs held,
  completed or in a retry delay are skipped; a requeued job keeps its place (its old
  seq). Enqueues into one queue get increasing seqs in the order the store applied them
  (one ``enqueue_many`` multi: in the order given).
* Counting (``queue_stats``): the head and the three tallies are read in one round trip
  (after a ``sync``), in that order; see :meth:`ZooKeeperBackend.queue_stats
  <consensus_lease.backends.zookeeper.ZooKeeperBackend.queue_stats>` for how the counts
  relate to concurrent claims.

All of it runs on the backend's shared client (:meth:`._transport.Wire.reader`): no worker
session is involved before the claim.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..._election import is_election_key
from ...errors import BackendUnavailable, InvalidArgument, QueueFull
from ...record import EnqueueItem, QueuedJob, QueueStats
from .._groups import size_groups
from ._config import ZkConfig
from ._jobs_lifecycle import DelayHints
from ._layout import (
    BUCKET_JOBS,
    BucketPaths,
    JobPaths,
    QueueHead,
    QueuePaths,
    QueueTag,
    bucket_of,
    dump_new,
    member_name,
    new_nonce,
    parse_delayed,
    parse_job,
    parse_member,
    to_record,
)
from ._queues_capacity import StoreCapacity
from ._transport import Multi, Read, Wire, clock_ms
from ._transport_errors import translate
from ._transport_gate import Gate
from ._transport_multi import MAX_VERSION, bad_version, exists, first_error, missing, not_empty
from ._transport_paged import read_window
from ._watches import SharedWatches

__all__ = [
    "ENQUEUE_BATCH",
    "HEAD_VERSION_CEILING",
    "JUTE_MAXBUFFER",
    "MAX_PAYLOAD_BYTES",
    "MAX_QUEUE_BYTES",
    "MAX_QUEUE_JOBS",
    "Queues",
]

log = logging.getLogger("consensus_lease.backends.zookeeper")

JUTE_MAXBUFFER = 0xFFFFF
"""ZooKeeper's default ``jute.maxbuffer`` (1 MiB - 1): the largest request a server
accepts (it drops the connection on a larger one) and the most one znode holds."""

MAX_PAYLOAD_BYTES = 1_000_000
"""Largest payload (``capabilities.max_payload_bytes``): the enqueue multi also carries
the head, four paths (up to ~1.6 KB each with the longest ids), the tag, ACLs and
framing, which must all fit in ``JUTE_MAXBUFFER``; this leaves them 48 KB. Checked again
against the actual request before sending (a very long chroot)."""

MAX_QUEUE_JOBS = 25_000
"""Most jobs one queue holds (any state, until purged): ``capabilities.max_queue_jobs``.
Each job is four znodes on every server (job, tag, member, open marker; a tally entry
once completed, more while held or failed): measured at about 3 KB of server heap per
job with 120-character ids and 100-byte payloads. A 256 MB-heap server (default
jute.maxbuffer) filled to this capacity in one queue had 113-143 MB in use after
collections (its committed log included: see ``ENQUEUE_MULTI_BYTES``) and kept serving
claims (``tests/backends/test_zookeeper_capacity.py``); 50,000 left it at ~200 MB, in
back-to-back full collections. Size the heap for the sum of every queue in the store,
or shard queues across ensembles (chroots)."""

MAX_QUEUE_BYTES = 16 * 1024 * 1024
"""Most payload bytes one queue holds (until purged), for the same reason: every
server keeps every payload in its heap."""

ENQUEUE_BATCH = 128
"""Most jobs one enqueue multi carries (``capabilities.max_enqueue_batch``): 4 creates
each, so about 520 operations."""

ENQUEUE_MULTI_BYTES = 160 * 1024
"""Largest enqueue multi sent (estimated); jobs with larger payloads or ids go in more
multis, each atomic. Far below jute.maxbuffer because every server also keeps each of
its last 500 writes whole in memory (``zookeeper.commitLogCount``, the committed log
that lets followers catch up): 500 enqueue multis of this size are ~80 MB of bytes and,
measured at the limit, about 3.5 x that of a server's heap (~273 MB: the ``W`` of
:func:`._queues_capacity.heap_needed_mb`). 128 jobs with 120-character ids and 100-byte
payloads take ~137 KB."""

REQUEST_MARGIN = 1024
"""Bytes below ``JUTE_MAXBUFFER`` an estimated request must stay."""

PAYLOAD_CACHE_BYTES = 8 * 1024 * 1024
"""Payloads ``queue_candidates`` keeps (most recently used first) so that a job staying
among the oldest candidates is not read again on every call."""

READ_CHUNK = 256
"""Reads pipelined at once when listing a queue."""

SCAN_GROUP = 4
"""Buckets read per round trip once the oldest one did not give enough candidates."""

MAX_SCAN_BUCKETS = 64
"""Most buckets one ``queue_candidates`` reads (16,384 jobs held or in a retry delay at
the head of the queue before a newer job is offered)."""

MAX_WATCH_BUCKETS = 8
"""Most buckets ``wait_for_queue`` watches; with more buckets holding only jobs held or
in a retry delay, it waits at most :data:`POLL_S` between looks."""

POLL_S = 0.5
"""How long ``wait_for_queue`` waits without a watch on every bucket that could change."""

PURGE_BATCH = 100
"""Completed jobs read (results included) and deleted per purge step, one multi of three
or four deletes each (more when over ``PURGE_MULTI_BYTES``)."""

PURGE_MULTI_BYTES = 512 * 1024
"""Largest purge multi sent (estimated), far below ``JUTE_MAXBUFFER``."""


HEAD_VERSION_CEILING = MAX_VERSION - 2**16
"""The highest version of a queue's head znode written in place: every enqueue and
purge multi writes the head at the version read (a signed 32-bit int that ZooKeeper
increments without a check; about 25 days at 1,000 enqueue multis a second). The multi
that would write it at this version or above rotates the head first instead: one multi
moves it, compared at that version, to a fresh znode ``{qname}/h/{r}`` at version 0
(see :mod:`._layout`), and the enqueue or purge goes on there. A rotated head is never
made again (each rotation takes the next ``r``), so a stale cached version can never
match it."""


class _Head(NamedTuple):
    """A queue's head as last seen: the queue node's czxid (which queue it is), the
    znode holding the head (the queue's own, or ``{qname}/h/{r}`` once rotated), its
    version, and the head."""

    czxid: int
    path: str
    version: int
    head: QueueHead


@dataclass(slots=True)
class _Scan:
    """What a look at a queue's buckets found."""

    chosen: list[tuple[str, str]] = field(default_factory=list)  # (job_id, member)
    soonest: float | None = None  # seconds until the soonest running retry delay ends
    head: QueueHead | None = None  # None: no such queue
    czxid: int = 0
    floor: int = 0
    last_read: int = -1  # the newest bucket read


class Queues:
    """The work-queue operations of one backend.

    Args:
        wire: the round trips (the shared client).
        job_paths: job id -> its znode paths.
        hints: when the retry delays seen end (shared with the claims).
    """

    def __init__(
        self, wire: Wire, job_paths: Callable[[str], JobPaths], hints: DelayHints
    ) -> None:
        self.wire = wire
        self.config: ZkConfig = wire.config
        self.job_paths = job_paths
        self.hints = hints
        self.watches = SharedWatches()
        self._lock = threading.Lock()
        self._queue_locks: dict[str, threading.Lock] = {}
        self._heads: dict[str, _Head] = {}
        self._rotations: dict[str, int] = {}  # queue -> the rotation of its head last seen
        self._floors: dict[str, tuple[int, int]] = {}  # queue -> (czxid, floor)
        self._cache: OrderedDict[tuple[str, int, str], bytes] = OrderedDict()  # payloads
        self._cache_bytes = 0
        # the store-wide limits (._queues_capacity)
        self.capacity = StoreCapacity(wire, ENQUEUE_MULTI_BYTES)

    def paths(self, queue: str) -> QueuePaths:
        return QueuePaths.of(self.config.queues_base, queue)

    # -- the head and the floor ---------------------------------------------------------

    def _head(self, q: QueuePaths, what: str, fresh: bool = False) -> _Head:
        """The queue's head, as last seen (read if not known or ``fresh``); the queue is
        made if missing.

        Raises:
            LegacyQueueLayout: a queue of layout 1.
        """
        with self._lock:
            known = None if fresh else self._heads.get(q.queue)
        if known is not None:
            return known
        for _ in range(3):
            entry = self._read_head(q, [], what)[0]
            if entry is not None:
                return entry
            self._create(q, what)
        raise BackendUnavailable(f"{what}: {q.node} keeps disappearing")

    def _read_head(self, q: QueuePaths, reads: list[Read], what: str,
                   synced: bool = True) -> tuple[_Head | None, list[Any]]:
        """After a ``sync`` (unless not ``synced``: then as new as the shared client's
        member has it), the head (``None``: no such queue), then ``reads``, in one
        round trip and in that order (the head before what it says anything about). A
        rotated head is read with its queue node, at the rotation this process last saw;
        a newer one costs one more round trip. The head read is cached.

        Raises:
            LegacyQueueLayout: a queue of layout 1. BackendUnavailable: the head kept
            moving (rotations by others) for three round trips.
        """
        for _ in range(3):
            with self._lock:
                seen = self._rotations.get(q.queue, 0)
            head_reads: list[Read] = [("get", q.node)]
            if seen:
                head_reads.append(("get", q.head_node(seen)))
            sync: list[Read] = [("sync", self.config.base)] if synced else []
            answers = self.wire.reader_read([*sync, *head_reads, *reads], what)[len(sync):]
            node, rest = answers[0], answers[len(head_reads):]
            if node is None:
                return None, rest
            rotation = QueueHead.rotation(node[0], q.node, q.queue)
            if rotation != seen:
                with self._lock:
                    self._rotations[q.queue] = rotation
                continue  # read again with it (the reads after it must follow the head)
            path = q.head_node(rotation)
            found = node if rotation == 0 else answers[1]
            if found is None:
                continue  # rotated again between the two reads
            entry = _Head(int(node[1].czxid), path, int(found[1].version),
                          QueueHead.parse(found[0], path, q.queue))
            with self._lock:
                self._heads[q.queue] = entry
            return entry, rest
        raise BackendUnavailable(f"{what}: the head of queue {q.queue!r} kept moving "
                                 f"(rotated by others) while it was read")

    def _head_due(self, q: QueuePaths, what: str, deadline: float,
                  fresh: bool = False) -> _Head:
        """The head as :meth:`_head` gives it, rotated first (and read again) while its
        version is at or above :data:`HEAD_VERSION_CEILING`: what a write may compare.

        Raises:
            BackendUnavailable: still at the ceiling at ``deadline`` (others kept
                writing it); nothing of the caller's was sent.
        """
        while True:
            at = self._head(q, what, fresh)
            if at.version < HEAD_VERSION_CEILING:
                return at
            self._rotate(q, at, what)
            fresh = True
            if time.monotonic() >= deadline:
                raise BackendUnavailable(f"{what}: the head of queue {q.queue!r} kept "
                                         f"changing while it was rotated; nothing was sent")

    def _rotate(self, q: QueuePaths, at: _Head, what: str) -> None:
        """Move the head ``at`` (at or above :data:`HEAD_VERSION_CEILING`) to a fresh
        znode at version 0, in one multi compared at ``at.version``: the queue node then
        names it (``{"layout":3,"head":r}``) and the old rotated head is deleted. If
        another enqueue, purge or rotation wrote the head first, nothing changes; either
        way the cached head is dropped and the caller reads it again."""
        rotation = 0 if at.path == q.node else int(at.path.rsplit("/", 1)[1])
        target = q.head_node(rotation + 1)
        def build(tx: Any) -> None:
            if rotation == 0:
                tx.set_data(q.node, QueueHead.dump_rotated(1), at.version)
                tx.create(q.heads, b"")
            else:
                tx.delete(at.path, at.version)
                tx.set_data(q.node, QueueHead.dump_rotated(rotation + 1))  # compared above
            tx.create(target, at.head.dump())

        def settle(deadline: float) -> bool:
            answer = self.wire.read(self.wire.reader(deadline),
                                    [("sync", self.config.base), ("get", target)], deadline,
                                    f"{what} (reading back the head's rotation)",
                                    worker=False)[1]
            return answer is not None

        multi = self.wire.reader_commit(build, settle, f"{what} (rotating the queue's head)")
        self._forget_head(q.queue)
        if multi.applied:
            with self._lock:
                self._rotations[q.queue] = max(self._rotations.get(q.queue, 0), rotation + 1)
            log.warning("queue head rotated before its 32-bit version's limit",
                        extra={"queue": q.queue, "version": at.version,
                               "rotation": rotation + 1})
        elif multi.results:
            _, error = _first_error(multi.results)
            if not (bad_version(error) or missing(error) or exists(error)):
                raise translate(error, what, self.wire.hosts, worker_session=False)

    def _create(self, q: QueuePaths, what: str) -> None:
        """Make the queue (its head and buckets container), and ``{chroot}/jobs``."""
        client = self.wire.reader()
        self.wire.ensure_path(client, self.config.base, what, worker=False)
        self.wire.ensure_path(client, self.config.queues_base, what, worker=False)

        def build(tx: Any) -> None:
            tx.create(q.node, QueueHead().dump())
            tx.create(q.buckets, b"")
            tx.create(q.tally, b"")
            for path in q.tallies():
                tx.create(path, b"")

        def settle(deadline: float) -> bool:
            return self.wire.read(self.wire.reader(deadline), [("exists", q.buckets)],
                                  deadline, what, worker=False)[0] is not None

        multi = self.wire.reader_commit(build, settle, what)
        if not multi.applied and multi.results:
            _, error = _first_error(multi.results)
            if not exists(error):  # made meanwhile: fine
                raise translate(error, what, self.wire.hosts, worker_session=False)

    def _forget_head(self, queue: str) -> None:
        with self._lock:
            self._heads.pop(queue, None)

    def _floor(self, queue: str, czxid: int | None) -> int:
        """The first bucket of ``queue`` not known to be done (0 if unknown, or if the
        queue was made anew: another ``czxid``)."""
        with self._lock:
            known = self._floors.get(queue)
        if known is None or (czxid is not None and known[0] != czxid):
            return 0
        return known[1]

    def _raise_floor(self, queue: str, czxid: int, floor: int) -> None:
        with self._lock:
            known = self._floors.get(queue)
            if known is None or known[0] != czxid or known[1] < floor:
                self._floors[queue] = (czxid, floor)

    def watch_target(self, queue: str) -> tuple[tuple[str, ...], bool]:
        """For subscriptions, from what this process last saw of ``queue``: the
        ``open``, ``held`` and ``delayed`` of each bucket from the first not known to be
        done to the newest (at most MAX_WATCH_BUCKETS), and whether the first is the
        bucket the next enqueue writes to (then an empty ``open`` there means an empty
        queue)."""
        q = self.paths(queue)
        with self._lock:
            head = self._heads.get(queue)
            floors = self._floors.get(queue)
        floor = 0 if floors is None or (head is not None and floors[0] != head.czxid) \
            else floors[1]
        newest = floor if head is None else max(floor, head.head.last_bucket)
        paths: list[str] = []
        for index in range(floor, min(newest, floor + MAX_WATCH_BUCKETS - 1) + 1):
            bucket = q.bucket(index)
            paths += [bucket.open, bucket.held, bucket.delayed]
        frontier = head is not None and floor >= bucket_of(head.head.seq + 1)
        return tuple(paths), frontier

    # -- enqueue ------------------------------------------------------------------------

    def enqueue(
        self, queue: str, job_id: str, payload: bytes, max_attempts: int | None = None
    ) -> bool:
        """See :meth:`ZooKeeperBackend.enqueue
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.enqueue>`."""
        what = f"enqueue of {job_id!r} in queue {queue!r}"
        return self.enqueue_many(queue, [EnqueueItem(job_id, payload, max_attempts)],
                                 what)[0]

    def enqueue_many(
        self, queue: str, items: Sequence[EnqueueItem], what: str | None = None
    ) -> list[bool]:
        """See :meth:`ZooKeeperBackend.enqueue_many
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.enqueue_many>`."""
        what = what or f"enqueue_many of {len(items)} job(s) into queue {queue!r}"
        for item in items:
            if is_election_key(item.job_id):  # elections are never in queues
                raise InvalidArgument(f"{item.job_id!r} is an election's key, not a job: it "
                                      f"cannot be enqueued", job_id=item.job_id)
        if not items:
            return []
        q = self.paths(queue)
        parts = self._parts(q, items, what)
        with self._lock:
            queue_lock = self._queue_locks.setdefault(queue, threading.Lock())
        added: dict[str, bool] = {}
        with queue_lock:  # this process's enqueues into one queue would only collide
            if len(parts) > 1:
                # Several multis: refuse a job outside this queue before writing any.
                self._head(q, what)
                added.update(self._classify(q, list(items), what))
            for part in parts:
                todo = [item for item in part if item.job_id not in added]
                if todo:
                    added.update(self._enqueue_part(q, todo, what))
        return [added[item.job_id] for item in items]

    def _parts(self, q: QueuePaths, items: Sequence[EnqueueItem],
               what: str) -> list[list[EnqueueItem]]:
        """``items`` in multis of at most ENQUEUE_BATCH jobs and ENQUEUE_MULTI_BYTES."""
        acl = sum(len(a.id.scheme) + len(a.id.id) + 16 for a in self.config.acl_list())
        # the head, and the six znodes of a new bucket (at most two buckets per multi)
        fixed = len(q.node) + 128 + 12 * (len(q.bucket(0).failed) + acl + 32)
        costs: dict[int, int] = {}
        for index, item in enumerate(items):
            paths = self.job_paths(item.job_id)
            tag = QueueTag(q.name, member_name(2**31 - 1, item.job_id), new_nonce(), 2**31)
            bucket = q.bucket(2**31)
            cost = (
                len(item.payload) + len(tag.dump()) + 40
                + sum(len(p.encode()) for p in (paths.job, paths.tag,
                                                bucket.member(tag.member),
                                                bucket.marker(tag.member)))
                + 4 * (acl + 32)
            )
            if fixed + cost > JUTE_MAXBUFFER - REQUEST_MARGIN:
                raise InvalidArgument(
                    f"{what}: the request would be about {fixed + cost} bytes; ZooKeeper "
                    f"accepts at most {JUTE_MAXBUFFER} (jute.maxbuffer) in one request: a "
                    f"smaller payload or a shorter chroot", job_id=item.job_id,
                )
            costs[index] = cost
        indexed = size_groups(range(len(items)), costs.__getitem__,
                              ENQUEUE_MULTI_BYTES - fixed, ENQUEUE_BATCH)
        return [[items[i] for i in group] for group in indexed]

    def _enqueue_multi(self, q: QueuePaths, todo: list[EnqueueItem], at: _Head,
                       new_head: QueueHead, what: str) -> tuple[Multi, list[BucketPaths]]:
        """Send the multi adding ``todo`` after ``at`` (the head, compared at its version)
        and writing ``new_head``; a lost answer is settled by reading back the first job's
        tag. Returns the commit's outcome and the buckets the multi created."""
        first_id = todo[0].job_id
        head, version = at.head, at.version
        nonce = new_nonce()
        tags: list[QueueTag] = []
        new_buckets: list[BucketPaths] = []
        for seq in range(head.seq + 1, head.seq + len(todo) + 1):
            if (seq - 1) % BUCKET_JOBS == 0:
                new_buckets.append(q.bucket(bucket_of(seq)))
            tags.append(QueueTag(q.name, member_name(seq, todo[len(tags)].job_id), nonce,
                                 bucket_of(seq)))
        batch = list(zip(todo, tags, strict=True))

        def build(tx: Any, new_head: QueueHead = new_head, version: int = version,
                  new_buckets: list[BucketPaths] = new_buckets,
                  batch: list[tuple[EnqueueItem, QueueTag]] = batch) -> None:
            tx.set_data(at.path, new_head.dump(), version)
            for bucket in new_buckets:
                for path in bucket.dirs():
                    tx.create(path, b"")
            for item, tag in batch:
                paths, bucket = self.job_paths(item.job_id), q.bucket(tag.bucket or 0)
                tx.create(paths.job, dump_new(item.max_attempts))
                tx.create(paths.tag, tag.dump())
                tx.create(bucket.member(tag.member), item.payload)
                tx.create(bucket.marker(tag.member), b"")

        def settle(deadline: float, tag: QueueTag = tags[0],
                   path: str = self.job_paths(todo[0].job_id).tag) -> bool:
            reads: list[Read] = [("sync", self.config.base), ("get", path)]
            answer = self.wire.read(self.wire.reader(deadline), reads, deadline,
                                    f"{what} (reading back)", worker=False,
                                    job_id=first_id)[1]
            return answer is not None and QueueTag.parse(answer[0], path) == tag

        multi = self.wire.reader_commit(build, settle, what, first_id)
        return multi, new_buckets

    def _enqueue_part(self, q: QueuePaths, todo: list[EnqueueItem],
                      what: str) -> dict[str, bool]:
        """One multi adding ``todo`` (sent again while other enqueues take the seqs);
        ``{job_id: added}`` for every job of ``todo``."""
        out: dict[str, bool] = {}
        deadline = self.wire.deadline()
        first_id = todo[0].job_id
        fresh = False
        while todo:
            at = self._head_due(q, what, deadline, fresh)
            fresh = False
            head = at.head
            nbytes = sum(len(item.payload) for item in todo)
            if head.jobs + len(todo) > MAX_QUEUE_JOBS \
                    or head.payload_bytes + nbytes > MAX_QUEUE_BYTES:
                # Jobs already queued need no room: leave them out, then decide on the
                # head read again (the cached one may be old).
                known = self._classify(q, todo, what)
                out.update(known)
                todo = [item for item in todo if item.job_id not in known]
                if not todo:
                    break
                at = self._head_due(q, what, deadline, fresh=True)
                head = at.head
                nbytes = sum(len(item.payload) for item in todo)
                self._check_capacity(q, head, len(todo), nbytes, what)
            todo = self._check_store(q, todo, what, out)
            if not todo:
                break
            nbytes = sum(len(item.payload) for item in todo)
            new_head = QueueHead(head.seq + len(todo), head.jobs + len(todo),
                                 head.payload_bytes + nbytes)
            multi, new_buckets = self._enqueue_multi(q, todo, at, new_head, what)
            if multi.applied:
                with self._lock:
                    self._heads[q.queue] = _Head(at.czxid, at.path, at.version + 1, new_head)
                self.capacity.added(nbytes)
                out.update((item.job_id, True) for item in todo)
                return out
            self._forget_head(q.queue)
            if multi.results:
                index, error = _first_error(multi.results)
                jobs_from = 1 + 6 * len(new_buckets)
                if index >= jobs_from and (index - jobs_from) % 4 in (0, 1) \
                        and exists(error):
                    known = self._classify(q, todo, what)  # a job exists already
                    out.update(known)
                    todo = [item for item in todo if item.job_id not in known]
                elif missing(error):
                    fresh = True  # the head or {chroot}/jobs deleted by hand: made again
                    client = self.wire.reader()
                    self.wire.ensure_path(client, self.config.base, what, worker=False)
                elif not (bad_version(error) or exists(error)):
                    raise translate(error, what, self.wire.hosts, worker_session=False,
                                    job_id=first_id)
                # else: another enqueue (or a purge) wrote the head first: again
            if todo and time.monotonic() >= deadline:
                raise BackendUnavailable(
                    f"{what}: other enqueues into the queue kept taking the next seq for "
                    f"{self.config.timeout_s:g} s; nothing more was applied", job_id=first_id,
                )
        return out

    @staticmethod
    def _check_capacity(q: QueuePaths, head: QueueHead, jobs: int, nbytes: int,
                        what: str) -> None:
        if head.jobs + jobs > MAX_QUEUE_JOBS:
            raise QueueFull(
                f"{what}: queue {q.queue!r} holds {head.jobs} jobs; {jobs} more would pass "
                f"its capacity of {MAX_QUEUE_JOBS} on ZooKeeper (purge completed jobs, or "
                f"shard the queue across stores); nothing was enqueued")
        if head.payload_bytes + nbytes > MAX_QUEUE_BYTES:
            raise QueueFull(
                f"{what}: queue {q.queue!r} holds {head.payload_bytes} payload bytes; "
                f"{nbytes} more would pass its capacity of {MAX_QUEUE_BYTES} on ZooKeeper (purge "
                f"completed jobs, or shard the queue across stores); nothing was enqueued")

    def _check_store(self, q: QueuePaths, todo: list[EnqueueItem], what: str,
                     out: dict[str, bool]) -> list[EnqueueItem]:
        """The store-wide limits (:mod:`._queues_capacity`) before an enqueue multi: ``todo``
        if it fits; if not, the jobs already in this queue are left out (recorded in
        ``out`` as not added) and the rest checked again.

        Raises:
            QueueFull: the rest would pass ``store_max_jobs`` or ``store_max_bytes``.
        """
        try:
            self.capacity.check(len(todo), sum(len(i.payload) for i in todo), what)
            return todo
        except QueueFull:
            known = self._classify(q, todo, what)
            if not known:
                raise
        out.update(known)
        todo = [item for item in todo if item.job_id not in known]
        if todo:
            self.capacity.check(len(todo), sum(len(i.payload) for i in todo), what)
        return todo

    def _classify(self, q: QueuePaths, items: list[EnqueueItem],
                  what: str) -> dict[str, bool]:
        """``{job_id: False}`` for the jobs of ``items`` already in this queue (the
        absent ones are left out).

        Raises:
            InvalidArgument: a job exists outside this queue.
        """
        out: dict[str, bool] = {}
        for start in range(0, len(items), READ_CHUNK):
            chunk = items[start : start + READ_CHUNK]
            reads: list[Read] = [("sync", self.config.base)]
            for item in chunk:
                paths = self.job_paths(item.job_id)
                reads += [("exists", paths.job), ("get", paths.tag)]
            answers = self.wire.reader_read(reads, what, chunk[0].job_id)[1:]
            for i, item in enumerate(chunk):
                job, tag = answers[2 * i : 2 * i + 2]
                if job is None:
                    continue  # absent (or purged meanwhile)
                paths = self.job_paths(item.job_id)
                if tag is not None and QueueTag.parse(tag[0], paths.tag).queue == q.name:
                    out[item.job_id] = False
                    continue
                where = "a job claimed by name" if tag is None else "in another queue"
                raise InvalidArgument(
                    f"{what}: {item.job_id!r} already exists outside this queue ({where})",
                    job_id=item.job_id,
                )
        return out

    # -- candidates ----------------------------------------------------------------------

    @staticmethod
    def _bucket_reads(bucket: BucketPaths) -> list[Read]:
        """One bucket's look: failed (stat), open, held, delayed (names), failed (stat)
        again: the two failed stats with the same ``cversion`` show that no job became
        FAILED, nor was requeued, while ``open`` was read."""
        return [("exists", bucket.failed), ("children", bucket.open),
                ("children", bucket.held), ("children", bucket.delayed),
                ("exists", bucket.failed)]

    def _scan(self, queue: str, limit: int, what: str, max_buckets: int = MAX_SCAN_BUCKETS,
              synced: bool = True) -> _Scan:
        """Up to ``limit`` claimable-looking jobs, oldest first, from the oldest buckets
        not done (after a ``sync``, unless not ``synced``); raises the floor over the
        buckets found done."""
        q = self.paths(queue)
        with self._lock:
            floors = self._floors.get(queue)
        guess = 0 if floors is None else floors[1]
        at, answers = self._read_head(q, self._bucket_reads(q.bucket(guess)), what, synced)
        scan = _Scan()
        if at is None:
            return scan
        scan.head = head = at.head
        scan.czxid = czxid = at.czxid
        floor = self._floor(queue, czxid)
        looks: list[tuple[int, list[Any]]] = []
        if floor == guess:
            looks.append((floor, answers))
        index = floor if not looks else floor + 1
        done_upto = floor  # buckets below it are done
        contiguous = True
        read = 0
        pending = looks
        while True:
            for bucket_index, look in pending:
                read += 1
                scan.last_read = bucket_index
                done = self._pick(q, head, bucket_index, look, limit, scan, what)
                if contiguous and done:
                    done_upto = bucket_index + 1
                else:
                    contiguous = False
            if len(scan.chosen) >= limit or index > head.last_bucket or read >= max_buckets:
                break
            group = list(range(index, min(index + SCAN_GROUP, head.last_bucket + 1)))
            index = group[-1] + 1
            reads: list[Read] = []
            for b in group:
                reads += self._bucket_reads(q.bucket(b))
            got = self.wire.reader_read(reads, what)
            pending = [(b, got[5 * i : 5 * i + 5]) for i, b in enumerate(group)]
        scan.floor = done_upto
        self._raise_floor(queue, czxid, done_upto)
        return scan

    def _pick(self, q: QueuePaths, head: QueueHead, index: int, look: list[Any], limit: int,
              scan: _Scan, what: str) -> bool:
        """Add the claimable-looking jobs of bucket ``index`` to ``scan`` (up to
        ``limit`` in all); whether the bucket is done."""
        failed_before, open_names, held_names, delayed_names, failed_after = look
        if open_names is None:
            return False  # not made yet (or deleted by hand)
        full = index < head.last_bucket or (index == head.last_bucket
                                            and head.seq % BUCKET_JOBS == 0)
        if not open_names:
            return (full and failed_before is not None and failed_after is not None
                    and failed_before.numChildren == 0
                    and failed_before.cversion == failed_after.cversion)
        free = sorted(set(open_names).difference(held_names or ()))  # sorts as seq
        if free and len(scan.chosen) < limit:
            chosen, soonest = self._claimable(q.bucket(index), free, set(delayed_names or ()),
                                              limit - len(scan.chosen), what)
            scan.chosen += chosen
            if soonest is not None:
                scan.soonest = soonest if scan.soonest is None else min(scan.soonest, soonest)
        return False

    def candidates(self, queue: str, limit: int,
                   synced: bool = True) -> list[tuple[str, bytes]]:
        """See :meth:`ZooKeeperBackend.queue_candidates
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.queue_candidates>`; not
        ``synced``: its ``queue_candidates_after_wake``."""
        what = f"listing the candidates of queue {queue!r}"
        scan = self._scan(queue, limit, what, synced=synced)
        if not scan.chosen:
            return []
        q = self.paths(queue)
        payloads = self._payloads(q, scan.czxid, [member for _, member in scan.chosen], what)
        return [(job_id, payloads[member]) for job_id, member in scan.chosen
                if member in payloads]

    def _claimable(
        self, bucket: BucketPaths, free: list[str], delayed: set[str], limit: int, what: str
    ) -> tuple[list[tuple[str, str]], float | None]:
        """Up to ``limit`` ``(job_id, member)`` of ``free`` (sorted open, not held
        members of ``bucket``) whose retry delay, if they have a delayed marker, is not
        known to be running; and the seconds until the soonest running delay ends
        (``None``: none). Delays not seen yet are timed first (:meth:`_time_delays`). A
        hint: the claim decides, on the store's clock."""
        members = [(parsed[1], name) for name in free
                   if (parsed := parse_member(name)) is not None]
        unseen = [(job_id, name) for job_id, name in members
                  if name in delayed and self.hints.remaining(job_id) is None]
        if unseen:
            self._time_delays(bucket, unseen[:READ_CHUNK], what)
        chosen: list[tuple[str, str]] = []
        soonest: float | None = None
        for job_id, name in members:
            left = self.hints.remaining(job_id) if name in delayed else None
            if left:  # its retry delay is running
                soonest = left if soonest is None else min(soonest, left)
            elif len(chosen) < limit:
                chosen.append((job_id, name))
        return chosen, soonest

    def _time_delays(self, bucket: BucketPaths, members: list[tuple[str, str]],
                     what: str) -> None:
        """One round trip: the delayed markers of ``members`` and a write whose mtime is
        the store's clock now (see :func:`._transport.clock_ms`); notes when each delay ends."""
        reads: list[Read] = [("get", bucket.delayed_marker(name)) for _, name in members]
        answers = self.wire.reader_read([*reads, ("clock", self.config.base)], what)
        answered = time.monotonic()
        if answers[-1] is None:
            return  # {chroot}/jobs deleted by hand: the claims will tell
        now_ms = clock_ms(answers[-1])
        for (job_id, name), answer in zip(members, answers, strict=False):
            if answer is None:
                self.hints.note(job_id, 0.0)  # claimed since: no delay running
                continue
            end_ms = parse_delayed(answer, bucket.delayed_marker(name))
            left_s = (end_ms + 1 - now_ms) / 1000 - (time.monotonic() - answered)
            self.hints.note(job_id, left_s)

    def _payloads(self, q: QueuePaths, czxid: int, members: list[str],
                  what: str) -> dict[str, bytes]:
        """The payloads of ``members`` (those not purged): from the cache, the others in
        one pipelined round trip. A member's data never changes, and its name is never
        reused while the queue node (``czxid``: its incarnation) lives, so the cache is
        keyed by both."""
        out: dict[str, bytes] = {}
        with self._lock:
            for member in members:
                payload = self._cache.get((q.node, czxid, member))
                if payload is not None:
                    self._cache.move_to_end((q.node, czxid, member))
                    out[member] = payload
        todo = [m for m in members if m not in out]
        reads: list[Read] = [("get", _member_path(q, m)) for m in todo]
        answers = self.wire.reader_read(reads, what) if todo else []
        with self._lock:
            for member, answer in zip(todo, answers, strict=True):
                if answer is None:
                    continue  # completed and purged meanwhile
                key = (q.node, czxid, member)
                payload = out[member] = bytes(answer[0])
                if key not in self._cache:  # (another thread may have read it too)
                    self._cache[key] = payload
                    self._cache_bytes += _cost(key, payload)
            while self._cache_bytes > PAYLOAD_CACHE_BYTES and self._cache:
                self._cache_bytes -= _cost(*self._cache.popitem(last=False))
        return out

    # -- counts and listing -------------------------------------------------------------

    def stats(self, queue: str) -> QueueStats:
        """See :meth:`ZooKeeperBackend.queue_stats
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.queue_stats>`."""
        q = self.paths(queue)
        what = f"counting the jobs of queue {queue!r}"
        held_path, done_path, failed_path = q.tallies()
        # the head first, held last: see queue_stats for what that gives
        at, (done, failed, held) = self._read_head(
            q, [("exists", done_path), ("exists", failed_path), ("exists", held_path)], what)
        if at is None:
            return QueueStats(queue, 0, 0, 0, None, 0)
        head = at.head
        n_done = 0 if done is None else int(done.numChildren)
        n_failed = 0 if failed is None else int(failed.numChildren)
        n_held = 0 if held is None else int(held.numChildren)
        n_held = max(0, min(n_held, head.jobs - n_done - n_failed))
        return QueueStats(
            queue=queue,
            available=max(0, head.jobs - n_done - n_failed - n_held),
            held=n_held,
            completed=n_done,
            oldest_held_lease_until=None,
            failed=n_failed,
        )

    def jobs(self, queue: str, limit: int | None) -> list[QueuedJob]:
        """See :meth:`ZooKeeperBackend.queue_jobs
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.queue_jobs>`."""
        q = self.paths(queue)
        what = f"listing queue {queue!r}"
        at = self._read_head(q, [], what)[0]
        if at is None:
            return []
        head = at.head
        out: list[QueuedJob] = []
        for b in range(0, head.last_bucket + 1):
            if limit is not None and len(out) >= limit:
                break
            bucket = q.bucket(b)
            # Paced by progress, at most READ_WINDOW in flight (._transport_paged): a large queue
            # neither fails for its size nor takes every slot of the shared client.
            members = _sorted_members(read_window(self.wire, [("children", bucket.members)],
                                                  what)[0])
            if limit is not None:
                members = members[: limit - len(out)]
            for start in range(0, len(members), READ_CHUNK):
                chunk = members[start : start + READ_CHUNK]
                reads: list[Read] = []
                for _, job_id, member in chunk:
                    paths = self.job_paths(job_id)
                    reads += [("get", paths.job), ("get", paths.owner),
                              ("get", bucket.member(member)), ("get", paths.failure)]
                answers = read_window(self.wire, reads, what)
                for i, (seq, job_id, _) in enumerate(chunk):
                    job, owner, payload, failure = answers[4 * i : 4 * i + 4]
                    record = to_record(self.job_paths(job_id), job, owner, failure)
                    if record is not None and payload is not None:  # else purged meanwhile
                        out.append(QueuedJob(queue, record, bytes(payload[0]), seq))
        return out

    # -- waiting ------------------------------------------------------------------------

    def wait(self, queue: str, timeout_s: float) -> None:
        """See :meth:`ZooKeeperBackend.wait_for_queue
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.wait_for_queue>`.
        Its reads end by the option ``timeout_s`` or this wait's ``timeout_s`` + 1 s,
        whichever is shorter, from the start.
        Raises kazoo's and the library's exceptions (the backend handles them)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        read_budget_s = min(self.config.timeout_s, max(timeout_s, 0.0) + 1.0)
        woken = threading.Event()
        joined: list[tuple[str, str]] = []
        try:
            with self.wire.bounded(read_budget_s) as read_deadline:
                gate = self.wire.gate(self.wire.reader())
                most_s = self._watch(gate, queue, woken, joined, read_deadline)
            if most_s is not None:
                woken.wait(max(0.0, min(deadline - time.monotonic(), most_s)))
        finally:
            self.watches.leave(joined, woken)

    def _watch(
        self, gate: Gate, queue: str, woken: threading.Event,
        joined: list[tuple[str, str]], read_deadline: float,
    ) -> float | None:
        """Join the child watches on ``open`` (an enqueue; a completion), ``held`` (a
        release, a completion, a holder's session ending; a claim) and ``delayed`` (a
        fail with a retry delay; the next claim) of every bucket from the floor to the
        newest (at most MAX_WATCH_BUCKETS; the bucket the next enqueue makes is watched
        for its creation), then look again: how long to wait at most (``math.inf``:
        until a watch fires), or ``None`` if a job looks claimable already. While every
        job that is neither held nor completed has a retry delay running, that is until
        the soonest ends: ZooKeeper has no timer event."""
        what = f"waiting on queue {queue!r}"
        q = self.paths(queue)
        scan = self._scan(queue, 1, what)
        if scan.chosen:
            return None
        if scan.head is None:  # no such queue yet: its first enqueue creates it
            joined.append(("created", q.node))
            armed = self.watches.join(gate, "created", [q.node], woken, read_deadline)[0]
            return None if armed is None else math.inf
        head = scan.head
        newest = bucket_of(head.seq + 1)  # the bucket the next enqueue writes to
        last = min(newest, scan.floor + MAX_WATCH_BUCKETS - 1)
        paths: list[str] = []
        for b in range(scan.floor, last + 1):
            if b <= head.last_bucket:
                bucket = q.bucket(b)
                paths += [bucket.open, bucket.held, bucket.delayed]
        if paths:
            joined += [("children", path) for path in paths]
            self.watches.join(gate, "children", paths, woken, read_deadline)
        if last == newest and newest > head.last_bucket:
            created = q.bucket(newest).open
            joined.append(("created", created))
            if self.watches.join(gate, "created", [created], woken, read_deadline)[0] is None:
                return None  # made meanwhile
        again = self._scan(queue, 1, what)  # the watches are armed: nothing is missed
        if again.chosen or again.head != head:
            return None
        most_s = math.inf if again.soonest is None else again.soonest
        if last < newest:
            most_s = min(most_s, POLL_S)
        return most_s

    # -- purge --------------------------------------------------------------------------

    def purge(self, queue: str) -> int:
        """See :meth:`ZooKeeperBackend.purge
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.purge>`."""
        q = self.paths(queue)
        what = f"purge of queue {queue!r}"
        with self.wire.bounded():
            at = self._read_head(q, [], what)[0]
        if at is None:
            return 0
        head = at.head
        purged = 0
        for b in range(0, head.last_bucket + 1):
            bucket = q.bucket(b)
            # Members first, open markers after: an enqueue landing between the two reads
            # is then missing from the first (ignored), never taken for a completed job.
            with self.wire.bounded():
                members, open_names = self.wire.reader_read(
                    [("children", bucket.members), ("children", bucket.open)], what)
            still_open = set(open_names or ())
            done = [m for m in _sorted_members(members) if m[2] not in still_open]
            for start in range(0, len(done), PURGE_BATCH):
                with self.wire.bounded():  # each step its own timeout_s (the docstring)
                    verified = self._verify_completed(
                        queue, bucket, done[start : start + PURGE_BATCH], what)
                    purged += sum(self._delete(q, batch, what)
                                  for batch in _purge_batches(verified))
        return purged

    def _verify_completed(
        self, queue: str, bucket: BucketPaths, chunk: list[tuple[int, str, str]], what: str
    ) -> list[_Doomed]:
        """The jobs of ``chunk`` whose record says COMPLETED and whose tag names this
        member, with the versions their deletes will require and their payload sizes."""
        reads: list[Read] = []
        done_base = self.paths(queue).tallies()[1]
        for _, job_id, member in chunk:
            paths = self.job_paths(job_id)
            reads += [("get", paths.job), ("get", paths.tag), ("exists", paths.failure),
                      ("exists", bucket.member(member)), ("exists", f"{done_base}/{member}")]
        answers = self.wire.reader_read(reads, what)
        out: list[_Doomed] = []
        for i, (_, job_id, member) in enumerate(chunk):
            job, tag, failure, stat, tally = answers[5 * i : 5 * i + 5]
            paths = self.job_paths(job_id)
            if job is None or tag is None or stat is None \
                    or not parse_job(job[0], paths.job).completed:
                continue
            if QueueTag.parse(tag[0], paths.tag).member != member:
                continue  # not this member's job (purged and enqueued again meanwhile)
            out.append(_Doomed(paths, tag[1].version, job[1].version, bucket.member(member),
                               None if failure is None else failure.version,
                               int(stat.dataLength),
                               None if tally is None else f"{done_base}/{member}"))
        return out

    def _delete(self, q: QueuePaths, batch: list[_Doomed], what: str) -> int:
        """One multi deleting every job of ``batch`` (tag and failure znode, then the job
        znode at its completed version, then the member) and taking them off the head's
        counts (at the head's version: sent again if an enqueue wrote it first); if it
        fails otherwise, one multi per job. Returns how many went (a job another purge
        deleted first is not counted)."""
        deadline = self.wire.deadline()
        while True:
            at = self._head_due(q, what, deadline)
            head, version = at.head, at.version
            freed = sum(job.payload_bytes for job in batch)
            new_head = QueueHead(head.seq, max(0, head.jobs - len(batch)),
                                 max(0, head.payload_bytes - freed))

            def build(tx: Any, new_head: QueueHead = new_head, version: int = version,
                      path: str = at.path) -> None:
                tx.set_data(path, new_head.dump(), version)
                for job in batch:
                    tx.delete(job.paths.tag, job.tag_version)
                    if job.failure_version is not None:
                        tx.delete(job.paths.failure, job.failure_version)
                    tx.delete(job.paths.job, job.job_version)
                    tx.delete(job.member)
                    if job.tally_done is not None:
                        tx.delete(job.tally_done)

            def settle(deadline: float) -> bool:
                reads: list[Read] = [("sync", self.config.base)]
                reads += [("exists", job.paths.job) for job in batch]
                gone = self.wire.read(self.wire.reader(deadline), reads, deadline,
                                      f"{what} (reading back)", worker=False)[1:]
                return all(stat is None for stat in gone)

            multi = self.wire.reader_commit(build, settle, what)
            if multi.applied:
                with self._lock:
                    self._heads[q.queue] = _Head(at.czxid, at.path, version + 1, new_head)
                return len(batch)
            self._forget_head(q.queue)
            if not multi.results:
                return 0  # the answer was lost and it was not applied: gone some other way
            index, error = _first_error(multi.results)
            if index == 0 and bad_version(error):
                if time.monotonic() >= deadline:
                    raise BackendUnavailable(f"{what}: enqueues kept writing the queue's "
                                             f"head for {self.config.timeout_s:g} s")
                continue  # an enqueue wrote the head first
            if len(batch) > 1:
                return sum(self._delete(q, [job], what) for job in batch)
            if missing(error) or bad_version(error) or not_empty(error):
                return 0  # purged by someone else first, or changed: not this call's
            raise translate(error, what, self.wire.hosts, worker_session=False)


@dataclass(frozen=True, slots=True)
class _Doomed:
    """A completed job purge is about to delete."""

    paths: JobPaths
    tag_version: int
    job_version: int
    member: str
    failure_version: int | None = None  # its failure znode's, if it ever failed
    payload_bytes: int = 0
    tally_done: str | None = None  # its entry in the queue's tally of completed jobs

    def request_bytes(self) -> int:
        return sum(len(p.encode()) + 16
                   for p in (self.paths.tag, self.paths.failure, self.paths.job, self.member,
                             self.tally_done or ""))


def _purge_batches(jobs: list[_Doomed]) -> list[list[_Doomed]]:
    """``jobs`` in purge multis of at most PURGE_BATCH jobs and PURGE_MULTI_BYTES."""
    return size_groups(jobs, _Doomed.request_bytes, PURGE_MULTI_BYTES, PURGE_BATCH)


def _sorted_members(names: list[str] | None) -> list[tuple[int, str, str]]:
    """``(seq, job_id, member)`` of the member names we made, by seq."""
    out = []
    for member in names or ():
        parsed = parse_member(member)
        if parsed is not None:
            out.append((parsed[0], parsed[1], member))
    out.sort()
    return out


def _member_path(q: QueuePaths, member: str) -> str:
    """The member znode of ``member`` (its seq names its bucket)."""
    parsed = parse_member(member)
    seq = 1 if parsed is None else parsed[0]
    return q.bucket(bucket_of(seq)).member(member)


def _cost(key: tuple[str, int, str], payload: bytes) -> int:
    """What a cached payload counts against ``PAYLOAD_CACHE_BYTES`` (with its key)."""
    return len(payload) + len(key[0]) + len(key[2]) + 200


def _first_error(results: list[Any]) -> tuple[int, Exception]:
    """The operation that failed a multi (ZooKeeper rolls back those before it and does
    not run those after it)."""
    index, error = first_error(results)
    return index, error or BackendUnavailable("a multi failed without saying why")
