"""RetryPolicy.delay_s: exponential backoff capped at max_s, full jitter within [0, delay]."""

from __future__ import annotations

import time

import pytest

from consensus_lease import RetryPolicy


def test_exponential_and_capped() -> None:
    policy = RetryPolicy(initial_s=0.5, multiplier=3.0, max_s=10.0)
    assert [policy.delay_s(n) for n in (1, 2, 3, 4)] == [0.5, 1.5, 4.5, 10.0]
    assert policy.delay_s(0) == policy.delay_s(-5) == 0.5  # below 1 counts as 1


def test_default_policy_doubles_from_one_second_up_to_five_minutes() -> None:
    policy = RetryPolicy()
    assert [policy.delay_s(n) for n in (1, 2, 3, 9, 10)] == [1.0, 2.0, 4.0, 256.0, 300.0]


def test_no_growth_and_zero_initial() -> None:
    assert RetryPolicy(initial_s=2.0, multiplier=1.0).delay_s(1000) == 2.0
    assert RetryPolicy(initial_s=0.0).delay_s(1000) == 0.0
    assert RetryPolicy(initial_s=1.0, max_s=0.0).delay_s(3) == 0.0


def test_a_huge_attempt_number_is_the_cap_at_once() -> None:
    started = time.monotonic()
    assert RetryPolicy(multiplier=2).delay_s(2**31 - 1) == 300.0
    assert RetryPolicy(multiplier=1.5, max_s=7.0).delay_s(10**9) == 7.0
    assert time.monotonic() - started < 1.0  # no huge integer power is built


@pytest.mark.parametrize("attempt", [1, 2, 5, 30])
def test_jitter_stays_within_zero_and_the_delay(attempt: int) -> None:
    plain = RetryPolicy(initial_s=1.0, max_s=20.0)
    jittered = RetryPolicy(initial_s=1.0, max_s=20.0, jitter=True)
    samples = [jittered.delay_s(attempt) for _ in range(200)]
    assert all(0.0 <= s <= plain.delay_s(attempt) for s in samples)
    assert len(set(samples)) > 1  # spread, not a constant
