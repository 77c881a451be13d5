"""``consensus-lease worker``'s bad numbers, in this process (nothing is started): each is
refused with exit status 2 and a message naming its flag, or its environment variable
when that was the source; the TTL against the store's own range, before it is opened."""

from __future__ import annotations

from pathlib import Path

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


@pytest.mark.parametrize("value", ["0.01", "1e9"])
def test_a_ttl_outside_the_stores_range_exits_2_naming_the_flag_and_range(
        value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Checked against the backend's capabilities before the store is opened: the
    SQLite file is not even made."""
    db = tmp_path / "store.db"
    assert main(_worker(f"sqlite:///{db}", "--ttl-s", value)) == 2
    out = _flat(capsys.readouterr().out)
    assert f"--ttl-s {float(value):g} is outside the sqlite store's TTL range [0.05, 604800] s" \
        in out, out
    assert not db.exists()


def test_a_ttl_variable_outside_the_range_names_the_variable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSENSUS_LEASE_TTL_S", "0.0001")
    assert main(_worker("memory://")) == 2
    out = _flat(capsys.readouterr().out)
    assert ("environment variable CONSENSUS_LEASE_TTL_S=0.0001 is outside the memory "
            "store's TTL range [0.001, 604800] s") in out, out


def test_a_ttl_in_range_and_an_unknown_scheme_are_left_to_the_worker(
        tmp_path: Path) -> None:
    """No backend for the URL: the pre-check says nothing (the worker reports the store
    error as before); a TTL within the range passes."""
    command.check_ttl_range({"backend": "nosuch://x", "ttl_s": 0.01}, 0.01)
    command.check_ttl_range({"backend": f"sqlite:///{tmp_path}/s.db", "ttl_s": 5.0}, 5.0)
    assert not (tmp_path / "s.db").exists()
