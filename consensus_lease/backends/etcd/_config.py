"""Parse an ``etcd://`` URL and its options into an :class:`EtcdConfig`.

The option table (names, defaults, meaning) lives in the package docstring,
:mod:`consensus_lease.backends.etcd`; keep the two in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from ...errors import InvalidArgument, UnsupportedBackend
from ...options import Option, OptionTable

__all__ = ["DEFAULT_PREFIX", "OPTIONS", "EtcdConfig", "parse_url"]

DEFAULT_PORT = 2379
DEFAULT_PREFIX = "/consensus_lease"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0

OPTIONS = OptionTable(
    "etcd",
    [
        Option("timeout_s", "seconds", DEFAULT_TIMEOUT_S, "deadline of one gRPC request"),
        Option("connect_timeout_s", "seconds", DEFAULT_CONNECT_TIMEOUT_S,
               "how long to keep trying members before giving up"),
        Option("user", "str", None, "etcd RBAC user (with password)"),
        Option("password", "str", None, "etcd RBAC password (with user)", secret=True),
        Option("ca_file", "path", None, "PEM CA file: use TLS"),
        Option("cert_file", "path", None, "PEM client certificate (with key_file)"),
        Option("key_file", "path", None, "PEM client key (with cert_file)"),
    ],
)
"""The options of ``etcd://`` URLs (see the package docstring)."""


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
        ca_file / cert_file / key_file: PEM file paths for TLS, or ``None``.
    """

    endpoints: tuple[str, ...]
    prefix: bytes
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def tls(self) -> bool:
        return self.ca_file is not None

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
        elif (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5
              and 0 < int(port_text) < 65536):
            port = int(port_text)
        else:
            raise UnsupportedBackend(f"bad port {port_text!r} in {url!r}")
        if not host or host == "[]":
            raise UnsupportedBackend(f"empty host in {url!r}")
        hosts.append(f"{host}:{port}")
    return tuple(hosts)


def parse_url(url: str, options: Mapping[str, object]) -> EtcdConfig:
    """Build the config from ``etcd://[user:password@]h1:p1,h2:p2/prefix`` and options
    (already merged: query string and keyword arguments, keyword arguments win; see
    :func:`consensus_lease.options.merge_options`). Options override credentials given
    in the URL.

    Raises:
        UnsupportedBackend: malformed URL (no host, bad port).
        InvalidArgument: unknown or renamed option, bad value, missing TLS file, or
            half-given credentials/certificates.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "etcd":
        raise UnsupportedBackend(f"not an etcd:// URL: {url!r}")
    netloc = parts.netloc
    userinfo: dict[str, str] = {}
    if "@" in netloc:
        creds, _, netloc = netloc.rpartition("@")
        url_user, _, url_password = creds.partition(":")
        userinfo = {"user": unquote(url_user), "password": unquote(url_password)}
    if not netloc:
        raise UnsupportedBackend(f"no etcd host in {url!r}; expected etcd://host:port/prefix")
    endpoints = _parse_hosts(netloc, url)

    path = unquote(parts.path).rstrip("/")
    if not path:
        path = DEFAULT_PREFIX
    if "\x00" in path:
        raise InvalidArgument("etcd prefix must not contain NUL")

    parsed = OPTIONS.parse({**userinfo, **options})
    user, password = parsed.text("user"), parsed.text("password")
    ca_file, cert_file, key_file = (parsed.text(n) for n in ("ca_file", "cert_file", "key_file"))
    if (user is None) != (password is None):
        raise InvalidArgument("etcd options user and password must be given together")
    if (cert_file is None) != (key_file is None):
        raise InvalidArgument("etcd options cert_file and key_file must be given together")
    if cert_file is not None and ca_file is None:
        raise InvalidArgument("etcd client certificates (cert_file/key_file) need ca_file")
    return EtcdConfig(
        endpoints=endpoints,
        prefix=path.encode("utf-8"),
        timeout_s=parsed.seconds("timeout_s"),
        connect_timeout_s=parsed.seconds("connect_timeout_s"),
        user=user,
        password=password,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
    )
