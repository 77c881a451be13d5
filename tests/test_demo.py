"""`consensus-lease demo` on real worker processes, and proof its check can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "consensus_lease.cli", "demo", "--ttl-s", "1", *args],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.slow
def test_demo_passes_with_every_rejection() -> None:
    result = run()
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "PASS" in out
    for expected in ("LeaseLost", "StaleLeaseError", "FenceRejected"):
        assert expected in out


@pytest.mark.slow
def test_demo_fails_when_the_destination_is_unfenced() -> None:
    result = run("--unfenced")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL" in result.stdout and "late write" in result.stdout


def test_demo_rejects_bad_ttl() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "consensus_lease.cli", "demo", "--ttl-s", "-3"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "must be a finite number" in result.stderr


def test_demo_refuses_a_ttl_outside_the_stores_range_before_creating_it(
        tmp_path: Path) -> None:
    db = tmp_path / "leases.db"
    result = subprocess.run(
        [sys.executable, "-m", "consensus_lease.cli", "demo", "--backend", f"sqlite:///{db}",
         "--ttl-s", "1e7"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "outside this store's range [0.05, 604800.0] s" in result.stdout + result.stderr
    assert not db.exists()


def test_inspect_shows_records(tmp_path: pytest.TempPathFactory) -> None:
    from consensus_lease import open_store

    url = f"sqlite:///{tmp_path}/x.db"
    with open_store(url) as store, store.session("worker-Z") as session:
        assert session.claim("job/ü 1") is not None
        result = subprocess.run(
            [sys.executable, "-m", "consensus_lease.cli", "inspect", "--backend", url],
            capture_output=True, text=True, timeout=60,
        )
    assert result.returncode == 0, result.stderr
    assert "job/ü 1" in result.stdout and "worker-Z" in result.stdout and "held" in result.stdout


def test_inspect_bad_url_is_a_clear_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "consensus_lease.cli", "inspect", "--backend", "nope://x"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "UnsupportedBackend" in result.stderr
    assert "Traceback" not in result.stderr


def test_inspect_queue_counts(tmp_path: pytest.TempPathFactory) -> None:
    from consensus_lease import open_store

    url = f"sqlite:///{tmp_path}/q.db"
    with open_store(url) as store, store.session("W") as session:
        for i in range(3):
            store.enqueue("mail", f"m{i}")
        lease = session.claim_next("mail")
        assert lease is not None
        lease.complete(b"")
        assert session.claim_next("mail") is not None
        result = subprocess.run(
            [sys.executable, "-m", "consensus_lease.cli", "inspect", "--backend", url,
             "--queue", "mail"],
            capture_output=True, text=True, timeout=60,
        )
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "mail" in line and "│" in line)
    assert [c.strip() for c in row.split("│")[1:5]] == ["mail", "1", "1", "1"]


def test_demo_refuses_an_in_process_store() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "consensus_lease.cli", "demo", "--backend", "memory://"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "UnsupportedOperation" in result.stdout
