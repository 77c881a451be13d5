"""The one rule every driver cuts a batch into requests by (backends/_groups.py)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from consensus_lease.backends._groups import size_groups


@given(st.lists(st.integers(0, 50)), st.integers(1, 60), st.one_of(st.none(), st.integers(1, 5)))
def test_groups_keep_order_respect_both_limits_and_are_greedy(
        costs: list[int], limit: int, max_count: int | None) -> None:
    items = list(enumerate(costs))  # distinct items, cost by position
    groups = size_groups(items, lambda item: item[1], limit, max_count)
    assert [item for group in groups for item in group] == items  # order, nothing lost
    assert all(groups)
    for group in groups:
        assert len(group) == 1 or sum(c for _, c in group) <= limit
        assert max_count is None or len(group) <= max_count
    for before, after in itertools.pairwise(groups):
        # greedy: the next group's first item did not fit in the one before
        full = max_count is not None and len(before) == max_count
        assert full or sum(c for _, c in before) + after[0][1] > limit


def test_an_item_over_the_limit_goes_alone() -> None:
    assert size_groups([1, 9, 1, 1], lambda c: c, 5) == [[1], [9], [1, 1]]
    assert size_groups([], lambda c: c, 5) == []
