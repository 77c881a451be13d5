"""The core's structure (issue 26): its modules form layers, and none reads another's
private names. A runtime import cycle between the core's modules, an access to another
module's private name, or a new type-only reference up the layers fails here.

"Core" is the package's top-level modules (``consensus_lease/*.py``; drivers, tools and
the test kit have packages of their own, held so by ``test_package_root.py``).

A *private access* is ``x._name`` where ``x`` is not ``self``, ``cls`` or ``super()`` and
``_name`` is not defined in the accessing module itself (as a function, class attribute,
``self._name = ...`` or module name), or ``from .module import _name``: a name of another
module's implementation, which that module may change without telling the reader. (A
name defined in both modules is taken as the module's own only when no other core module
defines it: ``lease._lock`` in a module that has a ``_lock`` of its own is still
another module's name.) What one module needs of another is public there: a property or method
(``Session.waiters``, ``LeaseStore.watchers``, ``LeaseStore.check_open``,
``AsyncLeaseStore.workers``), or, for what only one other module may do, a documented
module-level function outside ``__all__`` (``lease.finish_lease`` / ``lose_lease`` and
``transaction.end_transaction`` for the holdings, ``election.announced`` for campaigns,
``session.close_with_store`` for the store). The standard library's private names are not
used either (the caller's frame comes from ``inspect.currentframe()``).

A *runtime import* is one made when the module is imported: at module level, also inside
``if``/``try``/``with``/``class`` blocks, but not under ``if TYPE_CHECKING:`` nor inside
functions (deferred). The runtime imports form layers, each module importing only
modules of lower layers (a module's layer: 1 + the highest layer it imports). They are
(held by a test: ``python tests/unit/test_core_layers.py`` prints them)::

    0  _callsite _election _extras _subscriptions _visible clock errors record states
    1  _epoch _fork _renewer _waiting observe options validation
    2  _callbacks backend fencing metrics otel retry shard
    3  _liveness _queue_claim fencing_sql lease transaction
    4  _aio_lease _holdings election
    5  _campaign leader_watch
    6  _aio_election session
    7  store
    8  __init__ aio celery

Under ``if TYPE_CHECKING:`` remain the names a module's annotations need from a module
that imports it (a runtime import would be a cycle): :data:`BACK_REFERENCES`, each with
why. The other type-only imports there would make no cycle at run time: they are only
annotations (ruff's ``TC`` rules put them there); ``__init__`` names ``fencing_sql`` there because it
loads it on first access (it needs SQLAlchemy).
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import consensus_lease

CORE = Path(consensus_lease.__file__).parent
MODULES = {path.stem: path for path in sorted(CORE.glob("*.py"))}

BACK_REFERENCES: dict[tuple[str, str], str] = {
    # (module, the module above it whose names its annotations use): why
    ("lease", "session"): "a lease names the session it lives under (which claims it)",
    ("lease", "_holdings"): "a lease hands each operation to its session's holdings",
    ("election", "session"): "a leadership is a lease: as lease -> session",
    ("_holdings", "session"): "the holdings wrap the session's claims in leases",
    ("_waiting", "session"): "a waiting claim waits for the session that runs it",
    ("_queue_claim", "session"): "claim_next runs for the session that calls it",
    ("_campaign", "session"): "a campaign runs for the session that calls it",
    ("_renewer", "_liveness"): "the renewer drives the liveness objects given to it",
    ("leader_watch", "store"): "a leader watch reads the store that opens it",
    ("_aio_lease", "aio"): "an asyncio lease runs on its AsyncSession's pool",
    ("_aio_election", "aio"): "an asyncio leadership or watch runs on its store's pool",
}
"""Type-only imports up the layers, and why the lower module names the higher one."""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(node: ast.ImportFrom) -> list[str]:
    """The core modules a relative ``from`` import names."""
    if node.level != 1:
        return []
    return [node.module.split(".")[0]] if node.module else [a.name for a in node.names]


def _import_time(body: list[ast.stmt]) -> Iterator[ast.ImportFrom]:
    """The relative imports run when a module's ``body`` runs (not in functions, not
    under ``if TYPE_CHECKING:``)."""
    for node in body:
        if isinstance(node, ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time(node.body)
            yield from _import_time(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse,
                          node.finalbody):
                yield from _import_time(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _import_time(node.body)


def _runtime_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {name for node in _import_time(tree.body) for name in _imported(node)}
    return found & MODULES.keys() - {path.stem}


def _type_only_imports(path: Path) -> set[str]:
    """The core modules imported under a module-level ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for sub in node.body:
                if isinstance(sub, ast.ImportFrom):
                    found.update(_imported(sub))
    return found & MODULES.keys()


def _graph() -> dict[str, set[str]]:
    return {name: _runtime_imports(path) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                out.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _layers(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's layer: 0 without core imports, else 1 + its imports' highest (the
    graph must have no cycle)."""
    layer: dict[str, int] = {}

    def of(name: str) -> int:
        if name not in layer:
            layer[name] = 1 + max((of(dep) for dep in graph[name]), default=-1)
        return layer[name]

    for name in graph:
        of(name)
    return layer


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    """Whether ``start`` imports ``goal`` at run time, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name == goal:
            return True
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return False


def _own_private_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, assigned names, and
    attributes it assigns on ``self``/``cls``."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            own.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
    return {name for name in own if name.startswith("_")}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _foreign_private_names(tree: ast.Module, own: set[str]) -> Iterator[str]:
    """The private names of others ``tree`` reads: ``x._name`` (``x`` not ``self``,
    ``cls``, ``super()``; ``_name`` not in ``own``) and ``from .m import _name``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level and node.module:
            yield from (a.name for a in node.names if _is_private(a.name))
        if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                and owner.func.id == "super"):
            continue
        if node.attr not in own:
            yield node.attr


def _private_accesses() -> Counter[tuple[str, str]]:
    trees = {name: ast.parse(path.read_text(encoding="utf-8"))
             for name, path in MODULES.items()}
    owners = {name: _own_private_names(tree) for name, tree in trees.items()}
    found: Counter[tuple[str, str]] = Counter()
    for name, path in MODULES.items():
        # a name this module defines is its own only if no other core module defines it
        # too: ``lease._lock`` in a module with a ``_lock`` of its own is still Lease's
        others = set().union(*(own for other, own in owners.items() if other != name))
        for attr in _foreign_private_names(trees[name], owners[name] - others):
            found[(path.name, attr)] += 1
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        frozenset({"a", "b", "c"})]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_finder_skips_type_checking_and_functions_only(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nfrom . import lease\n"
        "if TYPE_CHECKING:\n    from .session import Session\nelse:\n    from .record import x\n"
        "if not TYPE_CHECKING:\n    from .store import y\n"
        "try:\n    from .aio import z\nexcept ImportError:\n    pass\n"
        "def f():\n    from .election import w\n")
    assert _runtime_imports(module) == {"lease", "record", "store", "aio"}
    assert _type_only_imports(module) == {"session"}


def test_the_core_has_no_runtime_import_cycle() -> None:
    cycles = [sorted(c) for c in _cycles(_graph())]
    assert not cycles, f"runtime import cycles in the core: {cycles} (import under " \
        "TYPE_CHECKING, inside the function that needs it, or move the shared part down)"


def test_type_only_references_up_the_layers_are_the_named_ones() -> None:
    graph = _graph()
    back = {(name, target) for name, path in MODULES.items()
            for target in _type_only_imports(path) if _reaches(graph, target, name)}
    new = sorted(back - BACK_REFERENCES.keys())
    assert not new, (
        f"type-only imports of a module that imports the importer: {new}; name each in "
        "BACK_REFERENCES with why (or let the higher module pass what the lower one needs)")
    gone = sorted(BACK_REFERENCES.keys() - back)
    assert not gone, f"no longer type-only references up the layers: delete {gone}"


def _layer_table() -> str:
    by_layer: dict[int, list[str]] = {}
    for module, level in _layers(_graph()).items():
        by_layer.setdefault(level, []).append(module)
    return "\n".join(f"{level}  {' '.join(sorted(by_layer[level]))}" for level in sorted(by_layer))


def test_the_docstring_shows_the_layers() -> None:
    table = _layer_table()
    shown = "\n".join(line.strip() for line in (__doc__ or "").splitlines()
                      if line.strip()[:1].isdigit() and "  " in line.strip())
    assert shown == table, f"the core's layers changed: update the module docstring to\n{table}"


def test_the_architecture_page_shows_the_layers() -> None:
    """``docs/architecture.md`` tells maintainers the same layers (its table's rows are
    ``| N | `module` `module` ... |``)."""
    page = Path(__file__).parents[2] / "docs" / "architecture.md"
    if not page.exists():  # an installed wheel's tests: the docs are not shipped
        pytest.skip("docs/architecture.md is not in this tree (run from the checkout)")
    section = page.read_text("utf-8").split("## The core's layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("| ").split(" | ", 1) for line in section.splitlines()
            if line.startswith("| ") and line[2:3].isdigit()]
    shown = "\n".join(f"{level}  {' '.join(sorted(m.strip('`') for m in mods.strip(' |').split()))}"
                      for level, mods in rows)
    assert shown == _layer_table(), (
        f"docs/architecture.md's layer table is out of date; the layers are\n{_layer_table()}")


def test_no_core_module_reads_another_modules_private_names() -> None:
    found = _private_accesses()
    assert not found, (
        f"accesses to another module's private names (file, name): count {dict(found)}; "
        "give the owner a public method (or property) for what you need instead, or a "
        "documented module-level function outside __all__")


if __name__ == "__main__":
    print(_layer_table())
