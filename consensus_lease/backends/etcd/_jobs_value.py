"""A held job's value (``set_value``: an election's leader value): one guarded put.

::

    if held at generation G (the compare of renew: create_revision(o) is G's, and
            value(o) is the claim's owner value, or without it lease(o) is ours):
        put v = {value, G, nonce}           (on the session's lease)
    else:
        get o, get c

The value key rides on the session's lease, so etcd deletes it with the owner key when
the lease ends (expiry or revoke); release, complete and fail of an election delete it
in their own transaction. It records ``G``: a value left by an older hold (one set on a
job, whose release leaves it in place) is stale, and ``get`` never shows it
(:func:`._layout_records.held_value`). A claim without its handle reads the owner key first to
check the epoch part of its token, as release does (one more round trip).

A lost answer is settled by reading ``o``, ``c`` and ``v`` back: ``v`` carrying the
request's nonce means it landed; the job still held means not applied yet, and the same
request (same nonce) is sent again. Limitation: a first copy still in flight when read
back may land after the re-send; if the holder set another value in between, the
earlier one comes back (the holder still holds the job: nothing is written outside its
hold).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from ...record import ClaimResult
from . import _transport_requests as rq
from ._jobs import Ops, Settled, refusal
from ._layout import HeldValue
from ._sessions import EtcdClaim, EtcdSession

__all__ = ["set_value"]


def set_value(ops: Ops, handle: EtcdSession, job_id: str, claim: ClaimResult,
              value: bytes) -> None:
    """See :meth:`EtcdBackend.set_value <consensus_lease.backends.etcd.EtcdBackend.set_value>`."""
    known = EtcdClaim.of(claim, handle, job_id)
    generation = claim.generation
    keys = ops.layout.job(job_id)
    nonce = secrets.token_hex(8)
    what = f"setting the value of {job_id!r} generation {generation}"
    if known is None:
        (owner_kv,) = ops.read_keys([keys.owner], f"reading {job_id!r}",
                                    time.monotonic() + ops.config.timeout_s, job_id)
        ops.check_epoch(keys, generation, owner_kv, what)
    record = HeldValue(value, generation, nonce)
    request = rq.txn(
        compare=ops.holds(handle, keys, generation, known),
        success=[rq.put(keys.value, record.encode(), handle.lease_id)],
        failure=[rq.get(keys.owner), rq.get(keys.completion)],
    )

    def decide(kvs: list[Any]) -> Settled | None:
        owner_kv, completion_kv, value_kv = kvs
        if value_kv is not None and HeldValue.decode(value_kv.value, value_kv.key).nonce == nonce:
            return Settled(None)
        if ops.held_by(handle, owner_kv, generation, known):
            return None  # not applied: send again
        raise refusal(ops, handle, keys, generation, owner_kv, completion_kv, what)

    answer = ops.send_guarded(
        request, what, job_id=job_id, generation=generation,
        read_back=(keys.owner, keys.completion, keys.value), decide=decide,
    )
    if isinstance(answer, Settled) or answer.succeeded:
        return
    owner_kv, completion_kv = (rq.kv_of(r) for r in answer.responses)
    raise refusal(ops, handle, keys, generation, owner_kv, completion_kv, what)
