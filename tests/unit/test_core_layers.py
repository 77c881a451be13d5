"""The core's structure, held where it stands until issue 26 untangles it: a new runtime
import cycle between the core's modules, or a new access to another module's private
name in them, fails here (a ratchet: the lists below may only shrink).

"Core" is the package's top-level modules (``consensus_lease/*.py``; drivers, tools and
the test kit have packages of their own, held so by ``test_package_root.py``). A private
access is ``x._name`` where ``x`` is not ``self``, ``cls`` or ``super()`` and ``_name``
is not defined in the accessing module itself (as a function, class attribute,
``self._name = ...`` or module name): a name of another module's implementation, which
that module may change without telling the reader. (A name defined in both modules is
taken as the module's own only when no other core module defines it: ``lease._lose``
in a module that has a ``_lose`` of its own is another module's name.) A runtime import
is one at module level outside ``if TYPE_CHECKING:`` (imports inside functions are deferred and left out).
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import consensus_lease

CORE = Path(consensus_lease.__file__).parent
MODULES = {path.stem: path for path in sorted(CORE.glob("*.py"))}

KNOWN_CYCLES = [
    # aio imports _aio_election at its bottom, which imports aio's AsyncSession back
    frozenset({"aio", "_aio_election"}),
]

KNOWN_PRIVATE: dict[tuple[str, str], int] = {
    # the asyncio election reads aio's worker pool and the store's watchers
    ("_aio_election.py", "_check_open"): 1, ("_aio_election.py", "_watchers"): 1,
    ("_aio_election.py", "_workers"): 2,
    # the async session reads the sync session's waiter registry
    ("aio.py", "_waiters"): 4,
    # campaigns and waits read the session's liveness and waiter registry
    ("_campaign.py", "_announced"): 1, ("_campaign.py", "_liveness"): 1,
    ("_waiting.py", "_waiters"): 3,
    # the holdings end a lease's state (Lease._finish/_close: no public setter)
    # (Lease._lose too: the two modules each have a ``_lose``; the holdings call Lease's)
    ("_holdings.py", "_close"): 1, ("_holdings.py", "_finish"): 3, ("_holdings.py", "_lose"): 2,
    ("leader_watch.py", "_watchers"): 1,
    ("session.py", "_getframe"): 3,  # sys._getframe: the caller's file for messages
    ("store.py", "_close_with_store"): 2,
}


def _runtime_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, ast.ImportFrom) and sub.level == 1:
                found.update([sub.module.split(".")[0]] if sub.module
                             else [alias.name for alias in sub.names])
    return found & MODULES.keys()


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


def _private_accesses() -> Counter[tuple[str, str]]:
    trees = {name: ast.parse(path.read_text(encoding="utf-8"))
             for name, path in MODULES.items()}
    owners = {name: _own_private_names(tree) for name, tree in trees.items()}
    found: Counter[tuple[str, str]] = Counter()
    for name, path in MODULES.items():
        tree = trees[name]
        # a name this module defines is its own only if no other core module defines it
        # too: ``lease._lose`` in a module with a ``_lose`` of its own is still Lease's
        others = set().union(*(own for other, own in owners.items() if other != name))
        own = owners[name] - others
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                    and owner.func.id == "super"):
                continue
            if node.attr in own:
                continue
            found[(path.name, node.attr)] += 1
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        frozenset({"a", "b", "c"})]


def test_no_new_runtime_import_cycle_in_the_core() -> None:
    graph = {name: _runtime_imports(path) for name, path in MODULES.items()}
    cycles = _cycles(graph)
    new = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not new, f"new runtime import cycles in the core: {new} (import under " \
        "TYPE_CHECKING, inside the function that needs it, or move the shared part down)"
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"cycles gone: delete them from KNOWN_CYCLES: {gone}"


def test_no_new_access_to_another_modules_private_names_in_the_core() -> None:
    found = _private_accesses()
    grown = {key: n for key, n in found.items() if n > KNOWN_PRIVATE.get(key, 0)}
    assert not grown, (
        f"new accesses to another module's private names (file, name): count {grown}; "
        "give the owner a public method (or property) for what you need instead")
    shrunk = {key: (n, found.get(key, 0)) for key, n in KNOWN_PRIVATE.items()
              if found.get(key, 0) < n}
    assert not shrunk, f"fewer private accesses than listed: lower KNOWN_PRIVATE {shrunk}"
