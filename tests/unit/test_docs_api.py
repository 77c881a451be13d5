"""The API reference is the public API: every public module has a page in docs/api/, and
the site built from them (``mkdocs build --strict``, as ``make docs`` runs it) has an entry
for every name in each module's ``__all__`` and for no other module-level name."""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import consensus_lease

ROOT = Path(consensus_lease.__file__).resolve().parents[1]
API_DIR = ROOT / "docs" / "api"

# The documentation sources are part of a checkout, not of the wheel: scripts/check-wheel.sh
# leaves this file out when it runs the unit tests against an installed wheel.
assert (ROOT / "mkdocs.yml").is_file(), f"no mkdocs.yml beside the package ({ROOT})"
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)

NOT_IN_API_REFERENCE = {
    # Reached through their command-line interface, documented in the guides.
    "consensus_lease.admin": "the operator commands (inspect, enqueue, requeue, bump-epoch)",
    "consensus_lease.bench": "consensus-lease bench",
    "consensus_lease.cli": "the consensus-lease command",
    "consensus_lease.runcmd": "consensus-lease run / elect",
    # Chosen by URL scheme; each module docstring is rendered on its Stores page.
    "consensus_lease.backends": "the store drivers",
    # Argument checks shared by the modules above; raises InvalidArgument only.
    "consensus_lease.validation": "internal argument checks",
    # Adapters under other libraries' APIs: each module has its own page (below).
    "consensus_lease.integrations": "the adapters (tooz); each has its own page",
}
"""Direct submodules of the package that are public by name but have no API page, and why."""

SUBMODULES_WITH_PAGES = {
    "consensus_lease.model.checker",
    "consensus_lease.model.mutations",
    "consensus_lease.model.protocol",
    "consensus_lease.model.store",
    "consensus_lease.testing.cluster",
    "consensus_lease.testing.conformance",
    "consensus_lease.testing.faultsuite",
    "consensus_lease.integrations.tooz",
    "consensus_lease.verify.lockset",
}
"""Deeper modules that users import from directly, so they get a page of their own."""


def documented_modules() -> dict[str, Path]:
    """Module name -> the docs/api page whose ``::: module`` directive renders it."""
    pages: dict[str, Path] = {}
    for page in sorted(API_DIR.glob("*.md")):
        for module in DIRECTIVE.findall(page.read_text()):
            assert module not in pages, f"{module} is rendered by {pages[module]} and {page}"
            pages[module] = page
    return pages


def public_modules() -> set[str]:
    """``consensus_lease``, its public direct submodules, and SUBMODULES_WITH_PAGES."""
    names = {"consensus_lease", *SUBMODULES_WITH_PAGES}
    for info in pkgutil.iter_modules(consensus_lease.__path__):
        if not info.name.startswith("_"):
            names.add(f"consensus_lease.{info.name}")
    return names - set(NOT_IN_API_REFERENCE)


def test_every_public_module_has_exactly_one_api_page() -> None:
    assert set(documented_modules()) == public_modules()


def test_every_api_page_is_in_the_nav() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    for page in API_DIR.glob("*.md"):
        assert f"api/{page.name}" in config, page.name


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built as ``make docs`` builds it, into a temporary folder."""
    import mkdocs  # noqa: F401  (the docs extra, part of dev: a missing one fails here)
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
         "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.mark.slow
def test_each_api_page_documents_exactly_the_modules_all(site: Path) -> None:
    differences: dict[str, dict[str, list[str]]] = {}
    for module_name, page in documented_modules().items():
        module = importlib.import_module(module_name)
        html = (site / "api" / page.stem / "index.html").read_text()
        # mkdocstrings gives each rendered object a heading whose id is its dotted path;
        # the module's own members are those one level below the module.
        rendered = set(re.findall(rf'id="{re.escape(module_name)}\.(\w+)"', html))
        missing = sorted(set(module.__all__) - rendered)
        extra = sorted(rendered - set(module.__all__))
        if missing or extra:
            differences[module_name] = {"missing": missing, "not in __all__": extra}
    assert differences == {}


@pytest.mark.slow
def test_the_reference_renders_no_raw_sphinx_roles(site: Path) -> None:
    # The docstrings use :class:`...` roles; docs/_ext/rst_roles.py turns them into code.
    for page in (site / "api").glob("*/index.html"):
        assert ":class:" not in page.read_text(), page


def _member_docstrings(path: Path, class_name: str) -> dict[str, str]:
    """``NAME -> docstring`` of an enum's members (the string literal after each member)."""
    import ast

    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    docs: dict[str, str] = {}
    for before, node in zip(cls.body, cls.body[1:], strict=False):
        if (isinstance(before, ast.Assign) and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            target = before.targets[0]
            assert isinstance(target, ast.Name)
            docs[target.id] = node.value.value
    return docs


def _plain(text: str) -> str:
    return " ".join(text.replace("`", "").replace("*", "").split())


@pytest.mark.parametrize("class_name", ["SessionState", "LeaseState"])
def test_the_concepts_page_states_what_states_py_says(class_name: str) -> None:
    # The "what you may assume" tables are copied from the enum members' docstrings.
    page = (ROOT / "docs" / "concepts.md").read_text()
    heading = {"SessionState": "**Session** (`session.state`):",
               "LeaseState": "**Lease** (`lease.state`):"}[class_name]
    table = page[page.index(heading):]
    table = table[: table.index("\n\n", table.index("| state |"))]
    rows = dict(re.findall(r"^\| `([A-Z]+)` \| (.+) \|$", table, re.MULTILINE))
    states = _member_docstrings(ROOT / "consensus_lease" / "states.py", class_name)
    assert states, class_name
    assert set(rows) == set(states)
    for name, doc in states.items():
        assert _plain(rows[name]) == _plain(doc), name
