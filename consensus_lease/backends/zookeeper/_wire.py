"""Round trips to ZooKeeper: pipelined reads, one multi with read-back on a lost answer,
and the shared read client. Every kazoo exception is translated here, and every answer's
zxid is shown to the backend's :class:`._history.History` (a write answered below a zxid
seen before it was sent is a store whose history went back)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from ...errors import AuthenticationFailed, BackendUnavailable, OutcomeUnknown, SessionExpired
from ._errors import KAZOO_ERRORS, translate
from ._options import ZkConfig
from ._session import ZkSession

if TYPE_CHECKING:
    from ._history import History

__all__ = ["READER_SESSION_TIMEOUT_S", "Multi", "Read", "Wire"]

log = logging.getLogger("consensus_lease.backends.zookeeper")

READER_SESSION_TIMEOUT_S = 10.0
"""Session timeout requested for the shared client used by get/records/wait_for_change."""

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
    """The backend's round trips. ``config.timeout_s`` bounds each of them.

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

    def deadline(self) -> float:
        return time.monotonic() + self.config.timeout_s

    def read(
        self, client: KazooClient, reads: Sequence[Read], deadline: float, what: str, *,
        worker: bool = True, job_id: str | None = None,
    ) -> list[Any]:
        """Send every read at once, then collect the answers in order: one round trip of
        latency. A missing node reads as ``None``. ZooKeeper answers one client's requests
        in order, so reads see this client's own earlier writes. Reads after a ``barrier``
        also see every other client's write committed before it; after a ``sync`` only
        on a follower, not on the leader (see :func:`_barrier_async`)."""
        start = {
            "sync": client.sync_async,
            "barrier": lambda path: _barrier_async(client, path),
            "get": client.get_async,
            "exists": client.exists_async,
            "children": client.get_children_async,
            "clock": lambda path: client.set_async(path, b"", -1),
        }
        floor = self.history.highest() if any(k in WRITES for k, _ in reads) else None
        try:
            pending = [start[kind](path) for kind, path in reads]
            out: list[Any] = []
            for result in pending:
                try:
                    out.append(result.get(timeout=max(0.0, deadline - time.monotonic())))
                except NoNodeError:
                    out.append(None)
        except KAZOO_ERRORS as exc:
            raise translate(exc, what, self.hosts, worker_session=worker, job_id=job_id) from exc
        self._answered(client, floor, what)
        return out

    def _answered(self, client: KazooClient, floor: int | None, what: str) -> None:
        """``client`` was answered: show the history its zxid (the answer to a write sent
        when the highest zxid seen was ``floor``, or ``None`` for reads alone). kazoo
        sets ``last_zxid`` before it hands out an answer, and a later answer on the same
        connection (same member, applied in order) only raises it."""
        zxid = int(client.last_zxid or 0)
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
            pending = [client.create_async(path, data, acl=acl) for path, data in nodes]
            for result in pending:
                with contextlib.suppress(NodeExistsError):
                    result.get(timeout=max(0.0, deadline - time.monotonic()))
        except KAZOO_ERRORS as exc:
            raise translate(exc, what, self.hosts) from exc

    def ensure_path(self, client: KazooClient, path: str, what: str, *,
                    worker: bool = True) -> None:
        """Make ``path`` (and its parents) with the configured ACL if missing."""
        try:
            client.ensure_path_async(path, acl=self.config.acl_list()).get(
                timeout=self.config.timeout_s
            )
        except KAZOO_ERRORS as exc:
            raise translate(exc, f"{what}: creating {path}", self.hosts,
                            worker_session=worker) from exc

    def session_read(
        self, h: ZkSession, reads: Sequence[Read], what: str, job_id: str | None = None,
        deadline: float | None = None,
    ) -> list[Any]:
        """Reads on a worker session's client, riding out a connection loss until the
        deadline (reads are safe to repeat)."""
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
        self, h: ZkSession, build: Callable[[Any], None], settle: Callable[[float], bool],
        what: str, job_id: str | None, generation: int | None = None,
    ) -> Multi:
        """Send one multi (``build(transaction)`` adds its operations) on the session's
        client. If its answer is lost (connection loss, timeout, kazoo protocol error) it
        may or may not have been applied: read back with ``settle(deadline) -> applied``
        once the session is connected again, never re-send blindly.

        Raises:
            SessionExpired: the session ended (before sending, or while reading back).
            BackendUnavailable: not connected by the deadline; nothing was sent.
            OutcomeUnknown: reading back could not settle it in time.
        """
        deadline = self.deadline()
        h.wait_connected(deadline)
        transaction = h.client.transaction()
        build(transaction)
        floor = self.history.highest()
        try:
            results = transaction.commit_async().get(
                timeout=max(0.0, deadline - time.monotonic())
            )
        except (ConnectionLoss, KazooTimeoutError, RuntimeError) as exc:
            log.warning("answer to a %s was lost; reading back", what,
                        extra={"job_id": job_id, "session_id": h.session_id})
            return Multi(self._settle(h, settle, what, job_id, generation, exc), [])
        except KAZOO_ERRORS as exc:
            raise translate(exc, what, self.hosts, job_id=job_id, generation=generation) from exc
        self._answered(h.client, floor, what)
        failed = any(isinstance(r, Exception) for r in results)
        return Multi(not failed, list(results))

    def _settle(
        self, h: ZkSession, probe: Callable[[float], bool], what: str, job_id: str | None,
        generation: int | None, cause: BaseException,
    ) -> bool:
        # Once reconnected with the same session, a request still in flight on the old
        # connection is either ordered before the write barrier the probe sends or
        # rejected (the session moved to the new connection), so a read after the
        # barrier is the truth.
        deadline = self.deadline()
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
                        f"reading back failed too: {exc}",
                        job_id=job_id, generation=generation,
                    ) from cause
                threading.Event().wait(0.05)  # back off before asking again

    # -- the shared read client ---------------------------------------------------------------

    def reader(self) -> KazooClient:
        """The backend's one client for get/records/waits (started on first use; kazoo
        opens a new session on it by itself if its session expires)."""
        with self._reader_lock:
            if self._closed:
                raise BackendUnavailable("this ZooKeeper backend is closed")
            if self._reader is None:
                client = self.config.new_client(READER_SESSION_TIMEOUT_S)
                try:
                    client.start(timeout=self.config.connect_timeout_s)
                except KAZOO_ERRORS as exc:
                    raise BackendUnavailable(
                        f"no ZooKeeper member of {self.hosts} answered within "
                        f"{self.config.connect_timeout_s} s"
                    ) from exc
                self._reader = client
            return self._reader

    def reader_read(
        self, reads: Sequence[Read], what: str, job_id: str | None = None
    ) -> list[Any]:
        """Reads on the shared client, retried while it reconnects, until the deadline."""
        client = self.reader()
        deadline = self.deadline()
        while True:
            try:
                return self.read(client, reads, deadline, what, worker=False, job_id=job_id)
            except BackendUnavailable as exc:
                if isinstance(exc, AuthenticationFailed) or time.monotonic() >= deadline:
                    raise
                threading.Event().wait(0.05)  # the client is reconnecting

    def reader_commit(
        self, build: Callable[[Any], None], settle: Callable[[float], bool], what: str,
        job_id: str | None = None,
    ) -> Multi:
        """One multi on the shared client (writes no session owns: enqueue, purge). A lost
        answer is settled as in :meth:`commit`: ``settle(deadline) -> applied``, with reads
        on the shared client (which reconnects, or opens a new session, by itself).

        Raises:
            BackendUnavailable: nothing was applied (or the store refused the multi as a
                whole). OutcomeUnknown: reading back could not settle it in time.
        """
        client = self.reader()
        deadline = self.deadline()
        transaction = client.transaction()
        build(transaction)
        floor = self.history.highest()
        try:
            results = transaction.commit_async().get(
                timeout=max(0.0, deadline - time.monotonic())
            )
        except (ConnectionLoss, KazooTimeoutError, RuntimeError) as exc:
            log.warning("answer to a %s was lost; reading back", what, extra={"job_id": job_id})
            return Multi(self._settle_shared(settle, what, job_id, exc), [])
        except KAZOO_ERRORS as exc:
            raise translate(exc, what, self.hosts, worker_session=False, job_id=job_id) from exc
        self._answered(client, floor, what)
        failed = any(isinstance(r, Exception) for r in results)
        return Multi(not failed, list(results))

    def _settle_shared(
        self, probe: Callable[[float], bool], what: str, job_id: str | None,
        cause: BaseException,
    ) -> bool:
        # A request in flight on a lost connection is ordered before the sync the probe
        # sends after reconnecting, or rejected (session moved, or expired: an expired
        # session's requests are never applied after its expiry).
        deadline = self.deadline()
        while True:
            try:
                return probe(deadline)
            except AuthenticationFailed:
                raise
            except BackendUnavailable as exc:
                if time.monotonic() >= deadline:
                    raise OutcomeUnknown(
                        f"{what}: the answer from ZooKeeper ({self.hosts}) was lost and "
                        f"reading back failed too: {exc}", job_id=job_id,
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


def _stop_quietly(client: KazooClient) -> None:
    try:
        client.stop()
        client.close()
    except KAZOO_ERRORS as exc:
        log.debug("stopping a dropped read client failed", extra={"error": repr(exc)})
