"""``consensus-lease worker``'s flags and variables, in this process or as a cheap
subprocess (nothing started, no cluster): a flag wins over a malformed variable; bad
values exit 2 naming their flag or variable, before anything is created."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from consensus_lease.cli import main
from consensus_lease.errors import InvalidArgument
from consensus_lease.worker import run_worker

REPO = Path(__file__).resolve().parents[2]


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


# -- 3. a handler module that fails to import: one line, naming module and type ------

BROKEN_MODULES = {
    "raises_base": ("class Boom(BaseException):\n    pass\n\nraise Boom('from the module')\n",
                    "importing it raised Boom: from the module"),
    "raises_lines": ("raise RuntimeError('first line\\nsecond line\\nthird')\n",
                     "importing it raised RuntimeError: first line / second line / third"),
    "raises_bad_str": ("class Odd(Exception):\n    def __str__(self):\n"
                       "        raise ValueError('nested')\n\nraise Odd()\n",
                       "importing it raised Odd: <str() of it raised ValueError>"),
}


def _write_modules(directory: Path, prefix: str) -> None:
    for name, (code, _) in BROKEN_MODULES.items():
        (directory / f"{prefix}{name}.py").write_text(code + "\ndef handle(lease, payload):\n"
                                                      "    return b''\n")


@pytest.mark.parametrize("name", sorted(BROKEN_MODULES))
def test_load_handler_folds_any_import_failure_into_one_line(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from consensus_lease.errors import InvalidArgument
    from consensus_lease.worker.handler import load_handler

    _write_modules(tmp_path, "lh_")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidArgument) as raised:
        load_handler(f"lh_{name}:handle")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"cannot import the handler's module 'lh_{name}': "), message
    assert BROKEN_MODULES[name][1] in message, message


@pytest.mark.parametrize("exc", ["KeyboardInterrupt", "SystemExit"])
def test_load_handler_lets_keyboard_interrupt_and_system_exit_through(
        exc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from consensus_lease.worker.handler import load_handler

    (tmp_path / f"lh_exit_{exc}.py").write_text(f"raise {exc}()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BaseException) as raised:  # the exact type is checked below
        load_handler(f"lh_exit_{exc}:handle")
    assert type(raised.value).__name__ == exc


def _run_cli(cwd: Path, *argv: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONSENSUS_LEASE_")}
    environ.update({"PYTHONPATH": str(REPO), "COLUMNS": "500", **(env or {})})
    return subprocess.run([sys.executable, "-m", "consensus_lease.cli", *argv], cwd=cwd,
                          env=environ, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("processes", [False, True])
@pytest.mark.parametrize("name", [*sorted(BROKEN_MODULES), "no_such_module"])
def test_a_handler_that_cannot_be_imported_is_one_line_and_nothing_is_created(
        name: str, processes: bool, tmp_path: Path) -> None:
    """Thread and process mode alike: one error line naming the module, exit 1, before
    the SQLite file is made or a process spawned."""
    _write_modules(tmp_path, "")
    db = tmp_path / "store.db"
    flags = ["--processes", "--concurrency", "2"] if processes else []
    done = _run_cli(tmp_path, *_worker(f"sqlite:///{db}", *flags, handler=f"{name}:handle"))
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert len(lines) == 1, lines
    assert f"cannot import the handler's module {name!r}" in lines[0]
    if name in BROKEN_MODULES:
        assert BROKEN_MODULES[name][1] in lines[0]
    assert not db.exists()


def test_a_process_mode_handler_object_that_cannot_be_sent_creates_nothing(
        tmp_path: Path) -> None:
    from consensus_lease.errors import InvalidArgument
    from consensus_lease.worker import run_worker

    db = tmp_path / "store.db"
    with pytest.raises(InvalidArgument, match="importable by name"):
        run_worker(f"sqlite:///{db}", "q", lambda lease, payload: b"", mode="process")
    assert not db.exists()


# -- 7. run_worker refuses a TTL out of the store's range before opening it ----------

@pytest.mark.parametrize("mode", ["thread", "process"])
def test_run_worker_refuses_a_ttl_out_of_range_before_creating_the_store(
        mode: str, tmp_path: Path) -> None:
    from consensus_lease.errors import InvalidArgument
    from consensus_lease.worker import run_worker

    db = tmp_path / "store.db"
    with pytest.raises(InvalidArgument, match="ttl"):
        run_worker(f"sqlite:///{db}", "q", "no_such_module:handle", ttl_s=0.01,
                   mode=mode)  # type: ignore[arg-type]
    assert not db.exists()


# -- 4. numbers: ASCII digits only, no underscores -----------------------------------

FLOAT_FLAGS = ["--ttl-s", "--grace-s", "--claim-wait-s", "--complete-flush-s",
               "--retry-initial-s", "--retry-max-s"]
ODD_NUMBERS = ["1_0", "\u0661\u0660", "\uff11", "3\x0b"]


@pytest.mark.parametrize("value", ODD_NUMBERS)
@pytest.mark.parametrize("flag", [*FLOAT_FLAGS, "--metrics-port"])
def test_underscores_and_non_ascii_digits_are_not_numbers(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    if flag == "--metrics-port":
        value = value.replace("1_0", "1_9125")
    with pytest.raises(SystemExit) as exited:
        main(_worker("memory://", flag, value))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: not a" in err, err


@pytest.mark.parametrize("value", ODD_NUMBERS)
def test_a_variable_with_underscores_is_not_a_number(
        value: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSENSUS_LEASE_GRACE_S", value)
    assert main(_worker("memory://")) == 2
    assert ("environment variable CONSENSUS_LEASE_GRACE_S: not a number of seconds"
            in _flat(capsys.readouterr().out))


def test_plain_numbers_still_parse() -> None:
    from consensus_lease.worker import config

    assert config.parse_seconds(" 1.5e1 ") == 15.0
    assert config.parse_seconds(".5") == 0.5
    assert config.parse_port(" 9125 ") == 9125
    assert config.parse_port("+80") == 80


# -- 5. a TTL just outside the range is printed as given ------------------------------

@pytest.mark.parametrize("value", ["604800.001", "0.0499999"])
def test_a_ttl_just_outside_the_range_is_not_rounded_to_its_bound(
        value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "store.db"
    assert main(_worker(f"sqlite:///{db}", "--ttl-s", value)) == 2
    out = _flat(capsys.readouterr().out)
    assert f"--ttl-s {value} is outside the sqlite store's TTL range [0.05, 604800] s" in out
    assert not db.exists()


# -- 6. bad store URLs, handler specs, log levels, metrics addresses: exit 2, named --

def _no_psycopg(directory: Path) -> Path:
    """A directory that, first on the path, makes ``import psycopg`` fail as if the
    postgresql extra were not installed."""
    package = directory / "blocked" / "psycopg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'psycopg'\", name='psycopg')\n")
    return package.parent


def test_a_missing_extra_exits_2_with_the_pip_install_line(tmp_path: Path) -> None:
    blocked = _no_psycopg(tmp_path)
    done = _run_cli(tmp_path, *_worker("postgresql://u@127.0.0.1:1/db"),
                    env={"PYTHONPATH": f"{blocked}{os.pathsep}{REPO}"})
    out = _flat(done.stdout + done.stderr)
    assert done.returncode == 2, out
    assert "--backend: " in out and "pip install 'consensus_lease[postgresql]'" in out, out
    assert "Traceback" not in out


@pytest.mark.parametrize("url", ["bogus://x", "not-a-url"])
def test_a_url_no_backend_serves_exits_2_naming_the_flag(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_worker(url)) == 2
    assert _flat(capsys.readouterr().out).startswith("error: --backend: "), url


def test_a_url_variable_no_backend_serves_names_the_variable(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSENSUS_LEASE_URL", "bogus://x")
    assert main(["worker", "--queue", "q", "m:f"]) == 2
    assert "error: CONSENSUS_LEASE_URL: no backend for scheme 'bogus'" in _flat(
        capsys.readouterr().out)


@pytest.mark.parametrize("spec", ["nocolon", ":f", "m:"])
def test_a_malformed_handler_spec_exits_2_naming_the_argument(
        spec: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(_worker("memory://", handler=spec)) == 2
    assert "error: MODULE:FUNCTION: handler must be 'package.module:function'" in _flat(
        capsys.readouterr().out)
    monkeypatch.setenv("CONSENSUS_LEASE_HANDLER", spec)
    assert main(["worker", "--backend", "memory://", "--queue", "q"]) == 2
    assert "error: CONSENSUS_LEASE_HANDLER: handler must be" in _flat(capsys.readouterr().out)


def test_a_bad_log_level_names_its_flag_or_variable(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(_worker("memory://", "--log-level", "bogus")) == 2
    assert "error: --log-level: not a log level" in _flat(capsys.readouterr().out)
    monkeypatch.setenv("CONSENSUS_LEASE_LOG_LEVEL", "bogus")
    assert main(_worker("memory://")) == 2
    assert "error: CONSENSUS_LEASE_LOG_LEVEL: not a log level" in _flat(
        capsys.readouterr().out)


@pytest.mark.parametrize(("value", "says"), [
    ("\u0663", "not a log level"), ("notset", "not a log level"),
    ("0", "must be from 1 to 50"), ("51", "must be from 1 to 50"),
    ("99999999999999999999", "must be from 1 to 50"),
])
def test_a_log_level_is_a_name_or_an_ascii_number_from_1_to_50(
        value: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_worker("memory://", "--log-level", value)) == 2
    assert says in _flat(capsys.readouterr().out)


def test_log_levels_by_name_and_number_still_parse() -> None:
    from consensus_lease.worker.logs import parse_level

    assert [parse_level(t) for t in ("debug", "WARNING", "15", "50")] == [10, 30, 15, 50]


def test_a_grace_period_past_what_a_thread_can_wait_is_refused(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """A thread's wait overflows past ``threading.TIMEOUT_MAX``: refused up front, by flag,
    variable and ``run_worker`` alike, before the store is created."""
    with pytest.raises(SystemExit) as exited:
        main(_worker("memory://", "--grace-s", "1e300"))
    assert exited.value.code == 2
    assert "argument --grace-s: grace_s must be at most" in capsys.readouterr().err
    monkeypatch.setenv("CONSENSUS_LEASE_GRACE_S", "1e300")
    assert main(_worker("memory://")) == 2
    assert "CONSENSUS_LEASE_GRACE_S: grace_s must be at most" in _flat(capsys.readouterr().out)
    db = tmp_path / "store.db"
    with pytest.raises(InvalidArgument, match="grace_s must be at most"):
        run_worker(f"sqlite:///{db}", "q", lambda lease: None, grace_s=1e300)
    assert not db.exists()


ODD_INTEGERS = ["\u00a02", "\u30002", "\x1c2", "1" * 5000]
"""A no-break or ideographic space (``\\s`` in a pattern takes them), a control
character ``\\s`` takes but ``int()`` refuses, more digits than ``int()`` converts."""


@pytest.mark.parametrize("value", ODD_INTEGERS)
def test_an_integer_flag_or_variable_takes_ascii_blanks_and_digits_only(
        value: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as exited:
        main(_worker("memory://", "--concurrency", value))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --concurrency: not an integer" in err and len(err) < 1000, err
    monkeypatch.setenv("CONSENSUS_LEASE_CONCURRENCY", value)
    assert main(_worker("memory://")) == 2
    out = _flat(capsys.readouterr().out)
    assert "CONSENSUS_LEASE_CONCURRENCY: not an integer" in out and len(out) < 1000, out


def test_a_log_level_takes_ascii_blanks_around_it_and_not_thousands_of_digits(
        capsys: pytest.CaptureFixture[str]) -> None:
    from consensus_lease.worker.logs import parse_level

    assert parse_level(" 20\t") == 20 and parse_level(" info ") == 20
    assert main(_worker("memory://", "--log-level", "2" * 5000)) == 2
    out = _flat(capsys.readouterr().out)
    assert "--log-level: not a log level" in out and len(out) < 1000


def test_a_metrics_address_that_cannot_be_served_names_its_variable(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("prometheus_client")
    monkeypatch.setenv("CONSENSUS_LEASE_METRICS_ADDR", "999.1.1.1")
    assert main(_worker("memory://", "--metrics-port", "1")) == 2
    out = _flat(capsys.readouterr().out)
    assert "error: CONSENSUS_LEASE_METRICS_ADDR/--metrics-port: cannot serve on 999.1.1.1:1" \
        in out, out
