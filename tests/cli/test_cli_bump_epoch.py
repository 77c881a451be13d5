"""``consensus-lease bump-epoch``: output, the effect on tokens, bad input and errors
(one line each, the admin exit statuses); ``inspect`` shows the epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

from consensus_lease import open_store
from consensus_lease.admin import EXIT_UNAVAILABLE, EXIT_USAGE
from consensus_lease.backend import Backend
from consensus_lease.backends.memory import MemoryBackend
from consensus_lease.cli import main


@pytest.fixture()
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/leases.db"


def bump(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    capsys.readouterr()
    assert main(["bump-epoch", *args]) == 0
    return capsys.readouterr().out.splitlines()


def epoch_of(url: str) -> int:
    with open_store(url) as store:
        return store.epoch()


def test_bump_prints_old_new_and_lowest_next_token(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bump(capsys, "--backend", url) == [
        "old epoch: 0", "new epoch: 1", f"lowest next token: {2**32}"]
    above = 10_000_000_000  # epoch part 2
    assert bump(capsys, "--backend", url, "--above", str(above)) == [
        "old epoch: 1", "new epoch: 3", f"lowest next token: {3 << 32}"]
    with open_store(url) as store, store.session("W", 30.0) as session:
        lease = session.claim("after")
        assert lease is not None and lease.generation > above
        lease.release()


def test_inspect_title_shows_the_epoch(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    bump(capsys, "--backend", url, "--above", str(5 << 32))
    assert main(["inspect", "--backend", url]) == 0
    assert "(store epoch 6)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("bad", ["-1", "x", "1.5", str(2**63), ""])
def test_bad_above_is_a_usage_error(
    url: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bump-epoch", "--backend", url, "--above", bad])
    assert exc.value.code == EXIT_USAGE
    assert epoch_of(url) == 0


def test_errors_are_one_line_with_their_exit_status(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    capsys.readouterr()
    assert main(["bump-epoch", "--backend", url, "--above", str(2**63 - 1)]) == EXIT_USAGE
    assert main(["bump-epoch", "--backend", f"sqlite:///{tmp_path}/no/such/dir/x.db"]
                ) == EXIT_UNAVAILABLE
    monkeypatch.setattr(MemoryBackend, "epoch", Backend.epoch)
    assert main(["bump-epoch", "--backend", "memory://"]) == EXIT_USAGE
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert captured.out == "" and len(err) == 3
    assert "InvalidArgument" in err[0] and "2**63" in err[0]
    assert "BackendUnavailable" in err[1]
    assert "UnsupportedOperation" in err[2]
    assert epoch_of(url) == 0


def test_help_names_every_occasion_and_only_its_exit_statuses(
    capsys: pytest.CaptureFixture[str]
) -> None:
    """``--help``: a restore is not the only reason to bump (a PostgreSQL failover, any
    StoreRegressed), and the exit statuses are bump-epoch's own: it refuses no job, so no 1."""
    with pytest.raises(SystemExit):
        main(["bump-epoch", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for occasion in ("restoring the store", "PostgreSQL failover or switchover",
                     "StoreRegressed"):
        assert occasion in text, text
    assert "exit status: 0 epoch bumped" in text and "69 store unreachable" in text, text
    assert "jobs refused" not in text and "; 1 " not in text, text
