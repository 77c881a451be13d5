"""Store epochs: fencing tokens that keep increasing across a restore of the store.

A token is ``epoch * 2**shift + local``: ``local`` is the store's own counter (SQLite and
memory: the job's generation), ``shift`` the backend's ``epoch_shift`` (a bit split, so
``token >> shift`` is the epoch and ``token & (2**shift - 1)`` the counter) and ``epoch``
a number kept in the store that only ``bump_epoch`` raises. Epoch 0 leaves the token
equal to the counter. Tokens stay below ``2**63`` (fences store them as int64), so the
epoch stays below ``2**(63 - shift)``.
"""

from __future__ import annotations

from .errors import InvalidArgument

__all__ = ["compose", "next_epoch", "split"]

TOKEN_LIMIT = 2**63
"""Tokens are below this: destinations store them as signed 64-bit integers."""


def compose(epoch: int, local: int, shift: int) -> int:
    """The token of counter value ``local`` in ``epoch``."""
    return (epoch << shift) | local


def split(token: int, shift: int) -> tuple[int, int]:
    """``(epoch, local)`` of ``token`` (the inverse of :func:`compose`)."""
    return token >> shift, token & ((1 << shift) - 1)


def next_epoch(current: int, above: int | None, shift: int) -> int:
    """The epoch ``bump_epoch(above)`` sets: ``max(current + 1, above // 2**shift + 1)``,
    so that every token of it exceeds every token of ``current`` and ``above``.

    Raises:
        InvalidArgument: ``above`` is not an int from 0 to 2**63 - 1, or the new epoch
            would put tokens at or past 2**63.
    """
    if above is not None and (isinstance(above, bool) or not isinstance(above, int)
                              or not 0 <= above < TOKEN_LIMIT):
        raise InvalidArgument(f"above must be a token (an int from 0 to 2**63-1), not "
                              f"{above!r}")
    new = current + 1 if above is None else max(current + 1, (above >> shift) + 1)
    if new >= 1 << (63 - shift):
        raise InvalidArgument(
            f"epoch {new} would put tokens past 2**63 (this store's epochs end at "
            f"2**{63 - shift} - 1); nothing changed"
        )
    return new
