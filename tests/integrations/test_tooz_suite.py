"""tooz's own driver test suite (``tooz.tests.test_coordination``, 83 tests shipped in the
tooz wheel) against our tooz driver on every store: 0 failures, 0 errors, and exactly the
skips the docs list (docs/integrations/tooz.md), each one either a ``tooz.NotImplemented``
of ours or a test tooz's suite runs only for drivers with other characteristics.

Each store runs the suite once in a subprocess (about 15-25 s): SQLite in a temporary
file, PostgreSQL in a fresh schema, etcd and ZooKeeper on the kit's 3-member clusters
under their own prefix. The comparison with tooz's own drivers on the same servers is
``benchmarks/tooz_suite.py`` (not run here: tooz's etcd3gw driver alone takes 90 s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from consensus_lease.testing.postgresql import fresh_schema, postgres_url
from consensus_lease.testing.tooz_suite import SuiteCounts, run_tooz_suite

pytest.importorskip("tooz", reason="the tooz extra (pip install 'consensus_lease[tooz-test]')")

pytestmark = pytest.mark.slow

EVERY_STORE = {
    "test_get_lock_release_broken": "consensus_lease cannot break a lock held by another session",
    "test_watch_join_group_booted_out": "this member id's membership is held by another "
                                        "coordinator's session",
    # tooz's suite runs it only for its etcd3gw, memcached and redis drivers (isinstance).
    "test_watch_join_group_disappear": "This test only works with coordinators that have "
                                       "the ability to destroy groups.",
}
"""Skipped on every store: test name -> how the skip reason starts."""

EXTRA_SKIPS = {
    # Not DISTRIBUTED_ACROSS_HOSTS: tooz's suite has no remote host to fail to reach.
    "sqlite": {"test_connection_error_bad_host": "This driver is not distributed across hosts"},
    "postgresql": {},
    "etcd": {},
    # keepalive=background by default (kazoo pings the session anyway): NON_TIMEOUT_BASED.
    "zk": {"test_timeout": "This driver is not based on timeout"},
}

TOOZ_ZOOKEEPER_PASSED = 75
"""tooz's own ZooKeeper driver on a 3-member ensemble here (docs/integrations/tooz.md)."""


def check(counts: SuiteCounts, store: str) -> None:
    assert counts.failed == 0 and counts.errors == 0, counts.report()
    assert counts.tests == 83, counts.report()
    expected = {**EVERY_STORE, **EXTRA_SKIPS[store]}
    assert set(counts.skips) == set(expected), counts.report()
    for name, start in expected.items():
        assert counts.skips[name].startswith(start), (name, counts.skips[name])
    assert counts.passed >= TOOZ_ZOOKEEPER_PASSED, counts.report()


def test_sqlite(tmp_path: Path) -> None:
    check(run_tooz_suite(f"consensus-lease+sqlite:///{tmp_path}/tooz.db"), "sqlite")


def test_postgresql() -> None:
    base = postgres_url()
    with fresh_schema(base) as schema:
        check(run_tooz_suite(f"consensus-lease+{base}?schema={schema}"), "postgresql")


def test_etcd_three_members(etcd_cluster: Any, key_prefix: str) -> None:
    url = f"consensus-lease+{etcd_cluster.url_with_prefix(key_prefix)}"
    check(run_tooz_suite(url), "etcd")


def test_zookeeper_three_members(zookeeper_cluster: Any, key_prefix: str) -> None:
    url = f"consensus-lease+{zookeeper_cluster.url_with_prefix(key_prefix)}"
    check(run_tooz_suite(url), "zk")
