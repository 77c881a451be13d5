"""The destination-side fence."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import consensus_lease
from consensus_lease import FenceRejected, InvalidArgument
from consensus_lease.fencing import Fence, FenceOutcome, SqliteFence


@pytest.fixture
def fence(tmp_path: Path) -> SqliteFence:
    return SqliteFence(str(tmp_path / "dest.db"))


def test_accepts_equal_and_higher_rejects_lower(fence: SqliteFence) -> None:
    assert fence.apply("job", 7, "step-1") is FenceOutcome.ACCEPTED
    assert fence.apply("job", 7, "step-2") is FenceOutcome.ACCEPTED
    assert fence.apply("job", 8, "step-1") is FenceOutcome.ACCEPTED
    with pytest.raises(FenceRejected) as rejected:
        fence.apply("job", 7, "step-3")
    assert rejected.value.highest_seen == 8 and rejected.value.generation == 7
    assert fence.highest_token("job") == 8
    assert [(e.token, e.effect_id) for e in fence.effects("job")] == [
        (7, "step-1"), (7, "step-2"), (8, "step-1"),
    ]


def test_rejection_hints_at_a_store_restore_only_when_it_looks_like_one(
    fence: SqliteFence,
) -> None:
    """A token of an earlier store epoch (token >> 32), or more than 2**31 below the
    highest, gets a hint naming bump-epoch with the highest token; an ordinary stale
    token does not."""
    fence.apply("job", 9, "x")
    with pytest.raises(FenceRejected) as plain:
        fence.apply("job", 8, "x")
    assert "bump-epoch" not in str(plain.value)
    highest = (1 << 32) + 3  # epoch 1
    fence.apply("job", highest, "y")
    with pytest.raises(FenceRejected) as earlier_epoch:
        fence.apply("job", 12, "z")  # epoch 0: e.g. a wiped store that lost its epoch
    message = str(earlier_epoch.value)
    assert "earlier store epoch" in message and "restored" in message
    assert f"consensus-lease bump-epoch --backend URL --above {highest}" in message
    far = (5 << 44) + 2**32 - 1  # an etcd token (44-bit split) of epoch 5
    fence.apply("far", far, "x")
    with pytest.raises(FenceRejected) as far_below:
        fence.apply("far", far - 2**31 - 1, "y")
    assert f"--above {far}" in str(far_below.value) and "far below" in str(far_below.value)
    with pytest.raises(FenceRejected) as near:
        fence.apply("far", far - 2**31, "y")
    assert "bump-epoch" not in str(near.value)


def test_resources_are_fenced_independently(fence: SqliteFence) -> None:
    fence.apply("a", 9, "x")
    assert fence.apply("b", 1, "x") is FenceOutcome.ACCEPTED


def test_idempotency_key_makes_retry_a_no_op(fence: SqliteFence) -> None:
    assert fence.apply("job", 3, "charge", b"$10") is FenceOutcome.ACCEPTED
    assert fence.apply("job", 3, "charge", b"$10") is FenceOutcome.DUPLICATE
    assert len(fence.effects()) == 1
    fence.apply("job", 4, "charge")
    with pytest.raises(FenceRejected):  # stale: the token check comes first
        fence.apply("job", 3, "charge", b"$10")
    assert len(fence.effects()) == 2


def test_rejected_effect_changes_nothing(fence: SqliteFence) -> None:
    fence.apply("job", 5, "a")
    with pytest.raises(FenceRejected):
        fence.apply("job", 4, "b")
    assert [e.effect_id for e in fence.effects()] == ["a"]


def test_unfenced_mode_lets_stale_tokens_through(tmp_path: Path) -> None:
    fence = SqliteFence(str(tmp_path / "d.db"), enforce_tokens=False)
    fence.apply("job", 5, "a")
    assert fence.apply("job", 4, "b") is FenceOutcome.ACCEPTED


def test_shared_between_handles(tmp_path: Path) -> None:
    one, two = SqliteFence(str(tmp_path / "d.db")), SqliteFence(str(tmp_path / "d.db"))
    one.apply("job", 2, "a")
    with pytest.raises(FenceRejected):
        two.apply("job", 1, "b")


@pytest.mark.parametrize(
    ("resource", "token", "effect"),
    [("", 1, "e"), ("job", 0, "e"), ("job", True, "e"), ("job", 1.5, "e"), ("job", 1, "")],
)
def test_bad_input(fence: SqliteFence, resource: str, token: int, effect: str) -> None:
    with pytest.raises(InvalidArgument):
        fence.apply(resource, token, effect)
    assert fence.effects() == []


@pytest.mark.parametrize("payload", [5, [1, 2, 3], "text", None])
def test_non_bytes_payload_rejected(fence: SqliteFence, payload: object) -> None:
    with pytest.raises(InvalidArgument):
        fence.apply("job", 1, "e", payload)  # type: ignore[arg-type]
    assert fence.effects() == []


def test_token_beyond_int64_rejected(fence: SqliteFence) -> None:
    with pytest.raises(InvalidArgument):
        fence.apply("job", 2**63, "e")


def test_effect_id_limit_is_the_sql_fences(fence: SqliteFence) -> None:
    """The same limit as SqlFence (its VARCHAR(256) column), one constant, one error:
    a 256-character id (4-byte characters too) is taken, 257 or 300 refused, nothing
    recorded."""
    from consensus_lease import fencing, fencing_sql

    assert fencing_sql.MAX_EFFECT_ID_CHARS is fencing.MAX_EFFECT_ID_CHARS == 256
    for too_long in ("x" * 257, "x" * 300, "\U0001f600" * 257):
        with pytest.raises(InvalidArgument, match="effect_id must be at most 256 characters"):
            fence.apply("job", 1, too_long)
    assert fence.effects() == [] and fence.highest_token("job") is None
    assert fence.apply("job", 1, "x" * 256) is FenceOutcome.ACCEPTED
    assert fence.apply("job", 1, "\U0001f600" * 256) is FenceOutcome.ACCEPTED


# -- once per job ------------------------------------------------------------------------

STEPS = ("step-1", "step-2", "step-3")


def test_once_per_job_takeover_applies_each_effect_once(fence: SqliteFence) -> None:
    """A (token 1) applies 2 of 3 steps and is paused; B (token 2) runs all 3: one new
    effect, two ALREADY_APPLIED; A's late writes are rejected."""
    for step in STEPS[:2]:
        assert fence.apply("job", 1, step, b"A", once_per_job=True) is FenceOutcome.ACCEPTED
    b_outcomes = [fence.apply("job", 2, step, b"B", once_per_job=True) for step in STEPS]
    assert b_outcomes == [
        FenceOutcome.ALREADY_APPLIED, FenceOutcome.ALREADY_APPLIED, FenceOutcome.ACCEPTED,
    ]
    for step in ("step-3", "step-1"):  # late A: not applied, and told it lost the job
        with pytest.raises(FenceRejected) as rejected:
            fence.apply("job", 1, step, b"A", once_per_job=True)
        assert rejected.value.highest_seen == 2 and rejected.value.generation == 1
    assert Counter(e.effect_id for e in fence.effects("job")) == dict.fromkeys(STEPS, 1)
    done = fence.applied("job")
    assert [(i, e.token, e.payload) for i, e in done.items()] == [
        ("step-1", 1, b"A"), ("step-2", 1, b"A"), ("step-3", 2, b"B"),
    ]
    assert fence.highest_token("job") == 2


def test_default_mode_redoes_steps_after_takeover(fence: SqliteFence) -> None:
    """The problem once_per_job solves: keyed with the token, B's steps are new effects."""
    fence.apply("job", 1, "charge")
    assert fence.apply("job", 2, "charge") is FenceOutcome.ACCEPTED
    assert [e.token for e in fence.effects("job")] == [1, 2]


def test_once_per_job_repeat_records_the_newer_token(fence: SqliteFence) -> None:
    fence.apply("job", 1, "step-1", once_per_job=True)
    assert fence.apply("job", 2, "step-1", once_per_job=True) is FenceOutcome.ALREADY_APPLIED
    assert fence.highest_token("job") == 2
    with pytest.raises(FenceRejected):  # A is fenced out by B's repeat alone
        fence.apply("job", 1, "step-2", once_per_job=True)
    assert list(fence.applied("job")) == ["step-1"]


def test_once_per_job_retry_with_the_same_token(fence: SqliteFence) -> None:
    assert fence.apply("job", 3, "charge", once_per_job=True) is FenceOutcome.ACCEPTED
    assert fence.apply("job", 3, "charge", once_per_job=True) is FenceOutcome.ALREADY_APPLIED
    assert len(fence.effects()) == 1


def test_once_per_job_sees_effects_applied_in_default_mode(fence: SqliteFence) -> None:
    fence.apply("job", 1, "charge")
    assert fence.apply("job", 2, "charge", once_per_job=True) is FenceOutcome.ALREADY_APPLIED
    assert fence.apply("other", 2, "charge", once_per_job=True) is FenceOutcome.ACCEPTED


def test_applied_keeps_the_first_of_repeated_ids(fence: SqliteFence) -> None:
    assert fence.applied("job") == {}
    fence.apply("job", 1, "b")
    fence.apply("job", 1, "a")
    fence.apply("job", 2, "b")  # default mode: a second "b"
    assert [(i, e.token) for i, e in fence.applied("job").items()] == [("b", 1), ("a", 1)]


def test_unfenced_once_per_job_still_dedupes(tmp_path: Path) -> None:
    fence = SqliteFence(str(tmp_path / "d.db"), enforce_tokens=False)
    fence.apply("job", 5, "a", once_per_job=True)
    assert fence.apply("job", 4, "a", once_per_job=True) is FenceOutcome.ALREADY_APPLIED
    assert fence.apply("job", 4, "b", once_per_job=True) is FenceOutcome.ACCEPTED
    assert fence.highest_token("job") == 5


@pytest.mark.parametrize("flag", [1, 0, "yes", None, 1.0])
def test_non_bool_once_per_job_rejected(fence: SqliteFence, flag: object) -> None:
    with pytest.raises(InvalidArgument, match="once_per_job"):
        fence.apply("job", 1, "e", once_per_job=flag)  # type: ignore[arg-type]
    assert fence.effects() == [] and fence.highest_token("job") is None


def test_applied_rejects_a_bad_resource(fence: SqliteFence) -> None:
    with pytest.raises(InvalidArgument):
        fence.applied("")


def test_sqlite_fence_is_a_fence(fence: SqliteFence) -> None:
    as_protocol: Fence = fence  # mypy checks the structural match
    assert as_protocol.apply("job", 1, "e", once_per_job=True) is FenceOutcome.ACCEPTED


RACER = r"""
import sys
from consensus_lease.fencing import SqliteFence
fence = SqliteFence(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    print(fence.apply("job", 1, line.strip(), once_per_job=True).value, flush=True)
"""


def _child_env() -> dict[str, str]:
    """The children import the consensus_lease under test, not an installed one."""
    root = str(Path(consensus_lease.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def test_processes_racing_one_effect_with_one_token(tmp_path: Path) -> None:
    """Two processes, released together each round, apply the same once-per-job effect
    with the same token: exactly one is ACCEPTED, the other ALREADY_APPLIED."""
    path, rounds = str(tmp_path / "race.db"), 40
    SqliteFence(path).close()  # create the tables before the race
    procs = [
        subprocess.Popen([sys.executable, "-c", RACER, path], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_child_env())
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for r in range(rounds):
            for proc in procs:  # release both children back to back
                assert proc.stdin is not None
                proc.stdin.write(f"effect-{r}\n")
                proc.stdin.flush()
            outcomes = sorted(proc.stdout.readline().strip() for proc in procs if proc.stdout)
            assert outcomes == ["accepted", "already_applied"], (r, outcomes)
    finally:
        for proc in procs:
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
    counts = Counter(e.effect_id for e in SqliteFence(path).effects("job"))
    assert counts == {f"effect-{r}": 1 for r in range(rounds)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.sampled_from("abcd")), max_size=20))
def test_once_per_job_matches_a_model(ops: list[tuple[int, str]]) -> None:
    """Random interleavings of holders' once-per-job effects agree with the rule: stale
    token -> rejected; else applied iff never applied before; highest = max token seen."""
    with tempfile.TemporaryDirectory() as tmp:
        fence = SqliteFence(os.path.join(tmp, "d.db"))
        highest: int | None = None
        done: list[tuple[str, int]] = []
        for token, effect in ops:
            if highest is not None and token < highest:
                with pytest.raises(FenceRejected):
                    fence.apply("job", token, effect, once_per_job=True)
                continue
            outcome = fence.apply("job", token, effect, once_per_job=True)
            highest = token
            if effect in {e for e, _ in done}:
                assert outcome is FenceOutcome.ALREADY_APPLIED
            else:
                assert outcome is FenceOutcome.ACCEPTED
                done.append((effect, token))
        assert [(i, e.token) for i, e in fence.applied("job").items()] == done
        assert len(fence.effects()) == len(done)
        assert fence.highest_token("job") == highest
        fence.close()


def test_fence_inputs_and_closed_fence_give_named_errors(tmp_path: Path) -> None:
    """Found by a newcomer: raw UnicodeEncodeError / sqlite3 errors escaped."""
    from consensus_lease import BackendUnavailable, InvalidArgument, SqliteFence

    fence = SqliteFence(str(tmp_path / "f.db"))
    for bad in ("\udcff", "nul\0", "x" * 2000):
        with pytest.raises(InvalidArgument):
            fence.apply("job", 7, bad)
    for bad_resource in ("", "a\0", 5):
        with pytest.raises(InvalidArgument):
            fence.highest_token(bad_resource)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            fence.effects(bad_resource)  # type: ignore[arg-type]
    assert fence.effects() == []
    fence.close()
    with pytest.raises(BackendUnavailable):
        fence.highest_token("job")
    with pytest.raises(BackendUnavailable):
        fence.effects("job")
