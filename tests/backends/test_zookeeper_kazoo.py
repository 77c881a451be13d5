"""kazoo's private surface is one module (``backends/zookeeper/_transport_kazoo.py``), and the kazoo
a store is opened with is checked there: the tested range pinned in pyproject.toml, a
warning outside it, a typed error for a missing internal. No server needed."""

from __future__ import annotations

import ast
import re
import tomllib
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.client import KazooClient, TransactionRequest
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import AsyncResult
from kazoo.protocol.connection import ConnectionHandler

import consensus_lease
from consensus_lease import open_store
from consensus_lease.backends.zookeeper import UntestedKazooWarning, _transport_kazoo
from consensus_lease.backends.zookeeper._transport import Wire
from consensus_lease.errors import BackendUnavailable, UnsupportedBackend

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(consensus_lease.__file__).resolve().parent / "backends" / "zookeeper"
RANGE = re.escape(f"kazoo{_transport_kazoo.TESTED_SPEC}")
"""What a warning or an error about the kazoo version must name."""

# -- the rule: only _transport_kazoo.py touches kazoo's private surface ------------------------------

PUBLIC_IMPORTS: dict[str, frozenset[str] | None] = {
    "kazoo.client": frozenset({"KazooClient", "KazooState"}),
    "kazoo.exceptions": None,  # any name
    "kazoo.retry": frozenset({"KazooRetry"}),
    "kazoo.security": None,
    "kazoo.protocol.states": None,
    "kazoo.handlers.threading": frozenset({"KazooTimeoutError"}),
}
"""The kazoo modules (and names) the driver's other modules may import: kazoo's
documented API (docs/api of kazoo: client, exceptions, retry, security, protocol.states;
``KazooTimeoutError`` is the threading handler's documented ``timeout_exception``)."""

UNDOCUMENTED_PUBLIC = frozenset({"last_zxid", "operations"})
"""Attributes of kazoo objects without an underscore that kazoo does not document."""


def kazoo_private_names() -> frozenset[str]:
    """kazoo's private attribute names (one leading underscore, not dunder) on the
    objects the driver handles: the client (class and a new instance), its connection,
    a transaction, the threading handler and its async results; plus
    :data:`UNDOCUMENTED_PUBLIC`."""
    client = KazooClient(hosts="127.0.0.1:2181")
    objects: list[Any] = [KazooClient, client, vars(client), ConnectionHandler,
                          vars(client._connection), TransactionRequest,
                          vars(client.transaction()), SequentialThreadingHandler,
                          vars(SequentialThreadingHandler()), AsyncResult]
    names = set(UNDOCUMENTED_PUBLIC)
    for obj in objects:
        for name in (obj if isinstance(obj, dict) else dir(obj)):
            if name.startswith("_") and not name.startswith("__"):
                names.add(name)
    return frozenset(names)


def violations(source: str, private: frozenset[str]) -> list[str]:
    """What in ``source`` (one module of the driver) touches kazoo's private surface.

    The rule (attribute access on kazoo objects cannot be told apart statically, so it
    is put this way):

    1. kazoo is imported only from :data:`PUBLIC_IMPORTS` (so no ``kazoo.protocol.
       serialization`` / ``.connection``, no ``kazoo.handlers.utils``);
    2. no attribute named like one of kazoo's private attributes (or an undocumented
       one, ``last_zxid``) is read, written or called on anything but ``self`` / ``cls``,
       and none is named as a string to ``getattr``/``setattr``/``hasattr``/``delattr``
       (``client._call(...)``, ``client._pending``, ``client.last_zxid``);
    3. no class subclasses a kazoo class other than an exception (so ``self._x`` is
       always the project's own attribute).
    """
    tree = ast.parse(source)
    out: list[str] = []
    from_kazoo: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "kazoo" or alias.name.startswith("kazoo."):
                    out.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kazoo":
            allowed = PUBLIC_IMPORTS.get(node.module or "", frozenset())
            for alias in node.names:
                from_kazoo.add(alias.asname or alias.name)
                if allowed is not None and alias.name not in allowed:
                    out.append(f"line {node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr in private:
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                out.append(f"line {node.lineno}: .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in private):
            out.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    exceptions = {"KazooTimeoutError"} | {
        name for name in from_kazoo if name.endswith(("Error", "Exception", "Loss"))}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id in from_kazoo - exceptions:
                    out.append(f"line {node.lineno}: class {node.name}({base.id})")
    return out


def test_only_the_kazoo_module_touches_kazoos_private_surface() -> None:
    """Every module of the ZooKeeper driver but ``_transport_kazoo.py`` keeps to kazoo's documented
    API, by the rule of :func:`violations`; ``_transport_kazoo.py`` is where the internals are."""
    private = kazoo_private_names()
    assert {"_call", "_pending", "_submit", "_session_callback", "last_zxid"} <= private
    modules = sorted(DRIVER.glob("*.py"))
    assert len(modules) > 15 and DRIVER / "_transport_kazoo.py" in modules
    found = {path.name: violations(path.read_text(), private) for path in modules}
    assert found.pop("_transport_kazoo.py"), "the scan finds nothing even where the internals are"
    assert {name: lines for name, lines in found.items() if lines} == {}


@pytest.mark.parametrize("source", [
    "def f(client):\n    client._call(request, result)\n",
    "def f(h):\n    return len(h.client._pending)\n",
    "def f(client):\n    return client.last_zxid\n",
    "def f(client):\n    return getattr(client, '_connection')\n",
    "from kazoo.protocol.serialization import Ping\n",
    "from kazoo.handlers.utils import AsyncResult\n",
    "import kazoo.protocol.connection\n",
    "from kazoo.handlers.threading import SequentialThreadingHandler\n"
    "class H(SequentialThreadingHandler):\n    pass\n",
])
def test_the_scan_catches_each_kind_of_private_use(source: str) -> None:
    assert violations(source, kazoo_private_names())


def test_the_scan_allows_the_public_api() -> None:
    source = (
        "from kazoo.client import KazooClient, KazooState\n"
        "from kazoo.exceptions import NoNodeError\n"
        "from kazoo.handlers.threading import KazooTimeoutError\n"
        "class NotSent(KazooTimeoutError):\n    pass\n"
        "class Mine:\n    def f(self, client):\n"
        "        self._call = client.get_async('/x')\n        return client.connected\n"
    )
    assert violations(source, kazoo_private_names()) == []


# -- the tested range ------------------------------------------------------------------------


def test_pyproject_pins_the_tested_range() -> None:
    """Both kazoo requirements of pyproject.toml are the tested range, whose bounds are
    the ones the check uses, and the installed kazoo is inside it."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    kazoo_lines = [line for lines in extras.values() for line in lines
                   if line.split(">")[0].split("<")[0].strip() == "kazoo"]
    assert kazoo_lines and set(kazoo_lines) == {f"kazoo{_transport_kazoo.TESTED_SPEC}"}
    low, high = _transport_kazoo.TESTED_MIN, _transport_kazoo.TESTED_BELOW
    assert f">={low[0]}.{low[1]},<{high[0]}.{high[1]}" == _transport_kazoo.TESTED_SPEC
    assert all(_transport_kazoo.in_tested_range(version) for version in _transport_kazoo.VERIFIED)
    assert _transport_kazoo.in_tested_range(_transport_kazoo.installed_version())


@pytest.mark.parametrize("version", ["2.11.0", "2.11.3.dev1"])
def test_a_tested_kazoo_opens_quietly(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_transport_kazoo, "installed_version", lambda: version)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _transport_kazoo.check_installed()


@pytest.mark.parametrize("version", ["2.12.0", "2.12.0rc1", "3.0.0", "2.10.0", "", "x"])
def test_an_untested_kazoo_warns_naming_the_range(
    version: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_transport_kazoo, "installed_version", lambda: version)
    with pytest.warns(UntestedKazooWarning, match=RANGE) as caught:
        _transport_kazoo.check_installed()
    assert (version or "unknown version") in str(caught[0].message)


def _refuse_to_connect(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the backend's first connection fail at once (and record that it was tried)."""
    tried: list[str] = []

    def reader(self: Wire, deadline: float | None = None) -> Any:
        tried.append("reader")
        raise BackendUnavailable("no connection in this test")

    monkeypatch.setattr(Wire, "reader", reader)
    return tried


def test_open_store_warns_on_an_untested_kazoo_and_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_transport_kazoo, "installed_version", lambda: "2.12.0")
    tried = _refuse_to_connect(monkeypatch)
    with pytest.warns(UntestedKazooWarning, match="2.12.0"), pytest.raises(BackendUnavailable):
        open_store("zk://127.0.0.1:2181/kazoo-check")
    assert tried == ["reader"]  # a warning, then the store is opened as usual


def _without_operations(client: Any) -> Any:
    return SimpleNamespace(client=client)


MISSING: list[tuple[str, Callable[[pytest.MonkeyPatch], None]]] = [
    ("KazooClient._call", lambda mp: mp.delattr(KazooClient, "_call")),
    ("serialization.CheckVersion", lambda mp: mp.setattr(_transport_kazoo, "CheckVersion", None)),
    ("Transaction.type == 14", lambda mp: mp.setattr(
        _transport_kazoo, "KazooTransaction", SimpleNamespace(type=99, deserialize=print))),
    ("Create.type == 1", lambda mp: mp.setattr(_transport_kazoo, "Create", SimpleNamespace(type=7))),
    ("ConnectionHandler._submit", lambda mp: mp.delattr(ConnectionHandler, "_submit")),
    ("utils.fileobj_to_fd", lambda mp: mp.setattr(_transport_kazoo, "fileobj_to_fd", None)),
    ("TransactionRequest.operations",
     lambda mp: mp.setattr(KazooClient, "transaction", _without_operations)),
    ("KazooClient.last_zxid", lambda mp: mp.setattr(
        _transport_kazoo, "KazooClient", lambda **kw: SimpleNamespace(
            chroot=None, default_acl=None, handler=None,
            transaction=lambda: SimpleNamespace(operations=[], client=None)))),
    ("exceptions.SessionClosedRequireSaslError",  # kazoo 2.10.0
     lambda mp: mp.setattr(_transport_kazoo, "SessionClosedRequireSaslError", None)),
    ("SequentialThreadingHandler.select",
     lambda mp: mp.delattr(SequentialThreadingHandler, "select")),
]


@pytest.mark.parametrize(("name", "remove"), MISSING, ids=[name for name, _ in MISSING])
def test_a_missing_internal_is_a_typed_error_naming_it(
    name: str, remove: Callable[[pytest.MonkeyPatch], None], monkeypatch: pytest.MonkeyPatch,
) -> None:
    remove(monkeypatch)
    with pytest.raises(UnsupportedBackend, match=RANGE) as raised:
        _transport_kazoo.check_installed()
    assert name in str(raised.value)


def test_open_store_refuses_a_kazoo_without_an_internal_before_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not an AttributeError in the middle of an operation: ``UnsupportedBackend`` from
    ``open_store``, and no connection tried (a version in range does not hide it)."""
    monkeypatch.delattr(KazooClient, "_call")
    tried = _refuse_to_connect(monkeypatch)
    with pytest.raises(UnsupportedBackend, match=r"KazooClient\._call"):
        open_store("zk://127.0.0.1:2181/kazoo-check")
    assert tried == []
