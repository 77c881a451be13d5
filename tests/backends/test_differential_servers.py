"""The differential test (consensus_lease.testing.differential) on the server stores:
PostgreSQL (``CONSENSUS_LEASE_POSTGRES_URL``), etcd (a local member) and ZooKeeper (the
ensemble of the ZooKeeper suites, ``zk_target``). 200 random sequences each, each on
fresh data (a schema, a key prefix, a chroot), 0 disagreements with the model."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from etcd_local import LocalEtcd, local_members
from zk_local import ZkTarget, zk_target  # noqa: F401  (the fixture)

from consensus_lease import open_store
from consensus_lease.backend import Backend
from consensus_lease.testing.differential import run_differential
from consensus_lease.testing.postgresql import fresh_schema, postgres_url

EXAMPLES = 200
STEPS = 10
"""Fewer steps than the unit suite's 25: every step is two round trips or more."""


@pytest.fixture(scope="module")
def local_etcd() -> Iterator[LocalEtcd]:
    yield from local_members(size=1, base=110)


def test_postgresql_agrees_with_the_model() -> None:
    base = postgres_url()
    with ExitStack() as schemas:

        def fresh() -> Backend:
            schema = schemas.enter_context(fresh_schema(base))
            return open_store(f"{base}?schema={schema}").backend

        run_differential(fresh, examples=EXAMPLES, steps=STEPS)


def test_etcd_agrees_with_the_model(local_etcd: LocalEtcd) -> None:
    def fresh() -> Backend:
        return open_store(local_etcd.url_with_prefix(f"diff-{uuid.uuid4().hex[:12]}")).backend

    run_differential(fresh, examples=EXAMPLES, steps=STEPS)


def test_zookeeper_agrees_with_the_model(zk_target: ZkTarget, key_prefix: str) -> None:  # noqa: F811
    numbers = itertools.count()

    def fresh() -> Backend:
        url = zk_target.url(f"{key_prefix}-{next(numbers)}")
        return open_store(url, connect_timeout_s=30).backend

    run_differential(fresh, examples=EXAMPLES, steps=STEPS)
