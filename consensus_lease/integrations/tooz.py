"""A tooz driver on consensus_lease stores: fenced locks, elections and groups.

``pip install consensus_lease[tooz]`` registers one URL scheme per store in tooz's
``tooz.backends`` entry-point group, so existing tooz code gets fencing tokens by changing
its URL::

    from tooz import coordination

    coord = coordination.get_coordinator(
        "consensus-lease+etcd://h1:2379,h2:2379,h3:2379/app", b"worker-7")
    coord.start(start_heart=True)              # heartbeats renew the session
    lock = coord.get_lock(b"invoice-42")
    with lock:
        lock.ensure_held()                     # before every effect
        write(effect, token=lock.fencing_token)  # the destination fences

========================================  ============================================
URL                                       store
========================================  ============================================
``consensus-lease+sqlite:////abs/x.db``   embedded SQLite (one machine, many processes)
``consensus-lease+etcd://h1:2379/prefix`` etcd v3 (``[etcd]`` extra)
``consensus-lease+zk://h1:2181/chroot``   ZooKeeper (``[zookeeper]`` extra); also
                                          ``consensus-lease+zookeeper``
``consensus-lease+postgresql://u:p@h/db`` PostgreSQL (``[postgresql]`` extra)
========================================  ============================================

The part after ``consensus-lease+`` is the store's own URL (:func:`consensus_lease.open_store`);
its query-string options are the store's, except these two, which belong to the driver
(``get_coordinator`` keyword arguments override the query string, as tooz defines):

============  ==============================  ==============================================
option        default                         meaning
============  ==============================  ==============================================
``timeout``   30 (seconds, float > 0)         the session TTL: how long a member, its locks
                                              and its leaderships outlive its last heartbeat
``keepalive`` ``heartbeat``; ZooKeeper:       ``heartbeat``: only ``heartbeat()`` (tooz's
              ``background``                  ``Heart`` with ``start(start_heart=True)``)
                                              renews, as tooz's timeout-based drivers do;
                                              ``background``: consensus_lease's own thread
                                              renews every TTL / 3 (members then leave only
                                              when their process stops or is cut off:
                                              ``NON_TIMEOUT_BASED``)
============  ==============================  ==============================================

How tooz maps onto the protocol (every name below lives in the store under ``tooz/``):

* A coordinator is one :class:`~consensus_lease.Session` (owner = the member id).
* ``get_lock(name)`` is a :class:`FencedLock` on the job ``tooz/lock/NAME``: each acquire
  is a claim, so :attr:`FencedLock.fencing_token` is strictly greater than every earlier
  holder's. Shared (``shared=True``) holders each hold ``tooz/reader/NAME/MEMBER``; a
  writer and a reader each claim their own key first and then read the other's, so one
  of any two overlapping attempts sees the other and backs off.
* Elections (``watch_elected_as_leader`` / ``run_watchers``) campaign in the election
  ``tooz/leader/GROUP`` with the member id as value; :meth:`Coordinator.leadership` gives
  the :class:`~consensus_lease.Leadership` and its fencing token.
* A group is a job of the queue ``tooz/groups``; a member is a job of the queue
  ``tooz/members/GROUP`` held by its session (HELD = joined); its capabilities are the
  value of the election ``tooz/caps/GROUP/MEMBER``, held by the same session.

What is refused with ``tooz.NotImplemented`` (the reason is in the message):

* ``Lock.break_()``: ending another session's hold needs a forced release the protocol
  does not have (only its holder, or its session's expiry in the store, ends a hold).
* ``leave_group`` of a membership held by *another* coordinator with the same member id:
  it would end another session's hold. Stop that coordinator instead.

Errors: every store error becomes a ``tooz.ToozError`` chained (``raise ... from``) to the
consensus_lease error: ``BackendUnavailable`` -> ``tooz.coordination.ToozConnectionError``
(nothing is known to have changed, except ``OutcomeUnknown``, which says so), a lost
session -> :class:`SessionLost` (every lock, leadership and membership of the coordinator
ended; ``stop()`` and ``start()`` again: the driver never opens a new session behind your
back), bad input -> :class:`InvalidToozArgument` (nothing changed).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Generic, TypeVar

from .._extras import install_hint

try:
    import tooz
    from tooz import coordination, locking
    from tooz import utils as tooz_utils
except ModuleNotFoundError as exc:  # pragma: no cover - the [tooz] extra is missing
    if exc.name is None or exc.name.partition(".")[0] != "tooz":
        raise
    raise ImportError(f"consensus_lease.integrations.tooz needs tooz: {install_hint('tooz')}",
                      name=exc.name) from exc

from ..election import Leadership
from ..errors import (
    BackendUnavailable,
    ClaimTimeout,
    InvalidArgument,
    JobCompleted,
    LeaseError,
    LeaseLost,
    OutcomeUnknown,
)
from ..lease import Lease
from ..options import Option, OptionTable
from ..record import JobState, LeaseRecord
from ..session import Session
from ..states import LeaseState
from ..store import LeaseStore, default_owner, open_store
from ..validation import check_owner

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Coordinator",
    "EtcdCoordinator",
    "FencedLock",
    "InvalidToozArgument",
    "LockNotHeld",
    "PostgresCoordinator",
    "SessionLost",
    "SqliteCoordinator",
    "ZooKeeperCoordinator",
]

_LOG = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_TIMEOUT_S = 30.0
"""The session TTL when the URL sets no ``timeout`` (tooz's etcd3gw driver's default)."""

_WAIT_CHUNK_S = 300.0
"""A blocking acquire without a timeout waits in chunks of this many seconds."""
_POLL_MIN_S, _POLL_MAX_S = 0.02, 0.5
"""Poll interval range while a writer waits for readers to drain (or the reverse)."""
_DELETE_WAIT_S = 10.0
"""How long a join waits for a concurrent ``delete_group`` to finish or give up."""

_GROUPS_QUEUE = "tooz/groups"

_OPTIONS = OptionTable("tooz driver", [
    Option("timeout", "seconds", DEFAULT_TIMEOUT_S, "the session TTL"),
    Option("keepalive", "str", None, "who renews the session",
           choices=("heartbeat", "background")),
])
"""The driver's own options (the module docstring's table); the rest go to the store."""


class SessionLost(coordination.ToozError):
    """The coordinator's session ended in the store (expired, or the store refused it):
    every lock, leadership and membership it held has ended. The driver does not open a
    new session by itself: ``stop()`` and ``start()`` the coordinator."""


class LockNotHeld(coordination.ToozError):
    """The lock is not held (never acquired, released, or lost with the session), so it
    has no fencing token."""


class InvalidToozArgument(coordination.ToozError):
    """A bad option or argument (chained to consensus_lease's ``InvalidArgument``);
    nothing was changed."""


def _bytes(value: bytes | str) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def _quote(value: bytes | str) -> str:
    return urllib.parse.quote(_bytes(value), safe="")


def _unquote(text: str) -> bytes:
    return urllib.parse.unquote_to_bytes(text)


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """consensus_lease errors as tooz errors, chained."""
    try:
        yield
    except tooz.ToozError:
        raise
    except LeaseLost as exc:
        raise SessionLost(f"the coordinator's session is lost: {exc}") from exc
    except OutcomeUnknown as exc:
        raise coordination.ToozError(f"outcome unknown (read it back): {exc}") from exc
    except BackendUnavailable as exc:
        raise coordination.ToozConnectionError(str(exc)) from exc
    except InvalidArgument as exc:
        raise InvalidToozArgument(str(exc)) from exc
    except LeaseError as exc:
        raise coordination.ToozError(str(exc)) from exc


class _Done(coordination.CoordAsyncResult[_T], Generic[_T]):
    """The result of a call already made (the driver calls the store synchronously)."""

    def __init__(self, value: _T | None = None, error: BaseException | None = None) -> None:
        self._value = value
        self._error = error

    def get(self, timeout: float | None = None) -> _T:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def done(self) -> bool:
        return True


def _run(call: Callable[[], _T]) -> _Done[_T]:
    """Run ``call`` now; its value, or its tooz error, for ``get()``."""
    try:
        with _translated():
            return _Done(call())
    except tooz.NotImplemented:
        raise
    except tooz.ToozError as exc:
        return _Done(error=exc)


class _LocalName:
    """This coordinator's state of one lock name (guarded by the coordinator's lock)."""

    __slots__ = ("busy", "exclusive", "reader", "readers")

    def __init__(self) -> None:
        self.busy = False
        """A thread of this coordinator is talking to the store about this name."""
        self.exclusive: FencedLock | None = None
        self.reader: Lease | None = None
        """The member's reader hold while ``readers`` > 0."""
        self.readers = 0


class FencedLock(locking.Lock):
    """A tooz lock that is a consensus_lease lease: ``acquire`` claims the job
    ``tooz/lock/NAME`` in the store (atomically, only if unowned or its holder's session
    expired), so every acquire gets a new fencing token, strictly greater than every
    earlier holder's. Pass :attr:`fencing_token` with every effect and let the
    destination reject lower ones (:mod:`consensus_lease.fencing`): a holder that paused
    past its TTL cannot overwrite its successor's writes.

    The hold lasts as long as the coordinator's session: renewed by
    ``coordinator.heartbeat()`` (or the background thread with ``keepalive=background``).
    Check :meth:`is_still_owner` or call :meth:`ensure_held` before each effect.
    """

    def __init__(self, coord: Coordinator, name: bytes) -> None:
        super().__init__(name)
        self._coord = coord
        self._lease: Lease | None = None
        self._shared = 0

    # -- what tooz defines -------------------------------------------------------------

    def acquire(
        self, blocking: bool | float = True, shared: bool = False, timeout: float | None = None
    ) -> bool:
        """Acquire the lock; ``True`` once held.

        Args:
            blocking: ``False``: one attempt. ``True``: wait (up to ``timeout`` seconds if
                given, else until acquired). A number: wait up to that many seconds.
            shared: hold it shared with other shared holders (one reader hold per member
                in the store; acquiring again in the same coordinator counts up).
            timeout: seconds (float >= 0) for ``blocking=True``.

        Returns:
            ``True`` if acquired, ``False`` if it was held elsewhere (also by another
            lock object of this coordinator, or this one) until the wait ended.

        Raises:
            SessionLost: the coordinator's session is lost; nothing is held.
            tooz.coordination.ToozConnectionError: the store could not be asked; not held.
            InvalidToozArgument: a bad ``blocking`` or ``timeout``.
        """
        deadline = self._coord._deadline(blocking, timeout)
        with _translated():
            if shared:
                return self._coord._acquire_shared(self, deadline)
            return self._coord._acquire_exclusive(self, deadline)

    def release(self) -> bool:
        """Release one hold: ``True`` if this object held the lock and the store handed it
        back; ``False`` if it held nothing or the hold had already been lost (the store's
        atomic owner + generation check refused it; never another holder's lock).

        Raises:
            tooz.coordination.ToozConnectionError: the store could not be asked; the lock
                is still held until the session's deadline.
        """
        with _translated():
            return self._coord._release(self)

    def heartbeat(self) -> bool:
        """Renew the coordinator's session (one round trip); ``True`` while held."""
        if self._lease is None and self._shared == 0:
            return False
        with _translated():
            self._coord._renew()
        return self.is_still_owner()

    def is_still_owner(self) -> bool:
        """``True`` while this object holds the lock within its local deadline (measured
        from the send time of the last successful renewal)."""
        lease = self._lease if self._lease is not None else self._coord._reader_of(self)
        return lease is not None and lease.state is LeaseState.HELD

    def break_(self) -> bool:
        raise tooz.NotImplemented(
            "consensus_lease cannot break a lock held by another session: only its holder, "
            "or its session's expiry in the store, ends a hold (the fencing token makes a "
            "stale holder's late writes harmless instead)")

    # -- fencing -----------------------------------------------------------------------

    @property
    def lease(self) -> Lease:
        """The :class:`~consensus_lease.Lease` of the current exclusive hold.

        Raises:
            LockNotHeld: not held exclusively by this object.
        """
        if self._lease is None:
            raise LockNotHeld(f"lock {self.name!r} is not held exclusively by this object")
        return self._lease

    @property
    def fencing_token(self) -> int:
        """The current hold's fencing token (the lease generation, an int): strictly
        greater than every earlier holder's of this lock name. Shared holders get their
        reader hold's generation (increasing per member, not across members).

        Raises:
            LockNotHeld: not held by this object.
        """
        lease = self._lease if self._lease is not None else self._coord._reader_of(self)
        if lease is None:
            raise LockNotHeld(f"lock {self.name!r} is not held by this object")
        return lease.generation

    def ensure_held(self) -> None:
        """Raise unless still held within the local deadline: call before every effect.

        Raises:
            LockNotHeld: never acquired or released.
            SessionLost: the hold was lost (the store may have given it to another).
            tooz.ToozError: suspended (a renewal is overdue): do not act until renewed.
        """
        lease = self._lease if self._lease is not None else self._coord._reader_of(self)
        if lease is None:
            raise LockNotHeld(f"lock {self.name!r} is not held by this object")
        with _translated():
            lease.ensure_held()

    def __repr__(self) -> str:
        return f"<FencedLock {self.name!r} lease={self._lease!r} shared={self._shared}>"


class _Membership:
    __slots__ = ("caps", "member")

    def __init__(self, member: Lease, caps: Leadership) -> None:
        self.member = member
        self.caps = caps


class Coordinator(coordination.CoordinationDriverCachedRunWatchers):
    """The tooz coordination driver on a consensus_lease store (subclassed per store for
    its ``CHARACTERISTICS``). See the module docstring for the URL options and the
    mapping; every method returns what tooz documents, raising tooz's errors."""

    STORE_SCHEME: ClassVar[str] = ""
    DEFAULT_KEEPALIVE: ClassVar[str] = "heartbeat"
    CHARACTERISTICS: tuple[coordination.Characteristics, ...] = (
        coordination.Characteristics.DISTRIBUTED_ACROSS_THREADS,
        coordination.Characteristics.DISTRIBUTED_ACROSS_PROCESSES,
    )

    def __init__(self, member_id: bytes, parsed_url: Any, options: dict[str, Any]) -> None:
        member = _bytes(member_id)
        super().__init__(member, parsed_url, options)
        opts = {key: (value[-1] if isinstance(value, list) else value)
                for key, value in options.items()}
        ours = {name: opts.pop(name) for name in _OPTIONS.names if name in opts}
        try:
            parsed = _OPTIONS.parse(ours)
        except InvalidArgument as exc:
            raise InvalidToozArgument(str(exc)) from exc
        self._ttl_s = parsed.seconds("timeout")
        self._background = (parsed.text("keepalive") or self.DEFAULT_KEEPALIVE) == "background"
        if self._background and (coordination.Characteristics.NON_TIMEOUT_BASED
                                 not in self.CHARACTERISTICS):
            self.CHARACTERISTICS = (*self.CHARACTERISTICS,
                                    coordination.Characteristics.NON_TIMEOUT_BASED)
        query = urllib.parse.urlencode({k: str(v) for k, v in opts.items()})
        self._store_url = (f"{self.STORE_SCHEME}://{parsed_url.netloc}{parsed_url.path}"
                           + (f"?{query}" if query else ""))
        text = member.decode("utf-8", "backslashreplace")
        try:
            self._owner = check_owner(text)
        except InvalidArgument:
            self._owner = default_owner()
        self._store: LeaseStore | None = None
        self._session: Session | None = None
        self._cond = threading.Condition()
        self._names: dict[bytes, _LocalName] = {}
        self._members: dict[bytes, _Membership] = {}
        self._leaderships: dict[bytes, Leadership] = {}
        self._stopping = threading.Event()

    # -- life ------------------------------------------------------------------------------

    def _start(self) -> None:
        self._stopping.clear()
        try:
            store = open_store(self._store_url)
        except ImportError as exc:
            raise coordination.ToozError(str(exc)) from exc
        except BackendUnavailable as exc:
            raise coordination.ToozConnectionError(str(exc)) from exc
        except LeaseError as exc:
            with _translated():
                raise exc
        try:
            with _translated():
                try:
                    session = store.session(owner=self._owner, ttl_s=self._ttl_s,
                                            keepalive=self._background)
                except BackendUnavailable as exc:
                    raise coordination.ToozConnectionError(str(exc)) from exc
        except BaseException:
            store.close()
            raise
        session.on_lost(self._on_lost)
        self._store, self._session = store, session

    def _on_lost(self, session: Session, reason: LeaseLost) -> None:
        _LOG.error("tooz coordinator %r lost its consensus_lease session (%s): its locks, "
                  "leaderships and memberships have ended; stop() and start() it",
                  self._member_id, reason)

    def _stop(self) -> None:
        self._stopping.set()
        store, self._store, self._session = self._store, None, None
        with self._cond:
            self._names.clear()
            self._cond.notify_all()
        self._members.clear()
        self._leaderships.clear()
        if store is not None:
            store.close()  # hands back every hold of the session

    def _live(self) -> tuple[LeaseStore, Session]:
        if self._store is None or self._session is None:
            raise coordination.ToozError("the coordinator is not started")
        return self._store, self._session

    def heartbeat(self) -> float:
        """Renew the session (one round trip); return the seconds until the next beat
        (a third of the granted TTL; tooz's ``Heart`` waits half of what is left).

        Raises:
            SessionLost: the session is gone in the store (final).
            tooz.coordination.ToozConnectionError: no answer; the session lives until
                its local deadline.
        """
        with _translated():
            return self._renew() / 3.0

    def _renew(self) -> float:
        return self._live()[1].keepalive()

    # -- locks -------------------------------------------------------------------------------

    def get_lock(self, name: bytes) -> FencedLock:
        return FencedLock(self, _bytes(name))

    def _deadline(self, blocking: bool | float, timeout: float | None) -> float | None:
        """Monotonic deadline of an acquire: now (one attempt), a time, or ``None``."""
        wait: object
        if blocking is False:
            wait = 0.0
        elif blocking is True:
            wait = timeout
        else:
            wait = blocking
        if wait is None:
            return None
        try:
            seconds = float(wait)
        except (TypeError, ValueError):
            seconds = float("nan")
        if not seconds >= 0:
            raise InvalidToozArgument(f"blocking / timeout must be seconds >= 0, not {wait!r}")
        return time.monotonic() + seconds

    def _local(self, name: bytes) -> _LocalName:
        state = self._names.get(name)
        if state is None:
            state = self._names[name] = _LocalName()
        return state

    def _wait_local(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """With ``self._cond`` held: wait until ``ready()`` or the deadline."""
        while not ready():
            if self._stopping.is_set():
                return False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._cond.wait(timeout=1.0 if left is None else min(left, 1.0))
        return True

    def _pause(self, delay: float, deadline: float | None) -> bool:
        """Sleep ``delay`` (bounded by the deadline); ``False`` if the deadline passed."""
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            delay = min(delay, left)
        self._stopping.wait(delay)  # a poll interval of a deadline loop
        return not self._stopping.is_set()

    def _acquire_exclusive(self, lock: FencedLock, deadline: float | None) -> bool:
        with self._cond:
            state = self._local(lock.name)
            if not self._wait_local(lambda: not state.busy and state.exclusive is None
                                    and state.readers == 0, deadline):
                return False
            state.busy = True
        lease: Lease | None = None
        try:
            lease = self._claim_exclusive(lock.name, deadline)
        finally:
            with self._cond:
                state.busy = False
                if lease is not None:
                    state.exclusive, lock._lease = lock, lease
                self._cond.notify_all()
        return lease is not None

    def _claim_exclusive(self, name: bytes, deadline: float | None) -> Lease | None:
        store, session = self._live()
        job = f"tooz/lock/{_quote(name)}"
        readers = f"tooz/readers/{_quote(name)}"
        delay = _POLL_MIN_S
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                if left is not None and left <= 0:
                    lease = session.claim(job)
                else:
                    lease = session.claim(job, wait_s=_WAIT_CHUNK_S if left is None
                                          else min(left, _WAIT_CHUNK_S))
            except ClaimTimeout:
                lease = None
            if lease is not None:
                if not any(j.record.state is JobState.HELD for j in store.queue_jobs(readers)):
                    return lease
                lease.release()  # shared holders came first: back off
            if deadline is not None and deadline - time.monotonic() <= 0:
                return None
            if not self._pause(delay * random.uniform(0.5, 1.0), deadline):
                return None  # jittered: a writer and a reader never back off in step
            delay = min(delay * 2, _POLL_MAX_S)

    def _acquire_shared(self, lock: FencedLock, deadline: float | None) -> bool:
        with self._cond:
            state = self._local(lock.name)
            if not self._wait_local(lambda: not state.busy and state.exclusive is None,
                                    deadline):
                return False
            if state.readers > 0:
                state.readers += 1
                lock._shared += 1
                return True
            state.busy = True
        reader: Lease | None = None
        try:
            reader = self._claim_shared(lock.name, deadline)
        finally:
            with self._cond:
                state.busy = False
                if reader is not None:
                    state.reader, state.readers = reader, 1
                    lock._shared += 1
                self._cond.notify_all()
        return reader is not None

    def _claim_shared(self, name: bytes, deadline: float | None) -> Lease | None:
        store, session = self._live()
        job = f"tooz/lock/{_quote(name)}"
        reader_job = f"tooz/reader/{_quote(name)}/{_quote(self._member_id)}"
        store.enqueue(f"tooz/readers/{_quote(name)}", reader_job)
        delay = _POLL_MIN_S
        while True:
            reader = session.claim(reader_job)
            if reader is not None:
                record = store.get(job)
                if record is None or record.state is not JobState.HELD:
                    return reader
                reader.release()  # a writer came first: back off
            if not self._pause(delay * random.uniform(0.5, 1.0), deadline):
                return None
            delay = min(delay * 2, _POLL_MAX_S)

    def _reader_of(self, lock: FencedLock) -> Lease | None:
        with self._cond:
            state = self._names.get(lock.name)
            return state.reader if state is not None and lock._shared > 0 else None

    def _release(self, lock: FencedLock) -> bool:
        with self._cond:
            state = self._names.get(lock.name)
            if state is None:
                return False
            if state.exclusive is lock and lock._lease is not None:
                lease: Lease | None = lock._lease
            elif lock._shared > 0:
                lock._shared -= 1
                state.readers -= 1
                if state.readers > 0:
                    return True
                lease, state.reader = state.reader, None
            else:
                return False
            state.busy = True
        try:
            assert lease is not None
            return self._hand_back(lease)
        finally:
            with self._cond:
                if state.exclusive is lock:
                    state.exclusive, lock._lease = None, None
                state.busy = False
                self._cond.notify_all()

    @staticmethod
    def _hand_back(lease: Lease) -> bool:
        """Release ``lease``: ``True`` if the store handed it back, ``False`` if it had
        been lost already (logged: a lost hold is never silent)."""
        if lease.state is not LeaseState.HELD and lease.state is not LeaseState.SUSPENDED:
            _LOG.warning("tooz lock hold %r was already %s", lease.job_id, lease.state.value)
            return False
        try:
            lease.release()
        except LeaseLost as exc:
            _LOG.warning("tooz lock hold %r was lost before its release: %s", lease.job_id, exc)
            return False
        return True

    # -- groups -----------------------------------------------------------------------------

    @staticmethod
    def _group_job(group_id: bytes) -> str:
        return f"tooz/group/{_quote(group_id)}"

    @staticmethod
    def _members_queue(group_id: bytes) -> str:
        return f"tooz/members/{_quote(group_id)}"

    @staticmethod
    def _member_job(group_id: bytes, member_id: bytes) -> str:
        return f"tooz/member/{_quote(group_id)}/{_quote(member_id)}"

    @staticmethod
    def _caps_name(group_id: bytes, member_id: bytes) -> str:
        return f"tooz/caps/{_quote(group_id)}/{_quote(member_id)}"

    def _group_record(self, group_id: bytes) -> LeaseRecord | None:
        """The group's record if the group exists (AVAILABLE, or HELD while a
        ``delete_group`` decides), else ``None``."""
        record = self._live()[0].get(self._group_job(group_id))
        if record is None or record.state not in (JobState.AVAILABLE, JobState.HELD):
            return None
        return record

    def _require_group(self, group_id: bytes) -> None:
        if self._group_record(group_id) is None:
            raise coordination.GroupNotCreated(group_id)

    def create_group(self, group_id: bytes) -> _Done[None]:
        group = _bytes(group_id)

        def create() -> None:
            store = self._live()[0]
            if store.enqueue(_GROUPS_QUEUE, self._group_job(group)):
                return
            record = store.get(self._group_job(group))
            if record is not None and record.state is JobState.COMPLETED:
                store.purge(_GROUPS_QUEUE)  # deleted, not yet purged
                if store.enqueue(_GROUPS_QUEUE, self._group_job(group)):
                    return
            raise coordination.GroupAlreadyExist(group)

        return _run(create)

    def get_groups(self) -> _Done[list[bytes]]:
        def groups() -> list[bytes]:
            prefix = len("tooz/group/")
            return [_unquote(job.record.job_id[prefix:])
                    for job in self._live()[0].queue_jobs(_GROUPS_QUEUE)
                    if job.record.state is not JobState.COMPLETED]

        return _run(groups)

    def delete_group(self, group_id: bytes) -> _Done[None]:
        group = _bytes(group_id)

        def delete() -> None:
            store, session = self._live()
            self._require_group(group)
            try:
                hold = session.claim(self._group_job(group), wait_s=_DELETE_WAIT_S)
            except JobCompleted:
                raise coordination.GroupNotCreated(group) from None
            if self._members_of(group):
                hold.release()
                raise coordination.GroupNotEmpty(group)
            hold.complete(b"deleted")
            store.purge(_GROUPS_QUEUE)

        return _run(delete)

    def _members_of(self, group: bytes) -> set[bytes]:
        prefix = len(self._member_job(group, b""))
        return {_unquote(job.record.job_id[prefix:])
                for job in self._live()[0].queue_jobs(self._members_queue(group))
                if job.record.state is JobState.HELD}

    def join_group(
        self, group_id: bytes, capabilities: coordination.Capabilities | None = None
    ) -> _Done[None]:
        group = _bytes(group_id)

        def join() -> None:
            store, session = self._live()
            if group in self._members:
                raise coordination.MemberAlreadyExist(group, self._member_id)
            self._require_group(group)
            value = tooz_utils.dumps(capabilities)
            job = self._member_job(group, self._member_id)
            store.enqueue(self._members_queue(group), job)
            member = session.claim(job)
            if member is None:
                raise coordination.MemberAlreadyExist(group, self._member_id)
            try:
                caps = session.campaign(self._caps_name(group, self._member_id), value)
                if caps is None:
                    raise coordination.MemberAlreadyExist(group, self._member_id)
                try:
                    self._check_not_deleted(group)
                except BaseException:
                    caps.resign()
                    raise
            except BaseException:
                member.release()
                raise
            self._members[group] = _Membership(member, caps)
            self._joined_groups.add(group)

        return _run(join)

    def _check_not_deleted(self, group: bytes) -> None:
        """After the member's claim: a ``delete_group`` that read the members before it
        holds the group job until it completes it; wait for its decision."""
        deadline = time.monotonic() + _DELETE_WAIT_S
        while True:
            record = self._group_record(group)
            if record is None:
                raise coordination.GroupNotCreated(group)
            if record.state is JobState.AVAILABLE:
                return
            if not self._pause(_POLL_MIN_S, deadline):
                raise coordination.ToozError(
                    f"group {group!r} is being deleted by another coordinator; try again")

    def leave_group(self, group_id: bytes) -> _Done[None]:
        group = _bytes(group_id)

        def leave() -> None:
            store = self._live()[0]
            membership = self._members.pop(group, None)
            if membership is None:
                self._require_group(group)
                record = store.get(self._member_job(group, self._member_id))
                if record is not None and record.state is JobState.HELD:
                    raise tooz.NotImplemented(
                        "this member id's membership is held by another coordinator's "
                        "session; ending it would end another session's hold: stop that "
                        "coordinator instead")
                raise coordination.MemberNotJoined(group, self._member_id)
            self._joined_groups.discard(group)
            lost = not self._hand_back(membership.member)
            self._hand_back(membership.caps)
            if lost:
                raise coordination.MemberNotJoined(group, self._member_id)

        return _run(leave)

    def get_members(self, group_id: bytes) -> _Done[set[bytes]]:
        group = _bytes(group_id)

        def members() -> set[bytes]:
            self._require_group(group)
            return self._members_of(group)

        return _run(members)

    def _capabilities(self, group: bytes, member: bytes) -> tuple[Any, LeaseRecord]:
        store = self._live()[0]
        record = store.get(self._member_job(group, member))
        leader = store.leader(self._caps_name(group, member))
        if record is None or record.state is not JobState.HELD or leader is None:
            raise coordination.MemberNotJoined(group, member)
        return tooz_utils.loads(leader.value), record

    def get_member_capabilities(
        self, group_id: bytes, member_id: bytes
    ) -> _Done[coordination.Capabilities | None]:
        group, member = _bytes(group_id), _bytes(member_id)

        def capabilities() -> Any:
            self._require_group(group)
            return self._capabilities(group, member)[0]

        return _run(capabilities)

    def get_members_with_capabilities(
        self, group_id: bytes
    ) -> _Done[dict[bytes, coordination.Capabilities | None]]:
        group = _bytes(group_id)

        def all_capabilities() -> dict[bytes, Any]:
            self._require_group(group)
            out: dict[bytes, Any] = {}
            for member in self._members_of(group):
                try:
                    out[member] = self._capabilities(group, member)[0]
                except coordination.MemberNotJoined:
                    continue  # left between the two reads
            return out

        return _run(all_capabilities)

    def get_member_info(self, group_id: bytes, member_id: bytes) -> _Done[dict[str, Any]]:
        """``capabilities``, plus the membership's ``generation`` (its fencing token),
        ``owner`` and ``lease_until`` (store clock, seconds since the epoch, or None)."""
        group, member = _bytes(group_id), _bytes(member_id)

        def info() -> dict[str, Any]:
            self._require_group(group)
            caps, record = self._capabilities(group, member)
            return {"capabilities": caps, "generation": record.generation,
                    "owner": record.owner, "lease_until": record.lease_until}

        return _run(info)

    def update_capabilities(
        self, group_id: bytes, capabilities: coordination.Capabilities
    ) -> _Done[None]:
        group = _bytes(group_id)

        def update() -> None:
            membership = self._members.get(group)
            if membership is None:
                self._require_group(group)
                raise coordination.MemberNotJoined(group, self._member_id)
            membership.caps.proclaim(tooz_utils.dumps(capabilities))

        return _run(update)

    # -- elections ----------------------------------------------------------------------------

    @staticmethod
    def _leader_name(group_id: bytes) -> str:
        return f"tooz/leader/{_quote(group_id)}"

    def leadership(self, group_id: bytes) -> Leadership | None:
        """This coordinator's :class:`~consensus_lease.Leadership` of the group (its
        ``generation`` is the leader's fencing token), or ``None`` if it does not lead."""
        held = self._leaderships.get(_bytes(group_id))
        return held if held is not None and held.state is LeaseState.HELD else None

    def run_elect_coordinator(self) -> None:
        self._elect()

    def _elect(self) -> list[Any]:
        results: list[Any] = []
        with _translated():
            session = self._live()[1]
            for group, hooks in list(self._hooks_elected_leader.items()):
                if self.leadership(group) is not None:
                    continue
                self._leaderships.pop(group, None)
                won = session.campaign(self._leader_name(group), self._member_id)
                if won is None:
                    continue
                self._leaderships[group] = won
                results.extend(hooks.run(coordination.LeaderElected(group, self._member_id)))
        return results

    def run_watchers(self, timeout: float | None = None) -> list[Any]:
        results = super().run_watchers(timeout)
        results.extend(self._elect())
        return results

    def get_leader(self, group_id: bytes) -> _Done[bytes]:
        group = _bytes(group_id)

        def leader() -> Any:
            record = self._live()[0].leader(self._leader_name(group))
            return None if record is None else record.value

        return _run(leader)

    def stand_down_group_leader(self, group_id: bytes) -> bool:
        held = self._leaderships.pop(_bytes(group_id), None)
        if held is None:
            return False
        with _translated():
            return self._hand_back(held)


class SqliteCoordinator(Coordinator):
    """``consensus-lease+sqlite://``: the embedded SQLite store (one machine)."""

    STORE_SCHEME = "sqlite"


class EtcdCoordinator(Coordinator):
    """``consensus-lease+etcd://``: etcd v3 (linearizable reads and writes)."""

    STORE_SCHEME = "etcd"
    CHARACTERISTICS = (
        *Coordinator.CHARACTERISTICS,
        coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
        coordination.Characteristics.LINEARIZABLE,
        coordination.Characteristics.SERIALIZABLE,
    )


class ZooKeeperCoordinator(Coordinator):
    """``consensus-lease+zk://``: ZooKeeper. The ZooKeeper session is kept alive by the
    client's pings whatever the driver does, so the default is ``keepalive=background``
    (``NON_TIMEOUT_BASED``, as tooz's own ZooKeeper driver)."""

    STORE_SCHEME = "zk"
    DEFAULT_KEEPALIVE = "background"
    CHARACTERISTICS = (
        *Coordinator.CHARACTERISTICS,
        coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
        coordination.Characteristics.SEQUENTIAL,
    )


class PostgresCoordinator(Coordinator):
    """``consensus-lease+postgresql://``: PostgreSQL (one primary)."""

    STORE_SCHEME = "postgresql"
    CHARACTERISTICS = (
        *Coordinator.CHARACTERISTICS,
        coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
        coordination.Characteristics.LINEARIZABLE,
    )
