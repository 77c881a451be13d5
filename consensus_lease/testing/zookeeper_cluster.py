"""A real ZooKeeper ensemble in containers: :class:`ZooKeeperCluster`.

Readiness and leadership are read from outside the containers over loopback,
with ZooKeeper's ``srvr`` four-letter word.

Image styles: ``kit`` runs ``consensus-lease/zookeeper:3.8`` with the command
``zk-member MYID zoo.cfg-line ...``; ``upstream`` runs the official ``zookeeper``
image (default :data:`~consensus_lease.testing.engine.UPSTREAM_ZOOKEEPER_IMAGE`) with
its own entrypoint and command, configured through its environment variables:
``ZOO_MY_ID``, ``ZOO_SERVERS`` (``server.N=ADDR:2888:3888;ADDR:2181``, which also sets
each member's client address), ``ZOO_TICK_TIME``, ``ZOO_INIT_LIMIT``,
``ZOO_SYNC_LIMIT``, ``ZOO_STANDALONE_ENABLED``, ``ZOO_ADMINSERVER_ENABLED``,
``ZOO_4LW_COMMANDS_WHITELIST``, ``ZOO_MAX_CLIENT_CNXNS``, ``ZOO_CFG_EXTRA`` (every other
zoo.cfg line) and ``JVMFLAGS``. That image's entrypoint, started as root, switches to
its ``zookeeper`` user *and group*, which would lose the member's gid and with it
member partitions; the kit therefore starts it as ``--user zookeeper:GID`` (the
entrypoint then stays that user), and every fault works.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Mapping, Sequence
from typing import ClassVar

from consensus_lease.testing import engine
from consensus_lease.testing._cluster_base import (
    PROBE_TIMEOUT_S,
    Cluster,
    ClusterError,
    Member,
    MemberState,
)

__all__ = ["ZooKeeperCluster", "four_letter_word"]


def four_letter_word(
    address: str, port: int, word: str, timeout_s: float = PROBE_TIMEOUT_S
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
        heap_mb: JVM maximum heap per member, MiB (default
            :data:`~consensus_lease.testing.engine.ZOOKEEPER_HEAP_MB`, 640: what the
            store's default limits need by the rule in ``docs/capacity.md``; a test
            that wants a server to run out sooner passes a smaller one).
        extra_config: more zoo.cfg ``key: value`` lines for every member (a key
            ZooKeeper does not know becomes the system property ``zookeeper.KEY``,
            e.g. ``forceSnapshotSync: "true"``: every learner syncs by SNAP).
        jvm_flags: more JVM flags for every member, after the kit's own (e.g.
            ``-Xlog:gc:stdout`` to have each collection in the member's log).
        slot, size, image, image_style: see :class:`Cluster`.

    Raises:
        ValueError: with the upstream image style, a zoo.cfg key or value containing
            blanks (``ZOO_CFG_EXTRA`` is split on them).
    """

    kind = "zookeeper"
    scheme = "zk"
    host_base = 20
    client_port = 2181
    peer_ports = (2888, 3888)
    upstream_user: ClassVar[str] = "zookeeper"
    """The official image's user, which its entrypoint keeps when not started as root."""
    UPSTREAM_ENV: ClassVar[dict[str, str]] = {
        "tickTime": "ZOO_TICK_TIME",
        "initLimit": "ZOO_INIT_LIMIT",
        "syncLimit": "ZOO_SYNC_LIMIT",
        "standaloneEnabled": "ZOO_STANDALONE_ENABLED",
        "admin.enableServer": "ZOO_ADMINSERVER_ENABLED",
        "4lw.commands.whitelist": "ZOO_4LW_COMMANDS_WHITELIST",
        "maxClientCnxns": "ZOO_MAX_CLIENT_CNXNS",
        "autopurge.purgeInterval": "ZOO_AUTOPURGE_PURGEINTERVAL",
        "autopurge.snapRetainCount": "ZOO_AUTOPURGE_SNAPRETAINCOUNT",
    }
    """zoo.cfg keys the official image takes as variables of their own."""

    def __init__(
        self,
        *,
        slot: int | None = None,
        size: int = 3,
        image: str | None = None,
        image_style: str | None = None,
        tick_ms: int = 250,
        init_limit: int = 20,
        sync_limit: int = 6,
        heap_mb: int = engine.ZOOKEEPER_HEAP_MB,
        extra_config: Mapping[str, str] | None = None,
        jvm_flags: Sequence[str] = (),
    ) -> None:
        super().__init__(slot=slot, size=size, image=image, image_style=image_style)
        self.config = {
            "tickTime": str(tick_ms),
            "initLimit": str(init_limit),
            "syncLimit": str(sync_limit),
            "maxSessionTimeout": "60000",
            # every test client connects from 127.0.0.1, one connection per session:
            # ZooKeeper's default of 60 per address would refuse a test's 61st session
            "maxClientCnxns": "0",
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "srvr,mntr,ruok",
            "standaloneEnabled": "false",
            "cnxTimeout": "1000",  # becomes -Dzookeeper.cnxTimeout: election connect timeout
            **(extra_config or {}),
        }
        self.heap_mb = heap_mb
        self.jvm_flags = tuple(jvm_flags)
        if self.image_style == engine.UPSTREAM_STYLE:
            blank = [f"{k}={v}" for k, v in self.config.items() if re.search(r"\s", k + v)]
            if blank:
                raise ValueError(f"zoo.cfg lines with blanks cannot pass ZOO_CFG_EXTRA: {blank}")

    def _default_image(self) -> str:
        return engine.zookeeper_image(self.image_style)

    def _upstream(self) -> bool:
        return self.image_style == engine.UPSTREAM_STYLE

    def _user(self, member: Member) -> str:
        if self._upstream():
            return f"{self.upstream_user}:{member.gid}"
        return super()._user(member)

    def _command(self, member: Member) -> list[str] | None:
        if self._upstream():
            return None  # the image's entrypoint and `zkServer.sh start-foreground`
        quorum, election = self.peer_ports
        lines = [f"{key}={value}" for key, value in self.config.items()]
        lines += [f"clientPortAddress={member.address}", f"clientPort={self.client_port}"]
        lines += [f"server.{m.index}={m.address}:{quorum}:{election}" for m in self.members]
        return [str(member.index), *lines]

    def _env(self, member: Member) -> dict[str, str]:
        jvm = " ".join((f"-Xms32m -Xmx{self.heap_mb}m -XX:+UseSerialGC -XX:TieredStopAtLevel=1",
                        *self.jvm_flags))
        if not self._upstream():
            return {"JVMFLAGS": jvm}
        quorum, election = self.peer_ports
        env = {
            "JVMFLAGS": jvm,
            "ZK_SERVER_HEAP": str(self.heap_mb),
            "ZOO_MY_ID": str(member.index),
            "ZOO_SERVERS": " ".join(
                f"server.{m.index}={m.address}:{quorum}:{election};{m.address}:{self.client_port}"
                for m in self.members
            ),
        }
        extra = []
        for key, value in self.config.items():
            if key in self.UPSTREAM_ENV:
                env[self.UPSTREAM_ENV[key]] = value
            else:
                extra.append(f"{key}={value}")
        env["ZOO_CFG_EXTRA"] = " ".join(extra)
        return env

    SYNC_MESSAGES: ClassVar[dict[str, str]] = {
        "Getting a snapshot from leader": "SNAP",
        "Getting a diff from the leader": "DIFF",
        "Truncating log to get in sync with the leader": "TRUNC",
    }
    """What ZooKeeper 3.5-3.8's ``Learner.syncWithLeader`` logs for each way to sync."""

    def sync_modes(self, member: Member) -> list[str]:
        """How ``member`` synced with a leader each time it followed one, oldest first,
        read from its log (every start of its container): ``"SNAP"`` (it loaded the
        leader's whole tree), ``"DIFF"`` (the transactions it missed) or ``"TRUNC"``."""
        pattern = "|".join(re.escape(message) for message in self.SYNC_MESSAGES)
        return [self.SYNC_MESSAGES[found] for found in re.findall(pattern, self.logs(member))]

    def member_mode(self, member: Member) -> str | None:
        """``leader``, ``follower`` (or ``observer``, ``standalone``) as ``srvr`` says, or
        None: the member does not answer or serves no clients."""
        try:
            mode = re.search(r"^Mode: (\w+)", self._srvr(member), re.MULTILINE)
        except OSError:
            return None
        return mode.group(1) if mode else None

    def mntr(self, member: Member) -> dict[str, str]:
        """The member's ``mntr`` figures (``zk_znode_count``, ``zk_approximate_data_size``,
        ...) as text; empty if it does not answer."""
        try:
            reply = four_letter_word(member.address, member.client_port, "mntr")
        except OSError:
            return {}
        return dict(line.split("\t", 1) for line in reply.splitlines() if "\t" in line)

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

    def wipe(self, timeout_s: float = 90.0) -> float:
        """Lose the ensemble's whole history at once, as an operator deleting every
        member's data directory would: every member is stopped, its data (which lives in
        its container) deleted with it, and a new one started in its place with an empty
        data directory; then waits until all serve. Partitions are healed first.

        Clients then find a store with none of the old znodes, sessions or zxids: znode
        versions (and so the tokens) start again, and ZooKeeper refuses every client that
        saw a newer zxid than it has until its own zxids pass that one.

        Returns the seconds from the call until every member served again.

        Raises:
            ClusterError: a member could not be removed or started again.
            ClusterTimeout: not all members served within ``timeout_s`` seconds.
        """
        started = time.monotonic()
        self.heal_all()
        errors = self._remove_containers()  # every member at once: none can reseed the others
        if errors:
            raise ClusterError(f"{self.name}: wiping failed: {errors!r}")
        for member in self.members:
            if member.container is not None:
                member.container.get_docker_client().client.close()
            member.container = self._new_container(member)
            member.state = MemberState.RUNNING
        for member in self.members:
            assert member.container is not None
            member.container.start()
        self.wait_ready(timeout_s)
        return time.monotonic() - started
