"""The lock-set workload (``consensus-lease verify --workload lock-set``).

* the lost-update accounting, the verdict and the pause schedule: pure, no store;
* the command's options: the lock-set's own defaults, options of the other workload
  refused;
* one short run on the PostgreSQL store with the SQL fence as the destination, fenced
  read-modify-write, the holder paused past its TTL: at least one takeover, 0 lost
  updates (needs ``CONSENSUS_LEASE_POSTGRES_URL``; skipped without it, failed under
  ``CI=true``). The 90 s runs with Jepsen's parameters on every server store are
  recorded in benchmarks/results/lockset/, not run here.
"""

from __future__ import annotations

import argparse
import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from consensus_lease import InvalidArgument
from consensus_lease.testing.postgresql import fresh_schema, postgres_url
from consensus_lease.verify import command
from consensus_lease.verify.history import Op
from consensus_lease.verify.lockset import (
    LockSetConfig,
    LockSetReport,
    LockSetResult,
    account,
    run_lockset,
    slot_of,
)

JOB = "v1-lockset"


def op(process: str, index: int, name: str, outcome: str, *, gen: int | None = None,
       t: float = 0.0, **detail: object) -> Op:
    return Op(process, index, name, t, t + 0.01, outcome, job=JOB, generation=gen,
              detail=detail)


def history() -> list[Op]:
    """w0 holds generation 1 and releases it; w1 claims 2, reads and is paused; w2 takes
    over with 3 (2 was never released) and reads; w1's late write-back ``w1-1`` is
    accepted (the write-only control) and w2's write-back ``w2-1`` drops it; w0 claims 4,
    its fenced read is refused and its write ``w0-2`` never returns."""
    return [
        op("w0", 1, "claim", "claimed", gen=1, t=1),
        op("w0", 2, "read", "ok", gen=1, t=2),
        op("w0", 3, "write", "accepted", gen=1, t=3, item="w0-1"),
        op("w0", 4, "release", "ok", gen=1, t=4),
        op("w1", 1, "claim", "claimed", gen=2, t=5),
        op("w1", 2, "read", "ok", gen=2, t=6),
        op("nemesis", 1, "fault", "healed", t=6.5, kind="pause"),
        op("w2", 1, "claim", "claimed", gen=3, t=9),
        op("w2", 2, "read", "ok", gen=3, t=10),
        op("w1", 3, "write", "accepted", gen=2, t=11, item="w1-1"),
        op("w2", 3, "write", "accepted", gen=3, t=12, item="w2-1"),
        op("w1", 4, "release", "stale", gen=2, t=12.5),
        op("w2", 4, "release", "ok", gen=3, t=13),
        op("w0", 5, "claim", "claimed", gen=4, t=14),
        op("w0", 6, "read", "fence_rejected", gen=4, t=15),
        op("w0", 7, "write", "indeterminate", gen=4, t=16, item="w0-2"),
        op("w0", 8, "release", "ok", gen=4, t=17),
    ]


def test_the_accounting_counts_acknowledged_lost_and_takeovers() -> None:
    report = account(history(), ["w0-1", "w2-1", "w0-2"])
    assert report.acknowledged == 3                     # w0-1, w1-1, w2-1 (w0-2 never returned)
    assert report.lost == ["w1-1"]                       # acknowledged, dropped by w2's write-back
    assert report.in_final_set == 2
    assert report.unacknowledged_in_set == 1             # w0-2: in the set, not acknowledged
    assert report.takeovers == 1                         # generation 3: 2 was never released
    assert report.claims == 4 and report.pauses == 1
    assert (report.reads_refused, report.writes_refused, report.leases_lost) == (1, 0, 1)
    assert report.outcomes["write:accepted"] == 3


def test_the_accounting_of_a_run_without_a_loss() -> None:
    report = account(history(), ["w0-1", "w1-1", "w2-1"])
    assert report.lost == [] and report.in_final_set == report.acknowledged == 3
    assert account([], []).takeovers == 0 and account([], []).acknowledged == 0


def result(report: LockSetReport, *, mode: str = "fenced",
           crashes: list[str] | None = None) -> LockSetResult:
    return LockSetResult(config=LockSetConfig(mode=mode), report=report,  # type: ignore[arg-type]
                         history_path=Path("h"), run_dir=Path("r"), store_url="s",
                         destination="d", elapsed_s=1.0, worker_crashes=crashes or [])


@pytest.mark.parametrize(("final", "takeovers", "crashed", "status"), [
    (["w0-1", "w1-1", "w2-1"], True, False, 0),
    (["w0-1", "w2-1"], True, False, 1),
    ([], False, True, 1),                         # a loss is a FAIL whatever else
    (["w0-1"], False, False, 2),                  # nothing lost, nothing tested
    (["w0-1", "w1-1", "w2-1"], True, True, 2),
])
def test_the_verdict_puts_a_loss_first_then_what_the_run_tested(
    final: list[str], takeovers: bool, crashed: bool, status: int
) -> None:
    ops = history() if takeovers else [o for o in history() if o.process in ("w0", "nemesis")]
    res = result(account(ops, final), crashes=["w1 (exit 1): boom"] if crashed else None)
    assert res.exit_status == status
    if not takeovers:
        assert any("no takeover" in reason for reason in res.inconclusive)


def render(res: LockSetResult) -> str:
    out = io.StringIO()
    command.render_lockset(res, Console(file=out, width=200))
    return " ".join(out.getvalue().split())


def test_the_control_says_a_loss_is_its_expected_result() -> None:
    lost = result(account(history(), ["w0-1", "w2-1"]), mode="write-only")
    assert lost.exit_status == 1
    text = render(lost)
    assert "FAIL: 1 acknowledged update(s) lost: w1-1" in text
    assert "expected: this is the write-only-fenced control" in text
    kept = result(account(history(), ["w0-1", "w1-1", "w2-1"]), mode="write-only")
    assert kept.exit_status == 0 and "the write-only-fenced control lost nothing" in render(kept)
    fenced = result(account(history(), ["w0-1", "w1-1", "w2-1"]))
    assert "PASS: no acknowledged update lost" in render(fenced)
    assert "control" not in render(fenced).split("PASS")[1]
    summary = command.lockset_summary(lost)
    assert (summary["verdict"], summary["lost"], summary["lost_items"]) == ("FAIL", 1, ["w1-1"])
    assert summary["acknowledged"] == 3 and summary["takeovers"] == 1


def test_the_schedule_is_jepsens_by_default() -> None:
    config = LockSetConfig()
    assert (config.workers, config.ttl_s, config.duration_s, config.mode) == (5, 2.0, 90.0,
                                                                              "fenced")
    pauses = config.schedule()
    assert [p.at_s for p in pauses] == [5.0 * k for k in range(1, 18)]  # 5 .. 85 s
    assert all(p.kind == "pause" and 3.0 <= p.hold_s <= 5.0 and 0 <= p.target < 5
               for p in pauses)
    assert pauses == LockSetConfig().schedule()                        # a pure function
    holder = LockSetConfig(pause_target="holder", duration_s=10).schedule()
    assert [p.kind for p in holder] == ["pause-holder"]
    config.validate()


def test_a_pause_that_cannot_outlast_the_ttl_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="never outlast the TTL"):
        LockSetConfig(ttl_s=2.0, pause_min_s=1.0, pause_max_s=2.0).validate()
    with pytest.raises(InvalidArgument, match="mode must be"):
        LockSetConfig(mode="unfenced").validate()  # type: ignore[arg-type]


def test_slot_of_reads_the_session_owner_label() -> None:
    assert [slot_of(o) for o in ("w3#2", "w0#1", "w12.1#4", "other", None, "wx#1")] == [
        3, 0, 12, None, None, None]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args([command.NAME, *argv])


def test_the_command_gives_each_workload_its_own_defaults() -> None:
    config = command.lockset_config_from_args(parse("--workload", "lock-set",
                                                     "--mode", "write-only"))
    assert (config.workers, config.ttl_s, config.duration_s, config.pause_every_s,
            config.pause_min_s, config.pause_max_s, config.pause_target, config.mode) == (
        5, 2.0, 90.0, 5.0, 3.0, 5.0, "random", "write-only")
    jobs = command.config_from_args(parse())
    assert (jobs.workers, jobs.ttl_s, jobs.duration_s, jobs.jobs, jobs.steps, jobs.quiet_s) == (
        4, 1.0, 30.0, 100, 3, 20.0)
    with pytest.raises(InvalidArgument, match="--mode write-only"):
        command.lockset_config_from_args(parse("--workload", "lock-set", "--unfenced"))
    with pytest.raises(InvalidArgument, match="--jobs, --faults: not with --workload lock-set"):
        command.lockset_config_from_args(parse("--workload", "lock-set", "--jobs", "3",
                                               "--faults", "kill"))
    with pytest.raises(InvalidArgument, match="--pause-target: only with --workload lock-set"):
        command.config_from_args(parse("--pause-target", "holder"))


@pytest.fixture
def store_url() -> Iterator[str]:
    base = postgres_url()
    with fresh_schema(base) as schema:
        yield f"{base}?schema={schema}"


@pytest.mark.slow
def test_fenced_lock_set_on_postgresql_loses_nothing_across_takeovers(
    store_url: str, tmp_path: Path
) -> None:
    """3 workers, TTL 2 s, the holder paused 3-3.5 s every 3.5 s for 10 s (two pauses,
    each past the TTL: each a takeover), the set in the SQL fence on PostgreSQL."""
    destination = os.environ["CONSENSUS_LEASE_POSTGRES_URL"]  # postgres_url() checked it
    config = LockSetConfig(backend=store_url, destination=destination, workers=3, ttl_s=2.0,
                           duration_s=10.0, pause_every_s=3.5, pause_min_s=3.0,
                           pause_max_s=3.5, pause_target="holder",
                           run_dir=str(tmp_path / "run"))
    res = run_lockset(config)
    report = res.report
    why = f"{report} crashes={res.worker_crashes} history={res.history_path}"
    assert res.exit_status == 0, why
    assert report.lost == [] and report.acknowledged >= 10, why
    assert report.in_final_set == report.acknowledged, why
    assert report.takeovers >= 1, why                 # else the run proved nothing
    assert report.pauses == 2, why


def test_progress_counts_acknowledged_updates_and_refused_reads(tmp_path: Path) -> None:
    from consensus_lease.verify.history import HistoryWriter
    from consensus_lease.verify.progress import HistoryTally, RunStatus, counts_text

    part = tmp_path / "w0.jsonl"
    rec = HistoryWriter(part, "w0")
    rec.ret(rec.invoke("claim", job=JOB), "claimed", generation=1)
    rec.ret(rec.invoke("read", job=JOB, generation=1), "ok")
    rec.ret(rec.invoke("write", job=JOB, generation=1, item="w0-1"), "accepted")
    rec.ret(rec.invoke("read", job=JOB, generation=1), "fence_rejected")
    rec.close()
    tally = HistoryTally()
    tally.update([part])
    assert (tally.claims, tally.acknowledged, tally.fenced, tally.violations) == (1, 1, 1, 0)
    text = counts_text(RunStatus(phase="faults", elapsed_s=1.0, total_s=10.0, faults_injected=0,
                                 faults_planned=2, completions=0, jobs=1, acknowledged=1))
    assert "acknowledged 1" in text and "completed" not in text
