"""Every subcommand takes numbers as the worker's flags do: ASCII digits, no underscores
(``int()`` and ``float()`` also take ``"1_0"`` and other scripts' digits)."""

from __future__ import annotations

import pytest

from consensus_lease.cli import main


@pytest.mark.parametrize("argv", [
    ["demo", "--ttl-s", "\u0663"],
    ["demo", "--ttl-s", "1_0"],
    ["inspect", "--backend", "memory://", "--limit", "1_0"],
    ["enqueue", "--backend", "memory://", "--queue", "q", "--max-attempts", "\u0663", "j"],
    ["run", "--backend", "memory://", "--job", "j", "--ttl-s", "\uff13", "--", "true"],
    ["run", "--backend", "memory://", "--job", "j", "--wait-s", "1e300", "--", "true"],
    ["model-check", "--depth", "\u0663"],
    ["bench", "--zk-tick-ms", "2_50"],
])
def test_odd_numbers_are_refused_naming_the_flag(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code in (2, 64)  # (run's usage errors exit 64)
    err = capsys.readouterr().err
    flag = next(a for a in argv if a.startswith("--") and a not in ("--backend", "--queue",
                                                                     "--job", "--"))
    assert f"argument {flag}:" in err and ("not a" in err or "at most" in err), err
