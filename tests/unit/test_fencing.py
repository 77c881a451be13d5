"""The destination-side fence."""

from __future__ import annotations

from pathlib import Path

import pytest

from consensus_lease import FenceRejected, InvalidArgument
from consensus_lease.fencing import FenceOutcome, SqliteFence


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


def test_resources_are_fenced_independently(fence: SqliteFence) -> None:
    fence.apply("a", 9, "x")
    assert fence.apply("b", 1, "x") is FenceOutcome.ACCEPTED


def test_idempotency_key_makes_retry_a_no_op(fence: SqliteFence) -> None:
    assert fence.apply("job", 3, "charge", b"$10") is FenceOutcome.ACCEPTED
    assert fence.apply("job", 3, "charge", b"$10") is FenceOutcome.DUPLICATE
    assert len(fence.effects()) == 1


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
