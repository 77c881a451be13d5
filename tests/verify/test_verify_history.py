"""History parts: invoke/return pairs, operations cut short, merging, outcome names."""

from __future__ import annotations

from pathlib import Path

import pytest

from consensus_lease import errors
from consensus_lease.verify.history import (
    INDETERMINATE,
    HistoryWriter,
    outcome_of,
    read_history,
    read_parts,
    write_history,
)


def test_invoke_and_return_pair_into_one_op(tmp_path: Path) -> None:
    rec = HistoryWriter(tmp_path / "w1.jsonl", "w1")
    i = rec.invoke("claim", job="j1", attempt=1)
    rec.ret(i, "claimed", generation=4, note="x")
    rec.event("session_lost", reason="expired")
    rec.close()
    claim, lost = read_parts([tmp_path / "w1.jsonl"])
    assert (claim.process, claim.op, claim.job, claim.generation, claim.outcome) == (
        "w1", "claim", "j1", 4, "claimed")
    assert claim.t_return is not None and claim.t_return >= claim.t_invoke
    assert dict(claim.detail) == {"attempt": 1, "note": "x"}
    assert lost.op == "session_lost" and lost.outcome == "ok" and lost.job is None


def test_an_op_without_return_is_indeterminate_and_a_cut_line_is_ignored(tmp_path: Path) -> None:
    part = tmp_path / "w2.jsonl"
    rec = HistoryWriter(part, "w2")
    rec.invoke("write", job="j", generation=2, effect_id="step-0")
    rec.close()
    with part.open("a") as file:
        file.write('{"p": "w2", "i": 1, "ev": "return", "t": 1.0, "outc')  # SIGKILL mid-line
    (op,) = read_parts([part])
    assert op.outcome == INDETERMINATE and op.t_return is None
    assert op.generation == 2 and op.detail["effect_id"] == "step-0"


def test_parts_merge_in_invocation_order_and_round_trip(tmp_path: Path) -> None:
    a, b = HistoryWriter(tmp_path / "a.jsonl", "a"), HistoryWriter(tmp_path / "b.jsonl", "b")
    a.event("one")
    b.event("two")
    a.event("three", job="j", generation=1)
    a.close()
    b.close()
    ops = read_parts([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert [o.op for o in ops] == ["one", "two", "three"]
    path = write_history(ops, tmp_path / "out" / "history.jsonl")
    assert read_history(path) == ops
    assert len(path.read_text().splitlines()) == 3


@pytest.mark.parametrize(
    ("error", "name"),
    [(errors.FenceRejected("x"), "fence_rejected"), (errors.StaleLeaseError("x"), "stale"),
     (errors.SessionExpired("x"), "expired"), (errors.LeaseLost("x"), "lost"),
     (errors.LeaseSuspended("x"), "suspended"), (errors.JobCompleted("x"), "completed_before"),
     (errors.OutcomeUnknown("x"), "unknown"), (errors.BackendUnavailable("x"), "unavailable"),
     (RuntimeError("x"), "error")],
)
def test_outcome_names(error: BaseException, name: str) -> None:
    assert outcome_of(error) == name
