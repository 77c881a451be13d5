"""A run directory holds one run: a directory that already holds a run's files is refused.

The history parts pair each operation's invocation with its return by ``(process,
index)``, and every run uses the same process names (``w0``, ``nemesis``, ...). A second
run appending to the first one's parts would mix the two histories, and an operation of
the new run that never returned could take the old run's result for the same key, hiding
an unresolved write. So: the run directory is refused before anything starts (API and
command line, exit status 2), a part file is created exclusively, and a part that records
one key twice is refused by the merge instead of being paired.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from consensus_lease import InvalidArgument
from consensus_lease.verify import runner
from consensus_lease.verify.history import INDETERMINATE, HistoryWriter, read_parts
from consensus_lease.verify.lockset import LockSetConfig, run_lockset
from consensus_lease.verify.runner import (
    RUN_FILES,
    VerifyConfig,
    claim_run_dir,
    run_files,
    run_verify,
)


def _tiny(run_dir: Path) -> VerifyConfig:
    """A run of a few seconds (no faults) if it were not refused."""
    return VerifyConfig(workers=1, jobs=2, steps=1, duration_s=0.0, quiet_s=5.0, faults=(),
                        think_s=0.01, run_dir=str(run_dir))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _earlier_run(run_dir: Path) -> dict[str, bytes]:
    """What an earlier run leaves: its parts, logs and history (the lines of one
    operation of ``w0`` that returned ``accepted``)."""
    claim_run_dir(run_dir)
    rec = HistoryWriter(run_dir / "parts" / "w0.jsonl", "w0")
    rec.ret(rec.invoke("write", job="v1-j000", generation=3, effect_id="step-0"), "accepted")
    rec.close()
    (run_dir / "logs" / "w0.log").write_text("earlier run\n", encoding="utf-8")
    (run_dir / "history.jsonl").write_text("{}\n", encoding="utf-8")
    return _snapshot(run_dir)


def test_a_second_run_in_the_same_run_dir_is_refused_and_changes_nothing(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    before = _earlier_run(run_dir)
    with pytest.raises(InvalidArgument) as refused:
        run_verify(_tiny(run_dir))
    text = str(refused.value)
    assert f"{run_dir} already holds a run's files (history.jsonl, logs/, parts/)" in text
    assert "pass a new or empty directory" in text
    assert _snapshot(run_dir) == before  # nothing appended, created or replaced
    assert sorted(p.name for p in run_dir.iterdir()) == ["history.jsonl", "logs", "parts"]


def test_the_lock_set_workload_refuses_it_too(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    before = _earlier_run(run_dir)
    with pytest.raises(InvalidArgument, match="already holds a run's files"):
        run_lockset(LockSetConfig(workers=1, duration_s=0.0, run_dir=str(run_dir)))
    assert _snapshot(run_dir) == before


@pytest.mark.parametrize("name", [*RUN_FILES, "store.db-wal", "destination.db-journal"])
def test_each_of_a_run_s_files_marks_a_used_run_dir(tmp_path: Path, name: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine\n", encoding="utf-8")  # not a run's file
    if name in ("parts", "logs"):
        (run_dir / name).mkdir()
        shown = f"{name}/"
    else:
        (run_dir / name).write_bytes(b"")
        shown = name
    assert run_files(run_dir) == [shown]
    with pytest.raises(InvalidArgument, match=rf"already holds a run's files \({shown}\)"):
        claim_run_dir(run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(["notes.txt", name])


def test_a_new_or_empty_run_dir_or_one_without_a_run_s_files_is_taken(tmp_path: Path) -> None:
    empty, other = tmp_path / "empty", tmp_path / "other"
    empty.mkdir()
    other.mkdir()
    (other / "README").write_text("x\n", encoding="utf-8")
    for run_dir in (tmp_path / "new" / "run", empty, other):
        assert run_files(run_dir) == []
        parts, logs = claim_run_dir(run_dir)
        assert (parts, logs) == (run_dir / "parts", run_dir / "logs")
        assert parts.is_dir() and logs.is_dir()
        assert run_files(run_dir) == ["logs/", "parts/"]


def test_a_run_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x\n", encoding="utf-8")
    with pytest.raises(InvalidArgument, match="is not a directory"):
        claim_run_dir(path)


def test_of_two_runs_started_at_once_in_one_dir_the_second_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both checked the directory before either created its parts: ``parts/`` is created
    exclusively, so the one that comes second is refused."""
    run_dir = tmp_path / "run"
    claim_run_dir(run_dir)  # the first run
    real = runner.run_files
    calls: list[Path] = []

    def checked_before_the_first_run_began(path: Path) -> list[str]:
        calls.append(path)
        return [] if len(calls) == 1 else real(path)

    monkeypatch.setattr(runner, "run_files", checked_before_the_first_run_began)
    with pytest.raises(InvalidArgument, match=r"already holds a run's files \(logs/, parts/\)"):
        claim_run_dir(run_dir)


def test_the_command_refuses_a_used_run_dir_with_exit_status_2(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    before = _earlier_run(run_dir)
    done = subprocess.run(
        [sys.executable, "-m", "consensus_lease.verify", "--workers", "1", "--jobs", "2",
         "--steps", "1", "--duration-s", "0", "--quiet-s", "5", "--faults", "",
         "--think-s", "0.01", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=120)
    out = " ".join(done.stdout.split())
    assert done.returncode == 2, done.stdout + done.stderr
    assert "InvalidArgument" in out and "already holds a run's files" in out, out
    assert "pass a new or empty directory" in out, out
    assert "INCONCLUSIVE" not in out, out  # refused before any run
    assert _snapshot(run_dir) == before


def test_a_part_file_is_created_never_appended_to(tmp_path: Path) -> None:
    part = tmp_path / "w0.jsonl"
    part.write_text("", encoding="utf-8")
    with pytest.raises(FileExistsError):
        HistoryWriter(part, "w0")


def test_a_part_holding_two_runs_is_refused_not_paired(tmp_path: Path) -> None:
    """Run 1's ``w0`` operation 1 returned accepted; run 2's ``w0`` operation 1 was cut
    short (SIGKILL). Paired by key, run 2's would take run 1's result and look accepted:
    the merge refuses the part instead."""
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    rec = HistoryWriter(first, "w0")
    rec.ret(rec.invoke("write", job="v1-j000", generation=3), "accepted")
    rec.close()
    rec = HistoryWriter(second, "w0")
    rec.invoke("write", job="v2-j000", generation=1)  # never returned
    rec.close()
    (op,) = read_parts([second])
    assert op.outcome == INDETERMINATE
    mixed = tmp_path / "w0.jsonl"
    mixed.write_bytes(first.read_bytes() + second.read_bytes())  # what appending made
    with pytest.raises(ValueError, match="invoke of operation 1 of w0 recorded twice"):
        read_parts([mixed])
