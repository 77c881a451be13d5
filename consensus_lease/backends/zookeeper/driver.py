"""The ZooKeeper driver class: every public Backend method, and the capabilities. The
protocol, the guarantees relied on and the options are in the package docstring.

The methods delegate to the driver template's modules (see
:mod:`consensus_lease.backends`): the URL to :mod:`._config`; kazoo, the round trips and
the translation of kazoo's exceptions to :mod:`._transport` and its parts; the session
handle to :mod:`._sessions`; claims to :mod:`._jobs_claim`, renew, complete, release and
fail to :mod:`._jobs`, the lifecycle (``requeue``, the store's clock) to
:mod:`._jobs_lifecycle`, ``set_value`` to :mod:`._jobs_value`; work queues to
:mod:`._queues` (their batch and fused claims to :mod:`._queues_claim`); waits and
subscriptions to :mod:`._watches` and :mod:`._watches_subscribe`; the epoch and
regressions to :mod:`._tokens` and :mod:`._tokens_history`. Kept here (not yet moved to
those modules): ``keepalive`` and opening a session (the store's identity and epoch read
with it), ``get`` and ``records``, the grouping of ``complete_many``, ``release_many``
and ``fail_many``,
``upgrade_queue``'s layout check, the test hook ``expire_session``, and the regression
marker written when a regression is noticed."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Concatenate, ParamSpec, TypeVar

from ..._election import is_election_key
from ..._subscriptions import Unsubscribe, WakeCallback
from ...backend import (
    Backend,
    Capabilities,
    CompleteItem,
    FailItem,
    QueuePick,
    ReleaseItem,
    SessionHandle,
    StateListener,
)
from ...errors import (
    BackendUnavailable,
    InvalidArgument,
    JobCompleted,
    JobFailed,
    LeaseError,
    OutcomeUnknown,
    SessionExpired,
    StaleLeaseError,
    StoreRegressed,
    TokenSpaceExhausted,
)
from ...record import ClaimResult, EnqueueItem, LeaseRecord, QueuedJob, QueueStats
from .._groups import size_groups
from ._config import ZkConfig, parse_url
from ._jobs import Hold, Holds
from ._jobs_claim import Claims
from ._jobs_known import Released
from ._jobs_lifecycle import Lifecycle
from ._jobs_value import Values
from ._layout import (
    EPOCH_SHIFT,
    JobPaths,
    QueueHead,
    decode_name,
    job_paths,
    split_token,
    to_record,
)
from ._queues import (
    ENQUEUE_BATCH,
    MAX_PAYLOAD_BYTES,
    MAX_QUEUE_JOBS,
    Queues,
)
from ._queues_claim import QueueClaims
from ._sessions import NegotiatedTimeouts, Status, ZkSession
from ._tokens import Epochs
from ._tokens_history import (
    KEEPALIVE_FRACTION,
    History,
    Prober,
    marker_error,
    new_identity,
    parse_marker,
)
from ._transport import Read, Wire
from ._transport_errors import KAZOO_ERRORS
from ._transport_kazoo import SharedPollHandler, check_installed, last_zxid
from ._transport_reconnect import ReconnectPacer
from ._watches import OwnerWatches
from ._watches_subscribe import JOB, QUEUE, Subscriptions

__all__ = ["ZooKeeperBackend"]

log = logging.getLogger("consensus_lease.backends.zookeeper")

READ_CHUNK = 256
"""Reads pipelined at once by records()."""

MAX_BATCH_CLAIM = 128
"""Claims per ``claim_many`` multi (as ``max_enqueue_batch``): about 50 KB with short
ids; ``Claims.size_chunks`` splits further by size."""

MAX_COMPLETE_BATCH = 128
"""Completions per ``complete_many`` call (``capabilities.max_complete_batch``); split
further into multis of at most :data:`END_MULTI_BYTES`."""

MAX_END_BATCH = 128
"""Releases or failures per ``release_many`` / ``fail_many`` call
(``capabilities.max_end_batch``); split further into multis of at most
:data:`END_MULTI_BYTES`."""

END_MULTI_BYTES = 160 * 1024
"""Most bytes of results or error texts (plus about 512 per item for paths and records)
one ``complete_many``, ``release_many`` or ``fail_many`` multi carries: every server
keeps its last writes whole in memory, as for the enqueue multis."""

_ITEM_BYTES = 512
"""What one item of those multis is counted for beside its result or error text."""

_I = TypeVar("_I", bound=tuple[Any, ...])
_O = TypeVar("_O")

PATHS_CACHED = 4096
"""Job ids whose znode paths are kept built (the ids most recently used)."""

EXPIRY_NOTICE_S = 0.25
"""How long ``expire_session`` waits for the session's client to see the server close
the session before ending it from that client itself: well inside the shortest local
deadline tests use (a 1 s TTL less its margin)."""

_WAIT_ERRORS: tuple[type[BaseException], ...] = (LeaseError, *KAZOO_ERRORS)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _bounded(
    method: Callable[Concatenate[ZooKeeperBackend, _P], _R],
) -> Callable[Concatenate[ZooKeeperBackend, _P], _R]:
    """A public call: every round trip it makes ends by one deadline, ``timeout_s`` from
    its start (reading back a lost answer, ``SETTLE_GRACE_S`` later); see
    :meth:`._transport.Wire.bounded`."""

    @functools.wraps(method)
    def call(self: ZooKeeperBackend, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        # Wire.enter/leave rather than ``with Wire.bounded()``: no generator per call.
        entered = self._wire.enter()
        try:
            return method(self, *args, **kwargs)
        finally:
            if entered is not None:
                self._wire.leave(entered)

    return call


def quiet_kazoo_by_default() -> None:
    """kazoo logs each failed connection attempt at WARNING (a refused ``open_store``
    makes some twenty "Connection dropped" lines), and with no logging configured Python
    prints them on stderr (``logging.lastResort``). What matters reaches the caller as
    ``BackendUnavailable``. So, unless the application gave the ``kazoo`` logger
    handlers of its own, it gets a ``NullHandler``: nothing is printed by default, and
    handlers the application sets up (on the root logger too) still get every record."""
    kazoo_log = logging.getLogger("kazoo")
    if not kazoo_log.handlers:
        kazoo_log.addHandler(logging.NullHandler())


quiet_kazoo_by_default()


class _concerning:  # used as a function: ``with _concerning(...)``
    """Attach the job (and generation) to any library error raised without them. (A
    class, not a generator-based context manager: cheaper on every call.)

    With ``holds``, ``h`` and ``paths`` (a call on a hold of ``h``), a SessionExpired
    is first checked against the store (:meth:`Holds.after_expiry`): StaleLeaseError
    instead if another session claimed or completed the job since, the rule of
    :meth:`Backend.complete`."""

    __slots__ = ("generation", "h", "holds", "job_id", "paths", "what")

    def __init__(
        self, job_id: str, generation: int | None = None, holds: Holds | None = None,
        h: ZkSession | None = None, paths: JobPaths | None = None, what: str = "",
    ) -> None:
        self.job_id = job_id
        self.generation = generation
        self.holds, self.h, self.paths, self.what = holds, h, paths, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, LeaseError):
            if exc.job_id is None:
                exc.job_id = self.job_id
            if exc.generation is None:
                exc.generation = self.generation
            if isinstance(exc, SessionExpired) and self.holds is not None:
                self._explain(exc)

    def _explain(self, expired: SessionExpired) -> None:
        assert self.holds is not None and self.h is not None and self.paths is not None
        assert self.generation is not None
        done = self.holds.after_expiry(self.h, self.paths, self.generation, expired, self.what)
        if done is not None:  # this session completed it at this generation
            raise StaleLeaseError(
                f"{self.what}: {self.job_id!r} is completed (by this session, at "
                f"generation {self.generation})", job_id=self.job_id,
                generation=self.generation, current_generation=self.generation,
            ) from expired


def _checked(claim: object) -> ClaimResult:
    """``claim`` as given to renew/complete/release, refused unless a ClaimResult."""
    if not isinstance(claim, ClaimResult):
        raise InvalidArgument(
            f"expected the ClaimResult a claim returned (or ClaimResult(generation) for a "
            f"claim this process did not make), got {claim!r}"
        )
    return claim


class ZooKeeperBackend(Backend):
    """Leases on a ZooKeeper ensemble, through kazoo. See the package docstring.

    Args:
        config: parsed URL and options (use :func:`consensus_lease.open_store`).
    """

    scheme: ClassVar[str] = "zk"
    epoch_shift: ClassVar[int] = EPOCH_SHIFT
    capabilities: ClassVar[Capabilities] = Capabilities(
        cross_process=True,
        store_watch=True,
        consecutive_generations=True,
        min_ttl_s=0.2,
        max_ttl_s=24 * 3600.0,
        max_batch_claim=MAX_BATCH_CLAIM,
        queues=True,
        max_payload_bytes=MAX_PAYLOAD_BYTES,
        description="ZooKeeper (kazoo): session per worker, ephemeral owner znodes, "
        "job znode version as fencing token",
        epoch=True,
        regression_refusal=True,
        elections=True,
        max_enqueue_batch=ENQUEUE_BATCH,
        max_queue_jobs=MAX_QUEUE_JOBS,
        max_complete_batch=MAX_COMPLETE_BATCH,
        fused_claim_next=True,
        max_queue_claim_batch=MAX_BATCH_CLAIM,
        max_end_batch=MAX_END_BATCH,
    )

    def __init__(self, config: ZkConfig) -> None:
        self.config = config
        self.hosts = config.hosts_text
        # Every call builds a job's paths (percent-encoding): the hot ones are cached.
        self._job_paths = functools.lru_cache(maxsize=PATHS_CACHED)(
            functools.partial(job_paths, config.base, config.elections_base))
        self._history = History(self.hosts, self._on_regressed)
        self._wire = Wire(config, self._history)
        self._epochs = Epochs(self._wire, self._history)
        self._prober = Prober(self._wire, self._history, self._disconnected)
        self.reconnects = ReconnectPacer()
        """The reconnection turns of the session clients while none is connected (see
        :mod:`._transport_reconnect`)."""
        self._session_handler = SharedPollHandler(sleep_func=self.reconnects.sleep)
        """The worker threads of every session's kazoo client, and the sleep of their
        reconnection (see :class:`._transport_kazoo.SharedPollHandler`)."""
        self._lifecycle = Lifecycle(self._wire, self._paths)
        self._subs = Subscriptions(self._wire, self._paths)
        self._lifecycle.hints = self._subs.hints  # delay ends noted wake the subscribers
        self._claims = Claims(
            self._wire, self._paths, lambda h: self._ensure_base(h, again=True),
            self._lifecycle, self._epochs,
        )
        self._holds = Holds(self._wire)
        self._values = Values(self._wire)
        self._queues = Queues(self._wire, self._paths, self._lifecycle.hints)
        self._subs.queue_target = self._queues.watch_target
        self._queue_claims = QueueClaims(self._wire, self._claims, self._holds, self._queues,
                                         self._epochs)
        self._watches = OwnerWatches()
        self._lock = threading.Lock()
        self._sessions: dict[str, ZkSession] = {}
        self._closed = False
        self._base_ready = False

    @classmethod
    def from_url(cls, url: str, options: Mapping[str, object]) -> ZooKeeperBackend:
        """Parse the URL and options, and connect: start the backend's shared client (a
        ZooKeeper session of its own, used for reads and waits), waiting at most
        ``connect_timeout_s``, as etcd's ``open_store`` does.

        The installed kazoo is checked first (:func:`._transport_kazoo.check_installed`).

        Raises:
            UnsupportedBackend: malformed URL; or the installed kazoo lacks an internal
                this driver relies on (nothing was connected). InvalidArgument: unknown
                or bad option.
            BackendUnavailable: no member answered within ``connect_timeout_s`` (or the
                TLS handshake kept failing).

        Warns:
            UntestedKazooWarning: the installed kazoo is outside the tested range
                (``_transport_kazoo.TESTED_SPEC``, the pin in pyproject.toml).
        """
        check_installed()
        backend = cls(parse_url(url, options))
        try:
            backend._wire.reader()
        except BaseException:
            backend.close()
            raise
        return backend

    def __repr__(self) -> str:
        return f"ZooKeeperBackend(hosts={self.hosts!r}, chroot={self.config.chroot!r})"

    def _handle(self, session: SessionHandle) -> ZkSession:
        if not isinstance(session, ZkSession):
            raise InvalidArgument(f"{session!r} is not a session of this ZooKeeper backend")
        return session

    def _paths(self, job_id: str) -> JobPaths:
        """A job's znodes under ``{chroot}/jobs``, an election key's under
        ``{chroot}/elections`` (see :mod:`._layout`)."""
        return self._job_paths(job_id)

    # -- sessions --------------------------------------------------------------------------

    def open_session(
        self, owner: str, ttl_s: float, on_event: StateListener | None = None
    ) -> SessionHandle:
        """Open one ZooKeeper session (its own kazoo client) requesting ``ttl_s`` seconds
        as session timeout. ``granted_ttl_s`` is what the server negotiated (clamped to
        its [minSessionTimeout, maxSessionTimeout], by default 2-20 x tickTime).

        Raises:
            BackendUnavailable: no member answered within ``connect_timeout_s``, or the
                new session expired before it was ready (a busy host); nothing was
                created.
            AuthenticationFailed: the credentials do not grant access to the chroot.
            StoreRegressed: the store's history went back; no session was created.
        """
        with self._lock:
            if self._closed:
                raise BackendUnavailable("this ZooKeeper backend is closed")
        timeouts = NegotiatedTimeouts()
        client = self.config.new_client(ttl_s, logger=timeouts, handler=self._session_handler)
        sleeper = self.reconnects.follow(client)
        h = ZkSession(owner, client, timeouts, on_event, self.hosts)
        h.before_stop = sleeper.cancel
        h.on_disconnected = self._prober.wake
        h.explain_loss = self._explain_loss
        try:
            client.start(timeout=self.config.connect_timeout_s)
        except KAZOO_ERRORS as exc:  # kazoo stops and closes the client itself
            h.mark_closed()
            raise BackendUnavailable(
                f"no ZooKeeper member of {self.hosts} answered within "
                f"{self.config.connect_timeout_s:g} s"
            ) from exc
        try:
            h.connected(ttl_s)
            self._open_store(h)
        except BaseException as exc:
            h.mark_closed()
            h._stop_quietly()
            if isinstance(exc, SessionExpired) and not isinstance(exc, StoreRegressed):
                # expired before it was ready (a busy host): no session was created,
                # as the contract says of every failed open
                raise BackendUnavailable(f"opening a session: {exc}") from exc
            raise
        with self._lock:
            self._sessions[h.session_id] = h
        regressed = self._history.error()  # noticed while it was being opened
        if regressed is not None:
            self.close_session(h)
            raise regressed
        return h

    def _open_store(self, h: ZkSession) -> None:
        """Read the store's identity and epoch after a write barrier, in one round trip
        (see :mod:`._tokens_history`).
        On the backend's first session (and after a regression) make sure of
        ``{chroot}/jobs`` first, and make ``identity`` and ``epoch`` (at 0) if the store
        has none yet.

        Raises:
            StoreRegressed: the identity is gone or another one, the epoch went back; or
                the backend had found the history gone back and the epoch has not been
                raised since (``bump_epoch``).
        """
        what = "opening a session"
        config = self.config
        # After a write barrier: a member lagging behind the identity's creation (or a
        # bump) must not look like a store that lost them.
        reads: list[Read] = [("barrier", config.base), ("get", config.identity_node),
                             ("get", config.epoch_node), ("get", config.regressed_node)]
        first = not self._base_ready or self._history.regressed
        if first:
            self._wire.ensure_path(h.client, config.base, what)
        identity, epoch, marker = self._wire.session_read(h, reads, what)[1:]
        if first and (identity is None or epoch is None):  # a store never used: make them
            missing = [(config.identity_node, new_identity())] if identity is None else []
            missing += [(config.epoch_node, b"0")] if epoch is None else []
            self._wire.create_missing(h.client, missing, what)
            identity, epoch, marker = self._wire.session_read(h, reads, what)[1:]
        self._base_ready = True
        mark, now_epoch = parse_marker(marker), self._epochs.parse(epoch)
        if mark is not None and mark[0] >= (0 if now_epoch is None else now_epoch[0]):
            raise marker_error(self.hosts, mark[1])  # noticed elsewhere; no bump since
        if self._history.regressed:
            now = self._epochs.parse(epoch)
            if now is None or not self._history.recover(now, identity, last_zxid(h.client)):
                raise self._regressed_error()
            return
        self._history.identity_seen(identity, what)
        if epoch is None:
            self._history.epoch_gone(what)  # deleted since: a claim makes it again at 0
        else:
            self._epochs.learned(epoch, what)
        if self._history.regressed:
            raise self._regressed_error()

    def _regressed_error(self) -> StoreRegressed:
        error = self._history.error()
        assert error is not None
        return error

    def _on_regressed(self, error: StoreRegressed) -> None:
        """The store's history went back: end every session with it (each reports it to
        the core as an expiry; its client is stopped, which hands its jobs back), and
        drop the shared client (it has seen zxids the store no longer has)."""
        self._claims.known.clear()  # job znodes may hold other data at the same versions
        with self._lock:
            sessions = list(self._sessions.values())
        for h in sessions:
            h.expire_locally(str(error), StoreRegressed(str(error)))
        self._wire.reset_reader()
        threading.Thread(target=self._write_marker, args=(str(error),),
                         name="zk-regression-marker", daemon=True).start()

    def _write_marker(self, why: str) -> None:
        """Write ``{chroot}/regressed`` (see :mod:`._tokens_history`) at the store's epoch, in
        one multi checking the epoch znode's version; nothing if the epoch was raised
        since the regression was noticed. Best effort (a warning if it fails)."""
        config, what = self.config, "writing the regression marker"
        try:
            known = self._history.regressed_epoch()
            _, epoch, marker = self._wire.reader_read(
                [("barrier", config.base), ("get", config.epoch_node),
                 ("get", config.regressed_node)], what)
            now = self._epochs.parse(epoch)
            if known is None or now is None or now[0] > known:
                return  # bumped since (or nothing to mark against)
            data = f"{now[0]} {why}".encode()[:4096]

            def build(tx: Any) -> None:
                tx.check(config.epoch_node, now[1])
                if marker is None:
                    tx.create(config.regressed_node, data)
                else:
                    tx.set_data(config.regressed_node, data, marker[1].version)

            def settle(deadline: float) -> bool:
                found = self._wire.reader_read([("get", config.regressed_node)], what,
                                               deadline=deadline)[0]
                return found is not None and found[0] == data

            multi = self._wire.reader_commit(build, settle, what)
            if multi.applied:
                log.error("regression marker written: every backend opened on this store "
                          "refuses sessions until bump-epoch", extra={"epoch": now[0]})
        except Exception as exc:  # a background thread: tell, never raise
            log.warning("writing the regression marker failed; backends opened later may "
                        "not refuse sessions", extra={"error": repr(exc)})

    def _disconnected(self) -> list[tuple[float, float]]:
        """``(since, granted_ttl_s)`` of each session now disconnected (for the prober)."""
        with self._lock:
            sessions = list(self._sessions.values())
        out: list[tuple[float, float]] = []
        for h in sessions:
            since = h.disconnected_since
            if since is not None and h.status is Status.SUSPENDED:
                out.append((since, h.granted_ttl_s))
        return out

    def _explain_loss(self) -> SessionExpired | None:
        """Before an expiry ZooKeeper reported is passed on: did the store's history go
        back (then the session could not but expire)? One probe."""
        self._prober.probe(time.monotonic())
        return self._history.error()

    def _ensure_base(self, h: ZkSession, again: bool = False) -> None:
        """Create ``{chroot}/jobs`` (and the chroot) with the configured ACL: once, or
        ``again`` when a claim found it deleted."""
        if self._base_ready and not again:
            return
        self._wire.ensure_path(h.client, self.config.base, "claim" if again else "open_session")
        self._base_ready = True

    @_bounded
    def keepalive(self, session: SessionHandle) -> float:
        """One write barrier (a multi of one ``check``, changing nothing) on the session's
        own connection: it must commit through the quorum, so its answer proves the
        *current* leader had the session alive. (A ``sync`` would not: a deposed leader
        that has not noticed yet answers it from its old state, and the local deadline
        would be extended past an expiry the ensemble already decided.) Also hands
        back owner znodes of claims whose outcome had been unknown.

        In the same round trip, at most once per keepalive interval per backend and
        after a reconnect, it reads the store's identity; the barrier's answer is also
        compared with the highest zxid seen (see :mod:`._tokens_history`).

        Returns the negotiated session timeout (seconds).

        Raises:
            SessionExpired: the session expired or was ended. Final.
            StoreRegressed: the store's history went back (wiped or restored). Final.
            BackendUnavailable: disconnected or no answer; the session may still be alive.
        """
        h = self._handle(session)
        h.check_alive()
        if h.status is not Status.CONNECTED:
            raise BackendUnavailable(f"ZooKeeper session {h.session_id} is disconnected "
                                     f"from {self.hosts}")
        send = time.monotonic()
        deadline = send + min(self.config.timeout_s, max(1.0, h.granted_ttl_s))
        reads: list[Read] = [("barrier", self.config.base)]
        identity = h.recheck_identity or self._history.identity_due(
            h.granted_ttl_s * KEEPALIVE_FRACTION)
        if identity:
            reads.append(("get", self.config.identity_node))
        answers = self._wire.read(h.client, reads, deadline, "keepalive")
        if identity:
            h.recheck_identity = False
            self._history.identity_seen(answers[1], "keepalive")
        h.check_alive()
        if h.uncertain:
            self._claims.hand_back_uncertain(h, self.release)
        return h.current_ttl_s()

    def close_session(self, session: SessionHandle) -> None:
        """Close the ZooKeeper session: the server deletes its owner znodes at once, so
        its jobs are claimable immediately. Idempotent; if no member can be reached the
        server expires the session after its timeout instead.

        kazoo pings on its own, so a session nobody closes lives as long as its process:
        the core calls this when a session's local deadline passes without a successful
        renewal (or the session is lost otherwise), as well as on ``Session.close()``.

        Raises:
            BackendUnavailable: kazoo could not stop the client cleanly (the session
                still ends, at the latest when its timeout passes).
        """
        h = self._handle(session)
        with self._lock:
            self._sessions.pop(h.session_id, None)
        h.mark_closed()
        h.stop_client()

    def expire_session(self, session_id: str, timeout_s: float = 30.0) -> None:
        """Test hook: make the ensemble expire a session now, as its timeout would.

        kazoo's own testing approach: a second client connects with the same session id
        and password and closes the session; the server deletes its ephemeral znodes and
        the session's own client then finds it expired. Waits (bounded by ``timeout_s``)
        until the session's client has seen the expiry, so the next call raises
        ``SessionExpired``.
        """
        with self._lock:
            h = self._sessions.get(session_id)
        live = h is not None and h.status in (Status.CONNECTED, Status.SUSPENDED)
        if h is None or not live:
            return
        impostor = self.config.new_client(h.granted_ttl_s, client_id=(h.sid, h.passwd))
        try:
            impostor.start(timeout=self.config.connect_timeout_s)
            impostor.stop()  # closes the session: the server deletes its ephemerals
            impostor.close()
        except KAZOO_ERRORS as exc:
            raise BackendUnavailable(f"expire_session: cannot reach {self.hosts}") from exc
        give_up = time.monotonic() + timeout_s
        notice_by = time.monotonic() + min(EXPIRY_NOTICE_S, timeout_s)
        while h.status in (Status.CONNECTED, Status.SUSPENDED) and time.monotonic() < notice_by:
            threading.Event().wait(0.01)
        # Usually the server has closed the session by now. But if the session's own client
        # reconnected between the impostor's connect and its close, the close never reached
        # the server; ending the session from its own client (which expire_locally does)
        # closes it either way, so the hook is deterministic.
        h.expire_locally("expired by expire_session()")
        if h.status is not Status.CLOSED:  # closed meanwhile (the core, on loss): no report
            h.ended.wait(max(0.0, give_up - time.monotonic()))  # reported, client stopped

    # -- claiming --------------------------------------------------------------------------

    @_bounded
    def claim(self, session: SessionHandle, job_id: str) -> ClaimResult | None:
        """Claim ``job_id`` in one multi: a versioned ``set_data`` on the job znode (the
        version just read; the new version is the generation) plus the ephemeral owner
        znode. Fails as a whole if anyone changed the job since the read — including a
        completion — or a live session owns it. Not read first if this backend never saw
        the job (claimed as new: ``create`` + ``set_data`` at 0) or released it (at the
        version it left): the multi is sent at once, and read and decided as above only
        if it fails (see :mod:`._jobs_known`).

        The same ``set_data`` writes the attempt number (the one read + 1). The job's
        failure znode is read with it: a FAILED job is refused; a job whose attempts are
        used up (``attempt - base >= max_attempts``) becomes FAILED instead, in a multi
        of its own that checks the version read; a job with a retry delay recorded since
        its last claim is claimed only if a fresh write's mtime (the store's clock) is
        past the delay's end: one more round trip, only then. See :mod:`._jobs_lifecycle`.

        Returns the generation and attempt (its ``handle`` is the claim's hold: pass the
        result back to renew/complete/release/fail), or ``None`` if a live session (maybe
        this one) holds it or its retry delay has not passed.

        Raises:
            JobCompleted: the job has a completion record (its generation attached).
            JobFailed: the job is FAILED (now or before).
            TokenSpaceExhausted: the job znode's version (the token's low part) is at
                the ceiling of ZooKeeper's 32-bit versions
                (:data:`._jobs_claim.VERSION_CEILING`); nothing was written. The remedy is
                in the message (and on the store's page, "32-bit counters").
            SessionExpired: this session is over; nothing is held.
            BackendUnavailable: nothing was applied.
            OutcomeUnknown: the answer was lost and reading back failed; if it was applied,
                a later claim of the job by this session adopts it, else keepalive hands it
                back.
        """
        h = self._handle(session)
        with _concerning(job_id):
            outcome = self._claims.claim(h, [job_id])[0]
        if isinstance(outcome, (JobCompleted, JobFailed, TokenSpaceExhausted)):
            raise outcome
        return outcome

    @_bounded
    def claim_many(
        self, session: SessionHandle, job_ids: Sequence[str]
    ) -> list[ClaimResult | None]:
        """Claim several jobs, all candidates in one multi (split to stay far below
        jute.maxbuffer); completed, FAILED or held jobs (and those whose retry delay has
        not passed, or whose version is at the ceiling: logged at ERROR) yield ``None``.
        Raises as :meth:`claim`."""
        h = self._handle(session)
        out: list[ClaimResult | None] = []
        for chunk in self._claims.size_chunks(h, list(job_ids)):
            for outcome in self._claims.claim(h, chunk):
                out.append(None if isinstance(outcome, (JobCompleted, JobFailed,
                                                        TokenSpaceExhausted)) else outcome)
        return out

    # -- holding, completing, releasing -------------------------------------------------------

    @_bounded
    def renew(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> float:
        """Check that the job znode's version is ``claim.generation`` and its owner znode
        is this session's: with the claim's hold, one multi of two ``check``s (job znode
        at that version, owner znode at the version the hold knows: only this session's
        claim can have made it while the version stands); otherwise, or if it fails,
        after a write barrier, the job znode and the owner znode's ephemeralOwner (one
        pipelined round trip; if that shows the job not held, one more read, after a
        ``sync``, says why). Either is a write the current leader orders: success also
        proves the session alive, like :meth:`keepalive`.

        Raises:
            InvalidArgument: ``claim`` is not a ClaimResult.
            StaleLeaseError: not held at that generation; the lease is lost.
            SessionExpired: the session is over. BackendUnavailable: no answer (still held
                until the local deadline).
        """
        h = self._handle(session)
        claim = _checked(claim)
        send = time.monotonic()
        paths = self._paths(job_id)
        with _concerning(job_id, claim.generation, self._holds, h, paths, "renew"):
            self._holds.renew(h, paths, claim, send)
        return h.current_ttl_s()

    @_bounded
    def complete(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes
    ) -> LeaseRecord:
        """Record the completion in one multi: ``set_data`` of the completion record on the
        job znode at version ``claim.generation`` (bumping the version, so any claim
        prepared against the held state fails) and delete of this session's owner znode
        at the version its claim created it with (and a queued job's markers). Sent
        without reading first when ``claim.handle`` is the hold this session's claim
        made; any other claim (``handle`` ``None``: not made by this process) is read
        first, after a ``sync``, and completed only if this session holds the job at
        ``claim.generation``. The record keeps that generation as the one that completed
        the job.

        A repeat of a completion this session made at this generation returns the
        existing record, also after the session ended.

        Raises:
            InvalidArgument: ``result`` longer than ``max_result_bytes``, or ``claim`` not
                a ClaimResult; still held.
            StaleLeaseError: not held at ``claim.generation``; the lease is lost.
            SessionExpired: the session is over (and it had not completed the job).
            BackendUnavailable: nothing was applied; still held until the deadline.
            OutcomeUnknown: the answer was lost and reading back failed.
        """
        h = self._handle(session)
        claim = _checked(claim)
        self._checked_result(job_id, claim, result)
        with _concerning(job_id, claim.generation):
            return self._holds.complete(h, self._paths(job_id), claim, result)

    def _checked_result(self, job_id: str, claim: ClaimResult, result: bytes) -> None:
        if len(result) > self.config.max_result_bytes:
            raise InvalidArgument(
                f"result is {len(result)} bytes; this store takes at most "
                f"{self.config.max_result_bytes} (option max_result_bytes; ZooKeeper's "
                f"jute.maxbuffer bounds it)", job_id=job_id, generation=claim.generation,
            )

    @_bounded
    def complete_and_claim_next(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, result: bytes,
        queue: str,
    ) -> tuple[LeaseRecord, QueuePick | None]:
        """:meth:`complete` ``job_id`` and claim a job of ``queue`` in **one multi**: the
        completion's operations (sent from the claim's hold, as :meth:`complete`), then
        the claim multi's (the epoch znode's check, the job znode's versioned
        ``set_data``, the owner znode, the held marker) of a random one of the 8 oldest
        jobs this backend read ahead from the queue (16 listed and read at once, each
        used for 1 s). So a worker draining a queue sends one multi per job, plus one
        listing and one read every few jobs. See :mod:`._queues_claim`.

        If the multi fails on the claim's operations (the job was taken or changed since
        the read), the completion is sent alone and the next job claimed as
        :meth:`claim_from_queue_many` with one; if it fails on the completion's, the
        completion is refused as :meth:`complete` would refuse it (read, then
        ``StaleLeaseError``/``SessionExpired``) and nothing is claimed. A claim without
        its hold, or a result over 512 KiB, is completed by :meth:`complete`, then the
        next job claimed. A lost answer is read back (the completion record's nonce;
        the multi applied whole or not at all), never re-sent blindly.

        Returns the COMPLETED record and ``(job_id, claim, payload)`` of the job claimed,
        or ``None`` when none was claimable (or the claim after a completion sent alone
        failed): the completion commits either way.

        Raises:
            InvalidArgument: as :meth:`complete`; nothing was sent, still held.
            StaleLeaseError / SessionExpired: the completion was refused, as in
                :meth:`complete`; nothing was claimed.
            BackendUnavailable: nothing was applied; still held until the deadline.
            OutcomeUnknown: the answer was lost and reading back failed: the completion
                and the claim were both applied or neither (if applied, the claim stays
                the session's until a later claim of the job adopts it or keepalive
                hands it back).
        """
        h = self._handle(session)
        claim = _checked(claim)
        self._checked_result(job_id, claim, result)
        with _concerning(job_id, claim.generation):
            return self._queue_claims.complete_and_claim(h, self._paths(job_id), claim,
                                                         bytes(result), queue)

    @_bounded
    def claim_from_queue_many(
        self, session: SessionHandle, queue: str, n: int
    ) -> list[QueuePick]:
        """Claim up to ``n`` (at most ``max_queue_claim_batch``, 128) of the oldest
        claimable jobs of ``queue``: the candidates (as :meth:`queue_candidates`, ``n``
        of them), one pipelined read of their job znodes, then **one claim multi** for
        all of them (split to stay far below jute.maxbuffer, as :meth:`claim_many`).
        A multi applies all or nothing: if a candidate was taken meanwhile, the failing
        operation names it, it is read again and the rest sent again without it
        (bounded); if fewer than ``n`` were claimed because others took some, the queue
        is listed again (at most 3 listings). Oldest enqueued first. Exhausted jobs
        found on the way become FAILED (not returned; a listing that made one FAILED is
        not one of the 3, so any number of them at the head is walked past); held,
        delayed, completed ones and those at the version ceiling are skipped. A lost
        answer is read back (each owner znode's nonce). See :mod:`._queues_claim`.

        Raises:
            SessionExpired: the session is over; nothing is held.
            BackendUnavailable / OutcomeUnknown / TokenSpaceExhausted: as :meth:`claim`,
                before any job was claimed (after some: the call returns those).
        """
        h = self._handle(session)
        return self._queue_claims.claim_many(h, queue, n)

    def complete_many(
        self, session: SessionHandle, items: Sequence[CompleteItem]
    ) -> list[LeaseRecord | LeaseError]:
        """Complete the items in one multi per up to :data:`END_MULTI_BYTES` of results
        (at most ``max_complete_batch`` items): the operations of :meth:`complete` for
        each, all applied or none. When every item is held as this session's claims left
        them, that is one round trip per multi. When a multi applies nothing (an item
        stale or expired, a marker deleted by hand, a claim not made by this process), or
        its answer was lost and reading back could not tell, each item of it is
        completed alone by :meth:`complete`, which gives each its own outcome (a repeat
        of a completion that applied is recognised): the others still commit.

        Raises:
            nothing of its own: each item's error is its outcome.
        """

        def cost(item: CompleteItem) -> int | None:
            claim, result = item[1], item[2]
            if not isinstance(claim, ClaimResult) or len(result) > self.config.max_result_bytes:
                return None  # complete() refuses it with its own error
            return len(result) + _ITEM_BYTES

        return self._end_many(
            session, items, cost,
            lambda h, group: self._holds.complete_batch(
                h, [(self._paths(job_id), claim, bytes(result))
                    for job_id, claim, result in group]),
            lambda item: self.complete(session, *item), unknown_alone=True)

    def release_many(
        self, session: SessionHandle, items: Sequence[ReleaseItem]
    ) -> list[LeaseError | None]:
        """Release the items in one multi per up to ``max_end_batch`` (128) items: the
        operations of :meth:`release` for each (``check`` of the job znode's version ==
        the item's generation, versioned ``delete`` of this session's owner znode, a
        queued job's held marker), all applied or none. When every item is held as this
        session's claims left them, that is one round trip. When the multi applies
        nothing (an item stale or expired, a marker deleted by hand, a claim not made by
        this process), each item is released alone by :meth:`release`, which gives each
        its own outcome: the others are still released. A lost answer is read back (the
        first item's owner znode: the multi applied whole or not at all), never re-sent
        blindly.

        Returns:
            Element ``i``: ``None`` (released: claimable at once, the next claim gets
            generation + 1) or the error :meth:`release` raises for ``items[i]``.

        Raises:
            nothing of its own: each item's error is its outcome (``OutcomeUnknown`` for
            every item of a multi whose answer was lost and could not be read back: each
            was released or none; a lease it names is no longer to be relied on).
        """
        return self._end_many(
            session, items,
            lambda item: _ITEM_BYTES if isinstance(item[1], ClaimResult) else None,
            self._release_batch, lambda item: self.release(session, *item),
            unknown_alone=False)

    def fail_many(
        self, session: SessionHandle, items: Sequence[FailItem]
    ) -> list[LeaseRecord | LeaseError]:
        """Fail the items in one multi per up to :data:`END_MULTI_BYTES` of error text
        (at most ``max_end_batch``, 128, items): the operations of :meth:`fail` for
        each (``check`` of the job znode's version == the item's generation, versioned
        ``delete`` of this session's owner znode, the failure znode's versioned write
        with the item's error and delay, a queued job's markers), all applied or none.
        Each item's retry delay runs from that multi's mtime (the leader's time of it,
        the same for every item). When the multi applies nothing, each item of it is
        failed alone by :meth:`fail` (its own outcome: the others still apply). A lost
        answer is read back (the first item's failure znode's nonce), never re-sent
        blindly.

        Returns:
            Element ``i``: the record after ``items[i]``'s failure, as :meth:`fail`
            returns it, or the error :meth:`fail` raises for it.

        Raises:
            nothing of its own: each item's error is its outcome (``OutcomeUnknown`` as
            for :meth:`release_many`).
        """

        def cost(item: FailItem) -> int | None:
            if not isinstance(item[1], ClaimResult) or not isinstance(item[2], str):
                return None  # fail() refuses it with its own error
            return len(item[2].encode("utf-8", "surrogatepass")) + _ITEM_BYTES

        return self._end_many(
            session, items, cost,
            lambda h, group: self._holds.fail_batch(
                h, [(self._paths(job_id), claim, error, retry_in_s)
                    for job_id, claim, error, retry_in_s in group]),
            lambda item: self.fail(session, *item), unknown_alone=False)

    def _release_batch(
        self, h: ZkSession, group: list[ReleaseItem]
    ) -> list[None] | None:
        holds = self._holds.release_batch(h, [(self._paths(j), c) for j, c in group])
        if holds is None:
            return None
        for (job_id, _), hold in zip(group, holds, strict=True):
            self._remember_released(job_id, hold)
        return [None] * len(group)

    def _remember_released(self, job_id: str, hold: Hold | None) -> None:
        """Keep what a release left the job (so its next claim here need not read
        first), if it is known exactly."""
        if hold is not None and hold.exact:
            self._claims.known.released(job_id, Released(
                *split_token(hold.generation), hold.attempt, hold.max_attempts, hold.failure,
                hold.held, hold.open, hold.delayed, hold.failed, hold.tally,
            ))

    def _end_many(
        self, session: SessionHandle, items: Sequence[_I],
        cost: Callable[[_I], int | None],
        batch: Callable[[ZkSession, list[_I]], Sequence[_O] | None],
        alone: Callable[[_I], _O], *, unknown_alone: bool,
    ) -> list[_O | LeaseError]:
        """The one path of ``complete_many``, ``release_many`` and ``fail_many``: the
        items grouped into multis of at most :data:`END_MULTI_BYTES` (``cost(item)``
        bytes each; ``None``: one the lone call refuses, sent alone), each group sent by
        ``batch`` (one multi, by one deadline; ``None``: it applied nothing). The items
        of a group that applied nothing, or raised (nothing applied: BackendUnavailable,
        TokenSpaceExhausted, SessionExpired; and OutcomeUnknown if ``unknown_alone``,
        for a lone call that recognises its own earlier success) are each sent alone by
        ``alone``; otherwise an OutcomeUnknown is each item's of that group."""
        h = self._handle(session)
        outcomes: dict[int, _O | LeaseError] = {}
        costs = {i: c for i, item in enumerate(items) if (c := cost(item)) is not None}
        for group in size_groups(list(costs), costs.__getitem__, END_MULTI_BYTES):
            entered = self._wire.enter()
            try:
                with _concerning(items[group[0]][0]):
                    answers: Sequence[_O | LeaseError] | None = batch(
                        h, [items[i] for i in group])
            except OutcomeUnknown as exc:
                answers = None if unknown_alone else [exc] * len(group)
            except LeaseError:  # nothing applied: each item alone below
                answers = None
            finally:
                if entered is not None:
                    self._wire.leave(entered)
            if answers is not None:
                outcomes.update(zip(group, answers, strict=True))
        out: list[_O | LeaseError] = []
        for i, item in enumerate(items):
            if i not in outcomes:
                try:
                    outcomes[i] = alone(item)
                except LeaseError as exc:
                    outcomes[i] = exc
            out.append(outcomes[i])
        return out

    @_bounded
    def release(self, session: SessionHandle, job_id: str, claim: ClaimResult) -> None:
        """End the hold in one multi: check the job znode's version is
        ``claim.generation`` and delete this session's owner znode (at its version; and a
        queued job's held marker). Sent without reading first, or read first, as
        :meth:`complete`. The job is claimable at once, and its next claim gets
        ``claim.generation + 1``.

        Raises:
            InvalidArgument: ``claim`` is not a ClaimResult.
            StaleLeaseError / SessionExpired: not held (any more); the lease is lost.
            BackendUnavailable: nothing was applied. OutcomeUnknown: as for complete.
        """
        h = self._handle(session)
        claim = _checked(claim)
        paths = self._paths(job_id)
        with _concerning(job_id, claim.generation, self._holds, h, paths, "release"):
            hold = self._holds.release(h, paths, claim)
        self._remember_released(job_id, hold)

    @_bounded
    def fail(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, error: str,
        retry_in_s: float,
    ) -> LeaseRecord:
        """End the hold and record ``error`` in one multi: ``check`` of the job znode's
        version == ``claim.generation``, ``delete`` of this session's owner znode (at its
        version) and the versioned write of the job's failure znode (made by the first
        fail: ``create`` + ``set_data``), plus a queued job's markers (held deleted; open
        deleted if FAILED; delayed made for a retry delay). Sent without reading first,
        or read first, as :meth:`complete`.

        If this attempt (counted since the last requeue) reached the job's
        ``max_attempts`` the job becomes FAILED; otherwise it is AVAILABLE, and claimable
        once ``retry_in_s`` seconds have passed on the store's clock from the mtime of
        this very write (the leader's time of it: see :mod:`._jobs_lifecycle`). The job
        znode's version (the generation) does not move: the next claim gets
        ``claim.generation + 1``. A lost answer is read back (the failure znode's nonce).

        Returns:
            The record after it: FAILED, or AVAILABLE with ``not_before`` (the write's
            mtime + ``retry_in_s``, store clock; ``None`` for no delay).

        Raises:
            InvalidArgument: ``claim`` is not a ClaimResult; still held.
            StaleLeaseError / SessionExpired: not held (any more); the lease is lost.
            BackendUnavailable: nothing was applied. OutcomeUnknown: as for complete.
        """
        h = self._handle(session)
        claim = _checked(claim)
        paths = self._paths(job_id)
        with _concerning(job_id, claim.generation, self._holds, h, paths, "fail"):
            return self._holds.fail(h, paths, claim, error, retry_in_s)

    @_bounded
    def set_value(
        self, session: SessionHandle, job_id: str, claim: ClaimResult, value: bytes
    ) -> None:
        """Keep ``value`` with the hold, in one multi with the checks of :meth:`release`:
        ``check`` of the job znode's version == ``claim.generation`` and a versioned
        ``set_data`` of this session's EPHEMERAL owner znode, whose data gets the value
        (so it ends with the hold: release, completion, expiry; the next claim starts
        without one). Sent without reading first when ``claim.handle`` is the hold this
        session's claim made, else read first, as :meth:`complete`. ``get`` returns it as
        ``LeaseRecord.value`` while the job is HELD. A lost answer is read back (the
        owner znode's ``vnonce``), never re-sent blindly. See :mod:`._jobs_value`.

        Raises:
            InvalidArgument: ``value`` not bytes or longer than ``max_result_bytes``, or
                ``claim`` not a ClaimResult; nothing was sent.
            StaleLeaseError / SessionExpired: not held (any more); the lease is lost.
            BackendUnavailable: nothing was applied; still held until the deadline.
            OutcomeUnknown: the answer was lost and reading back failed.
        """
        h = self._handle(session)
        claim = _checked(claim)
        if not isinstance(value, bytes) or len(value) > self.config.max_result_bytes:
            size = f"{len(value)} bytes" if isinstance(value, bytes) else repr(type(value))
            raise InvalidArgument(
                f"value must be bytes of at most {self.config.max_result_bytes} (option "
                f"max_result_bytes; ZooKeeper's jute.maxbuffer bounds it), got {size}",
                job_id=job_id, generation=claim.generation,
            )
        paths = self._paths(job_id)
        with _concerning(job_id, claim.generation, self._holds, h, paths, "set_value"):
            self._values.set_value(h, paths, claim, value)

    @_bounded
    def requeue(self, job_id: str) -> LeaseRecord:
        """FAILED -> AVAILABLE at once, on the shared client: read the job (after a write
        barrier), then one multi: the failure znode's versioned write (not FAILED, no
        delay, attempt base = the attempt now, error kept), a ``check`` of the job
        znode's version, and a queued job's open marker made again. A lost answer is
        read back (the failure znode's nonce). The job znode's version does not move.

        Returns:
            The record after it (AVAILABLE).

        Raises:
            InvalidArgument: the job is unknown or not FAILED; nothing changed.
            BackendUnavailable: nothing was applied. OutcomeUnknown: reading back failed.
        """
        with _concerning(job_id):
            return self._lifecycle.requeue(job_id)

    # -- reading and waiting ----------------------------------------------------------------

    @_bounded
    def get(self, job_id: str) -> LeaseRecord | None:
        """The job's record, read after a write barrier on the shared client (a multi of
        one ``check``, which changes nothing), so it reflects every operation any client
        completed before the call, whichever member the shared client is connected to. A
        ``sync`` would not: a leader answers it at once, possibly before applying a claim
        its followers already answered (or while deposed). ``lease_until`` is ``None``:
        ZooKeeper does not expose session deadlines.

        Raises:
            BackendUnavailable: no answer within ``timeout_s`` of the call's start.
            AuthenticationFailed.
        """
        paths = self._paths(job_id)
        _, job, owner, failure = self._wire.reader_read(
            [("barrier", self.config.base), ("get", paths.job), ("get", paths.owner),
             ("get", paths.failure)], "get", job_id,
        )
        return to_record(paths, job, owner, failure)

    @_bounded
    def records(self, limit: int | None = None) -> list[LeaseRecord]:
        """Every job (children of ``{chroot}/jobs``), ordered by job id, at most ``limit``;
        read after a write barrier, as :meth:`get`.

        Raises:
            BackendUnavailable: not done within ``timeout_s`` of the call's start (every
                read included). AuthenticationFailed.
        """
        children = self._wire.reader_read(
            [("barrier", self.config.base), ("children", self.config.base)], "records"
        )[1] or []
        ids = sorted(job_id for job_id in map(decode_name, children)
                     if job_id is not None and not is_election_key(job_id))
        ids = ids[:limit] if limit is not None else ids
        out: list[LeaseRecord] = []
        for start in range(0, len(ids), READ_CHUNK):
            chunk = [self._paths(job_id) for job_id in ids[start : start + READ_CHUNK]]
            reads: list[Read] = []
            for paths in chunk:
                reads += [("get", paths.job), ("get", paths.owner), ("get", paths.failure)]
            answers = self._wire.reader_read(reads, "records")
            for i, paths in enumerate(chunk):
                record = to_record(paths, *answers[3 * i : 3 * i + 3])
                if record is not None:
                    out.append(record)
        return out

    def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        """Wait on a ZooKeeper watch on the job's owner znode: returns when it is deleted
        (release, completion, holder's session expired), when it does not exist, or after
        ``timeout_s``. If the store cannot be asked, waits briefly and returns (the
        caller's next claim reports the error).

        A job whose last claim by this backend was refused for a running retry delay is
        not watched: ZooKeeper has no timer event, so this sleeps until that delay ends
        (as measured from the store's clock by that claim), then returns."""
        delay_s = self._lifecycle.hints.remaining(job_id)
        if delay_s:
            threading.Event().wait(min(max(timeout_s, 0.0), delay_s))
            return
        read_budget_s = min(self.config.timeout_s, max(timeout_s, 0.0) + 1.0)
        try:
            with self._wire.bounded(read_budget_s) as read_deadline:
                gate = self._wire.gate(self._wire.reader())
            self._watches.wait_gone(gate, self._paths(job_id).owner, timeout_s, read_deadline)
        except _WAIT_ERRORS as exc:
            log.debug("wait_for_change could not watch", extra={"job_id": job_id,
                                                                 "error": repr(exc)})
            threading.Event().wait(min(max(timeout_s, 0.0), 0.25))

    # -- subscriptions (how waiting claims are woken) --------------------------------------

    def subscribe_job(self, job_id: str, callback: WakeCallback) -> Unsubscribe:
        """Call ``callback()`` at least once after ``job_id`` may have become claimable
        (or completed, or FAILED): a ZooKeeper watch on its owner znode (deleted by a
        release, completion, fail, or its holder's session ending), shared by every
        subscription of the job, and a timer at the end of a retry delay this backend has
        seen (ZooKeeper has no timer event). Also called once when the shared client
        loses its connection, and on close. See :mod:`._watches_subscribe`.

        If the shared client cannot connect, falls back to the default poller. Never
        raises; the returned function cancels the subscription (idempotent)."""
        try:
            return self._subs.subscribe((JOB, job_id), callback)
        except BackendUnavailable:
            return super().subscribe_job(job_id, callback)

    def subscribe_queue(self, queue: str, callback: WakeCallback) -> Unsubscribe:
        """As :meth:`subscribe_job`, for any job of ``queue``: child watches on its
        ``open``, ``held`` and ``delayed`` znodes (an enqueue or requeue, a release,
        completion, fail or expiry), one per znode however many subscribe."""
        try:
            return self._subs.subscribe((QUEUE, queue), callback)
        except BackendUnavailable:
            return super().subscribe_queue(queue, callback)

    def close_subscriptions(self) -> None:
        """Call every subscriber once and stop watching (and the fallback poller)."""
        self._subs.close()
        super().close_subscriptions()

    # -- work queues -------------------------------------------------------------------------

    @_bounded
    def enqueue(
        self, queue: str, job_id: str, payload: bytes, max_attempts: int | None = None
    ) -> bool:
        """Add ``job_id`` to ``queue``: :meth:`enqueue_many` with one job (one multi on
        the shared client). See :mod:`._queues`.

        Do not enqueue the id of a purged job again: its job znode would start again at
        version 0, so its generations would repeat.

        Returns ``True`` if added, ``False`` if the job is already in this queue.

        Raises:
            InvalidArgument: the job exists outside this queue (claimed by name, or in
                another queue), ``job_id`` is an election key, or the request would
                exceed jute.maxbuffer (a very long chroot); nothing was written.
            QueueFull: the queue holds ``MAX_QUEUE_JOBS`` (25,000) jobs or
                ``MAX_QUEUE_BYTES`` (16 MiB) of payloads, or the whole store (every queue
                and named job) ``store_max_jobs`` jobs or all its queues
                ``store_max_bytes`` payload bytes (options; see ``._queues_capacity``); nothing
                was written.
            LegacyQueueLayout (an ``UnsupportedOperation``): a queue written before the
                bucketed layout; nothing was written (the message names the upgrade step).
            BackendUnavailable: nothing was applied (also when other enqueues into the
                same queue kept winning the race for ``seq`` for ``timeout_s``).
            OutcomeUnknown: the answer was lost and reading back the tag failed.
        """
        self._claims.known.seen([job_id])  # its claims read first (see ._jobs_known)
        return self._queues.enqueue(queue, job_id, payload, max_attempts)

    @_bounded
    def enqueue_many(self, queue: str, items: Sequence[EnqueueItem]) -> list[bool]:
        """Add ``items`` (at most ``ENQUEUE_BATCH``, 128) to ``queue`` in one multi on the
        shared client: the queue's head written at the version read (which issues the
        seqs and keeps the counts), each new bucket's znodes, and per job its job znode,
        tag, member (the payload) and open marker. Jobs whose paths and payloads would
        pass 160 KB together go in further multis, each atomic; before the first of
        several, every job is checked not to exist outside this queue. A job already in
        this queue is left out (``False``); a lost answer is read back (the tags' nonce),
        never re-sent blindly. See :mod:`._queues`.

        Raises:
            InvalidArgument: a job exists outside this queue (nothing of the multi that
                carries it, nor of later ones, is added), an election key, or a request
                over jute.maxbuffer.
            QueueFull: the queue would pass ``MAX_QUEUE_JOBS`` jobs or
                ``MAX_QUEUE_BYTES`` of payloads, or the store its store-wide
                ``store_max_jobs`` or ``store_max_bytes`` (options); that multi and later
                ones are not added.
            LegacyQueueLayout: a queue written before the bucketed layout.
            BackendUnavailable: that multi and later ones were not applied.
            OutcomeUnknown: a lost answer could not be read back.
        """
        self._claims.known.seen(item.job_id for item in items)  # read first (see ._jobs_known)
        return self._queues.enqueue_many(queue, items)

    @_bounded
    def queue_stats(self, queue: str) -> QueueStats:
        """Counts of ``queue``'s jobs by state, without listing any job: one round trip
        (after a ``sync``) reading the queue's head (the jobs enqueued and not purged,
        exact) and the ``numChildren`` of its three tallies: held (ephemeral entries that
        come and go with the held markers, so a holder's session ending takes its jobs
        out too), done (made by each completion multi) and failed (made with FAILED,
        deleted by ``requeue``). O(1) whatever the depth; ``available`` = jobs - done -
        failed - held. ``oldest_held_lease_until`` is ``None`` (ZooKeeper does not
        expose session expiry).

        Consistency: not a snapshot (ZooKeeper has no multi-read). Each count is exact
        at the moment its znode was read (each tally changes in the same multi as the
        job's state), and the reads follow one another within the round trip (head,
        done, failed, held), so a job that changes state meanwhile (a claim, a
        completion, an enqueue) is counted in its state before or after; the four counts
        always add up to the head's ``jobs``, and ``completed`` never goes back between
        calls (until a purge).

        Raises:
            LegacyQueueLayout: a queue written before the bucketed layout.
            BackendUnavailable: not done within ``timeout_s``.
        """
        return self._queues.stats(queue)

    @_bounded
    def queue_candidates(self, queue: str, limit: int) -> list[tuple[str, bytes]]:
        """Up to ``limit`` ``(job_id, payload)`` of ``queue``'s jobs neither completed nor
        FAILED, not held, and without a running retry delay, oldest ``seq`` first: one
        round trip (after a ``sync``) reading the queue's head and listing the ``open``,
        ``held`` and ``delayed`` markers of its oldest bucket not known to be done (at
        most 256 names each), newer buckets (4 per round trip) only while fewer than
        ``limit`` were found; then one pipelined read of the payloads not cached yet
        (and, for delayed markers not seen yet, one of those markers with a write whose
        mtime is the store's "now"). Cost independent of the queue's depth. A hint: the
        claim decides. An unknown queue has none. Ordering: see :mod:`._queues`.

        Raises:
            LegacyQueueLayout: a queue written before the bucketed layout.
            BackendUnavailable: not done within ``timeout_s`` of the call's start.
        """
        candidates = self._queues.candidates(queue, limit)
        self._claims.known.seen(job_id for job_id, _ in candidates)  # read first (._jobs_known)
        return candidates

    @_bounded
    def queue_candidates_after_wake(self, queue: str, limit: int) -> list[tuple[str, bytes]]:
        """:meth:`queue_candidates` without its ``sync``, for a waiting claim once
        subscribed (:meth:`subscribe_queue`): read as the shared client's member has the
        queue, which is at least as new as the watch events (and subscription rounds) this
        client was given before, since a member answers one client's requests in order and
        sends a watch's event before any later read sees the change. A change the member
        has not applied yet fires a watch armed on it (the subscription's rounds are sent
        on this client before the listings they trigger), which wakes the claim again.
        Saves the ``sync``'s trip to the leader (about a millisecond on the kit ensemble).

        Raises:
            LegacyQueueLayout, BackendUnavailable: as :meth:`queue_candidates`.
        """
        candidates = self._queues.candidates(queue, limit, synced=False)
        self._claims.known.seen(job_id for job_id, _ in candidates)  # read first (._jobs_known)
        return candidates

    @_bounded
    def queue_jobs(self, queue: str, limit: int | None = None) -> list[QueuedJob]:
        """Every job of ``queue`` (at most ``limit``), oldest first, with its record,
        payload and ``seq``; an unknown queue is empty. One listing per bucket, then
        pipelined reads of each job's znode, owner znode, member and failure znode.
        O(jobs read).

        The reads are paced by progress (:mod:`._transport_paged`): at most 50 in flight (half the
        shared client's cap, so other calls on it find room), each answer due within
        ``timeout_s`` of the previous one; the listing as a whole is bounded by the
        queue's size, not by ``timeout_s``.

        Raises:
            BackendUnavailable: no answer for ``timeout_s`` (not connected, or the store
                stopped answering).
        """
        return self._queues.jobs(queue, limit)

    def wait_for_queue(self, queue: str, timeout_s: float) -> None:
        """Wait on ZooKeeper watches, not polling: child watches on the ``open``
        (an enqueue, a requeue), ``held`` (a release, a fail, the holder's session
        ending; also a completion or a claim, which wake it spuriously) and ``delayed``
        znodes of the buckets from the oldest not done to the newest (at most 8; with
        more, it looks again every 0.5 s), and on the creation of the bucket the next
        enqueue makes. Returns at once if a job looks claimable, and after
        ``timeout_s`` at the latest. While every job neither held nor completed has a
        retry delay running, returns when the soonest ends (timed from the store's clock:
        ZooKeeper has no timer event). The watches are
        shared by every waiter of this backend, one per path, so waiters timing out
        leave nothing to pile up. If the store cannot be asked, waits briefly and
        returns."""
        try:
            self._queues.wait(queue, timeout_s)
        except _WAIT_ERRORS as exc:
            log.debug("wait_for_queue could not watch", extra={"queue": queue,
                                                               "error": repr(exc)})
            threading.Event().wait(min(max(timeout_s, 0.0), 0.25))

    def purge(self, queue: str) -> int:
        """Delete ``queue``'s completed jobs: each one's tag (and failure znode), job znode
        (at its completed version) and member, in multis of up to 100 jobs (far below
        jute.maxbuffer). Jobs without an open marker (completed or FAILED) are read first
        and deleted only if their record says COMPLETED (FAILED jobs stay until
        requeued). Returns how many this call deleted (a job another purge deleted first
        is not counted, except in a batch whose answer was lost and which reading back
        found gone). The queue's own znodes stay.

        A purged job id must not be enqueued again: its job znode would be made anew at
        version 0, so its generations (fencing tokens) would repeat.

        Each step (the head's read, a bucket's listing, the reads and deletes of up to
        100 jobs) ends by its own deadline, ``timeout_s`` from its start: a large queue
        takes as many steps as it needs (a 10,000-job queue took about 11 s on a 3-member
        ensemble, past one ``timeout_s``), and an unreachable store fails the first.

        Raises:
            BackendUnavailable / OutcomeUnknown (earlier steps' jobs are deleted): a step
                not done within ``timeout_s`` (a lost answer read back within
                ``SETTLE_GRACE_S`` more).
        """
        return self._queues.purge(queue)

    @_bounded
    def upgrade_queue(self, queue: str) -> int:
        """ZooKeeper's queues have no in-place upgrade: this reads the queue's head
        (after a ``sync``) and returns 0 if this version serves the queue (or it does not
        exist; nothing is made). A queue of layout 1 (before buckets) is upgraded by hand
        (:class:`~._layout.LegacyQueueLayout` gives the steps): drain it with the
        previous release, purge it, delete its znode and enqueue again. The command
        ``consensus-lease upgrade-queue`` calls it.

        Raises:
            LegacyQueueLayout (an ``UnsupportedOperation``): a queue of layout 1; its
                message gives the manual steps. Nothing was changed.
            BackendUnavailable: not done within ``timeout_s``.
        """
        q = self._queues.paths(queue)
        answer = self._wire.reader_read([("sync", self.config.base), ("get", q.node)],
                                        f"reading queue {queue!r}'s layout")[1]
        if answer is not None:
            QueueHead.rotation(answer[0], q.node, queue)  # raises for layout 1
        return 0

    # -- the store epoch -----------------------------------------------------------------------

    def epoch(self) -> int:
        """The store epoch: ``{chroot}/epoch`` read after a write barrier on the shared
        client (0 if it was never made). Every token is ``epoch * 2**32 + the job znode's
        version``, with the epoch in effect when it was claimed.

        Raises:
            BackendUnavailable.
        """
        return self._epochs.current()

    def bump_epoch(self, above: int | None = None) -> int:
        """Raise the store epoch to ``max(epoch + 1, above // 2**32 + 1)`` (see
        :meth:`Backend.bump_epoch <consensus_lease.backend.Backend.bump_epoch>`): read it
        after a write barrier on the shared client, then one multi, a versioned
        ``set_data`` of ``{chroot}/epoch`` (``create`` if absent; ``{chroot}`` and
        ``{chroot}/identity`` are made first if missing), read and sent again if another
        bump came first. A lost answer is
        read back (the nonce written with the value). Claims in flight fail their check
        of the epoch znode and are sent again with the new epoch, so every token handed
        out afterwards exceeds every one before. A backend that had found the store's
        history gone back is usable again afterwards (see :mod:`._tokens_history`).

        Returns:
            The new epoch.

        Raises:
            InvalidArgument: ``above`` < 0, or the epoch would pass 2**31 - 1 (tokens
                beyond 2**63 - 1); nothing changed.
            BackendUnavailable: nothing was applied. OutcomeUnknown: reading back failed.
        """
        epoch = self._epochs.bump(above)
        if self._history.regressed:
            identity = self._wire.reader_read([("get", self.config.identity_node)],
                                              "bump_epoch")[0]
            self._history.recover(epoch, identity, last_zxid(self._wire.reader()))
        return epoch[0]

    def close(self) -> None:
        """Close every session still open (best effort), wake every subscriber once,
        and close the read client."""
        self._prober.close()
        with self._lock:
            self._closed = True
            sessions = list(self._sessions.values())
        for h in sessions:
            try:
                self.close_session(h)
            except BackendUnavailable as exc:
                log.warning("closing a session failed", extra={"error": str(exc)})
        self.close_subscriptions()
        self._wire.close()
