"""Local etcd members as subprocesses, for the etcd backend tests.

Stand-in for the containerised cluster (``etcd_cluster`` in
:mod:`consensus_lease.testing.pytest_plugin`) where only the Debian ``etcd-server`` package
is installed. Members bind their own loopback address (127.0.251.1, .2, ..., away from the
cluster kit's 127.0.k.1x/2x and the ZooKeeper helper's 127.0.250.x) on free ports, keep
their data in a temporary directory, and are always killed at teardown.

It offers the part of :class:`~consensus_lease.testing.cluster.EtcdCluster` the tests use
(``members``, ``url_with_prefix``, ``pause``/``unpause``, ``kill``/``restart``,
``leader``), so a test moves to the containers by swapping the fixture.

Raft timing is fast (heartbeat 50 ms, election timeout 500 ms), so etcd's minimum lease
TTL is 1 s and a failed leader is replaced in about a second.

The end of the module holds what the etcd test modules share: starting members for a
module's fixture (skipped when etcd is missing), pointing a store at one member, and
answers lost after (or before) a write is applied.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import pytest

from consensus_lease import LeaseStore
from consensus_lease.backends.etcd import EtcdBackend
from consensus_lease.backends.etcd._transport import Failure

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"  # Debian package etcd-client
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def available() -> str | None:
    """``None`` if local members can be started, else why not."""
    if not Path(ETCD).exists():
        return "etcd is not installed (apt-get install -y etcd-server)"
    return None


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@dataclass
class LocalMember:
    name: str
    address: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    metrics_port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    paused: bool = False

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.client_port}"

    @property
    def metrics_url(self) -> str:
        """Plain-HTTP ``/metrics`` and ``/health`` (also when clients use TLS)."""
        return f"http://{self.address}:{self.metrics_port}"

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class LocalEtcd:
    """``size`` etcd members on 127.0.251.(base+1 ...). Use as a context manager."""

    def __init__(
        self,
        size: int = 3,
        base: int = 0,
        extra_args: tuple[str, ...] = (),
        tls_dir: Path | None = None,
    ) -> None:
        """``tls_dir``: serve clients over TLS with ``ca.pem``, ``server.pem`` and
        ``server.key`` from it, requiring client certificates signed by the CA."""
        self.root = Path(tempfile.mkdtemp(prefix="consensus-lease-etcd-"))
        self.token = f"t-{id(self):x}"
        self.extra_args = extra_args
        self.tls_dir = tls_dir
        self.members = []
        for n in range(1, size + 1):
            address = f"127.0.251.{base + n}"
            self.members.append(
                LocalMember(
                    name=f"m{n}",
                    address=address,
                    client_port=_free_port(address),
                    peer_port=_free_port(address),
                    metrics_port=_free_port(address),
                    data_dir=self.root / f"m{n}",
                    log_path=self.root / f"m{n}.log",
                )
            )

    # -- addresses ------------------------------------------------------------------------
    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    @property
    def client_url(self) -> str:
        return f"etcd://{','.join(self.endpoints)}"

    def url_with_prefix(self, prefix: str) -> str:
        return f"{self.client_url}/{prefix.strip('/')}"

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{m.name}=http://{m.address}:{m.peer_port}" for m in self.members)

    def _command(self, member: LocalMember, state: str) -> list[str]:
        initial = self.initial_cluster
        scheme = "http" if self.tls_dir is None else "https"
        client = f"{scheme}://{member.address}:{member.client_port}"
        peer = f"http://{member.address}:{member.peer_port}"
        tls: list[str] = []
        if self.tls_dir is not None:
            tls = [
                "--cert-file", str(self.tls_dir / "server.pem"),
                "--key-file", str(self.tls_dir / "server.key"),
                "--trusted-ca-file", str(self.tls_dir / "ca.pem"),
                "--client-cert-auth",
            ]  # fmt: skip
        return [
            ETCD,
            "--name", member.name,
            "--data-dir", str(member.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", initial,
            "--initial-cluster-state", state,
            "--initial-cluster-token", self.token,
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
            "--listen-metrics-urls", f"http://{member.address}:{member.metrics_port}",
            *tls,
            *self.extra_args,
        ]  # fmt: skip

    def _spawn(self, member: LocalMember) -> None:
        log = member.log_path.open("ab")
        state = "existing" if member.data_dir.exists() else "new"
        member.process = subprocess.Popen(
            self._command(member, state), stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        member.paused = False

    def start(self, timeout_s: float = 60.0) -> LocalEtcd:
        for member in self.members:
            self._spawn(member)
        self.wait_ready(timeout_s)
        return self

    def _health(self, member: LocalMember) -> bool:
        try:
            url = f"http://{member.address}:{member.metrics_port}/health"
            with _HTTP.open(url, timeout=1.0) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until every running, unpaused member reports healthy (has a leader)."""
        give_up = time.monotonic() + timeout_s
        while True:
            live = [m for m in self.members if m.process is not None and not m.paused]
            for m in live:
                assert m.process is not None
                if m.process.poll() is not None:
                    raise RuntimeError(f"etcd {m.name} exited:\n{m.log_tail()}")
            if all(self._health(m) for m in live):
                return
            if time.monotonic() > give_up:
                tails = "\n".join(f"--- {m.name}\n{m.log_tail()}" for m in live)
                raise TimeoutError(f"etcd not ready within {timeout_s} s\n{tails}")
            time.sleep(0.05)  # poll interval inside a deadline loop

    def leader(self, timeout_s: float = 10.0) -> LocalMember:
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            for m in self.members:
                if m.process is None or m.paused:
                    continue
                request = urllib.request.Request(
                    f"http://{m.endpoint}/v3/maintenance/status", data=b"{}",
                    headers={"Content-Type": "application/json"},
                )
                with contextlib.suppress(OSError, ValueError, KeyError):
                    with _HTTP.open(request, timeout=1.0) as response:
                        status = json.loads(response.read())
                    if status.get("leader") and status["leader"] == status["header"]["member_id"]:
                        return m
            time.sleep(0.05)  # poll interval inside a deadline loop
        raise TimeoutError("no etcd leader")

    def _signal(self, member: LocalMember, sig: signal.Signals) -> None:
        if member.process is not None and member.process.poll() is None:
            member.process.send_signal(sig)

    def pause(self, member: LocalMember) -> None:
        """SIGSTOP: the member's sockets stay open but nothing answers."""
        self._signal(member, signal.SIGSTOP)
        member.paused = True

    def unpause(self, member: LocalMember) -> None:
        self._signal(member, signal.SIGCONT)
        member.paused = False

    def kill(self, member: LocalMember) -> None:
        if member.process is not None:
            self._signal(member, signal.SIGCONT)
            member.process.kill()
            member.process.wait(timeout=10)
            member.process = None
        member.paused = False

    def restart(self, member: LocalMember, ready_timeout_s: float = 60.0) -> None:
        self.kill(member)
        self._spawn(member)
        self.wait_ready(ready_timeout_s)

    def restore(self) -> None:
        """Thaw paused members and restart killed ones (after a fault test)."""
        for member in self.members:
            if member.paused:
                self.unpause(member)
            if member.process is None or member.process.poll() is not None:
                member.process = None
                self._spawn(member)
        self.wait_ready()

    def _etcdctl(self, *args: str) -> None:
        done = subprocess.run([ETCDCTL, *args], capture_output=True, timeout=30,
                              env={**os.environ, "ETCDCTL_API": "3"}, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {done.stderr.decode()}")

    def save_snapshot(self, member: LocalMember, path: Path) -> None:
        """``etcdctl snapshot save`` from ``member`` (plain-HTTP clients only)."""
        self._etcdctl("--endpoints", f"http://{member.endpoint}", "snapshot", "save", str(path))

    def restore_snapshot(self, path: Path, ready_timeout_s: float = 60.0) -> None:
        """Put every member back to the snapshot ``path`` (``etcdctl snapshot restore``
        with the same names, peer URLs and cluster token, so the cluster and member ids
        stay the same) and start them again: the cluster's history goes back to the
        snapshot's revision, as after restoring a backup."""
        restored = {m.name: self.root / f"{m.name}.restored" for m in self.members}
        for member in self.members:
            shutil.rmtree(restored[member.name], ignore_errors=True)
            self._etcdctl(
                "snapshot", "restore", str(path), "--name", member.name,
                "--data-dir", str(restored[member.name]),
                "--initial-cluster", self.initial_cluster,
                "--initial-cluster-token", self.token,
                "--initial-advertise-peer-urls", f"http://{member.address}:{member.peer_port}",
            )  # fmt: skip
        for member in self.members:
            self.kill(member)
        for member in self.members:
            shutil.rmtree(member.data_dir, ignore_errors=True)
            restored[member.name].rename(member.data_dir)
            self._spawn(member)
        self.wait_ready(ready_timeout_s)

    def stop(self) -> None:
        for member in self.members:
            with contextlib.suppress(Exception):
                self.kill(member)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# -- what the etcd backend test modules share ---------------------------------------------------


def require_local_etcd(etcdctl: bool = False) -> None:
    """Skip the test when local members cannot be started (or, with ``etcdctl``, etcdctl
    is missing); fail instead under ``CI=true``."""
    reason = available()
    if reason is None and etcdctl and not Path(ETCDCTL).exists():
        reason = "etcdctl is not installed (apt-get install -y etcd-client)"
    if reason is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason)
        pytest.skip(reason)


def local_members(size: int, base: int, extra_args: tuple[str, ...] = ()) -> Iterator[LocalEtcd]:
    """For a module's fixture (``yield from local_members(...)``): ``size`` members on
    127.0.251.(base+1 ...), each started with ``extra_args`` (more ``etcd`` flags, e.g.
    ``("--max-txn-ops", "16")``), stopped at teardown; see :func:`require_local_etcd`."""
    require_local_etcd()
    with LocalEtcd(size=size, base=base, extra_args=extra_args) as cluster:
        yield cluster


def backend_of(store: LeaseStore) -> EtcdBackend:
    assert isinstance(store.backend, EtcdBackend)
    return store.backend


def use_member(store: LeaseStore, endpoint: str) -> None:
    """Point the store's transport at the member ``endpoint`` (``host:port``), so a fault
    hits the member in use."""
    transport = backend_of(store)._transport
    transport._current = [m.target for m in transport.members].index(endpoint)


def lose_answers(store: LeaseStore, monkeypatch: pytest.MonkeyPatch, *, applied: bool,
                 times: int = 1) -> list[str]:
    """Make the next ``times`` writes fail as if the answer was lost: after being applied
    (``applied=True``) or before reaching etcd. Returns a log of what was dropped."""
    transport = backend_of(store)._transport
    real = transport.send
    dropped: list[str] = []

    def send(*args: Any, **kwargs: Any) -> Any:
        if len(dropped) < times:
            if applied:
                real(*args, **kwargs)
            dropped.append(str(kwargs.get("what")))
            raise Failure("injected", grpc.StatusCode.DEADLINE_EXCEEDED, "answer lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(transport, "send", send)
    return dropped


class Sent:
    """Every request the store's transport makes: ``writes`` (sent once, settled by
    reading back; by what they do) and ``attempts`` (every attempt, reads included, by
    method). ``monkeypatch`` undoes it at the test's end."""

    def __init__(self, store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> None:
        transport = backend_of(store)._transport
        self.writes: list[str] = []
        self.attempts: list[str] = []
        send, attempt = transport.send, transport.attempt

        def counting_send(*args: Any, **kwargs: Any) -> Any:
            self.writes.append(str(kwargs.get("what")))
            return send(*args, **kwargs)

        def counting_attempt(stub: str, method: str, request: Any, timeout_s: float) -> Any:
            self.attempts.append(method)
            return attempt(stub, method, request, timeout_s)

        monkeypatch.setattr(transport, "send", counting_send)
        monkeypatch.setattr(transport, "attempt", counting_attempt)

    def clear(self) -> None:
        self.writes.clear()
        self.attempts.clear()
