"""``fail()`` records an exception whose ``__str__`` is broken by its type (the failure
is still recorded: a raw error here used to stop a worker slot for its back-off and lose
the attempt)."""

from __future__ import annotations

from consensus_lease import LeaseState, open_store
from consensus_lease.validation import error_text


class _Raises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str exploded")


class _NotStr(Exception):
    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


def test_a_broken_str_is_recorded_by_its_type() -> None:
    assert error_text(_Raises()) == "_Raises: <str() raised RuntimeError>"
    assert error_text(_NotStr()) == "_NotStr: <str() raised TypeError>"
    assert error_text(ValueError("bad")) == "ValueError: bad"


def test_fail_and_fail_many_record_it() -> None:
    with open_store("memory://") as store, store.session("w", ttl_s=30) as session:
        one, two = session.claim("one"), session.claim("two")
        assert one is not None and two is not None
        record = one.fail(_Raises(), retry_in_s=0)
        assert record.error == "_Raises: <str() raised RuntimeError>"
        assert one.state is not LeaseState.HELD
        [answer] = session.fail_many([(two, _NotStr(), 0)])
        assert getattr(answer, "error", None) == "_NotStr: <str() raised TypeError>"
