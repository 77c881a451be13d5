"""``consensus-lease worker``'s bad numbers, in this process (nothing is started): each is
refused with exit status 2 and a message naming its flag, or its environment variable
when that was the source."""

from __future__ import annotations

import pytest

from consensus_lease.cli import main
from consensus_lease.errors import InvalidArgument
from consensus_lease.worker import command, config

OUT_OF_RANGE = [
    ("--concurrency", "2000"), ("--concurrency", "0"), ("--claim-wait-s", "1e12"),
    ("--claim-wait-s", "0"), ("--grace-s", "-1"), ("--ttl-s", "-1"), ("--prefetch", "300"),
    ("--complete-batch", "20000"), ("--complete-flush-s", "100"),
    ("--max-attempts", "99999999999"), ("--retry-initial-s", "1e12"),
    ("--retry-max-s", "1e12"), ("--metrics-port", "70000"),
]


def _worker(url: str, *extra: str) -> list[str]:
    return ["worker", "--backend", url, "--queue", "q", *extra, "no_such_module:handler"]


def _flat(text: str) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(text.split())


@pytest.mark.parametrize(("flag", "value"), OUT_OF_RANGE)
def test_a_flag_out_of_range_names_the_flag(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(_worker("memory://", flag, value))
    assert exited.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), OUT_OF_RANGE)
def test_a_variable_out_of_range_names_the_variable(
        flag: str, value: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    variable = config.ENVIRONMENT[flag[2:].replace("-", "_")][0]
    monkeypatch.setenv(variable, value)
    assert main(_worker("memory://")) == 2
    assert f"environment variable {variable}: " in _flat(capsys.readouterr().out)


def test_the_concurrency_limit_is_in_the_flags_message(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(_worker("memory://", "--concurrency", "2000"))
    assert ("argument --concurrency: concurrency must be an int from 1 to 1024, not 2000"
            in capsys.readouterr().err)


def test_check_arguments_names_the_source_of_what_the_parsers_let_through(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The backstop behind the parsers: run_worker's own range checks, per field, named
    by flag (or, when the flag was not given, by its variable)."""
    arguments = command.worker_arguments({"backend": "memory://", "queue": "q",
                                          "handler": "m:f", "concurrency": 2000})
    with pytest.raises(InvalidArgument, match=r"^--concurrency: concurrency must be an int"):
        command.check_arguments(arguments)
    args = command.add_parser(_subparsers()).parse_args(["m:f"])
    with pytest.raises(InvalidArgument, match=r"^CONSENSUS_LEASE_CONCURRENCY: concurrency"):
        command.check_arguments(arguments, args)


def _subparsers() -> object:
    import argparse

    return argparse.ArgumentParser().add_subparsers()
