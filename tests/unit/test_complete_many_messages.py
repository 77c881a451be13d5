"""``Session.complete_many`` names what is wrong with its input: a bytes-like object is
not a sequence of leases (though it is a sequence of ints), and a malformed item is
named by its index and shape. Nothing is sent and every lease stays held."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from consensus_lease import InvalidArgument, open_store
from consensus_lease.record import JobState
from consensus_lease.testing.conformance_completion import assert_names_item


@pytest.mark.parametrize(("bad", "message"), [
    (bytearray(b"mine"), "sequence of leases, not bytearray"),
    (memoryview(b"mine"), "sequence of leases, not memoryview"),
    ("LEASE_AND_3_TUPLE", r"^item 1: lease on 'mine': complete_many\(\) takes .*, got a 3-tuple$"),
    ("PAIR_OF_STR", "^item 0: complete_many.*, got a pair of str and bytes$"),
    ("INT", "^item 0: complete_many.*, got int$"),
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


@pytest.mark.parametrize(("call", "shape"), [
    ("fail_many", "LONE"), ("release_many", "PAIR"), ("complete_many", "ONE_TUPLE"),
    ("complete_many", "LIST_PAIR"), ("release_many", "LIST_ONE"),
    ("fail_many", "FOUR_TUPLE"),
])
def test_a_malformed_item_holding_a_lease_is_named_as_every_item_error(
    call: str, shape: str
) -> None:
    """A shape error is in the form of every per-item error: ``item I: `` first, the
    job named, the item's ``job_id`` and ``generation`` set (the lease in it)."""
    with open_store("memory://") as store, store.session("A", ttl_s=30) as a:
        first, lease = a.claim("first"), a.claim("mine")
        assert first is not None and lease is not None
        ok: Any = {"fail_many": (first, "e"), "release_many": first,
                   "complete_many": first}[call]
        bad: Any = {"LONE": lease, "PAIR": (lease, b""), "ONE_TUPLE": (lease,),
                    "LIST_PAIR": [lease, b""], "LIST_ONE": [lease],
                    "FOUR_TUPLE": (lease, "e", 1.0, 2)}[shape]
        with pytest.raises(InvalidArgument) as info:
            getattr(a, call)([ok, bad])
        assert_names_item(info.value, 1, "mine")
        assert info.value.generation == lease.generation
        assert f"{call}() takes " in str(info.value)
        for held in (first, lease):
            held.ensure_held()


def test_a_malformed_item_without_a_lease_has_the_prefix_and_no_job() -> None:
    with open_store("memory://") as store, store.session("A", ttl_s=30) as a:
        lease = a.claim("mine")
        assert lease is not None
        for call, ok, bad in (("complete_many", lease, 42),
                              ("release_many", lease, ("mine",)),
                              ("fail_many", (lease, "e"), ["mine", "e"])):
            with pytest.raises(InvalidArgument) as info:
                getattr(a, call)([ok, bad])
            assert str(info.value).startswith(f"item 1: {call}() takes "), info.value
            assert info.value.job_id is None
        lease.ensure_held()


def test_async_a_sync_lease_is_named_as_every_item_error() -> None:
    from consensus_lease.aio import AsyncLeaseStore

    async def main() -> None:
        async with await AsyncLeaseStore.open("memory://") as store:
            async with store.session("A", ttl_s=10) as a:
                a0, a1 = await a.claim("a0"), await a.claim("a1")
                assert a0 is not None and a1 is not None
                for call, items in (
                        ("complete_many", [a0, a1.sync]),
                        ("complete_many", [a0, (a1.sync, b"r")]),
                        ("release_many", [a0, a1.sync]),
                        ("fail_many", [(a0, "e"), (a1.sync, "e")])):
                    with pytest.raises(InvalidArgument) as info:
                        await getattr(a, call)(items)
                    assert_names_item(info.value, 1, "a1")
                    assert info.value.generation == a1.generation
                    assert f"AsyncSession.{call}() takes AsyncLease objects" in str(
                        info.value)
                a0.sync.ensure_held()
                a1.sync.ensure_held()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_async_a_malformed_item_names_the_async_lease_in_it() -> None:
    from consensus_lease.aio import AsyncLeaseStore

    async def main() -> None:
        async with await AsyncLeaseStore.open("memory://") as store:
            async with store.session("A", ttl_s=10) as a:
                a0, a1 = await a.claim("a0"), await a.claim("a1")
                assert a0 is not None and a1 is not None
                for call, items, shape in (
                        ("complete_many", [a0, (a1,)], "a 1-tuple"),
                        ("complete_many", [a0, [a1, b""]], "a list of 2 (pass a tuple)"),
                        ("release_many", [a0, (a1, b"")], "a 2-tuple"),
                        ("fail_many", [(a0, "e"), a1], "Lease")):
                    with pytest.raises(InvalidArgument) as info:
                        await getattr(a, call)(items)
                    assert_names_item(info.value, 1, "a1")
                    assert str(info.value).endswith(f", got {shape}"), info.value
                a0.sync.ensure_held()
                a1.sync.ensure_held()

    asyncio.run(asyncio.wait_for(main(), 60))
