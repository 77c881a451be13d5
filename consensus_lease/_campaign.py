"""Campaigning: how ``session.campaign(name, value, wait_s=)`` becomes the leader.

One campaign attempt is the claim of the election's key (the same backend ``claim`` a job
takes, under the reserved namespace of :mod:`._election`) followed by the leader's value
(``Backend.set_value``, compared with owner + generation in the store). If the value
cannot be written the claim is handed back, so nobody leads without the value it asked
for; if handing it back fails too, the session keeps the claim (its close or loss frees
it) and this session's next campaign for the name resumes it, writing the value again,
instead of waiting for itself. Waiting is the waiting claim's
(:func:`._waiting.wait_and_claim`): woken by the store's subscription on the key, holding
no store request open.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from ._election import election_key
from ._waiting import wait_and_claim
from .election import Leadership, announced, check_value, require_elections
from .errors import ClaimTimeout, InvalidArgument, LeaseError
from .states import LeaseState
from .validation import check_election_name, check_wait

if TYPE_CHECKING:
    from ._holdings import Holdings
    from .session import Session

__all__ = ["campaign"]


def campaign(
    session: Session, holdings: Holdings, name: str, value: bytes, wait_s: float | None
) -> Leadership | None:
    """See :meth:`Session.campaign`."""
    check_election_name(name)
    require_elections(session.backend)
    data = check_value(value, session.backend)
    wait = None if wait_s is None else check_wait(wait_s)
    key = election_key(name)
    held = holdings.held(key)
    if held is not None and not (isinstance(held, Leadership) and held.unannounced):
        raise InvalidArgument(f"this session already leads {name!r}", job_id=key,
                              generation=held.generation)

    def attempt() -> Leadership | None:
        orphan = holdings.held(key)
        if isinstance(orphan, Leadership) and orphan.unannounced:
            session.ensure_alive()
            return _announce(holdings, orphan, data)
        return _campaign_once(session, holdings, name, data)

    if wait is None:
        session.ensure_alive()
        return attempt()
    return wait_and_claim(
        session, lambda wake: session.backend.subscribe_job(key, wake), attempt, wait,
        lambda: ClaimTimeout(f"election {name!r} still led by another after waiting {wait} s",
                             job_id=key),
    )


def _campaign_once(
    session: Session, holdings: Holdings, name: str, value: bytes
) -> Leadership | None:
    """One attempt: the leadership, or ``None`` if another session leads."""
    key = election_key(name)
    result = holdings.liveness.call(lambda: session.backend.claim(session.handle, key))
    if result is None:
        return None
    leadership = holdings.register(Leadership(session, holdings, name, result, value))
    return _announce(holdings, leadership, value)


def _announce(holdings: Holdings, leadership: Leadership, value: bytes) -> Leadership:
    """Write the new leader's value; on failure hand the leadership back (or, if that
    fails too, leave it ``unannounced`` for the next campaign of this session)."""
    try:
        holdings.set_value(leadership, value)
    except BaseException:
        if leadership.state in (LeaseState.HELD, LeaseState.SUSPENDED):
            with contextlib.suppress(LeaseError):
                leadership.resign()
        raise
    announced(leadership, value)
    return leadership
