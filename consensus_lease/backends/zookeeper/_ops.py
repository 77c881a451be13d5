"""Multi operations as data, and how a failed multi's marker operations are told apart.

A multi that ends a hold (complete, release, fail) or changes a job's lifecycle
(requeue, the claim that finds the attempts used up) is a list of *core* operations,
which carry the checks (the job znode's version, the owner znode's, the failure
znode's), followed by *marker* operations on a queued job's markers (held, open,
delayed: see :mod:`._layout`). Markers are bookkeeping for the queue listings: one
deleted (or made) by hand must not make a job impossible to complete, so a multi that
failed on a marker alone is sent again without it (or after making the container that
was missing), without reading first. ZooKeeper reports the first failing operation of a
multi; those before it as rolled back, those after it as not run.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError, RolledBackError, RuntimeInconsistency
from kazoo.protocol.serialization import CheckVersion, Create, Delete, SetData
from kazoo.protocol.serialization import Transaction as KazooTransaction
from kazoo.security import OPEN_ACL_UNSAFE

from ...errors import TokenSpaceExhausted

__all__ = [
    "MAX_VERSION", "Checked", "Lean", "Op", "Transaction", "Trouble", "add_ops", "first_error",
    "marker_trouble", "wire_version",
]

Op = tuple[str, str, bytes, int | None]
"""``(kind, path, data, version)``: kind ``"check"``, ``"set"``, ``"create"`` (persistent,
the client's default ACL) or ``"delete"``; version ``None`` means any (ignored for a
create)."""

MAX_VERSION = 2**31 - 1
"""The highest znode version: ZooKeeper keeps it as a signed 32-bit int (Java ``int``),
which its server increments without a check (past it comes -2**31, and -1 means "any
version" in a request)."""


def wire_version(version: int | None, path: str) -> int:
    """The version field a request carries for ``version``: -1 for ``None`` (any
    version, said so on purpose), else ``version`` itself, which must be a real znode
    version, ``0 <= version <= MAX_VERSION``. Every versioned operation this backend
    sends goes through here, so a counter past the limit (or a negative one read from a
    znode that already wrapped) is a typed error before anything is sent, never a
    ``struct.error`` nor a -1 that the server would take for "any version".

    Raises:
        TokenSpaceExhausted: ``version`` is not in ``[0, MAX_VERSION]``; nothing was sent.
    """
    if version is None:
        return -1
    if type(version) is not int or not 0 <= version <= MAX_VERSION:
        raise TokenSpaceExhausted(
            f"{path}: version {version!r} is outside ZooKeeper's 32-bit range "
            f"[0, {MAX_VERSION}]; nothing was sent (see TokenSpaceExhausted for the remedy)",
            path=path, version=version if type(version) is int else -1)
    return version


class Lean:
    """Adds operations to a kazoo transaction as kazoo's own request records
    (``kazoo.protocol.serialization``), with the method names of kazoo's
    ``TransactionRequest``. kazoo's methods check the argument types, normalise every
    path against the client's chroot and log each operation (some 3 us apiece, the most
    of a multi's building); here the paths are already absolute and normalised (built by
    :mod:`._layout`: ids percent-encoded, dots too) and the client has no chroot of its
    own (the URL's chroot is part of every path), so the records are the ones kazoo
    would make. Creates get the client's default ACL, as kazoo's do.

    Raises:
        ValueError: the client has a chroot of its own (never made by this backend).
    """

    __slots__ = ("_acl", "_append")

    def __init__(self, tx: Any) -> None:
        if tx.client.chroot:
            raise ValueError("a kazoo client with a chroot of its own")
        self._append = tx.operations.append
        self._acl = tx.client.default_acl or OPEN_ACL_UNSAFE

    def check(self, path: str, version: int | None) -> None:
        self._append(CheckVersion(path, wire_version(version, path)))

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False) -> None:
        self._append(Create(path, value, self._acl, 1 if ephemeral else 0))

    def set_data(self, path: str, value: bytes, version: int | None = None) -> None:
        self._append(SetData(path, value, wire_version(version, path)))

    def delete(self, path: str, version: int | None = None) -> None:
        self._append(Delete(path, wire_version(version, path)))


class Checked:
    """A kazoo ``TransactionRequest`` (the shared client's multis: enqueue, purge, the
    epoch) behind the method names of :class:`Transaction`, with every version passed
    through :func:`wire_version` (``None``: any) before kazoo sees it.

    Raises:
        TokenSpaceExhausted: from any method, for a version out of range.
    """

    __slots__ = ("_tx",)

    def __init__(self, tx: Any) -> None:
        self._tx = tx

    def check(self, path: str, version: int | None) -> None:
        self._tx.check(path, wire_version(version, path))

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False) -> None:
        self._tx.create(path, value, ephemeral=ephemeral)

    def set_data(self, path: str, value: bytes, version: int | None = None) -> None:
        self._tx.set_data(path, value, wire_version(version, path))

    def delete(self, path: str, version: int | None = None) -> None:
        self._tx.delete(path, wire_version(version, path))


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


class Transaction:
    """A multi request, packed into the bytes kazoo would send for it as its operations
    are added (with the method names of kazoo's ``TransactionRequest``, as :class:`Lean`),
    and handed to the client's connection (``KazooClient._call``) in place of kazoo's own
    ``Transaction`` record: the same request type, and the same name (request counts
    read alike). kazoo's ``Transaction.serialize`` makes a ``MultiHeader`` record and a
    bytearray per operation and per field, on kazoo's connection thread: some 10 us for
    a claim's four operations, 1.5 us here. The answer is decoded by kazoo's own
    ``Transaction.deserialize``. Paths are absolute and normalised and the client has no
    chroot of its own (as for :class:`Lean`); creates get the client's default ACL, as
    kazoo's do. Every version is checked by :func:`wire_version` (``None``: any).

    Args:
        client: the kazoo client it will be sent on.

    Attributes:
        op_types: the ZooKeeper type of each operation added, in order (``check`` 13,
            ``create`` 1, ``set_data`` 5, ``delete`` 2).

    Raises:
        ValueError: the client has a chroot of its own (never made by this backend).
        TokenSpaceExhausted: from an operation method, for a version out of range.
    """

    type = KazooTransaction.type
    __slots__ = ("_acl", "_parts", "op_types")

    def __init__(self, client: Any) -> None:
        if client.chroot:
            raise ValueError("a kazoo client with a chroot of its own")
        self._acl = _acl_bytes(client.default_acl or OPEN_ACL_UNSAFE)
        self._parts: list[bytes] = []
        self.op_types: list[int] = []

    def check(self, path: str, version: int | None) -> None:
        name = path.encode()
        self._parts += (_OP.pack(13, 0, -1, len(name)), name,
                        _INT.pack(wire_version(version, path)))
        self.op_types.append(13)

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False) -> None:
        name = path.encode()
        self._parts += (_OP.pack(1, 0, -1, len(name)), name, _INT.pack(len(value)), value,
                        self._acl, _FLAGS[1 if ephemeral else 0])
        self.op_types.append(1)

    def set_data(self, path: str, value: bytes, version: int | None = None) -> None:
        name = path.encode()
        self._parts += (_OP.pack(5, 0, -1, len(name)), name, _INT.pack(len(value)), value,
                        _INT.pack(wire_version(version, path)))
        self.op_types.append(5)

    def delete(self, path: str, version: int | None = None) -> None:
        name = path.encode()
        self._parts += (_OP.pack(2, 0, -1, len(name)), name,
                        _INT.pack(wire_version(version, path)))
        self.op_types.append(2)

    def serialize(self) -> bytes:
        """The request's body (kazoo's connection adds its length, xid and type)."""
        return b"".join(self._parts) + _END

    @staticmethod
    def deserialize(buffer: bytes, offset: int) -> list[Any]:
        """The answer's per-operation results, as kazoo decodes a multi's."""
        return KazooTransaction.deserialize(buffer, offset)  # type: ignore[no-any-return]

    def __repr__(self) -> str:  # kazoo's debug log names the request
        return f"Transaction(packed, operation types {self.op_types})"


def add_ops(tx: Any, ops: list[Op]) -> None:
    """Add ``ops`` to ``tx`` (a :class:`Transaction` or :class:`Checked`, or a kazoo
    transaction: see :class:`Lean`), in order."""
    lean = tx if isinstance(tx, (Transaction, Checked)) else Lean(tx)
    for kind, path, data, version in ops:
        if kind == "check":
            lean.check(path, version)
        elif kind == "set":
            lean.set_data(path, data, version)
        elif kind == "create":
            lean.create(path, data)
        elif kind == "delete":
            lean.delete(path, version)
        else:
            raise ValueError(f"unknown multi operation {kind!r}")


def first_error(results: list[Any]) -> tuple[int, Exception | None]:
    """The operation that failed a multi and its error (``(len, None)`` if none did)."""
    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(
            result, (RolledBackError, RuntimeInconsistency)
        ):
            return index, result
    return len(results), None


@dataclass(slots=True)
class Trouble:
    """What a failed multi's marker operations say.

    Attributes:
        skip: marker paths to leave out next time (a delete of a missing marker, a
            create of one that exists).
        parents: containers to make first (a create whose parent was missing).
        only: the multi failed on a marker alone: send it again without reading.
    """

    skip: set[str] = field(default_factory=set)
    parents: set[str] = field(default_factory=set)
    only: bool = False


def marker_trouble(results: list[Any], core: int, markers: list[Op]) -> Trouble:
    """Read a failed multi's ``results``: its first ``core`` operations are the core
    ones, then come ``markers``. Empty ``results`` (an answer lost and not applied)
    say nothing."""
    index, error = first_error(results)
    trouble = Trouble()
    if error is None or index < core or index - core >= len(markers):
        return trouble
    kind, path, _, _ = markers[index - core]
    harmless = NoNodeError if kind == "delete" else NodeExistsError
    if isinstance(error, harmless):  # a missing marker not deleted, an existing one not made
        trouble.skip.add(path)
    elif kind == "create" and isinstance(error, NoNodeError):
        trouble.parents.add(path.rsplit("/", 1)[0])
    else:
        return trouble
    trouble.only = True
    return trouble
