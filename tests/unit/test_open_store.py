"""Opening stores: URLs, options and unusable files fail with named errors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from consensus_lease import (
    BackendUnavailable,
    InvalidArgument,
    JobState,
    UnsupportedBackend,
    open_store,
)
from consensus_lease import errors as errors_module


@pytest.mark.parametrize("url", ["", "nonsense", "mysql://x", "sqlite:", 42])
def test_bad_urls_name_the_supported_schemes(url: object) -> None:
    with pytest.raises(UnsupportedBackend) as exc:
        open_store(url)  # type: ignore[arg-type]
    assert "sqlite" in str(exc.value) and "memory" in str(exc.value)


def test_a_sqlalchemy_url_is_answered_with_the_store_url() -> None:
    """``scripts/start-postgres.sh`` exports a SQLAlchemy URL (for the SQL fence); given to
    open_store, the error says which store URL that is, without the password."""
    with pytest.raises(UnsupportedBackend) as exc:
        open_store("postgresql+psycopg://u:secret@127.0.0.1:1/db")
    assert "the store URL is the same with 'postgresql://'" in str(exc.value)
    assert "secret" not in str(exc.value)
    with pytest.raises(UnsupportedBackend) as exc:
        open_store("mysql+pymysql://u@127.0.0.1/db")  # no such store: no hint
    assert "dialect+driver" not in str(exc.value)


def test_unknown_option_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        open_store(f"sqlite:///{tmp_path}/x.db?colour=blue")
    with pytest.raises(InvalidArgument):
        open_store("memory://", colour="blue")
    with pytest.raises(InvalidArgument):
        open_store(f"sqlite:///{tmp_path}/x.db", busy_timeout_s="-1")


def test_relative_and_absolute_sqlite_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///rel.db"):
        pass
    assert (tmp_path / "rel.db").exists()
    with open_store(f"sqlite:///{tmp_path}/abs.db"):
        pass
    assert (tmp_path / "abs.db").exists()


def test_a_nul_in_a_sqlite_path_is_invalid_argument(tmp_path: Path) -> None:
    """sqlite3 raised a bare ValueError; the path is not percent-decoded, so ``%00`` is
    three characters of a file name."""
    with pytest.raises(InvalidArgument, match="NUL"):
        open_store(f"sqlite:///{tmp_path}/a\x00b.db")
    assert list(tmp_path.iterdir()) == []
    with open_store(f"sqlite:///{tmp_path}/a%00b.db"):
        pass
    assert [p.name for p in tmp_path.iterdir()] == ["a%00b.db"]


def test_unreadable_or_corrupt_file_is_backend_unavailable(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable):
        open_store(f"sqlite:///{tmp_path}/missing-dir/x.db")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(BackendUnavailable):
        open_store(f"sqlite:///{junk}")


def test_locked_file_is_backend_unavailable_and_changes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db?busy_timeout_s=0.2"
    store = open_store(url)
    session = store.session("A", 30)
    blocker = sqlite3.connect(str(tmp_path / "x.db"), isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(BackendUnavailable):
            session.claim("job")
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert store.get("job") is None
    lease = session.claim("job")
    assert lease is not None and lease.generation == 1
    record = store.get("job")
    assert record is not None and record.state is JobState.HELD
    session.close()
    store.close()


def test_error_module_all_is_sorted_complete_and_drawn() -> None:
    names = errors_module.__all__
    assert list(names) == sorted(names)
    classes = {
        n for n, v in vars(errors_module).items()
        if isinstance(v, type) and issubclass(v, Exception) and v.__module__ == errors_module.__name__
    }
    assert set(names) == classes
    assert errors_module.__doc__ is not None
    for name in names:
        assert name in errors_module.__doc__, f"{name} missing from the error tree"


def test_closing_a_store_closes_its_sessions_and_refuses_later_use() -> None:
    from consensus_lease import LeaseLost, StoreClosed

    store = open_store("memory://")
    session = store.session("A", 30)
    lease = session.claim("j")
    assert lease is not None and not store.closed
    store.close()
    assert store.closed
    with pytest.raises(LeaseLost):
        lease.ensure_held()
    for call in (lambda: store.session("B", 30), lambda: store.get("j"), store.records,
                 lambda: store.enqueue("q", "x")):
        with pytest.raises(StoreClosed):
            call()
    store.close()  # idempotent


@pytest.mark.parametrize("bad", [10**400, -(10**400)])
def test_huge_ints_are_invalid_not_overflow(bad: int) -> None:
    with open_store("memory://") as store:
        with pytest.raises(InvalidArgument):
            store.session("A", bad)
        with store.session("A", 30) as session, pytest.raises(InvalidArgument):
            session.claim("j", wait_s=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_bad_limits(bad: object) -> None:
    with open_store("memory://") as store, pytest.raises(InvalidArgument):
        store.records(limit=bad)  # type: ignore[arg-type]


def test_bad_keyword_objects_and_callbacks() -> None:
    with pytest.raises(InvalidArgument):
        open_store("memory://", clock="not a clock")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        open_store("memory://", observer=5)  # type: ignore[arg-type]
    with open_store("memory://") as store, store.session("A", 30) as session:
        with pytest.raises(InvalidArgument):
            session.on_lost(None)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            session.claim_many("abc")
        lease = session.claim("j")
        assert lease is not None
        too_big = b"x" * (store.capabilities.max_payload_bytes + 1)
        with pytest.raises(InvalidArgument):
            lease.complete(too_big)
        lease.ensure_held()
