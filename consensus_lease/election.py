"""Leader election with a fencing token: a lease on a name that is never completed.

::

    with store.session(ttl_s=10) as session:
        with session.campaign("scheduler", b"host-a:8080", wait_s=60) as leadership:
            while True:
                leadership.ensure_held()                        # before every effect
                fence.apply("schedule", leadership.generation, "tick")

    for leader in store.watch_leader("scheduler", timeout_s=30):     # None: nobody leads
        print(leader and (leader.owner, leader.value, leader.generation))

An election is held through the same claim / renew / release machinery as a job lease,
under the election's key in a namespace no job id can enter
(:mod:`consensus_lease._election`), so everything a lease guarantees holds for a leader:
at most one live leader per name at any store time, a generation strictly greater than
every earlier leader's (the fencing token), loss delivered as for any lease
(``ensure_held``, ``on_lost``, cancellation in asyncio). Handover is unordered on every
store: when the leader resigns or expires, *any* waiting candidate may win; there is no
queue of candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._election import election_key
from .backend import Backend
from .errors import InvalidArgument, UnsupportedOperation
from .lease import Lease
from .record import ClaimResult, JobState, LeaseRecord
from .states import LeaseState

if TYPE_CHECKING:
    from ._holdings import Holdings
    from .session import Session

__all__ = ["LeaderRecord", "Leadership", "check_value", "leader_record", "require_elections"]


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    """The leader of an election, as the store has it.

    Attributes:
        name: the election's name.
        owner: the owner label of the leader's session.
        value: what the leader announced (``campaign``'s value, or its last ``proclaim``).
            ``b""`` also for the instant between a new leader's claim and its value.
        generation: the leader's fencing token: strictly greater than every earlier
            leader's of this election.
        lease_until: when the leader's lease ends if not renewed, seconds since the
            epoch, as ``LeaseRecord.lease_until`` (store clock, or etcd's estimate;
            ``None`` where the store does not expose it: ZooKeeper). For display only.
    """

    name: str
    owner: str
    value: bytes
    generation: int
    lease_until: float | None


def leader_record(name: str, record: LeaseRecord | None) -> LeaderRecord | None:
    """The leader an election key's record shows, or ``None`` if nobody holds it."""
    if record is None or record.state is not JobState.HELD:
        return None
    return LeaderRecord(name=name, owner=record.owner or "", value=record.value or b"",
                        generation=record.generation, lease_until=record.lease_until)


def require_elections(backend: Backend) -> None:
    """Raise ``UnsupportedOperation`` unless ``backend`` declares elections."""
    if not backend.capabilities.elections:
        raise UnsupportedOperation(
            f"the {backend.scheme} backend has no leader elections (capabilities.elections)"
        )


def check_value(value: object, backend: Backend) -> bytes:
    """``value`` as bytes if it is bytes-like and within the store's request size
    (``capabilities.max_payload_bytes``); else ``InvalidArgument``."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"value must be bytes, not {type(value).__name__}")
    limit = backend.capabilities.max_payload_bytes
    if limit and (size := memoryview(value).nbytes) > limit:
        raise InvalidArgument(
            f"value is {size} bytes; the {backend.scheme} store accepts at most {limit} "
            f"in one request"
        )
    return bytes(value)


class Leadership(Lease):
    """Leadership of one election: a :class:`~consensus_lease.Lease` on the election's
    name, made by :meth:`Session.campaign <consensus_lease.Session.campaign>`.

    Everything a lease does holds: :attr:`generation` is the fencing token to send with
    every effect, :meth:`ensure_held` is the local check before each one, :meth:`renew`
    re-confirms in the store, loss is delivered as for any lease (the session's
    ``on_lost``, ``guard()`` cancellation in asyncio). A leader never completes:
    :meth:`complete` and :meth:`fail` raise ``InvalidArgument``; it ends by
    :meth:`resign` (also on leaving a ``with`` block), by closing its session, or by
    losing it.

    Attributes:
        name (str): the election's name.
        job_id (str): the election's key in the store (a reserved prefix + ``name``),
            which errors and log lines of the lease carry.
        generation (int): the fencing token.
    """

    __slots__ = ("_value", "name", "unannounced")

    def __init__(
        self, session: Session, holdings: Holdings, name: str, claim: ClaimResult, value: bytes
    ) -> None:
        super().__init__(session, holdings, election_key(name), claim)
        self.name = name
        self._value = value
        self.unannounced = True
        """Claimed, but the value not yet written: not handed to the caller yet."""

    def _announced(self, value: bytes) -> None:
        with self._lock:
            self._value = value
            self.unannounced = False

    @property
    def value(self) -> bytes:
        """The value this leader announced: ``campaign``'s, or its last ``proclaim``'s."""
        with self._lock:
            return self._value

    def __repr__(self) -> str:
        return (
            f"Leadership(name={self.name!r}, generation={self.generation}, "
            f"owner={self.owner!r}, state={self.state.value})"
        )

    def __enter__(self) -> Leadership:
        return self

    def resign(self) -> None:
        """Step down: end the hold iff still the leader at this generation (one atomic
        store operation, as :meth:`Lease.release`). A waiting candidate may lead at once,
        with a higher generation. Resigning twice is a no-op.

        Raises:
            StaleLeaseError / SessionExpired: it was no longer the leader; LOST.
            OutcomeUnknown: as for :meth:`Lease.release`.
            BackendUnavailable: nothing applied; still the leader until the deadline.
            StoreClosed / StoreInherited: nothing was sent.
        """
        self.release()

    def proclaim(self, value: bytes) -> None:
        """Announce a new value (leader watches see it), iff still the leader at this
        generation: the store compares owner and generation in the same atomic
        operation as the write (one round trip).

        As for :meth:`Lease.complete`, the store decides, not the local deadline: a
        leader that was paused past its TTL learns it here (``StaleLeaseError``) and its
        value is not written.

        Args:
            value: bytes, at most ``capabilities.max_payload_bytes``.

        Raises:
            InvalidArgument: ``value`` not bytes or too large, or this leader already
                resigned; nothing sent.
            StaleLeaseError / SessionExpired: no longer the leader; LOST, nothing written.
            OutcomeUnknown: the store may or may not have written it; LOST.
            BackendUnavailable: nothing written; still the leader until the deadline.
            StoreClosed / StoreInherited: nothing was sent.
        """
        self._holdings.check_usable()
        data = check_value(value, self.session.backend)
        with self._lock:
            state = self._state
        if state is LeaseState.RELEASED:
            raise InvalidArgument(
                f"the leadership of {self.name!r} generation {self.generation} was resigned: "
                f"proclaim() cannot announce a value; nothing was sent",
                job_id=self.job_id, generation=self.generation,
            )
        self._holdings.set_value(self, data)
        with self._lock:
            self._value = data

    def complete(self, result: bytes = b"") -> LeaseRecord:
        """Refused: an election is never completed (use :meth:`resign`).

        Raises:
            InvalidArgument: always; nothing sent, still the leader.
        """
        raise self._not_a_job("complete")

    def complete_and_claim_next(
        self, result: bytes = b"", queue: str | None = None
    ) -> tuple[LeaseRecord, Lease | None]:
        """Refused: an election is never completed (use :meth:`resign`).

        Raises:
            InvalidArgument: always; nothing sent, still the leader.
        """
        raise self._not_a_job("complete_and_claim_next")

    def fail(self, error: str | BaseException, retry_in_s: float | None = None) -> LeaseRecord:
        """Refused: an election is never failed (use :meth:`resign`).

        Raises:
            InvalidArgument: always; nothing sent, still the leader.
        """
        raise self._not_a_job("fail")

    def _not_a_job(self, call: str) -> InvalidArgument:
        return InvalidArgument(
            f"{call}() on the leadership of {self.name!r}: an election is never completed "
            f"or failed; resign() steps down. Nothing was sent",
            job_id=self.job_id, generation=self.generation,
        )


def announced(leadership: Leadership, value: bytes) -> None:
    """For campaigns (:mod:`consensus_lease._campaign`) only: the store has the new
    leader's ``value``; the leadership is no longer ``unannounced`` and may be handed to
    the caller."""
    leadership._announced(value)
