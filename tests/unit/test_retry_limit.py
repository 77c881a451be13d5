"""A retry delay over the limit (a year, ``MAX_RETRY_IN_S``) is refused with that limit
on every path, however large it is: above ``threading.TIMEOUT_MAX`` (about 9.2e9 s) it
once named the longest wait of a thread instead."""

from __future__ import annotations

import pytest

from consensus_lease import InvalidArgument, LeaseState, RetryPolicy, open_store
from consensus_lease.validation import MAX_RETRY_IN_S
from consensus_lease.worker import Retry

LIMIT = f"at most {MAX_RETRY_IN_S:.0f} s (a year"

OVER = [MAX_RETRY_IN_S + 1, 1e10, 1e300, 10**30, 10**400,  # 10**400: past a float
        pytest.param(10**5000, id="int-past-repr")]  # its repr raises (4,300 digits)


@pytest.mark.parametrize("delay", OVER)
def test_lease_fail_names_the_year_limit(delay: float) -> None:
    with open_store("memory://") as store:
        session = store.session("W", 30.0)
        lease = session.claim("j")
        assert lease is not None
        with pytest.raises(InvalidArgument) as info:
            lease.fail("boom", retry_in_s=delay)
        assert f"retry_in_s must be {LIMIT}" in str(info.value)
        assert "thread" not in str(info.value)
        assert lease.state is LeaseState.HELD  # nothing sent


@pytest.mark.parametrize("delay", OVER)
def test_fail_many_names_the_year_limit_and_the_item(delay: float) -> None:
    with open_store("memory://") as store:
        session = store.session("W", 30.0)
        a, b = session.claim("a"), session.claim("b")
        assert a is not None and b is not None
        with pytest.raises(InvalidArgument) as info:
            session.fail_many([(a, "x", 1.0), (b, "y", delay)])
        text = str(info.value)
        assert text.startswith("item 1: ") and f"retry_in_s must be {LIMIT}" in text
        assert info.value.job_id == "b"
        assert a.state is LeaseState.HELD and b.state is LeaseState.HELD


@pytest.mark.parametrize("delay", OVER)
def test_worker_retry_names_the_year_limit(delay: float) -> None:
    with pytest.raises(InvalidArgument, match=r"retry_in_s must be at most 31622400 s \(a year"):
        Retry(delay)


@pytest.mark.parametrize("field", ["initial_s", "max_s"])
@pytest.mark.parametrize("delay", [MAX_RETRY_IN_S + 1, 1e10, 1e300])
def test_retry_policy_names_the_year_limit(field: str, delay: float) -> None:
    with pytest.raises(InvalidArgument) as info:
        RetryPolicy(**{field: delay})
    assert f"RetryPolicy.{field} must be {LIMIT}" in str(info.value)


def test_the_limit_itself_and_the_other_refusals() -> None:
    assert Retry(MAX_RETRY_IN_S).delay_s == MAX_RETRY_IN_S
    with pytest.raises(InvalidArgument, match="retry_in_s must be >= 0, got -1"):
        Retry(-1)
    with pytest.raises(InvalidArgument, match="retry_in_s must be finite"):
        Retry(float("inf"))
    with pytest.raises(InvalidArgument, match="must be a number of seconds, not str"):
        Retry("1")  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [10**400, pytest.param(10**5000, id="int-past-repr")])
def test_a_ttl_past_a_float_is_outside_the_range(ttl: int) -> None:
    with open_store("memory://") as store, pytest.raises(InvalidArgument) as info:
        store.session("W", ttl)
    assert "is outside this backend's range" in str(info.value)
    assert "bits" in str(info.value)
