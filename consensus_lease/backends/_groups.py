"""Cutting a batch into requests of bounded size, shared by the drivers.

Each store takes one request of bounded size (etcd's ``--max-request-bytes``, ZooKeeper's
``jute.maxbuffer``, libpq's 1 GiB message): a batch call sends its items, in order, as
as many requests as that takes, and an item is never split across two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["size_groups"]

T = TypeVar("T")


def size_groups(items: Sequence[T], cost: Callable[[T], int], limit: int,
                max_count: int | None = None) -> list[list[T]]:
    """``items`` in order, cut into groups whose ``cost`` (bytes, ``cost(item)`` each)
    adds up to at most ``limit`` and of at most ``max_count`` items (``None``: any
    number). An item whose cost alone passes ``limit`` is a group of its own (whether it
    can be sent at all is the caller's check). ``[]`` for no items."""
    groups: list[list[T]] = []
    size = 0
    for item in items:
        item_cost = cost(item)
        if groups and size + item_cost <= limit and (
                max_count is None or len(groups[-1]) < max_count):
            groups[-1].append(item)
            size += item_cost
        else:
            groups.append([item])
            size = item_cost
    return groups
