"""The pytest plugin from an empty folder outside the checkout, as a user's project would
use it: a short test file written into a temporary folder and run by its own pytest.

Run 1 uses the default (kit) images; run 2 the upstream image style with the look-alike
images (``consensus-lease kit build-images lookalike``), which follow the conventions of
etcd's published image and the official ``zookeeper`` image.

The package comes from this checkout through ``PYTHONPATH``, unless
``CONSENSUS_LEASE_KIT_PYTHON`` names an interpreter of a virtualenv where the wheel is
installed (then nothing of the checkout is on its path).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import consensus_lease
from consensus_lease.testing import engine
from consensus_lease.testing.images.build import LOOKALIKE_RECIPES, BuildError, build_images

pytestmark = pytest.mark.containers

USER_TESTS = """\
from consensus_lease import open_store


def test_etcd(etcd_cluster, key_prefix):
    with open_store(etcd_cluster.url_with_prefix(key_prefix)) as store:
        with store.session(ttl_s=5) as session:
            assert session.claim("job-1").generation > 0


def test_zookeeper(zookeeper_cluster, key_prefix):
    with open_store(zookeeper_cluster.url_with_prefix(key_prefix)) as store:
        with store.session(ttl_s=5) as session:
            assert session.claim("job-1").generation > 0
"""

RUN_TIMEOUT_S = 600.0


def _run_user_project(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_my_service.py").write_text(USER_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSENSUS_LEASE_")}
    python = os.environ.get("CONSENSUS_LEASE_KIT_PYTHON")
    if python is None:
        python = sys.executable
        env["PYTHONPATH"] = str(Path(consensus_lease.__file__).resolve().parents[1])
    else:
        env.pop("PYTHONPATH", None)
    return subprocess.run(
        [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def _ensure_lookalikes() -> None:
    """Build the look-alike images when missing (about 80 s on a fresh machine)."""
    try:
        engine.ensure_engine(timeout_s=60.0)
        if engine.missing_images([engine.LOOKALIKE_ETCD_IMAGE, engine.LOOKALIKE_ZOOKEEPER_IMAGE]):
            build_images(LOOKALIKE_RECIPES, report=lambda line: None)
    except (OSError, engine.EngineUnavailable, BuildError) as exc:
        pytest.fail(f"the look-alike images cannot be had: {exc}", pytrace=False)


def test_kit_images_from_an_empty_folder(tmp_path: Path) -> None:
    done = _run_user_project(tmp_path, "-k", "etcd")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout[-3000:]


def test_upstream_lookalike_images_from_an_empty_folder(tmp_path: Path) -> None:
    _ensure_lookalikes()
    done = _run_user_project(
        tmp_path,
        "--consensus-lease-image-style=upstream",
        f"--consensus-lease-etcd-image={engine.LOOKALIKE_ETCD_IMAGE}",
        f"--consensus-lease-zookeeper-image={engine.LOOKALIKE_ZOOKEEPER_IMAGE}",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout, done.stdout[-3000:]
