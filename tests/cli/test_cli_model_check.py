"""``consensus-lease model-check``: one configuration checked (off a terminal, progress
is a line per depth); a mutation's counterexample printed as a timeline and counted as
caught (exit 0), a mutation not caught at the depth given exits 1; options that need
``--workers`` are refused without it."""

from __future__ import annotations

import pytest

from consensus_lease.cli import main


def test_a_clean_configuration_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model-check", "--workers", "2", "--depth", "6", "--skip-mutations"]) == 0
    out = capsys.readouterr().out
    assert "2 workers: " in out and "depth 6" in out and "0 violations" in out
    assert "2 workers: depth 1/6, " in out and "2 workers: depth 6/6, " in out  # progress


def test_a_mutation_prints_its_counterexample_and_counts_as_caught(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["model-check", "--workers", "2", "--depth", "8", "--skip-mutations",
            "--mutation", "deadline-from-receive"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "counterexample found, as it must be with --mutation" in out
    assert "VIOLATION: w0 sent an effect before its local deadline" in out
    assert "receives the answer OK to w0's claim" in out


def test_a_mutation_not_caught_at_the_depth_given_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["model-check", "--workers", "2", "--depth", "2", "--skip-mutations",
            "--mutation", "deadline-from-receive"]
    assert main(args) == 1
    assert "NO counterexample: the mutation was not caught" in capsys.readouterr().out


@pytest.mark.parametrize("alone", [["--depth", "5"], ["--rmw"], ["--no-loss"],
                                   ["--mutation", "deadline-from-receive"]])
def test_options_of_one_configuration_need_workers(
    alone: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model-check", "--skip-mutations", *alone]) == 2
    out = capsys.readouterr().out
    assert "InvalidArgument" in out and "--workers" in out and alone[0] in out


@pytest.mark.parametrize("bad", [["--mutation", "no-such-rule"], ["--workers", "0"],
                                 ["--workers", "two"], ["--depth", "-1"]])
def test_bad_arguments_are_a_usage_error(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["model-check", "--workers", "2", *bad])
    assert stopped.value.code == 2
