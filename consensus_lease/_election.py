"""The reserved namespace of election names inside a store's job keys.

An election (:meth:`consensus_lease.Session.campaign`) is a lease on a name that is never
completed. Backends need no claim code of their own for it: every per-job backend method
receives the election's *key*, ``election_key(name)``, which starts with a prefix that
:func:`consensus_lease.validation.check_job_id` refuses in user job ids, so an election
can never collide with a job. Backends only (a) accept such keys, (b) leave them out of
``records()``, queues and ``inspect`` (:func:`is_election_key`), and (c) keep the
leader's value (:meth:`consensus_lease.backend.Backend.set_value`).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping

__all__ = [
    "ELECTION_PREFIX",
    "ChangeTracker",
    "election_key",
    "election_name",
    "is_election_key",
]

ELECTION_PREFIX = "\x1fe:"
"""What every election key starts with: U+001F (INFORMATION SEPARATOR ONE), ``e``, ``:``.
Reserved: no user job id may start with it."""


def election_key(name: str) -> str:
    """The job key under which the election ``name`` is held (``name`` must already be a
    valid election name: see :func:`consensus_lease.validation.check_election_name`)."""
    return ELECTION_PREFIX + name


def is_election_key(key: str) -> bool:
    """Whether the job key ``key`` is an election's (and so no job)."""
    return key.startswith(ELECTION_PREFIX)


def election_name(key: str) -> str:
    """The election name of an election key (the inverse of :func:`election_key`).

    Raises:
        ValueError: ``key`` is not an election key.
    """
    if not is_election_key(key):
        raise ValueError(f"{key!r} is not an election key")
    return key[len(ELECTION_PREFIX):]


class ChangeTracker:
    """For drivers served by the default poller (:mod:`consensus_lease._subscriptions`):
    which subscribed election keys changed since the previous poll, so that their
    ``claimable_hint`` wakes observers after a new claim or value too (see
    :meth:`consensus_lease.backend.Backend.subscribe_job`). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, Hashable] = {}

    def changed(self, states: Mapping[str, Hashable]) -> set[str]:
        """The keys of ``states`` (election key -> anything that changes with its holder,
        generation or value) whose state differs from the previous call's, or that the
        previous call did not have. Remembers ``states`` for the next call."""
        with self._lock:
            out = {k for k, v in states.items() if k not in self._seen or self._seen[k] != v}
            self._seen = dict(states)
        return out
