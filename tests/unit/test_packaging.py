"""Packaging: the base install needs only the standard library, and whatever needs an
extra says which one to install (open_store, the consensus-lease command).

Each check runs in a fresh interpreter, where a library can be made missing with
``sys.modules[name] = None`` (an import of it then raises ModuleNotFoundError, as when
the extra is not installed). These tests also run against an installed wheel
(scripts/check-wheel.sh), so they read the extras from pyproject.toml in a checkout and
from the installed metadata otherwise.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import consensus_lease
from consensus_lease import _extras
from consensus_lease.cli import EXTRA_COMMANDS

PACKAGE_ROOT = Path(consensus_lease.__file__).resolve().parents[1]
OPTIONAL = ("rich", "tenacity", "grpc", "pyetcd", "google.protobuf", "kazoo", "sqlalchemy",
            "psycopg", "psycopg_pool", "prometheus_client", "pytest", "hypothesis",
            "testcontainers", "docker", "matplotlib", "tooz")
"""Libraries an extra installs: none may be needed by the base install."""


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter importing the package under test."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=60, env=env,
    )


def block(*names: str) -> str:
    """Code making ``names`` missing, as if their extra were not installed."""
    return "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in names)


def declared_extras() -> dict[str, list[str]]:
    """Extra name -> its requirements, from the checkout or the installed metadata."""
    pyproject = PACKAGE_ROOT / "pyproject.toml"
    if pyproject.is_file():
        project = tomllib.loads(pyproject.read_text())["project"]
        assert project["dependencies"] == [], "the base install needs nothing"
        return dict(project["optional-dependencies"])
    meta = metadata.metadata("consensus_lease")
    assert not [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    return {extra: [] for extra in meta.get_all("Provides-Extra") or []}


def test_import_and_the_sqlite_store_load_no_optional_library(tmp_path: Path) -> None:
    # The blocks make a stray import fail loudly; the sys.modules check below also
    # catches an import hidden behind try/except ImportError.
    done = run_python(
        """
        import sys
        import consensus_lease
        from consensus_lease import RetryPolicy, SqliteFence, open_store
        url = "sqlite:///" + sys.argv[1] + "/jobs.db"
        with open_store(url, retry=RetryPolicy(jitter=True)) as store:
            with store.session(ttl_s=5) as session:
                store.enqueue("q", "job-1")
                lease = session.claim_next("q", wait_s=5)
                lease.fail("retry later")  # computes the retry delay
        SqliteFence(sys.argv[1] + "/effects.db").apply("job-1", 1, "effect")
        optional = sys.argv[2].split(",")
        loaded = sorted(n for n in optional if n in sys.modules and sys.modules[n] is not None)
        print("loaded:", loaded)
        """,
        str(tmp_path), ",".join(OPTIONAL),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded: []"


@pytest.mark.parametrize(
    ("url", "blocked", "extra"),
    [
        ("etcd://127.0.0.1:2379/prefix", ("grpc", "pyetcd"), "etcd"),
        ("zk://127.0.0.1:2181/chroot", ("kazoo",), "zookeeper"),
        ("zookeeper://127.0.0.1:2181/chroot", ("kazoo",), "zookeeper"),
    ],
)
def test_open_store_without_the_client_names_the_extra(
    url: str, blocked: tuple[str, ...], extra: str
) -> None:
    done = run_python(
        block(*blocked)
        + """
from consensus_lease import UnsupportedBackend, open_store
try:
    open_store(sys.argv[1])
except UnsupportedBackend as exc:
    assert isinstance(exc.__cause__, ModuleNotFoundError), repr(exc.__cause__)
    print(exc)
""",
        url,
    )
    assert done.returncode == 0, done.stderr
    assert f"pip install 'consensus_lease[{extra}]'" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("consensus_lease.backends.etcd", ("grpc", "pyetcd"), "etcd"),
        ("consensus_lease.backends.zookeeper", ("kazoo",), "zookeeper"),
        ("consensus_lease.backends.postgresql", ("psycopg", "psycopg_pool"), "postgresql"),
    ],
)
def test_importing_a_backend_without_its_client_names_the_extra(
    module: str, blocked: tuple[str, ...], extra: str
) -> None:
    done = run_python(
        block(*blocked)
        + """
import importlib
try:
    importlib.import_module(sys.argv[1])
except ModuleNotFoundError as exc:
    print(exc.name, "|", exc)
"""
        , module,
    )
    assert done.returncode == 0, done.stderr
    name, _, message = done.stdout.partition(" | ")
    assert name in blocked, done.stdout
    assert f"pip install 'consensus_lease[{extra}]'" in message, done.stdout


def test_cli_without_the_etcd_client_names_the_extra() -> None:
    done = run_python(
        block("grpc", "pyetcd")
        + """
from consensus_lease.cli import main
sys.exit(main(["inspect", "--backend", "etcd://127.0.0.1:2379/prefix"]))
"""
    )
    assert done.returncode == 2, done.stderr
    out = done.stdout + done.stderr
    # The brackets survive the console's markup.
    assert "the etcd backend needs: pip install 'consensus_lease[etcd]'" in out, out
    assert "Traceback" not in out


def test_cli_without_rich_prints_one_line_not_a_traceback() -> None:
    done = run_python(
        block("rich")
        + """
from consensus_lease.cli import main
sys.exit(main(["demo"]))
"""
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: consensus-lease needs 'rich', which is not installed: "
        "pip install 'consensus_lease[cli]'"
    ]


def test_every_subcommand_loads_with_only_the_cli_extra() -> None:
    others = [name for name in OPTIONAL if name != "rich"]
    done = run_python(
        block(*others)
        + """
import importlib
from consensus_lease.cli import EXTRA_COMMANDS, _parser
for name in ["consensus_lease.cli.demo", *EXTRA_COMMANDS]:
    importlib.import_module(name)
parser = _parser()
assert not parser.epilog, parser.epilog
print("ok")
"""
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert len(EXTRA_COMMANDS) >= 9


def test_a_subcommand_needing_a_missing_library_is_listed_with_its_extra(
    tmp_path: Path,
) -> None:
    (tmp_path / "fake_plot_command.py").write_text("import matplotlib\n")
    done = run_python(
        block("matplotlib")
        + """
sys.path.insert(0, sys.argv[1])
from consensus_lease import cli
cli.EXTRA_COMMANDS.append("fake_plot_command")
print(cli._parser().epilog)
""",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert ("fake_plot_command needs 'matplotlib', which is not installed: "
            "pip install 'consensus_lease[bench]'") in done.stdout, done.stdout


def test_every_hint_names_a_declared_extra() -> None:
    extras = declared_extras()
    for extra in {*_extras.BACKEND_EXTRAS.values(), *_extras.MODULE_EXTRAS.values()}:
        assert extra in extras, extra
    for required in ("cli", "etcd", "zookeeper", "postgresql", "metrics", "sql", "testing",
                     "bench", "dev"):
        assert required in extras, required
    schemes = {ep.name: ep.value for ep in metadata.entry_points(group="consensus_lease.backends")}
    for scheme, target in schemes.items():
        if target.startswith("consensus_lease.") and scheme not in ("memory", "sqlite"):
            assert scheme in _extras.BACKEND_EXTRAS, scheme


def test_install_hint_quotes_the_brackets() -> None:
    assert _extras.install_hint("etcd") == "pip install 'consensus_lease[etcd]'"
    assert _extras.missing_dependency(ModuleNotFoundError("x", name="grpc._cython")) == "grpc"
    assert _extras.missing_dependency(
        ModuleNotFoundError("x", name="consensus_lease.backends.nope")) is None
    assert _extras.missing_dependency(ImportError("cannot import name 'x'")) is None


def test_prometheus_observer_without_the_client_names_the_extra() -> None:
    done = run_python(
        block("prometheus_client")
        + """
from consensus_lease.metrics import PrometheusObserver
try:
    PrometheusObserver()
except ImportError as exc:
    print(exc)
"""
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'consensus_lease[metrics]'" in done.stdout, done.stdout


def test_readme_and_getting_started_name_every_extra() -> None:
    readme, guide = PACKAGE_ROOT / "README.md", PACKAGE_ROOT / "docs" / "getting-started.md"
    if not (readme.is_file() and guide.is_file()):
        pytest.skip("the README and docs are in a checkout, not in the installed wheel")
    listed = re.search(r"Every extra \(([^)]*)\)", readme.read_text())
    assert listed, "the README's 'Every extra (...)' line is gone"
    in_readme = set(re.findall(r"`([a-z-]+)`", listed.group(1)))
    in_guide = set(re.findall(r"\[([a-z-]+)\]'", guide.read_text())) | \
        set(re.findall(r"`([a-z-]+)` is the former name", guide.read_text()))
    declared = set(declared_extras())
    assert in_readme == declared, (declared - in_readme, in_readme - declared)
    assert declared <= in_guide, declared - in_guide
