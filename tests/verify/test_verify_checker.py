"""The checker on hand-made histories: each violation is found, and only when present; a
run is inconclusive when a fault kind asked for never happened or the fence was never
tested."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus_lease.fencing import Effect
from consensus_lease.verify.checker import COUNTS, VIOLATIONS, check, inconclusive_reasons
from consensus_lease.verify.history import INDETERMINATE, Op

_index = itertools.count(1)


def op(process: str, name: str, outcome: str, job: str | None = "j", generation: int | None = None,
       t: float = 0.0, **detail: Any) -> Op:
    return Op(process, next(_index), name, t, t + 0.001, outcome, job, generation, detail)


class History:
    """Builds the history and the destination of a run, step by step."""

    def __init__(self, jobs: Sequence[str] = ("j",)) -> None:
        self.ops: list[Op] = [op("verifier", "run", "ok", job=None, jobs=list(jobs))]
        self.effects: list[Effect] = []

    def claim(self, worker: str, gen: int, job: str = "j") -> History:
        self.ops.append(op(worker, "claim", "claimed", job, gen))
        return self

    def write(self, worker: str, gen: int, step: int, job: str = "j", *, accepted: bool = True,
              outcome: str | None = None) -> History:
        effect_id = f"step-{step}"
        result = outcome or ("accepted" if accepted else "fence_rejected")
        self.ops.append(op(worker, "write", result, job, gen, effect_id=effect_id))
        if accepted:
            self.effects.append(Effect(len(self.effects) + 1, job, gen, effect_id, b""))
        return self

    def check(self, worker: str, gen: int, outcome: str = "ok", job: str = "j") -> History:
        self.ops.append(op(worker, "check", outcome, job, gen))
        return self

    def complete(self, worker: str, gen: int, outcome: str = "ok", job: str = "j") -> History:
        self.ops.append(op(worker, "complete", outcome, job, gen))
        return self

    def final(self, state: str, gen: int, job: str = "j") -> History:
        self.ops.append(op("verifier", "final", "ok", job, gen, state=state))
        return self

    def job_run(self, worker: str, gen: int, steps: int = 3, job: str = "j") -> History:
        self.claim(worker, gen, job)
        for step in range(steps):
            self.check(worker, gen, job=job).write(worker, gen, step, job)
        return self.check(worker, gen, job=job).complete(worker, gen, job=job)


def test_a_clean_takeover_has_no_violation_and_counts_what_happened() -> None:
    h = (History().claim("A", 1).check("A", 1).write("A", 1, 0)
         # A is paused in its window; B takes over with generation 2
         .claim("B", 2).check("B", 2).write("B", 2, 0)
         .write("A", 1, 1, accepted=False)           # A's late write: fenced
         .check("A", 1, outcome="lost")              # A finds out
         .complete("A", 1, outcome="stale")          # and the store refuses it
         .check("B", 2).write("B", 2, 1).check("B", 2).complete("B", 2)
         .final("completed", 2))
    report = check(h.ops, h.effects)
    assert report.ok, report.examples
    assert set(report.violations) == set(VIOLATIONS) and set(report.counts) >= set(COUNTS)
    c = report.counts
    assert (c["claims"], c["stale_writes_rejected"], c["losses_detected"],
            c["stale_completions_rejected"], c["completions"], c["effects_accepted"]) == (
        2, 1, 1, 1, 1, 3)
    assert report.jobs["j"].tokens == [1, 2, 2] and report.jobs["j"].completed_generation == 2


def test_an_unfenced_late_write_is_a_stale_effect_and_an_interleaving() -> None:
    h = (History().claim("A", 1).write("A", 1, 0).claim("B", 2).write("B", 2, 0)
         .write("A", 1, 1)                           # accepted: the destination is unfenced
         .write("B", 2, 1).complete("B", 2).final("completed", 2))
    report = check(h.ops, h.effects)
    assert report.violations["stale_effects"] == 1
    assert report.violations["interleaved_generations"] == 2  # 1 2 [1] [2]
    assert not report.ok and report.total_violations == 3
    assert any("token 1 after token 2" in e for e in report.examples)


def test_a_stale_write_after_the_completion_is_caught_as_not_by_last_writer() -> None:
    h = (History().claim("A", 1).write("A", 1, 0).claim("B", 2).write("B", 2, 0)
         .complete("B", 2).write("A", 1, 1).final("completed", 2))
    report = check(h.ops, h.effects)
    assert report.violations["completed_not_by_last_writer"] == 1
    assert report.violations["stale_effects"] == 1


def test_two_generations_completing_is_a_multiple_completion() -> None:
    h = History().job_run("A", 1).job_run("B", 2).final("completed", 2)
    report = check(h.ops, h.effects)
    assert report.violations["multiple_completions"] == 1
    assert report.violations["claimed_after_completion"] == 1  # B claimed after A completed


def test_a_claim_above_the_completed_generation_is_flagged() -> None:
    h = History().job_run("A", 1).final("completed", 1).claim("B", 2)
    report = check(h.ops, h.effects)
    assert report.violations["claimed_after_completion"] == 1
    assert report.violations["multiple_completions"] == 0


def test_the_store_record_decides_completion_not_the_worker() -> None:
    # The worker saw ok, but the store says the job is available: not completed.
    h = History().job_run("A", 1).final("available", 1)
    assert check(h.ops, h.effects).violations["not_completed"] == 1
    # The worker died before seeing the answer, but the store completed it: fine.
    h = History().claim("A", 1).write("A", 1, 0).complete("A", 1, outcome=INDETERMINATE)
    h.final("completed", 1)
    assert check(h.ops, h.effects).ok
    # No final record at all: the history's completions are used.
    h2 = History().job_run("A", 1)
    assert check(h2.ops, h2.effects).ok


def test_jobs_never_worked_are_not_completed() -> None:
    h = History(jobs=("a", "b")).job_run("A", 1, job="a").final("completed", 1, job="a")
    h.final("available", 0, job="b")
    report = check(h.ops, h.effects)
    assert report.violations["not_completed"] == 1 and report.jobs["a"].ok
    assert not report.jobs["b"].ok


def test_destination_and_history_must_agree() -> None:
    h = History().claim("A", 1).write("A", 1, 0).complete("A", 1).final("completed", 1)
    # an acknowledged write the destination lost
    assert check(h.ops, []).violations["destination_mismatch"] == 1
    # an effect nobody sent
    ghost = [*h.effects, Effect(99, "j", 1, "step-9", b"")]
    assert check(h.ops, ghost).violations["destination_mismatch"] == 1
    # a write cut short by SIGKILL that did land is fine
    h2 = History().claim("A", 1).write("A", 1, 0, outcome=INDETERMINATE)
    h2.complete("A", 1).final("completed", 1)
    report = check(h2.ops, h2.effects)
    assert report.ok and report.counts["writes_indeterminate"] == 1


def test_effects_are_ordered_by_seq_not_by_list_order() -> None:
    h = History().claim("A", 1).write("A", 1, 0).claim("B", 2).write("B", 2, 0)
    h.complete("B", 2).final("completed", 2)
    assert check(h.ops, list(reversed(h.effects))).ok


def test_other_runs_effects_and_ops_are_ignored() -> None:
    h = History(jobs=("mine",)).job_run("A", 1, job="mine").final("completed", 1, job="mine")
    noise = [Effect(1000, "other", 1, "step-0", b""), Effect(1001, "other", 0, "x", b"")]
    assert check(h.ops, h.effects + noise).ok


def test_faults_are_counted_only_when_injected() -> None:
    h = History().job_run("A", 1).final("completed", 1)
    h.ops += [op("nemesis", "fault", "healed", None, kind="kill"),
              op("nemesis", "fault", "skipped", None, kind="pause"),
              op("nemesis", "fault", "error", None, kind="partition")]
    assert dict(check(h.ops, h.effects).faults) == {"kill": 1}


# -- conclusive or not ---------------------------------------------------------------------


def refused(writes: int = 0, completions: int = 0) -> Counter[str]:
    return Counter({"stale_writes_rejected": writes, "stale_completions_rejected": completions})


def injected(*kinds: str) -> dict[str, Counter[str]]:
    return {kind: Counter({"healed": 1}) for kind in kinds}


def test_a_run_that_did_every_fault_and_refused_a_stale_write_is_conclusive() -> None:
    kinds = ("pause", "pause-at-check", "kill", "skew")
    scheduled = Counter(kinds)
    assert inconclusive_reasons(kinds, scheduled, injected(*kinds), refused(writes=1)) == []
    # a stale completion the store refused tests the protocol just as well
    assert inconclusive_reasons(kinds, scheduled, injected(*kinds), refused(completions=1)) == []
    # a heal that failed still means the fault was injected
    outcomes = {**injected(*kinds), "kill": Counter({"heal_error": 1, "skipped": 2})}
    assert inconclusive_reasons(kinds, scheduled, outcomes, refused(writes=1)) == []


@pytest.mark.parametrize(("scheduled", "outcomes", "expected"), [
    (0, Counter(), "fault 'kill' never happened: not scheduled (the fault period is too short"),
    (2, Counter(), "fault 'kill' never happened: scheduled 2 time(s), but the fault period "
                   "ended before it started"),
    (3, Counter({"skipped": 2, "error": 1}),
     "fault 'kill' never happened: tried 3 time(s), never injected (1 error, 2 skipped"),
])
def test_a_fault_kind_that_never_happened_makes_the_run_inconclusive(
    scheduled: int, outcomes: Counter[str], expected: str
) -> None:
    kinds = ("pause-at-check", "kill")
    reasons = inconclusive_reasons(kinds, Counter({"pause-at-check": 1, "kill": scheduled}),
                                   {**injected("pause-at-check"), "kill": outcomes},
                                   refused(writes=3))
    assert len(reasons) == 1 and reasons[0].startswith(expected), reasons


def test_without_pause_at_check_the_fence_was_never_tested() -> None:
    kinds = ("pause", "skew")
    (reason,) = inconclusive_reasons(kinds, Counter(kinds), injected(*kinds), refused())
    assert reason.startswith("no fault class that can produce a stale write was exercised")
    assert reason.endswith("faults: pause, skew): the fence was never tested")
    # a random pause may get a stale write refused, but not reproducibly: still inconclusive
    (reason,) = inconclusive_reasons(kinds, Counter(kinds), injected(*kinds), refused(writes=2))
    assert "the fence was not tested on purpose (2 stale action(s) refused by chance" in reason
    # no faults at all
    (reason,) = inconclusive_reasons((), Counter(), {}, refused())
    assert "faults: none): the fence was never tested" in reason


def test_pause_at_check_without_a_refused_stale_action_did_not_test_the_fence() -> None:
    kinds = ("pause-at-check", "kill")
    outcomes = {"pause-at-check": Counter({"healed": 2, "skipped": 1}),
                "kill": Counter({"healed": 1})}
    (reason,) = inconclusive_reasons(kinds, Counter(kinds), outcomes, refused())
    assert reason.startswith("pause-at-check 2 time(s) ran, but no stale write was rejected by "
                             "the fence and no stale completion refused by the store: the fence "
                             "was never tested")
    # asked for, never injected: both reasons
    reasons = inconclusive_reasons(kinds, Counter(kinds),
                                   {**outcomes, "pause-at-check": Counter({"skipped": 1})},
                                   refused())
    assert [r.split(" ")[0] for r in reasons] == ["fault", "no"]


def _faulted_run(faults: list[str], fault_ops: list[tuple[str, str]], *,
                 stale_write: bool) -> History:
    h = History()
    h.ops[0] = op("verifier", "run", "ok", job=None, jobs=["j"], faults=faults,
                  schedule=[{"kind": kind, "at_s": 1.0} for kind, _ in fault_ops])
    h.claim("A", 1).check("A", 1).write("A", 1, 0).claim("B", 2).check("B", 2).write("B", 2, 0)
    if stale_write:
        h.write("A", 1, 1, accepted=False)
    h.check("B", 2).write("B", 2, 1).check("B", 2).write("B", 2, 2).complete("B", 2)
    h.final("completed", 2)
    h.ops += [op("nemesis", "fault", outcome, None, kind=kind) for kind, outcome in fault_ops]
    return h


def test_check_reads_what_was_asked_for_planned_and_done_from_the_history() -> None:
    h = _faulted_run(["pause-at-check", "kill", "skew"],
                     [("pause-at-check", "healed"), ("kill", "skipped"), ("kill", "healed")],
                     stale_write=True)
    report = check(h.ops, h.effects)
    assert report.ok and not report.conclusive
    assert report.faults_requested == ("pause-at-check", "kill", "skew")
    assert report.faults_scheduled == Counter({"pause-at-check": 1, "kill": 2})
    assert report.fault_outcomes["kill"] == Counter({"skipped": 1, "healed": 1})
    assert dict(report.faults) == {"pause-at-check": 1, "kill": 1}
    assert [r[:30] for r in report.inconclusive] == ["fault 'skew' never happened: n"]

    h = _faulted_run(["pause-at-check", "kill"],
                     [("pause-at-check", "healed"), ("kill", "healed")], stale_write=True)
    report = check(h.ops, h.effects)
    assert report.ok and report.conclusive and report.inconclusive == []
    h = _faulted_run(["pause-at-check", "kill"],
                     [("pause-at-check", "healed"), ("kill", "healed")], stale_write=False)
    report = check(h.ops, h.effects)
    assert report.ok and not report.conclusive
    assert "the fence was never tested" in report.inconclusive[0]


def test_without_a_run_operation_the_faults_tried_stand_for_those_asked_for() -> None:
    h = History().claim("A", 1).write("A", 1, 0).claim("B", 2).write("B", 2, 0)
    h.write("A", 1, 1, accepted=False).complete("B", 2).final("completed", 2)
    h.ops = [*h.ops[1:], op("nemesis", "fault", "healed", None, kind="pause-at-check"),
             op("nemesis", "fault", "skipped", None, kind="kill")]
    report = check(h.ops, h.effects, jobs=["j"])
    assert report.faults_requested == ("pause-at-check", "kill")
    assert len(report.inconclusive) == 1 and "'kill' never happened: tried 1" in report.inconclusive[0]


# -- properties ------------------------------------------------------------------------


def _history_from_tokens(tokens: list[int]) -> History:
    h = History()
    for gen in sorted(set(tokens)):
        h.claim(f"w{gen}", gen)
    for step, token in enumerate(tokens):
        h.write(f"w{token}", token, step)
    last = tokens[-1]
    return h.complete(f"w{last}", last).final("completed", last)


@given(st.lists(st.integers(1, 6), min_size=1, max_size=30))
def test_token_order_violations_iff_not_sorted(tokens: list[int]) -> None:
    """Stale and interleaving counts are zero exactly when the acceptance order is
    non-decreasing, and the stale count is the number of drops below the running max."""
    report = check(*_as_args(_history_from_tokens(tokens)))
    expected_stale = sum(1 for i, t in enumerate(tokens) if i and t < max(tokens[:i]))
    assert report.violations["stale_effects"] == expected_stale
    clean = tokens == sorted(tokens)
    assert (report.violations["stale_effects"] + report.violations["interleaved_generations"]
            == 0) == clean


@given(st.lists(st.integers(1, 4), min_size=1, max_size=8).map(sorted),
       st.integers(0, 40), st.integers(1, 5))
def test_a_fenced_history_with_an_inserted_stale_effect_fails(
    tokens: list[int], position: int, lower_by: int
) -> None:
    h = _history_from_tokens(tokens)
    assert check(*_as_args(h)).ok
    # Accept one more effect of an older generation somewhere after a newer one.
    at = position % len(h.effects)
    newer = max(e.token for e in h.effects[: at + 1])
    stale = newer - lower_by
    if stale < 1 or stale not in tokens:
        return
    h.ops.append(op(f"w{stale}", "write", "accepted", "j", stale, effect_id="late"))
    effects = [*h.effects[: at + 1], Effect(0, "j", stale, "late", b""), *h.effects[at + 1:]]
    renumbered = [Effect(i + 1, e.resource, e.token, e.effect_id, e.payload)
                  for i, e in enumerate(effects)]
    assert check(h.ops, renumbered).violations["stale_effects"] >= 1


def _as_args(h: History) -> tuple[list[Op], list[Effect]]:
    return h.ops, h.effects
