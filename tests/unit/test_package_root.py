"""The package root shows the library: its top-level modules (``consensus_lease/*.py``)
are the protocol core and its public modules, and nothing else. Commands, the test kit's
internals and the store drivers live in packages below it, and the core imports none of
those (the tools and the kit build on the core, never the other way round).

A new module at the root fails here with where it belongs; a module that left the root
must leave the list too. ``tests/unit/test_core_layers.py`` holds the same modules'
import cycles and private accesses.
"""

from __future__ import annotations

import ast
from pathlib import Path

import consensus_lease

ROOT = Path(consensus_lease.__file__).parent

CORE_MODULES = {
    "__init__",
    # the user API: one module per concept, each with a page in docs/api/
    "aio", "backend", "clock", "election", "errors", "fencing", "fencing_sql",
    "leader_watch", "lease", "options", "record", "retry", "session", "shard", "states",
    "store", "transaction",
    # the metrics hook and its implementations; Celery's fenced tasks
    "observe", "metrics", "otel", "celery",
    # internals of the core (documented in their docstrings, not in docs/api/)
    "validation", "_aio_election", "_aio_lease", "_callbacks", "_callsite", "_campaign", "_election",
    "_epoch", "_extras", "_fork", "_holdings", "_liveness", "_queue_claim", "_renewer",
    "_subscriptions", "_visible", "_waiting",
}
"""The modules allowed at ``consensus_lease/*.py``."""

TOOLS = {
    "cli": "the consensus-lease command and its demo",
    "admin": "the operator commands (inspect, enqueue, requeue, bump-epoch, upgrade-queue)",
    "bench": "consensus-lease bench",
    "runcmd": "consensus-lease run / elect",
    "verify": "consensus-lease verify",
    "worker": "the worker runner and consensus-lease worker",
}
KIT = {"testing": "the test kit: conformance suites, clusters, faults, worker processes"}
LIBRARY_PACKAGES = {
    "backends": "the store drivers, chosen by URL scheme",
    "integrations": "adapters under other libraries' APIs (tooz)",
    "model": "the protocol's model and its checker",
}

WHERE_IT_BELONGS = (
    "the package root holds the protocol core and its public modules only: "
    "a command goes in consensus_lease/cli/ or its tool's package (registered in "
    "cli.EXTRA_COMMANDS), a part of the test kit in consensus_lease/testing/ (private "
    "names for its internals), a store driver's code in consensus_lease/backends/; "
    "a new core module is added to CORE_MODULES in this file"
)


def test_the_root_holds_only_the_core_modules() -> None:
    found = {path.stem for path in ROOT.glob("*.py")}
    new = sorted(found - CORE_MODULES)
    assert not new, f"new modules at consensus_lease/: {new}; {WHERE_IT_BELONGS}"
    gone = sorted(CORE_MODULES - found)
    assert not gone, f"no longer at consensus_lease/: delete them from CORE_MODULES: {gone}"


def test_the_root_packages_are_the_tools_the_kit_and_the_library_parts() -> None:
    # A folder without __init__.py ships as a namespace package (pyproject.toml), so
    # every folder counts.
    found = {path.name for path in ROOT.iterdir()
             if path.is_dir() and path.name != "__pycache__" and not path.name.startswith(".")}
    known = {*TOOLS, *KIT, *LIBRARY_PACKAGES}
    assert found == known, (
        f"new: {sorted(found - known)}, gone: {sorted(known - found)}; a new package "
        "is listed here as a tool, the kit or a part of the library")


def _imported_packages(path: Path) -> set[str]:
    """The first component below ``consensus_lease`` of every import in ``path``'s
    module, deferred ones (inside functions, under TYPE_CHECKING) included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module.split(".")[0]] if node.module
                         else [alias.name for alias in node.names])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] == "consensus_lease" and len(parts) > 1:
                found.add(parts[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "consensus_lease" and len(parts) > 1:
                    found.add(parts[1])
    return found


def test_the_core_imports_no_tool_and_not_the_test_kit() -> None:
    above = {*TOOLS, *KIT}
    wrong = {path.name: sorted(_imported_packages(path) & above)
             for path in sorted(ROOT.glob("*.py"))}
    wrong = {name: packages for name, packages in wrong.items() if packages}
    assert not wrong, (
        f"core modules importing a tool or the test kit: {wrong}; the tools and the kit "
        "build on the core: move what both need into the core (a private module)")


def test_the_import_finder_sees_relative_absolute_and_deferred_imports(
    tmp_path: Path,
) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from . import errors\nfrom .cli import main\nimport consensus_lease.bench.x\n"
        "def f():\n    from consensus_lease.testing import workers\n")
    assert _imported_packages(module) == {"errors", "cli", "bench", "testing"}
