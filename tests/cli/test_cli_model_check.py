"""``consensus-lease model-check``: one configuration checked with a progress bar; a
mutation's counterexample printed as a timeline, exit 1."""

from __future__ import annotations

import pytest

from consensus_lease.cli import main


def test_a_clean_configuration_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model-check", "--workers", "2", "--depth", "6", "--skip-mutations"]) == 0
    out = capsys.readouterr().out
    assert "2 workers: " in out and "depth 6" in out and "0 violations" in out


def test_a_mutation_prints_its_counterexample_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["model-check", "--workers", "2", "--depth", "8", "--skip-mutations",
            "--mutation", "deadline-from-receive"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "VIOLATION: w0 sent an effect before its local deadline" in out
    assert "receives the answer OK to w0's claim" in out


@pytest.mark.parametrize("bad", [["--mutation", "no-such-rule"], ["--workers", "0"],
                                 ["--workers", "two"], ["--depth", "-1"]])
def test_bad_arguments_are_a_usage_error(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["model-check", "--workers", "2", *bad])
    assert stopped.value.code == 2
