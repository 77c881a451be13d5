"""Checks of every value the PostgreSQL store hands to libpq, before anything is sent.

libpq reads its connection string as a C string: a NUL character ends it, so whatever
follows is silently dropped and replaced by libpq's defaults (``PG*`` variables, then the
local socket, the database named like the user). ``password='p\\x00x'`` therefore did not
fail: it connected without the URL's host, port and database, and the store created its
schema wherever that led. psycopg passes such a value through (``make_conninfo`` quotes
spaces and quotes, not NUL); libpq's own URI parser refuses ``%00`` but names neither the
part nor hides the password; a character UTF-8 cannot encode (a lone surrogate) raises
``UnicodeEncodeError`` out of psycopg.

So every value is checked here, by the name the caller used: the URL's parts
(:func:`check_url`: ``user``, ``password``, ``host``, ``port``, ``dbname`` after
percent-decoding, as libpq decodes them), every text option
(:func:`check_option_values`: the query string's and ``open_store``'s keyword arguments
alike) and, last, the whole connection string (:func:`check_conninfo`, for callers that
build a :class:`~consensus_lease.backends.postgresql.PostgresBackend` themselves). Each
failure is :class:`~consensus_lease.errors.InvalidArgument` naming the parameter; a
password's value is never quoted.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping

from ..errors import InvalidArgument

__all__ = [
    "check_conninfo", "check_option_values", "check_url", "hide_password", "value_problem",
]

_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
"""A ``%`` not followed by two hex digits: libpq's ``invalid percent-encoded token``."""


def value_problem(value: object, *, percent_encoded: bool = False) -> str | None:
    """Why libpq cannot carry ``value`` as a connection parameter, or ``None`` if it can.

    Args:
        value: the parameter's value.
        percent_encoded: ``value`` is a URL part: decode it as libpq does first.
    """
    if not isinstance(value, str):
        return f"must be a str, not {type(value).__name__}"
    if "\x00" in value:
        return ("contains a NUL character (libpq would stop reading the connection string "
                "there and use its defaults for the rest)")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a character UTF-8 cannot encode (a lone surrogate)"
    if not percent_encoded:
        return None
    if _PERCENT.search(value):
        return "has a % not followed by two hex digits (percent-encode it as %25)"
    decoded = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), raw)
    if b"\x00" in decoded:
        return ("contains %00, a NUL character (libpq would stop reading the connection "
                "string there)")
    try:
        decoded.decode("utf-8")
    except UnicodeDecodeError:
        return "is not UTF-8 after percent-decoding"
    return None


def _refuse(what: str, problem: str, value: object, secret: bool) -> InvalidArgument:
    shown = "" if secret or not isinstance(value, str) else f" ({value[:64]!r})"
    return InvalidArgument(f"PostgreSQL {what}{shown} {problem}")


def url_parts(conninfo: str) -> Iterator[tuple[str, str]]:
    """``(name, raw value)`` of each part of a ``postgresql://`` URL without its query
    string, split as libpq splits it (``[user[:password]@][host][:port][,...][/dbname]``;
    the credentials end at the first ``@`` before any ``/``)."""
    rest = conninfo.split("://", 1)[1]
    authority, slash, dbname = rest.partition("/")
    userinfo, at, hosts = authority.partition("@")
    if not at:
        userinfo, hosts = "", authority
    user, colon, password = userinfo.partition(":")
    yield "user", user
    if colon:
        yield "password", password
    for spec in hosts.split(","):
        if spec.startswith("["):
            host, _, after = spec[1:].partition("]")
            port = after[1:] if after.startswith(":") else after
        else:
            host, _, port = spec.partition(":")
        yield "host", host
        yield "port", port
    if slash:
        yield "dbname", dbname


def check_url(conninfo: str) -> None:
    """Refuse a ``postgresql://`` URL (its part before ``?``) with a part libpq cannot
    carry.

    Raises:
        InvalidArgument: naming the part (``the URL's password``); never its value when it
            is the password.
    """
    for name, raw in url_parts(conninfo):
        problem = value_problem(raw, percent_encoded=True)
        if problem is not None:
            raise _refuse(f"URL's {name}", problem, raw, secret=name == "password")
    check_conninfo(conninfo)


def hide_password(text: str, conninfo: str) -> str:
    """``text`` (a libpq parser message, which may quote the whole URI) with the URL's
    password replaced by ``***``."""
    for name, raw in url_parts(conninfo):
        if name == "password" and raw:
            text = text.replace(raw, "***")
    return text


def check_option_values(values: Mapping[str, object], secret: Collection[str]) -> None:
    """Refuse any text option (given in the query string or as a keyword argument, already
    percent-decoded) that libpq cannot carry. Options that are not text (numbers, flags,
    unset ones) are not looked at: their own parsing checked them.

    Raises:
        InvalidArgument: naming the option; never the value of one in ``secret``.
    """
    for name, value in values.items():
        if not isinstance(value, str):
            continue
        problem = value_problem(value)
        if problem is not None:
            raise _refuse(f"option {name}", problem, value, secret=name in secret)


def check_conninfo(conninfo: object) -> None:
    """Refuse a whole connection string libpq cannot read to its end (the last guard, for
    strings built elsewhere).

    Raises:
        InvalidArgument: the string is not a str, holds a NUL or an unencodable character
            (its value is not shown: it may hold a password).
    """
    problem = value_problem(conninfo)
    if problem is not None:
        raise _refuse("connection string", problem, conninfo, secret=True)
