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

from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError, RolledBackError, RuntimeInconsistency
from kazoo.protocol.serialization import CheckVersion, Create, Delete, SetData
from kazoo.security import OPEN_ACL_UNSAFE

__all__ = ["Lean", "Op", "Trouble", "add_ops", "first_error", "marker_trouble"]

Op = tuple[str, str, bytes, int]
"""``(kind, path, data, version)``: kind ``"check"``, ``"set"``, ``"create"`` (persistent,
the client's default ACL) or ``"delete"``; version -1 means any."""


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

    def check(self, path: str, version: int) -> None:
        self._append(CheckVersion(path, version))

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False) -> None:
        self._append(Create(path, value, self._acl, 1 if ephemeral else 0))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self._append(SetData(path, value, version))

    def delete(self, path: str, version: int = -1) -> None:
        self._append(Delete(path, version))


def add_ops(tx: Any, ops: list[Op]) -> None:
    """Add ``ops`` to the kazoo transaction ``tx``, in order (see :class:`Lean`)."""
    lean = Lean(tx)
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
