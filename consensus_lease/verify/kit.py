"""A real 3-member cluster for the verifier, from the container kit
(:mod:`consensus_lease.testing.cluster`), seen through the nemesis's small
:class:`~consensus_lease.verify.nemesis.ClusterControl` interface.

The kit (and Docker, testcontainers) is imported only when ``--cluster etcd|zookeeper``
is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import UnsupportedBackend

__all__ = ["KitCluster"]

KINDS = ("etcd", "zookeeper")


class KitCluster:
    """A cluster the verifier starts, faults and stops.

    Args:
        kind: ``etcd`` or ``zookeeper``.

    Raises:
        UnsupportedBackend: unknown kind, or the kit cannot be imported.
    """

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise UnsupportedBackend(f"no cluster kind {kind!r}; choose one of {', '.join(KINDS)}")
        self.kind = kind
        self._cluster: Any = None
        self._owned = True

    @classmethod
    def adopt(cls, cluster: Any) -> KitCluster:
        """Wrap a kit cluster someone else started (e.g. a pytest fixture's); the
        verifier faults it and restores it, but :meth:`stop` leaves it running."""
        kind = "etcd" if cluster.scheme == "etcd" else "zookeeper"
        wrapper = cls(kind)
        wrapper._cluster = cluster
        wrapper._owned = False
        return wrapper

    def start(self, timeout_s: float = 120.0) -> KitCluster:
        """Start the members and wait until they serve.

        Raises:
            UnsupportedBackend: the kit or its dependencies are missing.
            Exception: the kit's ``ClusterError`` / ``ClusterTimeout``.
        """
        try:
            from ..testing import cluster as kit
        except ImportError as error:
            raise UnsupportedBackend(
                f"--cluster {self.kind} needs the container kit and its dependencies "
                f"(pip install consensus_lease[testing]): {error}"
            ) from error
        cls = kit.EtcdCluster if self.kind == "etcd" else kit.ZooKeeperCluster
        self._cluster = cls().start(timeout_s)
        return self

    @property
    def cluster(self) -> Any:
        if self._cluster is None:
            raise RuntimeError("cluster not started")
        return self._cluster

    def url(self, prefix: str) -> str:
        """The store URL naming every member, with a key prefix / chroot."""
        return str(self.cluster.url_with_prefix(prefix))

    def _member(self, name: str) -> Any:
        for member in self.cluster.members:
            if member.name == name:
                return member
        raise KeyError(name)

    # -- ClusterControl -----------------------------------------------------------------

    def member_names(self) -> list[str]:
        return [str(m.name) for m in self.cluster.members]

    def pause_member(self, name: str) -> None:
        self.cluster.pause(self._member(name))

    def unpause_member(self, name: str) -> None:
        self.cluster.unpause(self._member(name))

    def kill_member(self, name: str) -> None:
        self.cluster.kill(self._member(name))

    def restart_member(self, name: str) -> None:
        self.cluster.restart(self._member(name), ready_timeout_s=60.0)

    def leader(self) -> str:
        return str(self.cluster.leader(timeout_s=10.0).name)

    def cut_client(self, gid: int) -> Callable[[], None]:
        cut = self.cluster.cut_client(gid)
        heal: Callable[[], None] = cut.heal
        return heal

    def restore(self) -> None:
        self.cluster.restore()

    def stop(self) -> None:
        """Remove the members (only if this object started them)."""
        if self._cluster is not None and self._owned:
            self._cluster.stop()
        self._cluster = None
