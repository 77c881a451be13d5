"""The operator commands on the SQLite store: enqueue, requeue, inspect (--state,
--json), with their exit statuses and one-line errors."""

from __future__ import annotations

import base64
import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from consensus_lease import JobState, LeaseStore, open_store
from consensus_lease.admin import EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE
from consensus_lease.cli import main


@pytest.fixture()
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/leases.db"


def failed_job(store: LeaseStore, job: str, error: str = "boom") -> None:
    """Enqueue ``job`` with one attempt and fail that attempt: a dead letter."""
    store.enqueue("mail", job, b"\xff\x00payload", max_attempts=1)
    with store.session("worker-F") as session:
        lease = session.claim(job)
        assert lease is not None
        lease.fail(error, retry_in_s=0)


def inspect_json(url: str, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    assert main(["inspect", "--backend", url, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_enqueue_named_and_stdin_jobs_with_payload_and_attempts(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("b\n\nc\r\n"))
    status = main(["enqueue", "--backend", url, "--queue", "mail", "--payload", "hé",
                   "--max-attempts", "3", "a", "-"])
    assert status == 0
    assert capsys.readouterr().out.split("\n")[:3] == ["queued a", "queued b", "queued c"]
    assert main(["enqueue", "--backend", url, "--queue", "mail", "a"]) == 0
    assert capsys.readouterr().out.strip() == "already queued a"
    with open_store(url) as store:
        jobs = store.queue_jobs("mail")
    assert [(j.record.job_id, j.payload, j.record.max_attempts) for j in jobs] == [
        ("a", "hé".encode(), 3), ("b", "hé".encode(), 3), ("c", "hé".encode(), 3)]


def test_enqueue_payload_file(url: str, tmp_path: Path) -> None:
    payload = tmp_path / "p.bin"
    payload.write_bytes(b"\x00\x01\xff")
    assert main(["enqueue", "--backend", url, "--queue", "q", "--payload-file", str(payload),
                 "j"]) == 0
    with open_store(url) as store:
        assert store.queue_jobs("q")[0].payload == b"\x00\x01\xff"


def test_enqueue_bad_input_changes_nothing(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["enqueue", "--backend", url, "--queue", "q", "ok", ""]) == EXIT_USAGE
    assert "InvalidArgument" in capsys.readouterr().err
    assert main(["enqueue", "--backend", url, "--queue", "q", "--payload-file",
                 str(tmp_path / "missing"), "ok"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "missing" in err and "Traceback" not in err
    with open_store(url) as store:
        assert store.queue_jobs("q") == []


def test_enqueue_reports_a_job_of_another_queue_and_does_the_rest(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["enqueue", "--backend", url, "--queue", "one", "x"]) == 0
    assert main(["enqueue", "--backend", url, "--queue", "two", "x", "y"]) == EXIT_REFUSED
    captured = capsys.readouterr()
    assert "not queued 'x'" in captured.err and "queued y" in captured.out


def test_requeue_a_failed_job_and_refuse_the_others(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_store(url) as store:
        failed_job(store, "dead")
        store.enqueue("mail", "alive")
    assert main(["requeue", "--backend", url, "dead"]) == 0
    assert "requeued dead" in capsys.readouterr().out
    with open_store(url) as store:
        record = store.get("dead")
    assert record is not None and record.state is JobState.AVAILABLE and record.error == "boom"
    status = main(["requeue", "--backend", url, "dead", "alive", "unknown"])
    assert status == EXIT_REFUSED
    err = capsys.readouterr().err
    assert err.count("not requeued") == 3 and "Traceback" not in err


def test_inspect_state_filter_and_json_round_trip(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_store(url) as store:
        failed_job(store, "dead", error="line one\nline two")
        store.enqueue("mail", "waiting")
        with store.session("worker-D") as session:
            store.enqueue("mail", "done")
            lease = session.claim("done")
            assert lease is not None
            lease.complete("résultat".encode())
    (dead,) = inspect_json(url, capsys, "--state", "failed")
    assert dead == {
        "job_id": "dead", "state": "failed", "owner": dead["owner"], "generation": 1,
        "attempt": 1, "max_attempts": 1, "error": "line one\nline two",
        "lease_until": None, "not_before": None, "result": None, "result_encoding": None,
    }
    states = {r["job_id"]: r["state"] for r in inspect_json(url, capsys)}
    assert states == {"dead": "failed", "done": "completed", "waiting": "available"}
    (done,) = inspect_json(url, capsys, "--state", "completed")
    assert base64.b64decode(done["result"]) == "résultat".encode()
    assert done["result_encoding"] == "base64"
    (done,) = inspect_json(url, capsys, "--state", "completed", "--bytes", "utf-8")
    assert (done["result"], done["result_encoding"]) == ("résultat", "utf-8")
    (unknown,) = inspect_json(url, capsys, "nope")
    assert unknown == {"job_id": "nope", "state": None}


def test_inspect_queue_jobs_carry_their_payload(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_store(url) as store:
        failed_job(store, "dead")
    (dead,) = inspect_json(url, capsys, "--queue", "mail", "--state", "failed",
                           "--bytes", "utf-8")
    assert dead["queue"] == "mail" and dead["payload_encoding"] == "base64"  # not UTF-8
    assert base64.b64decode(dead["payload"]) == b"\xff\x00payload"
    (counts,) = inspect_json(url, capsys, "--queue", "mail")
    assert counts == {"queue": "mail", "available": 0, "held": 0, "completed": 0,
                      "failed": 1, "oldest_held_lease_until": None}


def test_inspect_table_shows_attempts_and_errors(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_store(url) as store:
        failed_job(store, "dead", error="disk full\nmore detail")
    assert main(["inspect", "--backend", url]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "dead" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[3:5] == ["failed", "1/1"] and cells[-1] == "disk full …"  # more lines: --json has them
    assert main(["inspect", "--backend", url, "--queue", "mail"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "mail" in line
               and "│" in line)
    assert [c.strip() for c in row.split("│")[1:6]] == ["mail", "0", "0", "0", "1"]


def test_inspect_after_requeue_and_completion(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A requeued job's count goes on past max_attempts (a fresh budget each requeue):
    shown as such, not "3/2"; a COMPLETED job shows no error of an earlier attempt."""
    with open_store(url) as store:
        store.enqueue("mail", "job", max_attempts=2)
        with store.session("w") as session:
            for _ in range(2):
                lease = session.claim("job")
                assert lease is not None
                lease.fail("smtp down", retry_in_s=0)
            store.requeue("job")
            lease = session.claim("job")
            assert lease is not None and lease.attempt == 3
            lease.complete(b"sent")
    assert main(["inspect", "--backend", url]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "job" in line
               and "│" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[3:5] == ["completed", "3 (2 per requeue)"] and cells[-1] == "-", cells
    assert inspect_json(url, capsys)[0]["error"] == "smtp down"  # kept for the record


def test_errors_are_one_line_with_their_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "--backend", "nope://x"]) == EXIT_USAGE
    assert main(["enqueue", "--backend", f"sqlite:///{tmp_path}/no/such/dir/x.db",
                 "--queue", "q", "j"]) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "UnsupportedBackend" in err[0]
    assert "BackendUnavailable" in err[1]
    with pytest.raises(SystemExit) as exc:
        main(["enqueue", "--backend", "sqlite:///x.db", "--queue", "q", "--max-attempts", "0",
              "j"])
    assert exc.value.code == EXIT_USAGE


@pytest.mark.parametrize("command", [["inspect"], ["inspect", "--json", "j"], ["requeue", "j"]])
def test_admin_commands_refuse_a_missing_sqlite_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """A typo in the URL is reported (exit 2, one line), and no empty store is created."""
    typo = tmp_path / "typo.db"
    assert main([command[0], "--backend", f"sqlite:///{typo}", *command[1:]]) == EXIT_USAGE
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 1 and "InvalidArgument: no SQLite store at" in err[0], err
    assert "create=false" in err[0] and captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_admin_commands_open_existing_stores_and_obey_an_explicit_create(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_store = tmp_path / "other.db"
    sqlite3.connect(not_a_store).execute("CREATE TABLE t (x)").connection.close()
    assert main(["inspect", "--backend", f"sqlite:///{not_a_store}"]) == EXIT_USAGE
    assert "is not a consensus_lease store" in capsys.readouterr().err
    fresh = tmp_path / "fresh.db"
    assert main(["inspect", "--backend", f"sqlite:///{fresh}?create=true"]) == 0
    assert fresh.exists()
    with open_store(url) as store:
        store.enqueue("q", "j")
    assert inspect_json(url, capsys, "j")[0]["state"] == "available"


@pytest.mark.parametrize("args", [
    ["enqueue", "--backend", "memory://", "--queue", "q", "j1"],
    ["inspect", "--backend", "memory://"],
    ["requeue", "--backend", "memory://", "j1"],
])
def test_commands_refuse_an_in_process_store(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A command runs in its own process: memory:// would be an empty store of its own."""
    assert main(args) == 2
    assert "lives inside one process" in capsys.readouterr().err
