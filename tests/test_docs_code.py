"""Every Python code block of ``docs/`` and ``README.md`` is run, so an example cannot
drift from the API (issue 31).

Each ```` ```python ```` block runs in a fresh namespace, in a temporary directory:

* Paths under ``/var/lib/`` (``sqlite:////var/lib/app/leases.db``, ``SqliteFence
  ("/var/lib/app/effects.db")``) are mapped into the test's directory.
* Names a page takes from an earlier example ("session as in Getting started") are
  given: ``store`` and ``session`` (a SQLite store on ``/var/lib/jobs.db``, or with the
  ``postgresql`` marker a PostgreSQL store in a fresh schema), ``url`` (the store's URL),
  ``lease`` (held by ``session``), ``DB`` and ``conn`` (PostgreSQL: the store's database,
  with ``search_path`` the fresh schema, which has the tables ``charges`` and
  ``accounts``), and stand-ins for the reader's own code (:data:`STAND_INS`).
* ``prometheus_client.start_http_server`` records its call instead of binding a port,
  and ``PrometheusObserver()`` registers in a fresh registry (not the process's).
* A marker, an HTML comment on the line before the block (a blank line between them),
  says what else it needs:

  - ``<!-- docs-test: postgresql -->``: run against the test PostgreSQL server
    (``CONSENSUS_LEASE_POSTGRES_URL``); each ``postgresql://`` / ``postgresql+psycopg://``
    URL in the block is replaced by the server's, keeping its query string (``schema=``
    becomes the fresh schema);
  - ``; then: CODE`` (after either form): Python run after the block, in its namespace
    (calls what the block only defines, checks what it did);
  - ``<!-- docs-test: compile-only: REASON -->``: the block needs what a test here
    cannot have (a named cluster, a pooler): it is compiled, not run, and its test id says
    ``compile-only``. REASON must be given.

  A block that includes a test file (``--8<-- "tests/...:section"``) is run by that test.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest

import consensus_lease
import consensus_lease.store
from consensus_lease import LeaseStore

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(\s*)```python\s*$")
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
PG_URL = re.compile(r"(postgresql(?:\+psycopg)?)://[^\"'\s]*")


class TemporaryError(Exception):
    """The reader's own retryable error (queues.md)."""


def _stand_ins() -> dict[str, Any]:
    class Smtp:
        def send(self, payload: object, idempotency_key: str) -> None:
            pass

    async def do_the_work(token: int) -> None:
        pass

    return {
        "send": lambda payload, token: None, "TemporaryError": TemporaryError,
        "smtp": Smtp(), "smtp_is_down": lambda: False, "do_the_work": do_the_work,
        "ticks": lambda: range(3), "route_to": lambda value: None,
    }


STAND_INS = sorted(_stand_ins())
"""The reader's own code, as the pages leave it to them."""


@dataclass(frozen=True)
class Block:
    path: str
    line: int
    code: str
    marker: str

    @property
    def id(self) -> str:
        kind = "compile-only" if self.marker.startswith("compile-only") else (
            "postgresql" if self.marker.startswith("postgresql") else "sqlite")
        return f"{self.path}:{self.line}:{kind}"


def blocks() -> list[Block]:
    found = []
    for name in ["README.md", *sorted(glob.glob("docs/**/*.md", root_dir=ROOT,
                                                recursive=True))]:
        lines = (ROOT / name).read_text().split("\n")
        i = 0
        while i < len(lines):
            fence = FENCE.match(lines[i])
            if fence:
                indent, j = fence.group(1), i + 1
                while lines[j].rstrip() != f"{indent}```":
                    j += 1
                before = [line for line in lines[max(0, i - 2):i] if line.strip()]
                marker = MARKER.search(before[-1]) if before else None
                code = "\n".join(line[len(indent):] for line in lines[i + 1:j])
                found.append(Block(name, i + 1, code, marker.group(1) if marker else ""))
                i = j
            i += 1
    return found


BLOCKS = blocks()


def test_the_docs_have_python_blocks_and_every_marker_is_known() -> None:
    assert len(BLOCKS) >= 20
    for block in BLOCKS:
        head = block.marker.split(";")[0].strip()
        assert head in ("", "postgresql") or head.startswith("then:") or re.fullmatch(r"compile-only: \S.*", head), (
            f"{block.id}: unknown docs-test marker {block.marker!r}")


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[LeaseStore]]:
    """Every store a block opens, closed after it (a block need not close its own)."""
    stores: list[LeaseStore] = []
    real = consensus_lease.store.open_store

    def tracked(*args: Any, **kwargs: Any) -> LeaseStore:
        store = real(*args, **kwargs)
        stores.append(store)
        return store

    monkeypatch.setattr(consensus_lease, "open_store", tracked)
    monkeypatch.setattr(consensus_lease.store, "open_store", tracked)
    yield stores
    for store in stores:
        store.close()


def _pg_url(base: str, schema: str) -> Callable[[re.Match[str]], str]:
    parts = urlsplit(base)

    def replace(match: re.Match[str]) -> str:
        query = dict(parse_qsl(urlsplit(match.group(0)).query))
        if "schema" in query:
            query["schema"] = schema
        else:
            query["options"] = f"-csearch_path={schema}"
        return f"{match.group(1)}://{parts.netloc}{parts.path}?{urlencode(query)}"

    return replace


def _run(block: Block, namespace: dict[str, Any], tmp_path: Path) -> None:
    code = block.code.replace("/var/lib/", f"{tmp_path}/var/lib/")
    if block.marker.startswith("postgresql"):
        code = PG_URL.sub(namespace["_pg_replace"], code)
    exec(compile(code, f"{block.path}:{block.line}", "exec"), namespace)
    then = block.marker.partition("then:")[2].strip()
    if then:
        exec(compile(then, f"{block.path}:{block.line} (then)", "exec"), namespace)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_docs_block(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    opened: list[LeaseStore]) -> None:
    if block.marker.startswith("compile-only"):
        compile(block.code, f"{block.path}:{block.line}", "exec")
        return
    include = re.fullmatch(r'--8<-- "(tests/[^":]+)(:\w+)?"', block.code.strip())
    if include:
        assert (ROOT / include.group(1)).is_file(), include.group(1)
        return  # that test file runs it
    (tmp_path / "var/lib/app").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    served: list[tuple[Any, ...]] = []
    try:
        import prometheus_client
    except ImportError:
        pass
    else:
        monkeypatch.setattr(prometheus_client, "REGISTRY", prometheus_client.CollectorRegistry())
        monkeypatch.setattr(prometheus_client, "start_http_server",
                            lambda *args, **kwargs: served.append((args, kwargs)))
    namespace: dict[str, Any] = {"__name__": "docs_block", **_stand_ins()}
    if block.marker.startswith("postgresql"):
        with _postgres_givens(namespace, opened) as ready:
            _run(block, ready, tmp_path)
        return
    url = f"sqlite:///{tmp_path}/var/lib/jobs.db"
    store = consensus_lease.store.open_store(url)
    opened.append(store)
    session = store.session("docs", ttl_s=10.0)
    namespace.update(store=store, session=session, url=url, lease=session.claim("given"))
    _run(block, namespace, tmp_path)


class _postgres_givens:
    """The PostgreSQL givens in a fresh schema (module docstring)."""

    def __init__(self, namespace: dict[str, Any], opened: list[LeaseStore]) -> None:
        self.namespace, self.opened = namespace, opened

    def __enter__(self) -> dict[str, Any]:
        import psycopg

        from consensus_lease.testing.postgresql import fresh_schema, postgres_url

        base = postgres_url()
        self._schema = fresh_schema(base)
        schema = self._schema.__enter__()
        replace = _pg_url(base, schema)
        db = PG_URL.sub(replace, base)
        self.conn = psycopg.connect(db, autocommit=True)
        self.conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        self.conn.execute("CREATE TABLE charges (invoice text, amount bigint, token bigint)")
        self.conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint)")
        store = consensus_lease.store.open_store(f"{base}?schema={schema}")
        self.opened.append(store)
        session = store.session("docs", ttl_s=10.0)
        self.namespace.update(
            store=store, session=session, url=f"{base}?schema={schema}", DB=db,
            conn=self.conn, lease=session.claim("given"), _pg_replace=replace,
        )
        return self.namespace

    def __exit__(self, *exc: object) -> None:
        for store in self.opened:
            store.close()
        self.opened.clear()
        self.conn.close()
        self._schema.__exit__(None, None, None)


def test_every_docstring_table_renders_as_a_markdown_table() -> None:
    """The site shows docstrings through docs/_ext/rst_roles.py: no reST simple table may
    come out as raw ``====`` rules (each becomes a pipe table with its header)."""
    import ast
    import importlib.util

    spec = importlib.util.spec_from_file_location("rst_roles", ROOT / "docs/_ext/rst_roles.py")
    assert spec is not None and spec.loader is not None
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    tables = 0
    for path in sorted((ROOT / "consensus_lease").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                              | ast.AsyncFunctionDef):
                continue
            doc = ast.get_docstring(node, clean=True) or ""
            if not any(roles._TABLE_RULE.match(line) for line in doc.split("\n")):
                continue
            tables += 1
            shown = roles.rewrite(doc).split("\n")
            where = f"{path.relative_to(ROOT)} {getattr(node, 'name', '(module)')}"
            assert not [line for line in shown if roles._TABLE_RULE.match(line)], where
            rows = [line for line in shown if line.startswith("|")]
            assert rows and all(r.count("``") % 2 == 0 for r in rows), where
    assert tables >= 15
