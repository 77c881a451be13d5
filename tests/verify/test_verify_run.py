"""Real verification runs: worker processes, a nemesis, the checker.

* fenced, on SQLite, under worker pause + pause-at-check + kill + clock skew: zero
  violations, and the faults demonstrably did something (losses, rejections);
* the control: the same kind of faults with an unfenced destination must FAIL;
* the SQL fence on PostgreSQL as the destination (skipped without
  ``CONSENSUS_LEASE_POSTGRES_URL``, failed under ``CI=true``);
* the command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from consensus_lease.verify.history import read_history
from consensus_lease.verify.nemesis import WORKER_FAULTS, plan
from consensus_lease.verify.runner import VerifyConfig, VerifyResult, run_verify

POSTGRES_ENV = "CONSENSUS_LEASE_POSTGRES_URL"


def seed_covering(kinds: tuple[str, ...], *, first: int, repeat: str, **plan_args: float) -> int:
    """The smallest seed whose first ``first`` planned faults include every kind, and
    ``repeat`` at least twice (the schedule is a pure function of the seed)."""
    for seed in range(1, 500):
        head = [p.kind for p in plan(seed, kinds, **plan_args)[:first]]  # type: ignore[arg-type]
        if set(head) == set(kinds) and head.count(repeat) >= 2:
            return seed
    raise AssertionError("no seed covers every fault kind")


def explain(result: VerifyResult) -> str:
    r = result.report
    return (f"violations={dict(r.violations)} counts={dict(r.counts)} faults={dict(r.faults)} "
            f"examples={r.examples[:5]} crashes={result.worker_crashes} "
            f"notes={result.notes} history={result.history_path}")


@pytest.mark.slow
def test_fenced_run_under_worker_faults_has_zero_violations(tmp_path: Path) -> None:
    ttl_s, duration_s, workers = 0.75, 25.0, 4
    seed = seed_covering(WORKER_FAULTS, first=5, repeat="pause-at-check",
                         duration_s=duration_s, ttl_s=ttl_s, slots=workers)
    config = VerifyConfig(cluster="sqlite", workers=workers, jobs=80, steps=3, ttl_s=ttl_s,
                          duration_s=duration_s, quiet_s=25.0, seed=seed, faults=WORKER_FAULTS,
                          run_dir=str(tmp_path / "run"), history=str(tmp_path / "history.jsonl"))
    result = run_verify(config)
    report = result.report

    assert result.exit_status == 0, explain(result)
    assert report.ok and not result.worker_crashes, explain(result)
    assert result.all_completed_at_s is not None, explain(result)
    # The faults happened and did something.
    for kind in WORKER_FAULTS:
        assert report.faults[kind] >= 1, explain(result)
    c = report.counts
    assert c["claims"] > config.jobs, explain(result)          # some jobs were taken over
    assert c["completions"] == config.jobs, explain(result)
    assert c["losses_detected"] + c["sessions_lost"] >= 1, explain(result)
    assert c["stale_writes_rejected"] + c["stale_completions_rejected"] >= 1, explain(result)
    # The history is one file, with the replacements' and the skewed worker's operations.
    ops = read_history(result.history_path)
    assert result.history_path == tmp_path / "history.jsonl"
    skewed = {o.process for o in ops if o.op == "worker_start" and o.detail["clock_offset_s"]}
    assert skewed, "no worker ran with a skewed clock"
    assert any(o.op == "claim" and o.outcome == "claimed" and o.process in skewed for o in ops), (
        "the skewed worker never claimed a job")
    assert any("." in o.process for o in ops if o.op == "worker_start")  # a replacement ran
    assert all(o.t_return is not None for o in ops if o.op == "fault")


@pytest.mark.slow
def test_unfenced_control_run_reports_violations(tmp_path: Path) -> None:
    """The same protocol with a destination that does not check tokens: a worker stopped
    between its check and its write writes late, and the checker must say so."""
    config = VerifyConfig(cluster="sqlite", workers=3, jobs=40, steps=3, ttl_s=0.5,
                          duration_s=12.0, quiet_s=20.0, seed=2, faults=("pause-at-check",),
                          unfenced=True, run_dir=str(tmp_path / "run"))
    result = run_verify(config)
    report = result.report
    assert result.exit_status == 1, explain(result)
    assert report.violations["stale_effects"] >= 1, explain(result)
    assert report.total_violations >= report.violations["stale_effects"]
    assert report.counts["stale_writes_rejected"] == 0  # nothing was fenced
    assert any("accepted with token" in e for e in report.examples)


def _postgres_url_or_skip() -> str:
    url = os.environ.get(POSTGRES_ENV, "").strip()
    if not url:
        reason = (f"{POSTGRES_ENV} is not set: run `eval \"$(bash scripts/start-postgres.sh)\"` "
                  "to start PostgreSQL on 127.0.0.1 and export it")
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(f"{reason} (CI=true: PostgreSQL tests must run)", pytrace=False)
        pytest.skip(reason)
    return url


@pytest.mark.slow
def test_postgres_destination_run(tmp_path: Path) -> None:
    url = _postgres_url_or_skip()
    config = VerifyConfig(cluster="sqlite", workers=3, jobs=25, steps=3, ttl_s=0.5,
                          duration_s=8.0, quiet_s=20.0, seed=4,
                          faults=("pause-at-check", "kill"), destination=url,
                          run_dir=str(tmp_path / "run"))
    result = run_verify(config)
    assert result.exit_status == 0, explain(result)
    assert result.report.counts["effects_accepted"] >= 25 * 3
    assert result.destination == url


def _cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "consensus_lease.verify", *args],
                          capture_output=True, text=True, timeout=timeout_s)


def test_cli_without_faults_passes_and_prints_the_history(tmp_path: Path) -> None:
    history = tmp_path / "h.jsonl"
    done = _cli("--workers", "2", "--jobs", "4", "--steps", "2", "--duration-s", "0",
                "--quiet-s", "30", "--faults", "", "--think-s", "0.01", "--history", str(history),
                "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout and str(history) in done.stdout.replace("\n", "")
    assert history.exists()


def test_cli_rejects_bad_options() -> None:
    done = _cli("--faults", "pause,meteor")
    assert done.returncode == 2 and "unknown fault" in done.stderr
    done = _cli("--faults", "member-kill", "--duration-s", "1")
    assert done.returncode == 2 and "--cluster etcd" in done.stdout
    done = _cli("--backend", "x://y", "--cluster", "etcd")
    assert done.returncode == 2 and "not allowed with" in done.stderr


def test_the_subcommand_plugs_into_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    from consensus_lease import cli

    monkeypatch.setattr(cli, "EXTRA_COMMANDS", ["consensus_lease.verify.command"])
    args = cli._parser().parse_args(["verify", "--jobs", "7", "--unfenced", "--faults", "kill"])
    assert (args.command, args.jobs, args.unfenced, args.faults) == ("verify", 7, True, ("kill",))
