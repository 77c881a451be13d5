"""Run tooz's own driver test suite (``tooz.tests.test_coordination``, shipped in the
tooz wheel) against a tooz URL in a subprocess, and count what it did.

::

    counts = run_tooz_suite("consensus-lease+sqlite:////tmp/t.db")
    assert counts.failed == counts.errors == 0, counts.report()

Used by ``tests/integrations/test_tooz_suite.py`` (our driver on every store) and
``benchmarks/tooz_suite.py`` (ours beside tooz's own drivers on the same servers). The
suite's module imports every tooz driver's client library: install the ``tooz-test``
extra (``pip install consensus_lease[tooz-test]``).

If this checkout's ``tooz.backends`` entry points are not installed (an environment
installed from another checkout, or from before the driver existed), the subprocess gets
them from a throw-away ``.dist-info`` on its ``PYTHONPATH`` naming the same classes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

__all__ = ["TOOZ_SCHEMES", "SuiteCounts", "run_tooz_suite"]

TOOZ_SCHEMES = {
    "consensus-lease+sqlite": "consensus_lease.integrations.tooz:SqliteCoordinator",
    "consensus-lease+etcd": "consensus_lease.integrations.tooz:EtcdCoordinator",
    "consensus-lease+zk": "consensus_lease.integrations.tooz:ZooKeeperCoordinator",
    "consensus-lease+zookeeper": "consensus_lease.integrations.tooz:ZooKeeperCoordinator",
    "consensus-lease+postgresql": "consensus_lease.integrations.tooz:PostgresCoordinator",
}
"""The driver's URL schemes and classes, as ``pyproject.toml`` registers them."""

SUITE = "tooz.tests.test_coordination"


@dataclass
class SuiteCounts:
    """What one run of the suite did.

    Attributes:
        url: the ``TOOZ_TEST_URL`` it ran with.
        passed / failed / errors / skipped: test counts (``tests`` is their sum).
        skips: ``{test name: skip reason}``.
        problems: ``{test name: first lines of the failure}``.
        wall_s: the subprocess's wall time (seconds).
        output: the tail of its output.
    """

    url: str
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    skips: dict[str, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    output: str = ""

    @property
    def tests(self) -> int:
        return self.passed + self.failed + self.errors + self.skipped

    def summary(self) -> str:
        return (f"{self.passed} passed, {self.skipped} skipped, {self.failed} failed, "
                f"{self.errors} errors of {self.tests} in {self.wall_s:.0f} s")

    def report(self) -> str:
        """The summary, each problem and each skip reason, then the output's tail."""
        lines = [f"{self.url}: {self.summary()}"]
        lines += [f"  PROBLEM {name}: {text}" for name, text in self.problems.items()]
        lines += [f"  skipped {name}: {text}" for name, text in self.skips.items()]
        return "\n".join(lines) + "\n" + self.output[-3000:]


def _entry_points_path(into: Path) -> str | None:
    """A directory to put on ``PYTHONPATH`` that registers :data:`TOOZ_SCHEMES`, or
    ``None`` when the installed metadata already has every one of them."""
    installed = {ep.name for ep in entry_points(group="tooz.backends")}
    if set(TOOZ_SCHEMES) <= installed:
        return None
    info = into / "consensus_lease_tooz_entry_points-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: consensus-lease-tooz-entry-points\nVersion: 0\n")
    lines = [f"{name} = {target}" for name, target in TOOZ_SCHEMES.items()
             if name not in installed]
    (info / "entry_points.txt").write_text("[tooz.backends]\n" + "\n".join(lines) + "\n")
    return str(into)


def _python_path(first: list[str], inherited: str) -> str:
    """``first``, then the inherited ``PYTHONPATH``, each folder once: a folder listed
    twice shows its distributions twice, and tooz (stevedore) then finds two drivers per
    scheme and loads none ("No 'tooz.backends' driver found")."""
    paths = [*first, *inherited.split(os.pathsep)]
    return os.pathsep.join(p for i, p in enumerate(paths) if p and p not in paths[:i])


def _parse(counts: SuiteCounts, junit: Path) -> None:
    root = ET.parse(junit).getroot()
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        if (skip := case.find("skipped")) is not None:
            counts.skipped += 1
            counts.skips[name] = (skip.get("message") or "").removeprefix("Skipped: ")
        elif (bad := case.find("failure")) is not None:
            counts.failed += 1
            counts.problems[name] = (bad.get("message") or bad.text or "")[:500]
        elif (bad := case.find("error")) is not None:
            counts.errors += 1
            counts.problems[name] = (bad.get("message") or bad.text or "")[:500]
        else:
            counts.passed += 1


def run_tooz_suite(
    url: str,
    *,
    timeout_s: float = 600.0,
    per_test_timeout_s: float = 120.0,
    env: dict[str, str] | None = None,
    select: str | None = None,
) -> SuiteCounts:
    """Run ``pytest --pyargs tooz.tests.test_coordination`` with ``TOOZ_TEST_URL=url``
    in a subprocess (its own temporary working directory, so no project's pytest
    configuration applies) and return its counts.

    Args:
        url: the tooz URL (any driver: ours or tooz's own).
        timeout_s: the whole run's limit (seconds); then the subprocess is killed and
            :class:`subprocess.TimeoutExpired` raised.
        per_test_timeout_s: pytest-timeout's limit per test (a hung test fails alone).
        env: extra environment variables.
        select: a pytest ``-k`` expression (``None``: every test).

    Raises:
        subprocess.TimeoutExpired: the run exceeded ``timeout_s``.
        RuntimeError: the suite wrote no report (it could not be collected: the output
            says why, e.g. a missing ``tooz-test`` extra).
    """
    import consensus_lease

    counts = SuiteCounts(url=url)
    with tempfile.TemporaryDirectory(prefix="tooz-suite-") as tmp:
        work = Path(tmp)
        junit = work / "junit.xml"
        paths = [str(Path(consensus_lease.__file__).resolve().parent.parent)]
        if (shim := _entry_points_path(work / "entry-points")) is not None:
            paths.append(shim)
        child_env = {**os.environ, **(env or {}), "TOOZ_TEST_URL": url,
                     "PYTHONPATH": _python_path(paths, os.environ.get("PYTHONPATH", ""))}
        command = [sys.executable, "-m", "pytest", "--pyargs", SUITE, "-q", "-rs",
                   "-p", "no:cacheprovider", "-p", "no:consensus_lease",
                   "-o", "addopts=", f"--timeout={per_test_timeout_s:g}",
                   f"--junitxml={junit}"]
        if select:
            command += ["-k", select]
        start = time.monotonic()
        done = subprocess.run(command, cwd=work, env=child_env, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
        counts.wall_s = time.monotonic() - start
        counts.output = done.stdout + done.stderr
        if not junit.exists():
            raise RuntimeError(f"tooz's suite wrote no report (exit {done.returncode}):\n"
                               f"{counts.output[-3000:]}")
        _parse(counts, junit)
    return counts
