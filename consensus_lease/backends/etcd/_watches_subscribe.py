"""Waking waiting claims on etcd: subscriptions served by watches on one shared stream.

:meth:`EtcdBackend.subscribe_job <consensus_lease.backends.etcd.EtcdBackend.subscribe_job>`
and ``subscribe_queue`` land here. Subscriptions are refcounted per job and per queue:
the first subscriber of one reads it once (at revision ``R``; if it looks claimable
already, every subscriber is called soon) and starts its watches from ``R + 1`` on the
driver's :class:`~._watches_hub.WatchHub` (one gRPC stream, one thread), so no change
after that read is missed; later subscribers just join. The last one to leave cancels
the watches. A change before a subscription returns needs no event: callers claim after
subscribing.

What wakes whom (as :meth:`wait_for_change` and :func:`._watches_queue.wait` decide):

* a job: a watch on its keys ``[c, o\\0)`` (:attr:`JobKeys.watch_range`); in one
  revision, the owner key deleted (release, lease expiry or revoke, completion, fail)
  unless a not-before key was put with it (a fail with a retry delay), the not-before key
  deleted (the delay's lease ran out), the completion or FAILED record put (the waiting
  claim learns it), or the FAILED record deleted (requeue). A new claim wakes nobody.
* an election: the same watch reaching to its value key ``v``, and every event wakes it:
  a new leader (claim), its value (``set_value``) and its end are what observers of the
  election follow (waiting candidates then try once more and find it held).
* a queue: a watch on its pending keys, which tells enqueues and requeues (a PUT: wake)
  and keeps the set of the queue's open jobs (a DELETE: completed or FAILED); plus ONE
  watch shared by every subscribed queue on the deletions of all job keys: an owner key
  deleted without its history key in the same revision (a release, a lease expiry, a
  fail; a completion deletes the history key and frees nothing), or a not-before key,
  wakes the queues that have that job open (every queue tracking more than
  :data:`~._watches_queue.WAIT_TRACKED` open jobs).

If the stream breaks, every subscriber is called once (they re-check the store) and the
watches resume where they stopped; a watch whose events were compacted meanwhile calls
its subscribers too. Closing calls every subscriber once; later subscriptions are called
at once (their claims then find the store closed).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from pyetcd import etcdrpc

from ..._subscriptions import Unsubscribe, WakeCallback
from ...errors import BackendUnavailable
from . import _transport_requests as rq
from ._jobs import Ops
from ._layout import COMPLETION, FAILED, HISTORY, NOT_BEFORE, OWNER, Layout, QueueKeys
from ._watches import NOPUT
from ._watches_hub import Watch, WatchHub
from ._watches_queue import WAIT_TRACKED

__all__ = ["Subscriptions"]

log = logging.getLogger("consensus_lease.etcd")

PAGE = 64
"""Pending keys read per request when a queue is first subscribed."""

_DELETE = etcdrpc.WatchResponse().events.add().DELETE


class _Entry:
    """The subscribers of one job or queue, and the watch that serves them."""

    __slots__ = ("callbacks", "error", "open_jobs", "ready", "watch")

    def __init__(self) -> None:
        self.callbacks: dict[int, WakeCallback] = {}
        self.ready = threading.Event()  # armed (or failed: ``error``)
        self.error: BaseException | None = None
        self.watch: Watch | None = None
        self.open_jobs: set[str] | None = set()  # a queue's; None: too many to track


@dataclass(frozen=True, slots=True)
class _Armed:
    """What the first read of a job or queue found, and the watch to start."""

    watch: Watch
    claimable: bool
    open_jobs: set[str] | None = None


Arm = Callable[[str, _Entry], _Armed]
Table = dict[str, _Entry]


class Subscriptions:
    """Every subscription of one etcd driver. Thread-safe.

    Args:
        ops: the driver's shared context (transport, layout, config).
    """

    def __init__(self, ops: Ops) -> None:
        self._ops = ops
        self._layout: Layout = ops.layout
        self.hub = WatchHub(ops.transport, self._stream_failed)
        self._lock = threading.Lock()
        self._jobs: Table = {}
        self._queues: Table = {}
        self._deletes: Watch | None = None  # shared by every armed queue entry
        self._ids = itertools.count()
        self._closed = False

    # -- subscribing ---------------------------------------------------------------------

    def subscribe_job(self, job_id: str, callback: WakeCallback) -> Unsubscribe:
        """See :meth:`EtcdBackend.subscribe_job`."""
        return self._subscribe(self._jobs, job_id, callback, self._arm_job)

    def subscribe_queue(self, queue: str, callback: WakeCallback) -> Unsubscribe:
        """See :meth:`EtcdBackend.subscribe_queue`."""
        return self._subscribe(self._queues, queue, callback, self._arm_queue)

    def _subscribe(self, table: Table, name: str, callback: WakeCallback,
                   arm: Arm) -> Unsubscribe:
        token = next(self._ids)
        with self._lock:
            closed = self._closed
            entry = table.get(name)
            first = entry is None
            if not closed:
                if entry is None:
                    entry = table[name] = _Entry()
                entry.callbacks[token] = callback
        if closed or entry is None:
            callback()  # the driver is closed: the caller finds out when it re-tries
            return _nothing
        if first:
            self._arm(table, name, entry, arm)
        else:
            entry.ready.wait()
        if entry.error is not None:
            with self._lock:
                entry.callbacks.pop(token, None)
            raise BackendUnavailable(f"etcd: cannot watch {name!r}: {entry.error}") from (
                entry.error)
        return lambda: self._unsubscribe(table, name, entry, token)

    def _arm(self, table: Table, name: str, entry: _Entry, arm: Arm) -> None:
        """Read ``name`` once and start its watch (the first subscriber does this; the
        others wait for ``entry.ready``). Raises what the read raised."""
        try:
            armed = arm(name, entry)
        except BaseException as exc:
            with self._lock:
                if table.get(name) is entry:
                    del table[name]
                entry.error = exc
                entry.ready.set()
            raise
        with self._lock:
            entry.watch, entry.open_jobs = armed.watch, armed.open_jobs
            if entry.callbacks and not self._closed:
                self.hub.add(armed.watch)
                if table is self._queues:
                    self._share_deletes(armed.watch.next_revision)
            elif table.get(name) is entry:  # everyone left (or closed) meanwhile
                del table[name]
            entry.ready.set()
            callbacks = list(entry.callbacks.values()) if armed.claimable else []
        _call_all(callbacks)

    def _unsubscribe(self, table: Table, name: str, entry: _Entry, token: int) -> None:
        with self._lock:
            if entry.callbacks.pop(token, None) is None or entry.callbacks:
                return
            if table.get(name) is not entry or entry.watch is None:
                return  # being armed: the armer sees nobody is left; or already gone
            del table[name]
            self.hub.remove(entry.watch)
            if table is self._queues:
                self._unshare_deletes()

    def _share_deletes(self, start_revision: int) -> None:
        """The first armed queue starts the shared job-deletions watch (lock held)."""
        if self._deletes is None:
            self._deletes = Watch(self._layout.root, self._layout.jobs_range_end,
                                  start_revision, self._job_keys_deleted, self._queues_lost,
                                  filters=(NOPUT,))
            self.hub.add(self._deletes)

    def _unshare_deletes(self) -> None:
        """The last armed queue gone: stop the shared watch (lock held)."""
        if self._deletes is not None and all(
                e.watch is None for e in self._queues.values()):
            self.hub.remove(self._deletes)
            self._deletes = None

    # -- first reads ---------------------------------------------------------------------

    def _arm_job(self, job_id: str, entry: _Entry) -> _Armed:
        keys = self._layout.job(job_id)
        answer = self._ops.read(
            rq.txn(success=[rq.count(keys.owner), rq.count(keys.not_before),
                            rq.count(keys.completion), rq.count(keys.failed)]),
            f"reading {job_id!r} to watch it", budget_s=self._ops.config.timeout_s,
            job_id=job_id,
        )
        owner, delay, done, dead = (r.response_range.count for r in answer.responses)
        election = keys.is_election
        watch = Watch(*keys.watch_range, int(answer.header.revision) + 1,
                      lambda events: self._job_changed(entry, events, election),
                      lambda: self._fire([entry]))
        return _Armed(watch, bool(done or dead or not (owner or delay)))

    def _arm_queue(self, queue: str, entry: _Entry) -> _Armed:
        qkeys = self._layout.queue(queue)
        revision, open_jobs, claimable = self._queue_snapshot(qkeys)
        watch = Watch(*qkeys.pendings, revision + 1,
                      lambda events: self._pending_changed(entry, qkeys, events),
                      lambda: self._pending_lost(entry))
        return _Armed(watch, claimable, open_jobs)

    def _queue_snapshot(self, qkeys: QueueKeys) -> tuple[int, set[str] | None, bool]:
        """``(revision, open jobs, claimable)``: the queue's pending keys at one revision
        (``None`` beyond :data:`WAIT_TRACKED`), and whether one of them was neither held
        nor in a retry delay."""
        what = f"reading queue {qkeys.queue!r} to watch it"
        budget_s = self._ops.config.timeout_s
        key, range_end = qkeys.pendings
        revision, claimable = 0, False
        open_jobs: set[str] = set()
        while True:
            page = self._ops.read(
                etcdrpc.RangeRequest(key=key, range_end=range_end, limit=PAGE,
                                     keys_only=True, revision=revision),
                what, budget_s=budget_s,
            )
            revision = revision or int(page.header.revision)
            jobs = [j for kv in page.kvs if (j := qkeys.job_of(bytes(kv.key))) is not None]
            if jobs and not claimable:
                claimable = self._any_unheld(jobs, what)
            open_jobs.update(jobs)
            if len(open_jobs) > WAIT_TRACKED or page.count > WAIT_TRACKED:
                # A deep queue: not tracked by name (each page would cost etcd a walk of
                # its index over the whole queue); one look at the first page decides.
                return revision, None, claimable
            if not page.more or not page.kvs:
                return revision, open_jobs, claimable
            key = bytes(page.kvs[-1].key) + b"\0"

    def _any_unheld(self, jobs: Sequence[str], what: str) -> bool:
        checks = []
        for job_id in jobs:
            keys = self._layout.job(job_id)
            checks += [rq.count(keys.owner), rq.count(keys.not_before)]
        answer = self._ops.read(rq.txn(success=checks), what,
                                budget_s=self._ops.config.timeout_s)
        counts = [r.response_range.count for r in answer.responses]
        return any(not (owner or delay) for owner, delay in zip(counts[::2], counts[1::2],
                                                                  strict=True))

    # -- events (on the hub's thread) ----------------------------------------------------

    def _job_changed(self, entry: _Entry, events: Sequence[Any], election: bool) -> None:
        if election or _job_may_be_free(self._layout, events):
            self._fire([entry])

    def _pending_changed(self, entry: _Entry, qkeys: QueueKeys, events: Sequence[Any]) -> None:
        """Keep the queue's open jobs; an enqueue or requeue (a PUT) wakes it."""
        woken = False
        with self._lock:
            for event in events:
                job_id = qkeys.job_of(bytes(event.kv.key))
                if job_id is None:
                    continue
                if event.type == _DELETE:
                    if entry.open_jobs is not None:
                        entry.open_jobs.discard(job_id)
                    continue
                woken = True
                if entry.open_jobs is not None:
                    entry.open_jobs.add(job_id)
                    if len(entry.open_jobs) > WAIT_TRACKED:
                        entry.open_jobs = None
        if woken:
            self._fire([entry])

    def _pending_lost(self, entry: _Entry) -> None:
        with self._lock:
            entry.open_jobs = None  # membership changes were missed: wake on any job
        self._fire([entry])

    def _job_keys_deleted(self, events: Sequence[Any]) -> None:
        """Wake the queues that have a job these deletions freed."""
        freed = _freed(self._layout, events)
        if freed:
            with self._lock:
                entries = [e for e in self._queues.values()
                           if e.watch is not None and _tracks(e.open_jobs, freed)]
            self._fire(entries)

    def _queues_lost(self) -> None:
        with self._lock:
            entries = list(self._queues.values())
        self._fire(entries)

    def _stream_failed(self) -> None:
        with self._lock:
            entries = [*self._jobs.values(), *self._queues.values()]
        self._fire(entries)

    def _fire(self, entries: Collection[_Entry]) -> None:
        with self._lock:
            callbacks = [cb for entry in entries for cb in entry.callbacks.values()]
        _call_all(callbacks)

    # -- closing -------------------------------------------------------------------------

    def stop(self) -> None:
        """End the stream (before the transport closes, which would look like a broken
        stream); :meth:`close` then calls the subscribers. Idempotent."""
        self.hub.close()

    def close(self) -> None:
        """Stop watching and call every subscriber once. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            entries = [*self._jobs.values(), *self._queues.values()]
            callbacks = [cb for entry in entries for cb in entry.callbacks.values()]
            self._jobs.clear()
            self._queues.clear()
            self._deletes = None
        self.hub.close()
        _call_all(callbacks)

    def __len__(self) -> int:
        """The number of subscriptions."""
        with self._lock:
            entries = [*self._jobs.values(), *self._queues.values()]
            return sum(len(entry.callbacks) for entry in entries)


def _job_may_be_free(layout: Layout, events: Sequence[Any]) -> bool:
    """Whether the events of one job's keys may have made it claimable (or completed or
    FAILED), judged revision by revision."""
    by_revision: dict[int, tuple[set[bytes], set[bytes]]] = {}
    for event in events:
        parsed = layout.parse(bytes(event.kv.key))
        if parsed is None:
            continue
        put, deleted = by_revision.setdefault(int(event.kv.mod_revision), (set(), set()))
        (deleted if event.type == _DELETE else put).add(parsed[1])
    for put, deleted in by_revision.values():
        if put & {COMPLETION, FAILED} or deleted & {FAILED, NOT_BEFORE}:
            return True
        if OWNER in deleted and NOT_BEFORE not in put:
            return True
    return False


def _freed(layout: Layout, events: Sequence[Any]) -> set[str]:
    """The jobs that job-key DELETE ``events`` may have made claimable: an owner key
    deleted without its history key in the same revision, or a not-before key."""
    kinds: dict[int, dict[bytes, set[str]]] = {}
    for event in events:
        parsed = layout.parse(bytes(event.kv.key))
        if parsed is not None and parsed[1] in (OWNER, HISTORY, NOT_BEFORE):
            by_kind = kinds.setdefault(int(event.kv.mod_revision), {})
            by_kind.setdefault(parsed[1], set()).add(parsed[0])
    freed: set[str] = set()
    for by_kind in kinds.values():
        owners, histories = by_kind.get(OWNER, set()), by_kind.get(HISTORY, set())
        freed |= (owners - histories) | by_kind.get(NOT_BEFORE, set())
    return freed


def _tracks(open_jobs: set[str] | None, freed: set[str]) -> bool:
    return open_jobs is None or not open_jobs.isdisjoint(freed)


def _nothing() -> None:
    return None


def _call_all(callbacks: Sequence[WakeCallback]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.exception("a subscription callback raised")
