"""Hooks for metrics: what happened to leases, and how close a holder came to losing one.

The core calls an :class:`Observer` at each event; the default does nothing (logging is
done separately, on the ``consensus_lease`` logger, with ``job_id``, ``generation`` and
``owner`` as record attributes). :class:`consensus_lease.metrics.PrometheusObserver`
exports them; write your own subclass for other systems. Observers are called from
worker and keepalive threads and must be fast and thread-safe; an exception raised by
one is logged and otherwise ignored, so metrics can never break lease handling.

**Early revocations** count sessions the store ended before the TTL it granted: the
deadline from the send time of the last answered renewal plus the TTL that answer
granted, against the time the end was seen, both on the worker's monotonic clock (no
wall clocks are compared across machines). A store that does so breaks the lease
protocol's premise; the etcd driver reports it (a stale leader's revoke, etcd#15247),
and logs each at ERROR.

**Renewal headroom** is the time left before the local deadline when a renewal succeeds:
the early warning that a holder is getting close to losing its lease (slow store, GC
pauses, an overloaded machine) before it does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .errors import (
    BackendUnavailable,
    InvalidArgument,
    LeaseLost,
    OutcomeUnknown,
    StaleLeaseError,
)

__all__ = ["OUTCOMES", "Observer", "default_observer", "notify", "outcome_of",
           "set_default_observer"]

log = logging.getLogger("consensus_lease")


class Observer:
    """Receives lease events. Every method is a no-op here; override what you need.

    The core calls these methods directly (through :func:`notify`), so their signatures
    are checked by mypy at every call site: an override must keep them.

    ``store`` is the backend's scheme (``"sqlite"``, ``"etcd"``, ...).
    """

    def claimed(self, store: str, job_id: str, generation: int, owner: str) -> None:
        """A claim succeeded."""

    def completed(self, store: str, job_id: str, generation: int, owner: str) -> None:
        """A completion was recorded."""

    def released(self, store: str, job_id: str, generation: int, owner: str) -> None:
        """A lease was handed back (the job is claimable again at once): by
        ``release()``, or by closing its session (then the lease's own state reads
        LOST, with the reason "session closed")."""

    def failed(self, store: str, job_id: str, generation: int, owner: str, state: str) -> None:
        """A failed attempt was recorded; ``state`` is the job's state after it
        (``"available"``: claimable again after the retry delay; ``"failed"``: its
        attempts ran out)."""

    def operation(self, store: str, op: str, job_id: str | None, generation: int | None,
                  outcome: str, latency_s: float) -> None:
        """A store operation on a lease ended ``latency_s`` seconds (the session's
        monotonic clock) after it was sent: ``op`` is ``"claim"``, ``"claim_next"``,
        ``"complete"``, ``"release"`` or ``"fail"``; ``outcome`` one of
        :data:`OUTCOMES`. ``job_id`` and ``generation`` are ``None`` where there is
        none (a claim that found the job held; ``claim_next`` on an empty queue).
        Only measured when the store has an observer: no clock is read without one."""

    def renewed(self, store: str, latency_s: float, headroom_s: float) -> None:
        """A session renewal succeeded ``latency_s`` after it was sent, with ``headroom_s``
        left before the previous local deadline."""

    def lost(self, store: str, job_id: str | None, generation: int | None, reason: str) -> None:
        """A lease (``job_id`` set) or a whole session (``job_id`` None) was lost. Not
        called for a session closed by its worker: its leases are :meth:`released`."""

    def stale_rejected(self, store: str, by: str, job_id: str, generation: int) -> None:
        """A stale operation was rejected ``by`` ``"store"`` (owner/generation compare) or
        ``"fence"`` (a destination saw a higher token)."""

    def early_revocation(self, store: str, session_id: str, early_by_s: float) -> None:
        """The store ended session ``session_id`` at least ``early_by_s`` seconds (> 0)
        before the deadline its last renewal granted (see the module docstring). The
        session is lost; another holder may have claimed its jobs before this worker
        heard of it. Called once per session."""

    def wal_measured(self, store: str, path: str, wal_bytes: int, blocked: bool) -> None:
        """The write-ahead log of the store file ``path`` is ``wal_bytes`` bytes now
        (SQLite: measured every ``wal_interval_s``). ``blocked``: it stayed above
        its bound (``wal_limit_bytes``) after checkpoints on two checks in a row, which
        means a reader holds an old snapshot open (see the SQLite store's page)."""

    def attached(self, store: str, kind: str = "store") -> None:
        """A store of scheme ``store`` (``kind`` ``"store"``) or a fence labelled
        ``store`` (``kind`` ``"fence"``: :class:`~consensus_lease.SqliteFence`) was made
        with this observer, before any other event of it. Metrics exporters create their
        series here, so that counters are exported at 0 before their first event."""

    def delivery_skipped(self, store: str, job_id: str, reason: str) -> None:
        """An integration (the Celery task base, :mod:`consensus_lease.celery`) did not
        run a delivered copy of job ``job_id``: ``reason`` is ``"completed"`` (done
        already), ``"held"`` (another holder runs it now), ``"failed"`` (its attempts
        ran out) or ``"unavailable"`` (the claim got no answer; a later copy asks
        again)."""

    def callback_failed(self, store: str, registration: str) -> None:
        """A user callback raised (logged at ERROR on ``consensus_lease.callbacks``);
        ``registration`` is where it was registered (``"Session.on_lost"``,
        ``"Lease.on_lost"``, ``"AsyncSession.on_lost"``)."""


OUTCOMES = ("ok", "held", "empty", "stale", "lost", "unknown", "unavailable", "error")
"""The ``outcome`` of :meth:`Observer.operation`: ``ok`` (done; a claim got the lease),
``held`` (a claim found the job held elsewhere), ``empty`` (``claim_next`` found nothing
claimable in the queue), ``stale`` (the store
refused: owner or generation no longer match), ``lost`` (another :class:`LeaseLost`,
e.g. the session expired), ``unknown`` (:class:`OutcomeUnknown`: maybe applied),
``unavailable`` (no answer) and ``error`` (anything else, e.g. ``JobCompleted``)."""


def outcome_of(exc: BaseException) -> str:
    """The :data:`OUTCOMES` word for an operation that raised ``exc``."""
    if isinstance(exc, StaleLeaseError):
        return "stale"
    if isinstance(exc, LeaseLost):
        return "lost"
    if isinstance(exc, OutcomeUnknown):
        return "unknown"
    if isinstance(exc, BackendUnavailable):
        return "unavailable"
    return "error"


_default: Observer | None = None


def set_default_observer(observer: Observer | None) -> None:
    """Make ``observer`` the observer of every store :func:`~consensus_lease.open_store`
    opens from now on without an ``observer=`` argument (``None``: none again). Stores
    already open keep theirs. :func:`consensus_lease.otel.instrument` calls this."""
    global _default
    if observer is not None and not isinstance(observer, Observer):
        raise InvalidArgument(
            f"observer must be a consensus_lease.observe.Observer, not {observer!r}")
    _default = observer


def default_observer() -> Observer | None:
    """The observer set by :func:`set_default_observer`, or ``None``."""
    return _default


def notify(observer: Observer | None, event: Callable[[Observer], None]) -> None:
    """Deliver one event: ``event(observer)``, e.g. ``notify(obs, lambda o: o.claimed(...))``.
    Any exception is logged and dropped, so metrics can never break lease handling."""
    if observer is None:
        return
    try:
        event(observer)
    except Exception:
        log.exception("observer %s raised", type(observer).__name__)
