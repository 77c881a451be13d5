"""The store URL and its options: parsed and checked once, before any connection.

See the option table in :mod:`consensus_lease.backends.zookeeper`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry
from kazoo.security import ACL, CREATOR_ALL_ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE

from ...errors import InvalidArgument, UnsupportedBackend
from ...options import Option, OptionTable
from ._transport_kazoo import PollHandler

__all__ = ["DEFAULT_PORT", "OPTIONS", "ZkConfig", "parse_url"]

DEFAULT_PORT = 2181
SCHEMES = ("zk", "zookeeper")
ACL_MODES = ("open", "creator", "creator_world_read")
JOBS_NODE = "jobs"
"""The znode under the chroot whose children are the job znodes."""
QUEUES_NODE = "queues"
"""The znode under the chroot whose children are the work queues."""
EPOCH_NODE = "epoch"
"""The znode under the chroot holding the store epoch (see ``_layout``)."""
IDENTITY_NODE = "identity"
"""The znode under the chroot holding the store's identity (see ``_tokens_history``)."""
ELECTIONS_NODE = "elections"
"""The znode under the chroot whose children are the elections' znodes (see ``_layout``)."""

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_RESULT_BYTES = 1_000_000
DEFAULT_STORE_MAX_JOBS = 30_000  # see ._queues_capacity (heap measured per job)
DEFAULT_STORE_MAX_BYTES = 16 * 1024 * 1024

OPTIONS = OptionTable(
    "ZooKeeper",
    [
        Option("user", "str", None, "digest user name (with password)"),
        Option("password", "str", None, "digest password (with user)", secret=True),
        Option("acl", "str", None, "ACL of created znodes (default: creator with a user)",
               choices=ACL_MODES),
        Option("tls", "bool", False, "TLS to the client port (default: on with a TLS file)"),
        Option("ca_file", "path", None, "CA bundle file to verify the servers"),
        Option("cert_file", "path", None, "client certificate file"),
        Option("key_file", "path", None, "client key file"),
        Option("key_file_password", "str", None, "password of key_file", secret=True),
        Option("verify_certs", "bool", True, "verify the server certificate"),
        Option("check_hostname", "bool", False, "check the certificate's host name"),
        Option("connect_timeout_s", "seconds", DEFAULT_CONNECT_TIMEOUT_S,
               "time to open a session"),
        Option("timeout_s", "seconds", DEFAULT_TIMEOUT_S,
               "time to wait for an answer or for a lost connection to come back"),
        Option("max_result_bytes", "int", DEFAULT_MAX_RESULT_BYTES,
               "largest completion result (and leader value), bytes", minimum=0),
        Option("store_max_jobs", "int", DEFAULT_STORE_MAX_JOBS,
               "most jobs in the whole store (every queue and named job)", minimum=1,
               maximum=2**31 - 1),  # the server's numChildren is a 32-bit int
        Option("store_max_bytes", "int", DEFAULT_STORE_MAX_BYTES,
               "most payload bytes in every queue of the store together", minimum=1),
    ],
)
"""The options of ``zk://`` URLs (see the package docstring)."""

_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
_IPV6 = re.compile(r"^[0-9A-Fa-f:.]+$")
# Characters ZooKeeper refuses in a path (PathUtils.validatePath), and control characters.
_BAD_PATH_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff]")


@dataclass(frozen=True, slots=True)
class ZkConfig:
    """Everything a :class:`~consensus_lease.backends.zookeeper.ZooKeeperBackend` needs
    to build its kazoo clients. Times in seconds."""

    hosts: tuple[tuple[str, int], ...]
    chroot: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    acl: str = "open"
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_file_password: str | None = field(default=None, repr=False)
    verify_certs: bool = True
    check_hostname: bool = False
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    store_max_jobs: int = DEFAULT_STORE_MAX_JOBS
    store_max_bytes: int = DEFAULT_STORE_MAX_BYTES

    @property
    def hosts_text(self) -> str:
        """``host:port,host:port`` as kazoo wants it (IPv6 in brackets)."""
        return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)

    @property
    def base(self) -> str:
        """Absolute path of the znode whose children are the jobs."""
        return f"{self.chroot}/{JOBS_NODE}"

    @property
    def elections_base(self) -> str:
        """Absolute path of the znode whose children are the elections (made by the
        first claim of an election)."""
        return f"{self.chroot}/{ELECTIONS_NODE}"

    @property
    def queues_base(self) -> str:
        """Absolute path of the znode whose children are the work queues."""
        return f"{self.chroot}/{QUEUES_NODE}"

    @property
    def epoch_node(self) -> str:
        """Absolute path of the znode holding the store epoch."""
        return f"{self.chroot}/{EPOCH_NODE}"

    @property
    def regressed_node(self) -> str:
        """Absolute path of the regression marker (see ``_tokens_history``): the store epoch
        when a backend noticed the store's history went back, and why."""
        return f"{self.chroot}/regressed"

    @property
    def identity_node(self) -> str:
        """Absolute path of the znode holding the store's identity."""
        return f"{self.chroot}/{IDENTITY_NODE}"

    def acl_list(self) -> list[ACL]:
        if self.acl == "creator":
            return list(CREATOR_ALL_ACL)
        if self.acl == "creator_world_read":
            return list(CREATOR_ALL_ACL) + list(READ_ACL_UNSAFE)
        return list(OPEN_ACL_UNSAFE)

    def new_client(
        self,
        session_timeout_s: float,
        *,
        client_id: tuple[int, bytes] | None = None,
        logger: Any = None,
        handler: Any = None,
    ) -> KazooClient:
        """A kazoo client (not started) for these hosts, credentials and TLS settings.

        Reconnection is retried forever with a short back-off capped at a quarter of
        the session timeout (kazoo's default cap is an hour), so a client whose member
        died reaches another member before its session can expire. Its handler is
        :class:`._transport_kazoo.PollHandler` (kazoo's, with a cheaper wait on its sockets),
        or ``handler`` (one shared by the store's session clients). Reconnection sleeps
        through the handler's ``sleep_func`` (kazoo requires the retry's to be the
        handler's): the shared handler's paces the rounds while no member serves (see
        :mod:`._transport_reconnect`).
        """
        max_delay = min(1.0, max(0.05, session_timeout_s / 4))
        handler = PollHandler() if handler is None else handler
        retry = KazooRetry(
            max_tries=-1, delay=0.02, backoff=1.5, max_jitter=0.3, max_delay=max_delay,
            sleep_func=handler.sleep_func,
        )
        auth = [("digest", f"{self.user}:{self.password}")] if self.user is not None else None
        return KazooClient(
            hosts=self.hosts_text,
            timeout=session_timeout_s,
            handler=handler,
            client_id=client_id,
            default_acl=self.acl_list(),
            auth_data=auth,
            connection_retry=retry,
            logger=logger,
            use_ssl=self.tls,
            ca=self.ca_file,
            certfile=self.cert_file,
            keyfile=self.key_file,
            keyfile_password=self.key_file_password,
            verify_certs=self.verify_certs,
            check_hostname=self.check_hostname,
        )


def parse_url(url: str, options: Mapping[str, object]) -> ZkConfig:
    """Parse ``zk://host[:port][,host[:port]...][/chroot][?option=value&...]``.

    ``options`` is the query string already merged with keyword arguments (see
    :func:`consensus_lease.open_store`).

    Raises:
        UnsupportedBackend: not a zk:// or zookeeper:// URL, no host, bad host or chroot.
        InvalidArgument: an unknown or renamed option, a bad option value, a missing TLS
            file, or half-given credentials.
    """
    if not isinstance(url, str) or "://" not in url:
        raise UnsupportedBackend(f"not a ZooKeeper URL: {url!r}")
    scheme, rest = url.split("://", 1)
    if scheme.lower() not in SCHEMES:
        raise UnsupportedBackend(f"the ZooKeeper backend serves zk:// and zookeeper://: {url!r}")
    if "#" in rest:
        raise UnsupportedBackend(f"a ZooKeeper URL has no #fragment: {url!r}")
    rest = rest.split("?", 1)[0]
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        raise UnsupportedBackend(
            "give ZooKeeper credentials as options (?user=...&password=...), not in the "
            "host part of the URL"
        )
    if not netloc:
        raise UnsupportedBackend(f"no ZooKeeper host in {url!r}; expected zk://host:port/chroot")
    hosts = tuple(_parse_host(part, url) for part in netloc.split(","))
    chroot = _parse_chroot(unquote(slash + path), url)
    return _apply_options(ZkConfig(hosts=hosts, chroot=chroot), options)


def _parse_host(part: str, url: str) -> tuple[str, int]:
    part = part.strip()
    port_text = ""
    if part.startswith("["):
        host, bracket, tail = part[1:].partition("]")
        if not bracket or not _IPV6.match(host) or (tail and not tail.startswith(":")):
            raise UnsupportedBackend(f"bad IPv6 host {part!r} in {url!r}")
        port_text = tail[1:]
    else:
        host, _, port_text = part.partition(":")
        if not _HOSTNAME.match(host):
            raise UnsupportedBackend(f"bad host {part!r} in {url!r}")
    if not port_text:
        return host, DEFAULT_PORT
    if (not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5
            or not 0 < int(port_text) < 65536):
        raise UnsupportedBackend(f"bad port in {part!r} of {url!r}")
    return host, int(port_text)


def _parse_chroot(path: str, url: str) -> str:
    """``""`` (the root) or ``/a/b`` without a trailing slash."""
    segments = [s for s in path.split("/")]
    segments = segments[1:] if segments and segments[0] == "" else segments
    if segments and segments[-1] == "":
        segments.pop()
    for segment in segments:
        if segment in ("", ".", "..") or _BAD_PATH_CHARS.search(segment):
            raise UnsupportedBackend(f"bad chroot path {path!r} in {url!r}")
    if segments and segments[0] == "zookeeper":
        raise UnsupportedBackend(f"/zookeeper is reserved by ZooKeeper itself: {url!r}")
    return "".join(f"/{s}" for s in segments)


def _apply_options(config: ZkConfig, options: Mapping[str, object]) -> ZkConfig:
    parsed = OPTIONS.parse(options)
    user, password = parsed.text("user"), parsed.text("password")
    if (user is None) != (password is None):
        raise InvalidArgument("ZooKeeper options user and password go together")
    if user is not None and ":" in user:
        raise InvalidArgument("a digest user name cannot contain ':'")
    acl = parsed.text("acl") or ("creator" if user is not None else "open")
    if acl != "open" and user is None:
        raise InvalidArgument(f"acl={acl} needs digest credentials (options user and password)")
    files = {name: parsed.text(name) for name in ("ca_file", "cert_file", "key_file")}
    tls = parsed.flag("tls") if "tls" in parsed.given else any(files.values())
    return replace(
        config,
        user=user,
        password=password,
        acl=acl,
        tls=tls,
        ca_file=files["ca_file"],
        cert_file=files["cert_file"],
        key_file=files["key_file"],
        key_file_password=parsed.text("key_file_password"),
        verify_certs=parsed.flag("verify_certs"),
        check_hostname=parsed.flag("check_hostname"),
        connect_timeout_s=parsed.seconds("connect_timeout_s"),
        timeout_s=parsed.seconds("timeout_s"),
        max_result_bytes=parsed.integer("max_result_bytes"),
        store_max_jobs=parsed.integer("store_max_jobs"),
        store_max_bytes=parsed.integer("store_max_bytes"),
    )
