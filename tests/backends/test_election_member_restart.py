"""A leader watch across a member restart, on the 3-member etcd cluster and the
ZooKeeper ensemble in containers: it sees every leadership change, in generation order."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from consensus_lease import LeaderRecord, open_store
from consensus_lease.testing.conformance import poll_until

pytestmark = [pytest.mark.containers, pytest.mark.slow]

TTL_S = 6.0  # across an election of the cluster without losing the leadership


@pytest.fixture(params=["etcd", "zookeeper"])
def cluster(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_cluster")


def test_leader_watch_sees_every_change_in_order_across_a_member_restart(cluster: Any) -> None:
    url = cluster.url_with_prefix(f"el-{uuid.uuid4().hex[:8]}")
    name = "scheduler"
    with open_store(url, connect_timeout_s=30) as store, \
            open_store(url, connect_timeout_s=30) as watcher:
        seen: list[LeaderRecord | None] = []
        watch = watcher.watch_leader(name, timeout_s=120)

        def follow() -> None:
            for record in watch:
                seen.append(record)

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        leaders: list[tuple[str, int]] = []
        for i, owner in enumerate(("A", "B", "C")):
            with store.session(owner, ttl_s=TTL_S) as session:
                leadership = session.campaign(name, f"v{i}".encode(), wait_s=60)
                leaders.append((owner, leadership.generation))
                poll_until(lambda g=leadership.generation: any(
                    r is not None and r.generation == g for r in seen), timeout_s=30)
                if i == 1:  # a member restarts while B leads: B keeps it, C follows
                    cluster.restart(cluster.members[0])
                    leadership.ensure_held()
                leadership.resign()
        poll_until(lambda: seen and seen[-1] is None, timeout_s=30)
        watch.close()
        thread.join(timeout=30)
    generations = [r.generation for r in seen if r is not None]
    assert generations == sorted(generations), seen  # never back to an older leader
    for owner, generation in leaders:
        assert any(r is not None and r.owner == owner and r.generation == generation
                   for r in seen), (owner, generation, seen)
