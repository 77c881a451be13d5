"""Failing a held job, and putting a FAILED job back: one guarded transaction each.

``fail`` compares as release does (the owner key's create revision is the generation and
its value is the claim's)::

    if held at generation G:
        delete o, put h = release marker (this session, the claim's nonce, G)
        put e = {error, session, G, attempt, nonce}
        (delete v, for an election; delete QDIR/h/HEX, for a queued job)
        attempts used up (attempt - base >= max_attempts):
            put f = {G, attempt, error, nonce}, delete QDIR/p/HEX      -> FAILED
            (and put QDIR/k/failed; delete the index entry if the claim read its ordinal)
        else, retry_in_s > 0:
            put n = "" attached to a lease of its own                  -> AVAILABLE later
    else:
        get o, get c, get e

Whether the attempts are used up is decided from the claim's handle (its attempt, and
the limit it compared), or, for a claim this process did not make, from one read of the
job's attempts, limit and queue keys first.

The retry delay is a key on its **own etcd lease**, granted (``LeaseGrant``, one round
trip before the transaction) with a TTL of ``ceil(retry_in_s)`` whole seconds, at least
1: etcd's leases count whole seconds, and etcd raises a TTL below its minimum (1.5 x the
election timeout: 2 s with default settings) to that minimum. The leader deletes the key
when the lease runs out (its expiry sweep runs every 500 ms); a new leader extends every
lease by its TTL. So the job is claimable ``max(ceil(retry_in_s), minimum TTL)`` seconds
after the fail, up to about half a second later, longer across a leader change; never
earlier. ``retry_in_s == 0`` writes no key. Claims compare the key absent; waiting
claims watch it go. If the transaction does not apply, the lease is revoked (best
effort; otherwise it expires holding nothing); a lost ``LeaseGrant`` answer leaves an
orphan lease that expires the same way.

``requeue`` reads the job's keys, then::

    if mod_revision(f) == seen and QDIR/k/seq == S (read first):
        delete f, put l = {max_attempts, base = attempts so far, nonce}
        put QDIR/p/HEX = S, QDIR/i/S/HEX = ""   (pending again, at the back)
        put QDIR/k/seq = S + 1, put QDIR/k/requeued

``fail_many``: each failure above as one nested transaction of a single transaction per
chunk (:mod:`._jobs_batch`); the FAILED verdicts of one queue put the failed counter's
shard of their position (``QDIR/k/failed/NNN``: etcd refuses one key put twice in a
transaction), which ``queue_stats`` sums. The retry delays take one lease per distinct
TTL (``ceil(retry_in_s)``), granted before the first transaction and shared by the
not-before keys of the items of that TTL: a lease's TTL runs from its grant, before any
transaction, so each job is claimable no earlier than its ``retry_in_s`` after the
call, as for a lone ``fail``; a TTL per item would cost a grant per item, and one lease
for the whole call would delay the shorter retries to the longest. A lease no applied
item uses (all of them refused, or their chunk not applied) is revoked, best effort;
one an item may use (applied, or ``OutcomeUnknown``, or ``StoreRegressed``) is left to
expire. The claims without their queue, attempts and limit have them read first, in
read-only transactions of up to 31 items.

Lost answers: a fail is recognised by its nonce in the error key ``e``, a requeue by its
nonce in the limit key ``l``; either found means it landed. Otherwise, if the compare
still holds, the same request is sent again (its compare cannot pass twice).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Sequence
from typing import Any

from pyetcd import etcdrpc

from ...backend import FailItem
from ...errors import (
    BackendUnavailable,
    InvalidArgument,
    LeaseError,
    OutcomeUnknown,
    StoreRegressed,
)
from ...record import ClaimResult, JobState, LeaseRecord
from . import _transport_requests as rq
from ._jobs import Ops, Settled, refusal
from ._jobs_batch import MAX_END_BATCH, end_many, read_first
from ._layout import (
    ATTEMPTS,
    FAILED,
    LIMIT,
    QUEUE,
    DeadLetter,
    History,
    JobKeys,
    LastError,
    Limit,
    attempts_of,
    limit_of,
    ordinal_bytes,
    queue_of,
)
from ._layout_records import job_record, read_kinds
from ._queues_index import read_counters
from ._sessions import EtcdClaim, EtcdSession

__all__ = ["MAX_REQUEUE_ROUNDS", "Failing", "delay_ttl_s", "fail", "fail_many", "failing",
           "requeue"]

MAX_REQUEUE_ROUNDS = 8
"""Most read-and-compare rounds of one requeue while the job keeps changing."""


def delay_ttl_s(retry_in_s: float) -> int:
    """The TTL (whole seconds) requested for a retry delay's lease: ``retry_in_s``
    rounded up, at least 1 (etcd may grant more: its minimum TTL)."""
    return max(1, math.ceil(retry_in_s))


def fail(ops: Ops, handle: EtcdSession, job_id: str, claim: ClaimResult, error: str,
         retry_in_s: float) -> LeaseRecord:
    """See :meth:`EtcdBackend.fail <consensus_lease.backends.etcd.EtcdBackend.fail>`."""
    item = failing(ops, handle, job_id, claim, error, retry_in_s)
    if item.unread:
        item.use_facts(ops.read_keys(item.fact_keys(), f"reading the attempts of {job_id!r}",
                                     time.monotonic() + ops.config.timeout_s, job_id))
    if item.delayed:
        item.lease_id, item.ttl_s = ops.grant(delay_ttl_s(retry_in_s),
                                              f"{item.what}: the retry delay's lease")
    try:
        record = item.send()
    except OutcomeUnknown:
        raise  # it may have landed, with the key on the lease
    except BaseException:
        if item.lease_id:
            ops.revoke(item.lease_id)
        raise
    if item.queue is not None and not item.exhausted:
        ops.queues.forget_cursor(item.queue)  # it keeps its place at the front
    return record


def fail_many(ops: Ops, handle: EtcdSession,
              items: Sequence[FailItem]) -> list[LeaseRecord | LeaseError]:
    """See :meth:`EtcdBackend.fail_many
    <consensus_lease.backends.etcd.EtcdBackend.fail_many>`: the facts of the claims
    without them read first (read-only transactions), one retry delay lease granted
    per distinct TTL (module docstring), then one transaction per chunk of nested fail
    transactions (:mod:`._jobs_batch`); each item's outcome in its place. A delay
    lease no applied item uses is revoked."""
    outcomes: list[Any] = [None] * len(items)
    batch: list[tuple[int, Failing]] = []
    for index, (job_id, claim, error, retry_in_s) in enumerate(items):
        try:
            batch.append((index, failing(ops, handle, job_id, claim, error, retry_in_s)))
        except LeaseError as exc:
            outcomes[index] = exc
    unread = [entry for entry in batch if entry[1].unread]
    if unread:
        ready = [entry for entry in batch if not entry[1].unread] + read_first(
            ops, unread, Failing.fact_keys, Failing.use_facts, outcomes,
            f"reading the attempts of {len(unread)} jobs")
        batch = sorted(ready, key=lambda entry: entry[0])
    batch = _delays(ops, batch, outcomes)
    end_many(ops, batch, outcomes, "failure", MAX_END_BATCH)
    kept = {item.lease_id for index, item in batch
            if isinstance(outcomes[index], LeaseRecord | OutcomeUnknown | StoreRegressed)}
    for lease_id in {item.lease_id for _, item in batch if item.lease_id} - kept:
        ops.revoke(lease_id)  # no item landed with its key on it
    for queue in {i.queue for _, i in batch if i.queue is not None and not i.exhausted}:
        ops.queues.forget_cursor(queue)
    return outcomes


def _delays(ops: Ops, batch: list[tuple[int, Failing]],
            outcomes: list[Any]) -> list[tuple[int, Failing]]:
    """Grant the retry delay leases of the items of ``batch``: one per distinct TTL
    (``LeaseGrant``: a round trip each), shared by the items of that TTL. Returns the
    items ready to be sent; an item whose lease could not be granted has that error
    as its outcome (nothing was written)."""
    granted: dict[int, tuple[int, int] | LeaseError] = {}
    ready: list[tuple[int, Failing]] = []
    for index, item in batch:
        if item.delayed:
            ttl = delay_ttl_s(item.retry_in_s)
            if ttl not in granted:
                try:
                    granted[ttl] = ops.grant(ttl, f"failure of {len(batch)} jobs: a retry "
                                                  f"delay's lease of {ttl} s")
                except LeaseError as exc:
                    granted[ttl] = exc
            lease = granted[ttl]
            if isinstance(lease, LeaseError):
                outcomes[index] = lease
                continue
            item.lease_id, item.ttl_s = lease
        ready.append((index, item))
    return ready


def failing(ops: Ops, handle: EtcdSession, job_id: str, claim: ClaimResult, error: str,
            retry_in_s: float) -> Failing:
    """The failure of ``job_id`` by ``claim``, not sent yet (:attr:`Failing.unread`:
    its facts are to be read first).

    Raises:
        InvalidArgument: ``claim.handle`` is not an :class:`EtcdClaim`.
    """
    known = EtcdClaim.of(claim, handle, job_id)
    return Failing(ops, handle, ops.layout.job(job_id), claim.generation, known, error,
                   float(retry_in_s))


class Failing:
    """One failure being decided (see the module docstring): :meth:`send` sends it
    alone (:func:`fail`), :mod:`._jobs_batch` many as the nested transactions of one
    (:func:`fail_many`). Its outcome is the record after it, or raised. ``queue``,
    ``attempt`` and ``limit`` are the claim's, from its handle or read first
    (:meth:`use_facts`); ``lease_id`` / ``ttl_s``: the retry delay's lease, granted
    before it is sent (0: none)."""

    def __init__(self, ops: Ops, handle: EtcdSession, keys: JobKeys, generation: int,
                 known: EtcdClaim | None, error: str, retry_in_s: float) -> None:
        self.ops, self.handle, self.keys, self.known = ops, handle, keys, known
        self.generation, self.error, self.retry_in_s = generation, error, retry_in_s
        self.nonce = secrets.token_hex(8)
        self.what = f"failure of {keys.job_id!r} generation {generation}"
        self.unread = known is None or not known.queue_known
        self.queue = None if known is None else known.queue
        self.attempt = 0 if known is None else known.attempt
        self.limit = None if known is None else known.limit
        self.lease_id, self.ttl_s = 0, 0

    def fact_keys(self) -> tuple[bytes, ...]:
        """The keys :meth:`use_facts` reads: the job's queue, attempts, limit, owner."""
        keys = self.keys
        return (keys.queue, keys.attempts, keys.limit, keys.owner)

    def use_facts(self, kvs: list[Any]) -> None:
        """Take the queue (and, for a claim without its handle, the attempt and limit,
        after the epoch check of :meth:`Ops.check_epoch`) from :meth:`fact_keys` read.

        Raises:
            StaleLeaseError: another epoch's token; nothing was written.
        """
        marker_kv, attempts_kv, limit_kv, owner_kv = kvs
        if self.known is None:
            self.ops.check_epoch(self.keys, self.generation, owner_kv, self.what)
            self.attempt, self.limit = attempts_of(attempts_kv), limit_of(limit_kv)
        self.queue, self.unread = queue_of(marker_kv), False

    @property
    def exhausted(self) -> bool:
        """Whether this attempt uses up the job's ``max_attempts``: it becomes FAILED."""
        return self.limit is not None and self.limit.exhausted(self.attempt)

    @property
    def delayed(self) -> bool:
        """Whether it puts a retry delay (a not-before key on a lease of its own)."""
        return not self.exhausted and self.retry_in_s > 0

    @property
    def back(self) -> tuple[bytes, ...]:
        """The keys read back after a lost answer (and by the ``else`` branch)."""
        return (self.keys.owner, self.keys.completion, self.keys.error)

    def fill(self, request: Any, position: int = 0) -> None:
        """Write the fail transaction into the empty ``request`` (module docstring); a
        FAILED verdict of a queued job bumps the failed counter's shard of
        ``position`` (:meth:`~._layout.QueueKeys.shard`)."""
        ops, keys, handle, generation = self.ops, self.keys, self.handle, self.generation
        ops.add_holds(request.compare, handle, keys, generation, self.known)
        nonce = "" if self.known is None else self.known.claim_nonce
        marker = History(None, handle.session_id, nonce, generation, released=True)
        last = LastError(self.error, handle.session_id, generation, self.attempt, self.nonce)
        success = [rq.delete(keys.owner), rq.put(keys.history, marker.encode()),
                   rq.put(keys.error, last.encode()), *ops.ending(keys)]
        qkeys = None if self.queue is None else ops.layout.queue(self.queue)
        if qkeys is not None:
            success.append(rq.delete(qkeys.held(keys.job_id)))
        if self.exhausted:
            success.append(rq.put(keys.failed, DeadLetter(generation, self.attempt,
                                                          self.error, self.nonce).encode()))
            if qkeys is not None:
                success += [rq.delete(qkeys.pending(keys.job_id)),
                            rq.put(qkeys.shard("failed", position), b"")]
                if self.known is not None and self.known.ordinal is not None:
                    success.append(rq.delete(qkeys.entry(self.known.ordinal, keys.job_id)))
        elif self.lease_id:
            success.append(rq.put(keys.not_before, b"", self.lease_id))
        request.success.extend(success)
        request.failure.extend(rq.get(key) for key in self.back)

    def landed(self, error_kv: Any) -> bool:
        """Whether the error key read is this failure's (its nonce)."""
        return (error_kv is not None
                and LastError.decode(error_kv.value, error_kv.key).nonce == self.nonce)

    def held(self, owner_kv: Any) -> bool:
        """Whether the owner key read back is still this claim's (not applied yet)."""
        return self.ops.held_by(self.handle, owner_kv, self.generation, self.known)

    def from_keys(self, kvs: list[Any]) -> LeaseRecord:
        """After a lost answer, the batch not pending: the record if it landed.

        Raises:
            StaleLeaseError / SessionExpired: it did not, and cannot land.
        """
        owner_kv, completion_kv, error_kv = kvs
        if self.landed(error_kv):
            return self.record()
        raise refusal(self.ops, self.handle, self.keys, self.generation, owner_kv,
                      completion_kv, self.what)

    def answered(self, answer: Any, resent: bool) -> LeaseRecord:
        """The record from the (nested) answer, or (refused) from the first copy of a
        transaction ``resent`` after a lost answer; else raise the refusal."""
        if answer.succeeded:
            return self.record()
        kvs = [rq.kv_of(r) for r in answer.responses]
        if resent and self.landed(kvs[2]):
            return self.record()
        raise refusal(self.ops, self.handle, self.keys, self.generation, kvs[0], kvs[1],
                      self.what)

    def send(self) -> LeaseRecord:
        """Send the failure alone, a lost answer settled by its nonce read back."""
        request = etcdrpc.TxnRequest()
        self.fill(request)
        resent = False

        def decide(kvs: list[Any]) -> Settled | None:
            nonlocal resent
            if not self.landed(kvs[2]) and self.held(kvs[0]):
                resent = True
                return None  # not applied: send again
            return Settled(self.from_keys(kvs))

        answer = self.ops.send_guarded(request, self.what, job_id=self.keys.job_id,
                                       generation=self.generation, read_back=self.back,
                                       decide=decide)
        if isinstance(answer, Settled):
            return self.record()
        return self.answered(answer, resent)

    def record(self) -> LeaseRecord:
        """The record after the failure: FAILED, or AVAILABLE (``not_before``: local
        wall clock + the granted TTL, display only)."""
        state = JobState.FAILED if self.exhausted else JobState.AVAILABLE
        not_before = time.time() + self.ttl_s if self.lease_id else None
        limit = self.limit
        return LeaseRecord(self.keys.job_id, None, None, self.generation, state, None,
                           self.attempt, self.error, not_before,
                           None if limit is None else limit.max_attempts)


def requeue(ops: Ops, job_id: str) -> LeaseRecord:
    """See :meth:`EtcdBackend.requeue <consensus_lease.backends.etcd.EtcdBackend.requeue>`."""
    keys = ops.layout.job(job_id)
    nonce = secrets.token_hex(8)
    what = f"requeue of {job_id!r}"
    for _ in range(MAX_REQUEUE_ROUNDS):
        kinds = read_kinds(ops, job_id, what)
        if FAILED not in kinds:
            record = job_record(ops, job_id, kinds, {})
            state = "unknown" if record is None else record.state.value
            raise InvalidArgument(
                f"only a FAILED job can be requeued; {job_id!r} is {state}", job_id=job_id
            )
        limit = limit_of(kinds.get(LIMIT))
        if limit is None:
            raise BackendUnavailable(f"{what}: corrupt job: FAILED without a limit key",
                                     job_id=job_id)
        fresh = Limit(limit.max_attempts, attempts_of(kinds.get(ATTEMPTS)), nonce)
        if _send_requeue(ops, keys, kinds, fresh, what):
            del kinds[FAILED]
            record = job_record(ops, job_id, kinds, {})
            assert record is not None
            return record
    raise BackendUnavailable(f"{what}: the job kept changing; try again", job_id=job_id)


def _send_requeue(ops: Ops, keys: JobKeys, kinds: dict[bytes, Any], fresh: Limit,
                  what: str) -> bool:
    """The requeue transaction for the FAILED record in ``kinds``; whether it applied
    (``False``: the job changed since it was read)."""
    seen = int(kinds[FAILED].mod_revision)
    compare = [rq.mod_is(keys.failed, seen)]
    success = [rq.delete(keys.failed), rq.put(keys.limit, fresh.encode())]
    queue = queue_of(kinds.get(QUEUE))
    if queue is not None:  # the job takes the queue's next ordinal: to the back
        qkeys = ops.layout.queue(queue)
        counters = read_counters(ops, qkeys, what)
        compare.append(counters.same_seq(qkeys))
        success += [rq.put(qkeys.pending(keys.job_id), ordinal_bytes(counters.seq)),
                    rq.put(qkeys.entry(counters.seq, keys.job_id), b""),
                    *counters.taking(qkeys, 1), rq.put(qkeys.counter("requeued"), b"")]
        ops.queues.set_counters(queue, None)
    request = rq.txn(compare=compare, success=success)

    def decide(kvs: list[Any]) -> Settled | None:
        dead_kv, limit_kv = kvs
        if limit_kv is not None and limit_of(limit_kv) == fresh:
            return Settled(True)  # ours landed
        if dead_kv is not None and int(dead_kv.mod_revision) == seen:
            return None  # not applied: send again
        return Settled(False)

    answer = ops.send_guarded(request, what, job_id=keys.job_id, generation=None,
                              read_back=(keys.failed, keys.limit), decide=decide)
    if isinstance(answer, Settled):
        return bool(answer.value)
    return bool(answer.succeeded)
