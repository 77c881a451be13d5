"""Input checks shared by every backend, so bad input fails the same way everywhere."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from ._election import ELECTION_PREFIX
from .errors import InvalidArgument

__all__ = [
    "MAX_ELECTION_NAME_BYTES",
    "MAX_JOB_ID_BYTES",
    "check_count",
    "check_election_name",
    "check_job_id",
    "check_limit",
    "check_owner",
    "check_queue_name",
    "check_ttl",
    "check_wait",
    "shown_number",
]

MAX_JOB_ID_BYTES = 256
"""Longest job id accepted, in UTF-8 bytes."""

MAX_ELECTION_NAME_BYTES = MAX_JOB_ID_BYTES - len(ELECTION_PREFIX)
"""Longest election name accepted, in UTF-8 bytes (253: its key, the reserved prefix +
the name, is at most :data:`MAX_JOB_ID_BYTES`)."""


def check_job_id(job_id: object) -> str:
    """Return ``job_id`` if it is a non-empty str of at most 256 UTF-8 bytes with no NUL,
    not starting with the prefix reserved for elections (``"\\x1fe:"``, see
    :mod:`consensus_lease._election`).

    Any other character is allowed; backends encode ids so ``/``, ``..``, spaces or
    non-ASCII cannot collide or escape a key prefix.

    Raises:
        InvalidArgument: with the reason, before anything is sent.
    """
    name = _check_name(job_id, "job id", is_job=True)
    if name.startswith(ELECTION_PREFIX):
        raise InvalidArgument(
            f"job id {name[:32]!r} starts with {ELECTION_PREFIX!r}, the prefix reserved for "
            f"election names (session.campaign); choose another id",
            job_id=name[:32],
        )
    return name


def check_election_name(name: object) -> str:
    """Return ``name`` if it is a valid election name: a non-empty str of at most
    :data:`MAX_ELECTION_NAME_BYTES` (253) UTF-8 bytes with no NUL.

    Raises:
        InvalidArgument: with the reason, before anything is sent.
    """
    checked = _check_name(name, "election name", is_job=False)
    size = len(checked.encode("utf-8"))
    if size > MAX_ELECTION_NAME_BYTES:
        raise InvalidArgument(
            f"election name is {size} UTF-8 bytes; at most {MAX_ELECTION_NAME_BYTES} are "
            f"allowed"
        )
    return checked


def check_queue_name(queue: object) -> str:
    """Return ``queue`` if it is a valid queue name: the rules of :func:`check_job_id`
    (a non-empty str of at most 256 UTF-8 bytes with no NUL).

    Raises:
        InvalidArgument: with the reason (naming the queue name), before anything is sent.
    """
    name = _check_name(queue, "queue name", is_job=False)
    if name.startswith(ELECTION_PREFIX):
        raise InvalidArgument(
            f"queue name {name[:32]!r} starts with {ELECTION_PREFIX!r}, the prefix reserved "
            f"for election names; choose another name"
        )
    return name


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


def shown_number(value: object) -> str:
    """``repr(value)``, but an int past 64 bits as its size (its digits can be thousands
    long, and past 4,300 ``repr`` itself raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    return repr(value)


def _finite_number(value: object, name: str,
                   too_large: Callable[[], str] | None = None) -> float:
    """``value`` as a finite float; ``too_large()``: the message for an int past the
    float range (``None``: that it is past every limit)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} must be a number of seconds, not {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        raise InvalidArgument(too_large() if too_large else f"{name} is past every limit, "
                              f"got {shown_number(value)} (no float holds it)") from None
    if not math.isfinite(number):
        raise InvalidArgument(f"{name} must be finite, got {value!r}")
    return number


def check_ttl(ttl_s: object, *, min_s: float, max_s: float) -> float:
    """Return ``ttl_s`` as float if finite and within ``[min_s, max_s]``.

    Raises:
        InvalidArgument: naming the backend's range.
    """
    outside = f"is outside this backend's range [{min_s}, {max_s}] s"
    ttl = _finite_number(ttl_s, "ttl_s", lambda: f"ttl_s={shown_number(ttl_s)} {outside}")
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


def check_count(value: object, name: str) -> int:
    """Return ``value`` if it is an int >= 1 (a ``bool`` is refused: ``True`` is no
    count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")
    return value


def check_wait(wait_s: object, name: str = "wait_s") -> float:
    """Return a finite, non-negative number of seconds, at most :data:`MAX_WAIT_S`."""
    wait = _finite_number(wait_s, name)
    if wait < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {wait_s!r}")
    if wait > MAX_WAIT_S:
        raise InvalidArgument(f"{name} must be at most {MAX_WAIT_S:.0f} s (the longest wait "
                              f"this platform's threads can make), got {wait_s!r}")
    return wait


MAX_WAIT_S = float(threading.TIMEOUT_MAX)
"""Longest ``wait_s`` (about 292 years on 64-bit Linux): ``threading``'s limit."""


MAX_ERROR_BYTES = 64 * 1024
"""Largest error text ``lease.fail()`` records."""

MAX_RETRY_IN_S = 366 * 24 * 3600.0
"""Longest retry delay ``lease.fail()`` accepts (a year)."""


def check_retry_in(retry_in_s: object, name: str = "retry_in_s") -> float:
    """Return a retry delay: finite seconds from 0 to :data:`MAX_RETRY_IN_S` (a value
    above it, however large, is refused with that limit: :func:`retry_limit_message`).

    Raises:
        InvalidArgument: not a finite number, below 0, or over the limit.
    """
    delay = _finite_number(retry_in_s, name, lambda: retry_limit_message(name, retry_in_s))
    if delay < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {retry_in_s!r}")
    if delay > MAX_RETRY_IN_S:
        raise InvalidArgument(retry_limit_message(name, retry_in_s))
    return delay


def retry_limit_message(name: str, value: object) -> str:
    """The one text of a retry delay over :data:`MAX_RETRY_IN_S` (``lease.fail``,
    ``fail_many``, the worker's ``Retry``, ``RetryPolicy``)."""
    return (f"{name} must be at most {MAX_RETRY_IN_S:.0f} s (a year: the longest retry "
            f"delay lease.fail() accepts), got {shown_number(value)}")


def error_text(
    error: object, *, job_id: str | None = None, generation: int | None = None
) -> str:
    """The text ``fail()`` records: a str as given (at most :data:`MAX_ERROR_BYTES` of
    UTF-8, no NUL), an exception as ``"TypeName: message"`` cut to that size (an
    exception whose ``str()`` raises or returns a non-str is recorded by its type and
    what its ``str()`` did, so the failure is still recorded)."""
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {_message(error)}".replace("\0", "\\0")
        data = text.encode("utf-8", "replace")[:MAX_ERROR_BYTES]
        return data.decode("utf-8", "ignore")
    if not isinstance(error, str):
        raise InvalidArgument(
            f"error must be a str or an exception, not {type(error).__name__}",
            job_id=job_id, generation=generation,
        )
    if "\0" in error or len(error.encode("utf-8", "surrogatepass")) > MAX_ERROR_BYTES:
        raise InvalidArgument(
            f"error text must have no NUL and be at most {MAX_ERROR_BYTES} bytes of UTF-8",
            job_id=job_id, generation=generation,
        )
    try:
        error.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("error text is not valid Unicode (lone surrogate)",
                              job_id=job_id, generation=generation) from None
    return error


def _message(error: BaseException) -> str:
    """``str(error)``, or what went wrong making it (a broken ``__str__`` in user code
    must not stop the failure from being recorded)."""
    try:
        return str(error)
    except Exception as exc:  # the user's __str__ raised (or returned a non-str)
        return f"<str() raised {type(exc).__name__}>"
