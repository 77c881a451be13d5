"""Noticing that the cluster's history went back (restored from an older snapshot, or
wiped and re-created), from the headers of etcd's answers.

Every etcd answer carries a header with the cluster's ``revision`` and ``cluster_id``.
A linearizable answer (a KV ``Range`` or ``Txn`` without ``serializable``, and the
raft-applied ``LeaseGrant`` and ``LeaseRevoke``) reflects every write that completed
before its request was sent, so in a healthy cluster its revision is never below the
highest revision seen on any answer received before that request was sent. Answers of
concurrent requests may arrive in any order, which is why each request compares with
the :class:`Mark` taken when it was sent, not with whatever was seen since.

Other answers (``LeaseKeepAlive``, ``LeaseTimeToLive``, watches) are filled in by the
member that received the request from its own applied state, which may lag behind the
leader: on a keepalive answer a revision below the mark only makes the driver ask once
more with a linearizable read (see the driver's keepalive); on a ``LeaseTimeToLive``
answer only the cluster id is checked; watch responses are not checked (they only wake
callers, whose reads then are). A different ``cluster_id`` is final on any answer
checked: the endpoints now reach another cluster.

When an answer shows the history went back, the guard tells its listeners (the driver
ends every open session with ``StoreRegressed``), starts a new *era* and takes that
answer's revision and cluster id as the new baseline, so sessions opened afterwards
work on the new history (the operator is told to run ``bump-epoch`` before restarting
workers). An answer to a request sent in an earlier era is still reported as
regressed to its caller (a claim it carries is handed back), without a second round of
notifications. The transport raises ``StoreRegressed`` for a regressed answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["ADVICE", "Mark", "RevisionGuard"]

ADVICE = (
    "every session of this store is over: stop the workers, run `consensus-lease "
    "bump-epoch --backend URL --above HIGHEST` (HIGHEST: the highest token any "
    "destination accepted), then restart them"
)


class Mark(NamedTuple):
    """What the guard knew when a request was sent: the era and the highest revision.
    (A named tuple: one is made per write answered.)"""

    era: int
    revision: int


class RevisionGuard:
    """The highest revision seen on linearizable answers and the cluster id, per driver.
    Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._era = 0
        self._high = 0
        self._cluster = 0
        self._mark = Mark(0, 0)  # (era, high), replaced whole under the lock
        self._listeners: list[Callable[[str], None]] = []

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` once per detected regression (from the thread that
        detected it; it must not block)."""
        with self._lock:
            self._listeners.append(listener)

    def mark(self) -> Mark:
        """Take before sending a request; hand to :meth:`observe` with its answer."""
        return self._mark  # one atomic read of an immutable pair

    @property
    def high(self) -> int:
        """The highest revision seen on a linearizable answer (this era)."""
        with self._lock:
            return self._high

    def observe(self, header: Any, mark: Mark | None, member: str) -> str | None:
        """Record an answer's ``header``; ``mark`` is the request's :meth:`mark` if the
        answer is linearizable, ``None`` if not (only its cluster id is checked).
        Returns why the history went back, or ``None`` if the answer is consistent."""
        revision, cluster = int(header.revision), int(header.cluster_id)
        with self._lock:
            if cluster == self._cluster and (mark is None or revision >= mark.revision):
                # The common answer: what the checks below pass, without them.
                if mark is not None and revision > self._high:
                    self._high = revision
                    self._mark = Mark(self._era, revision)
                return None
            reason = self._diagnose(revision, cluster, mark, member)
            if reason is None:
                self._cluster = self._cluster or cluster
                if mark is not None and revision > self._high:
                    self._high = revision
                    self._mark = Mark(self._era, revision)
                return None
            fresh = mark is None or mark.era == self._era
            if fresh:
                self._era += 1
                self._high, self._cluster = revision, cluster or self._cluster
                self._mark = Mark(self._era, self._high)
                listeners = list(self._listeners)
        if fresh:
            for listener in listeners:
                listener(reason)
        return reason

    def _diagnose(self, revision: int, cluster: int, mark: Mark | None,
                  member: str) -> str | None:
        if cluster and self._cluster and cluster != self._cluster:
            return (f"etcd member {member} answered for cluster {cluster:x}, not cluster "
                    f"{self._cluster:x} as before: the store was re-created or replaced "
                    f"(its history is not the one tokens came from); {ADVICE}")
        if mark is not None and revision and revision < mark.revision:
            return (f"etcd member {member} answered at revision {revision}, below revision "
                    f"{mark.revision} seen before: the store's history went back (restored "
                    f"from an older snapshot, or wiped); {ADVICE}")
        return None
