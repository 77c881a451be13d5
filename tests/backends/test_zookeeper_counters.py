"""ZooKeeper's 32-bit counters at their limit: a job znode's version (its tokens' low
part) and a queue head's version (every enqueue and purge writes the head at the version
read). ZooKeeper increments a version without a check (2**31 - 1 becomes -2**31), and
-1 in a request means "any version".

The ceilings are module constants, lowered here so that a real server reaches them in a
few writes; the last test runs against a throw-away server started from a snapshot
holding a job znode at version 2**31 - 3 (see ``zk_snapshot.py``). Like the other
ZooKeeper tests these run on the container ensemble unless ``CONSENSUS_LEASE_ZK=local``.
"""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator

import pytest
from zk_local import (  # noqa: F401  (fixtures)
    LocalZooKeeper,
    backend,
    chroot_of,
    opened,
    raw_client,
    session_ttl_s,
    store,
    zk_target,
    zk_url,
)
from zk_local import available as zk_local_available
from zk_snapshot import write_snapshot

from consensus_lease import LeaseStore, open_store
from consensus_lease.backends.zookeeper import _jobs_claim, _queues
from consensus_lease.backends.zookeeper._transport_multi import (
    MAX_VERSION,
    Transaction,
    wire_version,
)
from consensus_lease.errors import LeaseError, TokenSpaceExhausted
from consensus_lease.record import JobState
from consensus_lease.session import Session

pytestmark = pytest.mark.slow


def test_a_version_out_of_range_is_never_sent() -> None:
    """Every versioned operation is checked before it is packed: past 2**31 - 1 (where
    ``struct`` would fail) or negative (a wrapped znode; -1 would mean any version), a
    typed error; ``None`` is the only way to say "any"."""

    class Client:
        chroot = ""
        default_acl = None

    tx = Transaction(Client())
    for bad in (MAX_VERSION + 1, 2**32, -1, -(2**31)):
        for op in (lambda v: tx.check("/j", v), lambda v: tx.set_data("/j", b"", v),
                   lambda v: tx.delete("/j", v)):
            with pytest.raises(TokenSpaceExhausted) as caught:
                op(bad)
            assert (caught.value.path, caught.value.version) == ("/j", bad)
    tx.check("/j", MAX_VERSION)
    assert wire_version(None, "/j") == -1 and wire_version(0, "/j") == 0


def test_a_claim_at_the_job_version_ceiling_is_refused(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Claims go on up to the ceiling; the holder there renews, releases and completes;
    the next claim is TokenSpaceExhausted with the remedy, and writes nothing."""
    monkeypatch.setattr(_jobs_claim, "VERSION_CEILING", 4, raising=False)
    a = opened("A")
    tokens = []
    for _ in range(4):
        lease = a.claim("j")
        assert lease is not None
        tokens.append(lease.generation)
        lease.release()
    assert tokens == [1, 2, 3, 4]
    for _ in range(2):  # read first, then the guessed path (released here) too
        with pytest.raises(TokenSpaceExhausted) as caught:
            a.claim("j")
        error = caught.value
        assert isinstance(error, LeaseError) and error.job_id == "j"
        assert error.version == 4 and error.path.endswith("/jobs/j")
        assert "bump-epoch --above 4" in str(error) and "deleteall" in str(error)
    assert a.claim_many(["j"]) == [None]
    client = raw_client(zk_url)
    try:
        assert client.get(f"{chroot_of(zk_url)}/jobs/j")[1].version == 4  # nothing written
    finally:
        client.stop()
        client.close()
    # a hold taken just below the ceiling is kept and ended normally
    monkeypatch.setattr(_jobs_claim, "VERSION_CEILING", 5)
    lease = a.claim("j")
    assert lease is not None and lease.generation == 5
    lease.ensure_held()
    assert lease.complete(b"done").state is JobState.COMPLETED


def test_the_queue_head_rotates_before_its_version_limit(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the head's ceiling lowered to 3, twelve enqueues and a purge rotate the head
    several times: seqs stay consecutive and unique, FIFO holds, counts stay exact, the
    head znode never passes the ceiling, and a process that cached an old head (another
    store) still enqueues correctly."""
    monkeypatch.setattr(_queues, "HEAD_VERSION_CEILING", 3, raising=False)
    stale = open_store(zk_url, connect_timeout_s=30)  # caches the head it first wrote
    try:
        assert stale.enqueue("q", "j0", b"p0") is True
        for i in range(1, 7):
            assert store.enqueue("q", f"j{i}", f"p{i}".encode()) is True
        assert stale.enqueue("q", "j7", b"p7") is True  # its cached head is long gone
    finally:
        stale.close()
    assert store.enqueue_many("q", [(f"k{i}", b"") for i in range(4)]) == [True] * 4
    chroot = chroot_of(zk_url)
    client = raw_client(zk_url)
    try:
        data = client.get(f"{chroot}/queues/q")[0]
        pointer = json.loads(data)
        assert pointer["layout"] == 3 and pointer["head"] >= 2
        heads = client.get_children(f"{chroot}/queues/q/h")
        assert heads == [f"{pointer['head']:010d}"]  # the older ones were deleted
        head_data, head_stat = client.get(f"{chroot}/queues/q/h/{heads[0]}")
        assert head_stat.version <= 3
        assert json.loads(head_data) == {"layout": 2, "seq": 12, "jobs": 12, "bytes": 16}
    finally:
        client.stop()
        client.close()
    listed = store.queue_jobs("q")
    assert [(job.record.job_id, job.seq) for job in listed] == [
        (f"j{i}", i + 1) for i in range(8)] + [(f"k{i}", 9 + i) for i in range(4)]
    stats = store.queue_stats("q")
    assert (stats.available, stats.held, stats.completed) == (12, 0, 0)
    a = opened("A")
    first = a.claim_next("q")
    assert first is not None and first.job_id in {f"j{i}" for i in range(8)}  # FIFO-ish
    assert first.payload == first.job_id.replace("j", "p").encode()
    first.complete(b"ok")
    for _ in range(3):  # purge writes the head too (rotating it if due)
        assert store.purge("q") in (0, 1)
        store.enqueue("q", f"late{_}")
    stats = store.queue_stats("q")
    assert (stats.available, stats.completed) == (14, 0)
    tail = [(job.record.job_id, job.seq) for job in store.queue_jobs("q")][-3:]
    assert tail == [("late0", 13), ("late1", 14), ("late2", 15)]


@pytest.fixture
def near_limit() -> Iterator[str]:
    """A throw-away standalone server started from a snapshot (``zk_snapshot.py``) in
    which, under the chroot ``/t``: job ``high`` is at version 2**31 - 3, job ``edge``
    two versions below the claim ceiling, job ``wrapped`` at -2**31 (as a release
    without the guard left it), and queue ``q``'s head at version 2**31 - 3. Yields the
    store URL."""
    reason = zk_local_available()
    if reason is not None:
        if os.environ.get("CI") == "true":  # CI installs ZooKeeper: a missing one is a failure
            pytest.fail(f"CI=true but no local ZooKeeper can be started: {reason}")
        pytest.skip(reason)
    server = LocalZooKeeper("127.0.250.1")
    head = b'{"layout":2,"seq":0,"jobs":0,"bytes":0}'
    queue = "/t/queues/q"
    write_snapshot(server.dir / "data", {
        "/t/jobs/high": (b"", MAX_VERSION - 2),
        "/t/jobs/edge": (b"", _jobs_claim.VERSION_CEILING - 2),
        "/t/jobs/wrapped": (b"", -(2**31)),
        queue: (head, MAX_VERSION - 2),
        f"{queue}/b": (b"", 0), f"{queue}/tally": (b"", 0),
        **{f"{queue}/tally/{kind}": (b"", 0) for kind in ("held", "done", "failed")},
    })
    try:
        server.start()
        yield server.url("/t")
    finally:
        server.kill()


def test_real_znodes_near_two_to_the_31(near_limit: str) -> None:
    """On znodes whose versions really are near 2**31: no raw exception, no
    non-positive or repeated token, nothing wraps."""
    store = open_store(near_limit, connect_timeout_s=30)
    try:
        with store.session("A", 10.0) as a:
            for job in ("high", "wrapped"):
                with pytest.raises(TokenSpaceExhausted):
                    a.claim(job)
            tokens = []
            for _ in range(2):
                lease = a.claim("edge")
                assert lease is not None
                tokens.append(lease.generation)
                lease.ensure_held()
                lease.release()
            assert tokens == [_jobs_claim.VERSION_CEILING - 1, _jobs_claim.VERSION_CEILING]
            with pytest.raises(TokenSpaceExhausted):
                a.claim("edge")
            # the queue's head: rotated, then enqueued into
            assert store.enqueue("q", "first", b"1") is True
            assert store.enqueue_many("q", ["second", "third"]) == [True, True]
            assert [(j.record.job_id, j.seq) for j in store.queue_jobs("q")] == [
                ("first", 1), ("second", 2), ("third", 3)]
            lease = a.claim_next("q")
            assert lease is not None and lease.generation == 1
            lease.complete(b"")
            assert store.purge("q") == 1
        client = raw_client(near_limit)
        try:
            assert client.get("/t/jobs/high")[1].version == MAX_VERSION - 2  # untouched
            assert client.get("/t/jobs/edge")[1].version == _jobs_claim.VERSION_CEILING
            pointer = json.loads(client.get("/t/queues/q")[0])
            assert pointer == {"layout": 3, "head": 1}
            assert client.get("/t/queues/q/h/0000000001")[1].version == 3  # enqueue, enqueue_many, purge
        finally:
            client.stop()
            client.close()
    finally:
        store.close()
