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

__all__ = ["Op", "Trouble", "add_ops", "first_error", "marker_trouble"]

Op = tuple[str, str, bytes, int]
"""``(kind, path, data, version)``: kind ``"check"``, ``"set"``, ``"create"`` (persistent,
the client's default ACL) or ``"delete"``; version -1 means any."""


def add_ops(tx: Any, ops: list[Op]) -> None:
    """Add ``ops`` to the kazoo transaction ``tx``, in order."""
    for kind, path, data, version in ops:
        if kind == "check":
            tx.check(path, version)
        elif kind == "set":
            tx.set_data(path, data, version)
        elif kind == "create":
            tx.create(path, data)
        elif kind == "delete":
            tx.delete(path, version)
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
