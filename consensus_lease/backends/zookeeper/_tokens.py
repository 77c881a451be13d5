"""Fencing tokens and the store epoch (``{chroot}/epoch``), for one backend: reading and
caching the epoch for the claim multi's check, and ``bump_epoch``. The protocol (every
token is ``epoch * 2**32 + the job znode's version``, the claim multi's check of the
epoch znode, when to bump) is told once, in the package docstring ("Store epoch and
history regression"); the znode's data is in :mod:`._layout`; noticing that the history
went back, and refusing after it, is :mod:`._tokens_history`.

What is specific to this module:

* the epoch and its znode's version are cached in :class:`._tokens_history.History`
  (read when a session opens); :meth:`Epochs.refresh` reads them again, after a write
  barrier, when a claim multi failed on that check alone (:mod:`._jobs_claim` then sends
  it once more);
* a missing epoch znode is made again at 0 unless an epoch above 0 was seen (then it is
  a regression);
* :meth:`Epochs.bump` makes sure ``{chroot}`` and ``{chroot}/identity`` exist, then
  reads the epoch after a write barrier and writes the new value in one versioned
  ``set_data`` (``create`` if absent), read again and sent again after a concurrent
  bump (at most :data:`BUMP_ATTEMPTS` rounds); its nonce, written with the value, settles
  a lost answer by reading back.
"""

from __future__ import annotations

import logging
from typing import Any

from ...errors import BackendUnavailable, InvalidArgument
from ._layout import EPOCH_SHIFT, MAX_EPOCH, dump_epoch, new_nonce, parse_epoch
from ._sessions import ZkSession
from ._tokens_history import History, new_identity
from ._transport import Wire
from ._transport_errors import translate
from ._transport_multi import bad_version, exists, first_error, missing

__all__ = ["BUMP_ATTEMPTS", "Epochs"]

log = logging.getLogger("consensus_lease.backends.zookeeper")

BUMP_ATTEMPTS = 16
"""Rounds of read + write one ``bump_epoch`` makes while other bumps keep winning."""


class Epochs:
    """Reading, caching and raising the store epoch, for one backend."""

    def __init__(self, wire: Wire, history: History) -> None:
        self.wire = wire
        self.history = history
        self.node = wire.config.epoch_node
        self.base = wire.config.base

    def parse(self, answer: tuple[bytes, Any] | None) -> tuple[int, int] | None:
        """``(epoch, version)`` from ``{chroot}/epoch`` as read (``(data, stat)``;
        ``None``: absent)."""
        if answer is None:
            return None
        return parse_epoch(answer[0], self.node), int(answer[1].version)

    def learned(self, answer: tuple[bytes, Any] | None, what: str) -> tuple[int, int] | None:
        """:meth:`parse`, and cached."""
        epoch = self.parse(answer)
        if epoch is not None:
            self.history.epoch_seen(*epoch, what)
        return epoch

    def cached(self, h: ZkSession) -> tuple[int, int]:
        """The epoch and its znode's version for a claim multi: as cached, or read."""
        epoch = self.history.epoch()
        return epoch if epoch is not None else self.refresh(h)

    def refresh(self, h: ZkSession) -> tuple[int, int]:
        """Read the epoch again on ``h``'s client, after a write barrier (a claim's check
        of it failed; a lagging member must not show an epoch older than one cached
        from another member: that would look like a regression). A missing
        znode is made again at 0 unless an epoch above 0 was seen (a regression then:
        the session ends with StoreRegressed).

        Raises:
            StoreRegressed / SessionExpired / BackendUnavailable.
        """
        for _ in range(2):
            answer = self.wire.session_read(h, [("barrier", self.base), ("get", self.node)],
                                            "claim (reading the store epoch)")[1]
            epoch = self.learned(answer, "claim")
            if epoch is not None:
                h.check_alive()
                return epoch
            if not self.history.epoch_gone("claim"):
                break
            self.wire.create_missing(h.client, [(self.node, b"0")], "claim")
        h.check_alive()  # ended by the regression
        raise BackendUnavailable(f"claim: {self.node} keeps disappearing")

    def current(self) -> int:
        """The epoch now, read after a write barrier on the shared client."""
        answer = self.wire.reader_read([("barrier", self.base), ("get", self.node)],
                                       "reading the store epoch")[1]
        epoch = self.learned(answer, "reading the store epoch")
        return 0 if epoch is None else epoch[0]

    def bump(self, above: int | None) -> tuple[int, int]:
        """Raise the epoch to ``max(epoch + 1, above // 2**32 + 1)``; returns the new
        ``(epoch, version)``. See ``ZooKeeperBackend.bump_epoch``."""
        if above is not None and (isinstance(above, bool) or not isinstance(above, int)
                                  or above < 0):
            raise InvalidArgument(f"above must be a token (an int >= 0), not {above!r}")
        chroot = self.node.rsplit("/", 1)[0] or "/"
        self.wire.ensure_path(self.wire.reader(), chroot, "bump_epoch", worker=False)
        self.wire.create_missing(self.wire.reader(),
                                 [(self.wire.config.identity_node, new_identity())],
                                 "bump_epoch")
        for _ in range(BUMP_ATTEMPTS):
            answer = self.wire.reader_read([("barrier", self.base), ("get", self.node)],
                                           "bump_epoch")[1]
            epoch = 0 if answer is None else parse_epoch(answer[0], self.node)
            new = max(epoch + 1, 0 if above is None else (above >> EPOCH_SHIFT) + 1)
            if new > MAX_EPOCH:
                raise InvalidArgument(
                    f"bump_epoch: epoch {new} would put tokens beyond 2**63 - 1 (the "
                    f"highest epoch is {MAX_EPOCH}); nothing changed")
            version = self._write(new, None if answer is None else answer[1].version)
            if version is not None:
                log.warning("store epoch raised", extra={"epoch": new, "was": epoch})
                self.history.epoch_seen(new, version, "bump_epoch")
                return new, version
        raise BackendUnavailable(f"bump_epoch: other bumps kept changing {self.node}; "
                                 f"nothing was applied")

    def _write(self, epoch: int, version: int | None) -> int | None:
        """One multi writing ``epoch`` at ``version`` (``None``: create it). Returns the
        znode's new version, or ``None`` if it changed meanwhile (read it again)."""
        nonce = new_nonce()
        data = dump_epoch(epoch, nonce)
        written: list[int] = []

        def build(tx: Any) -> None:
            if version is None:
                tx.create(self.node, data)
            else:
                tx.set_data(self.node, data, version)

        def settle(deadline: float) -> bool:
            answer = self.wire.read(self.wire.reader(), [("barrier", self.base),
                                                          ("get", self.node)],
                                    deadline, "bump_epoch (reading back)", worker=False)[1]
            mine = answer is not None and answer[0].split()[1:] == [nonce.encode()]
            if mine:
                written.append(answer[1].version)
            return mine

        multi = self.wire.reader_commit(build, settle, "bump_epoch")
        if multi.applied:
            if written:
                return written[0]
            stat = multi.results[0]
            return 0 if version is None else int(stat.version)
        if not multi.results:
            return None  # the answer was lost and it was not applied
        error = first_error(multi.results)[1]
        if bad_version(error) or exists(error) or missing(error):
            return None  # another bump (or a deletion) came first
        raise translate(error or BackendUnavailable("a multi failed without saying why"),
                        "bump_epoch", self.wire.hosts, worker_session=False)
