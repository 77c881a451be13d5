"""``consensus-lease worker``'s flags and variables, in this process or as a cheap
subprocess (nothing started, no cluster): a flag wins over a malformed variable; bad
values exit 2 naming their flag or variable, before anything is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from consensus_lease.cli import main


def _worker(url: str, *extra: str, handler: str = "no_such_module:handler") -> list[str]:
    return ["worker", "--backend", url, "--queue", "q", *extra, handler]


def _flat(text: str) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(text.split())


# -- 1. a flag wins over a malformed variable ---------------------------------------

OVERRIDDEN = [
    ("CONSENSUS_LEASE_CONCURRENCY", "2000", ("--concurrency", "2")),
    ("CONSENSUS_LEASE_PREFETCH", "999", ("--prefetch", "1")),
    ("CONSENSUS_LEASE_CLAIM_WAIT_S", "0", ("--claim-wait-s", "0.05")),
    ("CONSENSUS_LEASE_UNTIL_EMPTY", "maybe", ("--until-empty",)),
    ("CONSENSUS_LEASE_QUEUE", "", ("--queue", "q")),
    ("CONSENSUS_LEASE_TTL_S", "-1", ("--ttl-s", "5")),
    ("CONSENSUS_LEASE_METRICS_PORT", "x", ("--metrics-port", "9125")),
]


@pytest.mark.parametrize(("variable", "value", "flag"), OVERRIDDEN)
def test_a_flag_wins_over_its_malformed_variable(
        variable: str, value: str, flag: tuple[str, ...], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable is not read when its flag is given: the run gets as far as the
    handler's import (exit 1 naming the module), never exit 2 for the variable."""
    from consensus_lease.worker import command

    monkeypatch.setenv(variable, value)
    monkeypatch.setattr(command, "serve_metrics", lambda *a, **k: None)
    assert main(_worker("memory://", *flag)) == 1
    out = _flat(capsys.readouterr().out)
    assert variable not in out, out
    assert "no_such_module" in out, out


def test_a_malformed_variable_without_its_flag_is_still_refused(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSENSUS_LEASE_UNTIL_EMPTY", "maybe")
    assert main(_worker("memory://")) == 2
    assert "environment variable CONSENSUS_LEASE_UNTIL_EMPTY" in _flat(capsys.readouterr().out)
