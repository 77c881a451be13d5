"""Fenced Celery tasks (``pip install consensus_lease[celery]``).

With ``acks_late=True`` and the Redis or SQS broker, a task that runs longer than the
broker's ``visibility_timeout`` is delivered again while it still runs: two copies at
once, and the first copy's late writes still land. :class:`FencedTask` makes each
delivery claim a lease first::

    from celery import Celery
    from consensus_lease.celery import FencedTask

    app = Celery("shop", broker="redis://127.0.0.1:6379/0")
    app.conf.consensus_lease_store = "sqlite:////var/lib/shop/leases.db"

    @app.task(bind=True, base=FencedTask, acks_late=True)
    def charge(self, order_id):
        token = self.lease.generation          # the fencing token: pass it to every write
        payments.charge(order_id, fencing_token=token)

A delivery:

1. claims the lease of the task's key (``celery:<task id>``, or ``lease_key(*args,
   **kwargs)``) in the lease store, as one atomic store operation;
2. runs the body with the lease (``self.lease``, or :func:`current_lease` anywhere in
   the body); the worker process's session renews it in the background while it runs;
3. on return, completes the lease (the job is never claimed again) and returns the
   body's value; if the body raised, records a failed attempt (``lease.fail``: the
   store's :class:`~consensus_lease.RetryPolicy` decides when it may be claimed again,
   and makes it FAILED when ``max_attempts`` ran out) and re-raises, so Celery's own
   retries (``autoretry_for``, ``self.retry``) work as before;
4. a copy whose job is completed (or FAILED) does not run the body: it is acked with a
   log line and the metric ``delivery_skipped`` (:meth:`consensus_lease.observe.Observer
   .delivery_skipped`), without touching the task's result (``celery.exceptions.Ignore``);
5. a copy whose job another worker holds does not run the body either; it publishes one
   delayed copy of itself (``lease_recheck_s`` later, same task id and retry count) and
   is acked, with a log line and the metric. The delayed copy checks again: completed
   -> acked; still held -> again; the holder died (its lease expired in the store) -> it
   claims and runs the task. So a worker killed mid-task never loses the task, and no
   two copies run the body at once while both hold the lease (one paused past its TTL
   may still be in the body when another claims: see 7, and fence the writes);
6. a copy that cannot claim (the store does not answer, or cannot tell whether the claim
   was applied) does not run the body: as in 5, a delayed copy asks again
   (``reason="unavailable"``); after an unknown outcome the worker process's session is
   closed first, so a claim it may hold ends in the store;
7. if the lease is lost while the body runs (the worker was paused past its TTL, the
   store went away), the completion is refused; the copy publishes a delayed copy (as
   in 5), logs at ERROR and is acked without a result. The body's writes were fenced
   with its token, so a new holder's writes win. The same when the completion (or the
   failed attempt) gets no answer from the store; the worker process's session is then
   closed, so the claim it may still hold ends in the store.

Options (Celery task options: ``@app.task(base=FencedTask, lease_ttl_s=60, ...)``, or
attributes of a subclass; ``lease_store`` also from ``app.conf.consensus_lease_store``):

====================  ===============================================================
option                meaning
====================  ===============================================================
``lease_store``       store URL (``open_store``), or a callable returning a
                      :class:`~consensus_lease.LeaseStore`; opened once per worker
                      process, after the fork (required)
``lease_key``         callable ``(*args, **kwargs) -> str``: the job id to claim;
                      default ``None``: ``celery:<task id>``
``lease_ttl_s``       TTL of the worker process's session, seconds (default 10)
``lease_recheck_s``   delay of the copy published while another holder runs the task,
                      seconds (default: ``lease_ttl_s``, at most half the broker's
                      ``visibility_timeout`` when it is set)
====================  ===============================================================

Composition with Celery:

- ``acks_late=True`` is what makes a crash safe (the message stays in the broker until
  the task ended); the lease is what makes the redelivery safe. Without ``acks_late``
  a worker killed mid-task loses the task, lease or not.
- ``visibility_timeout`` (Redis, SQS ``broker_transport_options``) may be shorter than
  the task: the redelivered copy is turned into one delayed re-check, not a second run.
  Keep ``lease_recheck_s`` below it (the default does), or the delayed copy is itself
  redelivered before it runs.
- Celery's retries: a raising body records a failed attempt (the store's retry policy,
  ``max_attempts``) and re-raises; a Celery retry of the same task id then claims the
  job again once the store's retry delay passed, and a job whose attempts ran out is
  acked without running (``reason="failed"``). ``self.retry()`` inside the body hands the
  lease back (``release``) first, so the retry can claim at once.
- ``task.apply()`` (eager) is fenced the same way (no delayed copy is published: the
  caller gets ``Ignore`` back). Calling the task as a plain function has no task id:
  it needs ``lease_key`` or raises :class:`~consensus_lease.InvalidArgument`.

A lease gives one holder at a time, not exactly-once: apply each effect once with a
fence (:class:`consensus_lease.fencing.SqliteFence` ``apply(..., once_per_job=True)``,
``SqlFence``) keyed by the job and fenced by the token.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from ._extras import install_hint, missing_dependency
from .errors import (
    BackendUnavailable,
    InvalidArgument,
    JobCompleted,
    JobFailed,
    LeaseLost,
    OutcomeUnknown,
)
from .lease import Lease
from .observe import notify
from .session import Session
from .states import LeaseState, SessionState
from .store import DEFAULT_TTL_S, LeaseStore, open_store

try:
    import celery
    from celery import signals
    from celery.exceptions import Ignore, Reject, Retry
except ModuleNotFoundError as _exc:  # pragma: no cover - exercised by check-wheel
    if missing_dependency(_exc) not in ("celery", "kombu", "billiard"):
        raise
    raise ImportError(f"consensus_lease.celery needs celery: {install_hint('celery')}") from _exc

__all__ = ["FencedTask", "current_lease"]

log = logging.getLogger("consensus_lease.celery")

_current: contextvars.ContextVar[Lease | None] = contextvars.ContextVar(
    "consensus_lease_celery_lease", default=None)


def current_lease() -> Lease:
    """The lease of the :class:`FencedTask` body running in this thread.

    Raises:
        InvalidArgument: not called from inside a fenced task's body.
    """
    lease = _current.get()
    if lease is None:
        raise InvalidArgument("current_lease() is only set inside a FencedTask's body")
    return lease


class _Process:
    """The stores and sessions of this worker process, keyed by store spec; opened after
    the fork (a store belongs to the process that opened it)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.stores: dict[Any, LeaseStore] = {}
        self.sessions: dict[tuple[Any, float], Session] = {}

    def session(self, spec: Any, ttl_s: float) -> Session:
        with self.lock:
            store = self.stores.get(spec)
            if store is None:
                store = open_store(spec) if isinstance(spec, str) else spec()
                if not isinstance(store, LeaseStore):
                    raise InvalidArgument(
                        f"lease_store must be a store URL or return a LeaseStore, not "
                        f"{store!r}")
                self.stores[spec] = store
            session = self.sessions.get((spec, ttl_s))
            if session is None or session.state in (SessionState.LOST, SessionState.CLOSED):
                session = store.session(ttl_s=ttl_s)
                self.sessions[(spec, ttl_s)] = session
            return session

    def discard(self, session: Session) -> None:
        """Stop using ``session`` and close it (its claims end in the store)."""
        with self.lock:
            self.sessions = {k: v for k, v in self.sessions.items() if v is not session}
        try:
            session.close()
        except Exception as exc:  # the store may be unreachable: its TTL ends it then
            log.warning("closing the session after an unknown claim outcome: %s", exc)

    def close(self) -> None:
        with self.lock:
            sessions, self.sessions = list(self.sessions.values()), {}
            stores, self.stores = list(self.stores.values()), {}
        for session in sessions:
            session.close()
        for store in stores:
            store.close()


_process_lock = threading.Lock()
_process: _Process | None = None


def _this_process() -> _Process:
    global _process
    with _process_lock:
        if _process is None or _process.pid != os.getpid():
            _process = _Process()  # a fork's child: the parent's stores are not ours
        return _process


def _close_process(**_: Any) -> None:
    with _process_lock:
        process = _process
    if process is not None and process.pid == os.getpid():
        process.close()


signals.worker_process_shutdown.connect(_close_process, weak=False)
signals.worker_shutdown.connect(_close_process, weak=False)


class FencedTask(celery.Task):  # type: ignore[misc]
    """A Celery task base whose body runs only while this delivery holds the task's
    lease (see the module docstring for the steps, the options and what happens to a
    redelivered copy).

    The body's lease is :attr:`lease`; its ``generation`` is the fencing token.
    """

    abstract = True
    lease_store: str | Callable[[], LeaseStore] | None = None
    lease_key: Callable[..., str] | None = None
    lease_ttl_s: float = DEFAULT_TTL_S
    lease_recheck_s: float | None = None

    @property
    def lease(self) -> Lease:
        """The lease of the running body (as :func:`current_lease`)."""
        return current_lease()

    # -- configuration -----------------------------------------------------------------

    def _store_spec(self) -> str | Callable[[], LeaseStore]:
        spec = self.lease_store or self.app.conf.get("consensus_lease_store")
        if not spec:
            raise InvalidArgument(
                f"task {self.name}: FencedTask needs lease_store (a store URL or a "
                f"callable returning a LeaseStore), or app.conf.consensus_lease_store")
        if not isinstance(spec, str) and not callable(spec):
            raise InvalidArgument(f"task {self.name}: lease_store must be a store URL or "
                                  f"a callable, not {spec!r}")
        return spec

    def _job_id(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        key = type(self).lease_key  # a plain function, not bound to the task
        if key is not None:
            job_id = key(*args, **kwargs)
            if not isinstance(job_id, str):
                raise InvalidArgument(
                    f"task {self.name}: lease_key returned {job_id!r}, not a str")
            return job_id
        task_id = self.request.id
        if not task_id:
            raise InvalidArgument(
                f"task {self.name} was called as a plain function: it has no task id to "
                f"key its lease; give it lease_key, or use .delay()/.apply()")
        return f"celery:{task_id}"

    def _recheck_s(self) -> float:
        if self.lease_recheck_s is not None:
            return float(self.lease_recheck_s)
        delay = float(self.lease_ttl_s)
        options = self.app.conf.get("broker_transport_options") or {}
        visibility = options.get("visibility_timeout")
        if visibility:
            delay = min(delay, float(visibility) / 2)
        return delay

    # -- one delivery ------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        job_id = self._job_id(args, kwargs)
        session = _this_process().session(self._store_spec(), float(self.lease_ttl_s))
        if any(lease.job_id == job_id for lease in session.leases()):
            self._skip(session, job_id, "held", republish=True)  # another thread has it
        try:
            lease = session.claim(job_id)
        except JobCompleted:
            self._skip(session, job_id, "completed", republish=False)
        except JobFailed:
            self._skip(session, job_id, "failed", republish=False)
        except (BackendUnavailable, LeaseLost) as exc:
            # No answer, or this process's session just ended: the body did not run and
            # the delayed copy asks the store again. A claim that may have been applied
            # (OutcomeUnknown) would stay held by this session while it lives: end the
            # session, so that claim expires in the store and the copy can claim.
            log.warning("%s[%s]: could not claim job %s: %s", self.name, self.request.id,
                        job_id, exc, extra={"job_id": job_id})
            if isinstance(exc, OutcomeUnknown):
                _this_process().discard(session)
            self._skip(session, job_id, "unavailable", republish=True)
        if lease is None:
            self._skip(session, job_id, "held", republish=True)
        token = _current.set(lease)
        try:
            value = self.run(*args, **kwargs)
        except (Retry, Ignore, Reject):
            self._hand_back(session, lease)
            raise
        except Exception as exc:
            if lease.state is LeaseState.LOST:  # e.g. ensure_held() or a fence said so
                self._lost(session, lease, exc)
            try:
                lease.fail(exc)
            except (LeaseLost, BackendUnavailable) as unrecorded:
                self._lost(session, lease, unrecorded)
            raise
        finally:
            _current.reset(token)
        try:
            lease.complete()
        except (LeaseLost, BackendUnavailable) as unrecorded:
            self._lost(session, lease, unrecorded)
        return value

    def _hand_back(self, session: Session, lease: Lease) -> None:
        try:
            lease.release()
        except (LeaseLost, BackendUnavailable) as exc:
            log.warning("could not hand the lease back before the Celery retry: %s", exc,
                        extra={"job_id": lease.job_id, "generation": lease.generation})
            if isinstance(exc, BackendUnavailable):
                _this_process().discard(session)  # its claims then end in the store

    def _republish(self) -> None:
        if self.request.is_eager or self.request.called_directly:
            return
        self.signature_from_request(
            self.request, countdown=self._recheck_s(), retries=self.request.retries,
        ).apply_async()

    def _skip(self, session: Session, job_id: str, reason: str, *, republish: bool
              ) -> NoReturn:
        """Do not run this copy: (publish the delayed re-check,) log, count, ack."""
        if republish:
            self._republish()
        log.info(
            "%s[%s]: not run: job %s %s; acked%s", self.name, self.request.id, job_id,
            {"completed": "is completed", "failed": "is FAILED (attempts ran out)",
             "held": "is held by another worker",
             "unavailable": "could not be claimed (no answer)"}[reason],
            f", re-check in {self._recheck_s()} s" if republish else "",
            extra={"job_id": job_id, "reason": reason},
        )
        store = session.backend.scheme
        notify(session.observer, lambda o: o.delivery_skipped(store, job_id, reason))
        raise Ignore()

    def _lost(self, session: Session, lease: Lease, exc: BaseException) -> NoReturn:
        """The body ran, but its end could not be recorded: the lease was lost (the store
        refused, the session expired), or the store gave no answer (then this process's
        session is closed, so the claim it may still hold ends in the store). The result
        is dropped; a delayed copy finds out by claiming, i.e. by reading the store,
        whether the task must run again."""
        if isinstance(exc, BackendUnavailable):
            _this_process().discard(session)
        self._republish()
        log.error(
            "%s[%s]: job %s: the end of this run was not recorded (%s: %s); its result is "
            "dropped and a copy re-checks in %s s", self.name, self.request.id,
            lease.job_id, type(exc).__name__, exc, self._recheck_s(),
            extra={"job_id": lease.job_id, "generation": lease.generation},
        )
        raise Ignore() from exc
