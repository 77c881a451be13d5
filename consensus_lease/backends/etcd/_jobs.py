"""What every job operation shares: linearizable reads of a job's keys, the ownership
compare, the "not held" diagnosis, and the guarded write with read-back.

The write protocol (:meth:`Ops.send_guarded`): send once; if the answer is lost
(timeout, member died mid-request), read the job's keys back and let the operation
decide from them: done (the write landed), not held (it cannot land), or not applied
yet, in which case the *same* request is sent again. Re-sending is safe because each
write is guarded by a compare that its own success makes false (the owner key absent;
the owner key at our create revision and value), and recognisable afterwards (claim
nonce, completion record, release marker), so a first copy that lands late fails its
compare instead of applying twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from pyetcd import etcdrpc

from ...errors import (
    BackendUnavailable,
    LeaseError,
    OutcomeUnknown,
    SessionExpired,
    StaleLeaseError,
)
from . import _transport_requests as rq
from ._config import EtcdConfig
from ._layout import Completion, History, JobKeys, Layout, Owner
from ._queues_state import QueueCache
from ._sessions import EtcdClaim, EtcdSession
from ._tokens import EpochCache, compose, split
from ._transport import Failure, Transport
from ._transport_txn_limit import TxnLimit

__all__ = ["Ops", "ReadBack", "Settled", "refusal"]

log = logging.getLogger("consensus_lease.etcd")


class Settled:
    """A final answer reached by reading back, as opposed to a transaction response."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


ReadBack = Callable[[float], list[Any]]
"""``read_back(deadline)``: a custom read-back for :meth:`Ops.send_guarded` (gives up at
``deadline``, monotonic); what it returns is handed to ``decide``."""


class Ops:
    """The driver's shared context: config, transport, key layout, the cached store
    epoch (:class:`~._tokens.EpochCache`), what is known of the server's
    ``--max-txn-ops`` (:mod:`._transport_txn_limit`) and of the work queues
    (:class:`~._queues_state.QueueCache`), and the last claim and release transactions
    built (:class:`~._transport_requests.Kept`)."""

    def __init__(self, config: EtcdConfig, transport: Transport, layout: Layout) -> None:
        self.config = config
        self.transport = transport
        self.layout = layout
        self.epochs = EpochCache(layout.epoch)
        self.txn_limit = TxnLimit()
        self.queues = QueueCache()
        self.kept_claim = rq.Kept()
        self.kept_release = rq.Kept()

    # -- reading --------------------------------------------------------------------------

    def read(self, request: Any, what: str, budget_s: float | None = None,
             job_id: str | None = None) -> Any:
        """An idempotent KV request (Txn of reads, or Range), retried over the members."""
        method = "Txn" if isinstance(request, etcdrpc.TxnRequest) else "Range"
        return self.transport.call("kv", method, request, what=what, budget_s=budget_s,
                                   job_id=job_id)

    def read_ops(self, reads: Sequence[Any], what: str, deadline: float,
                 job_id: str | None) -> list[Any]:
        """The answers of the read operations ``reads`` (``get``, ``span``, ``count``), in
        one linearizable transaction (a snapshot at one revision). Gives up at
        ``deadline`` (monotonic)."""
        answer = self.read(rq.txn(success=list(reads)), what,
                           budget_s=max(0.05, deadline - time.monotonic()), job_id=job_id)
        return list(answer.responses)

    def read_keys(self, keys: Sequence[bytes], what: str, deadline: float,
                  job_id: str | None) -> list[Any]:
        """``keys`` read in one linearizable transaction (a snapshot at one revision);
        ``None`` for each absent key. Gives up at ``deadline`` (monotonic)."""
        responses = self.read_ops([rq.get(k) for k in keys], what, deadline, job_id)
        return [rq.kv_of(r) for r in responses]

    def lease_ttl(self, lease_id: int) -> int | None:
        """The lease's remaining TTL in seconds (<= 0: gone), or ``None`` if etcd did not
        answer within ``timeout_s``."""
        try:
            answer = self.transport.call(
                "lease", "LeaseTimeToLive", etcdrpc.LeaseTimeToLiveRequest(ID=lease_id),
                what="lease lookup", budget_s=self.config.timeout_s,
            )
        except LeaseError:
            return None
        return int(answer.TTL)

    def grant(self, ttl_s: int, what: str) -> tuple[int, int]:
        """A new etcd lease of ``ttl_s`` whole seconds: ``(lease id, granted TTL)``
        (etcd raises a TTL below its minimum). A lost answer is retried on another
        member; the orphan lease holds no key and expires after its TTL.

        Raises:
            BackendUnavailable / AuthenticationFailed: no lease was granted.
        """
        answer = self.transport.call(
            "lease", "LeaseGrant", etcdrpc.LeaseGrantRequest(TTL=ttl_s), what=what,
            budget_s=self.config.timeout_s,
        )
        if answer.error:
            raise BackendUnavailable(f"etcd refused {what}: {answer.error}")
        return int(answer.ID), int(answer.TTL)

    def revoke(self, lease_id: int) -> None:
        """Revoke a lease, best effort: a failure is logged and the lease left to expire."""
        try:
            self.transport.call(
                "lease", "LeaseRevoke", etcdrpc.LeaseRevokeRequest(ID=lease_id),
                what=f"revoking lease {lease_id:x}", budget_s=self.config.timeout_s,
            )
        except LeaseError as exc:
            log.info("etcd: could not revoke lease %x (it expires by its TTL): %s",
                     lease_id, exc)

    # -- ownership ------------------------------------------------------------------------

    def holds(self, handle: EtcdSession, keys: JobKeys, generation: int,
              known: EtcdClaim | None) -> list[Any]:
        """Compares that pass iff ``handle`` holds the job at ``generation``: the owner
        key's create revision is the generation's (below the epoch bits), and its value
        is exactly the one the claim ``known`` wrote, epoch included (without it, for a
        claim this process did not make: its lease is ours; the epoch is checked by
        :meth:`check_epoch` on a read of the owner key)."""
        same = (
            rq.value_is(keys.owner, known.owner_value) if known is not None
            else rq.lease_is(keys.owner, handle.lease_id)
        )
        return [rq.create_is(keys.owner, split(generation)[1]), same]

    @staticmethod
    def add_holds(compare: Any, handle: EtcdSession, keys: JobKeys, generation: int,
                  known: EtcdClaim | None) -> None:
        """Append :meth:`holds` to the repeated ``compare`` field of a transaction being
        built."""
        owner = keys.owner
        rq.add_create_is(compare, owner, split(generation)[1])
        if known is not None:
            rq.add_value_is(compare, owner, known.owner_value)
        else:
            compare.append(rq.lease_is(owner, handle.lease_id))

    def held_by(self, handle: EtcdSession, owner_kv: Any, generation: int,
                known: EtcdClaim | None) -> bool:
        """The read-back twin of :meth:`holds` (with the epoch checked in both cases)."""
        epoch, local = split(generation)
        if owner_kv is None or owner_kv.create_revision != local:
            return False
        if known is not None:
            return bool(owner_kv.value == known.owner_value)
        return bool(owner_kv.lease == handle.lease_id
                    and Owner.decode(owner_kv.value, owner_kv.key).epoch == epoch)

    @staticmethod
    def ending(keys: JobKeys) -> list[Any]:
        """What a transaction ending a hold (release, complete, fail) does besides: for
        an election, delete its value key (``set_value``); nothing for a job (a value
        set on one is never shown once stale, and goes with its session's lease)."""
        return [rq.delete(keys.value)] if keys.is_election else []

    def token_of(self, owner_kv: Any) -> int:
        """The token of the claim that wrote the owner key ``owner_kv``."""
        owner = Owner.decode(owner_kv.value, owner_kv.key)
        return compose(owner.epoch, int(owner_kv.create_revision))

    def check_epoch(self, keys: JobKeys, generation: int, owner_kv: Any, what: str) -> None:
        """For a claim without its handle: raise if the owner key ``owner_kv`` (read
        before the write) has the generation's create revision but was written in
        another epoch (the token is not this claim's). Anything else is left to the
        write's compare.

        Raises:
            StaleLeaseError: the epochs differ; nothing was written.
        """
        if owner_kv is None or owner_kv.create_revision != split(generation)[1]:
            return
        current = self.token_of(owner_kv)
        if current != generation:
            raise StaleLeaseError(
                f"{what}: {keys.job_id!r} is held at generation {current}, not {generation} "
                f"(same revision, another store epoch)",
                job_id=keys.job_id, generation=generation, current_generation=current,
            )

    # -- writing --------------------------------------------------------------------------

    def send_guarded(
        self,
        request: Any,
        what: str,
        *,
        job_id: str | None,
        generation: int | None,
        read_back: Sequence[bytes] | ReadBack,
        decide: Callable[[list[Any]], Settled | None],
    ) -> Any:
        """Send the transaction ``request``; return its response, or the :class:`Settled`
        answer ``decide`` reached after a lost answer from the keys ``read_back`` (their
        key-values) or what the :data:`ReadBack` ``read_back`` read (``decide`` returns
        ``None`` for "not applied yet: send again", or raises).

        Raises:
            OutcomeUnknown: reading back failed, or still not applied when
                ``connect_timeout_s`` ran out.
            StoreRegressed: the answer (or the read-back) came from an older history.
            Translated definite refusals (SessionExpired, InvalidArgument, ...).
        """
        deadline = time.monotonic() + self.config.connect_timeout_s
        while True:
            try:
                return self.transport.send(
                    "kv", "Txn", request, what=what, job_id=job_id, generation=generation
                )
            except Failure as failure:
                log.warning("etcd: %s: no answer (%s); reading back", what, failure)
                try:
                    if callable(read_back):
                        kvs = read_back(deadline)
                    else:
                        kvs = self.read_keys(read_back, f"reading back {what}", deadline, job_id)
                except BackendUnavailable as exc:
                    raise OutcomeUnknown(
                        f"{what}: sent but not answered ({failure}), and reading back "
                        f"failed: {exc}",
                        job_id=job_id, generation=generation,
                    ) from exc
                settled = decide(kvs)
                if settled is not None:
                    return settled
                if time.monotonic() >= deadline:
                    raise OutcomeUnknown(
                        f"{what}: not applied when read back, and no time left to re-send",
                        job_id=job_id, generation=generation,
                    ) from failure.__cause__


def refusal(ops: Ops, handle: EtcdSession, keys: JobKeys, generation: int,
            owner_kv: Any, completion_kv: Any, what: str) -> LeaseError:
    """The driver's refusal rule (the template's ``refusal()``, one name in every driver):
    the error for a failed ownership compare: ``SessionExpired`` if the owner key is
    gone, etcd says our lease is gone too, and nobody claimed or completed the job
    since ``generation`` (the rule of :meth:`Backend.complete`); else
    ``StaleLeaseError`` with the generation the store has now."""
    if owner_kv is None:
        ttl = ops.lease_ttl(handle.lease_id)
        if ttl is not None and ttl <= 0:
            since = _generation_since(ops, keys, generation, completion_kv, what)
            if since is None:
                return SessionExpired(
                    f"{what}: session {handle.session_id} (etcd lease) has expired",
                    job_id=keys.job_id, generation=generation,
                )
            return StaleLeaseError(
                f"{what}: {keys.job_id!r} was claimed or completed again since "
                f"generation {generation} (store has generation {since}; session "
                f"{handle.session_id} has expired too)",
                job_id=keys.job_id, generation=generation, current_generation=since,
            )
    current = None
    if owner_kv is not None:
        current = ops.token_of(owner_kv)
    elif completion_kv is not None:
        current = Completion.decode(completion_kv.value, completion_kv.key).generation
    return StaleLeaseError(
        f"{what}: session {handle.session_id} does not hold {keys.job_id!r} at generation "
        f"{generation} (store has generation {current})",
        job_id=keys.job_id, generation=generation, current_generation=current,
    )

def _generation_since(ops: Ops, keys: JobKeys, generation: int, completion_kv: Any,
                      what: str) -> int | None:
    """With the job not held (owner key gone): the generation of a completion, or of
    a claim made after ``generation`` (the history key: every claim writes it, a
    release or fail rewrites it with its generation, a completion deletes it), or
    ``None`` if there is neither (or the history key cannot be read: the session's
    end is then the answer known)."""
    if completion_kv is not None:
        return Completion.decode(completion_kv.value, completion_kv.key).generation
    try:
        history_kv = ops.read_keys([keys.history], f"{what} (reading the history)",
                                    time.monotonic() + ops.config.timeout_s,
                                    keys.job_id)[0]
    except BackendUnavailable:
        return None
    if history_kv is None:
        return None
    past = History.decode(history_kv.value, history_kv.key)
    last = past.generation or compose(past.epoch, int(history_kv.mod_revision))
    return None if last == generation else last
