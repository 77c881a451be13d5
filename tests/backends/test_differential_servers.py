"""The differential test (consensus_lease.testing.differential) on the server stores:
PostgreSQL (``CONSENSUS_LEASE_POSTGRES_URL``), etcd (a local member) and ZooKeeper (the
ensemble of the ZooKeeper suites, ``zk_target``). 200 random sequences each, 0
disagreements with the model; on PostgreSQL 200 more with its batched queue claim among
the operations. One store per test (a schema, a key prefix, a chroot),
shared by its sequences: each uses job and queue names of its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from etcd_local import LocalEtcd, local_members
from zk_local import ZkTarget, zk_target  # noqa: F401  (the fixture)

from consensus_lease import LeaseStore, open_store
from consensus_lease.testing.differential import run_differential
from consensus_lease.testing.postgresql import fresh_schema, postgres_url

EXAMPLES = 200
STEPS = 15
"""Fewer steps than the unit suite's 25: every step is a round trip or two."""


@pytest.fixture(scope="module")
def local_etcd() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=110)


def _run(store: LeaseStore) -> None:
    with store:
        run_differential(lambda: store.backend, examples=EXAMPLES, steps=STEPS, close=False)


def test_postgresql_agrees_with_the_model() -> None:
    base = postgres_url()
    with fresh_schema(base) as schema:
        _run(open_store(f"{base}?schema={schema}"))


def test_postgresql_queue_batches_agree_with_the_model() -> None:
    base = postgres_url()
    with fresh_schema(base) as schema, open_store(f"{base}?schema={schema}") as store:
        run_differential(lambda: store.backend, examples=EXAMPLES, steps=STEPS, close=False,
                         queue_batches=True)


def test_etcd_agrees_with_the_model(local_etcd: LocalEtcd) -> None:
    _run(open_store(local_etcd.url_with_prefix(f"diff-{uuid.uuid4().hex[:12]}")))


def test_etcd_queue_batches_agree_with_the_model(local_etcd: LocalEtcd) -> None:
    with open_store(local_etcd.url_with_prefix(f"diffq-{uuid.uuid4().hex[:12]}")) as store:
        run_differential(lambda: store.backend, examples=EXAMPLES, steps=STEPS, close=False,
                         queue_batches=True)


def test_zookeeper_agrees_with_the_model(zk_target: ZkTarget, key_prefix: str) -> None:  # noqa: F811
    _run(open_store(zk_target.url(key_prefix), connect_timeout_s=30))
