"""The kit's containers on the Docker engine, found by their labels.

Every member container carries :data:`KIT_LABEL`, the pid of the process that
started it (:data:`OWNER_LABEL`) and its cluster's name (:data:`CLUSTER_LABEL`),
so :func:`reap_stale` can remove what dead processes left behind and
:func:`leftovers` can list what a live one still owns.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from consensus_lease.testing.faults import make_tag, pid_alive, reap_stale_rules, tagged_rules

__all__ = [
    "CLUSTER_LABEL",
    "KIT_LABEL",
    "OWNER_LABEL",
    "docker_client",
    "docker_module",
    "leftovers",
    "reap_stale",
]

KIT_LABEL = "org.consensus-lease.kit"
OWNER_LABEL = "org.consensus-lease.owner-pid"
CLUSTER_LABEL = "org.consensus-lease.cluster"


def docker_module(module: str = "docker") -> Any:
    """docker-py's module ``module`` (``"docker"``, ``"docker.errors"``, ...)."""
    # Imported by name: the repository's docker/ directory shadows docker-py
    # for ruff and mypy run from the checkout.
    return importlib.import_module(module)


def docker_client() -> Any:
    """A docker-py client for the engine in the environment; the caller closes it."""
    return docker_module().from_env(timeout=30)


def reap_stale() -> list[str]:
    """Remove containers and iptables rules left by kit processes that died.

    Returns what was removed. Things owned by live processes are left alone.
    """
    removed = [f"rule {line}" for line in reap_stale_rules()] if os.geteuid() == 0 else []
    not_found = docker_module("docker.errors").NotFound
    client = docker_client()
    try:
        # sparse: the list's own answer, no inspect per container, which fails with
        # NotFound when another process removes its container between list and inspect
        for container in client.containers.list(all=True, sparse=True,
                                                filters={"label": KIT_LABEL}):
            owner = (container.attrs.get("Labels") or {}).get(OWNER_LABEL, "")
            if owner.isdigit() and not pid_alive(int(owner)):
                try:
                    container.remove(force=True, v=True)
                except not_found:  # another reaper got there first
                    continue
                removed.append(f"container {_sparse_name(container)}")
    finally:
        client.close()
    return removed


def _sparse_name(container: Any) -> str:
    """The name of a container from a sparse list (``attrs["Names"]``, ``/``-prefixed)."""
    names = container.attrs.get("Names") or [container.id[:12]]
    return str(names[0]).lstrip("/")


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
    client = docker_client()
    try:
        for container in client.containers.list(all=True, sparse=True,
                                                filters={"label": labels}):
            found.append(f"container {_sparse_name(container)}")
    finally:
        client.close()
    return found
