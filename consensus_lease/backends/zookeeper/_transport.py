"""Round trips to ZooKeeper: pipelined reads, one multi with read-back on a lost answer,
and the shared read client. The transport is this module and its parts, the only
modules that name kazoo's exceptions: :mod:`._transport_errors` (their translation into
:mod:`consensus_lease.errors`, used here and by the callers of a failed multi),
:mod:`._transport_multi` (multi requests, and telling a failed multi's results apart),
:mod:`._transport_gate`, :mod:`._transport_paged` and :mod:`._transport_kazoo` (kazoo's
internals). Every answer's zxid is shown to the backend's
:class:`._tokens_history.History` (a write answered below a zxid seen before it was sent
is a store whose history went back).

Time: a public call of the backend runs inside :meth:`Wire.bounded`, which fixes one
deadline, ``timeout_s`` from its start; every round trip it makes (however many chunks a
listing takes, a retry after a lost connection, waiting for a reconnection) ends by it,
and reading back a write whose answer was lost by :data:`SETTLE_GRACE_S` after it. Every
request is started through the client's :class:`._transport_gate.Gate`, so that kazoo itself never
blocks the caller while it reconnects.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from ...errors import (
    AuthenticationFailed,
    BackendUnavailable,
    LeaseError,
    OutcomeUnknown,
    SessionExpired,
)
from ._config import ZkConfig
from ._sessions import ZkSession
from ._transport_errors import KAZOO_ERRORS, translate
from ._transport_gate import Gate
from ._transport_kazoo import last_zxid, send_request
from ._transport_multi import Checked, Transaction

if TYPE_CHECKING:
    from ._tokens_history import History

__all__ = ["READER_SESSION_TIMEOUT_S", "SETTLE_GRACE_S", "Multi", "Read", "Wire"]

log = logging.getLogger("consensus_lease.backends.zookeeper")

READER_SESSION_TIMEOUT_S = 10.0
"""Session timeout requested for the shared client used by get/records/wait_for_change."""

SETTLE_GRACE_S = 1.0
"""How long past a call's deadline reading back a write whose answer was lost may go on
(the answer may have been lost just before the deadline). A public call that writes thus
returns or raises within ``timeout_s`` + this."""

_CALL: ContextVar[tuple[Wire, float] | None] = ContextVar("consensus_lease_zk_call", default=None)
"""The wire and deadline of the public call this thread (or task) is in, if any."""

Read = tuple[str, str]
"""One read: ("sync" | "barrier" | "get" | "exists" | "children" | "clock", path).

``clock`` is a write: ``set_data`` of ``path`` (b"", any version), answered with its
Stat, whose ``mtime`` is the leader's time of that write: the store's clock "now" (see
:func:`clock_ms`). Used on ``{chroot}/jobs``, whose data is unused, and only while a
retry delay may be running."""

WRITES = ("barrier", "clock")
"""The kinds of :data:`Read` that are writes (ordered by the leader, with a new zxid)."""


def clock_ms(stat: Any) -> int:
    """The store's time (ms since the epoch) from a ``clock`` answer.

    ZooKeeper has no call that reads its clock, but every write's ``mtime`` is set by
    the leader that orders it (from its wall clock, in whole ms) and applied unchanged
    by every member. So the mtime of a write sent now is "now" on the store's clock, as
    the failure znode's mtime is the time of the ``fail()`` that wrote it; comparing the
    two never involves a worker's clock. (After a change of leader it is the new
    leader's clock: keep the members' clocks in sync, as for any server.)"""
    return int(stat.mtime)


def _barrier_async(client: KazooClient, path: str) -> Any:
    """Start a write barrier: a multi of one ``check`` of ``path`` at any version.

    It changes no znode, but like any write it is ordered by the leader and applied
    through the quorum (a failing check too: a failed multi is still a transaction), and
    ZooKeeper answers this client's later requests only after applying it. So reads sent
    after it see every write committed before it was ordered, wherever the client is
    connected. A ``sync`` is no such barrier on a client connected to the leader: the
    leader answers it at once, possibly before it has applied a write its followers have
    already applied and answered, or while it is deposed without knowing it yet (then it
    answers from its old state; a barrier there never commits)."""
    transaction = client.transaction()
    transaction.check(path, -1)
    return transaction.commit_async()


@dataclass(frozen=True, slots=True)
class Multi:
    """A multi's outcome: ``applied``, or the per-op results of the failure (empty when the
    answer was lost and reading back showed it was not applied)."""

    applied: bool
    results: list[Any]


class Wire:
    """The backend's round trips. One deadline bounds each public call (:meth:`bounded`).

    Args:
        config: the parsed URL and options.
        history: shown the zxid of every answer (see :meth:`_answered`).
    """

    def __init__(self, config: ZkConfig, history: History) -> None:
        self.config = config
        self.history = history
        self.hosts = config.hosts_text
        self._reader: KazooClient | None = None
        self._reader_lock = threading.Lock()
        self._closed = False
        self._gates: weakref.WeakKeyDictionary[KazooClient, Gate] = weakref.WeakKeyDictionary()
        self._gates_lock = threading.Lock()

    # -- time -----------------------------------------------------------------------------

    @contextmanager
    def bounded(self, budget_s: float | None = None) -> Iterator[float]:
        """Run a public call: every round trip inside (on this thread) ends by one
        deadline, ``budget_s`` (default ``timeout_s``) seconds from now, which it yields
        (``time.monotonic()`` seconds). Inside a call already (a call made by another),
        the outer deadline stays."""
        outer = _CALL.get()
        if outer is not None and outer[0] is self:
            yield outer[1]
            return
        budget = self.config.timeout_s if budget_s is None else budget_s
        deadline = time.monotonic() + budget
        token = _CALL.set((self, deadline))
        try:
            yield deadline
        finally:
            _CALL.reset(token)

    def enter(self, budget_s: float | None = None) -> Token[tuple[Wire, float] | None] | None:
        """Start a public call as :meth:`bounded` does, without a context manager: its
        deadline is set (unless inside a call already: then ``None``, and the outer
        deadline stays). Pass what it returned to :meth:`leave` when the call ends."""
        outer = _CALL.get()
        if outer is not None and outer[0] is self:
            return None
        budget = self.config.timeout_s if budget_s is None else budget_s
        return _CALL.set((self, time.monotonic() + budget))

    @staticmethod
    def leave(token: Token[tuple[Wire, float] | None]) -> None:
        """End a call :meth:`enter` started."""
        _CALL.reset(token)

    def deadline(self) -> float:
        """The current call's deadline (see :meth:`bounded`); outside one, ``timeout_s``
        from now."""
        call = _CALL.get()
        if call is not None and call[0] is self:
            return call[1]
        return time.monotonic() + self.config.timeout_s

    def gate(self, client: KazooClient) -> Gate:
        """The gate every request to ``client`` is started through."""
        gate = self._gates.get(client)  # made once per client: look without the lock
        if gate is not None:
            return gate
        with self._gates_lock:
            gate = self._gates.get(client)
            if gate is None:
                gate = self._gates[client] = Gate(client)
            return gate

    def _error(self, exc: BaseException, what: str, *, worker: bool = True,
               job_id: str | None = None, generation: int | None = None) -> LeaseError:
        return translate(exc, what, self.hosts, worker_session=worker, job_id=job_id,
                         generation=generation, timeout_s=self.config.timeout_s)

    # -- round trips ------------------------------------------------------------------------

    def read(
        self, client: KazooClient, reads: Sequence[Read], deadline: float, what: str, *,
        worker: bool = True, job_id: str | None = None,
    ) -> list[Any]:
        """Send every read at once (at most :data:`._transport_gate.IN_FLIGHT` unanswered), then
        collect the answers in order: one round trip of latency. Ends by ``deadline``. A
        missing node reads as ``None``. ZooKeeper answers one client's requests in order,
        so reads see this client's own earlier writes. Reads after a ``barrier`` also see
        every other client's write committed before it; after a ``sync`` only on a
        follower, not on the leader (see :func:`_barrier_async`)."""
        start: dict[str, Callable[[str], Any]] = {
            "sync": client.sync_async,
            "barrier": partial(_barrier_async, client),
            "get": client.get_async,
            "exists": client.exists_async,
            "children": client.get_children_async,
            "clock": lambda path: client.set_async(path, b"", -1),
        }
        floor = self.history.highest() if any(k in WRITES for k, _ in reads) else None
        gate = self.gate(client)
        try:
            pending = [gate.start(partial(start[kind], path), deadline) for kind, path in reads]
            out: list[Any] = []
            for result in pending:
                try:
                    out.append(result.get(timeout=max(0.0, deadline - time.monotonic())))
                except NoNodeError:
                    out.append(None)
        except KAZOO_ERRORS as exc:
            raise self._error(exc, what, worker=worker, job_id=job_id) from exc
        self._answered(client, floor, what)
        return out

    def checks(
        self, h: ZkSession, versions: Sequence[tuple[str, int]], deadline: float, what: str
    ) -> bool | None:
        """One multi of ``check``s on the session's client (it changes nothing, but like
        any write it is ordered by the leader and answered once the quorum committed it):
        ``True`` if every ``(path, version)`` holds, ``False`` if one does not, ``None``
        if no answer came by ``deadline`` (not connected, connection lost, any kazoo
        error): a read then says how things are."""
        request = Transaction(h.client)
        for path, version in versions:
            request.check(path, version)
        floor = self.history.highest()
        try:
            results = self.gate(h.client).start(partial(send_request, h.client, request),
                                                deadline).get(
                timeout=max(0.0, deadline - time.monotonic()))
        except KAZOO_ERRORS:
            return None
        self._answered(h.client, floor, what)
        return not any(isinstance(r, Exception) for r in results)

    def _answered(self, client: KazooClient, floor: int | None, what: str) -> None:
        """``client`` was answered: show the history its zxid (the answer to a write sent
        when the highest zxid seen was ``floor``, or ``None`` for reads alone). kazoo
        sets it (:func:`._transport_kazoo.last_zxid`) before it hands out an answer, and a later
        answer on the same connection (same member, applied in order) only raises it."""
        zxid = last_zxid(client)
        if floor is None:
            self.history.saw(zxid)
        else:
            self.history.answered(zxid, floor, what)

    def create_missing(self, client: KazooClient, nodes: Sequence[tuple[str, bytes]],
                       what: str) -> None:
        """Create each ``(path, data)`` with the configured ACL unless it exists, in one
        pipelined round trip (a node made meanwhile by someone else is fine)."""
        acl = self.config.acl_list()
        deadline = self.deadline()
        try:
            gate = self.gate(client)
            pending = [gate.start(partial(client.create_async, path, data, acl=acl), deadline)
                       for path, data in nodes]
            for result in pending:
                with contextlib.suppress(NodeExistsError):
                    result.get(timeout=max(0.0, deadline - time.monotonic()))
        except KAZOO_ERRORS as exc:
            raise self._error(exc, what, worker=False) from exc

    def ensure_path(self, client: KazooClient, path: str, what: str, *,
                    worker: bool = True) -> None:
        """Make ``path`` (and its parents) with the configured ACL if missing, by the
        current call's deadline."""
        deadline = self.deadline()
        try:
            self.gate(client).start(
                partial(client.ensure_path_async, path, acl=self.config.acl_list()), deadline
            ).get(timeout=max(0.0, deadline - time.monotonic()))
        except KAZOO_ERRORS as exc:
            raise self._error(exc, f"{what}: creating {path}", worker=worker) from exc

    def session_read(
        self, h: ZkSession, reads: Sequence[Read], what: str, job_id: str | None = None,
        deadline: float | None = None,
    ) -> list[Any]:
        """Reads on a worker session's client, riding out a connection loss until the
        deadline (default: the call's; reads are safe to repeat)."""
        deadline = self.deadline() if deadline is None else deadline
        while True:
            h.wait_connected(deadline)
            try:
                out = self.read(h.client, reads, deadline, what, job_id=job_id)
            except BackendUnavailable as exc:
                if not isinstance(exc.__cause__, ConnectionLoss) or time.monotonic() >= deadline:
                    raise
                continue
            h.check_alive()
            return out

    def commit(
        self, h: ZkSession, build: Callable[[Transaction], None], settle: Callable[[float], bool],
        what: str, job_id: str | None, generation: int | None = None,
    ) -> Multi:
        """Send one multi (``build(request)`` adds its operations to a
        :class:`._transport_multi.Transaction`) on the session's client. If its answer is
        lost (connection loss, timeout, kazoo protocol error) it may or may not have been
        applied: read back with ``settle(deadline) -> applied`` once the session is
        connected again, never re-send blindly. Sent by the call's deadline; read back by
        :data:`SETTLE_GRACE_S` after it.

        Raises:
            TokenSpaceExhausted: a version out of range (see
                :func:`._transport_multi.wire_version`); nothing was sent.
            SessionExpired: the session ended (before sending, or while reading back).
            BackendUnavailable: not connected by the deadline; nothing was sent.
            OutcomeUnknown: reading back could not settle it in time.
        """
        deadline = self.deadline()
        h.wait_connected(deadline)
        request = Transaction(h.client)
        build(request)
        floor = self.history.highest()
        try:
            pending = self.gate(h.client).start(partial(send_request, h.client, request), deadline)
        except KAZOO_ERRORS as exc:
            raise self._error(exc, what, job_id=job_id, generation=generation) from exc
        try:
            results = pending.get(timeout=max(0.0, deadline - time.monotonic()))
        except (ConnectionLoss, KazooTimeoutError, RuntimeError) as exc:
            log.warning("answer to a %s was lost; reading back", what,
                        extra={"job_id": job_id, "session_id": h.session_id})
            applied = self._settle(h, settle, what, job_id, generation, exc,
                                   deadline + SETTLE_GRACE_S)
            return Multi(applied, [])
        except KAZOO_ERRORS as exc:
            raise self._error(exc, what, job_id=job_id, generation=generation) from exc
        self._answered(h.client, floor, what)
        return _outcome(results)

    def _settle(
        self, h: ZkSession, probe: Callable[[float], bool], what: str, job_id: str | None,
        generation: int | None, cause: BaseException, deadline: float,
    ) -> bool:
        # Once reconnected with the same session, a request still in flight on the old
        # connection is either ordered before the write barrier the probe sends or
        # rejected (the session moved to the new connection), so a read after the
        # barrier is the truth.
        while True:
            try:
                h.wait_connected(deadline)
                return probe(deadline)
            except (SessionExpired, AuthenticationFailed):
                raise
            except BackendUnavailable as exc:
                if time.monotonic() >= deadline:
                    raise OutcomeUnknown(
                        f"{what}: the answer from ZooKeeper ({self.hosts}) was lost and "
                        f"reading back failed too within timeout_s "
                        f"({self.config.timeout_s:g} s): {exc}",
                        job_id=job_id, generation=generation,
                    ) from cause
                threading.Event().wait(0.05)  # back off before asking again

    # -- the shared read client ---------------------------------------------------------------

    def reader(self, deadline: float | None = None) -> KazooClient:
        """The backend's one client for get/records/waits, started on first use (by
        ``deadline``, default the call's; kazoo opens a new session on it by itself if
        its session expires)."""
        deadline = self.deadline() if deadline is None else deadline
        if not self._reader_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise BackendUnavailable(
                f"the ZooKeeper read client ({self.hosts}) was still connecting at the "
                f"deadline (timeout_s={self.config.timeout_s:g} s)"
            )
        try:
            if self._closed:
                raise BackendUnavailable("this ZooKeeper backend is closed")
            if self._reader is None:
                wait_s = min(self.config.connect_timeout_s, deadline - time.monotonic())
                client = self.config.new_client(READER_SESSION_TIMEOUT_S)
                try:
                    client.start(timeout=max(0.0, wait_s))
                except KAZOO_ERRORS as exc:
                    raise BackendUnavailable(
                        f"no ZooKeeper member of {self.hosts} answered within "
                        f"{max(0.0, wait_s):.3g} s (connect_timeout_s="
                        f"{self.config.connect_timeout_s:g}, timeout_s={self.config.timeout_s:g})"
                    ) from exc
                self._reader = client
            return self._reader
        finally:
            self._reader_lock.release()

    def reader_read(
        self, reads: Sequence[Read], what: str, job_id: str | None = None,
        deadline: float | None = None,
    ) -> list[Any]:
        """Reads on the shared client, retried while it reconnects, until the deadline
        (default: the call's)."""
        deadline = self.deadline() if deadline is None else deadline
        client = self.reader(deadline)
        while True:
            try:
                return self.read(client, reads, deadline, what, worker=False, job_id=job_id)
            except BackendUnavailable as exc:
                left = deadline - time.monotonic()
                if isinstance(exc, AuthenticationFailed) or left <= 0:
                    raise
                threading.Event().wait(min(left, 0.05))  # the client is reconnecting

    def reader_commit(
        self, build: Callable[[Any], None], settle: Callable[[float], bool], what: str,
        job_id: str | None = None,
    ) -> Multi:
        """One multi on the shared client (writes no session owns: enqueue, purge).
        ``build`` gets a :class:`._transport_multi.Checked` (versions ``None``: any). A lost
        answer is settled as in :meth:`commit`: ``settle(deadline) -> applied``, with reads
        on the shared client (which reconnects, or opens a new session, by itself).

        Raises:
            BackendUnavailable: nothing was applied (or the store refused the multi as a
                whole). OutcomeUnknown: reading back could not settle it in time.
            TokenSpaceExhausted: a version out of range; nothing was sent.
        """
        deadline = self.deadline()
        client = self.reader(deadline)
        transaction = client.transaction()
        build(Checked(transaction))  # every version in range before anything is sent
        floor = self.history.highest()
        try:
            pending = self.gate(client).start(transaction.commit_async, deadline)
        except KAZOO_ERRORS as exc:
            raise self._error(exc, what, worker=False, job_id=job_id) from exc
        try:
            results = pending.get(timeout=max(0.0, deadline - time.monotonic()))
        except (ConnectionLoss, KazooTimeoutError, RuntimeError) as exc:
            log.warning("answer to a %s was lost; reading back", what, extra={"job_id": job_id})
            applied = self._settle_shared(settle, what, job_id, exc, deadline + SETTLE_GRACE_S)
            return Multi(applied, [])
        except KAZOO_ERRORS as exc:
            raise self._error(exc, what, worker=False, job_id=job_id) from exc
        self._answered(client, floor, what)
        return _outcome(results)

    def _settle_shared(
        self, probe: Callable[[float], bool], what: str, job_id: str | None,
        cause: BaseException, deadline: float,
    ) -> bool:
        # A request in flight on a lost connection is ordered before the sync the probe
        # sends after reconnecting, or rejected (session moved, or expired: an expired
        # session's requests are never applied after its expiry).
        while True:
            try:
                return probe(deadline)
            except AuthenticationFailed:
                raise
            except BackendUnavailable as exc:
                if time.monotonic() >= deadline:
                    raise OutcomeUnknown(
                        f"{what}: the answer from ZooKeeper ({self.hosts}) was lost and "
                        f"reading back failed too within timeout_s "
                        f"({self.config.timeout_s:g} s): {exc}", job_id=job_id,
                    ) from cause
                threading.Event().wait(0.05)  # the client is reconnecting

    def reset_reader(self) -> None:
        """Drop the shared client (stopped in the background): the next use starts a
        fresh one. After a regression: the old one has seen zxids the store no longer
        has, and ZooKeeper would refuse it."""
        with self._reader_lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            threading.Thread(target=_stop_quietly, args=(reader,), daemon=True,
                             name="zk-reader-stop").start()

    def close(self) -> None:
        with self._reader_lock:
            self._closed = True
            reader, self._reader = self._reader, None
        if reader is not None:
            try:
                reader.stop()
                reader.close()
            except KAZOO_ERRORS as exc:
                raise BackendUnavailable(f"stopping the read client: {exc!r}") from exc


def _outcome(results: list[Any]) -> Multi:
    """The :class:`Multi` of an answered multi's per-op ``results``."""
    for result in results:
        if isinstance(result, Exception):
            return Multi(False, list(results))
    return Multi(True, list(results))


def _stop_quietly(client: KazooClient) -> None:
    try:
        client.stop()
        client.close()
    except KAZOO_ERRORS as exc:
        log.debug("stopping a dropped read client failed", extra={"error": repr(exc)})
