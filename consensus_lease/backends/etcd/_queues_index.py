"""A work queue's FIFO index: the candidate scan, the counters and ``queue_stats``.

Keys (see :mod:`._layout`): each open job has an index entry ``QDIR/i/ORD/HEX`` whose
ordinal ``ORD`` (20 digits) is its place in the queue, and its pending key
``QDIR/p/HEX`` names that ordinal. Ordinals are handed out by enqueue and requeue
transactions that compare and advance ``QDIR/k/seq``, so they follow commit order and
leave no gaps; ``QDIR/k/low`` says below which ordinal no live entry remains.

**Why.** etcd 3.4 answers a range sorted by anything but the key by reading every key of
the range and sorting it (the first layout's candidate read: 118 ms per claim at 100,000
open jobs), and even a key-ordered range with a small ``limit`` walks its in-memory
index over the whole range (13 ms at 100,000 keys, measured). A range whose *both ends*
are close costs what the keys inside it cost. So the scan reads windows of at most
:data:`WINDOW` ordinals from the low-water mark, key-ordered, :data:`SCAN_PAGE` entries
at a time: its cost depends on the held, delayed and stale entries at the front of the
queue, never on the queue's depth.

**The scan** (:func:`candidates`), per page: one read-only transaction with the page of
entries, ``seq`` and ``low``; one with each entry's pending key (stale if absent or
naming another ordinal), owner key (held?), not-before key (a retry delay runs?) and
payload. A held job keeps its entry, so a lease that expires (etcd deletes the owner key
and held marker; no transaction of ours runs) leaves the job findable at its old place,
and the claim transaction decides as always. The completion (and a FAILED verdict) of a
job claimed from a scan deletes its entry in the same transaction (the claim read the
ordinal); other entries that became stale (e.g. of jobs claimed by name) stay stale for
good, since ordinals are never reused, and scans delete them in batches of
:data:`~._queues_state.FLUSH_STALE`. A scan from the low-water mark raises it to the
first live entry (the driver's copy; ``QDIR/k/low`` with the next stale batch, compared,
never lowered); an empty window (a gap left by deleted entries) is jumped over with one
key-ordered read to the index's end (:func:`_next_ordinal`).

The held jobs at the front of the queue (and the gap a long-held job leaves behind it)
would be read again by every scan; so a driver starts its scans at its *cursor*, the
ordinal where its last scan found its first candidate (or past the last job of a batch
claim that took every candidate it read), and from the low-water mark only when the
cursor's scan finds nothing (for a batch claim: fewer than it asked for), when it
released a job of the queue itself or ended one of its sessions, or every
:data:`~._queues_state.RESCAN_S`.

**Ordering guarantee.** Candidates come in ordinal order: the order in which enqueue
transactions committed; a requeued job goes to the back; a released or expired job keeps
its place at the front, and is offered again by a driver's scans at once if that driver
released it (or ended the session that held it) or has nothing else to offer, else
within :data:`~._queues_state.RESCAN_S`.
``claim_next`` then starts at a random one of the oldest few (see
:mod:`consensus_lease._queue_claim`), so claims are FIFO-ish, not strictly FIFO.

**Counters** (:func:`stats`): completions, FAILED verdicts and requeues are counted by
the *version* of a key their transaction puts without a compare (``QDIR/k/done``,
``failed``, ``requeued``), so concurrent workers never conflict on them. etcd refuses a
transaction that puts one key twice, so the completions sharing one ``complete_many``
transaction each put a key of their own: the one at position ``i`` of the batch the
shard ``QDIR/k/done/NNN`` (``i`` > 0; at most ``max_complete_batch`` - 1 of them), the
first (and every lone completion) ``QDIR/k/done`` itself; the completed count is the sum
of their versions (a queue without shards, as every queue before batched completions
had, reads as before: no upgrade step). The FAILED verdicts of one ``fail_many``
transaction are sharded the same way (``QDIR/k/failed/NNN``). Purge rewrites
``QDIR/k/purged`` under a compare; held jobs are counted by their held markers
``QDIR/h/HEX``, which live on the holder's lease (an expiry deletes them with the owner
key, in the same revision). ``queue_stats`` reads all of them in one read-only
transaction, i.e. at one revision: the counts are one consistent snapshot, and
``available + held + completed + failed`` is the number of jobs in the queue.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyetcd import etcdrpc

from ...errors import InvalidArgument, LeaseError
from ...record import QueueStats
from . import _transport_requests as rq
from ._layout import ORDINAL_DIGITS, QueueKeys, ordinal_bytes, ordinal_of, pair_of
from ._queues_state import Base, Counters
from ._transport import Failure

if TYPE_CHECKING:
    from ._jobs import Ops

__all__ = [
    "MAX_SCAN_PAGES",
    "SCAN_PAGE",
    "WINDOW",
    "candidates",
    "delete_stale",
    "layout_refused",
    "read_counters",
    "stats",
]

log = logging.getLogger("consensus_lease.etcd")

WINDOW = 1024
"""Most ordinals one index read spans: etcd walks its index over the whole range asked
for, so both ends are kept this close."""

SCAN_PAGE = 32
"""Index entries per page: the check transaction makes 4 reads per entry, within etcd's
default ``--max-txn-ops`` (128; split further on a server that allows fewer)."""

MAX_SCAN_PAGES = 512
"""Most pages one scan reads (16,384 entries: held, delayed and stale ones at the front
of the queue) before answering what it found (possibly nothing)."""

HELD_LEASES = 8
"""Most distinct holder leases whose TTL ``queue_stats`` asks for (the earliest lease
end among held jobs)."""


def layout_refused(queue: str) -> InvalidArgument:
    """The error for a queue written by the first layout."""
    return InvalidArgument(
        f"etcd queue {queue!r} was written by an earlier consensus_lease (queue layout 1, "
        f"without FIFO ordinals) and is not served by this version; nothing was written. "
        f"Upgrade step: stop its workers and producers, then run "
        f"`consensus-lease upgrade-queue --backend URL {shlex.quote(queue)}` once (it "
        f"rewrites the queue's index and counters in place), then start them with this "
        f"version")

def _probe(qkeys: QueueKeys) -> Any:
    """A read answering whether the queue has any member key (count)."""
    key, end = qkeys.members
    return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(
        key=key, range_end=end, limit=1, keys_only=True))


def _checked(ops: Ops, qkeys: QueueKeys, seq_kv: Any, probe: Any | None) -> bool:
    """Whether the queue has jobs of the current layout (``seq`` exists); ``False`` for
    an empty queue.

    Raises:
        InvalidArgument: the queue has jobs of the first layout.
    """
    if seq_kv is not None:
        ops.queues.mark_current(qkeys.queue)
        return True
    if probe is not None and probe.response_range.count > 0:
        raise layout_refused(qkeys.queue)
    return False


def read_counters(ops: Ops, qkeys: QueueKeys, what: str) -> Counters:
    """One read-only transaction: the :class:`Counters` (and, until the queue is known
    to have the current layout, whether it has member keys).

    Raises:
        InvalidArgument: the queue has jobs of the first layout.
        BackendUnavailable / AuthenticationFailed.
    """
    reads = Counters.reads(qkeys)
    probe = not ops.queues.is_current(qkeys.queue)
    if probe:
        reads.append(_probe(qkeys))
    answer = ops.read(rq.txn(success=reads), what)
    kvs = [rq.kv_of(r) for r in answer.responses[:4]]
    _checked(ops, qkeys, kvs[0], answer.responses[4] if probe else None)
    return Counters.of(*kvs)


# -- the candidate scan ------------------------------------------------------------------


def candidates(ops: Ops, queue: str, limit: int,
               fill: bool = False) -> list[tuple[str, bytes]]:
    """See :meth:`EtcdBackend.queue_candidates
    <consensus_lease.backends.etcd.EtcdBackend.queue_candidates>`: a scan from the
    driver's cursor (where the last scan found its first candidate) while the last scan
    from the low-water mark is under :data:`~._queues_state.RESCAN_S` old and the cursor's
    scan finds something (with ``fill``: ``limit`` candidates; a batch claim's scan,
    which must not come back short while older jobs are claimable); else a scan from
    the low-water mark, which also raises it.
    What it found is remembered as the queue's offered candidates
    (:meth:`~._queues_state.QueueCache.offer`)."""
    qkeys = ops.layout.queue(queue)
    cursor = ops.queues.cursor(queue)
    found = [] if cursor is None else _scan(ops, qkeys, limit, cursor)
    if not found or (fill and len(found) < limit):
        found = _scan(ops, qkeys, limit, None)
    ops.queues.offer(queue, found)  # for the fused claim (:mod:`._queues_fused`)
    return found


def _classify(ops: Ops, qkeys: QueueKeys, entries: list[tuple[int, str]], what: str,
              stale: list[bytes], out: list[tuple[str, bytes]]) -> tuple[int | None, int | None]:
    """Read the jobs of one page of index ``entries``: append the stale entries (pending
    key gone or moved) to ``stale`` and the claimable jobs (no owner, no retry delay) to
    ``out``; return the ordinals of the first live and the first claimable entry."""
    first_live: int | None = None
    first_found: int | None = None
    for chunk, answer in ops.txn_limit.read_split(
            ops, entries, SCAN_PAGE, lambda c: _checks(ops, qkeys, c), what):
        for i, (ordinal, job_id) in enumerate(chunk):
            pending, owner, delay, member = answer.responses[4 * i : 4 * i + 4]
            if ordinal_of(rq.kv_of(pending)) != ordinal:
                stale.append(qkeys.entry(ordinal, job_id))
                continue
            if first_live is None:
                first_live = ordinal
            member_kv = rq.kv_of(member)
            if (owner.response_range.count == 0 and delay.response_range.count == 0
                    and member_kv is not None):
                out.append((job_id, bytes(member_kv.value)))
                ops.queues.hint(job_id, qkeys.queue)
                if first_found is None:
                    first_found = ordinal
    return first_live, first_found


def _scan(ops: Ops, qkeys: QueueKeys, limit: int,
          cursor: int | None) -> list[tuple[str, bytes]]:
    """Up to ``limit`` candidates, from ``cursor`` on, or (``None``) from the low-water
    mark: then the first live entry seen is the new mark."""
    queue = qkeys.queue
    cache = ops.queues
    what = f"listing the candidates of queue {queue!r}"
    pos = cache.low(queue) if cursor is None else max(cursor, cache.low(queue))
    first_live: int | None = None
    first_found: int | None = None
    stale: list[bytes] = []
    out: list[tuple[str, bytes]] = []
    for _ in range(MAX_SCAN_PAGES):
        high = (pos // WINDOW + 1) * WINDOW
        start, end = qkeys.entries(pos, high)
        reads = [
            etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(
                key=start, range_end=end, limit=SCAN_PAGE, keys_only=True)),
            rq.get(qkeys.counter("seq")), rq.get(qkeys.counter("low")),
        ]
        probe = not cache.is_current(queue)
        if probe:
            reads.append(_probe(qkeys))
        page = ops.read(rq.txn(success=reads), what)
        seq_kv, low_kv = rq.kv_of(page.responses[1]), rq.kv_of(page.responses[2])
        if not _checked(ops, qkeys, seq_kv, page.responses[3] if probe else None):
            return []  # no job was ever enqueued (with this layout)
        seq, low = pair_of(seq_kv)[0], ordinal_of(low_kv) or 0
        if low > pos:
            pos = low
            cache.raise_low(queue, low)
            continue
        found = page.responses[0].response_range
        if not found.kvs:  # a gap (deleted stale entries): jump to the next entry
            pos = min(seq, _next_ordinal(ops, qkeys, high, what) or seq)
            if pos >= seq:
                break
            continue
        entries = [e for e in (qkeys.entry_of(bytes(kv.key)) for kv in found.kvs)
                   if e is not None]
        live, claimable = _classify(ops, qkeys, entries, what, stale, out)
        first_live = live if first_live is None else first_live
        first_found = claimable if first_found is None else first_found
        if len(out) >= limit:
            break
        pos = entries[-1][0] + 1 if found.more and entries else high
        if pos >= seq:
            pos = seq
            break
    if cursor is None:
        cache.raise_low(queue, first_live if first_live is not None else pos)
    cache.move_cursor(queue, first_found, rescanned=cursor is None)
    delete_stale(ops, qkeys, cache.add_stale(queue, stale), cache.low(queue))
    return out[:limit]


def _next_ordinal(ops: Ops, qkeys: QueueKeys, start: int, what: str) -> int | None:
    """The ordinal of the first index entry from ``start`` on (``None``: none). One
    key-ordered range read with ``limit`` 1 to the end of the index: etcd walks its
    in-memory index over the rest of the queue (about 13 ms per 100,000 entries,
    measured on etcd 3.4), so this is only done on meeting an empty window."""
    key, end = qkeys.entries(start, 10**ORDINAL_DIGITS - 1)
    found = ops.read(etcdrpc.RangeRequest(key=key, range_end=end, limit=1, keys_only=True),
                     what)
    for kv in found.kvs:
        entry = qkeys.entry_of(bytes(kv.key))
        if entry is not None:
            return entry[0]
    return None


def _checks(ops: Ops, qkeys: QueueKeys, entries: Sequence[tuple[int, str]]) -> Any:
    """Per entry: its pending key, owner key (count), not-before key (count), payload."""
    reads = []
    for _, job_id in entries:
        keys = ops.layout.job(job_id)
        reads += [rq.get(qkeys.pending(job_id)), rq.count(keys.owner),
                  rq.count(keys.not_before), rq.get(qkeys.member(job_id))]
    return rq.txn(success=reads)


def delete_stale(ops: Ops, qkeys: QueueKeys, stale: Sequence[bytes],
                 low: int | None = None) -> None:
    """Best effort: delete stale index entries and (with ``low``) raise ``QDIR/k/low``
    to ``low`` unless it is higher already. An entry once stale stays stale (ordinals
    are never reused), so the deletes need no compare. A failure is logged: another scan
    (or purge) deletes them later."""
    if not stale:
        return
    raise_low = [] if low is None else [etcdrpc.RequestOp(request_txn=rq.txn(
        compare=[rq.value_less(qkeys.counter("low"), ordinal_bytes(low))],
        success=[rq.put(qkeys.counter("low"), ordinal_bytes(low))]))]
    room = max(1, ops.txn_limit.max_ops // 2)
    what = f"deleting stale index entries of queue {qkeys.queue!r}"
    try:
        for start in range(0, len(stale), room):
            chunk = stale[start : start + room]
            last = start + room >= len(stale)
            ops.transport.send("kv", "Txn", rq.txn(
                success=[rq.delete(k) for k in chunk] + (raise_low if last else [])),
                what=what, job_id=None)
    except (LeaseError, Failure) as exc:
        log.warning("etcd: %s failed (a later scan does it): %s", what, exc)


# -- statistics ---------------------------------------------------------------------------


def stats(ops: Ops, queue: str) -> QueueStats:
    """See :meth:`EtcdBackend.queue_stats
    <consensus_lease.backends.etcd.EtcdBackend.queue_stats>`."""
    qkeys = ops.layout.queue(queue)
    names = ("seq", "base", "done", "failed", "requeued", "purged")
    start, end = qkeys.helds
    reads = [rq.get(qkeys.counter(n)) for n in names]
    reads.append(etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(
        key=start, range_end=end, limit=64)))
    for counted in ("done", "failed"):
        shard, shards_end = qkeys.shards(counted)
        reads.append(etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(
            key=shard, range_end=shards_end, keys_only=True)))
    probe = not ops.queues.is_current(queue)
    if probe:
        reads.append(_probe(qkeys))
    answer = ops.read(rq.txn(success=reads), f"counting the jobs of queue {queue!r}")
    seq_kv, base_kv, done_kv, failed_kv, requeued_kv, purged_kv = (
        rq.kv_of(r) for r in answer.responses[:6])
    if not _checked(ops, qkeys, seq_kv, answer.responses[9] if probe else None):
        return QueueStats(queue, 0, 0, 0, None, 0)

    def version(kv: Any) -> int:
        return 0 if kv is None else int(kv.version)

    base = Base.of(base_kv)
    purged = pair_of(purged_kv)[0]
    requeued = version(requeued_kv)
    held_range = answer.responses[6].response_range
    held = int(held_range.count)
    total = pair_of(seq_kv)[0] + base.jobs - requeued - purged
    def shards(at: int) -> int:
        return sum(int(kv.version) for kv in answer.responses[at].response_range.kvs)

    completed = base.done + version(done_kv) + shards(7) - purged
    failed = base.failed + version(failed_kv) + shards(8) - requeued
    return QueueStats(queue, total - held - completed - failed, held, completed,
                      _earliest_lease_end(ops, held_range.kvs), failed)


def _earliest_lease_end(ops: Ops, held_kvs: Sequence[Any]) -> float | None:
    """The earliest end (local wall clock + remaining TTL) among the leases of the first
    held markers (at most :data:`HELD_LEASES` leases asked; display only)."""
    leases = list(dict.fromkeys(int(kv.lease) for kv in held_kvs if kv.lease))[:HELD_LEASES]
    ends = []
    for lease_id in leases:
        ttl = ops.lease_ttl(lease_id)
        if ttl is not None and ttl > 0:
            ends.append(time.time() + ttl)
    return min(ends) if ends else None
