"""``consensus-lease upgrade-queue`` on the stores that need no upgrade step (SQLite,
memory) and through a driver that has one: output, exit statuses and one-line errors.
The real etcd upgrade is in tests/backends/test_etcd_queue_depth.py, ZooKeeper's refusal
in tests/backends/test_zookeeper_deep_queue.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from consensus_lease import open_store
from consensus_lease.admin import EXIT_OK, EXIT_USAGE
from consensus_lease.backends.memory import MemoryBackend
from consensus_lease.backends.sqlite import SqliteBackend
from consensus_lease.cli import main
from consensus_lease.errors import UnsupportedOperation


@pytest.fixture()
def url(tmp_path: Path) -> str:
    with open_store(f"sqlite:///{tmp_path}/leases.db") as store:
        store.enqueue_many("q", ["a", ("b", b"B")])
    return f"sqlite:///{tmp_path}/leases.db"


def test_sqlite_has_nothing_to_do_and_is_left_unchanged(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["upgrade-queue", "--backend", url, "q"]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "consensus-lease: error: UnsupportedOperation: the sqlite store upgrades its "
        "queues itself when opened: nothing to do"]
    with open_store(url) as store:
        assert [j.record.job_id for j in store.queue_jobs("q")] == ["a", "b"]
        assert store.queue_stats("q").available == 2


def test_the_default_raises_without_touching_the_store() -> None:
    backend = MemoryBackend()
    backend.enqueue("q", "a", b"")
    with pytest.raises(UnsupportedOperation, match=r"memory store .* nothing to do"):
        backend.upgrade_queue("q")
    assert [j.record.job_id for j in backend.queue_jobs("q")] == ["a"]


def test_a_driver_with_an_upgrade_step_prints_the_jobs_indexed(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def upgrade_queue(self: SqliteBackend, queue: str) -> int:
        asked.append(queue)
        return 3

    monkeypatch.setattr(SqliteBackend, "upgrade_queue", upgrade_queue)
    capsys.readouterr()
    assert main(["upgrade-queue", "--backend", url, "q"]) == EXIT_OK
    assert capsys.readouterr().out == "queue q: 3 open jobs indexed\n"
    assert asked == ["q"]


@pytest.mark.parametrize("args, message", [
    (["memory://", "q"], "lives inside one process"),
    (["sqlite:///{tmp}/missing.db", "q"], "InvalidArgument"),
    (["{url}", "bad\x00queue"], "InvalidArgument"),
])
def test_bad_input_is_a_usage_error_and_creates_nothing(
    args: list[str], message: str, url: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    backend, queue = (a.format(tmp=tmp_path, url=url) for a in args)
    capsys.readouterr()
    assert main(["upgrade-queue", "--backend", backend, queue]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1 and message in captured.err
    assert not (tmp_path / "missing.db").exists()


def test_the_queue_is_required(url: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["upgrade-queue", "--backend", url])
    assert exc.value.code == EXIT_USAGE
