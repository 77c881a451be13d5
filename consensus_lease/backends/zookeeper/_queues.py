"""Work queues: enqueue, the claimable candidates, the listing, waiting, and purge.

The znodes are in :mod:`._layout`. An enqueue is one multi::

    create   {chroot}/jobs/{name}                 the job, version 0: never claimed
                                                  (data: b"", or its max_attempts)
    create   {chroot}/jobs/{name}/queue           tag   queue, member name, nonce
    set_data {chroot}/queues/{qname}  b"" at version seq - 1     issues seq
    create   {chroot}/queues/{qname}/jobs/{member}  payload
    create   {chroot}/queues/{qname}/open/{member}  b""

It fails as a whole if the job exists (then its tag says whether it is in this queue) or
another enqueue into the queue took ``seq`` first (then it is sent again with the next
``seq``: enqueues into one queue are serialised by the store, FIFO by construction).

A queued job is otherwise the ordinary job: a claim bumps the job znode's version (0 to
1 the first time) and creates the owner znode, release and completion delete it. Those
multis also maintain two markers per job, read from its tag in the same round trip
(:mod:`._claims`, :mod:`._holds`): the claim creates the EPHEMERAL held marker
``{qname}/held/{member}`` next to the owner znode (same session: both go with it), the
release and completion delete it, the completion also deletes the open marker. The job
lifecycle (:mod:`._lifecycle`) adds two: a ``fail()`` that makes the job FAILED deletes
its open marker (``requeue`` makes it again); one that sets a retry delay makes its
persistent delayed marker ``{qname}/delayed/{member}``, which the next claim deletes. So

    claimable = children(open) - children(held) - children(delayed) whose delay runs

and ``queue_candidates`` is one round trip of three listings, plus reads of payloads it
has not seen yet (a member's data never changes: they are cached), whatever the number
of held or completed jobs; ``wait_for_queue`` waits on three child watches. Whether a
delay still runs is a question for the store's clock: the delayed markers not timed yet
are read with one write of ``{chroot}/jobs`` in the same round trip (its mtime is "now",
see :func:`._wire.clock_ms`), and when each delay ends is remembered as a monotonic
deadline (:class:`._lifecycle.DelayHints`) to sleep until. A hint: the claim decides,
with a write of its own.

All of it runs on the backend's shared client (:meth:`._wire.Wire.reader`): no worker
session is involved before the claim.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)

from ..._election import is_election_key
from ...errors import BackendUnavailable, InvalidArgument
from ...record import QueuedJob
from ._errors import translate
from ._gate import Gate
from ._layout import (
    JobPaths,
    QueuePaths,
    QueueTag,
    dump_new,
    member_name,
    new_nonce,
    parse_delayed,
    parse_job,
    parse_member,
    to_record,
)
from ._lifecycle import DelayHints
from ._options import ZkConfig
from ._watch import SharedWatches
from ._wire import Read, Wire, clock_ms

__all__ = ["JUTE_MAXBUFFER", "MAX_PAYLOAD_BYTES", "Queues"]

JUTE_MAXBUFFER = 0xFFFFF
"""ZooKeeper's default ``jute.maxbuffer`` (1 MiB - 1): the largest request a server
accepts (it drops the connection on a larger one) and the most one znode holds."""

MAX_PAYLOAD_BYTES = 1_000_000
"""Largest payload (``capabilities.max_payload_bytes``): the enqueue multi also carries
five paths (up to ~1.6 KB each with the longest ids), the tag, ACLs and framing, which
must all fit in ``JUTE_MAXBUFFER``; this leaves them 48 KB. Checked again against the
actual request before sending (a very long chroot)."""

REQUEST_MARGIN = 1024
"""Bytes below ``JUTE_MAXBUFFER`` an estimated request must stay."""

PAYLOAD_CACHE_BYTES = 8 * 1024 * 1024
"""Payloads ``queue_candidates`` keeps (most recently used first) so that a job staying
among the oldest candidates is not read again on every call."""

READ_CHUNK = 256
"""Reads pipelined at once when listing a queue."""

PURGE_READ_CHUNK = 64
"""Completed jobs whose records (results included) purge reads at once."""

PURGE_BATCH = 100
"""Completed jobs deleted per purge multi (three or four deletes each), also kept under
``PURGE_MULTI_BYTES``."""

PURGE_MULTI_BYTES = 512 * 1024
"""Largest purge multi sent (estimated), far below ``JUTE_MAXBUFFER``."""


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
        self._versions: dict[str, int] = {}  # queue -> its node's version, as last seen
        self._ready: set[str] = set()  # queues whose znodes this process has made sure of
        self._cache: OrderedDict[tuple[str, int, str], bytes] = OrderedDict()  # payloads
        self._cache_bytes = 0

    def paths(self, queue: str) -> QueuePaths:
        return QueuePaths.of(self.config.queues_base, queue)

    # -- enqueue ------------------------------------------------------------------------

    def enqueue(
        self, queue: str, job_id: str, payload: bytes, max_attempts: int | None = None
    ) -> bool:
        """See :meth:`ZooKeeperBackend.enqueue
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.enqueue>`."""
        if is_election_key(job_id):  # elections are never in queues
            raise InvalidArgument(f"{job_id!r} is an election's key, not a job: it cannot "
                                  f"be enqueued", job_id=job_id)
        q, paths = self.paths(queue), self.job_paths(job_id)
        what = f"enqueue of {job_id!r} in queue {queue!r}"
        self._check_size(q, paths, payload, what)
        with self._lock:
            queue_lock = self._queue_locks.setdefault(queue, threading.Lock())
        deadline = self.wire.deadline()
        with queue_lock:  # this process's enqueues into one queue would only collide
            while True:
                added = self._enqueue_once(q, paths, payload, max_attempts, what)
                if added is not None:
                    return added
                if time.monotonic() >= deadline:
                    raise BackendUnavailable(
                        f"{what}: other enqueues into the queue kept taking the next seq "
                        f"for {self.config.timeout_s} s; nothing was applied", job_id=job_id,
                    )

    def _enqueue_once(
        self, q: QueuePaths, paths: JobPaths, payload: bytes, max_attempts: int | None,
        what: str,
    ) -> bool | None:
        """One multi: ``True``/``False`` as enqueue returns, ``None`` to send again."""
        version = self._version(q, what)
        tag = QueueTag(q.name, member_name(version + 1, paths.job_id), new_nonce())

        def build(tx: Any) -> None:
            tx.create(paths.job, dump_new(max_attempts))
            tx.create(paths.tag, tag.dump())
            tx.set_data(q.node, b"", version)
            tx.create(q.member(tag.member), payload)
            tx.create(q.marker(tag.member), b"")

        def settle(deadline: float) -> bool:
            reads: list[Read] = [("sync", self.config.base), ("get", paths.tag)]
            answer = self.wire.read(self.wire.reader(deadline), reads, deadline,
                                    f"{what} (reading back)", worker=False,
                                    job_id=paths.job_id)[1]
            return answer is not None and QueueTag.parse(answer[0], paths.tag) == tag

        multi = self.wire.reader_commit(build, settle, what, paths.job_id)
        if multi.applied:
            with self._lock:
                self._versions[q.queue] = version + 1
            return True
        with self._lock:
            self._versions.pop(q.queue, None)  # read it again
        if not multi.results:
            return None  # the answer was lost and it was not applied: send it again
        index, error = _first_error(multi.results)
        if index == 0 and isinstance(error, NodeExistsError):
            return self._existing(q, paths, what)
        if isinstance(error, BadVersionError):
            return None  # another enqueue took this seq
        if isinstance(error, NoNodeError):
            with self._lock:  # a container was deleted under us: make it again
                self._ready.discard(q.queue)
            return None
        if isinstance(error, NodeExistsError):  # a member of this seq exists: taken
            return None
        raise translate(error, what, self.wire.hosts, worker_session=False,
                        job_id=paths.job_id)

    def _existing(self, q: QueuePaths, paths: JobPaths, what: str) -> bool | None:
        """The job exists: ``False`` if it is in this queue; InvalidArgument if not;
        ``None`` if it is gone again (purged meanwhile)."""
        reads: list[Read] = [("sync", self.config.base), ("exists", paths.job),
                             ("get", paths.tag)]
        job, tag = self.wire.reader_read(reads, what, paths.job_id)[1:]
        if job is None:
            return None
        if tag is not None and QueueTag.parse(tag[0], paths.tag).queue == q.name:
            return False
        where = "a job claimed by name" if tag is None else "in another queue"
        raise InvalidArgument(
            f"{what}: {paths.job_id!r} already exists outside this queue ({where})",
            job_id=paths.job_id,
        )

    def _version(self, q: QueuePaths, what: str) -> int:
        """The queue node's version as last seen (the last seq issued). When not known,
        makes sure of the queue's znodes and ``{chroot}/jobs``, and reads it."""
        with self._lock:
            known = self._versions.get(q.queue)
            ready = q.queue in self._ready
        if known is not None and ready:
            return known
        if not ready:
            client = self.wire.reader()
            for path in (self.config.base, q.members, q.open, q.held):
                self.wire.ensure_path(client, path, what, worker=False)
        stat = self.wire.reader_read([("sync", self.config.base), ("exists", q.node)], what)[1]
        if stat is None:
            return 0  # deleted by hand meanwhile: the multi fails on it and makes it again
        with self._lock:
            self._ready.add(q.queue)
            self._versions[q.queue] = stat.version
        return int(stat.version)

    def _check_size(self, q: QueuePaths, paths: JobPaths, payload: bytes, what: str) -> None:
        tag = QueueTag(q.name, member_name(2**31 - 1, paths.job_id), new_nonce())
        acl = sum(len(a.id.scheme) + len(a.id.id) + 16 for a in self.config.acl_list())
        estimate = (
            len(payload) + len(tag.dump())
            + sum(len(p.encode()) for p in (paths.job, paths.tag, q.node,
                                            q.member(tag.member), q.marker(tag.member)))
            + 5 * (acl + 32) + 64
        )
        if estimate > JUTE_MAXBUFFER - REQUEST_MARGIN:
            raise InvalidArgument(
                f"{what}: the request would be about {estimate} bytes; ZooKeeper accepts at "
                f"most {JUTE_MAXBUFFER} (jute.maxbuffer) in one request: a smaller payload "
                f"or a shorter chroot", job_id=paths.job_id,
            )

    # -- reading ------------------------------------------------------------------------

    def _sorted_members(self, names: list[str] | None) -> list[tuple[int, str, str]]:
        """``(seq, job_id, member)`` of the member names we made, by seq."""
        out = []
        for member in names or ():
            parsed = parse_member(member)
            if parsed is not None:
                out.append((parsed[0], parsed[1], member))
        out.sort()
        return out

    def candidates(self, queue: str, limit: int) -> list[tuple[str, bytes]]:
        """See :meth:`ZooKeeperBackend.queue_candidates
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.queue_candidates>`."""
        q = self.paths(queue)
        what = f"listing the candidates of queue {queue!r}"
        # open before held: a job claimed between the two reads is seen held.
        _, node, open_names, held_names, delayed_names = self.wire.reader_read(
            [("sync", self.config.base), ("exists", q.node), ("children", q.open),
             ("children", q.held), ("children", q.delayed)], what,
        )
        if node is None or not open_names:
            return []
        free = sorted(set(open_names).difference(held_names or ()))  # sorts as seq
        chosen = self._claimable(q, free, set(delayed_names or ()), limit, what)[0]
        payloads = self._payloads(q, node.czxid, [member for _, member in chosen], what)
        return [(job_id, payloads[member]) for job_id, member in chosen if member in payloads]

    def _claimable(
        self, q: QueuePaths, free: list[str], delayed: set[str], limit: int, what: str
    ) -> tuple[list[tuple[str, str]], float | None]:
        """Up to ``limit`` ``(job_id, member)`` of ``free`` (sorted open, not held
        members) whose retry delay, if they have a delayed marker, is not known to be
        running; and the seconds until the soonest running delay ends (``None``: none).
        Delays not seen yet are timed first (:meth:`_time_delays`). A hint: the claim
        decides, on the store's clock."""
        members = [(parsed[1], name) for name in free
                   if (parsed := parse_member(name)) is not None]
        unseen = [(job_id, name) for job_id, name in members
                  if name in delayed and self.hints.remaining(job_id) is None]
        if unseen:
            self._time_delays(q, unseen[:READ_CHUNK], what)
        chosen: list[tuple[str, str]] = []
        soonest: float | None = None
        for job_id, name in members:
            left = self.hints.remaining(job_id) if name in delayed else None
            if left:  # its retry delay is running
                soonest = left if soonest is None else min(soonest, left)
            elif len(chosen) < limit:
                chosen.append((job_id, name))
        return chosen, soonest

    def _time_delays(self, q: QueuePaths, members: list[tuple[str, str]], what: str) -> None:
        """One round trip: the delayed markers of ``members`` and a write whose mtime is
        the store's clock now (see :func:`._wire.clock_ms`); notes when each delay ends."""
        reads: list[Read] = [("get", q.delayed_marker(name)) for _, name in members]
        answers = self.wire.reader_read([*reads, ("clock", self.config.base)], what)
        answered = time.monotonic()
        if answers[-1] is None:
            return  # {chroot}/jobs deleted by hand: the claims will tell
        now_ms = clock_ms(answers[-1])
        for (job_id, name), answer in zip(members, answers, strict=False):
            if answer is None:
                self.hints.note(job_id, 0.0)  # claimed since: no delay running
                continue
            end_ms = parse_delayed(answer, q.delayed_marker(name))
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
        answers = self.wire.reader_read([("get", q.member(m)) for m in todo], what) \
            if todo else []
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

    def jobs(self, queue: str, limit: int | None) -> list[QueuedJob]:
        """See :meth:`ZooKeeperBackend.queue_jobs
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.queue_jobs>`."""
        q = self.paths(queue)
        what = f"listing queue {queue!r}"
        members = self._sorted_members(
            self.wire.reader_read([("sync", self.config.base), ("children", q.members)], what)[1]
        )
        members = members if limit is None else members[:limit]
        out: list[QueuedJob] = []
        for start in range(0, len(members), READ_CHUNK):
            chunk = members[start : start + READ_CHUNK]
            reads: list[Read] = []
            for _, job_id, member in chunk:
                paths = self.job_paths(job_id)
                reads += [("get", paths.job), ("get", paths.owner), ("get", q.member(member)),
                          ("get", paths.failure)]
            answers = self.wire.reader_read(reads, what)
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
        q = self.paths(queue)
        woken = threading.Event()
        joined: list[tuple[str, str]] = []
        try:
            with self.wire.bounded(read_budget_s) as read_deadline:
                gate = self.wire.gate(self.wire.reader())
                most_s = self._watch(gate, q, woken, joined, read_deadline)
            if most_s is not None:
                woken.wait(max(0.0, min(deadline - time.monotonic(), most_s)))
        finally:
            self.watches.leave(joined, woken)

    def _watch(
        self, gate: Gate, q: QueuePaths, woken: threading.Event,
        joined: list[tuple[str, str]], read_deadline: float,
    ) -> float | None:
        """Join the child watches on the queue's ``open`` (an enqueue; a completion),
        ``held`` (a release, a completion, a holder's session ending; a claim) and
        ``delayed`` (a fail with a retry delay; the next claim): how long to wait at
        most (``math.inf``: until a watch fires), or ``None`` if a job looks claimable
        already (no need to wait). While every job that is neither held nor completed
        has a retry delay running, that is until the soonest ends: ZooKeeper has no
        timer event."""
        paths = [q.open, q.held, q.delayed]
        joined += [("children", path) for path in paths]
        names = self.watches.join(gate, "children", paths, woken, read_deadline)
        if names[0] is None:  # no such queue yet: its first enqueue creates it
            joined.append(("created", q.open))
            armed = self.watches.join(gate, "created", [q.open], woken, read_deadline)[0]
            return None if armed is None else math.inf
        if names[1] is None:
            return None  # made by hand, or deleted: nothing to wait on
        what = f"waiting on queue {q.queue!r}"
        if True in names:
            # joined watches armed earlier: read the names (any change since wakes us)
            names = self.wire.read(gate.client, [("children", path) for path in paths],
                                   read_deadline, what, worker=False)
            if names[0] is None or names[1] is None:
                return None
        open_names, held_names, delayed_names = names
        free = sorted(set(open_names).difference(held_names))
        if not free:
            return math.inf  # every job not completed is held
        chosen, soonest = self._claimable(q, free, set(delayed_names or ()), 1, what)
        if chosen:
            return None
        return math.inf if soonest is None else soonest

    # -- purge --------------------------------------------------------------------------

    def purge(self, queue: str) -> int:
        """See :meth:`ZooKeeperBackend.purge
        <consensus_lease.backends.zookeeper.ZooKeeperBackend.purge>`."""
        q = self.paths(queue)
        what = f"purge of queue {queue!r}"
        # Members first, open markers after: an enqueue landing between the two reads is
        # then missing from the first (ignored), never taken for a completed job.
        members, open_names = self.wire.reader_read(
            [("sync", self.config.base), ("children", q.members), ("children", q.open)], what
        )[1:]
        still_open = set(open_names or ())
        done = [m for m in self._sorted_members(members) if m[2] not in still_open]
        verified: list[_Doomed] = []
        for start in range(0, len(done), PURGE_READ_CHUNK):
            verified += self._verify_completed(q, done[start : start + PURGE_READ_CHUNK], what)
        return sum(self._delete(batch, what) for batch in self._purge_batches(verified))

    def _verify_completed(
        self, q: QueuePaths, chunk: list[tuple[int, str, str]], what: str
    ) -> list[_Doomed]:
        """The jobs of ``chunk`` whose record says COMPLETED and whose tag names this
        member, with the versions their deletes will require."""
        reads: list[Read] = []
        for _, job_id, _ in chunk:
            paths = self.job_paths(job_id)
            reads += [("get", paths.job), ("get", paths.tag), ("exists", paths.failure)]
        answers = self.wire.reader_read(reads, what)
        out: list[_Doomed] = []
        for i, (_, job_id, member) in enumerate(chunk):
            job, tag, failure = answers[3 * i : 3 * i + 3]
            paths = self.job_paths(job_id)
            if job is None or tag is None or not parse_job(job[0], paths.job).completed:
                continue
            if QueueTag.parse(tag[0], paths.tag).member != member:
                continue  # not this member's job (purged and enqueued again meanwhile)
            out.append(_Doomed(paths, tag[1].version, job[1].version, q.member(member),
                               None if failure is None else failure.version))
        return out

    @staticmethod
    def _purge_batches(jobs: list[_Doomed]) -> list[list[_Doomed]]:
        batches: list[list[_Doomed]] = []
        size = 0
        for job in jobs:
            cost = job.request_bytes()
            if batches and len(batches[-1]) < PURGE_BATCH and size + cost <= PURGE_MULTI_BYTES:
                batches[-1].append(job)
                size += cost
            else:
                batches.append([job])
                size = cost
        return batches

    def _delete(self, batch: list[_Doomed], what: str) -> int:
        """One multi deleting every job of ``batch`` (tag and failure znode, then the job
        znode at its completed version, then the member); if it fails, one multi per job.
        Returns how many went (a job another purge deleted first is not counted)."""

        def build(tx: Any) -> None:
            for job in batch:
                tx.delete(job.paths.tag, job.tag_version)
                if job.failure_version is not None:
                    tx.delete(job.paths.failure, job.failure_version)
                tx.delete(job.paths.job, job.job_version)
                tx.delete(job.member)

        def settle(deadline: float) -> bool:
            reads: list[Read] = [("sync", self.config.base)]
            reads += [("exists", job.paths.job) for job in batch]
            gone = self.wire.read(self.wire.reader(deadline), reads, deadline,
                                  f"{what} (reading back)", worker=False)[1:]
            return all(stat is None for stat in gone)

        multi = self.wire.reader_commit(build, settle, what)
        if multi.applied:
            return len(batch)
        if len(batch) > 1:
            return sum(self._delete([job], what) for job in batch)
        if not multi.results:
            return 0  # the answer was lost and it was not applied: gone some other way
        _, error = _first_error(multi.results)
        if isinstance(error, (NoNodeError, BadVersionError, NotEmptyError)):
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

    def request_bytes(self) -> int:
        return sum(len(p.encode()) + 16
                   for p in (self.paths.tag, self.paths.failure, self.paths.job, self.member))


def _cost(key: tuple[str, int, str], payload: bytes) -> int:
    """What a cached payload counts against ``PAYLOAD_CACHE_BYTES`` (with its key)."""
    return len(payload) + len(key[0]) + len(key[2]) + 200


def _first_error(results: list[Any]) -> tuple[int, Exception]:
    """The operation that failed a multi (ZooKeeper rolls back those before it and does
    not run those after it)."""
    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(
            result, (RolledBackError, RuntimeInconsistency)
        ):
            return index, result
    return len(results), BackendUnavailable("a multi failed without saying why")
