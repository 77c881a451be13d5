"""kazoo's private surface: every kazoo internal this driver relies on, in one place, and
the check made when a store is opened that the installed kazoo still has them.

Every other module of the driver uses kazoo's documented API only (``kazoo.client``'s
``KazooClient`` and ``KazooState``, ``kazoo.exceptions``, ``kazoo.retry``,
``kazoo.security``, ``kazoo.protocol.states``, and the handler's timeout exception
``kazoo.handlers.threading.KazooTimeoutError``, which is what a handler's documented
``timeout_exception`` is), plus the names of this module. The rule is enforced by
``tests/backends/test_zookeeper_kazoo.py``.

What is relied on here, each verified on kazoo 2.11.0 (:data:`VERIFIED`; all of it but
``SessionClosedRequireSaslError`` is in 2.10.0 too):

* ``KazooClient._call(request, result)``: :func:`send_request` (a packed multi queued on
  the client's connection).
* the request record protocol of ``kazoo.protocol.connection``
  (``ConnectionHandler._submit`` frames ``len, xid, type, serialize()``; ``_read_response`` calls
  ``deserialize``): :class:`PackedMulti` (``type``, ``serialize()``, ``deserialize(buffer,
  offset)``; a record whose ``type`` is the multi's is "unchrooted" by kazoo, a no-op
  with no chroot).
* ``kazoo.protocol.serialization``'s ``CheckVersion``, ``Create``, ``SetData``,
  ``Delete``, ``Transaction``: :class:`KazooRecords` (kazoo's own records, appended to a
  ``TransactionRequest``) and :class:`PackedMulti` (``Transaction.type`` and
  ``Transaction.deserialize``).
* ``TransactionRequest.operations`` and ``.client``: :class:`KazooRecords`.
* ``KazooClient.chroot`` and ``.default_acl`` (attributes): :class:`KazooRecords`,
  :class:`PackedMulti`.
* ``KazooClient.last_zxid``, set from each reply header before the answer is handed out:
  :func:`last_zxid`.
* the "Session created" log call of ``ConnectionHandler._connect`` (args: session id,
  password, negotiated timeout in ms): :class:`NegotiatedTimeouts` (the only place kazoo
  shows the negotiated session timeout).
* ``kazoo.handlers.utils.fileobj_to_fd``, and the connection thread waiting through
  ``handler.select``: :func:`poll_select`, :class:`PollHandler`.
* ``KazooClient.start()`` / ``stop()`` calling ``handler.start()`` / ``handler.stop()``
  once each: :class:`SharedPollHandler` (one handler for many clients, counted).
* ``kazoo.handlers.utils.AsyncResult``: :data:`AsyncResult` (what
  ``handler.async_result()`` returns, told from a test's stand-in).
* ``ConnectionHandler._submit`` and ``serialization.Ping``: :func:`count_requests` (the
  benchmarks' request counter; never used by the driver).
* ``KazooClient._stopped`` (the event ``stop()`` sets first): :func:`client_stopping`
  (a reconnect wait of :mod:`._transport_reconnect` ends when kazoo stops the client).
* ``kazoo.exceptions.SessionClosedRequireSaslError``: :data:`AUTH_REFUSED` (public, but
  new in 2.11.0: the floor of the tested range).

The tested range is :data:`TESTED_SPEC` (also the pin in ``pyproject.toml``). When a
store is opened (:meth:`ZooKeeperBackend.from_url`), :func:`check_installed` looks at the
kazoo that is imported:

* an internal missing (a name, a method, an attribute of a new client, a record's type
  code): ``UnsupportedBackend`` naming what is missing, the installed version and the
  tested range, before anything is connected: never an ``AttributeError`` in the middle
  of an operation;
* everything present but a version outside the tested range: an
  :class:`UntestedKazooWarning` (a ``UserWarning``: shown once per process by default;
  ``warnings.filterwarnings("error", category=UntestedKazooWarning)`` makes it an error).

The negotiated-timeout log call cannot be checked without a connection: a session whose
timeout kazoo did not log is refused at its open (``BackendUnavailable`` from
``ZkSession.connected``), never given a guessed TTL.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import math
import re
import select
import struct
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import kazoo
import kazoo.exceptions
from kazoo.client import KazooClient
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.security import OPEN_ACL_UNSAFE

from ...errors import UnsupportedBackend

__all__ = [
    "AUTH_REFUSED",
    "TESTED_SPEC",
    "VERIFIED",
    "AsyncResult",
    "KazooRecords",
    "NegotiatedTimeouts",
    "PackedMulti",
    "PollHandler",
    "SharedPollHandler",
    "UntestedKazooWarning",
    "check_installed",
    "client_stopping",
    "count_requests",
    "follow_connection_thread",
    "installed_version",
    "last_zxid",
    "missing_internals",
    "poll_select",
    "send_request",
]

TESTED_MIN = (2, 11)
"""The oldest kazoo (major, minor) tested."""
TESTED_BELOW = (2, 12)
"""The first kazoo (major, minor) not tested: the next minor after the newest verified."""
TESTED_SPEC = ">=2.11,<2.12"
"""The tested range as a requirement specifier (the pin in ``pyproject.toml``)."""
VERIFIED = ("2.11.0",)
"""The kazoo releases this module was verified against (the unit tests, the ZooKeeper
backend tests and the conformance suite on the kit's 3-member ensemble). 2.11.0 is the
newest on PyPI as of this module's writing. 2.10.0 has every internal below but not
``kazoo.exceptions.SessionClosedRequireSaslError`` (new in 2.11.0): opening a store with
it is refused (see :func:`check_installed`)."""


class UntestedKazooWarning(UserWarning):
    """The installed kazoo is outside :data:`TESTED_SPEC`: every internal this driver
    relies on is there (else ``UnsupportedBackend``), but how they behave was not tested
    with that version. Install a kazoo in the tested range (``pip install
    'kazoo>=2.11,<2.12'``)."""


# -- kazoo's private names, imported so that a kazoo without them still imports ------------

try:
    import kazoo.protocol.serialization as _serialization
except ImportError:  # pragma: no cover - a kazoo that moved its records
    _serialization = None
try:
    import kazoo.protocol.connection as _connection
except ImportError:  # pragma: no cover - a kazoo that moved its connection
    _connection = None
try:
    import kazoo.handlers.utils as _handler_utils
except ImportError:  # pragma: no cover
    _handler_utils = None

CheckVersion: Any = getattr(_serialization, "CheckVersion", None)
Create: Any = getattr(_serialization, "Create", None)
SetData: Any = getattr(_serialization, "SetData", None)
Delete: Any = getattr(_serialization, "Delete", None)
KazooTransaction: Any = getattr(_serialization, "Transaction", None)
Ping: Any = getattr(_serialization, "Ping", None)
ConnectionHandler: Any = getattr(_connection, "ConnectionHandler", None)
fileobj_to_fd: Any = getattr(_handler_utils, "fileobj_to_fd", None)
AsyncResult: Any = getattr(_handler_utils, "AsyncResult", None)
"""kazoo's async result class (``kazoo.handlers.utils.AsyncResult``; the threading
handler's ``async_result()`` makes a subclass of it)."""

SessionClosedRequireSaslError: Any = getattr(kazoo.exceptions,
                                             "SessionClosedRequireSaslError", None)
"""The error of a session the server closed for want of SASL authentication (new in kazoo
2.11.0: before, kazoo failed such a reply with a bare ``RuntimeError``)."""
AUTH_REFUSED: tuple[type[BaseException], ...] = tuple(
    error for error in (kazoo.exceptions.NoAuthError, kazoo.exceptions.AuthFailedError,
                        SessionClosedRequireSaslError) if error is not None)
"""kazoo's errors of a server that refused the credentials (``AuthenticationFailed``)."""

_IMPORTED = {
    "kazoo.exceptions.SessionClosedRequireSaslError": "SessionClosedRequireSaslError",
    "kazoo.protocol.serialization.CheckVersion": "CheckVersion",
    "kazoo.protocol.serialization.Create": "Create",
    "kazoo.protocol.serialization.SetData": "SetData",
    "kazoo.protocol.serialization.Delete": "Delete",
    "kazoo.protocol.serialization.Transaction": "KazooTransaction",
    "kazoo.protocol.connection.ConnectionHandler": "ConnectionHandler",
    "kazoo.handlers.utils.fileobj_to_fd": "fileobj_to_fd",
    "kazoo.handlers.utils.AsyncResult": "AsyncResult",
}
"""Dotted kazoo name -> the global of this module it was imported as (``None`` if
missing)."""

MULTI_TYPE = 14
"""ZooKeeper's opcode of a multi (``OpCode.multi``), kazoo's ``Transaction.type``."""
OP_TYPES = {"CheckVersion": 13, "Create": 1, "SetData": 5, "Delete": 2}
"""ZooKeeper's opcodes of the operations :class:`PackedMulti` packs by hand (checked
against kazoo's records at open)."""

_METHODS = (
    (KazooClient, "_call"),
    (KazooClient, "transaction"),
    (SequentialThreadingHandler, "select"),
    (SequentialThreadingHandler, "start"),
    (SequentialThreadingHandler, "stop"),
    (SequentialThreadingHandler, "async_result"),
)
"""Methods of kazoo's classes relied on (besides those of the records and connection)."""


# -- the version and what is present -------------------------------------------------------


def installed_version() -> str:
    """The version of the kazoo that is imported (``kazoo.__version__``, else the
    installed distribution's metadata; ``""`` if neither says)."""
    text = getattr(kazoo, "__version__", None)
    if isinstance(text, str) and text:
        return text
    try:
        return importlib.metadata.version("kazoo")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _minor(text: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string (``"2.12.0rc1"`` -> ``(2, 12)``), or
    ``None`` if it does not start with two numbers."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def in_tested_range(text: str) -> bool:
    """Whether kazoo version ``text`` is within :data:`TESTED_SPEC` (a pre-release of the
    first untested minor, ``2.12.0rc1``, is outside; ``2.11.1`` inside)."""
    minor = _minor(text)
    return minor is not None and TESTED_MIN <= minor < TESTED_BELOW


def missing_internals() -> list[str]:
    """The kazoo internals this module relies on that the imported kazoo lacks (dotted
    names; empty when all are there). Makes one client (never started: no thread, no
    socket; some 0.15 ms) to look at its attributes."""
    missing = [name for name, attr in _IMPORTED.items() if globals()[attr] is None]
    missing += [f"{owner.__module__}.{owner.__qualname__}.{name}" for owner, name in _METHODS
                if not callable(getattr(owner, name, None))]
    for name, code in OP_TYPES.items():
        record = globals()[name]
        if record is not None and getattr(record, "type", None) != code:
            missing.append(f"kazoo.protocol.serialization.{name}.type == {code}")
    if KazooTransaction is not None:
        if getattr(KazooTransaction, "type", None) != MULTI_TYPE:
            missing.append(f"kazoo.protocol.serialization.Transaction.type == {MULTI_TYPE}")
        if not callable(getattr(KazooTransaction, "deserialize", None)):
            missing.append("kazoo.protocol.serialization.Transaction.deserialize")
    if ConnectionHandler is not None:
        missing += [f"kazoo.protocol.connection.ConnectionHandler.{name}"
                    for name in ("_submit", "_read_response")
                    if not callable(getattr(ConnectionHandler, name, None))]
    missing += _missing_on_a_client()
    return missing


def _missing_on_a_client() -> list[str]:
    """The attributes relied on that a new (not started) client or its transaction lacks."""
    try:
        client = KazooClient(hosts="127.0.0.1:2181")
        tx = client.transaction()
    except Exception as exc:  # a kazoo whose client cannot even be made
        return [f"kazoo.client.KazooClient() ({exc!r})"]
    missing = []
    if not isinstance(getattr(client, "last_zxid", None), int):
        missing.append("KazooClient.last_zxid (an int)")
    missing += [f"KazooClient.{name}" for name in ("chroot", "default_acl", "handler")
                if not hasattr(client, name)]
    if not callable(getattr(getattr(client, "_stopped", None), "is_set", None)):
        missing.append("KazooClient._stopped (an Event)")
    if not callable(getattr(getattr(client, "_connection", None), "zk_loop", None)):
        missing.append("KazooClient._connection.zk_loop (the connection thread's function)")
    if not isinstance(getattr(tx, "operations", None), list):
        missing.append("TransactionRequest.operations (a list)")
    if getattr(tx, "client", None) is not client:
        missing.append("TransactionRequest.client")
    return missing


def check_installed() -> None:
    """Check the imported kazoo at a store's open (see the module docstring).

    Raises:
        UnsupportedBackend: an internal this driver relies on is missing; nothing was
            connected. The message names them, the installed version and the tested
            range.

    Warns:
        UntestedKazooWarning: every internal is there but the version is outside
            :data:`TESTED_SPEC` (or unknown).
    """
    version = installed_version() or "of unknown version"
    missing = missing_internals()
    if missing:
        raise UnsupportedBackend(
            f"the installed kazoo ({version}) lacks what the ZooKeeper backend relies on: "
            f"{', '.join(missing)}; install a tested kazoo: pip install 'kazoo{TESTED_SPEC}'"
        )
    if not in_tested_range(version):
        warnings.warn(
            f"kazoo {version} is outside the range the ZooKeeper backend was tested with "
            f"(kazoo{TESTED_SPEC}; verified: {', '.join(VERIFIED)}); it has every internal "
            f"the backend relies on, but install a tested one: pip install "
            f"'kazoo{TESTED_SPEC}'",
            UntestedKazooWarning, stacklevel=3,
        )


# -- requests ------------------------------------------------------------------------------


def send_request(client: KazooClient, request: Any) -> Any:
    """Start ``request`` (a :class:`PackedMulti`) on ``client`` as kazoo's
    ``TransactionRequest.commit_async`` starts its own: an async result from the client's
    handler, and the request queued for the connection thread by ``KazooClient._call``
    (which fails the result at once if the client is closed, its session expired or its
    authentication failed). Returns the async result.

    Relies on ``KazooClient._call`` (verified on kazoo 2.11.0; looked up on each
    call, so a test may wrap it on one client)."""
    result = client.handler.async_result()
    client._call(request, result)
    return result


def client_stopping(client: KazooClient) -> bool:
    """Whether ``client.stop()`` has begun (``KazooClient._stopped``, set before kazoo
    waits for the client's connection thread to end)."""
    return bool(client._stopped.is_set())


def follow_connection_thread(client: KazooClient, started: Callable[[], None],
                             ended: Callable[[], None]) -> None:
    """Call ``started`` on ``client``'s connection thread as it starts, before its first
    connection attempt, and ``ended`` as the thread ends. Call before ``client.start()``:
    kazoo's ``ConnectionHandler.start`` spawns the thread on the handler's
    ``zk_loop`` attribute (verified on kazoo 2.11.0), which this replaces on the
    instance with a wrapper."""
    connection = client._connection
    zk_loop = connection.zk_loop

    def followed_zk_loop() -> None:
        started()
        try:
            zk_loop()
        finally:
            ended()

    connection.zk_loop = followed_zk_loop


def last_zxid(client: KazooClient) -> int:
    """The zxid of the last answer ``client`` was given (0 before any). kazoo sets
    ``KazooClient.last_zxid`` from each reply's header before it hands out the answer
    (verified on kazoo 2.11.0)."""
    return int(client.last_zxid or 0)


def _any_or_given(version: int | None, path: str) -> int:
    """-1 (any version) for ``None``, else ``version`` (subclasses check the range)."""
    return -1 if version is None else version


class KazooRecords:
    """Adds operations to a kazoo ``TransactionRequest`` as kazoo's own request records
    (``kazoo.protocol.serialization``'s ``CheckVersion``, ``Create``, ``SetData``,
    ``Delete``), appended to its ``operations`` list, with the method names of
    ``TransactionRequest`` but none of its per-operation checks, chroot handling and
    logging. Paths must be absolute and normalised, and the client has no chroot of its
    own; creates get the client's default ACL, as kazoo's do. ``version_of(version,
    path)`` turns each version into the request's field (here -1 for ``None``).

    Relies on ``TransactionRequest.operations`` / ``.client``, ``KazooClient.chroot`` /
    ``.default_acl`` and the record classes (verified on kazoo 2.11.0).

    Raises:
        ValueError: the client has a chroot of its own.
    """

    __slots__ = ("_acl", "_append")
    version_of: Callable[[int | None, str], int] = staticmethod(_any_or_given)

    def __init__(self, tx: Any) -> None:
        if tx.client.chroot:
            raise ValueError("a kazoo client with a chroot of its own")
        self._append = tx.operations.append
        self._acl = tx.client.default_acl or OPEN_ACL_UNSAFE

    def check(self, path: str, version: int | None) -> None:
        self._append(CheckVersion(path, self.version_of(version, path)))

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False) -> None:
        self._append(Create(path, value, self._acl, 1 if ephemeral else 0))

    def set_data(self, path: str, value: bytes, version: int | None = None) -> None:
        self._append(SetData(path, value, self.version_of(version, path)))

    def delete(self, path: str, version: int | None = None) -> None:
        self._append(Delete(path, self.version_of(version, path)))


_OP = struct.Struct("!iBii")
"""An operation's multi header (its type, done = 0, err = -1), then its path's length."""
_INT = struct.Struct("!i")
_END = struct.Struct("!iBi").pack(-1, 1, -1)
"""The header that ends a multi (type -1, done, err -1)."""
_FLAGS = (_INT.pack(0), _INT.pack(1))  # a create's flags: persistent, ephemeral
_ACLS: dict[tuple[Any, ...], bytes] = {}  # an ACL list -> its bytes (a few per process)


def _acl_bytes(acl: list[Any] | tuple[Any, ...]) -> bytes:
    key = tuple(acl)
    packed = _ACLS.get(key)
    if packed is None:
        parts = [_INT.pack(len(key))]
        for entry in key:
            scheme, ident = entry.id.scheme.encode(), entry.id.id.encode()
            parts += (_INT.pack(entry.perms), _INT.pack(len(scheme)), scheme,
                      _INT.pack(len(ident)), ident)
        packed = _ACLS[key] = b"".join(parts)
    return packed


class PackedMulti:
    """A multi request packed into the bytes kazoo would send for it as its operations
    are added (ZooKeeper's wire format of ``MultiTransactionRecord``), to be queued on a
    client's connection by :func:`send_request` in place of kazoo's own ``Transaction``
    record: it has what kazoo's connection asks of a request record, the multi's
    ``type`` (so kazoo decodes and "unchroots" the answer as a multi's: a no-op without
    a chroot), ``serialize()`` (the body: kazoo frames it with its length, xid and
    type) and ``deserialize(buffer, offset)`` (kazoo's own ``Transaction.deserialize``).
    Paths are absolute and normalised and the client has no chroot of its own; creates
    get the client's default ACL, as kazoo's do. ``version_of(version, path)`` turns each
    version into the request's field (here -1 for ``None``).

    Relies on the request record protocol of ``kazoo.protocol.connection`` and on
    ``serialization.Transaction`` (verified on kazoo 2.11.0).

    Args:
        client: the kazoo client it will be sent on.

    Attributes:
        op_types: the ZooKeeper type of each operation added, in order (``check`` 13,
            ``create`` 1, ``set_data`` 5, ``delete`` 2).

    Raises:
        ValueError: the client has a chroot of its own.
    """

    type = MULTI_TYPE
    __slots__ = ("_acl", "_parts", "op_types")
    version_of: Callable[[int | None, str], int] = staticmethod(_any_or_given)

    def __init__(self, client: Any) -> None:
        if client.chroot:
            raise ValueError("a kazoo client with a chroot of its own")
        self._acl = _acl_bytes(client.default_acl or OPEN_ACL_UNSAFE)
        self._parts: list[bytes] = []
        self.op_types: list[int] = []

    def check(self, path: str, version: int | None) -> None:
        name = path.encode()
        self._parts += (_OP.pack(13, 0, -1, len(name)), name,
                        _INT.pack(self.version_of(version, path)))
        self.op_types.append(13)

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False) -> None:
        name = path.encode()
        self._parts += (_OP.pack(1, 0, -1, len(name)), name, _INT.pack(len(value)), value,
                        self._acl, _FLAGS[1 if ephemeral else 0])
        self.op_types.append(1)

    def set_data(self, path: str, value: bytes, version: int | None = None) -> None:
        name = path.encode()
        self._parts += (_OP.pack(5, 0, -1, len(name)), name, _INT.pack(len(value)), value,
                        _INT.pack(self.version_of(version, path)))
        self.op_types.append(5)

    def delete(self, path: str, version: int | None = None) -> None:
        name = path.encode()
        self._parts += (_OP.pack(2, 0, -1, len(name)), name,
                        _INT.pack(self.version_of(version, path)))
        self.op_types.append(2)

    def serialize(self) -> bytes:
        """The request's body (kazoo's connection adds its length, xid and type)."""
        return b"".join(self._parts) + _END

    @staticmethod
    def deserialize(buffer: bytes, offset: int) -> list[Any]:
        """The answer's per-operation results, as kazoo decodes a multi's."""
        return KazooTransaction.deserialize(buffer, offset)  # type: ignore[no-any-return]

    def __repr__(self) -> str:  # kazoo's debug log names the request
        return f"{type(self).__name__}(packed, operation types {self.op_types})"


@contextlib.contextmanager
def count_requests(add: Callable[[str], None]) -> Iterator[None]:
    """While inside, call ``add(name)`` with the record class name of every request any
    kazoo connection of this process sends (pings left out): for the benchmarks' request
    counts. Wraps ``ConnectionHandler._submit`` (verified on kazoo 2.11.0).

    Raises:
        UnsupportedBackend: this kazoo has no such method (see :func:`check_installed`).
    """
    if ConnectionHandler is None or not callable(getattr(ConnectionHandler, "_submit", None)):
        raise UnsupportedBackend(f"kazoo {installed_version()} has no "
                                 f"ConnectionHandler._submit to count requests with")
    submit = ConnectionHandler._submit

    def counted_submit(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if Ping is None or not isinstance(request, Ping):
            add(type(request).__name__)
        return submit(self, request, *args, **kwargs)

    ConnectionHandler._submit = counted_submit
    try:
        yield
    finally:
        ConnectionHandler._submit = submit


# -- the negotiated session timeout --------------------------------------------------------


class NegotiatedTimeouts(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The logger handed to a kazoo client, remembering each session's negotiated timeout.

    kazoo learns the session timeout the server granted (ConnectResponse.timeOut, clamped
    to [minSessionTimeout, maxSessionTimeout], by default 2-20 x tickTime) but keeps it
    in a local variable; the only place it surfaces is the "Session created" log call of
    ``ConnectionHandler._connect`` (args: session id, password, timeout in ms), made
    before kazoo reports CONNECTED (verified on kazoo 2.11.0). Everything else is
    logged unchanged to the ``kazoo.client`` logger.

    Attributes:
        timeouts_ms: session id -> the negotiated timeout, ms.
    """

    def __init__(self) -> None:
        super().__init__(logging.getLogger("kazoo.client"), {})
        self.timeouts_ms: dict[int, int] = {}

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if (
            isinstance(msg, str)
            and msg.startswith("Session created")
            and len(args) >= 3
            and isinstance(args[0], int)
            and isinstance(args[2], int)
        ):
            self.timeouts_ms[args[0]] = args[2]
        if not self.logger.isEnabledFor(level):  # kazoo logs every request and operation
            return
        kwargs.setdefault("stacklevel", 2)  # report kazoo's line, not this one
        super().log(level, msg, *args, **kwargs)


# -- the handler ---------------------------------------------------------------------------
#
# kazoo's connection thread waits on its sockets through ``handler.select`` about five
# times per request (for something to read or send, before each write, before reading an
# answer's length and its body). kazoo's ``select`` (``kazoo.handlers.utils.
# selector_select``) builds a new ``selectors.DefaultSelector`` for every one of those
# waits: on Linux an epoll object made, registered, polled and closed again, some 20-30
# us of Python and system calls each, over 200 us of the connection thread's CPU per
# claim+complete cycle (measured with the W1 loop: the thread's CPU per cycle 415-450 us
# with it). :class:`PollHandler` answers the same question with one ``poll(2)``.

_READ = select.POLLIN if hasattr(select, "poll") else 1
_WRITE = select.POLLOUT if hasattr(select, "poll") else 4


def poll_select(
    rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any],
    timeout: float | None = None,
) -> tuple[list[Any], list[Any], list[Any]]:
    """``select``'s contract as kazoo's connection uses it, with one ``poll(2)`` (no
    descriptor limit, unlike ``select(2)``), with the results kazoo's ``selector_select``
    gives. Relies on ``kazoo.handlers.utils.fileobj_to_fd`` (verified on kazoo
    2.11.0).

    Args:
        rlist: objects (sockets, or file descriptors) to wait on until readable.
        wlist: objects to wait on until writable.
        xlist: ignored, as by kazoo's own (nothing is ever reported in it).
        timeout: seconds (float) to wait at most, rounded up to whole ms; ``None``:
            no limit.

    Returns:
        The objects of ``rlist`` ready to read (or hung up, or in error), those of
        ``wlist`` ready to write (or in error), and an empty list. An object in both
        lists is reported as readable if it is, else as writable (as kazoo's).

    Raises:
        TypeError: an object has no file descriptor, or a negative one; ``timeout`` is
            not a number.
        ValueError: ``timeout`` is negative.
    """
    if timeout is not None:
        if not isinstance(timeout, (int, float)):
            raise TypeError("timeout must be a number")
        if timeout < 0:
            raise ValueError("timeout must be non-negative")
    masks: dict[int, int] = {}
    objects: dict[int, list[Any]] = {}
    for fileobj in rlist:
        fd = fileobj_to_fd(fileobj)
        if fd in masks:
            objects[fd].append(fileobj)
        else:
            masks[fd], objects[fd] = _READ, [fileobj]
    for fileobj in wlist:
        fd = fileobj_to_fd(fileobj)
        if fd in masks:
            masks[fd] |= _WRITE
            objects[fd].append(fileobj)
        else:
            masks[fd], objects[fd] = _WRITE, [fileobj]
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ready = poller.poll(None if timeout is None else math.ceil(timeout * 1000))
    readable: list[Any] = []
    writable: list[Any] = []
    for fd, event in ready:
        mask = masks[fd]
        # as selectors' PollSelector: anything but POLLOUT (input, hang-up, error) makes
        # a descriptor readable, anything but POLLIN writable, within what it waits for
        if mask & _READ and event & ~_WRITE:
            readable += objects[fd]
        elif mask & _WRITE and event & ~_READ:
            writable += objects[fd]
    return readable, writable, []


class PollHandler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's ``SequentialThreadingHandler`` whose ``select`` (what kazoo's connection
    thread waits on its sockets with) is :func:`poll_select`; everything else is kazoo's.
    Where ``select.poll`` does not exist, kazoo's own ``select`` is used."""

    if hasattr(select, "poll"):

        def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
            return poll_select(*args, **kwargs)


class SharedPollHandler(PollHandler):
    """One :class:`PollHandler` for the kazoo clients of a store's sessions: kazoo gives
    every client a handler with two worker threads (watch callbacks, completions), so
    2,000 sessions were 4,000 of them beside their 2,000 connection threads. Here each
    client's ``start()`` and ``stop()`` are counted (kazoo's client calls the handler's
    once each: verified on kazoo 2.11.0), the threads start with the first client
    and end with the last.

    ``sleep_func`` (kazoo's handler attribute, which every client's connection retry
    must share) replaces ``time.sleep``: the store's
    :meth:`._transport_reconnect.ReconnectPacer.sleep`.

    What the shared threads run is the library's own short callbacks (a watch that sets
    an event, an answer's completion): a session's state changes, and so its loss and
    the user's loss callbacks, come on its own client's connection thread, which is not
    shared.
    """

    def __init__(self, sleep_func: Callable[[float], None] | None = None) -> None:
        super().__init__()
        if sleep_func is not None:
            self.sleep_func = sleep_func  # kazoo's handler interface: its clients' sleep
        self._users = 0
        self._users_lock = threading.Lock()

    def start(self) -> None:
        with self._users_lock:
            self._users += 1
            if self._users == 1:
                super().start()

    def stop(self) -> None:
        with self._users_lock:
            if self._users == 0:
                return
            self._users -= 1
            if self._users == 0:
                super().stop()
