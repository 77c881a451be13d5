"""Parse an ``etcd://`` URL and its options into an :class:`EtcdConfig`.

The option table (names, defaults, meaning) lives in the package docstring,
:mod:`consensus_lease.backends.etcd`; keep the two in step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from ...errors import InvalidArgument, UnsupportedBackend

__all__ = ["DEFAULT_PREFIX", "EtcdConfig", "parse_url"]

DEFAULT_PORT = 2379
DEFAULT_PREFIX = "/consensus_lease"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0

_FLOAT_OPTIONS = ("timeout_s", "connect_timeout_s")
_TEXT_OPTIONS = ("user", "password", "ca_cert", "cert_key", "cert_cert")
KNOWN_OPTIONS = frozenset(_FLOAT_OPTIONS + _TEXT_OPTIONS)


@dataclass(frozen=True, slots=True)
class EtcdConfig:
    """Everything the driver needs to reach the cluster. See the package docstring.

    Attributes:
        endpoints: ``host:port`` of each member, in URL order (IPv6 hosts in brackets).
        prefix: the key prefix, UTF-8, with a leading ``/`` and no trailing ``/``.
        timeout_s: deadline of one gRPC request, in seconds.
        connect_timeout_s: how long, in seconds, to keep trying members (connecting,
            failing over, reading back after an ambiguous write) before giving up.
        user / password: etcd RBAC credentials, or ``None``.
        ca_cert / cert_key / cert_cert: PEM file paths for TLS, or ``None``.
    """

    endpoints: tuple[str, ...]
    prefix: bytes
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_cert: str | None = None
    cert_key: str | None = None
    cert_cert: str | None = None

    @property
    def tls(self) -> bool:
        return self.ca_cert is not None

    def describe(self) -> str:
        """Endpoints and prefix for messages (no secrets)."""
        return f"etcd://{','.join(self.endpoints)}{self.prefix.decode('utf-8', 'replace')}"


def _parse_hosts(netloc: str, url: str) -> tuple[str, ...]:
    hosts = []
    for part in netloc.split(","):
        part = part.strip()
        if not part:
            raise UnsupportedBackend(f"empty host in {url!r}")
        if part.startswith("["):  # [IPv6]:port
            host, sep, rest = part.partition("]")
            host += "]"
            port_text = rest[1:] if rest.startswith(":") else ""
            if rest and not rest.startswith(":"):
                raise UnsupportedBackend(f"malformed host {part!r} in {url!r}")
        else:
            host, sep, port_text = part.rpartition(":")
            if not sep:
                host, port_text = part, ""
        if not port_text:
            port = DEFAULT_PORT
        elif port_text.isdigit() and 0 < int(port_text) < 65536:
            port = int(port_text)
        else:
            raise UnsupportedBackend(f"bad port {port_text!r} in {url!r}")
        if not host or host == "[]":
            raise UnsupportedBackend(f"empty host in {url!r}")
        hosts.append(f"{host}:{port}")
    return tuple(hosts)


def _positive_seconds(name: str, value: object) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InvalidArgument(f"etcd option {name}={value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"etcd option {name} must be seconds, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise InvalidArgument(f"etcd option {name}={value!r} must be finite and > 0")
    return number


def _text(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"etcd option {name} must be a str, not {type(value).__name__}")
    return value


def parse_url(url: str, options: Mapping[str, object]) -> EtcdConfig:
    """Build the config from ``etcd://[user:password@]h1:p1,h2:p2/prefix`` and options
    (already merged: query string and keyword arguments, keyword arguments win).

    Raises:
        UnsupportedBackend: malformed URL (no host, bad port).
        InvalidArgument: unknown option, bad value, or half-given credentials/certificates.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "etcd":
        raise UnsupportedBackend(f"not an etcd:// URL: {url!r}")
    unknown = set(options) - KNOWN_OPTIONS
    if unknown:
        raise InvalidArgument(
            f"unknown etcd option(s): {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(KNOWN_OPTIONS))}"
        )
    netloc = parts.netloc
    userinfo: dict[str, str] = {}
    if "@" in netloc:
        creds, _, netloc = netloc.rpartition("@")
        user, _, password = creds.partition(":")
        userinfo = {"user": unquote(user), "password": unquote(password)}
    if not netloc:
        raise UnsupportedBackend(f"no etcd host in {url!r}; expected etcd://host:port/prefix")
    endpoints = _parse_hosts(netloc, url)

    path = unquote(parts.path).rstrip("/")
    if not path:
        path = DEFAULT_PREFIX
    if "\x00" in path:
        raise InvalidArgument("etcd prefix must not contain NUL")

    merged: dict[str, object] = {**userinfo, **options}
    timeouts = {
        name: _positive_seconds(name, merged[name]) for name in _FLOAT_OPTIONS if name in merged
    }
    text = {name: _text(name, merged.get(name)) for name in _TEXT_OPTIONS}
    if (text["user"] is None) != (text["password"] is None):
        raise InvalidArgument("etcd options user and password must be given together")
    if (text["cert_key"] is None) != (text["cert_cert"] is None):
        raise InvalidArgument("etcd options cert_key and cert_cert must be given together")
    if text["cert_key"] is not None and text["ca_cert"] is None:
        raise InvalidArgument("etcd client certificates (cert_key/cert_cert) need ca_cert")
    return EtcdConfig(
        endpoints=endpoints,
        prefix=path.encode("utf-8"),
        timeout_s=timeouts.get("timeout_s", DEFAULT_TIMEOUT_S),
        connect_timeout_s=timeouts.get("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S),
        user=text["user"],
        password=text["password"],
        ca_cert=text["ca_cert"],
        cert_key=text["cert_key"],
        cert_cert=text["cert_cert"],
    )
