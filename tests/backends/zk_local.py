"""Where the ZooKeeper backend tests find a server: the ``zk_target`` and ``zk_url``
fixtures, and a local standalone ZooKeeper started as a subprocess; and what the test
modules share: the ``store``, ``backend`` and ``opened`` fixtures, raw kazoo clients and a
transaction whose answer is lost.

Every ZooKeeper test runs on the containerised 3-member ensemble of the pytest plugin
(``zookeeper_cluster``) unless ``CONSENSUS_LEASE_ZK=local`` asks for the local server
(one line: the default in :func:`zk_target`). Test modules import the fixtures they use.

Stand-in for the containerised ensemble (``zookeeper_cluster`` in
:mod:`consensus_lease.testing.pytest_plugin`) on machines where only the Debian
``zookeeper`` and ``openjdk-17-jre-headless`` packages are installed. The server binds one
loopback address (127.0.250.x, far from the cluster kit's 127.0.k.1x/2x) on a free port,
keeps its data in a temporary directory, and is always killed at teardown.

Fault helpers: :meth:`LocalZooKeeper.pause` / :meth:`resume` (SIGSTOP / SIGCONT: clients
see silence, as with ``docker pause``) and :meth:`stop` / :meth:`start` (the port closes,
the data survives, so sessions whose timeout has not passed can resume after a restart).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss

from consensus_lease import LeaseStore, open_store
from consensus_lease.backends.zookeeper import ZooKeeperBackend
from consensus_lease.backends.zookeeper._sessions import ZkSession
from consensus_lease.errors import BackendUnavailable
from consensus_lease.session import Session

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ZOOKEEPER_CONF_DIR = Path("/etc/zookeeper/conf")
NETTY_CODEC_JAR = Path("/usr/share/java/netty-codec.jar")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
MULTI_TYPE = 14
"""ZooKeeper's request type of a multi (kazoo's ``Transaction.type``)."""


def available() -> str | None:
    """``None`` if a local server can be started, else why not."""
    if shutil.which("java") is None:
        return "java is not installed (apt-get install -y openjdk-17-jre-headless)"
    if not ZOOKEEPER_JAR.exists():
        return f"{ZOOKEEPER_JAR} is missing (apt-get install -y zookeeper)"
    return None


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


def four_letter_word(address: str, port: int, word: str, timeout_s: float = 1.0) -> str:
    with socket.create_connection((address, port), timeout=timeout_s) as sock:
        sock.sendall(word.encode())
        chunks = []
        while True:
            data = sock.recv(4096)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


class LocalZooKeeper:
    """One standalone ZooKeeper 3.8 server on a loopback address.

    Args:
        address: a 127.x.y.z address to bind (never anything else).
        tick_ms: tickTime; sessions are clamped to 2-20 x tick unless maxSessionTimeout
            is raised (it is: 60 s, like the cluster kit).
    """

    def __init__(self, address: str = "127.0.250.1", tick_ms: int = 200, tls: bool = False) -> None:
        if not address.startswith("127."):
            raise ValueError(f"tests only bind loopback addresses, not {address!r}")
        self.address = address
        self.tick_ms = tick_ms
        self.port = _free_port(address)
        self.dir = Path(tempfile.mkdtemp(prefix="consensus-lease-zk-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.tls_port: int | None = None
        (self.dir / "data").mkdir()
        config = {
            "tickTime": str(tick_ms),
            "initLimit": "10",
            "syncLimit": "5",
            "dataDir": str(self.dir / "data"),
            "clientPort": str(self.port),
            "clientPortAddress": address,
            "admin.enableServer": "false",
            "maxClientCnxns": "0",
            "maxSessionTimeout": "60000",
            "4lw.commands.whitelist": "ruok,srvr,cons",
        }
        if tls:
            self.tls_port = _free_port(address)
            config.update(self._tls_config())
        self.config_path = self.dir / "zoo.cfg"
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))

    def _tls_config(self) -> dict[str, str]:
        """A throw-away CA, a server certificate for the address, a client certificate
        (``ca.pem``, ``client.crt``, ``client.key`` in :attr:`dir`); client certs required."""
        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=self.dir, check=True, capture_output=True)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                "-out", "ca.pem", "-days", "2", "-subj", "/CN=consensus-lease-test-ca")
        for name, subject in (("server", self.address), ("client", "client")):
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                    "-out", f"{name}.csr", "-subj", f"/CN={subject}")
            (self.dir / f"{name}.ext").write_text(f"subjectAltName=IP:{self.address}\n")
            openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
                    "-extfile", f"{name}.ext")
        pem = (self.dir / "server.key").read_text() + (self.dir / "server.crt").read_text()
        (self.dir / "server.pem").write_text(pem)
        return {
            "secureClientPort": str(self.tls_port),
            "secureClientPortAddress": self.address,
            "serverCnxnFactory": "org.apache.zookeeper.server.NettyServerCnxnFactory",
            "ssl.keyStore.location": str(self.dir / "server.pem"),
            "ssl.keyStore.type": "PEM",
            "ssl.trustStore.location": str(self.dir / "ca.pem"),
            "ssl.trustStore.type": "PEM",
            "ssl.clientAuth": "need",
        }

    @property
    def tls_endpoint(self) -> str:
        assert self.tls_port is not None, "started without tls=True"
        return f"{self.address}:{self.tls_port}"

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    def url(self, chroot: str) -> str:
        return f"zk://{self.endpoint}/{chroot.strip('/')}"

    def start(self, timeout_s: float = 60.0) -> LocalZooKeeper:
        """Start the server (again) and wait until it answers ``ruok``."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        log = (self.dir / "server.log").open("ab")
        try:
            self.proc = subprocess.Popen(
                [
                    "java", "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    # netty-codec is missing from the Debian jar's manifest class path;
                    # the Netty connection factory (TLS) needs it.
                    "-cp", f"{ZOOKEEPER_CONF_DIR}:{ZOOKEEPER_JAR}:{NETTY_CODEC_JAR}",
                    MAIN_CLASS, str(self.config_path),
                ],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        give_up = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError):
                if four_letter_word(self.address, self.port, "ruok", 0.5) == "imok":
                    return self
            if time.monotonic() >= give_up:
                self.kill()
                raise TimeoutError(f"ZooKeeper not ready within {timeout_s} s: {self.log_tail()}")
            time.sleep(0.05)  # poll interval inside a deadline loop

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = (self.dir / "server.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError("the ZooKeeper server is not running")
        os.killpg(self.proc.pid, sig)

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing answers."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Kill the server process (its data directory stays for :meth:`start`)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        """Stop the server and remove its data directory."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalZooKeeper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


# -- the fixtures ------------------------------------------------------------------------


class ZkTarget(Protocol):
    """What the tests need from wherever ZooKeeper runs."""

    tick_ms: int

    def url(self, chroot: str) -> str: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def stop(self) -> None: ...
    def start(self) -> object: ...


class _ClusterTarget:
    """Adapter: the container ensemble, every member at once."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.tick_ms = int(cluster.config["tickTime"])

    def url(self, chroot: str) -> str:
        return str(self.cluster.url_with_prefix(chroot))

    def pause(self) -> None:
        for member in self.cluster.members:
            self.cluster.pause(member)

    def resume(self) -> None:
        for member in self.cluster.members:
            self.cluster.unpause(member)

    def stop(self) -> None:
        for member in self.cluster.members:
            self.cluster.kill(member)

    def start(self) -> object:
        for member in self.cluster.members:  # none can serve alone: wait for all at the end
            self.cluster.restart(member, ready_timeout_s=None)
        return self.cluster.wait_ready()


@pytest.fixture(scope="session")
def zk_target(request: pytest.FixtureRequest) -> Iterator[ZkTarget]:
    """The container ensemble (default: the backend is proven on a real 3-member
    ensemble), or a local standalone server when ``CONSENSUS_LEASE_ZK=local`` and one can
    be started (quicker while developing). Without an engine the plugin skips, or fails
    under ``CI=true``."""
    if os.environ.get("CONSENSUS_LEASE_ZK", "cluster") != "local" or available() is not None:
        yield _ClusterTarget(request.getfixturevalue("zookeeper_cluster"))
        return
    with LocalZooKeeper(tick_ms=200) as server:
        yield server


@pytest.fixture
def zk_url(zk_target: ZkTarget, key_prefix: str) -> str:
    """A zk:// URL on a chroot no other test uses."""
    return zk_target.url(key_prefix)


# -- what the ZooKeeper backend test modules share ------------------------------------------
# Import the fixtures you use (``store``, ``backend``, ``opened`` and ``session_ttl_s``,
# which ``opened`` needs) next to ``zk_target`` and ``zk_url``.


@pytest.fixture
def store(zk_url: str) -> Iterator[LeaseStore]:
    """A store on a fresh chroot; closed after the test."""
    store = open_store(zk_url, connect_timeout_s=30)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def backend(store: LeaseStore) -> ZooKeeperBackend:
    """The ``store``'s backend."""
    return backend_of(store)


@pytest.fixture
def session_ttl_s() -> float:
    """The TTL, in seconds, of the sessions ``opened`` opens unless told otherwise; a test
    module overrides it by defining a fixture of the same name."""
    return 10.0


@pytest.fixture
def opened(store: LeaseStore, session_ttl_s: float) -> Iterator[Callable[..., Session]]:
    """``opened(owner, ttl_s=session_ttl_s, **options)``: a session on ``store``, closed
    after the test."""
    sessions: list[Session] = []

    def open_(owner: str, ttl_s: float = session_ttl_s, **kw: Any) -> Session:
        session = store.session(owner, ttl_s, **kw)
        sessions.append(session)
        return session

    yield open_
    for session in sessions:
        session.close()


@pytest.fixture
def raw(zk_url: str) -> Iterator[KazooClient]:
    """A plain kazoo client on the ensemble (no chroot), to look at or change znodes by
    hand. It may be connected to another member than the worker: ``sync`` before
    reading."""
    client = raw_client(zk_url)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def backend_of(store: LeaseStore) -> ZooKeeperBackend:
    assert isinstance(store.backend, ZooKeeperBackend)
    return store.backend


def handle(session: Session) -> ZkSession:
    """The session's ZooKeeper handle."""
    assert isinstance(session.handle, ZkSession)
    return session.handle


def chroot_of(url: str) -> str:
    """The chroot path of a zk:// URL, e.g. ``/t-1234``."""
    return "/" + url.split("://", 1)[1].split("/", 1)[1].split("?")[0]


def raw_client(url: str) -> KazooClient:
    """A plain kazoo client on the server of ``url`` (no chroot), for inspection; the
    caller stops and closes it."""
    client = KazooClient(hosts=url.split("://", 1)[1].split("/", 1)[0])
    client.start(timeout=30)
    return client


class LostAnswer:
    """Stands in for a kazoo transaction: sends the multi (if ``apply``) or not, then
    loses its answer (``ConnectionLoss``)."""

    def __init__(self, real: Any, apply: bool = True) -> None:
        self._real, self._apply = real, apply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def commit_async(self) -> Any:
        if self._apply:
            self._real.commit_async().get(timeout=30)
        return self

    def get(self, timeout: float | None = None) -> Any:
        raise ConnectionLoss()


def lose_next_answer(client: KazooClient, apply: bool) -> list[int]:
    """The next multi ``client`` starts loses its answer (``ConnectionLoss``), after being
    applied if ``apply``; later ones go through. Returns a list that grows by one per
    multi started (write barriers are multis too). See :func:`lose_answer`."""
    return lose_answer(client, apply)


def lose_next_multi(client: KazooClient, apply: bool) -> list[int]:
    """The next multi of more than one operation ``client`` commits loses its answer
    (after being applied if ``apply``); write barriers (one ``check``) and later multis go
    through. Returns a list that grows by one per such multi committed."""
    return lose_answer(client, apply, counts=lambda request: len(multi_op_types(request)) > 1)


@contextlib.contextmanager
def reading_back_fails(backend: ZooKeeperBackend) -> Iterator[None]:
    """Inside, every read made to settle a lost answer ("reading back") fails with
    ``BackendUnavailable``; other reads go through."""
    wire = backend._wire
    real_read = wire.read

    def failing(*args: Any, **kwargs: Any) -> Any:
        if "reading back" in args[3]:
            raise BackendUnavailable("reading back fails in this test")
        return real_read(*args, **kwargs)

    wire.read = failing  # type: ignore[method-assign]
    try:
        yield
    finally:
        wire.read = real_read  # type: ignore[method-assign]


def multi_op_types(request: Any) -> list[int]:
    """The operation types of a multi request: kazoo's ``Transaction`` or the backend's
    (``_transport_multi.Transaction``, which packs its operations as they are added)."""
    op_types = getattr(request, "op_types", None)
    if op_types is not None:
        return list(op_types)
    return [op.type for op in request.operations]


def lose_answer(
    client: KazooClient, apply: bool, *, nth: int = 1,
    counts: Callable[[Any], bool] = lambda request: True,
) -> list[int]:
    """The ``nth`` multi (from 1) ``client`` starts of those ``counts(request)`` is true
    for loses its answer (``ConnectionLoss``), after being applied if ``apply``; every
    other request goes through. Returns a list that grows by one per multi counted.
    Hooks ``KazooClient._call``, which every request goes through: kazoo's transactions
    and the backend's own (``_transport_multi.Transaction``) alike."""
    real = client._call
    calls: list[int] = []

    def call(request: Any, async_object: Any) -> Any:
        if request.type != MULTI_TYPE or not counts(request):
            return real(request, async_object)
        calls.append(1)
        if len(calls) != nth:
            return real(request, async_object)
        if apply:
            applied = client.handler.async_result()
            real(request, applied)
            applied.get(timeout=30)
        async_object.set_exception(ConnectionLoss())
        return True

    client._call = call
    return calls
