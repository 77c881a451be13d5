"""``lease.transaction(conn)`` on SQLite refuses connections that cannot carry it with
``InvalidArgument`` (a configuration error, never a retryable ``BackendUnavailable``),
and the lease stays held."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from consensus_lease import InvalidArgument, open_store


def test_a_read_only_connection_is_invalid_not_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with open_store(f"sqlite:///{path}") as store, store.session("A", 10.0) as a:
        lease = a.claim("job")
        assert lease is not None
        ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        try:
            with pytest.raises(InvalidArgument, match="cannot write"):
                with lease.transaction(ro):
                    pytest.fail("the block must not run")
        finally:
            ro.close()
        lease.ensure_held()
        lease.complete()


def test_a_second_block_on_the_same_connection_names_the_open_block(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with open_store(f"sqlite:///{path}") as store, store.session("A", 10.0) as a:
        one, two = a.claim("one"), a.claim("two")
        assert one is not None and two is not None
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            with one.transaction(conn):
                with pytest.raises(InvalidArgument, match=r"another lease\.transaction"):
                    with two.transaction(conn):
                        pytest.fail("the block must not run")
        finally:
            conn.close()
        two.ensure_held()
        one.complete()
        two.complete()
