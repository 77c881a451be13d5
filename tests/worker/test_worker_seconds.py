"""Seconds given to the worker: an int too large for a float is refused like infinity
(it raised a raw ``OverflowError``), and a flag's refusal says why (it said "not a number
of seconds" for ``-1``, ``inf`` and ``nan``)."""

from __future__ import annotations

import pytest

from consensus_lease import InvalidArgument
from consensus_lease.worker import WorkerConfig
from consensus_lease.worker.config import parse_seconds


@pytest.mark.parametrize("field", ["ttl_s", "grace_s", "claim_wait_s", "complete_flush_s"])
def test_an_int_too_large_for_a_float_is_invalid_argument(field: str) -> None:
    with pytest.raises(InvalidArgument, match=f"{field} must be a finite number .*\\.\\.\\."):
        WorkerConfig(queue="q", **{field: 10**400})  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "message"), [
    ("-1", "finite number >= 0 of seconds, not '-1'"),
    ("inf", "finite number >= 0 of seconds, not 'inf'"),
    ("nan", "finite number >= 0 of seconds, not 'nan'"),
    ("soon", "not a number of seconds: 'soon'"),
])
def test_a_flags_refusal_says_why(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_seconds(text)
