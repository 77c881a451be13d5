"""``Session.complete_many`` names what is wrong with its input: a bytes-like object is
not a sequence of leases (though it is a sequence of ints), and a malformed item is
named by its index and shape. Nothing is sent and every lease stays held."""

from __future__ import annotations

from typing import Any

import pytest

from consensus_lease import InvalidArgument, open_store
from consensus_lease.record import JobState


@pytest.mark.parametrize(("bad", "message"), [
    (bytearray(b"mine"), "sequence of leases, not bytearray"),
    (memoryview(b"mine"), "sequence of leases, not memoryview"),
    ("LEASE_AND_3_TUPLE", "item 1 is a 3-tuple"),
    ("PAIR_OF_STR", "item 0 is a pair of str and bytes"),
    ("INT", "item 0 is int"),
])
def test_complete_many_names_the_bad_item(bad: Any, message: str) -> None:
    with open_store("memory://") as store, store.session("A", ttl_s=30) as a:
        lease = a.claim("mine")
        assert lease is not None
        made = {"LEASE_AND_3_TUPLE": [lease, (lease, b"x", b"y")],
                "PAIR_OF_STR": [("mine", b"x")], "INT": [42]}
        leases = made[bad] if isinstance(bad, str) else bad
        with pytest.raises(InvalidArgument, match=message):
            a.complete_many(leases)
        lease.ensure_held()
        record = store.get("mine")
        assert record is not None and record.state is JobState.HELD
