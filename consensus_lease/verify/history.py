"""The run's history: every operation with its invocation time, completion time and outcome.

Each process (worker, nemesis, verifier) appends to its own JSONL *part* file, two lines
per operation so that one cut short by SIGKILL still shows up (as *indeterminate*)::

    {"p": "w2", "i": 17, "ev": "invoke", "op": "write", "t": 1718000000.12, "job": "j3", ...}
    {"p": "w2", "i": 17, "ev": "return", "t": 1718000000.13, "outcome": "accepted", ...}

:func:`read_parts` pairs them into :class:`Op` records and :func:`write_history` writes the
run's single history file, one :class:`Op` per line, ordered by invocation time.

Times are ``time.time()`` of this machine (seconds since the epoch), read by the recorder
itself, never a worker's injected (skewed) clock; the checker does not depend on them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import (
    BackendUnavailable,
    FenceRejected,
    JobCompleted,
    LeaseLost,
    LeaseSuspended,
    OutcomeUnknown,
    SessionExpired,
    StaleLeaseError,
)

__all__ = [
    "INDETERMINATE",
    "HistoryWriter",
    "Op",
    "outcome_of",
    "read_history",
    "read_parts",
    "write_history",
]

INDETERMINATE = "indeterminate"
"""Outcome of an operation whose process died before recording its return."""


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of the run.

    Attributes:
        process: who did it (``w0``, ``w0.1`` for a replacement, ``nemesis``, ``verifier``).
        index: the operation's number within its process (1, 2, ...).
        op: what: ``open_session``, ``claim``, ``check`` (``ensure_held``), ``write``,
            ``renew``, ``complete``, ``release``, ``close_session``, ``session_lost``,
            ``pause_point``, ``worker_start``, ``worker_exit``, ``fault``, ``final``, ``run``.
        t_invoke: invocation time (seconds since the epoch).
        t_return: completion time, ``None`` if indeterminate.
        outcome: see :func:`outcome_of`; ``indeterminate`` if it never returned.
        job: the job concerned, if any.
        generation: the lease generation (fencing token) concerned, if any.
        detail: anything else (effect id, error message, fault description, ...).
    """

    process: str
    index: int
    op: str
    t_invoke: float
    t_return: float | None
    outcome: str
    job: str | None = None
    generation: int | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    @classmethod
    def from_json(cls, line: str) -> Op:
        raw = json.loads(line)
        return cls(
            process=str(raw["process"]),
            index=int(raw["index"]),
            op=str(raw["op"]),
            t_invoke=float(raw["t_invoke"]),
            t_return=None if raw.get("t_return") is None else float(raw["t_return"]),
            outcome=str(raw["outcome"]),
            job=raw.get("job"),
            generation=None if raw.get("generation") is None else int(raw["generation"]),
            detail=dict(raw.get("detail") or {}),
        )


def outcome_of(error: BaseException) -> str:
    """The history's name for an operation that raised ``error``.

    ``fence_rejected`` (FenceRejected), ``stale`` (StaleLeaseError), ``expired``
    (SessionExpired), ``lost`` (other LeaseLost), ``suspended``, ``completed_before``
    (JobCompleted), ``unknown`` (OutcomeUnknown), ``unavailable`` (BackendUnavailable),
    ``error`` (anything else).
    """
    for cls, name in (
        (FenceRejected, "fence_rejected"),
        (StaleLeaseError, "stale"),
        (SessionExpired, "expired"),
        (LeaseLost, "lost"),
        (LeaseSuspended, "suspended"),
        (JobCompleted, "completed_before"),
        (OutcomeUnknown, "unknown"),
        (BackendUnavailable, "unavailable"),
    ):
        if isinstance(error, cls):
            return name
    return "error"


class HistoryWriter:
    """Appends one process's operations to its part file. Thread-safe.

    Each line is written with one ``write`` call and flushed, so what a process wrote
    before being SIGKILLed is in the file.

    Args:
        path: the part file, created (it must not exist: a part holds one process of one
            run, since :func:`read_parts` pairs its lines by ``(process, index)``).
        process: this process's name in the history.

    Raises:
        FileExistsError: ``path`` exists (e.g. a part left by an earlier run).
    """

    def __init__(self, path: str | os.PathLike[str], process: str) -> None:
        self.path = Path(path)
        self.process = process
        self._lock = threading.Lock()
        self._next = 0
        self._file = self.path.open("x", encoding="utf-8", buffering=1)

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=str) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def invoke(self, op: str, *, job: str | None = None, generation: int | None = None,
               **detail: Any) -> int:
        """Record the invocation of ``op`` now; returns its index for :meth:`ret`."""
        with self._lock:
            self._next += 1
            index = self._next
        self._write({"p": self.process, "i": index, "ev": "invoke", "op": op, "t": time.time(),
                     "job": job, "gen": generation, "detail": detail})
        return index

    def ret(self, index: int, outcome: str, *, generation: int | None = None,
            **detail: Any) -> None:
        """Record that operation ``index`` returned now with ``outcome``; ``generation``
        and ``detail`` add to what the invocation recorded."""
        self._write({"p": self.process, "i": index, "ev": "return", "t": time.time(),
                     "outcome": outcome, "gen": generation, "detail": detail})

    def event(self, op: str, outcome: str = "ok", *, job: str | None = None,
              generation: int | None = None, **detail: Any) -> None:
        """Record an instantaneous operation (invoked and returned now)."""
        self.ret(self.invoke(op, job=job, generation=generation, **detail), outcome)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as file:
        for line in file:
            if not line.endswith("\n"):
                return  # a line cut short by SIGKILL: ignore it
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def read_parts(paths: Iterable[str | os.PathLike[str]]) -> list[Op]:
    """Pair the invoke/return lines of part files into operations, ordered by
    invocation time. An invocation without a return is INDETERMINATE.

    Raises:
        ValueError: a part records the same ``(process, index)`` invocation or return
            twice (the records of two runs, or a damaged file): pairing them could give
            an operation that never returned another one's result, so nothing is paired.
    """
    ops: list[Op] = []
    for path in paths:
        invokes: dict[tuple[str, int], dict[str, Any]] = {}
        returns: dict[tuple[str, int], dict[str, Any]] = {}
        for record in _lines(Path(path)):
            key = (str(record["p"]), int(record["i"]))
            seen = invokes if record["ev"] == "invoke" else returns
            if key in seen:
                raise ValueError(
                    f"{path}: {record['ev']} of operation {key[1]} of {key[0]} recorded "
                    "twice: the part holds two runs' records (or is damaged); a run "
                    "directory holds one run only")
            seen[key] = record
        for key, inv in invokes.items():
            done = returns.get(key)
            detail = dict(inv.get("detail") or {})
            generation = inv.get("gen")
            if done is not None:
                detail.update(done.get("detail") or {})
                if done.get("gen") is not None:
                    generation = done["gen"]
            ops.append(Op(
                process=key[0], index=key[1], op=str(inv["op"]), t_invoke=float(inv["t"]),
                t_return=None if done is None else float(done["t"]),
                outcome=INDETERMINATE if done is None else str(done["outcome"]),
                job=inv.get("job"), generation=None if generation is None else int(generation),
                detail=detail,
            ))
    ops.sort(key=lambda o: (o.t_invoke, o.process, o.index))
    return ops


def write_history(ops: Iterable[Op], path: str | os.PathLike[str]) -> Path:
    """Write the run's history file: one operation per line (:meth:`Op.to_json`)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as file:
        for op in ops:
            file.write(op.to_json() + "\n")
    tmp.replace(out)
    return out


def read_history(path: str | os.PathLike[str]) -> list[Op]:
    """Read a history file written by :func:`write_history`."""
    with Path(path).open(encoding="utf-8") as file:
        return [Op.from_json(line) for line in file if line.strip()]

