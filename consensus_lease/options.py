"""Store options: one vocabulary and one parser for every backend.

A backend declares its options as an :class:`OptionTable` of :class:`Option` specs and
parses what :func:`~consensus_lease.open_store` hands it (the URL's query string merged
with keyword arguments, keyword arguments winning: :func:`merge_options`). Every backend
therefore rejects the same things the same way, with :class:`~consensus_lease.InvalidArgument`:
an unknown name (the message lists the accepted ones), a name given twice in the query
string, a malformed value, or a renamed option (the message names the new name).

Shared names, used by every backend where the concept exists:

=====================  ==================================================================
option                 meaning
=====================  ==================================================================
``connect_timeout_s``  seconds to establish the connection or session
``timeout_s``          seconds allowed for one request
``ca_file``            CA certificate file (PEM) to verify the servers; enables TLS
``cert_file``          client certificate file (PEM) for TLS client authentication
``key_file``           the client certificate's private key file (PEM)
``user``, ``password`` credentials
=====================  ==================================================================

Value kinds (a query string value is text; a keyword argument may be the typed value):

* ``seconds``: a finite float > 0 (``"2.5"``, ``2``, ``2.5``); never a bool.
* ``int``: an int (``"7"``, ``7``); never a bool or float.
* ``bool``: ``True``/``False`` or one of ``true false 1 0 yes no on off``.
* ``str``: a non-empty str, optionally one of ``choices``.
* ``path``: a str or path-like naming an existing file; parsed to a str.
* ``object``: keyword arguments only, an instance of ``instance_of``.

This module knows nothing of any backend.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote_to_bytes, urlsplit

from .errors import InvalidArgument, UnsupportedBackend

__all__ = [
    "RENAMED",
    "Kind",
    "Option",
    "OptionTable",
    "ParsedOptions",
    "merge_options",
    "query_options",
    "redact_url",
]

Kind = Literal["seconds", "int", "bool", "str", "path", "object"]

RENAMED: Mapping[str, str] = {
    "op_timeout_s": "timeout_s",
    "ca": "ca_file",
    "ca_cert": "ca_file",
    "certfile": "cert_file",
    "cert_cert": "cert_file",
    "keyfile": "key_file",
    "cert_key": "key_file",
    "keyfile_password": "key_file_password",
}
"""Old option name -> its name now. An old name is refused with a message naming the new
one (by backends that accept the new one; elsewhere it is simply unknown)."""

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_INT = re.compile(r"[+-]?[0-9]{1,30}")
"""An integer option's text (after surrounding blanks): ASCII digits, at most 30 of them
(``int()`` refuses more than 4,300 with its own ValueError)."""


@dataclass(frozen=True, slots=True)
class Option:
    """One option a backend accepts.

    Attributes:
        name: the option's name (in the query string and as a keyword argument).
        kind: how its value is parsed; see the module docstring.
        default: the value when the option is not given (``None``: not set).
        doc: one line for people: what it does, with its unit.
        minimum / maximum: inclusive bounds for ``seconds`` and ``int`` options.
        choices: the accepted values of a ``str`` option (empty: any non-empty str).
        secret: never quote the value in an error message (passwords).
        instance_of: the class an ``object`` option's value must be an instance of.
    """

    name: str
    kind: Kind
    default: object = None
    doc: str = ""
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    secret: bool = False
    instance_of: type | None = None

    def parse(self, value: object, backend: str) -> object:
        """Return ``value`` parsed to this option's kind. ``None`` for an option whose
        default is ``None`` (unset) leaves it unset.

        Raises:
            InvalidArgument: naming the backend, the option and what was expected.
        """
        if value is None and self.default is None:
            return None  # None for an option that defaults to unset: not set
        shown = "(hidden)" if self.secret else repr(value)
        if len(shown) > 60:
            shown = shown[:56] + "..."
        where = f"{backend} option {self.name}"
        if self.kind == "seconds":
            number = _number(value)
            if number is None or not number > 0:
                raise InvalidArgument(
                    f"{where} must be a finite number of seconds > 0, not {shown}"
                )
            self._check_range(number, where, shown)
            return number
        if self.kind == "int":
            if isinstance(value, str) and _INT.fullmatch(value.strip(" \t")):
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgument(f"{where} must be an integer, not {shown}")
            self._check_range(value, where, shown)
            return value
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
                return value.strip().lower() in _TRUE
            raise InvalidArgument(f"{where} must be true or false, not {shown}")
        if self.kind == "str":
            if not isinstance(value, str) or not value:
                raise InvalidArgument(f"{where} must be a non-empty str, not {shown}")
            if self.choices and value not in self.choices:
                raise InvalidArgument(
                    f"{where} must be one of {', '.join(self.choices)}, not {shown}"
                )
            return value
        if self.kind == "path":
            if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
                raise InvalidArgument(f"{where} must be a file path, not {shown}")
            path = os.fspath(value)
            if not isinstance(path, str) or not os.path.isfile(path):
                raise InvalidArgument(f"{where}: no such file {path!r}")
            return path
        if self.instance_of is not None and not isinstance(value, self.instance_of):
            raise InvalidArgument(
                f"{where} must be a {self.instance_of.__module__}.{self.instance_of.__qualname__},"
                f" not {type(value).__name__}"
            )
        return value

    def _check_range(self, number: float, where: str, shown: str) -> None:
        low, high = self.minimum, self.maximum
        if (low is None or number >= low) and (high is None or number <= high):
            return
        if high is None:
            bounds = f">= {low}"
        elif low is None:
            bounds = f"<= {high}"
        else:
            bounds = f"in [{low}, {high}]"
        raise InvalidArgument(f"{where} must be {bounds}, not {shown}")


def _number(value: object) -> float | None:
    """A finite float from a number or its text, else ``None`` (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    if isinstance(value, str) and (not value.isascii() or "_" in value):
        return None  # float() also takes "1_0" and other scripts' digits
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


class ParsedOptions:
    """The parsed options of one store: every option of the table, given or default.

    The getters are typed; asking for an option as the wrong kind is a programming error
    (``TypeError``), never a user error.
    """

    def __init__(self, values: Mapping[str, object], given: Iterable[str]) -> None:
        self.values: Mapping[str, object] = dict(values)
        self.given: frozenset[str] = frozenset(given)
        """Names the caller gave (the others hold their defaults)."""

    def _get(self, name: str, kind: type | tuple[type, ...]) -> object:
        value = self.values[name]
        if not isinstance(value, kind):
            raise TypeError(f"option {name} is {value!r}, not {kind}")
        return value

    def seconds(self, name: str) -> float:
        value = self._get(name, (float, int))
        assert isinstance(value, (float, int))
        return float(value)

    def integer(self, name: str) -> int:
        value = self._get(name, int)
        assert isinstance(value, int)
        return value

    def flag(self, name: str) -> bool:
        value = self._get(name, bool)
        assert isinstance(value, bool)
        return value

    def text(self, name: str) -> str | None:
        """A ``str`` or ``path`` option, or ``None`` when not set."""
        value = self._get(name, (str, type(None)))
        assert value is None or isinstance(value, str)
        return value

    def value(self, name: str) -> object:
        """An ``object`` option (check its type with ``instance_of``)."""
        return self.values[name]


class OptionTable:
    """The options one backend accepts.

    Args:
        backend: the backend's name in error messages (``"etcd"``, ``"ZooKeeper"``).
        options: the specs; names must be distinct.
    """

    def __init__(self, backend: str, options: Iterable[Option]) -> None:
        self.backend = backend
        self.options: dict[str, Option] = {}
        for option in options:
            if option.name in self.options:
                raise ValueError(f"option {option.name} is declared twice")
            self.options[option.name] = option

    @property
    def names(self) -> list[str]:
        """The accepted names, sorted."""
        return sorted(self.options)

    def parse(self, given: Mapping[str, object]) -> ParsedOptions:
        """Parse ``given`` (see :func:`merge_options`) against this table.

        Raises:
            InvalidArgument: a renamed option (naming its new name), unknown options
                (listing the accepted names), or a malformed value.
        """
        for name in sorted(given):
            new = RENAMED.get(name)
            if new is not None and new in self.options and name not in self.options:
                raise InvalidArgument(
                    f"{self.backend} option {name!r} was renamed to {new!r}"
                )
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            raise InvalidArgument(
                f"unknown {self.backend} option(s): {', '.join(map(str, unknown))}; "
                f"accepted: {', '.join(self.names)}"
            )
        values = {
            name: option.parse(given[name], self.backend) if name in given else option.default
            for name, option in self.options.items()
        }
        return ParsedOptions(values, given)


_SECRET_QUERY = re.compile(r"(?i)(^|[?&])(password|passwd|pwd)=[^&#]*")
_USERINFO_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:?#]*):[^/@?#]*@")


def redact_url(url: object) -> str:
    """``url`` as it may appear in a message or a log: a password in the user info
    (``scheme://user:PASSWORD@host``) or the query string (``password=...``) replaced
    by ``***``. Anything that is not a str is shown with ``repr``."""
    if not isinstance(url, str):
        return repr(url)
    shown = _USERINFO_PASSWORD.sub(r"\1:***@", url)
    return _SECRET_QUERY.sub(lambda m: f"{m.group(1)}{m.group(2)}=***", shown)


def query_options(url: str) -> dict[str, str]:
    """The options in ``url``'s query string (``name=value`` pairs joined by ``&``; ``+``
    is a space), percent-decoded as UTF-8, checked as the URL's other parts are: a
    ``%`` not followed by two hex digits, or bytes that are not UTF-8 once decoded, are
    refused (never passed on literally, never replaced by U+FFFD). A message names the
    option, never its value (it may be a password).

    Raises:
        InvalidArgument: a name given twice; a name or value badly percent-encoded or
            not UTF-8.
        UnsupportedBackend: the URL cannot be split into its parts.
    """
    try:
        query = urlsplit(url).query
    except ValueError as exc:
        raise UnsupportedBackend(f"malformed store URL {redact_url(url)!r}: {exc}") from exc
    options: dict[str, str] = {}
    for pair in query.split("&"):
        if not pair:
            continue  # "a=1&&b=2", a trailing "&": nothing, as urllib.parse.parse_qsl
        raw_name, _, raw_value = pair.partition("=")
        name = _query_part(raw_name, "an option name")
        value = _query_part(raw_value, f"option {name!r}")
        if name in options:
            raise InvalidArgument(f"option {name!r} is given twice in the URL's query string")
        options[name] = value
    return options


_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
"""A ``%`` not followed by two hex digits."""


def _query_part(raw: str, what: str) -> str:
    """One name or value of a query string, decoded (``+`` a space, ``%XX`` a byte, the
    bytes UTF-8), else ``InvalidArgument`` naming ``what`` without its text."""
    raw = raw.replace("+", " ")
    if _BAD_PERCENT.search(raw):
        raise InvalidArgument(
            f"{what} in the URL's query string has a % not followed by two hex digits "
            "(percent-encode a literal % as %25)"
        )
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"{what} in the URL's query string is not UTF-8 once percent-decoded "
            "(percent-encode the UTF-8 bytes of the text)"
        ) from None


def merge_options(url: str, keywords: Mapping[str, object]) -> dict[str, object]:
    """The query string's options overridden by ``keywords`` (keyword arguments win).

    Raises:
        InvalidArgument / UnsupportedBackend: as :func:`query_options`.
    """
    return {**query_options(url), **keywords}
