"""What every kit cluster shares: members, loopback slots, containers and faults.

Layout: a cluster occupies a *slot* k (claimed with a lock file, so clusters
of several processes never clash); member n (1-based) binds 127.0.k.(B+n)
with B = 10 for etcd and 20 for ZooKeeper, and runs with gid
4300 + 100*k + B + n. Every member is one testcontainers ``DockerContainer``
with host networking and ``--user 0:GID``; its data lives in the container, so
it survives :meth:`Cluster.restart`. Images come from ``consensus-lease kit
build-images`` (recipes in :mod:`consensus_lease.testing.images`; names overridable,
see :mod:`consensus_lease.testing.engine`), or, in the *upstream* image style, are the
published etcd and official ``zookeeper`` images (or images following their
conventions).

Faults need nothing inside the images: pause, kill and restart go through the engine,
and partitions are iptables rules on the host matching each member's gid. That last
part holds only while the member's server process keeps the gid the kit gave it
(``--user UID:GID``); :attr:`Cluster.capabilities` says, after :meth:`Cluster.start`
checked the processes, which faults work, and a fault that does not raises
:class:`FaultUnsupported` instead of silently doing nothing.

A subclass per store (:mod:`consensus_lease.testing.etcd_cluster`,
:mod:`consensus_lease.testing.zookeeper_cluster`) supplies the server's command
line and how to read, from outside the containers over loopback, whether a
member serves and whether it leads. Every wait has a deadline and raises
:class:`ClusterTimeout` with the members' log tails when it passes.
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self

from consensus_lease.testing import engine
from consensus_lease.testing._containers import (
    CLUSTER_LABEL,
    KIT_LABEL,
    OWNER_LABEL,
    docker_client,
    docker_module,
    reap_stale,
)
from consensus_lease.testing.faults import Cut, Firewall, make_tag

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

__all__ = [
    "GID_BASE",
    "MAX_SLOTS",
    "PROBE_TIMEOUT_S",
    "Cluster",
    "ClusterError",
    "ClusterTimeout",
    "FaultUnsupported",
    "KitCapabilities",
    "Member",
    "MemberState",
]

GID_BASE = 4300
MAX_SLOTS = 64
PROBE_TIMEOUT_S = 1.0  # one readiness or leadership probe of one member
_POLL_S = 0.1


class ClusterError(RuntimeError):
    """A member could not be started, changed or removed."""


class ClusterTimeout(ClusterError, TimeoutError):
    """A bounded wait (readiness, leader) passed its deadline."""


class FaultUnsupported(ClusterError):
    """The fault cannot be injected with this cluster's images (see
    :attr:`Cluster.capabilities`); nothing was changed."""


@dataclass(frozen=True)
class KitCapabilities:
    """Which faults a started cluster can inject, and why not where it cannot.

    Attributes:
        pause, kill, restart: through the engine; work with any image.
        cut_client: :meth:`Cluster.cut_client`; matches the *client's* gid, so it works
            with any image.
        member_partitions: :meth:`Cluster.partition` and :meth:`Cluster.isolate`; they
            match each member's gid, so they need every member's server process to run
            with the gid the kit gave it.
        reasons: for each fault that does not work, why.
    """

    pause: bool = True
    kill: bool = True
    restart: bool = True
    cut_client: bool = True
    member_partitions: bool = True
    reasons: dict[str, str] = field(default_factory=dict)


def _process_gids(pid: int) -> tuple[int, ...] | None:
    """(real, effective, saved, filesystem) gid of host process ``pid``, or None."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("Gid:"):
            return tuple(int(part) for part in line.split()[1:])
    return None


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


class Cluster:
    """Members of one etcd cluster or ZooKeeper ensemble; subclasses fill in the server.

    Args:
        slot: address block to use (see module docstring); ``None`` takes the
            first free one from 0.
        size: number of members (odd; 3 by default).
        image: image name; default from :mod:`consensus_lease.testing.engine` for the
            image style.
        image_style: ``"kit"`` (our images, the default) or ``"upstream"`` (images
            following the published etcd / official ``zookeeper`` images' conventions);
            ``None`` reads ``$CONSENSUS_LEASE_IMAGE_STYLE``.

    Raises:
        ValueError: unknown image style.
    """

    kind: ClassVar[str]
    scheme: ClassVar[str]
    host_base: ClassVar[int]
    client_port: ClassVar[int]
    peer_ports: ClassVar[tuple[int, ...]]

    def __init__(
        self,
        *,
        slot: int | None = None,
        size: int = 3,
        image: str | None = None,
        image_style: str | None = None,
    ):
        self.image_style = engine.image_style(image_style)
        self.image = image or self._default_image()
        self.size = size
        self.slot = slot
        self.name = f"{self.kind}-s{slot}" if slot is not None else self.kind
        self.members: list[Member] = []
        self.ready_after_s: float | None = None  # start() to all members serving
        self.capabilities = KitCapabilities()
        self._lock: _SlotLock | None = None
        self._firewall = Firewall(make_tag(self.name))

    # -- subclass hooks ----------------------------------------------------------------
    def _default_image(self) -> str:
        raise NotImplementedError

    def _command(self, member: Member) -> list[str] | None:
        """The container's command (None: the image's own)."""
        raise NotImplementedError

    def _env(self, member: Member) -> dict[str, str]:
        return {}

    def _user(self, member: Member) -> str:
        """``--user`` of the member's container: it must give the server the member's gid."""
        return f"0:{member.gid}"

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
            self.capabilities = self._check_capabilities()
        except BaseException as exc:
            try:
                self.stop()
            except Exception as cleanup_exc:
                exc.add_note(f"cleanup after the failed start also failed: {cleanup_exc!r}")
            raise
        return self

    def _check_capabilities(self) -> KitCapabilities:
        """Which faults work: member partitions need each server process on its own gid."""
        wrong = []
        for member in self.members:
            container = member.docker()
            container.reload()
            gids = _process_gids(int(container.attrs.get("State", {}).get("Pid") or 0))
            if gids is None or len(gids) < 4 or {gids[1], gids[3]} != {member.gid}:
                wrong.append(f"{member.name} runs with gids {gids}, not {member.gid}")
        if not wrong:
            return KitCapabilities()
        reason = (
            f"image {self.image} does not keep the gid given by --user "
            f"({'; '.join(wrong)}): iptables rules on member gids cannot tell members apart"
        )
        return KitCapabilities(member_partitions=False, reasons={"member_partitions": reason})

    def _require(self, capability: str) -> None:
        if not getattr(self.capabilities, capability):
            raise FaultUnsupported(
                f"{self.name}: {capability} not supported: "
                + self.capabilities.reasons.get(capability, "")
            )

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
        command = self._command(member)
        if command is not None:
            container.with_command(command)
        for key, value in self._env(member).items():
            container.with_env(key, value)
        return container.with_kwargs(
            network=None,  # stops testcontainers from choosing a network
            network_mode="host",
            user=self._user(member),
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
        not_found = docker_module("docker.errors").NotFound
        labels = [f"{OWNER_LABEL}={os.getpid()}", f"{CLUSTER_LABEL}={self.name}"]
        try:
            client = docker_client()
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
        """Cut the link between two members both ways, until the returned cut heals.

        Raises:
            FaultUnsupported: the images do not keep member gids (see :attr:`capabilities`).
        """
        self._require("member_partitions")
        return self._firewall.cut([(a.gid, b.address), (b.gid, a.address)])

    def isolate(self, member: Member) -> Cut:
        """Cut ``member`` from every other member. Clients can still reach it:
        use :meth:`cut_client` for those.

        Raises:
            FaultUnsupported: the images do not keep member gids (see :attr:`capabilities`).
        """
        self._require("member_partitions")
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
