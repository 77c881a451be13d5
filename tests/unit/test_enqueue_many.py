"""LeaseStore.enqueue_many's own checks (the backends' batches are in the conformance
suite): a single string is no batch, and an error after the first chunk says what the
earlier chunks already enqueued."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from consensus_lease import InvalidArgument, open_store


@pytest.mark.parametrize("items", ["job-1", b"job-1"])
def test_a_single_string_is_refused_not_split_into_characters(items: Any) -> None:
    with open_store("memory://") as store:
        with pytest.raises(InvalidArgument, match="not a single"):
            store.enqueue_many("q", items)
        assert store.queue_stats("q").available == 0


def test_an_error_in_a_later_chunk_says_the_earlier_ones_are_in() -> None:
    with open_store("memory://") as store:
        backend: Any = store.backend
        backend.capabilities = dataclasses.replace(backend.capabilities, max_enqueue_batch=2)
        with store.session("w", 30) as session:
            lease = session.claim("elsewhere")  # a job outside the queue
            assert lease is not None
            lease.complete(b"")
        with pytest.raises(InvalidArgument) as error:
            store.enqueue_many("q", ["a", "b", "c", "elsewhere"])
        assert "the first 2 items" in str(error.value) and error.value.job_id == "elsewhere"
        assert store.queue_stats("q").available == 2  # the first chunk is in
        assert store.enqueue_many("q", ["a", "b", "c"]) == [False, False, True]
