"""The store's request size (``capabilities.max_payload_bytes``) counts bytes, not the
elements of a bytes-like: a ``memoryview`` of 8-byte items is 8 times its ``len()``."""

from __future__ import annotations

import array

import pytest

from consensus_lease import InvalidArgument, LeaseState, open_store


def _wide(limit: int) -> memoryview:
    """A memoryview whose ``len()`` is under ``limit`` but whose bytes are over it."""
    view = memoryview(array.array("d", bytes(limit // 8 * 8 + 64)))
    assert len(view) < limit < view.nbytes
    return view


def test_a_wide_memoryview_over_the_limit_is_refused_everywhere() -> None:
    with open_store("memory://") as store, store.session("w", ttl_s=30) as session:
        wide = _wide(store.backend.capabilities.max_payload_bytes)
        with pytest.raises(InvalidArgument, match=f"{wide.nbytes} bytes"):
            store.enqueue("q", "a", wide)
        with pytest.raises(InvalidArgument, match=f"{wide.nbytes} bytes"):
            store.enqueue_many("q", [("b", wide)])
        assert store.queue_jobs("q") == []
        lease = session.claim("job")
        assert lease is not None
        with pytest.raises(InvalidArgument, match=f"{wide.nbytes} bytes"):
            lease.complete(wide)
        with pytest.raises(InvalidArgument, match=f"{wide.nbytes} bytes"):
            session.complete_many([(lease, wide)])
        assert lease.state is LeaseState.HELD
        lease.ensure_held()
        with pytest.raises(InvalidArgument, match=f"{wide.nbytes} bytes"):
            session.campaign("election", wide, wait_s=0)


def test_a_memoryview_within_the_limit_is_stored_whole() -> None:
    with open_store("memory://") as store, store.session("w", ttl_s=30) as session:
        lease = session.claim("job")
        assert lease is not None
        view = memoryview(array.array("d", [1.0, 2.0]))
        record = lease.complete(view)
        assert record.result == view.tobytes()
