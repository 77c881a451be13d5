"""Issue 25, item 6: every ZooKeeper server we ship has the heap the store's default limits
need, by the rule measured at the limit (``docs/capacity.md``, ``heap_needed_mb``).

The rule's figure is computed from the constants in code (the store defaults and the
enqueue multi's cap), so a larger default limit, a larger multi or a smaller shipped heap
fails here instead of killing a rejoining member with ``OutOfMemoryError``. No engine
needed: the kit's command lines, the recipe's build arguments and the files in
``docker/`` are read, not run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import consensus_lease
from consensus_lease.backends.zookeeper import _config, _queues
from consensus_lease.backends.zookeeper._queues_capacity import heap_needed_mb
from consensus_lease.testing import engine, pytest_plugin
from consensus_lease.testing.cluster import Member, ZooKeeperCluster
from consensus_lease.testing.images import build

ROOT = Path(consensus_lease.__file__).resolve().parents[1]
USABLE = 0.96
"""Share of ``-Xmx`` the serial collector can fill (one survivor space stays empty:
measured 618 of 640 MiB, 247 of 256)."""


def needed_mb() -> float:
    """The rule for the store's defaults with bulk enqueues (multis at their cap)."""
    return heap_needed_mb(_config.DEFAULT_STORE_MAX_JOBS, _config.DEFAULT_STORE_MAX_BYTES,
                          _queues.ENQUEUE_MULTI_BYTES)


def xmx_mb(flags: str) -> int:
    """The ``-Xmx`` of JVM flags, MiB (the last one wins, as in the JVM)."""
    found = re.findall(r"-Xmx(\d+)m\b", flags)
    assert found, f"no -Xmx...m in {flags!r}"
    return int(found[-1])


def member() -> Member:
    return Member(name="m1", index=1, address="127.0.0.21", client_port=2181, gid=4321)


@pytest.fixture(autouse=True)
def _no_image_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (engine.IMAGE_STYLE_ENV, engine.ETCD_IMAGE_ENV, engine.ZOOKEEPER_IMAGE_ENV):
        monkeypatch.delenv(name, raising=False)


def test_the_rule_reproduces_the_measured_figures() -> None:
    # docs/capacity.md: ≈ 550 MB for the defaults, ≈ 440 MB for the 18,000-job store
    # that lost a member at 256 MB, ≈ 236 MB for it with 40 KB writes (it survived)
    assert 540 < needed_mb() < 560
    assert 435 < heap_needed_mb(18_000, 8_388_608, _queues.ENQUEUE_MULTI_BYTES) < 445
    assert heap_needed_mb(18_000, 8_388_608, 40_000) < 247  # the usable share of 256 MB


def test_the_shipped_heap_fits_the_store_defaults() -> None:
    assert needed_mb() <= engine.ZOOKEEPER_HEAP_MB * USABLE
    # the session's shared ensemble carries many stores: at least as much
    assert pytest_plugin.SHARED_ZOOKEEPER_HEAP_MB >= engine.ZOOKEEPER_HEAP_MB


@pytest.mark.parametrize("style", [engine.KIT_STYLE, engine.UPSTREAM_STYLE])
def test_the_kit_runs_members_with_the_shipped_heap(style: str) -> None:
    cluster = ZooKeeperCluster(image_style=style)
    cluster.members = [member()]
    assert cluster.heap_mb == engine.ZOOKEEPER_HEAP_MB
    env = cluster._env(cluster.members[0])
    assert xmx_mb(env["JVMFLAGS"]) == engine.ZOOKEEPER_HEAP_MB
    if style == engine.UPSTREAM_STYLE:  # zkServer.sh's own -Xmx comes first; both agree
        assert env["ZK_SERVER_HEAP"] == str(engine.ZOOKEEPER_HEAP_MB)


def test_the_kit_image_defaults_to_the_shipped_heap() -> None:
    recipe = build.RECIPES["zookeeper"]
    args = recipe.build_args()
    assert args == {"HEAP_MB": str(engine.ZOOKEEPER_HEAP_MB)}
    assert f"HEAP_MB={engine.ZOOKEEPER_HEAP_MB}" in recipe.label()  # a new heap rebuilds
    dockerfile = (build.recipe_dir(recipe) / "Dockerfile").read_text()
    assert re.search(r"^ARG HEAP_MB$", dockerfile, re.M)
    (env,) = re.findall(r'^ENV JVMFLAGS="(.*)"$', dockerfile, re.M)
    assert xmx_mb(env.replace("${HEAP_MB}", args["HEAP_MB"])) == engine.ZOOKEEPER_HEAP_MB
    assert build.RECIPES["etcd"].label() == str(build.RECIPES["etcd"].revision)


def test_docker_compose_and_its_readme_use_the_shipped_heap() -> None:
    compose = (ROOT / "docker" / "docker-compose.yml").read_text()
    (flags,) = re.findall(r"^\s+JVMFLAGS: (.*)$", compose, re.M)
    assert xmx_mb(flags) == engine.ZOOKEEPER_HEAP_MB
    readme = (ROOT / "docker" / "README.md").read_text()
    shown = [int(mb) for mb in re.findall(r"-Xmx(\d+)m", readme)]
    assert shown and set(shown) == {engine.ZOOKEEPER_HEAP_MB}
