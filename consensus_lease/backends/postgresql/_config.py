"""The URL and options of the PostgreSQL store, parsed and checked before anything is
sent: :data:`OPTIONS` (the option table of the package docstring,
:mod:`consensus_lease.backends.postgresql`) and :func:`parse_url`.

Checks of every value the PostgreSQL store hands to libpq, before anything is sent.

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
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ...errors import InvalidArgument
from ...options import Option, OptionTable, ParsedOptions

__all__ = [
    "LIBPQ_OPTIONS", "MAX_BATCH_BYTES", "MAX_BATCH_CLAIM", "OPTIONS", "POOLING", "SECRET_OPTIONS",
    "check_conninfo", "check_option_values", "check_url", "hide_password", "libpq_params",
    "parse_url", "value_problem",
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


POOLING = ("none", "session", "transaction")
"""The values of the ``pooling`` option: what sits between the store and the server."""

OPTIONS = OptionTable(
    "PostgreSQL",
    [
        Option("schema", "str", "consensus_lease", "schema holding the store's tables"),
        Option("connect_timeout_s", "seconds", 5.0, "seconds to open a connection"),
        Option("timeout_s", "seconds", 5.0, "seconds one statement may take"),
        Option("poll_interval_s", "seconds", 0.1,
               "fallback re-check interval of waiting claims (expiry)"),
        Option("pool_size", "int", 10, "most pooled connections", minimum=1, maximum=1000),
        Option("create", "bool", True, "create the schema and tables if missing"),
        Option("pooling", "str", "none", "the connection pooler in between (PgBouncer's "
               "pool_mode): none, session or transaction", choices=POOLING),
        Option("listen_url", "str", None, "postgresql:// URL of a direct connection to the "
               "same database for LISTEN (with pooling=transaction: none, waiting claims "
               "poll)", secret=True),
        Option("ca_file", "path", None, "PEM CA file to verify the server (libpq sslrootcert);"
               " sslmode verify-full unless sslmode is given"),
        Option("cert_file", "path", None, "client certificate file (libpq sslcert)"),
        Option("key_file", "path", None, "client certificate's key file (libpq sslkey)"),
        Option("user", "str", None, "user name (libpq user; overrides the URL's)"),
        Option("password", "str", None, "password (libpq password; overrides the URL's)",
               secret=True),
        Option("sslmode", "str", None, "libpq sslmode",
               choices=("disable", "allow", "prefer", "require", "verify-ca", "verify-full")),
        Option("gssencmode", "str", None, "libpq gssencmode",
               choices=("disable", "prefer", "require")),
        Option("channel_binding", "str", None, "libpq channel_binding",
               choices=("disable", "prefer", "require")),
        Option("target_session_attrs", "str", None, "libpq target_session_attrs",
               choices=("any", "read-write", "read-only", "primary", "standby",
                        "prefer-standby")),
        *(Option(name, "str", None, f"libpq {name}") for name in (
            "host", "hostaddr", "port", "sslrootcert", "sslcert", "sslkey", "sslcrl",
            "application_name", "options", "passfile")),
        Option("keepalives", "int", None, "libpq keepalives (1 on, 0 off)", minimum=0,
               maximum=1),
        *(Option(name, "int", None, f"libpq {name}", minimum=0) for name in (
            "keepalives_idle", "keepalives_interval", "keepalives_count")),
    ],
)
"""The options of ``postgresql://`` URLs (the table in the package docstring)."""

SECRET_OPTIONS = frozenset(o.name for o in OPTIONS.options.values() if o.secret)
"""Options whose value no error message quotes."""

LIBPQ_OPTIONS = (
    "host", "hostaddr", "port", "sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl",
    "application_name", "target_session_attrs", "options", "passfile", "channel_binding",
    "gssencmode", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
    "user", "password",
)
"""Options handed to libpq under their own name (with their libpq meaning,
https://www.postgresql.org/docs/15/libpq-connect.html#LIBPQ-PARAMKEYWORDS)."""

MAX_BATCH_CLAIM = 1000
"""Most jobs one ``claim_many`` statement claims (``capabilities.max_batch_claim``; the
session splits longer lists), and one ``complete_many`` statement completes."""

MAX_BATCH_BYTES = 32 * 1024 * 1024
"""Most bytes of results (``complete_many``), error texts (``fail_many``) or payloads
(``enqueue_many``) one batch statement carries (the job ids, at most 256 KB a batch, are
not counted): a longer batch goes out as several statements (``complete_many`` /
``fail_many``: each its own transaction; ``enqueue_many``: all in its one), one item
never split (16 MiB results go two to a statement). A statement's parameters travel as
one message, which libpq builds whole in its output buffer and the server reads whole;
both refuse a message of 1 GiB or more (libpq with ``cannot allocate memory for output
buffer``), and each array parameter is one value, also limited to 1 GiB. 32 MiB keeps a
statement far below those limits and the copies the client and the server make of it at
tens of MiB, while a statement that large takes far longer to send and write than its
round trip, so splitting costs nothing measurable: 66 results of 16 MiB took 45 s as 33
statements and 44 s as 66 (a local server on a 2-core VM; the client's peak RSS 250
MiB). A batch of 1,000 items with the largest error texts (64 KiB) is two statements."""

SHARED_TO_LIBPQ = {"ca_file": "sslrootcert", "cert_file": "sslcert", "key_file": "sslkey"}
"""The library's shared option names and the libpq parameter each one sets."""


def _listen_conninfo(url: str, extra: Mapping[str, str], store_url: str = "") -> str:
    """The listener's connection string: ``url`` (a libpq URI or connection string) with
    the libpq parameters given as options (credentials, TLS ...) and the ``user`` and
    ``password`` of ``store_url`` (the store's URL; options win over it) that it does not
    set itself; never the store's ``host``/``hostaddr``/``port``, which is what it
    differs in.

    Raises:
        InvalidArgument: ``url`` is malformed (the message leaves the password out).
    """
    try:
        own = conninfo_to_dict(url)
        store = conninfo_to_dict(store_url) if store_url else {}
        given = {k: str(store[k]) for k in ("user", "password") if store.get(k)}
        inherited = {k: v for k, v in {**given, **extra}.items()
                     if k not in own and k not in ("host", "hostaddr", "port")}
        return make_conninfo(url, **inherited) if inherited else url
    except psycopg.ProgrammingError:
        raise InvalidArgument("PostgreSQL option listen_url is not a valid libpq URI or "
                              "connection string") from None


def _port_option(options: Mapping[str, object]) -> Mapping[str, object]:
    """``options`` with an int ``port`` keyword (not a bool) as its text, so that
    ``port=5432`` is accepted like ``?port=5432``."""
    port = options.get("port")
    if isinstance(port, int) and not isinstance(port, bool):
        return {**options, "port": str(port)}
    return options


def _check_port(port: str | None) -> None:
    """Refuse a ``port`` option that is not a port number in 1..65535, or a
    comma-separated list of them (one per host), before libpq sees it.

    Raises:
        InvalidArgument: naming the option and the range.
    """
    if port is None:
        return
    for part in port.split(","):
        text = part.strip()
        if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
            raise InvalidArgument(
                f"PostgreSQL option port must be a port number in 1..65535, or a "
                f"comma-separated list of them (one per host), not {port!r}"
            )


def libpq_params(parsed: ParsedOptions) -> dict[str, str]:
    """The libpq connection parameters the options give (``ca_file`` ... mapped to their
    libpq names; ``ca_file`` without ``sslmode`` means ``sslmode=verify-full``).

    Raises:
        InvalidArgument: a shared name and its libpq name both given (``ca_file`` and
            ``sslrootcert``); ``connect_timeout`` (use ``connect_timeout_s``).
    """
    params = {name: str(parsed.values[name]) for name in LIBPQ_OPTIONS
              if parsed.values[name] is not None}
    for shared, libpq in SHARED_TO_LIBPQ.items():
        value = parsed.text(shared)
        if value is None:
            continue
        if libpq in params:
            raise InvalidArgument(
                f"PostgreSQL options {shared} and {libpq} are the same setting: give one"
            )
        params[libpq] = value
    if parsed.values["ca_file"] is not None and "sslmode" not in params:
        params["sslmode"] = "verify-full"
    return params


def _store_conninfo(url: str) -> str:
    """The part of ``url`` before ``?`` as the libpq URI handed on (``postgres://``,
    libpq's other spelling, made ``postgresql://``), checked by libpq's own parser.

    Raises:
        InvalidArgument: not a ``postgresql://`` URL, a part libpq cannot carry, or
            malformed (the message leaves the password out).
    """
    conninfo = url.split("?", 1)[0]
    if conninfo[:11].lower() == "postgres://":  # libpq's other spelling (Heroku's)
        conninfo = "postgresql://" + conninfo[11:]
    if not conninfo.lower().startswith("postgresql://") or conninfo == "postgresql://":
        raise InvalidArgument(
            f"PostgreSQL URL must be postgresql://user:password@host:port/dbname, got "
            f"{conninfo.split('@')[-1]!r}"
        )
    check_url(conninfo)  # NUL, %00, unencodable: named, before libpq sees them
    try:
        conninfo_to_dict(conninfo)  # libpq's own parser
        parts = urlsplit(conninfo)
        if "," not in parts.netloc:  # one host: libpq checks its port only on connect
            _ = parts.port
    except (psycopg.ProgrammingError, ValueError) as exc:
        raise InvalidArgument(
            f"malformed PostgreSQL URL: {hide_password(str(exc), conninfo)}") from None
    return conninfo


def parse_url(url: str, options: Mapping[str, object]) -> dict[str, Any]:
    """The keyword arguments of :class:`~consensus_lease.backends.postgresql.PostgresBackend`
    for ``url`` and ``options`` (the query string's and ``open_store``'s, keyword
    arguments winning): the libpq connection string with the libpq parameters among the
    options, and the store's own options. Nothing is sent.

    Raises:
        InvalidArgument: see the package docstring (Errors).
    """
    conninfo = _store_conninfo(url)
    if "connect_timeout" in options:
        raise InvalidArgument(
            "PostgreSQL option connect_timeout: use connect_timeout_s (seconds)"
        )
    parsed = OPTIONS.parse(_port_option(options))
    check_option_values(parsed.values, SECRET_OPTIONS)
    _check_port(parsed.text("port"))
    extra = libpq_params(parsed)
    if extra:
        try:
            conninfo = make_conninfo(conninfo, **extra)
        except psycopg.ProgrammingError as exc:
            raise InvalidArgument("malformed PostgreSQL connection options "
                                  f"({type(exc).__name__})") from None
    listen = parsed.text("listen_url")
    if listen is not None:
        if "://" in listen:
            check_url(listen.split("?", 1)[0])  # a %00 in its password: as the store's URL
        listen = _listen_conninfo(listen, extra, url.split("?", 1)[0])
    return {
        "conninfo": conninfo,
        "pooling": parsed.text("pooling") or "none",
        "listen_conninfo": listen,
        "schema": parsed.text("schema") or "consensus_lease",
        "connect_timeout_s": parsed.seconds("connect_timeout_s"),
        "timeout_s": parsed.seconds("timeout_s"),
        "poll_interval_s": parsed.seconds("poll_interval_s"),
        "pool_size": parsed.integer("pool_size"),
        "create": parsed.flag("create"),
    }
