"""Noticing that the store's history went back: an ensemble wiped (every member's data
deleted) or restored from an older backup. Its znode versions start again, so the tokens
it hands out go back too; the store epoch (:mod:`._tokens`) is how the operator moves them
on again, and this module is how a running backend notices that it must.

What a backend remembers of the store (one :class:`History` per backend)
-----------------------------------------------------------------------
* **The highest zxid seen**: kazoo's ``client.last_zxid`` after every answer, on every
  client of the backend (its sessions' and the shared one). ZooKeeper orders every write
  with a zxid greater than every zxid committed before, and a member answers with the
  zxid of the last transaction it applied, which for a write is at least the write's
  own (a lagging follower applies it in order first). So the answer to a write (a claim
  or completion multi, a write barrier) sent after zxid Z was seen carries a zxid above
  Z on any member of a healthy ensemble: one *below* it comes from an older history.
  Reads are not compared (a lagging follower answers them from behind), only noted.
* **The store's identity**: ``{chroot}/identity``, a random id made once, when a backend
  first opens a session on the store. It is read when a session opens, in the
  keepalive's round trip at most once per keepalive interval, and after a reconnect.
  Gone, or another one: the store was wiped (or its chroot replaced).
* **The epoch**: the value of ``{chroot}/epoch`` and that znode's version, cached for
  the claim multi's check (:mod:`._jobs_claim`). An epoch lower than one seen, or the znode
  gone once an epoch above 0 was seen, is a history gone back too.

A member refuses a session whose client has seen a newer zxid than the member has
("Refusing session request ... client must try another server"), so after a wipe every
client of this backend is refused over and over until the new history's zxids pass the
old ones: kazoo just keeps reconnecting, and a caller would only see "no answer in time"
until the session's deadline passed. So while a session stays disconnected,
:class:`Prober` connects a fresh client (without zxid history, so never refused) now and
then and reads the identity after a write barrier: identity gone or changed, or the
barrier answered below the highest zxid seen, is a regression. When ZooKeeper expires a
session, the same probe runs before the expiry is reported, so an expiry that comes from
a wipe is reported as one.

A regression is final for the sessions open: every one of them ends with
:class:`~consensus_lease.errors.StoreRegressed` (reported to the core as an expiry, and
raised by every later call on it), and its client is stopped, which hands its jobs back
to the store (best effort: the store's history is the new one). Opening a session on the
backend raises ``StoreRegressed`` too, until the store's epoch has been raised above the
one this backend knew (``bump_epoch``, here or in another process): then it starts
again from what the store now holds (identity, epoch, zxid).

The backend that noticed also writes the **regression marker** ``{chroot}/regressed``
(data: the store epoch when written, a space, why), from a background thread, in one
multi that checks the epoch znode's version; a backend opening a session on the store
reads it with the identity and the epoch and refuses (``StoreRegressed``) while its
epoch is at least the store's. So one rule holds for every backend on the store, in any
process: no session until ``bump_epoch`` raises the epoch above the marker's.

A restored ensemble whose zxids have already passed the ones a client saw by the time
it reconnects (a busy ensemble restored from a recent backup) accepts the client: its
identity is the backed-up one and its zxids are higher, so only a probe made while the
client was refused can tell. The operator's ``bump_epoch`` after a restore is the rule;
this is the safety net.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ...errors import BackendUnavailable, StoreRegressed
from ._transport import Wire
from ._transport_errors import KAZOO_ERRORS

__all__ = ["History", "Prober", "marker_error", "new_identity", "parse_marker"]

log = logging.getLogger("consensus_lease.backends.zookeeper")

PROBE_GRACE_S = 1.0
"""A session disconnected this long (or half its keepalive interval, if shorter) is
probed for: a member failing over reconnects well within it."""
PROBE_INTERVAL_S = 2.0
"""Most time between two probes while a session stays disconnected (half its keepalive
interval, if shorter): with :data:`PROBE_GRACE_S`, a regression is probed for within
one keepalive interval of the disconnection (and noticed once that probe's round trips
are answered)."""
PROBE_MIN_INTERVAL_S = 0.2
PROBE_SESSION_TIMEOUT_S = 4.0
"""Session timeout a probe requests (the probe closes its session at once)."""
KEEPALIVE_FRACTION = 1 / 3
"""The core's keepalive interval as a fraction of the granted TTL."""


def new_identity() -> bytes:
    """The data of a new ``{chroot}/identity``."""
    return uuid.uuid4().hex.encode()


def parse_marker(answer: tuple[bytes, Any] | None) -> tuple[int, str] | None:
    """``(epoch, why)`` of the regression marker as read (``None``: absent or unreadable)."""
    if answer is None:
        return None
    epoch, _, why = answer[0].decode("utf-8", "replace").partition(" ")
    return (int(epoch), why) if epoch.isdigit() else None


def marker_error(hosts: str, why: str) -> StoreRegressed:
    """The error of a store whose marker says it went back."""
    return StoreRegressed(
        f"the ZooKeeper store at {hosts} went back in its history (noticed by a backend "
        f"that wrote the regression marker: {why}); no session can be opened until "
        f"consensus-lease bump-epoch --backend URL --above HIGHEST (the highest token any "
        f"destination accepted) raises the store epoch"
    )


def _identity_text(answer: tuple[bytes, Any] | None) -> str | None:
    return None if answer is None else answer[0].decode("ascii", "replace")


class History:
    """What one backend has seen of the store's history, and whether it went back.

    Args:
        hosts: for messages.
        on_regressed: called once (from the thread that noticed) with the error when a
            regression is noticed; must not block.
    """

    def __init__(self, hosts: str, on_regressed: Callable[[StoreRegressed], None]) -> None:
        self.hosts = hosts
        self._on_regressed = on_regressed
        self._lock = threading.Lock()
        self._highest = 0
        self._identity: str | None = None
        self._identity_read_at = -math.inf
        self._epoch: tuple[int, int] | None = None
        self._regressed: StoreRegressed | None = None
        self._regressed_epoch = 0

    # -- zxids ----------------------------------------------------------------------------

    def highest(self) -> int:
        """The highest zxid seen so far (0: none)."""
        return self._highest  # one attribute read: no lock needed

    def saw(self, zxid: int) -> None:
        """A client got an answer at ``zxid`` (any request)."""
        if zxid <= self._highest:  # nothing to raise (it only grows, but at a recovery)
            return
        with self._lock:
            self._highest = max(self._highest, zxid)

    def answered(self, zxid: int, floor: int, what: str) -> None:
        """A write sent when :meth:`highest` was ``floor`` was answered at ``zxid``."""
        self.saw(zxid)
        if 0 < zxid < floor:
            self.regress(f"{what} was answered at zxid 0x{zxid:x}, below zxid 0x{floor:x} "
                         f"seen before it was sent")

    # -- the identity -----------------------------------------------------------------------

    def identity_due(self, interval_s: float) -> bool:
        """Whether the identity was last read ``interval_s`` or more ago; if so, counts it
        as read now (the caller reads it)."""
        now = time.monotonic()
        with self._lock:
            if now - self._identity_read_at < interval_s:
                return False
            self._identity_read_at = now
            return True

    def identity_seen(self, answer: tuple[bytes, Any] | None, what: str) -> None:
        """``{chroot}/identity`` as read (``(data, stat)``, ``None``: absent). The first
        one read is adopted; later, gone or different is a regression."""
        found = _identity_text(answer)
        with self._lock:
            self._identity_read_at = time.monotonic()
            known = self._identity
            if known is None:
                self._identity = found
                return
        if found != known:
            now = "is gone" if found is None else f"is {found!r}"
            self.regress(f"{what}: the store identity was {known!r} and {now}")

    # -- the epoch ----------------------------------------------------------------------------

    def epoch(self) -> tuple[int, int] | None:
        """The cached ``(epoch, version of {chroot}/epoch)``, or ``None`` if not read yet."""
        with self._lock:
            return self._epoch

    def epoch_seen(self, epoch: int, version: int, what: str) -> None:
        """``{chroot}/epoch`` read (or written) at ``version``: caches it. An epoch below
        the cached one is a regression (bumps only ever raise it)."""
        with self._lock:
            cached = self._epoch
            if cached is None or epoch > cached[0] or (epoch == cached[0]
                                                       and version >= cached[1]):
                self._epoch = (epoch, version)
                return
        if epoch < cached[0]:
            self.regress(f"{what}: the store epoch went back from {cached[0]} to {epoch}")

    def epoch_gone(self, what: str) -> bool:
        """``{chroot}/epoch`` was found missing. True if it may be made again at 0 (no
        epoch above 0 was seen); else a regression."""
        with self._lock:
            cached = self._epoch
            if cached is None or cached[0] == 0:
                self._epoch = None
                return True
        self.regress(f"{what}: the store epoch ({cached[0]}) is gone")
        return False

    # -- regression ----------------------------------------------------------------------------

    @property
    def regressed(self) -> bool:
        with self._lock:
            return self._regressed is not None

    def regressed_epoch(self) -> int | None:
        """The epoch known when the regression was noticed (``None``: not regressed)."""
        with self._lock:
            return None if self._regressed is None else self._regressed_epoch

    def error(self) -> StoreRegressed | None:
        """A new StoreRegressed to raise, or ``None`` if not regressed."""
        with self._lock:
            found = self._regressed
        return None if found is None else StoreRegressed(str(found))

    def regress(self, detail: str) -> None:
        """The store's history went back: remember it, and tell the backend (once)."""
        error = StoreRegressed(
            f"the ZooKeeper store at {self.hosts} went back in its history ({detail}): "
            f"it was wiped or restored from an older backup, and its tokens could go back "
            f"too. Every session of this store is over: stop the workers, run "
            f"consensus-lease bump-epoch --backend URL --above HIGHEST (the highest token "
            f"any destination accepted), then start them again"
        )
        with self._lock:
            if self._regressed is not None:
                return
            self._regressed = error
            self._regressed_epoch = 0 if self._epoch is None else self._epoch[0]
        log.error("store history went back", extra={"error": str(error)})
        self._on_regressed(error)

    def recover(self, epoch: tuple[int, int], identity: tuple[bytes, Any] | None,
                zxid: int) -> bool:
        """Start again from the store as it is now (its ``epoch`` and version, its
        ``identity``, a ``zxid`` just answered) if the epoch was raised above the one
        known when the regression was noticed. Returns whether the backend is usable."""
        with self._lock:
            if self._regressed is None:
                return True
            if epoch[0] <= self._regressed_epoch:
                return False
            self._regressed = None
            self._highest = zxid
            self._identity = _identity_text(identity)
            self._identity_read_at = time.monotonic()
            self._epoch = epoch
        log.warning("store epoch raised after a regression: the backend is usable again",
                    extra={"epoch": epoch[0]})
        return True


class Prober:
    """Probes the store with a fresh client while a session of the backend stays
    disconnected (see the module docstring), from one thread per backend started on the
    first :meth:`wake`.

    Args:
        wire: the round trips.
        history: what the probes are compared with.
        disconnected: ``(since, granted_ttl_s)`` of every session of the backend now
            disconnected (``since``: ``time.monotonic()`` when it was).
    """

    def __init__(self, wire: Wire, history: History,
                 disconnected: Callable[[], list[tuple[float, float]]]) -> None:
        self.wire = wire
        self.history = history
        self.disconnected = disconnected
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # starting the thread
        self._probing = threading.Lock()  # one probe at a time
        self._done_at = -math.inf  # when the last probe ended (monotonic)
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """A session was disconnected: probe if it stays so (called from kazoo's thread).

        Takes no lock once the probe thread runs: when a member goes, every one of its
        clients calls this at once, and 375 connection threads were seen queued on the
        lock here in a W9 run (10 x 1,000 sessions)."""
        if self._thread is None:  # (read without the lock: it is set once, never unset)
            with self._lock:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(target=self._run,
                                                    name="zk-history-probe", daemon=True)
                    self._thread.start()
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.is_set():
                gap = self._next_probe_in()
                if gap is None:
                    break  # nobody disconnected: wait to be woken
                if gap <= 0:
                    self.probe(time.monotonic())
                else:
                    self._stop.wait(min(gap, PROBE_INTERVAL_S))

    def _next_probe_in(self) -> float | None:
        """Seconds until the next probe is due (<= 0: now), ``None``: nobody disconnected."""
        disconnected = self.disconnected()
        if not disconnected:
            return None
        since = min(s for s, _ in disconnected)
        interval_s = min(ttl for _, ttl in disconnected) * KEEPALIVE_FRACTION
        grace_s = min(PROBE_GRACE_S, interval_s / 2)
        every_s = max(PROBE_MIN_INTERVAL_S, min(PROBE_INTERVAL_S, interval_s / 2))
        due = max(since + grace_s, self._done_at + every_s)
        return due - time.monotonic()

    def probe(self, fresh_after: float) -> None:
        """Connect a fresh client and compare (see the module docstring), unless a probe
        ended after ``fresh_after`` (monotonic) already. A store that cannot be reached
        teaches nothing: no error."""
        with self._probing:
            if self._done_at >= fresh_after or self.history.regressed or self._stop.is_set():
                return
            try:
                self._probe_once()
            except BackendUnavailable as exc:
                log.debug("store history probe failed", extra={"error": str(exc)})
            finally:
                self._done_at = time.monotonic()

    def _probe_once(self) -> None:
        config = self.wire.config
        client = config.new_client(PROBE_SESSION_TIMEOUT_S)
        timeout_s = min(config.connect_timeout_s, max(1.0, PROBE_INTERVAL_S))
        try:
            client.start(timeout=timeout_s)
        except KAZOO_ERRORS as exc:  # kazoo has stopped the client
            client.close()
            raise BackendUnavailable(f"probe: no member of {self.wire.hosts} answered") from exc
        try:
            deadline = time.monotonic() + config.timeout_s
            answers = self.wire.read(client, [("barrier", config.base),
                                              ("get", config.identity_node)],
                                     deadline, "a probe of the store's history", worker=False)
            self.history.identity_seen(answers[1], "a probe of the store's history")
        finally:
            try:
                client.stop()
                client.close()
            except KAZOO_ERRORS as exc:
                log.debug("stopping a probe client failed", extra={"error": repr(exc)})
