"""gRPC transport to an etcd cluster: members, failover, auth token, error translation.

pyetcd supplies the channels (:class:`pyetcd.Endpoint`, TLS credentials) and the raw
gRPC stubs and messages (:mod:`pyetcd.etcdrpc`). Its ``MultiEndpointEtcd3Client`` is not
used for requests because (a) its endpoint switching is not thread-safe, (b) it
quarantines a failed endpoint for ``time_retry`` (300 s), and (c) it turns gRPC errors
into exception classes without the etcd message, which is what separates "requested
lease not found" (the session is gone) from "request timed out" (the outcome is unknown).

Requests go to one *current* member; a transport failure (UNAVAILABLE, DEADLINE_EXCEEDED,
...) moves the current member to the next one in URL order. Every request carries
``hasleader=true`` metadata, so a member cut off from the leader refuses at once
("etcdserver: no leader") instead of timing out (etcd's ``WithRequireLeader``).

Idempotent requests go through :meth:`Transport.call`, which retries on the next member
(``tenacity``) for at most ``connect_timeout_s``. Writes go through :meth:`Transport.send`,
which tries once and hands an ambiguous failure back to the caller to settle by reading
back (see the driver).

Every unary answer's header goes through the driver's
:class:`~._tokens_history.RevisionGuard` (:meth:`Transport.attempt`, and ``finish()``
of :meth:`Transport.start`); an answer from a history older than one already seen raises
``StoreRegressed``, which is never retried. Keepalive answers are checked by the driver
(``EtcdBackend.keepalive``), watch responses not at all.

A public call that makes many requests (a listing, a purge) runs inside
:meth:`Transport.bounded`: one deadline, fixed at its start, caps every request's budget,
so the call as a whole ends by it however many pages or chunks it has left.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import grpc
import pyetcd
import tenacity
from pyetcd import etcdrpc

from ...errors import (
    AuthenticationFailed,
    BackendUnavailable,
    InvalidArgument,
    LeaseError,
    SessionExpired,
    StoreRegressed,
)
from ._config import EtcdConfig
from ._tokens_history import RevisionGuard

__all__ = ["Failure", "Member", "Transport", "rpc_failures", "translate"]

log = logging.getLogger("consensus_lease.etcd")

if not logging.getLogger("grpc").handlers:
    # grpc's Python loggers report failures this driver turns into typed errors; unless
    # the application gave them handlers, nothing reaches stderr by default (records
    # still propagate to handlers the application sets up). As the ZooKeeper backend
    # does for kazoo.
    logging.getLogger("grpc").addHandler(logging.NullHandler())

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    # Reconnect to a restarted member within about a second (gRPC's default backoff
    # grows to 120 s, which would keep a healthy member out of rotation).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Notice a dead connection under a long-lived stream. etcd's default
    # --grpc-keepalive-min-time is 5 s: pinging more often gets the connection closed.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # Completion results may be up to etcd's request limit; a records() page holds many.
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
]

# A write that failed with one of these may or may not have been applied: the request
# may have reached the leader and been committed before the answer was lost, or still
# be in the raft log ("etcdserver: request timed out" / "leader changed").
_AMBIGUOUS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.DATA_LOSS,
    }
)
# Answers that reflect every write completed before the request was sent (KV requests
# are linearizable by default, and the driver never asks for serializable ones; lease
# grants and revokes are applied through raft on the member that answers).
_LINEARIZABLE = frozenset({("kv", "Range"), ("kv", "Txn"), ("lease", "LeaseGrant"),
                           ("lease", "LeaseRevoke")})
_CALL: ContextVar[tuple[Transport, float] | None] = ContextVar(
    "consensus_lease_etcd_call", default=None
)
"""The transport and deadline of the bounded call this thread (or task) is in, if any."""

_LEADER_ONLY: tuple[tuple[str, str], ...] = (("hasleader", "true"),)
_TOKEN_REJECTED = ("invalid auth token", "revision of auth store is old")
_AUTH_MESSAGES = (
    "authentication failed",
    "authentication is not enabled",
    "user name is empty",
    "permission denied",
)
_TLS_MESSAGES = ("handshake", "ssl", "certificate", "tsi_")  # TSI: gRPC's TLS layer


class Failure(Exception):
    """One failed attempt of one request on one member (internal; never escapes).

    Attributes:
        endpoint: the member's ``host:port``.
        code: the gRPC status code, or ``None`` for a non-gRPC failure.
        details: the status message (etcd's error text).
    """

    def __init__(self, endpoint: str, code: grpc.StatusCode | None, details: str) -> None:
        super().__init__(f"{endpoint}: {getattr(code, 'name', code)}: {details}")
        self.endpoint = endpoint
        self.code = code
        self.details = details

    @classmethod
    def from_rpc(cls, endpoint: str, exc: grpc.RpcError) -> Failure:
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        return cls(endpoint, code, str(details or ""))

    @classmethod
    def unavailable(cls, endpoint: str, details: str) -> Failure:
        """A stream or member that stopped answering (``UNAVAILABLE``: transient)."""
        return cls(endpoint, grpc.StatusCode.UNAVAILABLE, details)

    @classmethod
    def deadline(cls, endpoint: str, details: str) -> Failure:
        """An attempt that ran out of time (``DEADLINE_EXCEEDED``: ambiguous)."""
        return cls(endpoint, grpc.StatusCode.DEADLINE_EXCEEDED, details)

    @property
    def timed_out(self) -> bool:
        """The attempt ran out of time (the member may still apply a write)."""
        return self.code is grpc.StatusCode.DEADLINE_EXCEEDED

    @property
    def ambiguous(self) -> bool:
        """A write that failed like this may have been applied."""
        return self.code is None or self.code in _AMBIGUOUS

    @property
    def transient(self) -> bool:
        """Worth trying again, on another member. Writes use :attr:`ambiguous` instead."""
        return self.ambiguous or (
            self.code is grpc.StatusCode.RESOURCE_EXHAUSTED and "too many requests" in self.details
        )

    @property
    def token_rejected(self) -> bool:
        return any(m in self.details for m in _TOKEN_REJECTED)

    @property
    def tls(self) -> bool:
        text = self.details.lower()
        return any(m in text for m in _TLS_MESSAGES)


@contextmanager
def rpc_failures(endpoint: str) -> Iterator[None]:
    """Inside the block, a gRPC error of a call to ``endpoint`` becomes a :class:`Failure`
    (the one place, with :meth:`Transport.send`, that catches ``grpc.RpcError``: the
    streaming readers of the keepalive and watch modules use it)."""
    try:
        yield
    except grpc.RpcError as exc:
        raise Failure.from_rpc(endpoint, exc) from exc


def translate(
    failure: Failure,
    what: str,
    tried: Sequence[Failure] = (),
    *,
    job_id: str | None = None,
    generation: int | None = None,
    members: Sequence[str] = (),
) -> LeaseError:
    """The library error for a failed request. Raise it ``from`` the gRPC error.
    ``members``: every configured endpoint, named in an unavailability message beside
    the ones tried (an operator checks all of them, also those the retries never
    reached before the time ran out)."""
    code, details = failure.code, failure.details
    ids: dict[str, Any] = {"job_id": job_id, "generation": generation}
    if (
        code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
        or any(m in details for m in _AUTH_MESSAGES)
        or failure.tls
    ):
        return AuthenticationFailed(f"etcd refused {what} at {failure.endpoint}: {details}", **ids)
    if code is grpc.StatusCode.NOT_FOUND and "lease not found" in details:
        return SessionExpired(f"etcd {what}: the session's lease is gone ({details})", **ids)
    if code is grpc.StatusCode.INVALID_ARGUMENT or (
        code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details
    ):
        return InvalidArgument(f"etcd rejected {what}; nothing was written: {details}", **ids)
    attempts = list(tried) or [failure]
    seen = sorted({f.endpoint for f in attempts})
    last = "; ".join(dict.fromkeys(str(f) for f in attempts[-3:]))
    others = [m for m in members if m not in seen]
    also = f"; not reached in time: {', '.join(others)}" if others else ""
    return BackendUnavailable(
        f"etcd {what}: no answer after {len(attempts)} attempt(s) on {', '.join(seen)} "
        f"(last: {last}){also}",
        **ids,
    )


class Member:
    """One cluster member: its channel and the stubs on it."""

    def __init__(self, target: str, config: EtcdConfig, creds: Any) -> None:
        self.target = target
        host, _, port = target.rpartition(":")
        self.endpoint = pyetcd.Endpoint(
            host, int(port), secure=config.tls, creds=creds, opts=CHANNEL_OPTIONS
        )
        channel = self.endpoint.channel
        self.kv = etcdrpc.KVStub(channel)
        self.lease = etcdrpc.LeaseStub(channel)
        self.watch = etcdrpc.WatchStub(channel)
        self.auth = etcdrpc.AuthStub(channel)

    def close(self) -> None:
        self.endpoint.close()


def _credentials(config: EtcdConfig) -> Any:
    if not config.tls:
        return None
    assert config.ca_file is not None
    try:
        return pyetcd.MultiEndpointEtcd3Client.get_secure_creds(
            config.ca_file, config.key_file, config.cert_file
        )
    except OSError as exc:
        raise InvalidArgument(f"etcd TLS file unreadable: {exc}") from exc


class Transport:
    """Thread-safe access to the cluster; see the module docstring."""

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        creds = _credentials(config)
        self.members = [Member(target, config, creds) for target in config.endpoints]
        self._lock = threading.Lock()
        self._current = random.randrange(len(self.members))  # spread clients over members
        self._token: str | None = None
        self._metadata: tuple[tuple[str, str], ...] = _LEADER_ONLY
        self._closed = False
        self.guard = RevisionGuard()

    # -- member selection ---------------------------------------------------------------

    def member(self) -> Member:
        """The current member. Lock-free: one read of ``_closed`` and of ``_current``,
        each atomic; a close right after it makes the request fail as "closed channel",
        as it would a moment later."""
        if self._closed:
            raise BackendUnavailable(f"{self.config.describe()}: the store is closed")
        return self.members[self._current]

    def rotate(self, failed: Member) -> None:
        """Move off ``failed`` to the next member (no-op if another thread already did)."""
        with self._lock:
            if self.members[self._current] is failed and len(self.members) > 1:
                self._current = (self._current + 1) % len(self.members)
                log.info(
                    "etcd: switching member",
                    extra={"failed": failed.target, "now": self.members[self._current].target},
                )

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """``hasleader``, and the auth token once there is one (one atomic read of the
        tuple :meth:`authenticate` replaces)."""
        return self._metadata

    # -- time ---------------------------------------------------------------------------

    @contextmanager
    def bounded(self, budget_s: float | None = None) -> Iterator[float]:
        """Run a public call: every request inside (on this thread) ends by one deadline,
        ``budget_s`` seconds from now (default ``max(timeout_s, connect_timeout_s)``:
        what one request may take), which it yields (``time.monotonic()`` seconds). In
        a call already, the outer deadline stays."""
        outer = _CALL.get()
        if outer is not None and outer[0] is self:
            yield outer[1]
            return
        if budget_s is None:
            budget_s = max(self.config.timeout_s, self.config.connect_timeout_s)
        deadline = time.monotonic() + budget_s
        token = _CALL.set((self, deadline))
        try:
            yield deadline
        finally:
            _CALL.reset(token)

    def _left(self, what: str, job_id: str | None, generation: int | None) -> float | None:
        """Seconds left to the current call's deadline (``None`` outside a bounded call).

        Raises:
            BackendUnavailable: none left; the request is not sent.
        """
        call = _CALL.get()
        if call is None or call[0] is not self:
            return None
        left = call[1] - time.monotonic()
        if left <= 0:
            raise BackendUnavailable(
                f"etcd {what}: not sent, the call's time ran out (timeout_s="
                f"{self.config.timeout_s:g} s, connect_timeout_s="
                f"{self.config.connect_timeout_s:g} s)", job_id=job_id, generation=generation,
            )
        return left

    # -- requests -----------------------------------------------------------------------

    def attempt(self, stub: str, method: str, request: Any, timeout_s: float) -> Any:
        """One request on the current member.

        Raises:
            Failure: no answer, or a refusal.
            StoreRegressed: the answer comes from an older history than one already seen
                (what the request wrote, if anything, stays).
        """
        for retry_auth in (True, False):
            member = self.member()
            rpc = getattr(getattr(member, stub), method)
            metadata = self._metadata if method != "Authenticate" else _LEADER_ONLY
            mark = self.guard.mark() if (stub, method) in _LINEARIZABLE else None
            try:
                response = rpc(request, timeout=timeout_s, metadata=metadata)
            except grpc.RpcError as exc:
                failure = Failure.from_rpc(member.target, exc)
                if failure.transient:
                    self.rotate(member)
                if retry_auth and failure.token_rejected and self.config.user is not None:
                    # Rejected before anything was applied: safe to re-send once.
                    self.authenticate()
                    continue
                raise failure from exc
            except ValueError as exc:  # grpc: "Cannot invoke RPC on closed channel!"
                raise Failure(member.target, None, str(exc)) from exc
            reason = self.guard.observe(response.header, mark, member.target)
            if reason is not None:
                raise StoreRegressed(reason)
            return response
        raise AssertionError("unreachable")

    def call(
        self,
        stub: str,
        method: str,
        request: Any,
        *,
        what: str,
        budget_s: float | None = None,
        job_id: str | None = None,
        generation: int | None = None,
    ) -> Any:
        """An idempotent request: on a transient failure, retried on the next member
        until ``budget_s`` (default ``connect_timeout_s``; at most what is left of a
        bounded call) has passed.

        Raises:
            BackendUnavailable (naming every member tried), AuthenticationFailed,
            SessionExpired, InvalidArgument: translated, chained to the gRPC error.
        """
        budget = self.config.connect_timeout_s if budget_s is None else budget_s
        remaining = self._left(what, job_id, generation)
        budget = budget if remaining is None else min(budget, remaining)
        deadline = time.monotonic() + budget
        failures: list[Failure] = []
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, Failure) and e.transient),
            stop=tenacity.stop_after_delay(budget),
            wait=tenacity.wait_exponential(multiplier=0.02, max=0.5)
            + tenacity.wait_random(0, 0.02),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    left = deadline - time.monotonic()
                    timeout = max(0.05, min(self.config.timeout_s, left))
                    try:
                        return self.attempt(stub, method, request, timeout)
                    except Failure as failure:
                        failures.append(failure)
                        raise
        except Failure as failure:
            raise translate(
                failure, what, failures, job_id=job_id, generation=generation,
                members=[m.target for m in self.members],
            ) from failure.__cause__
        raise AssertionError("unreachable")

    def start(
        self,
        stub: str,
        method: str,
        request: Any,
        *,
        what: str,
        budget_s: float,
        job_id: str | None = None,
        generation: int | None = None,
    ) -> Callable[[], Any]:
        """Send an idempotent request without waiting for its answer; returns
        ``finish()``, which waits for it and returns it as :meth:`call` would. So a caller
        can do something else (a keepalive) during the round trip. A transient failure
        (or a rejected token) is retried by ``finish()`` through :meth:`call`, within
        what is left of ``budget_s`` from now.

        Raises (from ``finish()``): as :meth:`call`; StoreRegressed as :meth:`attempt`.
        """
        remaining = self._left(what, job_id, generation)
        budget = budget_s if remaining is None else min(budget_s, remaining)
        deadline = time.monotonic() + budget

        def retry() -> Any:
            return self.call(stub, method, request, what=what,
                             budget_s=max(0.05, deadline - time.monotonic()),
                             job_id=job_id, generation=generation)

        member = self.member()
        mark = self.guard.mark() if (stub, method) in _LINEARIZABLE else None
        try:
            future = getattr(getattr(member, stub), method).future(
                request, timeout=max(0.05, min(self.config.timeout_s, budget)),
                metadata=self.metadata())
        except ValueError:  # grpc: "Cannot invoke RPC on closed channel!"
            return retry

        def finish() -> Any:
            try:
                response = future.result()
            except grpc.RpcError as exc:
                failure = Failure.from_rpc(member.target, exc)
                if failure.transient:
                    self.rotate(member)
                if failure.transient or (failure.token_rejected and self.config.user is not None):
                    return retry()
                raise translate(failure, what, job_id=job_id,
                                generation=generation) from exc
            except grpc.FutureCancelledError:
                return retry()
            reason = self.guard.observe(response.header, mark, member.target)
            if reason is not None:
                raise StoreRegressed(reason)
            return response

        return finish

    def send(
        self,
        stub: str,
        method: str,
        request: Any,
        *,
        what: str,
        job_id: str | None = None,
        generation: int | None = None,
    ) -> Any:
        """One attempt of a write (``timeout_s``, at most what is left of a bounded
        call). A definite refusal is raised translated; an ambiguous failure is raised as
        :class:`Failure` for the caller to settle.

        Raises:
            BackendUnavailable: no time left in the bounded call; not sent.
        """
        remaining = self._left(what, job_id, generation)
        timeout = self.config.timeout_s if remaining is None else min(self.config.timeout_s,
                                                                       remaining)
        try:
            return self.attempt(stub, method, request, timeout)
        except Failure as failure:
            if failure.ambiguous:
                raise
            raise translate(
                failure, what, job_id=job_id, generation=generation
            ) from failure.__cause__

    def authenticate(self) -> None:
        """Get a fresh token for ``user``/``password`` (no-op without credentials).

        Raises:
            AuthenticationFailed: wrong credentials, or auth not enabled on the cluster.
            BackendUnavailable: no member answered.
        """
        if self.config.user is None:
            return
        request = etcdrpc.AuthenticateRequest(name=self.config.user, password=self.config.password)
        response = self.call("auth", "Authenticate", request, what="authentication")
        with self._lock:
            self._token = str(response.token)
            self._metadata = (*_LEADER_ONLY, ("token", self._token))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for member in self.members:
            member.close()
