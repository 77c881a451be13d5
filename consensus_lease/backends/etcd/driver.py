"""The etcd driver: sessions are etcd leases, claims are compare-and-put transactions.

This module is the glue: each ``Backend`` method delegates to the template's modules
(:mod:`consensus_lease.backends`): the job operations in :mod:`._jobs` and its parts
(:mod:`._jobs_claim`, :mod:`._jobs_attempts` for jobs with an attempt limit,
:mod:`._jobs_claim_many`, :mod:`._jobs_complete_many`, :mod:`._jobs_hold`,
:mod:`._jobs_fail`, :mod:`._jobs_value`; :mod:`._jobs_batch` for the batches of
``complete_many``, ``release_many`` and ``fail_many``), the records in :mod:`._layout_records`, the
work queues in :mod:`._queues` and :mod:`._watches_queue` (batch claims from a queue in
:mod:`._queues_claim`, the fused completion and claim in :mod:`._queues_fused`). The
store epoch is in :mod:`._tokens` and :mod:`._tokens_epoch`, the detection of a history
that went back and the refusal after it in :mod:`._tokens_history`. See the package
docstring for the design, the URL options and the etcd guarantees relied on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar, cast

from pyetcd import etcdrpc

from ..._election import is_election_key
from ..._subscriptions import Unsubscribe, WakeCallback
from ..._visible import log_visible
from ...backend import (
    Backend,
    Capabilities,
    CompleteItem,
    FailItem,
    QueuePick,
    ReleaseItem,
    SessionHandle,
    StateListener,
)
from ...errors import (
    BackendUnavailable,
    InvalidArgument,
    LeaseError,
    SessionExpired,
    StoreRegressed,
)
from ...observe import notify
from ...record import ClaimResult, EnqueueItem, LeaseRecord, QueuedJob, QueueStats
from . import (
    _jobs_batch,
    _jobs_claim,
    _jobs_claim_many,
    _jobs_complete_many,
    _jobs_fail,
    _jobs_hold,
    _jobs_value,
    _layout_records,
    _queues,
    _queues_claim,
    _queues_fused,
    _queues_index,
    _queues_upgrade,
    _tokens,
    _tokens_epoch,
    _watches_queue,
)
from . import _transport_requests as rq
from ._config import EtcdConfig, parse_url
from ._jobs import Ops
from ._layout import Layout, session_text
from ._sessions import EtcdClaim, EtcdSession
from ._sessions_revocation import SessionWatch
from ._tokens_history import Mark, Refusal
from ._transport import Failure, Transport, translate
from ._transport_keepalive import KeepAliveCall, KeepAliveStreams
from ._watches import wait_for_event
from ._watches_subscribe import Subscriptions

__all__ = ["EtcdBackend", "EtcdClaim", "EtcdSession"]

log = logging.getLogger("consensus_lease.etcd")

T = TypeVar("T")
Out = TypeVar("Out")
Item = TypeVar("Item")

MAX_LEASE_TTL_S = 9_000_000_000.0
"""etcd's largest lease TTL (``MaxLeaseTTL``), in seconds."""


class EtcdBackend(Backend):
    """Job leases on etcd v3. Build it with ``open_store("etcd://...")``; see the package
    docstring for the options. Thread-safe."""

    scheme = "etcd"
    capabilities = Capabilities(
        cross_process=True,
        store_watch=True,
        consecutive_generations=False,
        min_ttl_s=1.0,  # requests round up to whole seconds; etcd may grant more
        max_ttl_s=MAX_LEASE_TTL_S,
        max_batch_claim=_jobs_claim_many.MAX_BATCH_CLAIM,
        queues=True,
        max_payload_bytes=_queues.MAX_PAYLOAD_BYTES,  # under --max-request-bytes (1.5 MiB)
        max_enqueue_batch=_queues.ENQUEUE_BATCH,  # one txn within --max-txn-ops (128)
        max_complete_batch=_jobs_complete_many.MAX_COMPLETE_BATCH,  # one txn, likewise
        max_queue_jobs=_queues.MAX_QUEUE_JOBS,  # a quarter of the default 2 GB quota
        description="etcd v3: a lease per session, one transaction per claim/complete/release",
        epoch=True,
        regression_refusal=True,
        elections=True,
        max_queue_claim_batch=_queues_claim.QUEUE_CLAIM_BATCH,  # one txn, within 128 ops
        fused_claim_next=True,  # one txn per job (a scan per 32 jobs): _queues_fused
        max_end_batch=_jobs_batch.MAX_END_BATCH,  # release_many / fail_many: one txn each
    )
    epoch_shift: ClassVar[int] = _tokens.EPOCH_SHIFT
    keepalive_batch: ClassVar[int] = 128
    """Sessions whose keepalives :meth:`keepalive_many` pipelines at once."""

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        self._transport = Transport(config)
        self._layout = Layout(config.prefix)
        self._ops = Ops(config, self._transport, self._layout)
        self._keepalives = KeepAliveStreams(self._transport)
        self._lock = threading.Lock()
        self._sessions: dict[int, EtcdSession] = {}
        self._refusal = Refusal(self._ops)
        self._transport.guard.subscribe(self._regressed)
        self._subscriptions_etcd = Subscriptions(self._ops)
        self._session_watch = SessionWatch(self._ops, self._subscriptions_etcd.hub,
                                           self._store_ended)

    def __repr__(self) -> str:
        return f"EtcdBackend({self.config.describe()!r})"

    @classmethod
    def from_url(cls, url: str, options: Mapping[str, object]) -> EtcdBackend:
        """Parse the URL and connect: authenticate if credentials are given, then one
        linearizable read of the prefix, the store epoch and the regression marker, each
        retried over the members for at most ``connect_timeout_s``.

        Raises:
            UnsupportedBackend / InvalidArgument: malformed URL, unknown or bad option,
                unreadable TLS file.
            AuthenticationFailed: credentials or certificates refused, or no read access.
            BackendUnavailable: no member answered (the message names every one tried).
        """
        backend = cls(parse_url(url, options))
        try:
            backend._transport.authenticate()
            layout = backend._layout
            answer = backend._ops.read(
                rq.txn(success=[
                    etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(
                        key=layout.root, range_end=layout.range_end, limit=1, keys_only=True)),
                    rq.get(layout.epoch),
                    rq.get(backend._refusal.key),
                ]),
                f"connecting to {backend.config.describe()}",
            )
            epoch_kv = rq.kv_of(answer.responses[1])
            backend._ops.epochs.update(epoch_kv)
            backend._refusal.adopt(epoch_kv, rq.kv_of(answer.responses[2]))
        except BaseException:
            backend.close()
            raise
        return backend

    @staticmethod
    def _typed(session: SessionHandle) -> EtcdSession:
        if not isinstance(session, EtcdSession):
            raise InvalidArgument(f"not an etcd session: {session!r}")
        return session

    def _handle(self, session: SessionHandle) -> EtcdSession:
        """The etcd session, if it may still be used.

        Raises:
            InvalidArgument: not an etcd session.
            StoreRegressed: the store's history went back while it was open, or this
                driver (or any process, see :mod:`._tokens_history`) found it went back and the
                epoch has not been raised since.
        """
        handle = self._typed(session)
        handle.check_history()
        self._refusal.check()
        return handle

    def _run(self, session: SessionHandle, op: Callable[[EtcdSession], T]) -> T:
        """Run a job operation of ``session``. A ``SessionExpired`` (its lease is gone)
        is checked against the store's history first (one linearizable read), so a lease
        lost in a restore reports ``StoreRegressed``; so does any refusal once the
        session is over by a regression noticed meanwhile."""
        handle = self._handle(session)
        try:
            return op(handle)
        except StoreRegressed:
            raise
        except SessionExpired:
            with contextlib.suppress(BackendUnavailable):
                self._probe_history()
            handle.check_history()
            raise
        except LeaseError:
            handle.check_history()
            raise

    # -- the store's history ------------------------------------------------------------

    def _regressed(self, reason: str) -> None:
        """The guard's listener: the history went back; every open session is over (its
        listener hears ``REGRESSED``)."""
        self._refusal.noticed(reason)
        with self._lock:
            handles = list(self._sessions.values())
        log.error("etcd: %s (%d open session(s) ended)", reason, len(handles))
        for handle in handles:
            try:
                handle.end_by_regression(reason)
            except Exception:  # a listener's bug must not stop the others being told
                log.exception("etcd: session %s: regression listener raised",
                              handle.session_id)

    def _probe_history(self) -> None:
        """One linearizable read (the epoch key's count), whose header the transport
        checks.

        Raises:
            StoreRegressed: the store's history went back.
            BackendUnavailable: no answer.
        """
        self._ops.read(rq.txn(success=[rq.count(self._layout.epoch)]),
                       "checking the store's history", budget_s=self.config.timeout_s)

    # -- the store ending a lease -------------------------------------------------------

    def _store_ended(self, handle: EtcdSession, how: str, member: str, revision: int) -> None:
        """etcd deleted the session's key (:mod:`._sessions_revocation`): its lease is gone. Ends
        the session (its listener hears ``EXPIRED``) unless it was closed meanwhile, and
        reports an end before the granted TTL."""
        with self._lock:
            if self._sessions.get(handle.lease_id) is not handle:
                return
        self._ops.queues.forget_cursors()  # its jobs are claimable at their places
        now = time.monotonic()
        promise = handle.ended_early(now)
        at = f" at revision {revision}" if revision else ""
        handle.end_by_store(f"etcd ended its lease: {how}{at}")  # first: then the report
        self._report_early(handle, promise, now, how, member, revision)

    def _report_early(self, handle: EtcdSession, promise: tuple[float, float, str] | None,
                      now: float, how: str, member: str, revision: int) -> None:
        """Log at ERROR and count (``Observer.early_revocation``) a lease seen gone at
        ``now`` before the deadline the store granted (``promise``, from
        :meth:`EtcdSession.ended_early`: the send time of the last answered grant or
        keepalive plus the TTL it granted, both on this process's monotonic clock; a
        lease seen gone after its deadline is an ordinary expiry). On stderr when logging
        is not configured (:func:`consensus_lease._visible.log_visible`)."""
        if promise is None:
            return
        sent, ttl_s, by = promise
        early_s = sent + ttl_s - now
        log_visible(
            log, logging.ERROR,
            "etcd: session %s: the store ended its lease %.3f s before the granted TTL: %s "
            "(seen from member %s%s); the last renewal was sent %.3f s before and granted "
            "%g s by member %s. Either another client revoked the lease, or the store broke "
            "its TTL: a stale leader revoking every lease after a pause is a known bug of "
            "etcd before 3.4.31 / 3.5.13 (etcd#15247, etcd#12528)",
            handle.session_id, early_s, how, member or "?",
            f", revision {revision}" if revision else "", now - sent, ttl_s, by,
            extra={"session_id": handle.session_id, "owner": handle.owner,
                   "early_by_s": early_s, "member": member},
        )
        notify(self.observer,
               lambda o: o.early_revocation(self.scheme, handle.session_id, early_s))

    def _check_keepalive_answer(self, header: Any, mark: Mark) -> None:
        """A keepalive answer's header: another cluster id is final; a revision below
        the one seen when it was sent may be a lagging member, or the history going
        back, which one linearizable read tells apart.

        Raises:
            StoreRegressed / BackendUnavailable.
        """
        reason = self._transport.guard.observe(header, None, f"id {int(header.member_id):x}")
        if reason is not None:
            raise StoreRegressed(reason)
        if int(header.revision) < mark.revision:
            self._probe_history()

    def epoch(self) -> int:
        """The store epoch: one linearizable read of ``PREFIX/epoch`` (0 if absent).

        Raises:
            BackendUnavailable / AuthenticationFailed.
        """
        return _tokens_epoch.read(self._ops)

    def bump_epoch(self, above: int | None = None) -> int:
        """Read ``PREFIX/epoch``, then one compare-and-set transaction on its mod
        revision putting ``max(epoch + 1, above // 2**44 + 1)`` (a concurrent bump makes
        it decide again from the value it answers). A lost answer is settled by the
        nonce in the value read back. Returns the new epoch; every claim afterwards gets
        a token ``>= epoch * 2**44``, above every earlier token and ``above``.

        Raises:
            InvalidArgument: ``above`` < 0, or the epoch would exceed 2**19 - 1 (tokens
                must stay below 2**63); nothing changed.
            OutcomeUnknown / BackendUnavailable / AuthenticationFailed.
        """
        epoch = _tokens_epoch.bump(self._ops, above)
        self._refusal.bumped()
        return epoch

    # -- sessions -----------------------------------------------------------------------

    def open_session(
        self, owner: str, ttl_s: float, on_event: StateListener | None = None
    ) -> SessionHandle:
        """Grant an etcd lease of ``ceil(ttl_s)`` seconds. etcd raises a TTL below its
        minimum (1.5 x election timeout, 2 s by default): ``granted_ttl_s`` is what the
        server granted. ``on_event`` hears only ``REGRESSED`` (the store's history went
        back; see :meth:`keepalive`): etcd has no SUSPENDED state; a keepalive without
        an answer is a risk only until the session's local deadline.

        A LeaseGrant whose answer is lost is retried on another member; the orphan lease
        holds no keys and expires after its TTL. Then the session's key
        (``PREFIX/sessions/LEASE``, on the lease; one more round trip) is put and
        watched (:mod:`._sessions_revocation`): when etcd ends the lease, the session hears
        ``EXPIRED`` from that key's deletion, within a watch delivery; an end before
        the granted TTL is logged at ERROR and counted (``Observer.early_revocation``).

        Raises:
            BackendUnavailable / AuthenticationFailed: no session was created.
            StoreRegressed: the store's history went back (noticed by this driver, now
                or earlier, or by any process: the marker of :mod:`._tokens_history`) and the
                epoch has not been raised since (``bump_epoch``); no session was created.
        """
        self._refusal.check()
        sent = time.monotonic()
        answer = self._transport.call(
            "lease", "LeaseGrant", etcdrpc.LeaseGrantRequest(TTL=max(1, math.ceil(ttl_s))),
            what="opening a session (LeaseGrant)",
        )
        if answer.error:
            raise BackendUnavailable(f"etcd refused LeaseGrant: {answer.error}")
        handle = EtcdSession(int(answer.ID), owner, float(answer.TTL), on_event)
        handle.promised(sent, float(answer.TTL), _member(answer.header))
        with self._lock:
            self._sessions[handle.lease_id] = handle
        self._session_watch.expect(handle)
        try:
            put = self._transport.call(
                "kv", "Put", etcdrpc.PutRequest(key=self._layout.session(handle.lease_id),
                                                value=owner.encode(), lease=handle.lease_id),
                what=f"opening session {handle.session_id} (its session key)",
            )
        except BaseException as exc:
            self._abandon(handle)
            if isinstance(exc, SessionExpired) and not isinstance(exc, StoreRegressed):
                raise BackendUnavailable(
                    f"opening a session: lease {handle.session_id} was gone before its "
                    f"session key was put: {exc}") from exc
            raise
        self._session_watch.armed(handle, int(put.header.revision))
        return handle

    def _abandon(self, handle: EtcdSession) -> None:
        """A session whose opening failed: forgotten, its lease revoked (best effort:
        else its TTL ends it; it holds no job)."""
        with self._lock:
            self._sessions.pop(handle.lease_id, None)
        self._session_watch.forget(handle)
        with contextlib.suppress(LeaseError):
            self._revoke(handle.lease_id, budget_s=self.config.timeout_s)

    def keepalive(self, session: SessionHandle) -> float:
        """One LeaseKeepAlive on the driver's shared streams; returns the TTL etcd
        granted, in seconds. The request moves to the next member at once when its
        stream fails, and is hedged on the next member when its stream answers nothing
        for ``max(0.15, granted TTL / 20)`` seconds; a stream silent for ``granted TTL / 3``
        is dropped, and the call gives up after ``2 x granted TTL / 3`` seconds (these two
        within 0.2 s .. ``timeout_s``; the hedge's wait at most the stall's). A leader
        election costs a keepalive about the election's length, a silent member one short
        wait; a slow answer on a busy host costs nobody else anything (see
        :mod:`._transport_keepalive`, which also gives the worst-case share of the TTL one
        renewal takes).

        The answer's header is checked (:mod:`._tokens_history`): another cluster id,
        or a revision below the highest seen that a linearizable read confirms, ends every
        session open now with ``StoreRegressed``.

        Raises:
            StoreRegressed: the store's history went back (now or earlier, while this
                session was open).
            SessionExpired: etcd answered TTL <= 0: the lease is gone, with all its keys.
            BackendUnavailable: no answer; the lease may still be alive.
        """
        handle = self._handle(session)
        call = self._keepalive_call(handle)
        mark = self._transport.guard.mark()
        sent = time.monotonic()
        self._keepalives.keepalive_many([call])
        return self._keepalive_outcome(handle, call, mark, sent)

    def keepalive_many(
        self, sessions: Sequence[SessionHandle],
        on_result: Callable[[int, float | Exception], None],
    ) -> None:
        """:meth:`keepalive` for every session at once: their requests are pipelined on
        the shared streams, each ends on its own answer, failover or budget exactly as
        alone, and ``on_result(i, ttl or error)`` hears each as it ends (a slow one holds
        back no other's result)."""
        handles = [self._handle(session) for session in sessions]
        calls = [self._keepalive_call(handle) for handle in handles]
        index = {id(call): i for i, call in enumerate(calls)}
        mark = self._transport.guard.mark()
        sent = time.monotonic()

        def ended(call: KeepAliveCall) -> None:
            i = index[id(call)]
            try:
                ttl = self._keepalive_outcome(handles[i], call, mark, sent)
            except Exception as exc:  # every error is this session's own result
                on_result(i, exc)
                return
            on_result(i, ttl)

        self._keepalives.keepalive_many(calls, ended)

    def _keepalive_call(self, handle: EtcdSession) -> KeepAliveCall:
        ttl_s = handle.granted_ttl_s
        stall = min(self.config.timeout_s, max(0.2, ttl_s / 3))
        budget = min(self.config.timeout_s, max(0.2, 2 * ttl_s / 3))
        attempt = min(stall, max(0.15, ttl_s / 20))
        return KeepAliveCall(handle.lease_id, budget, attempt, stall, [])

    def _keepalive_outcome(self, handle: EtcdSession, call: KeepAliveCall, mark: Mark,
                           sent: float) -> float:
        """The TTL granted by a finished call, or its error (see :meth:`keepalive`)."""
        what = f"keepalive of session {handle.session_id}"
        if isinstance(call.result, Failure):
            raise translate(call.result, what, call.tried or []) from call.result.__cause__
        assert call.result is not None
        ttl, header = call.result
        self._check_keepalive_answer(header, mark)
        handle.check_history()
        if ttl <= 0:
            now = time.monotonic()
            self._report_early(handle, handle.ended_early(now), now,
                               "a keepalive answered TTL 0", _member(header), 0)
            raise SessionExpired(f"{what}: etcd says the lease expired or was revoked")
        handle.promised(sent, float(ttl), _member(header))
        return float(ttl)

    def close_session(self, session: SessionHandle) -> None:
        """Revoke the lease: etcd deletes every owner key attached to it in one revision,
        so its jobs are claimable at once (this driver's next queue scans start at the
        low-water mark). Idempotent (a lease already gone is fine).

        Raises:
            BackendUnavailable: no member answered within ``timeout_s``; the lease then
                ends by its TTL.
        """
        handle = self._typed(session)
        with self._lock:
            self._sessions.pop(handle.lease_id, None)
        self._session_watch.forget(handle)
        self._revoke(handle.lease_id, budget_s=self.config.timeout_s)
        self._ops.queues.forget_cursors()  # its jobs are claimable at their places

    def expire_session(self, session_id: str) -> None:
        """Test hook: make etcd end a session now, as its TTL running out would (revoke
        the lease ``session_id``, hex). Its owner finds out from the deletion of its
        session key (within a watch delivery), else at its next keepalive (TTL 0) or
        store operation. A session of this driver ended so is not reported as an early
        revocation (one of another driver is: to it, the store ended the lease early)."""
        lease_id = int(session_id, 16)
        with self._lock:
            handle = self._sessions.get(lease_id)
        if handle is not None:
            handle.end_expected()
        self._revoke(lease_id, budget_s=self.config.connect_timeout_s)
        self._ops.queues.forget_cursors()

    def _revoke(self, lease_id: int, budget_s: float) -> None:
        with contextlib.suppress(SessionExpired):  # already gone: fine
            self._transport.call(
                "lease", "LeaseRevoke", etcdrpc.LeaseRevokeRequest(ID=lease_id),
                what=f"revoking lease {session_text(lease_id)}", budget_s=budget_s,
            )

    # -- jobs ---------------------------------------------------------------------------

    def claim(self, session: SessionHandle, job_id: str) -> ClaimResult | None:
        """One transaction: if neither the owner key, the completion record, a retry
        delay (not-before key) nor an attempt limit exists, put the owner key (attached
        to the session's lease), the history key and the attempts key. The generation is
        the transaction's revision (= the owner key's create revision); the attempt is
        the attempts key's new version. The transaction also compares the store epoch
        with the driver's cached copy (after a ``bump_epoch``: refused once, sent again)
        and reads the job's queue marker. A job with an attempt limit (``enqueue(...,
        max_attempts)``) takes a second transaction, comparing the limit and the
        attempt count the first one answered: it claims, or (attempts used up and the
        last one ended without completion or fail) makes the job FAILED. A queued job
        that was not among this driver's recent candidates gets its held marker from one
        more transaction after the claim (best effort).

        After a lost answer the owner key is read back; the per-claim nonce in its value
        tells whether this request created it. If nothing is there yet, the same request
        (same nonce) is sent again, so a first copy that lands meanwhile is recognised,
        never doubled.

        Returns the claim (generation, attempt) with an :class:`EtcdClaim` as its
        ``handle`` (the owner value written, the job's queue read in the same
        transaction, the attempt and limit), or ``None`` when a live session holds the
        job or a retry delay runs. A dead session is noticed when the compare passes
        (etcd refuses the put: lease not found); when the job is held elsewhere a dead
        session may still get ``None``.

        Raises:
            JobCompleted: the completion record exists (its generation attached).
            JobFailed: the job is FAILED (now, or by this claim).
            SessionExpired: the session's lease is gone.
            StoreRegressed: the store's history went back while the session was open, or
                the answer came from a history older than one seen (a claim it made is
                handed back).
            OutcomeUnknown: sent, no answer, and reading back failed; if the claim landed
                it holds the job under this session, and this session's next claim of the
                job adopts it.
            BackendUnavailable / AuthenticationFailed.
        """
        return self._run(session, lambda h: _jobs_claim.claim_one(self._ops, h, job_id))

    def claim_many(
        self, session: SessionHandle, job_ids: Sequence[str]
    ) -> list[ClaimResult | None]:
        """All claims in ONE transaction of nested claim transactions (up to
        ``max_batch_claim``); every successful claim of the batch gets the batch's
        revision as its generation, and an :class:`EtcdClaim` handle as from
        :meth:`claim`. A held, delayed, completed or FAILED job yields ``None``; a job
        with an attempt limit is refused by the batch and then claimed on its own, as by
        :meth:`claim`. Falls back to one transaction per job if the server's
        ``--max-txn-ops`` is too low.

        Raises:
            SessionExpired: the lease is gone (nothing was claimed).
            StoreRegressed: as for :meth:`claim` (every claim of the batch handed back).
            OutcomeUnknown / BackendUnavailable / AuthenticationFailed.
        """
        if 1 < len(job_ids) <= _jobs_claim_many.MAX_BATCH_CLAIM:
            results = self._run(
                session, lambda h: _jobs_claim_many.claim_batch(self._ops, h, job_ids))
            if results is not None:
                return results
        return super().claim_many(session, job_ids)

    def renew(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> float:
        """A read-only transaction comparing the owner key's create revision with
        ``claim.generation`` and its value with the one the claim wrote (its
        :class:`EtcdClaim` handle; with ``handle`` ``None``, or one made by another
        session or for another job: its lease with the session's), and one keepalive of
        the session's lease sent during the transaction's round trip (one round trip for
        both; the check's verdict is raised first, as if it had run before). Returns the
        granted TTL (seconds).

        Raises:
            StaleLeaseError: not held at ``claim.generation`` (the lease is lost).
            SessionExpired: the session's lease is gone.
            StoreRegressed: the store's history went back while the session was open.
            BackendUnavailable: no answer; still held until the local deadline.
            InvalidArgument: ``claim.handle`` is not an :class:`EtcdClaim`.
        """
        return self._run(session, lambda h: self._renew(h, job_id, claim))

    def _renew(self, handle: EtcdSession, job_id: str, claim: ClaimResult) -> float:
        """The ownership check sent first, the keepalive during its round trip; the
        check's verdict is raised before the keepalive's (as if one ran after the
        other)."""
        finish = _jobs_hold.check_held(self._ops, handle, job_id, claim)
        try:
            ttl = self.keepalive(handle)
        except LeaseError:
            finish()
            raise
        finish()
        return ttl

    def complete(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes
    ) -> LeaseRecord:
        """One transaction: if the owner key still has create revision
        ``claim.generation`` and our value (as for :meth:`renew`), put the completion
        record and delete the owner and history keys, and the queue's pending key for a
        queued job (the queue as the claim read it; with ``handle`` ``None`` or after a
        batch claim settled by reading back, the job's queue marker is read first). A
        repeat (the record exists with this session and generation) returns the record.
        After a lost answer: read back; the completion record settles it; an owner key
        still ours means "not applied" and the request is sent again (its compare cannot
        pass twice).

        Raises:
            StaleLeaseError / SessionExpired: not held; nothing written.
            StoreRegressed: the store's history went back while the session was open
                (what the answer says was written stays, in the new history).
            InvalidArgument: ``result`` exceeds etcd's request size, or ``claim.handle``
                is not an :class:`EtcdClaim`; still held.
            OutcomeUnknown: sent, no answer, reading back failed.
            BackendUnavailable: nothing applied; still held.
        """
        return self._run(session, lambda h: _jobs_hold.complete(self._ops, h, job_id, claim,
                                                             bytes(result)))

    def complete_many(
        self, session: SessionHandle, items: Sequence[CompleteItem]
    ) -> list[LeaseRecord | LeaseError]:
        """One transaction per chunk of at most ``max_complete_batch`` items (fewer on a
        server allowing fewer operations, or past 1 MiB of results): per item, a nested
        transaction with the compares, writes and reads of :meth:`complete`, so a stale
        item takes its own ``else`` branch while the others commit (see
        :mod:`._jobs_complete_many`). A lost answer is settled by reading every item's keys back:
        any item still held means nothing landed, and the same transaction (whose
        compares cannot pass twice) is sent again. A chunk refused as a whole (too large
        for the server) is completed item by item.

        Returns:
            Element ``i``: the COMPLETED record of ``items[i]``, or the error
            :meth:`complete` would raise for it (``StaleLeaseError`` /
            ``SessionExpired``, by its rule; ``StoreRegressed``; ``InvalidArgument`` for a
            claim of another backend or a result too large, still held;
            ``BackendUnavailable``: nothing of its chunk applied, still held;
            ``OutcomeUnknown``: sent, and reading back failed).

        Raises:
            nothing of its own: each item's error is its outcome (also the session's
            own, such as ``StoreRegressed`` or ``InvalidArgument`` for a session of
            another backend).
        """
        return self._batch(session, items, _jobs_complete_many.complete_many)

    def complete_and_claim_next(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes,
        queue: str,
    ) -> tuple[LeaseRecord, QueuePick | None]:
        """One transaction (``fused_claim_next``; see :mod:`._queues_fused`): the
        completion of :meth:`complete`, with its compares, and nested in its ``success``
        branch the claim of a candidate of ``queue`` (one this driver's last scan
        offered, else a scan runs first: read-only, two round trips per page of 32
        entries), decided by the claim's own compares. So a refused completion claims
        nothing, and a completion whose candidate was taken meanwhile commits alone; the
        next job is then claimed as ``claim_next`` claims it (at most 3 lone claims that
        find the job held or delayed; claims that make exhausted jobs FAILED do not
        count, so any number of them is walked past; an error there is not raised: no
        next job). A queue with nothing claimable gets the
        completion alone. A lost answer is settled by reading back the completed job's
        owner and completion keys and the candidate's owner key (the claim's nonce); not
        applied, the same transaction is sent again (its compares cannot pass twice).

        Cost: one round trip per job while the last scan's candidates last (up to 32 per
        scan, offered for 1 s), plus the scan; a candidate with an attempt limit takes
        the two transactions of its claim after the completion.

        Raises:
            StaleLeaseError / SessionExpired: the completion was refused; nothing was
                claimed.
            StoreRegressed / InvalidArgument / OutcomeUnknown / BackendUnavailable: as
                :meth:`complete`; nothing was claimed (a claim whose answer was lost is
                adopted by this session's next claim of that job).
        """
        return self._run(session, lambda h: _queues_fused.complete_and_claim_next(
            self._ops, h, job_id, claim, bytes(result), queue))

    def claim_from_queue_many(
        self, session: SessionHandle, queue: str, n: int
    ) -> list[QueuePick]:
        """Up to ``n`` (at most ``max_queue_claim_batch``, 100) of the queue's oldest
        claimable jobs: ``claim_next``'s scan (read-only; see :meth:`queue_candidates`),
        then ONE transaction of nested claim transactions (one per candidate, each
        decided by its own compares, under one compare of the store epoch; see
        :mod:`._queues_claim`), all landing at one revision: the claims of a batch share
        their token. A candidate another claimer took since the scan fails its compare
        and the rest are claimed; if the scan was cut at ``n``, the next candidates are
        read and claimed the same way (at most 3 rounds lost to other claimers). A job
        with an attempt limit is claimed on its own afterwards, as by :meth:`claim` (two
        transactions; a job whose attempts are used up becomes FAILED, and a round that
        made jobs FAILED does not count as one of the 3: any number of exhausted jobs is
        walked past, ``[]`` means nothing was claimable). A server allowing fewer operations per
        transaction gets smaller batches. A lost answer is settled by reading the owner
        keys back (the batch's nonce), never by re-sending blindly.

        Raises:
            SessionExpired: the session's lease is gone; nothing is held.
            StoreRegressed: as for :meth:`claim` (the batch's claims handed back).
            OutcomeUnknown / BackendUnavailable / AuthenticationFailed / InvalidArgument:
                before any job was claimed (``OutcomeUnknown``: claims that landed stay
                the session's until it ends, or its next claim of the job adopts them;
                ``InvalidArgument``: a queue of the first layout).
        """
        return self._run(session, lambda h: _queues_claim.claim_queued(
            self._ops, h, queue, n))

    def _batch(self, session: SessionHandle, items: Sequence[Item],
               run: Callable[[Ops, EtcdSession, Sequence[Item]], list[Out]]) -> list[Out]:
        """``run(ops, handle, items)``, a batch ending of the session's items, its
        refusals checked by :meth:`_history_checked`; the session's own error (of
        another backend, ended by a regression) is every item's outcome."""
        try:
            handle = self._handle(session)
        except LeaseError as exc:
            return cast(list[Out], [exc] * len(items))
        return self._history_checked(handle, run(self._ops, handle, items))

    def _history_checked(self, handle: EtcdSession, outcomes: list[Out]) -> list[Out]:
        """:meth:`_run`'s rule for a batch's refusals: after a ``SessionExpired``, one
        linearizable read of the store's history; then, if the session is over by a
        regression, every refusal is that ``StoreRegressed``."""
        def refused(outcome: object) -> bool:
            return isinstance(outcome, LeaseError) and not isinstance(outcome, StoreRegressed)

        if not any(map(refused, outcomes)):
            return outcomes
        if any(isinstance(o, SessionExpired) and refused(o) for o in outcomes):
            with contextlib.suppress(BackendUnavailable, StoreRegressed):
                self._probe_history()
        try:
            handle.check_history()
        except StoreRegressed as exc:
            return cast(list[Out], [exc if refused(o) else o for o in outcomes])
        return outcomes

    def release(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> None:
        """One transaction: if held at ``claim.generation`` by this session (as for
        :meth:`renew`), delete the owner key (and a queued job's held marker) and put a
        release marker (this session, this generation, the claim's nonce) in the history
        key, by which a lost answer is settled. A claim without its handle (or a batch
        claim settled by reading back) reads the job's queue marker and owner key first
        (one more round trip).

        Raises:
            StaleLeaseError / SessionExpired: not held; nothing written.
            StoreRegressed: the store's history went back while the session was open
                (what the answer says was written stays, in the new history).
            OutcomeUnknown / BackendUnavailable / InvalidArgument: as for :meth:`complete`.
        """
        self._run(session, lambda h: _jobs_hold.release(self._ops, h, job_id, claim))

    def release_many(
        self, session: SessionHandle, items: Sequence[ReleaseItem]
    ) -> list[LeaseError | None]:
        """One transaction per chunk of at most ``max_end_batch`` items (fewer on a
        server allowing fewer operations): per item, a nested transaction with the
        compares, writes and reads of :meth:`release`, so a stale item takes its own
        ``else`` branch while the others are released (see :mod:`._jobs_batch`). Claims
        without their handle (or batch claims settled by reading back) have their queue
        markers and owner keys read first, in one read-only transaction per 62 items. A
        lost answer is settled by reading every item's owner, history and completion
        keys back: any item still held means nothing landed, and the same transaction
        (whose compares cannot pass twice) is sent again; else each item's release
        marker tells. A chunk refused as a whole is released item by item.

        Returns:
            Element ``i``: ``None`` (released), or the error :meth:`release` would
            raise for it (``StaleLeaseError`` / ``SessionExpired`` by its rule;
            ``StoreRegressed``; ``InvalidArgument`` for a claim of another backend, still
            held; ``BackendUnavailable``: nothing of its chunk applied, still held;
            ``OutcomeUnknown``: sent, and reading back failed).

        Raises:
            nothing of its own: each item's error is its outcome.
        """
        return self._batch(session, items, _jobs_hold.release_many)

    def fail_many(
        self, session: SessionHandle, items: Sequence[FailItem]
    ) -> list[LeaseRecord | LeaseError]:
        """As :meth:`release_many`, each nested transaction that of :meth:`fail` (its
        error recorded with a per-item nonce, by which a lost answer is settled; a
        FAILED verdict of a queued job bumps the failed counter's shard of its position,
        which ``queue_stats`` sums). Claims without their facts have their queue,
        attempts, limit and owner keys read first (one read-only transaction per 31
        items). Retry delays: one lease per distinct TTL (``ceil(retry_in_s)``, at least
        1 s, raised by etcd to its minimum) is granted before the first transaction
        (``LeaseGrant``: one round trip per distinct TTL) and shared by the not-before
        keys of the items of that TTL; each item is claimable no earlier than its
        ``retry_in_s`` after the call, as with :meth:`fail`. A lease no applied item
        uses is revoked.

        Returns:
            Element ``i``: the record after ``items[i]``'s failure, as :meth:`fail`
            returns it, or the error it would raise for it (as in
            :meth:`release_many`; ``BackendUnavailable`` also when its delay's lease
            could not be granted: nothing written, still held).

        Raises:
            nothing of its own: each item's error is its outcome.
        """
        return self._batch(session, items, _jobs_fail.fail_many)

    def set_value(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, value: bytes
    ) -> None:
        """One transaction with the ownership compare of :meth:`renew`: put the value key
        (``value``, the generation and a per-request nonce) on the session's lease, so it
        ends with the hold when the lease does; release, complete and fail of an election
        delete it, and a value of an older hold is never shown by :meth:`get`. A lost
        answer is settled by reading back (the nonce); if the job is still held and the
        value not there, the same request is sent again (see :mod:`._jobs_value`). A claim
        without its handle reads the owner key first (one more round trip).

        Raises:
            StaleLeaseError / SessionExpired: not held at ``claim.generation``; nothing
                written.
            StoreRegressed: the store's history went back while the session was open.
            InvalidArgument: ``value`` exceeds etcd's request size (``--max-request-bytes``,
                1.5 MiB by default, base64 included), or ``claim.handle`` is not an
                :class:`EtcdClaim`; still held, value unchanged.
            OutcomeUnknown: sent, no answer, reading back failed.
            BackendUnavailable: nothing applied; still held.
        """
        self._run(session, lambda h: _jobs_value.set_value(self._ops, h, job_id, claim,
                                                        bytes(value)))

    def fail(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, error: str,
        retry_in_s: float,
    ) -> LeaseRecord:
        """One transaction with the ownership compare of :meth:`release`: delete the
        owner key, put the release marker (history key) and the error (error key, with a
        per-request nonce by which a lost answer is settled); then, if the claim's
        attempt used up the job's ``max_attempts`` (counted since the last requeue),
        put the FAILED record and delete the queue's pending key; else, for
        ``retry_in_s > 0``, put the not-before key on a lease of its own granted first
        (``LeaseGrant``: one more round trip) with a TTL of ``ceil(retry_in_s)``
        seconds, at least 1, which etcd raises to its minimum TTL (2 s by default): the
        job becomes claimable when etcd deletes the key, never earlier than
        ``retry_in_s`` after ``fail`` was called (the TTL runs from the grant, before
        the transaction), up to about 0.5 s after the TTL (longer across a leader
        change).
        A claim without a handle (or a batch claim settled by reading back) reads the
        job's queue, attempts and limit first.

        Returns the record after it: FAILED, or AVAILABLE with ``not_before`` = local
        wall clock + the granted TTL (display only; ``None`` without a delay).

        Raises:
            StaleLeaseError / SessionExpired: not held; nothing written (the delay's
                lease is revoked).
            StoreRegressed: as for :meth:`complete`.
            OutcomeUnknown: sent, no answer, reading back failed.
            BackendUnavailable: nothing applied; still held.
            InvalidArgument: ``claim.handle`` is not an :class:`EtcdClaim`, or etcd
                refused the request's size; still held.
        """
        return self._run(session, lambda h: _jobs_fail.fail(self._ops, h, job_id, claim, error,
                                                            float(retry_in_s)))

    def requeue(self, job_id: str) -> LeaseRecord:
        """Read the job's keys; if it is FAILED, one transaction comparing the FAILED
        record's mod revision: delete it, rewrite the limit key with ``base`` = the
        attempts so far (a fresh budget of ``max_attempts``) and put the queue's pending
        key and index entry back with the queue's next ordinal (the queue's counters are
        read first and compared: the job then comes after the jobs already pending). A
        lost answer is settled by the nonce in the limit key. Returns the AVAILABLE
        record.

        Raises:
            InvalidArgument: the job is unknown or not FAILED; nothing changed.
            OutcomeUnknown / BackendUnavailable / AuthenticationFailed.
        """
        return _jobs_fail.requeue(self._ops, job_id)

    # -- work queues --------------------------------------------------------------------

    def enqueue(
        self, queue: str, job_id: str, payload: bytes, max_attempts: int | None = None
    ) -> bool:
        """:meth:`enqueue_many` of one job: one transaction (two the first time this
        driver enqueues into the queue: the queue's counters are read first).

        ``payload`` is at most ``capabilities.max_payload_bytes`` (1 MiB, under etcd's
        default ``--max-request-bytes`` of 1.5 MiB; the core checks it before sending).

        Raises:
            InvalidArgument: the job exists outside this queue (in another queue, or as a
                job claimed by name), or ``job_id`` is an election key, or etcd refused
                the request's size, or its ``--max-txn-ops`` is below the operations
                the transaction needs (the message names the flag and the limit), or the
                queue was written by the first queue layout (the message names the
                upgrade step); nothing was written.
            QueueFull: the queue holds ``capabilities.max_queue_jobs`` jobs, or its
                payloads would exceed 256 MiB (``_queues.MAX_QUEUE_PAYLOAD_BYTES``).
            OutcomeUnknown / BackendUnavailable / AuthenticationFailed.
        """
        return self.enqueue_many(queue, [EnqueueItem(job_id, payload, max_attempts)])[0]

    def enqueue_many(self, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
        """One transaction for the whole chunk (at most ``max_enqueue_batch`` = 100 jobs,
        within etcd's default ``--max-txn-ops`` of 128; a server allowing fewer gets
        smaller transactions, each atomic): it compares the queue's ordinal counter
        ``QDIR/k/seq`` and the absence of each new job's keys, and puts each job's queue
        marker (with a per-request nonce), member key (the payload; its create revision
        is the job's ``seq``), pending key and index entry (the job's ordinal, so key
        order is FIFO order), limit key (with ``max_attempts``) and the counter. Its
        ``else`` branch reads the counters; refused with the counter unchanged, one more
        read (per 64 jobs) gets each job's marker and key count: jobs already in this
        queue are left unchanged (``False``) and compared in the next round; concurrent
        producers of the queue make it go round again. A lost answer
        is settled by reading back the first new job's marker (the nonce); the chunk is
        one transaction, so all of it landed or none. See :mod:`._queues`.

        Raises:
            InvalidArgument: a job exists outside this queue or is an election key, or
                as for :meth:`enqueue`; nothing of the chunk was written.
            QueueFull: the queue would exceed ``capabilities.max_queue_jobs`` jobs or
                256 MiB of payloads (checked from its counters before sending; purge
                gives completed jobs' room back); nothing of the chunk was written.
            OutcomeUnknown / BackendUnavailable / AuthenticationFailed.
        """
        for item in items:
            if is_election_key(item.job_id):
                raise InvalidArgument(f"{item.job_id!r} is an election, not a job: it "
                                      f"cannot be enqueued", job_id=item.job_id)
        if not items:
            return []
        return _queues.enqueue_items(self._ops, queue, items)

    def queue_candidates(self, queue: str, limit: int) -> list[tuple[str, bytes]]:
        """A scan of the queue's FIFO index (see :mod:`._queues_index`), from this
        driver's cursor (where its last scan found a candidate) or from the low-water
        mark (when the cursor finds nothing, after this driver released a job of the
        queue or ended one of its sessions, and at least every second): per page of 32
        entries, one read-only transaction with the entries (a key-ordered range
        spanning at most 1,024 ordinals, so etcd's cost does not grow with the queue's
        depth), the ordinal counter and the mark, then one with each entry's pending key
        (stale?), owner key (held?), not-before key (retry delay?) and payload. What it
        finds is offered to this driver's fused ``complete_and_claim_next`` for up to a
        second (:mod:`._queues_fused`). Stops once ``limit`` unheld
        jobs are found or the queue is exhausted (at most 512 pages). Its cost grows
        with the held and delayed jobs at the front of the queue, not with its depth.
        Candidates come oldest ordinal first (enqueue commit order; a requeued job goes
        to the back; a released or expired one keeps its place, offered again within a
        second by other drivers). A hint: the claim decides (and puts the job's held
        marker in the queue, and reads its ordinal, so the completion deletes its index
        entry).

        Raises:
            InvalidArgument: the queue was written by the first queue layout (the
                message names the upgrade step).
            BackendUnavailable / AuthenticationFailed.
        """
        with self._transport.bounded():
            return _queues.candidates(self._ops, queue, limit)

    def queue_stats(self, queue: str) -> QueueStats:
        """One read-only transaction, so one revision: the queue's counters (ordinals
        handed out, and the versions of the keys each completion, FAILED verdict and
        requeue puts, and the purged count) and its held markers (a key on the holder's
        lease per held job, deleted with the hold by etcd on expiry): cost O(held jobs)
        in the server, independent of the queue's depth. The counts are mutually
        consistent (``available + held + completed + failed`` is the number of jobs of
        the queue at that revision). ``oldest_held_lease_until``: the earliest end
        (local wall clock + remaining TTL) among the leases of at most 8 of the first
        64 held jobs' holders, one ``LeaseTimeToLive`` each (display only). A job
        claimed by name whose held marker could not be written (see ``claim``) counts
        as available while held. See :mod:`._queues_index`.

        Raises:
            InvalidArgument: the queue was written by the first queue layout.
            BackendUnavailable / AuthenticationFailed.
        """
        with self._transport.bounded():
            return _queues_index.stats(self._ops, queue)

    def upgrade_queue(self, queue: str) -> int:
        """Upgrade a queue written by an earlier consensus_lease (queue layout 1, which
        this version refuses with ``InvalidArgument``) to the FIFO index, in place; run
        it once with the queue's workers and producers stopped. Open jobs keep their
        order (and their claims, tokens and attempts); completed and FAILED jobs are
        counted into the new counters. Returns how many open jobs were indexed; 0 for a
        queue that needs no upgrade (idempotent). Cost: O(jobs of the queue): a listing,
        one read per 64 finished jobs, one transaction per 40 open jobs. See
        :mod:`._queues_upgrade`; the command ``consensus-lease upgrade-queue`` calls it.

        Raises:
            BackendUnavailable: the queue changed meanwhile (a worker or producer still
                runs; run it again once they are stopped), or a job is inconsistent.
            AuthenticationFailed.
        """
        with self._transport.bounded():
            return _queues_upgrade.upgrade_queue(self._ops, queue)

    def queue_jobs(self, queue: str, limit: int | None = None) -> list[QueuedJob]:
        """Every job of the queue, oldest enqueued first, at one revision: the queue's
        member keys (key-ordered pages, sorted here by create revision), then one read
        transaction per 32 jobs for payload and job keys (fewer under a lower
        ``--max-txn-ops``). ``lease_until`` and ``not_before`` as in :meth:`records`.

        Raises:
            BackendUnavailable / AuthenticationFailed.
        """
        with self._transport.bounded():
            return _queues.list_jobs(self._ops, queue, limit)

    def wait_for_queue(self, queue: str, timeout_s: float) -> None:
        """Read the queue's open jobs; return at once if one is neither held nor in a
        retry delay. Otherwise watch, on one stream from the next revision, the queue's
        pending keys for PUTs (an enqueue or requeue) and the job keys for DELETEs: an
        owner key of a job held at the read going away without its history key in the
        same revision (release, fail, lease expiry or revoke; not a completion), or the
        not-before key of a delayed job (its lease ran out), wakes it. The watches are
        cancelled on every way out; a failure returns early after a pause of at most
        0.2 s. Spurious returns are possible (e.g. over 1024 held jobs: any owner key
        deleted wakes it)."""
        _watches_queue.wait(self._ops, queue, timeout_s)

    def purge(self, queue: str) -> int:
        """Delete the keys of the queue's completed jobs (completion record, queue
        marker, member key, history, attempts, error and limit keys): list the member
        and pending keys at one revision (those without a pending key are completed or
        FAILED), then per 64 jobs (fewer under a lower ``--max-txn-ops``) one read of
        the purge counter and the jobs' queue markers and one transaction: a nested
        transaction of deletes per job, the whole guarded by the counter and by every
        job's completion record existing (a job no longer completed is left out and the
        rest sent again; FAILED jobs stay). Returns how many were deleted; after a lost
        answer, jobs whose member key is gone when read back are counted (a concurrent
        purge may have deleted them).

        Each step (a listing, the stale index entries' deletes, a batch's read and
        transaction) ends by its own deadline, ``max(timeout_s, connect_timeout_s)`` from
        its start: a large queue takes as many steps as it needs, and an unreachable
        store fails the first.

        Raises:
            OutcomeUnknown / BackendUnavailable / AuthenticationFailed: a step not done
                in time; the earlier steps' jobs are purged.
            InvalidArgument: the server's ``--max-txn-ops`` is below what one job's
                purge transaction needs (10: its two compares, then the nested eight
                deletes); the message names the limit.
        """
        return _queues.purge(self._ops, queue)

    # -- reading and waiting ------------------------------------------------------------

    def get(self, job_id: str) -> LeaseRecord | None:
        """The job's record from one linearizable range read of its keys. ``lease_until``
        (HELD only): local wall clock + the holder lease's remaining TTL (one more
        request; ``None`` if it fails); ``not_before`` (a retry delay runs) likewise from
        the not-before key's lease; ``value`` (HELD only): what :meth:`set_value` stored
        during this hold, else ``None``.

        Raises:
            BackendUnavailable / AuthenticationFailed.
        """
        with self._transport.bounded():
            return _layout_records.read_record(self._ops, job_id)

    def records(self, limit: int | None = None) -> list[LeaseRecord]:
        """Every job under the prefix in job-id order, from key-ordered range reads of
        the prefix at one revision; stops after ``limit`` jobs. Elections are no jobs:
        left out. ``lease_until`` and
        ``not_before`` are looked up for the first 64 leases, ``None`` beyond.

        Raises:
            BackendUnavailable / AuthenticationFailed.
        """
        with self._transport.bounded():
            return _layout_records.list_records(self._ops, limit)

    def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        """Read the job's keys; if it is held or a retry delay runs, watch them from the
        next revision until an event (the owner key deleted by release, completion, fail
        or lease expiry; the not-before key deleted when its lease runs out; a new
        claim; for an election, its value) or ``timeout_s``. The watch is cancelled on
        every way out. A failure returns early, after a pause of at most 0.2 s so a
        caller's retry loop does not spin."""
        deadline = time.monotonic() + timeout_s
        keys = self._layout.job(job_id)
        try:
            answer = self._ops.read(
                rq.txn(success=[rq.count(keys.owner), rq.count(keys.not_before),
                                rq.count(keys.completion), rq.count(keys.failed)]),
                f"reading {job_id!r}", budget_s=min(timeout_s, self.config.timeout_s),
            )
            owner, delay, done, dead = (r.response_range.count for r in answer.responses)
            if done or dead or not (owner or delay):
                return
            key, range_end = keys.watch_range
            wait_for_event(self._transport, key, range_end, int(answer.header.revision) + 1,
                           max(0.0, deadline - time.monotonic()))
        except (Failure, BackendUnavailable) as exc:
            log.info("etcd: waiting on %r failed: %s", job_id, exc)
            time.sleep(max(0.0, min(0.2, deadline - time.monotonic())))

    # -- subscriptions: waking waiting claims ---------------------------------------------

    def subscribe_job(self, job_id: str, callback: WakeCallback) -> Unsubscribe:
        """See :meth:`Backend.subscribe_job`. The first subscriber of a job reads its
        keys once (one linearizable read-only transaction, at revision ``R``; if the job
        looks claimable, completed or FAILED, every subscriber is called soon) and
        starts a watch of its keys from ``R + 1`` on the driver's one shared Watch
        stream (see :mod:`._watches_subscribe`); later subscribers join it, the last to
        leave cancels it. Called on an owner key's deletion (release, completion, fail,
        lease expiry or revoke; not a fail that starts a retry delay), a not-before
        key's deletion (its lease ran out), a completion or FAILED record, a requeue;
        for an election key also a new claim and a :meth:`set_value` (what observers
        follow); once more if the stream breaks or on :meth:`close`.

        Raises:
            BackendUnavailable / AuthenticationFailed: the first read failed; there is
                no subscription.
        """
        return self._subscriptions_etcd.subscribe_job(job_id, callback)

    def subscribe_queue(self, queue: str, callback: WakeCallback) -> Unsubscribe:
        """As :meth:`subscribe_job`, for the work queue ``queue``: the first read lists
        its pending keys (pages of 64, and the owner and not-before keys of those jobs);
        the watches are the queue's pending keys (an enqueue or requeue calls back) and
        one watch, shared by every subscribed queue, of the job keys' deletions (a job of
        the queue released, expired, or out of its retry delay calls back).

        Raises:
            BackendUnavailable / AuthenticationFailed: the first read failed; there is
                no subscription.
        """
        return self._subscriptions_etcd.subscribe_queue(queue, callback)

    def close_subscriptions(self) -> None:
        """End the shared Watch stream and call every subscriber once. Idempotent."""
        self._subscriptions_etcd.close()
        super().close_subscriptions()

    def close(self) -> None:
        """Revoke the leases of sessions still open (best effort: the first failure stops
        it, their TTL then ends them), then close the keepalive stream and channels, then
        call every subscriber once (their claims then find the store closed)."""
        with self._lock:
            handles = list(self._sessions.values())
            self._sessions.clear()
        for handle in handles:
            try:
                self._revoke(handle.lease_id, budget_s=self.config.timeout_s)
            except LeaseError as exc:
                log.warning("etcd: could not revoke lease %s on close: %s", handle.session_id, exc)
                break
        self._session_watch.close()
        self._keepalives.close()
        self._subscriptions_etcd.stop()
        self._transport.close()
        self.close_subscriptions()


def _member(header: Any) -> str:
    """The member that sent an answer, from its header (``"id HEX"``)."""
    return f"id {int(header.member_id):x}"
