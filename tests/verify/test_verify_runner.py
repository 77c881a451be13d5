"""``consensus-lease verify --runner``: the workers drive the worker runner
(``run_worker`` with prefetch and batched completion) over a queue of the run's jobs.

* fenced, under ``pause-at-check``, on SQLite and the session's etcd and ZooKeeper
  clusters: zero violations, every job completed once, completions sent in batches of
  more than one, stale actions refused (stale writes by the fence; stale completions,
  also items of a batch, by the store): PASS;
* the control: the same with an unfenced destination must FAIL (a late write gets in);
* the options: the knobs need the runner and are checked as the worker checks them.

Each run is bounded: ``until_done`` ends the fault period once every job is completed.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from verify_kit import explain

from consensus_lease import InvalidArgument
from consensus_lease.verify.command import add_parser, config_from_args, lockset_config_from_args
from consensus_lease.verify.kit import KitCluster
from consensus_lease.verify.queue_worker import StoreGate
from consensus_lease.verify.runner import VerifyConfig, VerifyResult, run_verify

KNOBS: dict[str, Any] = {"runner": True, "prefetch": 4, "complete_batch": 8,
                         "complete_flush_s": 0.2}


def _config(tmp_path: Path, **overrides: Any) -> VerifyConfig:
    fields: dict[str, Any] = {
        "cluster": "sqlite", "workers": 3, "jobs": 90, "steps": 2, "ttl_s": 0.5,
        "think_s": 0.01, "duration_s": 20.0, "quiet_s": 20.0, "seed": 2,
        "faults": ("pause-at-check",), "until_done": True, "run_dir": str(tmp_path / "run"),
        **KNOBS}
    fields.update(overrides)
    return VerifyConfig(**fields)


def _runner_stats(result: VerifyResult) -> Counter[str]:
    """The workers' runner counts (their ``worker_exit`` events), summed."""
    total: Counter[str] = Counter()
    for line in result.history_path.read_text().splitlines():
        op = json.loads(line)
        if op["op"] == "worker_exit":
            total.update({k: v for k, v in op["detail"]["stats"].items()
                          if isinstance(v, int)})
    return total


def _assert_passes_in_batches(result: VerifyResult, jobs: int) -> None:
    report = result.report
    assert result.exit_status == 0, explain(result)
    assert report.ok and report.conclusive and not result.worker_crashes, explain(result)
    assert report.faults["pause-at-check"] >= 1, explain(result)
    c = report.counts
    assert c["completions"] == jobs, explain(result)  # each job completed once
    assert c["stale_writes_rejected"] + c["stale_completions_rejected"] >= 1, explain(result)
    stats = _runner_stats(result)
    assert stats["errors"] == 0, stats
    assert stats["completed"] == jobs, stats  # the runner counted what the store recorded
    # batched: fewer complete_many calls than completions sent
    assert 0 < stats["complete_batches"] < stats["batched_completions"], stats


@pytest.mark.slow
def test_the_batched_runner_passes_under_pause_at_check(tmp_path: Path) -> None:
    config = _config(tmp_path, jobs=150)  # a few pauses land while the work goes on
    said: list[str] = []
    result = run_verify(config, said.append)
    _assert_passes_in_batches(result, config.jobs)
    assert any("worker runner on queue" in line for line in said), said
    assert result.elapsed_s < 120, result.elapsed_s


@pytest.mark.slow
def test_the_batched_runner_control_fails(tmp_path: Path) -> None:
    """Unfenced: a worker stopped between its check and its write writes late, after
    the job was taken over, and the checker must say so."""
    config = _config(tmp_path, unfenced=True, steps=3, think_s=0.02)
    result = run_verify(config)
    report = result.report
    assert result.exit_status == 1, explain(result)
    assert report.violations["stale_effects"] >= 1, explain(result)
    assert report.counts["stale_writes_rejected"] == 0  # nothing was fenced
    assert any("accepted with token" in e for e in report.examples)


def _passes_on(cluster: Any, tmp_path: Path) -> None:
    # the work lasts several seconds: pauses at a check start TTL, ~4 TTL, ~7 TTL in
    config = _config(tmp_path, ttl_s=1.0, jobs=150, think_s=0.05, duration_s=60.0,
                     quiet_s=30.0)
    result = run_verify(config, cluster=KitCluster.adopt(cluster))
    assert result.store_url.startswith(f"{cluster.scheme}://"), result.store_url
    _assert_passes_in_batches(result, config.jobs)


@pytest.mark.slow
def test_the_batched_runner_passes_on_etcd(etcd_cluster: Any, tmp_path: Path) -> None:
    _passes_on(etcd_cluster, tmp_path)  # max_complete_batch 1: one completion per item


@pytest.mark.slow
def test_the_batched_runner_passes_on_zookeeper(zookeeper_cluster: Any,
                                                tmp_path: Path) -> None:
    _passes_on(zookeeper_cluster, tmp_path)  # one multi per batch


# -- the options --------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [
    ("prefetch", 2), ("complete_batch", 8), ("complete_flush_s", 0.5)])
def test_a_knob_without_the_runner_is_refused(field: str, value: object) -> None:
    with pytest.raises(InvalidArgument, match=f"{field}.*--runner"):
        VerifyConfig(faults=(), **{field: value}).validate()


@pytest.mark.parametrize(("field", "value"), [
    ("prefetch", -1), ("prefetch", 257), ("complete_batch", 0), ("complete_flush_s", 61.0),
    ("runner", "yes")])
def test_a_bad_knob_is_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(InvalidArgument, match=field):
        VerifyConfig(faults=(), **{"runner": True, field: value}).validate()


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["verify", *argv])


def test_the_knobs_imply_the_runner_on_the_command_line() -> None:
    config = config_from_args(_parse("--complete-batch", "8", "--prefetch", "4"))
    assert (config.runner, config.prefetch, config.complete_batch,
            config.complete_flush_s) == (True, 4, 8, 0.01)
    assert config_from_args(_parse("--runner")).runner
    plain = config_from_args(_parse())
    assert (plain.runner, plain.prefetch, plain.complete_batch) == (False, 0, 1)
    with pytest.raises(InvalidArgument, match="--runner"):
        lockset_config_from_args(_parse("--workload", "lock-set", "--runner"))
    with pytest.raises(InvalidArgument, match="--complete-batch"):
        lockset_config_from_args(_parse("--workload", "lock-set", "--complete-batch", "4"))


def test_bad_knob_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parse("--complete-batch", "0")
    assert exited.value.code == 2 and "--complete-batch" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [
    ("--jobs", "\u0663"), ("--workers", "1_0"), ("--steps", "\uff11"), ("--seed", "\u0663"),
    ("--ttl-s", "1_0"), ("--duration-s", "\u0661\u0660"), ("--think-s", "\uff11"),
])
def test_numbers_are_ascii_digits_only(flag: str, value: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``int()`` and ``float()`` also take underscores and other scripts' digits."""
    with pytest.raises(SystemExit) as exited:
        _parse(flag, value)
    assert exited.value.code == 2
    assert f"argument {flag}: not a" in capsys.readouterr().err


def test_plain_numbers_still_parse_as_verify_flags() -> None:
    args = _parse("--jobs", "12", "--seed", "-3", "--ttl-s", " 1.5 ")
    assert (args.jobs, args.seed, args.ttl_s) == (12, -3, 1.5)


@pytest.mark.parametrize("flag", ["--think-s", "--duration-s", "--ttl-s", "--pause-max-s"])
def test_seconds_past_what_a_thread_can_wait_are_refused_naming_the_flag(
        flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--think-s 1e300`` passed and every worker died of an OverflowError in its
    think-time wait (the run INCONCLUSIVE: workers crashed)."""
    with pytest.raises(SystemExit) as exited:
        _parse(flag, "1e300")
    assert exited.value.code == 2
    assert f"argument {flag}: seconds must be at most" in capsys.readouterr().err


def test_a_run_whose_stop_time_overflows_or_whose_jobs_fill_memory_is_refused() -> None:
    """Each under the limit, ``--duration-s 5e9 --quiet-s 5e9`` overflowed the workers'
    stop timer; ``--jobs 10**29`` built its job list until memory ran out."""
    with pytest.raises(InvalidArgument, match="a run may last at most"):
        config_from_args(_parse("--duration-s", "5e9", "--quiet-s", "5e9")).validate()
    with pytest.raises(InvalidArgument, match="jobs must be an int from 1 to 1000000"):
        config_from_args(_parse("--jobs", "1" + "0" * 29)).validate()
    with pytest.raises(InvalidArgument, match="steps must be an int from 1 to 10000"):
        config_from_args(_parse("--steps", "10001")).validate()
    with pytest.raises(InvalidArgument, match="a run may last at most"):
        lockset_config_from_args(_parse("--workload", "lock-set", "--duration-s",
                                        "9e9")).validate()


def test_a_lock_set_schedule_of_more_pauses_than_the_nemesis_takes_is_refused() -> None:
    """``--pause-every-s 1e-300`` built its schedule for ever (a list growing without
    end); cut at MAX_FAULTS it would have been a run of another shape than asked."""
    from consensus_lease.verify.nemesis import MAX_FAULTS

    config = lockset_config_from_args(_parse("--workload", "lock-set", "--pause-every-s",
                                             "1e-300"))
    with pytest.raises(InvalidArgument, match=f"more than {MAX_FAULTS} pauses"):
        config.validate()
    assert len(config.schedule()) == MAX_FAULTS  # bounded even unvalidated


def test_the_store_gate_waits_for_calls_in_flight_and_holds_new_ones() -> None:
    import threading

    class Backend:
        def __init__(self) -> None:
            self.inside = threading.Event()
            self.leave = threading.Event()

        def claim(self) -> str:
            self.inside.set()
            assert self.leave.wait(10)
            return "claimed"

        def get(self) -> str:
            return "got"

    backend = Backend()
    gate = StoreGate(backend)
    answers: list[str] = []
    caller = threading.Thread(target=lambda: answers.append(backend.claim()))
    caller.start()
    assert backend.inside.wait(10)
    with gate.closed(0.05) as quiet:
        assert not quiet  # a call is in flight: the wait ended by its bound
    backend.leave.set()
    caller.join(10)
    with gate.closed(5.0) as quiet:
        assert quiet
        later = threading.Thread(target=lambda: answers.append(backend.get()))
        later.start()
        later.join(0.2)  # held back while the gate is closed
        assert later.is_alive()
    later.join(10)
    assert answers == ["claimed", "got"]
