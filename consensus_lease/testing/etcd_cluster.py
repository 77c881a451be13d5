"""A real etcd cluster in containers: :class:`EtcdCluster`.

Readiness and leadership are read from outside the containers over loopback,
through etcd's JSON gateway: ``/health`` and ``/v3/maintenance/status``.

Image styles: ``kit`` runs ``consensus-lease/etcd:3.4``, whose entrypoint is etcd and
whose command is the flags; ``upstream`` runs etcd's published image (default
:data:`~consensus_lease.testing.engine.UPSTREAM_ETCD_IMAGE`), which has no entrypoint
and the binary in ``/usr/local/bin``: the command is ``/usr/local/bin/etcd`` and the
flags. Both run as root with the member's gid, so every fault works.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterable
from typing import Any

from consensus_lease.testing import engine
from consensus_lease.testing._cluster_base import PROBE_TIMEOUT_S, Cluster, Member

UPSTREAM_ETCD_BINARY = "/usr/local/bin/etcd"
"""Where etcd's published images keep the binary."""

__all__ = ["EtcdCluster"]

# Bypass any http_proxy: every request here goes to a 127.x address.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EtcdCluster(Cluster):
    """etcd 3.4 members on 127.0.k.11-13:2379 (peers :2380).

    Args:
        heartbeat_interval_ms, election_timeout_ms: raft timing; a leader's
            failure is noticed after about ``election_timeout_ms``.
        extra_args: more ``etcd`` flags for every member.
        slot, size, image, image_style: see :class:`Cluster`.
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
        image_style: str | None = None,
        heartbeat_interval_ms: int = 100,
        election_timeout_ms: int = 1000,
        extra_args: Iterable[str] = (),
    ) -> None:
        super().__init__(slot=slot, size=size, image=image, image_style=image_style)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.election_timeout_ms = election_timeout_ms
        self.extra_args = list(extra_args)

    def _default_image(self) -> str:
        return engine.etcd_image(self.image_style)

    def _command(self, member: Member) -> list[str]:
        client = f"http://{member.address}:{self.client_port}"
        peer = f"http://{member.address}:{self.peer_ports[0]}"
        initial = ",".join(
            f"{m.name}=http://{m.address}:{self.peer_ports[0]}" for m in self.members
        )
        binary = [UPSTREAM_ETCD_BINARY] if self.image_style == engine.UPSTREAM_STYLE else []
        return [
            *binary,
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
        with _HTTP.open(request, timeout=PROBE_TIMEOUT_S) as response:
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
