"""kazoo's exceptions, translated into :mod:`consensus_lease.errors`.

=====================================  ===================================================
kazoo                                  consensus_lease
=====================================  ===================================================
``NoAuthError``, ``AuthFailedError``   ``AuthenticationFailed``
``SessionClosedRequireSaslError``      ``AuthenticationFailed``
``SessionExpiredError``                ``SessionExpired`` for a worker session;
                                       ``BackendUnavailable`` for the read client
``ConnectionClosedError`` (stopped)    as ``SessionExpiredError`` (its subclass)
``RuntimeError`` (kazoo#254)           ``BackendUnavailable``: the connection is reset
``KazooTimeoutError``                  ``BackendUnavailable`` naming ``timeout_s``
``ConnectionLoss``, any other          ``BackendUnavailable`` naming the hosts; for a
                                       write, the caller reads back first
=====================================  ===================================================

Ambiguity (a write whose answer was lost) is not decided here: the backend reads back.
"""

from __future__ import annotations

from typing import Any

from kazoo.exceptions import KazooException, NoNodeError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from ...errors import AuthenticationFailed, BackendUnavailable, LeaseError, SessionExpired
from ._transport_gate import IN_FLIGHT, NotSent
from ._transport_kazoo import AUTH_REFUSED

__all__ = ["KAZOO_ERRORS", "answer_or_none", "translate"]

KAZOO_ERRORS: tuple[type[BaseException], ...] = (KazooException, KazooTimeoutError, RuntimeError)
"""What a kazoo call can raise. kazoo fails a request with a bare ``RuntimeError("xids do
not match ...")`` when a reply arrives out of order (python-zk/kazoo#254), then tears the
connection down: treated like a lost connection."""


def answer_or_none(result: Any, **get: Any) -> Any:
    """The answer of one read's async result (``result.get(**get)``), or ``None`` if the
    znode does not exist (kazoo's ``NoNodeError``: a ``get_children`` of a missing path,
    which registers no watch). Any other error is raised as kazoo raised it."""
    try:
        return result.get(**get)
    except NoNodeError:
        return None


def translate(
    exc: BaseException,
    what: str,
    hosts: str,
    *,
    worker_session: bool = True,
    job_id: str | None = None,
    generation: int | None = None,
    timeout_s: float | None = None,
) -> LeaseError:
    """The library error for kazoo exception ``exc`` raised while doing ``what``.

    ``worker_session`` says whether the client was a worker's session (whose expiry is
    final: ``SessionExpired``) or the backend's shared read client (which reconnects).
    ``timeout_s``, if given, is named in the message of a deadline that passed."""
    where = f"ZooKeeper at {hosts}"
    if isinstance(exc, LeaseError):
        return exc
    if isinstance(exc, AUTH_REFUSED):  # NoAuth, AuthFailed, SessionClosedRequireSasl
        return AuthenticationFailed(
            f"{what}: {where} refused the credentials ({type(exc).__name__}); check the "
            f"user/password options and the ACLs of the chroot",
            job_id=job_id, generation=generation,
        )
    if isinstance(exc, SessionExpiredError) and worker_session:
        return SessionExpired(
            f"{what}: the ZooKeeper session expired ({where})", job_id=job_id, generation=generation
        )
    if isinstance(exc, RuntimeError):
        return BackendUnavailable(
            f"{what}: kazoo protocol error with {where} ({exc.args[0] if exc.args else exc}); "
            f"the connection is being reset", job_id=job_id, generation=generation,
        )
    within = "in time" if timeout_s is None else f"within timeout_s ({timeout_s:g} s)"
    if isinstance(exc, NotSent):
        return BackendUnavailable(
            f"{what}: could not send to {where} {within}: not connected (or {IN_FLIGHT} "
            f"requests already unanswered); nothing was sent", job_id=job_id,
            generation=generation,
        )
    if isinstance(exc, KazooTimeoutError):
        return BackendUnavailable(
            f"{what}: no answer from {where} {within}", job_id=job_id, generation=generation
        )
    detail = type(exc).__name__ + (f": {exc}" if str(exc) else "")
    return BackendUnavailable(
        f"{what}: {where} failed: {detail}", job_id=job_id, generation=generation
    )
