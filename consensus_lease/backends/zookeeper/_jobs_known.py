"""What this process last knew of job znodes, so that a claim can skip reading first.

A claim must know what the job znode holds at the version it writes against (a
completed job's version is as current as a claimable one's). Reading costs a round trip;
for two common cases the answer is already known, and the claim multi is sent at once
(a *guess*), with its versioned operations as the atomic compare:

* **A job never seen by this backend**: guessed not to exist yet. The multi is the one a
  read showing no job znode would send (``create`` of the job znode, ``set_data`` at
  version 0, the owner znode): if the job exists, its ``create`` fails and nothing is
  written.
* **A job this backend released**: the release left the job znode at the claim's
  version, with the data that claim wrote (a znode's data at a given version never
  changes), no owner znode, and the failure znode and queue markers the hold knew. The
  multi is the one a read showing exactly that would send (``set_data`` at that
  version): if anyone claimed or completed the job since, the version moved and the
  ``set_data`` fails. The failure znode cannot have changed meanwhile: only a claim's
  holder writes it (``fail``), and a claim bumps the version, except to make an
  exhausted job FAILED or to requeue a FAILED one, and such a job is never guessed.

A released job is guessed only in the store epoch it was released in (a store wiped or
restored from a backup may hold other data at that version; raising the epoch, which
that takes, ends such guesses), and a guess of a released job whose multi failed on the
epoch check is not sent again: the job is read. A guess that fails (any operation)
decides nothing: the job is marked as *seen* and read, as every claim did before (see
:mod:`._jobs_claim`); a lost answer is read back as for any claim. Everything else (a job
seen to exist: read by a claim, offered by ``queue_candidates``, enqueued here, claimed,
completed) is *seen*: its next claim reads first, so polling a held job stays a read any
member answers, not a failing write.

The table is bounded (:data:`MAX_KNOWN` ids, oldest forgotten first); forgetting only
costs a guess that may fail. It is per backend: every session of the backend shares it
(what a job znode holds does not depend on who asks).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from ._layout import Failure, Tally

__all__ = ["MAX_KNOWN", "UNSEEN", "Known", "Released"]

MAX_KNOWN = 16_384
"""Job ids remembered per backend: about 2 MB with short ids, up to some 16 MB if every
one were a queued job with a long id released here (its marker paths are kept)."""


@dataclass(frozen=True, slots=True)
class Released:
    """A job this backend released: its job znode at ``version`` holds the claim data of
    ``attempt`` and ``max_attempts``; the failure znode and queue markers as the hold had
    them (see :class:`._jobs.Hold`). Only in store epoch ``epoch``: a store wiped or
    restored from a backup (then the epoch is raised) may hold other data at that
    version."""

    epoch: int
    version: int
    attempt: int
    max_attempts: int | None
    failure: Failure | None
    held: str | None
    open: str | None
    delayed: str | None
    failed: str | None
    tally: Tally | None


class _Unseen:
    def __repr__(self) -> str:
        return "UNSEEN"


UNSEEN: Final = _Unseen()
""":meth:`Known.get` of a job id this backend has not seen (or has forgotten)."""


class Known:
    """Job id -> :class:`Released`, or ``None`` (seen: read before claiming); bounded."""

    def __init__(self, limit: int = MAX_KNOWN) -> None:
        self._limit = limit
        self._jobs: dict[str, Released | None] = {}
        self._lock = threading.Lock()

    def get(self, job_id: str) -> Released | _Unseen | None:
        return self._jobs.get(job_id, UNSEEN)

    def seen(self, job_ids: Iterable[str]) -> None:
        """The jobs exist: read before claiming them, unless known released."""
        with self._lock:
            for job_id in job_ids:
                if job_id not in self._jobs:
                    self._put(job_id, None)

    def stale(self, job_ids: Iterable[str]) -> None:
        """What was known of the jobs no longer holds (a guess failed, a claim, a
        completion): read before claiming them."""
        with self._lock:
            for job_id in job_ids:
                self._jobs.pop(job_id, None)
                self._put(job_id, None)

    def released(self, job_id: str, state: Released) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)
            self._put(job_id, state)

    def clear(self) -> None:
        """Forget everything (the store's history went back)."""
        with self._lock:
            self._jobs.clear()

    def _put(self, job_id: str, value: Released | None) -> None:
        self._jobs[job_id] = value
        if len(self._jobs) > self._limit:
            del self._jobs[next(iter(self._jobs))]  # the oldest entry
