"""The upstream image style with the look-alike images (built here when missing): faults
that depend on member gids work, and an image that loses them says so instead of
silently cutting nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import consensus_lease
from consensus_lease.testing import engine
from consensus_lease.testing.cluster import (
    Cluster,
    FaultUnsupported,
    Member,
    ZooKeeperCluster,
    leftovers,
)
from consensus_lease.testing.images.build import LOOKALIKE_RECIPES, BuildError, build_images

pytestmark = pytest.mark.containers

KIT_TESTS = Path(__file__).with_name("test_cluster_kit.py")
UPSTREAM_OPTIONS = [
    "--consensus-lease-image-style=upstream",
    f"--consensus-lease-etcd-image={engine.LOOKALIKE_ETCD_IMAGE}",
    f"--consensus-lease-zookeeper-image={engine.LOOKALIKE_ZOOKEEPER_IMAGE}",
]


@pytest.fixture(scope="module")
def lookalikes() -> None:
    """The look-alike images, built when missing (about 80 s on a fresh machine)."""
    try:
        engine.ensure_engine(timeout_s=60.0)
        if engine.missing_images([engine.LOOKALIKE_ETCD_IMAGE, engine.LOOKALIKE_ZOOKEEPER_IMAGE]):
            build_images(LOOKALIKE_RECIPES, report=lambda line: None)
    except (OSError, engine.EngineUnavailable, BuildError) as exc:
        pytest.fail(f"the look-alike images cannot be had: {exc}", pytrace=False)


class _AsRoot(ZooKeeperCluster):
    """Runs the official-style image as root, as ``docker run --user 0:GID`` would: its
    entrypoint then switches to the zookeeper user and group."""

    def _user(self, member: Member) -> str:
        return Cluster._user(self, member)


def test_an_image_that_drops_the_member_gid_refuses_member_partitions(lookalikes: None) -> None:
    with _AsRoot(image=engine.LOOKALIKE_ZOOKEEPER_IMAGE, image_style="upstream") as cluster:
        capabilities = cluster.capabilities
        assert capabilities.member_partitions is False
        assert "does not keep the gid" in capabilities.reasons["member_partitions"]
        assert capabilities.pause and capabilities.kill and capabilities.cut_client
        with pytest.raises(FaultUnsupported, match="member_partitions not supported"):
            cluster.isolate(cluster.members[0])
        with pytest.raises(FaultUnsupported):
            cluster.partition(cluster.members[0], cluster.members[1])
        assert not [item for item in leftovers(cluster=cluster.name) if item.startswith("rule")]


def test_gid_faults_kill_and_wipe_work_with_upstream_lookalikes(lookalikes: None) -> None:
    """The kit's own fault tests that depend on the image, in the upstream style."""
    chosen = "isolated_leader or partition_between or killing_the_leader or wipe"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSENSUS_LEASE_")}
    env["PYTHONPATH"] = str(Path(consensus_lease.__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(KIT_TESTS),
         "-k", chosen, *UPSTREAM_OPTIONS],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "6 passed" in done.stdout, done.stdout[-2000:]
