"""Job id and TTL rules, as properties."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus_lease import InvalidArgument
from consensus_lease._election import (
    ELECTION_PREFIX,
    election_key,
    election_name,
    is_election_key,
)
from consensus_lease.validation import (
    MAX_ELECTION_NAME_BYTES,
    MAX_JOB_ID_BYTES,
    check_election_name,
    check_job_id,
    check_ttl,
)

text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=0, max_size=300)


@given(text)
def test_job_id_accepted_iff_rules_hold(job_id: str) -> None:
    valid = (0 < len(job_id.encode()) <= MAX_JOB_ID_BYTES and "\x00" not in job_id
             and not job_id.startswith(ELECTION_PREFIX))
    if valid:
        assert check_job_id(job_id) == job_id
    else:
        with pytest.raises(InvalidArgument):
            check_job_id(job_id)


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**9)))
def test_ttl_accepted_iff_finite_and_in_range(ttl: float) -> None:
    ok = math.isfinite(ttl) and 0.5 <= ttl <= 100.0
    if ok:
        assert check_ttl(ttl, min_s=0.5, max_s=100.0) == float(ttl)
    else:
        with pytest.raises(InvalidArgument):
            check_ttl(ttl, min_s=0.5, max_s=100.0)


@pytest.mark.parametrize("bad", ["5", None, True, [1]])
def test_ttl_type_errors(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        check_ttl(bad, min_s=0.5, max_s=100.0)


@given(text)
def test_election_name_accepted_iff_rules_hold(name: str) -> None:
    valid = 0 < len(name.encode()) <= MAX_ELECTION_NAME_BYTES and "\x00" not in name
    if valid:
        assert check_election_name(name) == name
        key = election_key(name)
        assert is_election_key(key) and election_name(key) == name
        assert len(key.encode()) <= MAX_JOB_ID_BYTES
    else:
        with pytest.raises(InvalidArgument):
            check_election_name(name)


def test_job_id_with_the_election_prefix_is_rejected() -> None:
    with pytest.raises(InvalidArgument, match="reserved for election names"):
        check_job_id(election_key("leader"))
    assert check_job_id("\x1fe") == "\x1fe"  # only the whole prefix is reserved
    assert not is_election_key("job-1")
    with pytest.raises(ValueError):
        election_name("job-1")


def test_newcomer_findings_give_named_errors(tmp_path: Path) -> None:
    """Reserved queue prefix, an unbounded retry policy, and a file that is not a
    database opened with create=false: each a clear InvalidArgument."""
    from consensus_lease import InvalidArgument, RetryPolicy, open_store
    from consensus_lease.validation import check_queue_name

    with pytest.raises(InvalidArgument, match="reserved"):
        check_queue_name("\x1fe:q")
    for bad in ({"initial_s": 1e9}, {"max_s": 1e12}):
        with pytest.raises(InvalidArgument, match="must be at most 31622400 s"):
            RetryPolicy(**bad)
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 100)
    with pytest.raises(InvalidArgument, match="not a consensus_lease store"):
        open_store(f"sqlite:///{text}?create=false")
    assert text.read_text() == "not a database\n" * 100
