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

The results of a multi's operations are kazoo's objects (a stat, a path, ``True``, or an
exception instance): the other modules tell them apart through :func:`failed`,
:func:`missing`, :func:`exists`, :func:`bad_version` and :func:`not_empty`, never by
kazoo's exception classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)

from ...errors import TokenSpaceExhausted
from ._transport_kazoo import KazooRecords, PackedMulti

__all__ = [
    "MAX_VERSION", "Checked", "Lean", "Op", "Transaction", "Trouble", "add_ops", "bad_version",
    "exists", "failed", "first_error", "marker_trouble", "missing", "not_empty", "wire_version",
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


class Lean(KazooRecords):
    """Adds operations to a kazoo transaction as kazoo's own request records, with the
    method names of kazoo's ``TransactionRequest`` (:class:`._transport_kazoo.KazooRecords`).
    kazoo's methods check the argument types, normalise every path against the client's
    chroot and log each operation (some 3 us apiece, the most of a multi's building);
    here the paths are already absolute and normalised (built by :mod:`._layout`: ids
    percent-encoded, dots too) and the client has no chroot of its own (the URL's chroot
    is part of every path), so the records are the ones kazoo would make. Creates get the
    client's default ACL, as kazoo's do. Every version is checked by
    :func:`wire_version` (``None``: any).

    Raises:
        ValueError: the client has a chroot of its own (never made by this backend).
        TokenSpaceExhausted: from an operation method, for a version out of range.
    """

    __slots__ = ()
    version_of = staticmethod(wire_version)


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


class Transaction(PackedMulti):
    """A multi request, packed into the bytes kazoo would send for it as its operations
    are added (with the method names of kazoo's ``TransactionRequest``, as :class:`Lean`),
    and handed to the client's connection (:func:`._transport_kazoo.send_request`) in place of
    kazoo's own ``Transaction`` record: the same request type, and the same name (request
    counts read alike). kazoo's ``Transaction.serialize`` makes a ``MultiHeader`` record
    and a bytearray per operation and per field, on kazoo's connection thread: some 10 us
    for a claim's four operations, 1.5 us here. The answer is decoded by kazoo's own
    ``Transaction.deserialize``. Paths are absolute and normalised and the client has no
    chroot of its own (as for :class:`Lean`); creates get the client's default ACL, as
    kazoo's do. Every version is checked by :func:`wire_version` (``None``: any). The
    packing and what kazoo's connection asks of a request: :class:`._transport_kazoo.PackedMulti`.

    Args:
        client: the kazoo client it will be sent on.

    Attributes:
        op_types: the ZooKeeper type of each operation added, in order (``check`` 13,
            ``create`` 1, ``set_data`` 5, ``delete`` 2).

    Raises:
        ValueError: the client has a chroot of its own (never made by this backend).
        TokenSpaceExhausted: from an operation method, for a version out of range.
    """

    __slots__ = ()
    version_of = staticmethod(wire_version)


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


def failed(result: Any) -> bool:
    """Whether ``result`` (one operation's, in a multi's answer) is the error that failed
    the multi: not a success, nor an operation rolled back or not run because another
    one failed."""
    return isinstance(result, Exception) and not isinstance(
        result, (RolledBackError, RuntimeInconsistency))


def missing(result: Any) -> bool:
    """Whether ``result`` says the znode (or, for a create, its parent) does not exist."""
    return isinstance(result, NoNodeError)


def exists(result: Any) -> bool:
    """Whether ``result`` is a create's refusal: the znode exists already."""
    return isinstance(result, NodeExistsError)


def bad_version(result: Any) -> bool:
    """Whether ``result`` is a versioned operation's refusal: another version."""
    return isinstance(result, BadVersionError)


def not_empty(result: Any) -> bool:
    """Whether ``result`` is a delete's refusal: the znode has children."""
    return isinstance(result, NotEmptyError)


def first_error(results: list[Any]) -> tuple[int, Exception | None]:
    """The operation that failed a multi and its error (``(len, None)`` if none did)."""
    for index, result in enumerate(results):
        if failed(result):
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
    harmless = missing if kind == "delete" else exists
    if harmless(error):  # a missing marker not deleted, an existing one not made
        trouble.skip.add(path)
    elif kind == "create" and missing(error):
        trouble.parents.add(path.rsplit("/", 1)[0])
    else:
        return trouble
    trouble.only = True
    return trouble
