"""Waking waiting claims from ZooKeeper watches: the ZooKeeper side of
:meth:`Backend.subscribe_job <consensus_lease.backend.Backend.subscribe_job>` and
:meth:`~consensus_lease.backend.Backend.subscribe_queue`.

What is watched, on the backend's shared client (:meth:`._transport.Wire.reader`), with
kazoo's one-shot watches (the znodes the blocking waits of :mod:`._watches` watch too):

* a job: ``exists`` on its owner znode. Release, completion, ``fail()`` and the holder's
  session ending all delete it, in the same multi as any other change that may let a
  waiting claim go on; a claim creates it (a watch armed while it is absent). For an
  election key every event wakes the subscribers (a new leader creates the owner znode,
  ``set_value`` sets its data): ``store.observe`` reports each change.
* a queue: ``get_children`` on the ``open`` (enqueue, requeue, completion), ``held``
  (claim, release, completion, fail, expiry) and ``delayed`` (fail with a retry delay)
  znodes of its buckets from the oldest not known to be done (:mod:`._queues`) to the
  newest, at most 8; ``exists`` on the oldest one's ``open`` while it does not exist
  yet (a new queue, or every bucket done: the next enqueue makes it). Which buckets is
  decided again at every round, from what this backend last saw of the queue; an empty
  ``open`` in a bucket that is not the one the next enqueue writes to wakes the
  subscribers (their claims move past it) and is read again after the checks' backoff.

Every subscription of one job (or queue) shares one :class:`_Target`, and a target arms
at most one watch per znode, however many subscribe: a thousand waiting claims on one
job cost one watch. kazoo has no call that removes a watch, so a target whose
subscribers all left stays until its armed watches fire (or the connection drops them).

Rounds. A watch fires once. On its event (kazoo's callback thread, which must never
block) the target sends a *round*: the same reads again, asynchronously, re-arming the
watch that fired (the others, still armed, are read without one). When the round's
answers arrive the subscribers are woken if the job (a job of the queue) may be
claimable, completed or FAILED: the owner znode is absent; the queue has an ``open``
member that is not ``held`` and whose retry delay (if it has a ``delayed`` marker) is not
known to run. Waking only once the watch is in place again means that a change after
the wake fires the new watch, and a change before it is seen by the claims the wake
triggers. A subscription's first round (sent before ``subscribe`` returns) wakes it the
same way, so a change between the caller's claim and the watch being armed is not lost.

Early wake. An event on a queue's ``open`` (one of the buckets watched, or its creation)
is most often an enqueue: it also wakes the target's longest-waiting subscriber at once,
right after the round is sent, without waiting for its answers (one round trip and a
thread hand-off sooner: the handler of a job enqueued into an idle queue starts that
much earlier). Nothing is missed by waking before the watch is in place again: the
round is sent before the wake, on the shared client, which also sends the woken claim's
listing (``queue_candidates``); ZooKeeper answers one client's requests in order, so
that listing is read after the watch is armed again, and a change it does not see fires
the new watch. When the round's answers arrive every subscriber is woken as above (the
early one again, harmless: a claim woken while it tries tries once more if it found
nothing). The cost is one subscriber's listing for an event that made nothing claimable
(a completion of the queue's last open job, while others wait): one per event and
target, however many wait. ``held`` and ``delayed`` events (claims among them) wake
only through their round.

Checks. A target that looks claimable while subscribers still wait (a claim that read
a member lagging behind the shared client's: a worker's first read is not synced) is
read again after :data:`RECHECK_FIRST_S`, doubling up to :data:`RECHECK_MAX_S` while it
stays so; a target that does not look claimable costs no read at all. Retry delays have
no event in ZooKeeper: when this backend learns how long one runs (a claim refused for
it, a queue listing timing it: :class:`NotifyingHints`), a target waiting on that job is
read again when it ends. All timed checks share one thread (:class:`._watches_timer.WakeTimer`).

Connection: when the shared client is SUSPENDED or LOST, kazoo drops every watch; every
subscriber is woken once (spurious: their claims retry and find out) and every target
sends a round when the client is CONNECTED again. A round that fails otherwise wakes its
subscribers and is sent again after :data:`RETRY_ARM_S`. Closing wakes every subscriber
once; later subscriptions are called back at once.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.states import EventType, KazooState

from ..._election import is_election_key
from ..._subscriptions import Unsubscribe, WakeCallback
from ...errors import BackendUnavailable
from ._jobs_lifecycle import DelayHints
from ._layout import JobPaths, QueuePaths, parse_member
from ._transport import Wire
from ._transport_errors import answer_or_none
from ._watches_timer import WakeTimer

QueueTarget = Callable[[str], tuple[tuple[str, ...], bool]]
"""queue -> (the ``open``, ``held``, ``delayed`` of each bucket to watch, oldest first;
whether the first is the bucket the next enqueue writes to)."""

__all__ = [
    "ENDED_S",
    "JOB",
    "QUEUE",
    "RECHECK_FIRST_S",
    "RECHECK_MAX_S",
    "RETRY_ARM_S",
    "NotifyingHints",
    "Subscriptions",
]

log = logging.getLogger("consensus_lease.backends.zookeeper")

RETRY_ARM_S = 0.5
"""Seconds before a round that failed (other than by a lost connection) is sent again."""

RECHECK_FIRST_S = 0.05
"""Seconds before a target that looked claimable, with subscribers still waiting, is
read again; doubled at each read that finds it so, up to :data:`RECHECK_MAX_S`."""

RECHECK_MAX_S = 1.0

ENDED_S = 0.002
"""A retry delay that ends within this many seconds counts as ended (float rounding of
the timer and the hints)."""

JOB, QUEUE = "job", "queue"
Key = tuple[str, str]


class NotifyingHints(DelayHints):
    """:class:`._jobs_lifecycle.DelayHints` that also tell ``on_note(job_id, remaining_s)``
    each delay end noted (after storing it), so that subscribers are woken then."""

    def __init__(self, on_note: Callable[[str, float], None]) -> None:
        super().__init__()
        self._on_note = on_note

    def note(self, job_id: str, remaining_s: float) -> None:
        super().note(job_id, remaining_s)
        self._on_note(job_id, remaining_s)


@dataclass(eq=False)
class _Target:
    """One subscribed job or queue: its subscribers, its znodes and which are armed."""

    subs: Subscriptions
    key: Key
    paths: tuple[str, ...]  # job: (owner,); queue: (open, held, delayed) per bucket
    callbacks: dict[int, WakeCallback] = field(default_factory=dict)
    armed: dict[str, int] = field(default_factory=dict)  # path -> the round that armed it
    delayed: frozenset[str] = frozenset()  # queue: free jobs whose delay may be running
    ready: bool = False  # the last round found it claimable-looking
    check_at: float | None = None  # monotonic time of the next timed read
    backoff_s: float = RECHECK_FIRST_S

    def on_watch(self, event: Any) -> None:
        """kazoo's watch function for every znode of this target (one bound method, so
        kazoo keeps one per znode however often it is armed again)."""
        self.subs._watched(self, event)


@dataclass(eq=False)
class _Round:
    """One asynchronous read of a target's znodes, arming those in ``watch``."""

    target: _Target
    rid: int
    epoch: int
    watch: frozenset[str]
    create: bool = False  # queue only: an ``exists`` watch on ``open``, which is missing
    pending: int = 0
    results: list[Any] = field(default_factory=list)


class Subscriptions:
    """The watch-driven subscriptions of one ZooKeeper backend. Thread-safe.

    Args:
        wire: the backend's round trips (its shared client is the one watched).
        job_paths: job id -> its znode paths.
    """

    def __init__(self, wire: Wire, job_paths: Callable[[str], JobPaths]) -> None:
        self.wire = wire
        self.job_paths = job_paths
        self.queues_base = wire.config.queues_base
        self.queue_target: QueueTarget = self._first_bucket
        """Which buckets of a queue to watch (the backend sets it to its queues')."""
        self.hints = NotifyingHints(self._delay_noted)
        """Delay ends, shared with the claims and queue listings that note them."""
        self.timer = WakeTimer("consensus-lease-zk-wake")
        self._lock = threading.Lock()
        self._targets: dict[Key, _Target] = {}
        self._ids = itertools.count()
        self._rids = itertools.count(1)
        self._epoch = 0  # bumped each time the shared client loses its connection
        self._in_flight = 0  # rounds sent and not answered yet
        self._client: KazooClient | None = None
        self._closed = False

    # -- subscribing -------------------------------------------------------------------

    def subscribe(self, key: Key, callback: WakeCallback) -> Unsubscribe:
        """Call ``callback`` when the job or queue ``key`` (``("job", id)`` or
        ``("queue", name)``) may have become claimable; see the module docstring.

        Raises:
            BackendUnavailable: the shared client could not connect (the backend falls
                back to polling); nothing was subscribed.
        """
        client = None
        if not self._closed:
            try:
                client = self._attach()
            except BackendUnavailable:
                if not self._closed:  # (closing closes this before the shared client)
                    raise
        token = next(self._ids)
        send: _Round | None = None
        with self._lock:
            closed = self._closed
            if not closed:
                target = self._targets.get(key)
                if target is None:
                    target = self._targets[key] = _Target(self, key, self._paths_of(key))
                target.callbacks[token] = callback
                if len(target.armed) < len(target.paths):
                    send = self._start_round(target)
                elif target.ready:  # the caller's claim found otherwise: look again soon
                    target.backoff_s = RECHECK_FIRST_S
                    self._schedule_check(target, RECHECK_FIRST_S)
        if closed:
            callback()  # the backend is closed: the caller finds out when it re-tries
            return _nothing
        if send is not None:
            self._send(client, send)
        return partial(self._unsubscribe, key, token)

    def _attach(self) -> KazooClient:
        """The shared client, with this object listening to its connection state."""
        client = self.wire.reader()
        with self._lock:
            known = self._client is client
            self._client = client
        if not known:
            client.add_listener(self._on_state)
        return client

    def _paths_of(self, key: Key) -> tuple[str, ...]:
        if key[0] == JOB:
            return (self.job_paths(key[1]).owner,)
        return self.queue_target(key[1])[0]

    def _first_bucket(self, queue: str) -> tuple[tuple[str, ...], bool]:
        bucket = QueuePaths.of(self.queues_base, queue).bucket(0)
        return (bucket.open, bucket.held, bucket.delayed), False

    def _unsubscribe(self, key: Key, token: int) -> None:
        with self._lock:
            target = self._targets.get(key)
            if target is None:
                return
            target.callbacks.pop(token, None)
            if not target.callbacks and not target.armed:
                del self._targets[key]

    def close(self) -> None:
        """Call every subscriber once and stop watching; later subscriptions are called
        back at once. Idempotent."""
        with self._lock:
            self._closed = True
            callbacks = [cb for t in self._targets.values() for cb in t.callbacks.values()]
            self._targets.clear()
        self.timer.close()
        _call_all(callbacks)

    # -- for tests and inspection ---------------------------------------------------------

    def watches(self) -> int:
        """How many znode watches are armed (or being armed) now."""
        with self._lock:
            return sum(len(t.armed) for t in self._targets.values())

    def in_flight(self) -> int:
        """How many rounds of reads were sent and are not answered yet."""
        with self._lock:
            return self._in_flight

    def subscribers(self) -> int:
        """How many subscriptions are in place."""
        with self._lock:
            return sum(len(t.callbacks) for t in self._targets.values())

    # -- rounds ------------------------------------------------------------------------

    def _start_round(self, target: _Target, create: bool = False) -> _Round:
        """A round reading ``target``'s znodes and arming those not armed. Lock held."""
        rid = next(self._rids)
        if target.key[0] == QUEUE and not create:
            paths = self._paths_of(target.key)
            if paths != target.paths:  # the buckets to watch moved on
                for old in set(target.paths).difference(paths):
                    target.armed.pop(old, None)  # if it fires, a spurious round
                target.paths = paths
        paths = target.paths[:1] if create else target.paths
        watch = frozenset(p for p in paths if create or p not in target.armed)
        for path in watch:
            target.armed[path] = rid
        self._in_flight += 1
        return _Round(target, rid, self._epoch, watch, create)

    def _send(self, client: KazooClient | None, r: _Round) -> None:
        """Send ``r``'s reads (never blocks); its answers go to :meth:`_answered`."""
        watch_fn = r.target.on_watch
        try:
            if client is None:
                raise BackendUnavailable("not attached to the shared client")
            if r.create or r.target.key[0] == JOB:
                path = r.target.paths[0]
                results = [client.exists_async(path, watch=watch_fn if path in r.watch
                                               else None)]
            else:
                results = [client.get_children_async(p, watch=watch_fn if p in r.watch
                                                     else None) for p in r.target.paths]
        except Exception as exc:  # a closed client, a bad state: waking is what is left
            self._done(r, exc)
            return
        r.pending, r.results = len(results), results
        for result in results:
            result.rawlink(partial(self._one_answered, r))

    def _one_answered(self, r: _Round, _result: Any) -> None:
        with self._lock:
            r.pending -= 1
            last = r.pending == 0
        if last:
            self._done(r)

    def _done(self, r: _Round, error: BaseException | None = None) -> None:
        """``r`` is answered (or could not be sent: ``error``)."""
        try:
            if error is not None:
                self._failed(r, error)
            else:
                self._answered(r)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _answered(self, r: _Round) -> None:
        """All of ``r``'s answers are in (kazoo's completion thread: never block)."""
        answers: list[Any] = []
        for result in r.results:
            try:
                answers.append(answer_or_none(result, block=False))
            except Exception as exc:
                self._failed(r, exc)
                return
        client, wake, again = self._client, [], None
        with self._lock:
            target = r.target
            if r.epoch != self._epoch or self._targets.get(target.key) is not target:
                return  # dropped by a lost connection (re-armed when back) or closed
            if target.key[0] == JOB:
                maybe = self._job_answer(target, answers[0])
            else:
                maybe, again = self._queue_answer(r, answers)
            target.ready = maybe
            if maybe:
                wake = list(target.callbacks.values())
                self._schedule_check(target, target.backoff_s)
                target.backoff_s = min(2 * target.backoff_s, RECHECK_MAX_S)
            else:
                target.backoff_s = RECHECK_FIRST_S
                if target.key[0] == JOB and is_election_key(target.key[1]):
                    # An election's observers want every change: a new leader (the owner
                    # znode created) and a new value (its data set), not only its end.
                    wake = list(target.callbacks.values())
        _call_all(wake)
        if again is not None:
            self._send(client, again)

    def _job_answer(self, target: _Target, owner: Any) -> bool:
        """Whether the job may be claimable (or completed, or FAILED), from its owner
        znode's stat; schedules a check at the end of a delay known to run. Lock held."""
        if owner is not None:
            return False  # held: its deletion fires the watch
        left = self.hints.remaining(target.key[1]) or 0.0
        if left > ENDED_S:
            self._schedule_check(target, left)
            return False
        return True

    def _queue_answer(self, r: _Round, answers: list[Any]) -> tuple[bool, _Round | None]:
        """Whether a job of the queue may be claimable, from the listings of ``open``,
        ``held`` and ``delayed`` (or the ``exists`` of ``open``); and the round to send
        next, if any. Lock held."""
        target = r.target
        open_path = target.paths[0]
        if r.create:
            if answers[0] is None:
                return False, None  # armed on the missing ``open``: its creation fires it
            if target.armed.get(open_path) == r.rid:
                del target.armed[open_path]  # made meanwhile: list it after all
            return False, self._start_round(target)
        for path, answer in zip(target.paths, answers, strict=True):
            if answer is None and target.armed.get(path) == r.rid:
                del target.armed[path]  # get_children of a missing znode arms nothing
        if answers[0] is None:
            return False, self._start_round(target, create=True)
        running: dict[str, float] = {}  # job id -> its delay's end, in s (inf: not timed)
        maybe = False
        for i in range(0, len(answers), 3):
            open_names, held_names, delayed_names = answers[i : i + 3]
            delayed = set(delayed_names or ())
            for name in set(open_names or ()).difference(held_names or ()):
                parsed = parse_member(name)
                if parsed is None:
                    continue
                left = self.hints.remaining(parsed[1]) if name in delayed else 0.0
                if left is None or left > ENDED_S:
                    running[parsed[1]] = float("inf") if left is None else left
                maybe = maybe or left is None or left <= ENDED_S
        if not answers[0] and not maybe:
            # The oldest bucket watched has no open job: done (claims move past it and
            # the next round watches newer ones), unless the next enqueue writes to it.
            paths, frontier = self.queue_target(target.key[1])
            if paths != target.paths:
                return False, self._start_round(target)
            maybe = not frontier
        target.delayed = frozenset(running)
        soonest = min(running.values(), default=float("inf"))
        if soonest != float("inf"):
            self._schedule_check(target, soonest)
        return maybe, None

    def _failed(self, r: _Round, exc: BaseException) -> None:
        """A round could not be sent or answered: wake its subscribers and send it again
        after RETRY_ARM_S, unless a lost connection explains it (see :meth:`_on_state`)."""
        with self._lock:
            target = r.target
            if r.epoch != self._epoch or self._targets.get(target.key) is not target:
                return
            for path in r.watch:
                if target.armed.get(path) == r.rid:
                    del target.armed[path]
            wake = list(target.callbacks.values())
            if wake:
                self._schedule_check(target, RETRY_ARM_S)
        log.debug("a subscription round failed", extra={"key": target.key, "error": repr(exc)})
        _call_all(wake)

    # -- events --------------------------------------------------------------------------

    def _watched(self, target: _Target, event: Any) -> None:
        """A watch of ``target`` fired (kazoo's callback thread: never block). An
        ``open`` of a queue's bucket (an enqueue or requeue; also a completion) wakes
        its longest-waiting subscriber at once, once the round re-arming the watch is
        sent (see the module docstring, "Early wake")."""
        if event.type == EventType.NONE:
            return  # kazoo dropped it on a lost connection: _on_state wakes and re-arms
        early: list[WakeCallback] = []
        with self._lock:
            target.armed.pop(event.path, None)
            if self._targets.get(target.key) is not target:
                return
            if not target.callbacks:
                if not target.armed:
                    del self._targets[target.key]
                return
            if target.key[0] == QUEUE and event.path in target.paths[::3]:
                early.append(next(iter(target.callbacks.values())))
            send = self._start_round(target)
            client = self._client
        self._send(client, send)
        _call_all(early)

    def _on_state(self, state: str) -> None:
        """The shared client's connection state (kazoo's connection thread: never block).
        Lost: kazoo dropped every watch; wake everyone once. Back: re-arm everything, from
        the timer thread."""
        wake: list[WakeCallback] = []
        with self._lock:
            if self._closed:
                return
            epoch = self._epoch
            if state != KazooState.CONNECTED:
                self._epoch += 1
                for key, target in list(self._targets.items()):
                    target.armed.clear()
                    wake += target.callbacks.values()
                    if not target.callbacks:
                        del self._targets[key]
        if state == KazooState.CONNECTED:
            self.timer.at(time.monotonic(), partial(self._reconnected, epoch))
        _call_all(wake)

    def _reconnected(self, epoch: int) -> None:
        """Send a round for every target with subscribers (the timer thread)."""
        with self._lock:
            if epoch != self._epoch or self._closed:
                return  # lost again meanwhile: the next CONNECTED does it
            rounds = [self._start_round(t) for t in self._targets.values() if t.callbacks]
            client = self._client
        for r in rounds:
            self._send(client, r)

    # -- timed checks: retry delays, re-checks, retries ---------------------------------------

    def _delay_noted(self, job_id: str, remaining_s: float) -> None:
        """A delay end was noted: check the targets waiting on that job when it ends."""
        if remaining_s <= ENDED_S:
            return
        with self._lock:
            job = self._targets.get((JOB, job_id))
            if job is not None and job.callbacks:
                self._schedule_check(job, remaining_s)
            for target in self._targets.values():
                if target.key[0] == QUEUE and job_id in target.delayed and target.callbacks:
                    self._schedule_check(target, remaining_s)

    def _schedule_check(self, target: _Target, delay_s: float) -> None:
        """Read ``target`` again in ``delay_s`` seconds, unless that is already due
        sooner. Lock held."""
        when = time.monotonic() + delay_s
        if target.check_at is None or when < target.check_at:
            target.check_at = when
            self.timer.at(when, partial(self._check, target, when))

    def _check(self, target: _Target, when: float) -> None:
        """A timed check of ``target`` (the timer thread): a round, which wakes the
        subscribers if it looks claimable and schedules what is due next."""
        with self._lock:
            if target.check_at != when:
                return  # superseded by a sooner check
            target.check_at = None
            if self._closed or self._targets.get(target.key) is not target:
                return
            if not target.callbacks:
                return
            send = self._start_round(target)
            client = self._client
        self._send(client, send)


def _nothing() -> None:
    return None


def _call_all(callbacks: Iterable[Callable[[], None]]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.exception("a subscription callback raised")
