"""The etcd session handle: one lease, plus what this process knows about its claims."""

from __future__ import annotations

import threading

from ...backend import SessionHandle
from ._keys import Owner, session_text

__all__ = ["EtcdSession"]


class EtcdSession(SessionHandle):
    """A session: one etcd lease. ``session_id`` is the lease id in hex (as ``etcdctl
    lease list`` prints it).

    Besides the lease it keeps, per claim, the exact owner-key value written (renew,
    complete and release compare against it) and the job's work queue as the claim
    transaction read it (complete deletes the queue's pending key), and the nonces of
    claims whose answer was lost and not settled by reading back (so a late-landing one
    can be adopted).

    Attributes:
        lease_id: the etcd lease id (int).
    """

    def __init__(self, lease_id: int, owner: str, granted_ttl_s: float) -> None:
        super().__init__(session_text(lease_id), owner, granted_ttl_s)
        self.lease_id = lease_id
        self._lock = threading.Lock()
        self._held: dict[tuple[str, int], tuple[bytes, bool, str | None]] = {}
        self._unsettled: dict[str, set[str]] = {}

    def remember(self, job_id: str, generation: int, owner_value: bytes, queue: str | None,
                 *, queue_known: bool = True) -> None:
        """Record the owner-key value of a claim (later compares require exactly it) and
        the job's work queue (``None``: not queued) as the claim read it; ``queue_known``
        is false when the claim did not read it. A job's queue never changes while it is
        held: enqueue only marks a job that has no other key."""
        with self._lock:
            self._held[(job_id, generation)] = (owner_value, queue_known, queue)

    def owner_value(self, job_id: str, generation: int) -> bytes | None:
        with self._lock:
            held = self._held.get((job_id, generation))
        return None if held is None else held[0]

    def queue_of(self, job_id: str, generation: int) -> tuple[bool, str | None]:
        """``(known, queue)``: whether the claim's read of the job's work queue is
        recorded, and that queue (``None``: not queued)."""
        with self._lock:
            held = self._held.get((job_id, generation))
        return (False, None) if held is None else (held[1], held[2])

    def forget(self, job_id: str, generation: int) -> None:
        with self._lock:
            self._held.pop((job_id, generation), None)

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
