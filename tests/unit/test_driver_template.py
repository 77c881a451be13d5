"""Every server driver is a package cut to one template (see
:mod:`consensus_lease.backends`): the same module names with the same meaning in each,
every further module named as a part of one of them, and the client library's exceptions
imported only by the transport.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import consensus_lease.backends as backends
from consensus_lease.backends import TEMPLATE

ROOT = Path(backends.__file__).parent

CLIENT_EXCEPTIONS = {
    # driver: (modules whose import is the client library's exceptions, exception names)
    "etcd": ({"grpc"}, {"RpcError", "StatusCode"}),
    "zookeeper": ({"kazoo.exceptions"}, set()),
    "postgresql": ({"psycopg.errors", "psycopg_pool"}, {"Error", "OperationalError",
                   "InterfaceError", "DatabaseError", "IntegrityError", "PoolTimeout"}),
    "sqlite": (set(), {"Error", "OperationalError", "DatabaseError", "IntegrityError"}),
}
"""What counts as touching the client's exceptions: importing one of the modules, or
naming one of the exceptions as an attribute of the client library (``sqlite3.Error``,
``psycopg.OperationalError``, ``grpc.RpcError``)."""

LIBRARY = {"etcd": {"grpc", "pyetcd"}, "zookeeper": {"kazoo"},
           "postgresql": {"psycopg", "psycopg_pool"}, "sqlite": {"sqlite3"}}

DRIVERS = sorted(CLIENT_EXCEPTIONS)
"""Every server driver (a new one is added here and to ``LIBRARY``)."""


def _modules(driver: str) -> dict[str, Path]:
    package = ROOT / driver
    assert package.is_dir(), f"{driver} is not a package under {ROOT}"
    return {path.stem: path for path in sorted(package.glob("*.py"))}


def _template_part(stem: str) -> str | None:
    for name in sorted(TEMPLATE, key=len, reverse=True):
        if stem == name or stem.startswith(name + "_"):
            return name
    return None


@pytest.mark.parametrize("driver", DRIVERS)
def test_driver_has_the_template_modules(driver: str) -> None:
    modules = _modules(driver)
    missing = [name for name in TEMPLATE if name not in modules]
    assert not missing, f"{driver} lacks the template's modules {missing}"
    stray = [stem for stem in modules if _template_part(stem) is None]
    assert not stray, (f"{driver} has modules outside the template {stray}: name each "
                       f"after the template module it is part of (e.g. _queues_index)")
    assert not any(p.is_dir() and (p / "__init__.py").exists()
                   for p in (ROOT / driver).iterdir()), f"{driver} has a sub-package"


def _touches_client_exceptions(path: Path, driver: str) -> list[str]:
    modules, names = CLIENT_EXCEPTIONS[driver]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in modules:
                found.append(f"from {node.module} import ...")
            elif node.module in LIBRARY[driver]:
                found += [f"from {node.module} import {a.name}" for a in node.names
                          if a.name in names]
        elif (isinstance(node, ast.Attribute) and node.attr in names
              and isinstance(node.value, ast.Name) and node.value.id in LIBRARY[driver]):
            found.append(f"{node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("driver", DRIVERS)
def test_only_the_transport_touches_the_client_exceptions(driver: str) -> None:
    offenders = {stem: hits for stem, path in _modules(driver).items()
                 if _template_part(stem) != "_transport"
                 and (hits := _touches_client_exceptions(path, driver))}
    assert not offenders, (f"{driver}: the client's exceptions are translated in "
                           f"_transport only, but {offenders}")


def test_memory_stays_one_module() -> None:
    assert (ROOT / "memory.py").is_file() and not (ROOT / "memory").exists()


def test_the_architecture_page_lists_each_drivers_modules() -> None:
    """``docs/architecture.md`` shows every driver's modules by template module: a row
    ``| `_jobs` | `_jobs`<br>`_jobs_claim` | ... |`` per template module, a column per
    driver in the order etcd, ZooKeeper, PostgreSQL, SQLite."""
    page = Path(__file__).parents[2] / "docs" / "architecture.md"
    if not page.exists():  # an installed wheel's tests: the docs are not shipped
        pytest.skip("docs/architecture.md is not in this tree (run from the checkout)")
    order = ["etcd", "zookeeper", "postgresql", "sqlite"]
    shown: dict[str, dict[str, set[str]]] = {driver: {} for driver in order}
    for line in page.read_text("utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].strip("`") in TEMPLATE:
            for driver, cell in zip(order, cells[1:], strict=True):
                shown[driver][cells[0].strip("`")] = {
                    name.strip("`") for name in cell.split("<br>") if name}
    for driver in order:
        actual: dict[str, set[str]] = {}
        for stem in _modules(driver):
            actual.setdefault(_template_part(stem) or stem, set()).add(stem)
        assert shown[driver] == actual, (
            f"docs/architecture.md's table of {driver}'s modules is out of date: "
            f"it shows {shown[driver]}, the package has {actual}")
