"""Builders for the etcd transaction pieces the driver uses (thin :mod:`pyetcd.etcdrpc`
wrappers), and readers for their answers."""

from __future__ import annotations

from typing import Any

from pyetcd import etcdrpc

__all__ = [
    "count",
    "create_is",
    "delete",
    "exists",
    "get",
    "kv_of",
    "lease_is",
    "mod_is",
    "none_in",
    "put",
    "span",
    "span_count",
    "txn",
    "value_is",
    "value_less",
    "version_is",
]


def create_is(key: bytes, revision: int) -> Any:
    """Compare: the key's ``create_revision`` equals ``revision`` (0: the key is absent)."""
    return etcdrpc.Compare(
        key=key,
        target=etcdrpc.Compare.CREATE,
        result=etcdrpc.Compare.EQUAL,
        create_revision=revision,
    )


def none_in(key: bytes, range_end: bytes) -> Any:
    """Compare: no key exists in ``[key, range_end)`` (etcd compares every key of a
    compare's range, and an empty range as one absent key: create revision 0)."""
    return etcdrpc.Compare(
        key=key,
        range_end=range_end,
        target=etcdrpc.Compare.CREATE,
        result=etcdrpc.Compare.EQUAL,
        create_revision=0,
    )


def exists(key: bytes) -> Any:
    """Compare: the key exists (its ``create_revision`` is above 0)."""
    return etcdrpc.Compare(
        key=key,
        target=etcdrpc.Compare.CREATE,
        result=etcdrpc.Compare.GREATER,
        create_revision=0,
    )


def mod_is(key: bytes, revision: int) -> Any:
    """Compare: the key's ``mod_revision`` equals ``revision`` (0: the key is absent)."""
    return etcdrpc.Compare(
        key=key, target=etcdrpc.Compare.MOD, result=etcdrpc.Compare.EQUAL, mod_revision=revision
    )


def version_is(key: bytes, version: int) -> Any:
    """Compare: the key's ``version`` (puts since it was created) equals ``version`` (0:
    the key is absent)."""
    return etcdrpc.Compare(
        key=key, target=etcdrpc.Compare.VERSION, result=etcdrpc.Compare.EQUAL, version=version
    )


def value_is(key: bytes, value: bytes) -> Any:
    return etcdrpc.Compare(
        key=key, target=etcdrpc.Compare.VALUE, result=etcdrpc.Compare.EQUAL, value=value
    )


def value_less(key: bytes, value: bytes) -> Any:
    """Compare: the key's value sorts (bytewise) before ``value`` (false if absent)."""
    return etcdrpc.Compare(
        key=key, target=etcdrpc.Compare.VALUE, result=etcdrpc.Compare.LESS, value=value
    )


def lease_is(key: bytes, lease_id: int) -> Any:
    return etcdrpc.Compare(
        key=key, target=etcdrpc.Compare.LEASE, result=etcdrpc.Compare.EQUAL, lease=lease_id
    )


def put(key: bytes, value: bytes, lease_id: int = 0, prev_kv: bool = False) -> Any:
    """A put; with ``prev_kv`` the answer carries the key's previous key-value."""
    return etcdrpc.RequestOp(
        request_put=etcdrpc.PutRequest(key=key, value=value, lease=lease_id, prev_kv=prev_kv)
    )


def get(key: bytes) -> Any:
    return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key))


def span(key: bytes, range_end: bytes, revision: int = 0) -> Any:
    """A get of every key in ``[key, range_end)`` (at ``revision``; 0: now)."""
    return etcdrpc.RequestOp(
        request_range=etcdrpc.RangeRequest(key=key, range_end=range_end, revision=revision)
    )


def span_count(key: bytes, range_end: bytes) -> Any:
    """A count of the keys in ``[key, range_end)`` (``response_range.count``; etcd walks
    its in-memory index over the range, sends no key)."""
    return etcdrpc.RequestOp(
        request_range=etcdrpc.RangeRequest(key=key, range_end=range_end, count_only=True)
    )


def count(key: bytes) -> Any:
    """A get that answers only whether the key exists (``response_range.count``)."""
    return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key, count_only=True))


def delete(key: bytes) -> Any:
    return etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=key))


def txn(compare: list[Any] | None = None, success: list[Any] | None = None,
        failure: list[Any] | None = None) -> Any:
    return etcdrpc.TxnRequest(compare=compare or [], success=success or [], failure=failure or [])


def kv_of(response_op: Any) -> Any | None:
    """The single key-value of a ``get`` answer inside a transaction, or ``None``."""
    kvs = response_op.response_range.kvs
    return kvs[0] if kvs else None
