"""The top-level namespace is the user API: sorted, complete, and free of driver and test
names, which live in consensus_lease.backend and consensus_lease.testing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import consensus_lease
from consensus_lease import backend, errors, testing

USER_API = {
    # store, session, lease
    "DEFAULT_TTL_S", "LeaseStore", "open_store", "Session", "Lease", "LeaseTransaction",
    # leader election
    "Leadership", "LeaderRecord", "LeaderWatch",
    # records and states
    "JobState", "LeaseRecord", "QueuedJob", "QueueStats", "EnqueueItem", "LeaseState",
    "SessionState",
    # job lifecycle
    "RetryPolicy",
    # clocks users inject, the metrics hook
    "Clock", "SystemClock", "Observer",
    # destination-side fencing
    "Effect", "Fence", "FenceOutcome", "SqliteFence", "SqlFence", "FenceRetryable",
}
NOT_TOP_LEVEL = {*backend.__all__, *testing.__all__, "ClaimResult"}
PACKAGE_ROOT = str(Path(consensus_lease.__file__).resolve().parents[1])


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that imports this checkout of the package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=60, env=env,
    )


def test_all_is_sorted_constants_first() -> None:
    names = consensus_lease.__all__
    assert names == sorted(names, key=lambda n: (not n.isupper(), n))
    assert len(set(names)) == len(names)


def test_all_is_the_user_api_and_every_name_imports() -> None:
    # SQLAlchemy is installed with the test extra, so the lazy names are listed too.
    assert set(consensus_lease.__all__) == USER_API | set(errors.__all__)
    star: dict[str, object] = {}
    exec("from consensus_lease import *", star)
    assert set(star) - {"__builtins__"} == set(consensus_lease.__all__)
    for name in consensus_lease.__all__:
        assert getattr(consensus_lease, name) is star[name]
    assert set(consensus_lease.__all__) <= set(dir(consensus_lease))


def test_every_error_is_exported_and_drawn_in_both_trees() -> None:
    readme_file = Path(PACKAGE_ROOT) / "README.md"
    # Outside a checkout (an installed wheel), the README is the package's description.
    readme = (readme_file.read_text() if readme_file.is_file()
              else str(metadata.metadata("consensus_lease")["Description"]))
    tree = readme[readme.index("LeaseError\n"):]
    tree = tree[: tree.index("```")]
    assert errors.__doc__ is not None
    for name in errors.__all__:
        error = getattr(errors, name)
        assert issubclass(error, errors.LeaseError) and getattr(consensus_lease, name) is error
        assert name in errors.__doc__, name
        assert name in tree, name
    assert issubclass(errors.StoreInherited, errors.LeaseError)
    assert not issubclass(errors.StoreInherited, (errors.StoreClosed, errors.LeaseNotHeld))


def test_no_driver_interface_or_test_doubles_at_top_level() -> None:
    assert not set(consensus_lease.__all__) & NOT_TOP_LEVEL
    for name in NOT_TOP_LEVEL:
        assert not hasattr(consensus_lease, name), name
    with pytest.raises(ImportError):
        from consensus_lease import Backend  # noqa: F401
    with pytest.raises(AttributeError):
        _ = consensus_lease.NoSuchName  # type: ignore[attr-defined]


def test_driver_interface_and_test_doubles_import_from_their_modules() -> None:
    from consensus_lease import clock
    from consensus_lease.backend import Backend
    from consensus_lease.testing import FakeClock, SkewedClock

    assert Backend.__module__ == "consensus_lease.backend"
    assert FakeClock is clock.FakeClock and SkewedClock is clock.SkewedClock


def test_sql_fence_is_the_fencing_sql_class() -> None:
    from consensus_lease import fencing_sql

    assert consensus_lease.SqlFence is fencing_sql.SqlFence
    assert consensus_lease.FenceRetryable is fencing_sql.FenceRetryable


def test_without_sqlalchemy_the_sql_fence_names_the_extra() -> None:
    done = run_python(
        """
        import sys
        sys.modules["sqlalchemy"] = None  # as if the extra were not installed
        import consensus_lease
        assert "SqlFence" not in consensus_lease.__all__, consensus_lease.__all__
        assert "FenceRetryable" not in consensus_lease.__all__
        exec("from consensus_lease import *", {})
        from consensus_lease import SqliteFence
        for name in ("SqlFence", "FenceRetryable"):
            try:
                getattr(consensus_lease, name)
            except ImportError as exc:
                assert "pip install consensus_lease[sql]" in str(exc), exc
            else:
                raise AssertionError(name + " imported without SQLAlchemy")
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_importing_the_package_and_test_kit_loads_no_optional_clients() -> None:
    done = run_python(
        """
        import sys
        import consensus_lease, consensus_lease.testing
        heavy = {"sqlalchemy", "docker", "testcontainers", "pytest", "kazoo", "grpc"}
        print(sorted({m.partition(".")[0] for m in sys.modules} & heavy))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
