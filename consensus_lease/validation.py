"""Input checks shared by every backend, so bad input fails the same way everywhere."""

from __future__ import annotations

import math

from .errors import InvalidArgument

__all__ = [
    "MAX_JOB_ID_BYTES",
    "check_job_id",
    "check_limit",
    "check_owner",
    "check_queue_name",
    "check_ttl",
    "check_wait",
]

MAX_JOB_ID_BYTES = 256
"""Longest job id accepted, in UTF-8 bytes."""


def check_job_id(job_id: object) -> str:
    """Return ``job_id`` if it is a non-empty str of at most 256 UTF-8 bytes with no NUL.

    Any other character is allowed; backends encode ids so ``/``, ``..``, spaces or
    non-ASCII cannot collide or escape a key prefix.

    Raises:
        InvalidArgument: with the reason, before anything is sent.
    """
    return _check_name(job_id, "job id", is_job=True)


def check_queue_name(queue: object) -> str:
    """Return ``queue`` if it is a valid queue name: the rules of :func:`check_job_id`
    (a non-empty str of at most 256 UTF-8 bytes with no NUL).

    Raises:
        InvalidArgument: with the reason (naming the queue name), before anything is sent.
    """
    return _check_name(queue, "queue name", is_job=False)


def _check_name(name: object, what: str, *, is_job: bool) -> str:
    if not isinstance(name, str):
        raise InvalidArgument(f"{what} must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidArgument(f"{what} must not be empty")
    if "\x00" in name:
        raise InvalidArgument(f"{what} must not contain NUL", job_id=name if is_job else None)
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:  # lone surrogates
        raise InvalidArgument(f"{what} is not valid Unicode text: {exc.reason}") from None
    if size > MAX_JOB_ID_BYTES:
        raise InvalidArgument(
            f"{what} is {size} UTF-8 bytes; at most {MAX_JOB_ID_BYTES} are allowed",
            job_id=name[:32] + "..." if is_job else None,
        )
    return name


def check_owner(owner: object) -> str:
    """Return ``owner`` if it is a non-empty str of at most 256 UTF-8 bytes with no NUL."""
    if not isinstance(owner, str) or not owner or "\x00" in owner:
        raise InvalidArgument("owner must be a non-empty str without NUL")
    try:
        size = len(owner.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"owner is not valid Unicode text: {exc.reason}") from None
    if size > MAX_JOB_ID_BYTES:
        raise InvalidArgument(f"owner is {size} UTF-8 bytes; at most {MAX_JOB_ID_BYTES}")
    return owner


def _finite_number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} must be a number of seconds, not {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        raise InvalidArgument(f"{name} must be finite, got an int that large") from None
    if not math.isfinite(number):
        raise InvalidArgument(f"{name} must be finite, got {value!r}")
    return number


def check_ttl(ttl_s: object, *, min_s: float, max_s: float) -> float:
    """Return ``ttl_s`` as float if finite and within ``[min_s, max_s]``.

    Raises:
        InvalidArgument: naming the backend's range.
    """
    ttl = _finite_number(ttl_s, "ttl_s")
    if not (min_s <= ttl <= max_s):
        raise InvalidArgument(f"ttl_s={ttl!r} is outside this backend's range [{min_s}, {max_s}] s")
    return ttl


def check_limit(limit: object) -> int | None:
    """Return ``limit`` if it is ``None`` or an int >= 0."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidArgument(f"limit must be None or an int >= 0, got {limit!r}")
    return limit


def check_wait(wait_s: object, name: str = "wait_s") -> float:
    """Return a finite, non-negative number of seconds."""
    wait = _finite_number(wait_s, name)
    if wait < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {wait_s!r}")
    return wait
