"""pytest plugin: real etcd and ZooKeeper clusters in containers.

Loaded automatically when consensus_lease is installed (entry point
``pytest11``), or with ``-p consensus_lease.testing.pytest_plugin``. It imports
neither docker nor testcontainers until a fixture below is used.

Fixtures:

=========================== ======== ===============================================
fixture                     scope    what it gives
=========================== ======== ===============================================
``docker_engine``           session  starts the Docker engine if none answers and
                                     builds (kit style) or pulls (upstream style)
                                     missing images
``etcd_cluster``            session  a shared 3-member etcd cluster
``zookeeper_cluster``       session  a shared 3-member ZooKeeper ensemble
``fresh_etcd_cluster``      function a cluster of its own, for tests that break it
``fresh_zookeeper_cluster`` function an ensemble of its own, for tests that break it
``key_prefix``              function a unique key prefix / chroot, e.g. ``t-test-x-1a2b3c4d``
=========================== ======== ===============================================

After every test that used a shared cluster, its partitions are healed and
its members thawed, restarted and waited for, so one test's faults never
leak into the next. Tests using a cluster fixture get the ``containers``
marker; when one fails, each member's log is attached to its report.

Images (options, else environment variables, else defaults):

===================================== =================================== =========
option                                environment variable                default
===================================== =================================== =========
``--consensus-lease-image-style``     ``CONSENSUS_LEASE_IMAGE_STYLE``     ``kit``
``--consensus-lease-etcd-image``      ``CONSENSUS_LEASE_ETCD_IMAGE``      per style
``--consensus-lease-zookeeper-image`` ``CONSENSUS_LEASE_ZOOKEEPER_IMAGE`` per style
===================================== =================================== =========

``kit`` runs ``consensus-lease/etcd:3.4`` and ``consensus-lease/zookeeper:3.8``, built
from the recipes in the package (``consensus-lease kit build-images``; the plugin builds
missing ones itself). ``upstream`` runs images with the published images' conventions,
by default ``quay.io/coreos/etcd:v3.5.17`` and ``zookeeper:3.8``, pulled when missing;
every fault works with them (see :class:`~consensus_lease.testing.cluster.KitCapabilities`).

No engine (not root, no ``dockerd``, images not buildable): the tests are
skipped with the reason -- except when ``CI=true``, where that is an error.
At session end the plugin checks that no container or iptables rule of this
process is left, and fails the run if one is.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from consensus_lease.testing.cluster import Cluster, EtcdCluster, ZooKeeperCluster

_SHARED = ("etcd_cluster", "zookeeper_cluster")
_FRESH = ("fresh_etcd_cluster", "fresh_zookeeper_cluster")
_CLUSTERS_KEY = pytest.StashKey[list["Cluster"]]()
_STARTED_KEY = pytest.StashKey[bool]()
_LOG_TAIL_LINES = 300
_BUILD_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class KitImages:
    """The image names the cluster fixtures run."""

    etcd: str
    zookeeper: str
    style: str = "kit"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _unavailable(reason: str) -> NoReturn:
    if _in_ci():
        pytest.fail(f"{reason} (CI=true: a missing container engine is an error)", pytrace=False)
    pytest.skip(reason)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("consensus_lease", "consensus_lease container kit")
    group.addoption(
        "--consensus-lease-image-style", choices=("kit", "upstream"), default=None,
        help="kit: our images (built when missing); upstream: images following the "
        "published etcd and official zookeeper images' conventions (pulled when missing). "
        "Default: $CONSENSUS_LEASE_IMAGE_STYLE or kit",
    )  # fmt: skip
    group.addoption(
        "--consensus-lease-etcd-image", default=None, metavar="IMAGE",
        help="etcd image (default: $CONSENSUS_LEASE_ETCD_IMAGE or the style's)",
    )  # fmt: skip
    group.addoption(
        "--consensus-lease-zookeeper-image", default=None, metavar="IMAGE",
        help="ZooKeeper image (default: $CONSENSUS_LEASE_ZOOKEEPER_IMAGE or the style's)",
    )  # fmt: skip


def kit_images(config: pytest.Config) -> KitImages:
    """The image style and names chosen by the options, environment or defaults."""
    from consensus_lease.testing import engine

    try:
        style = engine.image_style(config.getoption("consensus_lease_image_style", None))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    return KitImages(
        etcd=config.getoption("consensus_lease_etcd_image", None) or engine.etcd_image(style),
        zookeeper=config.getoption("consensus_lease_zookeeper_image", None)
        or engine.zookeeper_image(style),
        style=style,
    )


def _build_kit_images(images: KitImages, missing: list[str]) -> None:
    """Build the kit-style images from the recipes in the installed package."""
    from consensus_lease.testing import engine

    env = {
        **os.environ,
        engine.ETCD_IMAGE_ENV: images.etcd,
        engine.ZOOKEEPER_IMAGE_ENV: images.zookeeper,
    }
    recipes = [name for name, image in (("etcd", images.etcd), ("zookeeper", images.zookeeper))
               if image in missing]  # fmt: skip
    command = [sys.executable, "-m", "consensus_lease.testing.images", *recipes]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, env=env
        )
        output = done.stdout + done.stderr if done.returncode != 0 else None
    except (OSError, subprocess.TimeoutExpired) as exc:
        output = str(exc)
    if output is not None:
        tail = "\n".join(output.splitlines()[-20:])
        _unavailable(f"building cluster images {missing} failed ({' '.join(command)}):\n{tail}")


def _pull_upstream_images(missing: list[str]) -> None:
    from consensus_lease.testing._containers import docker_client

    client = docker_client()
    try:
        for name in missing:
            try:
                client.images.pull(name)
            except Exception as exc:
                _unavailable(
                    f"upstream image {name} is missing and could not be pulled ({exc}); without "
                    "a registry, `consensus-lease kit build-images lookalike` builds look-alikes "
                    "to name with --consensus-lease-etcd-image / --consensus-lease-zookeeper-image"
                )
    finally:
        client.close()


@pytest.fixture(scope="session")
def docker_engine(pytestconfig: pytest.Config) -> KitImages:
    """A Docker engine that answers, and the cluster images present on it."""
    reason = _engine_missing()
    if reason is not None:
        _unavailable(reason)
    from consensus_lease.testing import engine

    images = kit_images(pytestconfig)
    missing = engine.missing_images([images.etcd, images.zookeeper])
    if missing:
        if images.style == engine.UPSTREAM_STYLE:
            _pull_upstream_images(missing)
        else:
            _build_kit_images(images, missing)
        still = engine.missing_images([images.etcd, images.zookeeper])
        if still:
            _unavailable(f"cluster images {still} are still missing after building them")
    return images


def _engine_missing() -> str | None:
    """Why the kit cannot run here, or None when it can (starting the engine if needed)."""
    from consensus_lease.testing import engine

    try:
        engine.ensure_engine(timeout_s=60.0)
    except engine.EngineUnavailable as exc:
        return str(exc)
    try:
        import testcontainers.core.container  # noqa: F401  (imports docker-py too)
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install 'consensus_lease[testing]')"
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        return "fault injection needs root and iptables (apt-get install -y iptables)"
    return None


def _run_cluster(cluster: Cluster, config: pytest.Config) -> Iterator[Any]:
    config.stash[_STARTED_KEY] = True
    cluster.start(timeout_s=90.0)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def etcd_cluster(docker_engine: KitImages, pytestconfig: pytest.Config) -> Iterator[EtcdCluster]:
    """A 3-member etcd cluster shared by the session; restored after each test."""
    from consensus_lease.testing.cluster import EtcdCluster

    cluster = EtcdCluster(image=docker_engine.etcd, image_style=docker_engine.style)
    yield from _run_cluster(cluster, pytestconfig)


@pytest.fixture(scope="session")
def zookeeper_cluster(
    docker_engine: KitImages, pytestconfig: pytest.Config
) -> Iterator[ZooKeeperCluster]:
    """A 3-member ZooKeeper ensemble shared by the session; restored after each test.

    Its members have :data:`SHARED_ZOOKEEPER_HEAP_MB` of heap: the ensemble keeps every
    test's znodes for the whole session, and a member that rejoins by snapshot (after a
    pause or a restart) holds two copies of that tree while it loads the leader's.
    """
    from consensus_lease.testing.cluster import ZooKeeperCluster

    cluster = ZooKeeperCluster(image=docker_engine.zookeeper, image_style=docker_engine.style,
                               heap_mb=SHARED_ZOOKEEPER_HEAP_MB)
    yield from _run_cluster(cluster, pytestconfig)


SHARED_ZOOKEEPER_HEAP_MB = 768
"""Heap of each member of the session's shared ensemble, in MB: above the kit's default
(:data:`~consensus_lease.testing.engine.ZOOKEEPER_HEAP_MB`, what one store at the default
limits needs), as the session's many stores share it. With 256 MB (the kit's default then)
a full suite's data (tens of thousands of znodes from queue, tooz and many-session tests)
made a deposed leader that rejoined by snapshot exit with ``OutOfMemoryError`` in
``Learner.syncWithLeader`` (loading the leader's tree beside its own)."""


@pytest.fixture
def fresh_etcd_cluster(
    docker_engine: KitImages, request: pytest.FixtureRequest
) -> Iterator[EtcdCluster]:
    """A 3-member etcd cluster for this test only (on its own addresses).

    Parametrize it indirectly with a dict of :class:`EtcdCluster` keyword arguments to
    change its raft timing or flags, e.g. ``@pytest.mark.parametrize("fresh_etcd_cluster",
    [{"election_timeout_ms": 500}], indirect=True)``.
    """
    from consensus_lease.testing.cluster import EtcdCluster

    options: dict[str, Any] = dict(getattr(request, "param", None) or {})
    options.setdefault("image_style", docker_engine.style)
    cluster = EtcdCluster(image=docker_engine.etcd, **options)
    request.node.stash.setdefault(_CLUSTERS_KEY, []).append(cluster)
    yield from _run_cluster(cluster, request.config)


@pytest.fixture
def fresh_zookeeper_cluster(
    docker_engine: KitImages, request: pytest.FixtureRequest
) -> Iterator[ZooKeeperCluster]:
    """A 3-member ZooKeeper ensemble for this test only (on its own addresses).

    Parametrize it indirectly with a dict of :class:`ZooKeeperCluster` keyword arguments
    to change its heap, timing or zoo.cfg, e.g. ``@pytest.mark.parametrize(
    "fresh_zookeeper_cluster", [{"heap_mb": 128}], indirect=True)``.
    """
    from consensus_lease.testing.cluster import ZooKeeperCluster

    options: dict[str, Any] = dict(getattr(request, "param", None) or {})
    options.setdefault("image_style", docker_engine.style)
    cluster = ZooKeeperCluster(image=docker_engine.zookeeper, **options)
    request.node.stash.setdefault(_CLUSTERS_KEY, []).append(cluster)
    yield from _run_cluster(cluster, request.config)


@pytest.fixture
def key_prefix(request: pytest.FixtureRequest) -> str:
    """A prefix unique to this test, valid as an etcd key prefix and a znode name.

    Lower-case letters, digits and dashes, without slashes; pass it to
    ``cluster.url_with_prefix()``.
    """
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    return f"t-{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def _consensus_lease_restore_shared(request: pytest.FixtureRequest) -> Iterator[None]:
    names = [name for name in _SHARED if name in request.fixturenames]
    if not names:
        yield
        return
    shared: list[Cluster] = [request.getfixturevalue(name) for name in names]
    request.node.stash.setdefault(_CLUSTERS_KEY, []).extend(shared)
    yield
    for cluster in shared:
        cluster.restore(timeout_s=60.0)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "containers: needs a Docker engine and the cluster images (real etcd / ZooKeeper)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if set(getattr(item, "fixturenames", ())) & {*_SHARED, *_FRESH}:
            item.add_marker(pytest.mark.containers)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        for cluster in item.stash.get(_CLUSTERS_KEY, []):
            for member in cluster.members:
                if member.container is None:
                    continue
                try:
                    text = cluster.logs(member, tail=_LOG_TAIL_LINES)
                except Exception as exc:
                    text = f"(log unavailable: {exc!r})"
                report.sections.append((f"{member.name} log ({report.when})", text))
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not session.config.stash.get(_STARTED_KEY, False):
        return
    from consensus_lease.testing.cluster import leftovers

    left = leftovers()
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "consensus_lease kit left these behind:\n  " + "\n  ".join(left)
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
