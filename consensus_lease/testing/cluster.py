"""Real 3-member etcd clusters and ZooKeeper ensembles in containers, with faults.

::

    with EtcdCluster() as cluster:                # members on 127.0.0.11-13:2379
        store = open_store(cluster.url_with_prefix("t1"))
        cluster.kill(cluster.leader())
        with cluster.isolate(cluster.members[0]):   # iptables, healed on exit
            ...

Layout: a cluster occupies a *slot* k (claimed with a lock file, so clusters
of several processes never clash); member n (1-based) binds 127.0.k.(B+n)
with B = 10 for etcd and 20 for ZooKeeper, and runs with gid
4300 + 100*k + B + n. Every member is one testcontainers ``DockerContainer``
with host networking and ``--user 0:GID``; its data lives in the container, so
it survives :meth:`Cluster.restart`. Images come from ``docker/build-images.sh``
(names overridable, see :mod:`consensus_lease.testing.engine`).

Readiness and leadership are read from outside the containers over loopback:
etcd's ``/health`` and ``/v3/maintenance/status`` (JSON gateway), ZooKeeper's
``srvr`` four-letter word. Every wait has a deadline and raises
:class:`ClusterTimeout` with the members' log tails when it passes.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import re
import socket
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self

from consensus_lease.testing import engine
from consensus_lease.testing.faults import (
    Cut,
    Firewall,
    make_tag,
    pid_alive,
    reap_stale_rules,
    tagged_rules,
)

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterTimeout",
    "EtcdCluster",
    "Member",
    "MemberState",
    "ZooKeeperCluster",
    "leftovers",
    "reap_stale",
]

KIT_LABEL = "org.consensus-lease.kit"
OWNER_LABEL = "org.consensus-lease.owner-pid"
CLUSTER_LABEL = "org.consensus-lease.cluster"
GID_BASE = 4300
MAX_SLOTS = 64
_PROBE_TIMEOUT_S = 1.0
_POLL_S = 0.1
# Bypass any http_proxy: every request here goes to a 127.x address.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ClusterError(RuntimeError):
    """A member could not be started, changed or removed."""


class ClusterTimeout(ClusterError, TimeoutError):
    """A bounded wait (readiness, leader) passed its deadline."""


class MemberState(Enum):
    """What the kit last did to a member (not a health probe)."""

    RUNNING = "running"
    PAUSED = "paused"
    KILLED = "killed"


@dataclass(eq=False)
class Member:
    """One member: ``name`` like ``etcd-s0-2``, ``index`` 1..size (ZooKeeper's myid)."""

    name: str
    index: int
    address: str
    client_port: int
    gid: int
    container: DockerContainer | None = None
    state: MemberState = MemberState.RUNNING

    @property
    def endpoint(self) -> str:
        """``address:client_port``."""
        return f"{self.address}:{self.client_port}"

    def docker(self) -> Any:
        """The docker-py ``Container`` (pause, kill, logs, ...)."""
        if self.container is None:
            raise ClusterError(f"{self.name} has no container")
        return self.container.get_wrapped_container()


class _SlotLock:
    """An flock on a per-slot file; the kernel drops it if the process dies."""

    def __init__(self, kind: str, slot: int) -> None:
        directory = Path(tempfile.gettempdir()) / "consensus-lease-kit"
        directory.mkdir(exist_ok=True)
        self._file = (directory / f"{kind}-slot{slot}.lock").open("a")

    def try_acquire(self) -> bool:
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            return False
        return True

    def release(self) -> None:
        self._file.close()


def _ports_free(address: str, ports: Iterable[int]) -> bool:
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError:
                return False
    return True


def _docker(module: str = "docker") -> Any:
    # Imported by name: the repository's docker/ directory shadows docker-py
    # for ruff and mypy run from the checkout.
    return importlib.import_module(module)


def _docker_client() -> Any:
    return _docker().from_env(timeout=30)


class Cluster:
    """Members of one etcd cluster or ZooKeeper ensemble; subclasses fill in the server.

    Args:
        slot: address block to use (see module docstring); ``None`` takes the
            first free one from 0.
        size: number of members (odd; 3 by default).
        image: image name; default from :mod:`consensus_lease.testing.engine`.
    """

    kind: ClassVar[str]
    scheme: ClassVar[str]
    host_base: ClassVar[int]
    client_port: ClassVar[int]
    peer_ports: ClassVar[tuple[int, ...]]

    def __init__(self, *, slot: int | None = None, size: int = 3, image: str | None = None):
        self.image = image or self._default_image()
        self.size = size
        self.slot = slot
        self.name = f"{self.kind}-s{slot}" if slot is not None else self.kind
        self.members: list[Member] = []
        self.ready_after_s: float | None = None  # start() to all members serving
        self._lock: _SlotLock | None = None
        self._firewall = Firewall(make_tag(self.name))

    # -- subclass hooks ----------------------------------------------------------------
    def _default_image(self) -> str:
        raise NotImplementedError

    def _command(self, member: Member) -> list[str]:
        raise NotImplementedError

    def _env(self, member: Member) -> dict[str, str]:
        return {}

    def _probe_ready(self, member: Member) -> tuple[bool, str]:
        """(serving?, detail) for one member, within about a second."""
        raise NotImplementedError

    def _probe_leader_term(self, member: Member) -> int | None:
        """The member's term if it claims leadership, else None."""
        raise NotImplementedError

    # -- addresses ------------------------------------------------------------------------
    def address(self, slot: int, index: int) -> str:
        return f"127.0.{slot}.{self.host_base + index}"

    @property
    def endpoints(self) -> list[str]:
        """``host:port`` of each member's client port."""
        return [m.endpoint for m in self.members]

    @property
    def client_url(self) -> str:
        """A store URL naming every member, e.g. ``etcd://127.0.0.11:2379,...``."""
        return f"{self.scheme}://{','.join(self.endpoints)}"

    def url_with_prefix(self, prefix: str) -> str:
        """:attr:`client_url` with ``/prefix`` appended (etcd key prefix, ZooKeeper chroot)."""
        return f"{self.client_url}/{prefix.strip('/')}"

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, timeout_s: float = 90.0) -> Self:
        """Claim a slot, start every member, and wait until all serve.

        Raises:
            ClusterError: no free slot, or a member exited (its log is in the message).
            ClusterTimeout: not all members served within ``timeout_s`` seconds.
        """
        started = time.monotonic()
        reap_stale()
        self.slot = self._claim_slot(self.slot)
        self.name = f"{self.kind}-s{self.slot}"
        self._firewall = Firewall(make_tag(self.name))
        self.members = [
            Member(
                name=f"{self.name}-{n}",
                index=n,
                address=self.address(self.slot, n),
                client_port=self.client_port,
                gid=GID_BASE + 100 * self.slot + self.host_base + n,
            )
            for n in range(1, self.size + 1)
        ]
        try:
            for member in self.members:
                member.container = self._new_container(member)
                member.container.start()
            self.wait_ready(timeout_s)
            self.ready_after_s = time.monotonic() - started
        except BaseException as exc:
            try:
                self.stop()
            except Exception as cleanup_exc:
                exc.add_note(f"cleanup after the failed start also failed: {cleanup_exc!r}")
            raise
        return self

    def _claim_slot(self, wanted: int | None) -> int:
        candidates = [wanted] if wanted is not None else list(range(MAX_SLOTS))
        for slot in candidates:
            lock = _SlotLock(self.kind, slot)
            if not lock.try_acquire():
                continue
            ports = (self.client_port, *self.peer_ports)
            if all(_ports_free(self.address(slot, n), ports) for n in range(1, self.size + 1)):
                self._lock = lock
                return slot
            lock.release()
        raise ClusterError(
            f"no free {self.kind} slot among {candidates}: lock held or ports in use"
        )

    def _new_container(self, member: Member) -> DockerContainer:
        from testcontainers.core.config import testcontainers_config
        from testcontainers.core.container import DockerContainer

        # Ryuk (testcontainers' reaper) cannot be pulled without a registry;
        # stop() and reap_stale() remove our containers instead.
        testcontainers_config.ryuk_disabled = True
        container = DockerContainer(self.image, name=f"clkit-{member.name}-{os.getpid()}")
        container.with_command(self._command(member))
        for key, value in self._env(member).items():
            container.with_env(key, value)
        return container.with_kwargs(
            network=None,  # stops testcontainers from choosing a network
            network_mode="host",
            user=f"0:{member.gid}",
            labels={
                KIT_LABEL: "1",
                OWNER_LABEL: str(os.getpid()),
                CLUSTER_LABEL: self.name,
            },
        )

    def stop(self) -> None:
        """Heal every partition and remove every container. Idempotent.

        Containers are found by their labels, so ones whose start failed half
        way are removed too.

        Raises:
            ExceptionGroup: some rules or containers could not be removed
                (the others were).
        """
        errors: list[Exception] = []
        try:
            self.heal_all()
        except Exception as exc:
            errors.append(exc)
        if self.members:
            errors += self._remove_containers()
        for member in self.members:
            if member.container is not None:
                member.container.get_docker_client().client.close()
                member.container = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if errors:
            raise ExceptionGroup(f"stopping {self.name}", errors)

    def _remove_containers(self) -> list[Exception]:
        errors: list[Exception] = []
        not_found = _docker("docker.errors").NotFound
        labels = [f"{OWNER_LABEL}={os.getpid()}", f"{CLUSTER_LABEL}={self.name}"]
        try:
            client = _docker_client()
            try:
                for container in client.containers.list(all=True, filters={"label": labels}):
                    try:
                        container.remove(force=True, v=True)
                    except not_found:
                        pass
                    except Exception as exc:
                        errors.append(exc)
            finally:
                client.close()
        except Exception as exc:
            errors.append(exc)
        return errors

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- health ---------------------------------------------------------------------------
    def running_members(self) -> list[Member]:
        return [m for m in self.members if m.state is MemberState.RUNNING]

    def wait_ready(self, timeout_s: float = 60.0, members: Iterable[Member] | None = None) -> float:
        """Poll until each of ``members`` (default: those not paused or killed) serves.

        Returns the seconds waited.

        Raises:
            ClusterError: a member's container exited.
            ClusterTimeout: not ready within ``timeout_s`` seconds.
        """
        started = time.monotonic()
        deadline = started + timeout_s
        pending = list(members) if members is not None else self.running_members()
        details: dict[str, str] = {}
        while True:
            still = []
            for member in pending:
                ok, details[member.name] = self._probe_ready(member)
                if not ok:
                    still.append(member)
            pending = still
            if not pending:
                return time.monotonic() - started
            for member in pending:
                self._raise_if_exited(member)
            if time.monotonic() >= deadline:
                raise ClusterTimeout(
                    f"{self.name}: not ready within {timeout_s:.0f} s: "
                    + "; ".join(f"{m.name}: {details[m.name]}" for m in pending)
                    + self._log_tails(pending)
                )
            time.sleep(_POLL_S)

    def _raise_if_exited(self, member: Member) -> None:
        container = member.docker()
        container.reload()
        if container.status in ("exited", "dead"):
            raise ClusterError(f"{member.name} exited" + self._log_tails([member]))

    def _log_tails(self, members: Iterable[Member], lines: int = 15) -> str:
        parts = []
        for member in members:
            try:
                parts.append(f"\n--- {member.name} log tail ---\n{self.logs(member, tail=lines)}")
            except Exception as exc:
                parts.append(f"\n--- {member.name}: no log ({exc!r}) ---")
        return "".join(parts)

    def leader(self, timeout_s: float = 10.0) -> Member:
        """The member that claims leadership in the highest term, polled until one does.

        A member cut off from the majority may still claim an older term for a
        moment; the highest term wins. Paused and killed members are not asked.

        Raises:
            ClusterTimeout: no running member claimed leadership within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            best: tuple[int, Member] | None = None
            for member in self.running_members():
                term = self._probe_leader_term(member)
                if term is not None and (best is None or term > best[0]):
                    best = (term, member)
            if best is not None:
                return best[1]
            if time.monotonic() >= deadline:
                raise ClusterTimeout(f"{self.name}: no leader within {timeout_s:.0f} s")
            time.sleep(_POLL_S)

    def logs(self, member: Member, tail: int | None = None) -> str:
        """The member's stdout and stderr, interleaved; the last ``tail`` lines if given."""
        raw = member.docker().logs(stdout=True, stderr=True, tail="all" if tail is None else tail)
        return bytes(raw).decode(errors="replace")

    # -- member faults --------------------------------------------------------------------
    def pause(self, member: Member) -> None:
        """Freeze the member's processes (``docker pause``); sockets stay open."""
        member.docker().pause()
        member.state = MemberState.PAUSED

    def unpause(self, member: Member) -> None:
        """Thaw a paused member."""
        member.docker().unpause()
        member.state = MemberState.RUNNING

    def kill(self, member: Member) -> None:
        """SIGKILL the member (``docker kill``); its data stays for :meth:`restart`."""
        if member.state is MemberState.PAUSED:
            self.unpause(member)
        member.docker().kill()
        member.state = MemberState.KILLED

    def restart(self, member: Member, ready_timeout_s: float | None = 60.0) -> None:
        """Start a killed member again, or ``docker restart`` a running one.

        Data survives (it lives in the container). Waits until the member serves
        unless ``ready_timeout_s`` is None.
        """
        container = member.docker()
        if member.state is MemberState.PAUSED:
            self.unpause(member)
        if member.state is MemberState.KILLED:
            container.start()
        else:
            container.restart(timeout=5)
        member.state = MemberState.RUNNING
        if ready_timeout_s is not None:
            self.wait_ready(ready_timeout_s, members=[member])

    def restore(self, timeout_s: float = 60.0) -> None:
        """Heal all partitions, thaw and start every member, and wait until all serve."""
        self.heal_all()
        for member in self.members:
            container = member.docker()
            container.reload()
            if container.status == "paused":
                container.unpause()
            elif container.status != "running":
                container.start()
            member.state = MemberState.RUNNING
        self.wait_ready(timeout_s)

    # -- network faults -------------------------------------------------------------------
    def partition(self, a: Member, b: Member) -> Cut:
        """Cut the link between two members both ways, until the returned cut heals."""
        return self._firewall.cut([(a.gid, b.address), (b.gid, a.address)])

    def isolate(self, member: Member) -> Cut:
        """Cut ``member`` from every other member. Clients can still reach it:
        use :meth:`cut_client` for those."""
        others = [m for m in self.members if m is not member]
        links = [(member.gid, o.address) for o in others] + [
            (o.gid, member.address) for o in others
        ]
        return self._firewall.cut(links)

    def cut_client(self, gid: int, member: Member | Iterable[Member] | None = None) -> Cut:
        """Drop what processes of group ``gid`` send to ``member`` (default: every member)."""
        if member is None:
            targets = self.members
        elif isinstance(member, Member):
            targets = [member]
        else:
            targets = list(member)
        return self._firewall.cut([(gid, m.address) for m in targets])

    def heal_all(self) -> None:
        """Remove every rule this cluster added."""
        self._firewall.heal_all()


class EtcdCluster(Cluster):
    """etcd 3.4 members on 127.0.k.11-13:2379 (peers :2380).

    Args:
        heartbeat_interval_ms, election_timeout_ms: raft timing; a leader's
            failure is noticed after about ``election_timeout_ms``.
        extra_args: more ``etcd`` flags for every member.
    """

    kind = "etcd"
    scheme = "etcd"
    host_base = 10
    client_port = 2379
    peer_ports = (2380,)

    def __init__(
        self,
        *,
        slot: int | None = None,
        size: int = 3,
        image: str | None = None,
        heartbeat_interval_ms: int = 100,
        election_timeout_ms: int = 1000,
        extra_args: Iterable[str] = (),
    ) -> None:
        super().__init__(slot=slot, size=size, image=image)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.election_timeout_ms = election_timeout_ms
        self.extra_args = list(extra_args)

    def _default_image(self) -> str:
        return engine.etcd_image()

    def _command(self, member: Member) -> list[str]:
        client = f"http://{member.address}:{self.client_port}"
        peer = f"http://{member.address}:{self.peer_ports[0]}"
        initial = ",".join(
            f"{m.name}=http://{m.address}:{self.peer_ports[0]}" for m in self.members
        )
        return [
            "--name", member.name,
            "--data-dir", "/var/lib/etcd-member",
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", initial,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"{self.name}-{os.getpid()}",
            "--heartbeat-interval", str(self.heartbeat_interval_ms),
            "--election-timeout", str(self.election_timeout_ms),
            "--logger", "zap",
            "--log-outputs", "stderr",
            *self.extra_args,
        ]  # fmt: skip

    def _get_json(self, member: Member, path: str, post: bool) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://{member.endpoint}{path}",
            data=b"{}" if post else None,
            headers={"Content-Type": "application/json"},
        )
        with _HTTP.open(request, timeout=_PROBE_TIMEOUT_S) as response:
            body: dict[str, Any] = json.loads(response.read())
            return body

    def _probe_ready(self, member: Member) -> tuple[bool, str]:
        try:
            body = self._get_json(member, "/health", post=False)
        except (OSError, ValueError) as exc:
            return False, repr(exc)
        return body.get("health") == "true", json.dumps(body)

    def _probe_leader_term(self, member: Member) -> int | None:
        try:
            status = self._get_json(member, "/v3/maintenance/status", post=True)
        except (OSError, ValueError):
            return None
        if status.get("leader") and status["leader"] == status["header"]["member_id"]:
            return int(status.get("raftTerm", 0))
        return None


def four_letter_word(
    address: str, port: int, word: str, timeout_s: float = _PROBE_TIMEOUT_S
) -> str:
    """Send a ZooKeeper four-letter word and return the reply (the server closes after it)."""
    deadline = time.monotonic() + timeout_s
    chunks = []
    with socket.create_connection((address, port), timeout=timeout_s) as sock:
        sock.sendall(word.encode())
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = sock.recv(4096)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperCluster(Cluster):
    """ZooKeeper 3.8 members on 127.0.k.21-23:2181 (quorum :2888, election :3888).

    Args:
        tick_ms, init_limit, sync_limit: zoo.cfg timing; a lost leader is
            noticed after about ``sync_limit * tick_ms``.
        heap_mb: JVM maximum heap per member.
        extra_config: more zoo.cfg ``key: value`` lines for every member.
    """

    kind = "zookeeper"
    scheme = "zk"
    host_base = 20
    client_port = 2181
    peer_ports = (2888, 3888)

    def __init__(
        self,
        *,
        slot: int | None = None,
        size: int = 3,
        image: str | None = None,
        tick_ms: int = 250,
        init_limit: int = 20,
        sync_limit: int = 6,
        heap_mb: int = 256,
        extra_config: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(slot=slot, size=size, image=image)
        self.config = {
            "tickTime": str(tick_ms),
            "initLimit": str(init_limit),
            "syncLimit": str(sync_limit),
            "maxSessionTimeout": "60000",
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "srvr,mntr,ruok",
            "standaloneEnabled": "false",
            "cnxTimeout": "1000",  # becomes -Dzookeeper.cnxTimeout: election connect timeout
            **(extra_config or {}),
        }
        self.heap_mb = heap_mb

    def _default_image(self) -> str:
        return engine.zookeeper_image()

    def _command(self, member: Member) -> list[str]:
        quorum, election = self.peer_ports
        lines = [f"{key}={value}" for key, value in self.config.items()]
        lines += [f"clientPortAddress={member.address}", f"clientPort={self.client_port}"]
        lines += [f"server.{m.index}={m.address}:{quorum}:{election}" for m in self.members]
        return [str(member.index), *lines]

    def _env(self, member: Member) -> dict[str, str]:
        return {"JVMFLAGS": f"-Xms32m -Xmx{self.heap_mb}m -XX:+UseSerialGC -XX:TieredStopAtLevel=1"}

    def _srvr(self, member: Member) -> str:
        return four_letter_word(member.address, member.client_port, "srvr")

    def _probe_ready(self, member: Member) -> tuple[bool, str]:
        try:
            reply = self._srvr(member)
        except OSError as exc:
            return False, repr(exc)
        mode = re.search(r"^Mode: (\w+)", reply, re.MULTILINE)
        ok = mode is not None and mode.group(1) in ("leader", "follower", "observer")
        return ok, mode.group(0) if mode else reply.strip()[:120]

    def _probe_leader_term(self, member: Member) -> int | None:
        try:
            reply = self._srvr(member)
        except OSError:
            return None
        zxid = re.search(r"^Zxid: 0x([0-9a-f]+)", reply, re.MULTILINE)
        if "Mode: leader" in reply and zxid:
            return int(zxid.group(1), 16) >> 32  # the epoch
        return None


def reap_stale() -> list[str]:
    """Remove containers and iptables rules left by kit processes that died.

    Returns what was removed. Things owned by live processes are left alone.
    """
    removed = [f"rule {line}" for line in reap_stale_rules()] if os.geteuid() == 0 else []
    client = _docker_client()
    try:
        for container in client.containers.list(all=True, filters={"label": KIT_LABEL}):
            owner = container.labels.get(OWNER_LABEL, "")
            if owner.isdigit() and not pid_alive(int(owner)):
                container.remove(force=True, v=True)
                removed.append(f"container {container.name}")
    finally:
        client.close()
    return removed


def leftovers(pid: int | None = None, cluster: str | None = None) -> list[str]:
    """Containers and iptables rules still owned by process ``pid`` (default: this one),
    optionally only those of the cluster named ``cluster`` (e.g. ``etcd-s1``)."""
    owner = os.getpid() if pid is None else pid
    found = []
    if os.geteuid() == 0:  # others cannot have added rules, nor list them
        tag = make_tag("" if cluster is None else cluster, owner)
        found += [f"rule {line}" for line in tagged_rules(tag, exact=cluster is not None)]
    labels = [f"{OWNER_LABEL}={owner}"]
    if cluster is not None:
        labels.append(f"{CLUSTER_LABEL}={cluster}")
    client = _docker_client()
    try:
        for container in client.containers.list(all=True, filters={"label": labels}):
            found.append(f"container {container.name}")
    finally:
        client.close()
    return found
