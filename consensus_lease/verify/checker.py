"""The checker: a pure function from (history, destination effects) to a report.

It trusts nothing the workers *believe*: what counts is what the destination accepted
(its effects, in acceptance order ``seq`` per job) and what the store finally recorded
(the verifier's ``final`` operations). Times are not compared, so clock skew on a worker
cannot hide or invent a violation. Per job it counts:

====================================  ==================================================
violation (must be 0)                 definition
====================================  ==================================================
``stale_effects``                     accepted effects whose token is lower than one
                                      already accepted for the job (in ``seq`` order)
``interleaved_generations``           an accepted effect of a generation whose run of
                                      effects had already been interrupted by another
                                      generation (tokens ``1 2 1`` or ``1 2 1 2``)
``multiple_completions``              distinct generations completing the job, minus one
``completed_not_by_last_writer``      the completing generation is not the token of the
                                      job's last accepted effect
``claimed_after_completion``          successful claims at a generation above the
                                      (first) completing one (the store must refuse them)
``not_completed``                     the store's final record is not COMPLETED
``destination_mismatch``              a write the worker saw accepted that the
                                      destination does not have, or an effect in the
                                      destination that no worker ever sent
====================================  ==================================================

and, to show the faults did something, the counts listed in :data:`COUNTS`.

Zero violations is not yet a pass: the run must also have tested what it claims to
test. :func:`inconclusive_reasons` (a pure function too; its result is
``Report.inconclusive``) lists why a run without violations proves nothing:

* a fault kind asked for (the ``run`` operation's ``faults``) that never happened — not
  scheduled (the fault period is too short), scheduled but never started (earlier faults
  outlasted the fault period), or only ``skipped`` / ``error`` when tried;
* the fence was never tested: no fault kind that puts a stale write in front of the
  fence by design (:data:`~consensus_lease.verify.nemesis.STALE_FAULTS`:
  ``pause-at-check``) was exercised, or it was and still no stale write was rejected by
  the fence and no stale completion refused by the store.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..fencing import Effect
from .history import INDETERMINATE, Op

__all__ = ["COUNTS", "STALE_FAULTS", "VIOLATIONS", "JobReport", "Report", "check",
           "inconclusive_reasons"]

VIOLATIONS = (
    "stale_effects",
    "interleaved_generations",
    "multiple_completions",
    "completed_not_by_last_writer",
    "claimed_after_completion",
    "not_completed",
    "destination_mismatch",
)

COUNTS = (
    "claims",
    "claim_attempts",
    "renewals",
    "renewals_rejected",
    "losses_detected",
    "sessions_lost",
    "stale_completions_rejected",
    "stale_writes_rejected",
    "effects_accepted",
    "duplicate_writes",
    "writes_indeterminate",
    "completions",
)
"""``claims``: successful claims. ``renewals`` / ``renewals_rejected``: explicit
``lease.renew()`` calls that succeeded / were refused by the store. ``losses_detected``:
``ensure_held()`` or ``renew()`` calls that told the worker its lease was no longer held.
``sessions_lost``: sessions that reported loss. ``stale_completions_rejected``:
``complete()`` calls the store refused. ``stale_writes_rejected``: writes the fence
refused. ``writes_indeterminate``: writes whose worker died before seeing the answer."""

STALE_FAULTS = ("pause-at-check",)
"""Fault kinds that put a stale action in front of the fence by design: the worker is
stopped between a passed check and its write (or completion) until that action is surely
stale. A ``pause`` may do the same by chance (not reproducibly); ``kill`` never does (a
killed worker sends nothing more); ``skew`` and the cluster faults must change nothing."""
INJECTED = frozenset({"healed", "heal_error"})
"""Outcomes of a ``fault`` operation that was injected."""

_LOST = frozenset({"lost", "expired", "stale", "suspended"})
_STORE_REFUSED = frozenset({"lost", "expired", "stale"})
MAX_EXAMPLES = 20


@dataclass
class JobReport:
    """What the checker found for one job.

    Attributes:
        job: the job id.
        violations: count per name in :data:`VIOLATIONS`.
        counts: count per name in :data:`COUNTS`.
        completed_generation: the generation that completed it (store, else history).
        tokens: tokens of the accepted effects, in acceptance order.
    """

    job: str
    violations: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    completed_generation: int | None = None
    tokens: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())


@dataclass
class Report:
    """The checker's verdict.

    Attributes:
        jobs: per-job reports, by job id.
        violations / counts: totals over all jobs.
        faults: faults injected (and healed) per kind, from the ``fault`` operations.
        examples: human-readable explanations of the first violations found.
        faults_requested: the fault kinds the run asked for.
        faults_scheduled: planned faults per kind (the ``run`` operation's schedule).
        fault_outcomes: per kind, how its ``fault`` operations ended (``healed``,
            ``heal_error``, ``skipped``, ``error``, ``indeterminate``).
        inconclusive: why the run proves nothing even without violations (see
            :func:`inconclusive_reasons`); empty when it does.
    """

    jobs: dict[str, JobReport]
    violations: Counter[str]
    counts: Counter[str]
    faults: Counter[str]
    examples: list[str]
    faults_requested: tuple[str, ...] = ()
    faults_scheduled: Counter[str] = field(default_factory=Counter)
    fault_outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    inconclusive: list[str] = field(default_factory=list)

    @property
    def total_violations(self) -> int:
        return sum(self.violations.values())

    @property
    def ok(self) -> bool:
        """True iff every violation count is zero (see also :attr:`conclusive`)."""
        return self.total_violations == 0

    @property
    def conclusive(self) -> bool:
        """True iff every fault kind asked for happened and the fence was tested."""
        return not self.inconclusive


def _runs_report(job: JobReport, effects: Sequence[Effect], examples: list[str]) -> None:
    """Stale tokens and interleaved generations, from the acceptance order."""
    highest: int | None = None
    ended: set[int] = set()
    previous: int | None = None
    for effect in effects:
        token = effect.token
        if highest is not None and token < highest:
            job.violations["stale_effects"] += 1
            examples.append(f"{job.job}: effect {effect.effect_id!r} (seq {effect.seq}) "
                            f"accepted with token {token} after token {highest}")
        if previous is not None and token != previous:
            ended.add(previous)
            if token in ended:
                job.violations["interleaved_generations"] += 1
                examples.append(f"{job.job}: generation {token} wrote again (seq "
                                f"{effect.seq}) after generation {previous} had written")
        highest = token if highest is None else max(highest, token)
        previous = token
        job.tokens.append(token)


def _completion_report(job: JobReport, ops: Sequence[Op], examples: list[str]) -> None:
    completed_ok = {o.generation for o in ops if o.op == "complete" and o.outcome == "ok"}
    finals = [o for o in ops if o.op == "final"]
    final_completed = [o.generation for o in finals if o.detail.get("state") == "completed"]
    generations = {g for g in completed_ok | set(final_completed) if g is not None}
    if len(generations) > 1:
        job.violations["multiple_completions"] += len(generations) - 1
        examples.append(f"{job.job}: completed by generations {sorted(generations)}")
    if final_completed:
        job.completed_generation = final_completed[-1]
    elif finals:
        job.completed_generation = None  # the store says it is not completed
    elif generations:
        job.completed_generation = max(generations)
    if job.completed_generation is None:
        job.violations["not_completed"] += 1
        state = finals[-1].detail.get("state") if finals else "no final record"
        examples.append(f"{job.job}: not completed at the end (store: {state})")
        return
    if job.tokens and job.tokens[-1] != job.completed_generation:
        job.violations["completed_not_by_last_writer"] += 1
        examples.append(f"{job.job}: completed by generation {job.completed_generation} but "
                        f"the last accepted effect carries token {job.tokens[-1]}")
    first = min(generations | {job.completed_generation})
    for claim in ops:
        if (claim.op == "claim" and claim.outcome == "claimed" and claim.generation is not None
                and claim.generation > first):
            job.violations["claimed_after_completion"] += 1
            examples.append(f"{job.job}: claimed at generation {claim.generation} by "
                            f"{claim.process} after generation {first} completed it")


def _mismatch_report(job: JobReport, ops: Sequence[Op], effects: Sequence[Effect],
                     examples: list[str]) -> None:
    in_destination = {(e.token, e.effect_id) for e in effects}
    sent = {(o.generation, str(o.detail.get("effect_id"))) for o in ops if o.op == "write"}
    for o in ops:
        key = (o.generation, str(o.detail.get("effect_id")))
        if o.op == "write" and o.outcome in ("accepted", "duplicate") and key not in in_destination:
            job.violations["destination_mismatch"] += 1
            examples.append(f"{job.job}: {o.process}'s write {key[1]!r} token {key[0]} was "
                            f"{o.outcome} but the destination does not have it")
    for e in effects:
        if (e.token, e.effect_id) not in sent:
            job.violations["destination_mismatch"] += 1
            examples.append(f"{job.job}: destination has {e.effect_id!r} token {e.token} that "
                            "no worker sent")


def _counts(job: JobReport, ops: Sequence[Op], effects: Sequence[Effect]) -> None:
    c = job.counts
    for o in ops:
        if o.op == "claim":
            c["claim_attempts"] += 1
            c["claims"] += o.outcome == "claimed"
        elif o.op == "renew":
            c["renewals"] += o.outcome == "ok"
            c["renewals_rejected"] += o.outcome in _STORE_REFUSED
            c["losses_detected"] += o.outcome in _LOST
        elif o.op == "check":
            c["losses_detected"] += o.outcome in _LOST
        elif o.op == "complete":
            c["completions"] += o.outcome == "ok"
            c["stale_completions_rejected"] += o.outcome in _STORE_REFUSED
        elif o.op == "write":
            c["stale_writes_rejected"] += o.outcome == "fence_rejected"
            c["duplicate_writes"] += o.outcome == "duplicate"
            c["writes_indeterminate"] += o.outcome == INDETERMINATE
    c["effects_accepted"] += len(effects)


def _fault_summary(
    history: Sequence[Op],
) -> tuple[tuple[str, ...], Counter[str], dict[str, Counter[str]]]:
    """(kinds asked for, planned faults per kind, outcomes per kind) from the ``run``
    and ``fault`` operations; without a ``run`` operation, the kinds tried stand for
    both what was asked for and what was planned."""
    requested: list[str] | None = None
    scheduled: Counter[str] | None = None
    for o in history:
        if o.op != "run":
            continue
        if isinstance(o.detail.get("faults"), list):
            requested = [str(kind) for kind in o.detail["faults"]]
        if isinstance(o.detail.get("schedule"), list):
            scheduled = Counter(str(p.get("kind")) for p in o.detail["schedule"]
                                if isinstance(p, dict))
    outcomes: dict[str, Counter[str]] = {}
    for o in history:
        if o.op == "fault":
            outcomes.setdefault(str(o.detail.get("kind")), Counter())[o.outcome] += 1
    if requested is None:
        requested = list(outcomes)
    if scheduled is None:
        scheduled = Counter({kind: sum(c.values()) for kind, c in outcomes.items()})
    return tuple(dict.fromkeys(requested)), scheduled, outcomes


def _injected(outcomes: Counter[str]) -> int:
    return sum(n for outcome, n in outcomes.items() if outcome in INJECTED)


def _fault_missing(kind: str, scheduled: int, tried: Counter[str]) -> str | None:
    """Why fault ``kind`` never happened, or ``None`` if it did."""
    if _injected(tried):
        return None
    if not scheduled:
        return (f"fault {kind!r} never happened: not scheduled (the fault period is too "
                "short to reach it; raise --duration-s)")
    if not tried:
        return (f"fault {kind!r} never happened: scheduled {scheduled} time(s), but the "
                "fault period ended before it started (earlier faults outlasted their "
                "planned holds; raise --duration-s)")
    how = ", ".join(f"{n} {outcome}" for outcome, n in sorted(tried.items()))
    return (f"fault {kind!r} never happened: tried {sum(tried.values())} time(s), never "
            f"injected ({how}; see the history's fault operations)")


def _fence_untested(requested: Sequence[str], outcomes: Mapping[str, Counter[str]],
                    counts: Mapping[str, int]) -> str | None:
    """Why the fence was not tested, or ``None`` if it was."""
    refused = counts["stale_writes_rejected"] + counts["stale_completions_rejected"]
    ran = {kind: _injected(outcomes.get(kind, Counter())) for kind in STALE_FAULTS}
    by_design = " or ".join(STALE_FAULTS)
    if not any(ran.values()):
        text = (f"no fault class that can produce a stale write was exercised (only "
                f"{by_design} stops a worker between its check and its write by design; "
                f"faults: {', '.join(requested) or 'none'})")
        if refused:
            return (f"{text}: the fence was not tested on purpose ({refused} stale "
                    "action(s) refused by chance, which the seed does not reproduce)")
        return f"{text}: the fence was never tested"
    if refused:
        return None
    times = ", ".join(f"{kind} {n} time(s)" for kind, n in ran.items() if n)
    return (f"{times} ran, but no stale write was rejected by the fence and no stale "
            "completion refused by the store: the fence was never tested (no other "
            "worker took the stopped worker's job over: too few workers?)")


def inconclusive_reasons(requested: Sequence[str], scheduled: Mapping[str, int],
                         outcomes: Mapping[str, Counter[str]],
                         counts: Mapping[str, int]) -> list[str]:
    """Why a run proves nothing even with zero violations; empty if it does.

    Args:
        requested: the fault kinds the run asked for.
        scheduled: planned faults per kind.
        outcomes: per kind, how its ``fault`` operations ended (``healed`` and
            ``heal_error`` mean injected).
        counts: the run's counts (:data:`COUNTS`; ``stale_writes_rejected`` and
            ``stale_completions_rejected`` are read).

    Returns:
        One sentence per reason: each kind in ``requested`` never injected, then the
        fence left untested (see the module docstring).
    """
    reasons = [
        reason for kind in requested
        if (reason := _fault_missing(kind, scheduled.get(kind, 0),
                                     outcomes.get(kind, Counter()))) is not None
    ]
    fence = _fence_untested(requested, outcomes, counts)
    if fence is not None:
        reasons.append(fence)
    return reasons


def _run_jobs(history: Sequence[Op]) -> list[str] | None:
    for o in history:
        if o.op == "run" and isinstance(o.detail.get("jobs"), list):
            return [str(j) for j in o.detail["jobs"]]
    return None


def check(history: Sequence[Op], effects: Iterable[Effect],
          jobs: Sequence[str] | None = None) -> Report:
    """Check a run.

    Args:
        history: every operation of the run (:func:`~consensus_lease.verify.history.read_history`),
            including the verifier's ``final`` operations (the store's last record per
            job: ``detail["state"]``, ``generation``) and its ``run`` operation.
        effects: the destination's accepted effects (any order; ``seq`` orders them).
        jobs: the jobs of the run (default: the ``run`` operation's ``detail["jobs"]``,
            else every job seen).

    Returns:
        A :class:`Report`; ``report.ok`` iff every violation count is zero;
        ``report.conclusive`` iff, in addition, every fault kind asked for (the ``run``
        operation's ``faults``) was injected and the fence was tested (see
        :func:`inconclusive_reasons`).
    """
    all_effects = sorted(effects, key=lambda e: e.seq)
    job_ids = list(jobs) if jobs is not None else _run_jobs(history)
    if job_ids is None:
        seen = {o.job for o in history if o.job is not None} | {e.resource for e in all_effects}
        job_ids = sorted(seen)
    ops_by_job: dict[str, list[Op]] = {j: [] for j in job_ids}
    for o in history:
        if o.job in ops_by_job:
            ops_by_job[o.job].append(o)
    effects_by_job: dict[str, list[Effect]] = {j: [] for j in job_ids}
    for e in all_effects:
        if e.resource in effects_by_job:
            effects_by_job[e.resource].append(e)

    examples: list[str] = []
    reports: dict[str, JobReport] = {}
    for job_id in job_ids:
        job = JobReport(job_id)
        ops, job_effects = ops_by_job[job_id], effects_by_job[job_id]
        _runs_report(job, job_effects, examples)
        _completion_report(job, ops, examples)
        _mismatch_report(job, ops, job_effects, examples)
        _counts(job, ops, job_effects)
        reports[job_id] = job

    violations: Counter[str] = Counter({name: 0 for name in VIOLATIONS})
    counts: Counter[str] = Counter({name: 0 for name in COUNTS})
    for job in reports.values():
        violations.update(job.violations)
        counts.update(job.counts)
    counts["sessions_lost"] += sum(1 for o in history if o.op == "session_lost")
    requested, scheduled, outcomes = _fault_summary(history)
    faults = Counter({kind: _injected(c) for kind, c in outcomes.items() if _injected(c)})
    return Report(reports, violations, counts, faults, examples[:MAX_EXAMPLES],
                  faults_requested=requested, faults_scheduled=scheduled,
                  fault_outcomes=outcomes,
                  inconclusive=inconclusive_reasons(requested, scheduled, outcomes, counts))
