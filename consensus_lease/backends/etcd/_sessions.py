"""The etcd session handle (one lease) and the claim handle (what one claim wrote)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ...backend import SessionEvent, SessionHandle, StateListener
from ...errors import InvalidArgument, SessionExpired, StoreRegressed
from ...record import ClaimResult
from ._layout import History, Limit, Owner, session_text
from ._tokens import split

__all__ = ["EtcdClaim", "EtcdSession"]


class EtcdSession(SessionHandle):
    """A session: one etcd lease. ``session_id`` is the lease id in hex (as ``etcdctl
    lease list`` prints it).

    What each claim wrote is not kept here: it travels with the claim, as the
    :class:`EtcdClaim` in ``ClaimResult.handle``. The only per-claim state of a session
    is the nonces of its claims whose answer was lost and not settled by reading back:
    such a claim may still land after the read-back, and then nothing holds its
    ``ClaimResult``; the nonces let this session's next claim of the job recognise the
    owner key as its own and adopt it (see :meth:`is_ours`), instead of finding the job
    held by itself under a claim nobody can complete or release. They are kept until
    the session ends (a handful of short strings per lost answer).

    A session open when the driver noticed that the store's history went back is over
    (:meth:`end_by_regression`): its listener is told (``SessionEvent.REGRESSED``) and
    every later operation on it raises ``StoreRegressed``. A session whose lease etcd
    ended (seen by the watch of the session keys, or a keepalive answering TTL 0) is
    over too (:meth:`end_by_store`): its listener is told ``SessionEvent.EXPIRED``.

    The session remembers the store's last promise (:meth:`promised`): the lease lives at
    least until the send time of the last answered grant or keepalive plus the TTL the
    answer granted (monotonic clock of this process; etcd starts the TTL no earlier than
    it receives the request). An end observed before that time is an early revocation
    (:meth:`ended_early`).

    Attributes:
        lease_id: the etcd lease id (int).
    """

    def __init__(self, lease_id: int, owner: str, granted_ttl_s: float,
                 on_event: StateListener | None = None) -> None:
        super().__init__(session_text(lease_id), owner, granted_ttl_s)
        self.lease_id = lease_id
        self._on_event = on_event
        self._lock = threading.Lock()
        self._unsettled: dict[str, set[str]] = {}
        self._regressed: str | None = None
        self._owner_value = Owner.encoder(owner, self.session_id)
        self._release_marker = History.release_encoder(self.session_id)
        self._promise: tuple[float, float, str] | None = None  # (sent, ttl_s, member)
        self._ended = False

    def promised(self, sent: float, ttl_s: float, member: str) -> None:
        """An answer to a grant or keepalive sent at ``sent`` (monotonic seconds) granted
        ``ttl_s`` seconds, from ``member``: the lease lives until ``sent + ttl_s`` at
        least (a later promise replaces an earlier one, never shortens it)."""
        with self._lock:
            last = self._promise
            if last is None or sent + ttl_s >= last[0] + last[1]:
                self._promise = (sent, ttl_s, member)

    def ended_early(self, now: float) -> tuple[float, float, str] | None:
        """The lease was seen gone at ``now`` (monotonic): the last promise ``(sent,
        ttl_s, member)`` if that is before ``sent + ttl_s`` (an early end), else
        ``None``. Answers once per session: later calls return ``None``."""
        with self._lock:
            if self._ended:
                return None
            self._ended = True
            promise = self._promise
        if promise is None or now >= promise[0] + promise[1]:
            return None
        return promise

    def end_expected(self) -> None:
        """The lease is being ended on purpose (a revoke this process asked for): its
        end is no early revocation (:meth:`ended_early` answers ``None`` from now)."""
        with self._lock:
            self._ended = True

    def end_by_store(self, reason: str) -> None:
        """etcd ended the lease (its keys are gone): the session is over. The listener
        is told ``SessionEvent.EXPIRED`` once (the core loses the session with a
        ``SessionExpired`` naming ``reason``), from the calling thread."""
        with self._lock:
            first = self.expiry is None and self._regressed is None
            if first:
                self.expiry = SessionExpired(f"session {self.session_id}: {reason}")
        if first and self._on_event is not None:
            self._on_event(SessionEvent.EXPIRED)

    def owner_value(self, nonce: str, epoch: int) -> bytes:
        """The owner value a claim request of this session writes: exactly
        ``Owner(owner, session_id, nonce, epoch).encode()`` (the part naming the owner
        and the session is encoded once per session)."""
        return self._owner_value(nonce, epoch)

    def release_marker(self, nonce: str, generation: int) -> bytes:
        """The history value a release of this session's claim ``nonce`` at
        ``generation`` writes: exactly ``History(None, session_id, nonce, generation,
        released=True).encode()`` (the part naming the session is encoded once)."""
        return self._release_marker(nonce, generation)

    def end_by_regression(self, reason: str) -> None:
        """The store's history went back while this session was open: it is over. The
        listener is told once, from the calling thread."""
        with self._lock:
            first, self._regressed = self._regressed is None, self._regressed or reason
        if first and self._on_event is not None:
            self._on_event(SessionEvent.REGRESSED)

    def check_history(self) -> None:
        """Raise ``StoreRegressed`` if the session ended by a regression.

        Raises:
            StoreRegressed: see :meth:`end_by_regression`.
        """
        reason = self._regressed  # one atomic read (set once, never cleared)
        if reason is not None:
            raise StoreRegressed(f"session {self.session_id}: {reason}")

    def unsettled(self, job_id: str, nonce: str) -> None:
        """A claim with ``nonce`` was sent but its fate is not known: if it lands later,
        this session's next claim of the job adopts it."""
        with self._lock:
            self._unsettled.setdefault(job_id, set()).add(nonce)

    def is_ours(self, job_id: str, owner: Owner, nonce: str) -> bool:
        """Whether an owner value was written by this session's claim ``nonce`` or by
        one of its unsettled claims of ``job_id``."""
        with self._lock:
            return owner.session == self.session_id and (
                owner.nonce == nonce or owner.nonce in self._unsettled.get(job_id, ())
            )


@dataclass(frozen=True, slots=True)
class EtcdClaim:
    """What one claim wrote: the etcd backend's ``ClaimResult.handle``, handed back with
    renew, complete, release, fail and set_value of that claim.

    Each of them compares the owner key's value with ``owner_value`` (without it: its
    lease with the session's); complete deletes the queue's pending key of ``queue``
    (without it, or with ``queue_known`` false: the job's queue marker is read first,
    one more round trip, as release and fail do). A job's queue never changes while it
    is held: enqueue only marks a job that has no other key. ``fail`` decides from
    ``attempt`` and ``limit`` whether the job's attempts are used up; its limit cannot
    change while it is held either (requeue rewrites it only for a FAILED job, which
    nobody holds).

    Attributes:
        lease_id: the lease (int) of the session that made the claim.
        job_id: the job claimed.
        owner_value: the exact owner-key value the claim wrote (bytes).
        queue_known: whether the claim read the job's queue marker (a batch claim
            settled by reading back did not).
        queue: the job's work queue as the claim read it (``None``: not queued, or not
            known).
        attempt: the claim's attempt number (the attempts key's version it wrote).
        limit: the job's attempt limit as the claim saw it (``None``: unlimited; a claim
            only succeeds without a limit key, or comparing the one it read).
        epoch: the store epoch the claim was made in (also in ``owner_value``); its
            token is ``epoch * 2**44 + create revision``.
        ordinal: the job's place in ``queue`` (its index entry, which complete and a
            FAILED verdict delete), when the claim read it (``None``: not known).
        nonce: the claim request's nonce (also in ``owner_value``), which release and
            fail put in their marker (``None``: read from ``owner_value``).

    What the claim knows of the job's attempts is final while it holds the job: no other
    claim can bump the attempts key, and only the holder's ``fail`` writes an error. So
    complete builds the record it returns from ``attempt`` and ``limit`` without reading
    them again (see :attr:`first_attempt`).
    """

    lease_id: int
    job_id: str
    owner_value: bytes
    queue_known: bool
    queue: str | None
    attempt: int = 0
    limit: Limit | None = None
    epoch: int = 0
    ordinal: int | None = None
    nonce: str | None = None

    @property
    def claim_nonce(self) -> str:
        """The claim request's nonce: :attr:`nonce`, else decoded from ``owner_value``.

        Raises:
            BackendUnavailable: ``owner_value`` is not an owner record.
        """
        if self.nonce is not None:
            return self.nonce
        return Owner.decode(self.owner_value, b"(claim handle)").nonce

    @property
    def first_attempt(self) -> bool:
        """Whether this claim is the job's first (attempt 1) and the job has no attempt
        limit, so no last-error key can exist: one is written only by ``fail`` of an
        earlier hold (whose claim put the attempts key, which then makes this claim's
        attempt at least 2; only ``purge`` deletes that key, and the error key with it)
        or by a claim that finds a limited job's attempts used up."""
        return self.attempt == 1 and self.limit is None

    @staticmethod
    def of(claim: ClaimResult, session: EtcdSession, job_id: str) -> EtcdClaim | None:
        """The handle ``claim`` carries, if ``session`` made it for ``job_id`` with the
        token ``claim.generation``; ``None`` for a claim without one (made elsewhere, or
        rebuilt from its generation) or made by another session, for another job or in
        another epoch: its ownership is then checked by the session's lease alone, so a
        claim cannot lend one session's owner value to another.

        Raises:
            InvalidArgument: ``claim`` is not a ``ClaimResult``, or carries a handle that
                is not an etcd claim (nothing was sent).
        """
        if not isinstance(claim, ClaimResult):
            raise InvalidArgument(f"not a ClaimResult: {claim!r}", job_id=job_id)
        handle = claim.handle
        if handle is None:
            return None
        if not isinstance(handle, EtcdClaim):
            raise InvalidArgument(f"not an etcd claim: {handle!r}", job_id=job_id)
        if handle.lease_id != session.lease_id or handle.job_id != job_id:
            return None
        if split(claim.generation)[0] != handle.epoch:
            return None
        return handle
