"""Work queues on the ZooKeeper backend: the znode layout, FIFO candidates, waking by
watch, the payload limit, lost answers read back, purge in several multis, no stray
znodes and no piling watches.

The behaviour every backend shares is in the conformance suite (``test_queue_*``, run on
ZooKeeper by ``test_zookeeper.py``). Like it, these run on the 3-member container
ensemble unless ``CONSENSUS_LEASE_ZK=local`` (see ``zk_local.py``). Nothing sleeps to
synchronise: waits poll with deadlines.
"""

# ruff: noqa: F811  (tests take the fixtures imported from zk_local)

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss
from purge_budget import drain_then_purge_with_a_tight_budget
from zk_local import (  # noqa: F401  (fixtures)
    ZkTarget,
    backend_of,
    chroot_of,
    lose_next_answer,
    opened,
    raw_client,
    store,
    zk_target,
    zk_url,
)

from consensus_lease import LeaseStore, open_store
from consensus_lease.backends.zookeeper._layout import encode_job_id
from consensus_lease.backends.zookeeper._queues import JUTE_MAXBUFFER, MAX_PAYLOAD_BYTES
from consensus_lease.errors import (
    AuthenticationFailed,
    ClaimTimeout,
    InvalidArgument,
    JobCompleted,
)
from consensus_lease.record import JobState
from consensus_lease.session import Session
from consensus_lease.testing.conformance import poll_until
from consensus_lease.validation import MAX_JOB_ID_BYTES

pytestmark = pytest.mark.slow


# -- helpers --------------------------------------------------------------------------------


def tree(url: str) -> dict[str, bytes]:
    """Every znode under the chroot of ``url`` (relative path -> data)."""
    root = chroot_of(url)
    client = raw_client(url)
    out: dict[str, bytes] = {}
    try:
        todo = [root]
        while todo:
            path = todo.pop()
            for child in client.get_children(path):
                full = f"{path}/{child}"
                out[full[len(root) + 1 :]] = client.get(full)[0]
                todo.append(full)
    finally:
        client.stop()
        client.close()
    return out


def version_of(url: str, relative: str) -> int:
    client = raw_client(url)
    try:
        return int(client.exists(f"{chroot_of(url)}/{relative}").version)
    finally:
        client.stop()
        client.close()


def count_multis(store: LeaseStore) -> list[int]:
    """Record each multi the shared client sends (its number of operations)."""
    client = backend_of(store)._wire.reader()
    real = client.transaction
    sent: list[int] = []

    class Counting:
        def __init__(self) -> None:
            self.tx = real()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.tx, name)

        def commit_async(self) -> Any:
            sent.append(len(self.tx.operations))
            return self.tx.commit_async()

    client.transaction = Counting
    return sent


def member(seq: int, job_id: str) -> str:
    return f"{seq:010d}-{encode_job_id(job_id)}"


B0 = "b/0000000000"
"""The first bucket of a queue (seqs 1-256), relative to the queue's node."""


def bucket_dirs(queue: str, bucket: str = B0) -> set[str]:
    """The znodes a bucket is made with (relative to the chroot)."""
    base = f"queues/{queue}/{bucket}"
    return {base, *(f"{base}/{d}" for d in ("jobs", "open", "held", "delayed", "failed"))}


def queue_dirs(queue: str) -> set[str]:
    """The znodes a queue is made with, and its first bucket's (relative to the chroot)."""
    base = f"queues/{queue}"
    return {base, f"{base}/b", f"{base}/tally", f"{base}/tally/held", f"{base}/tally/done",
            f"{base}/tally/failed", *bucket_dirs(queue)}


def head_of(url: str, queue: str) -> dict[str, int]:
    """The queue's head: its last seq, jobs and payload bytes."""
    data = tree(url)[f"queues/{queue}"]
    fields: dict[str, int] = json.loads(data)
    return fields


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def session_ttl_s() -> float:
    """``opened`` (from zk_local) opens sessions of 30 s here unless told otherwise."""
    return 30.0


# -- layout ---------------------------------------------------------------------------------


def test_enqueue_is_one_multi_making_job_tag_member_and_marker(
    store: LeaseStore, zk_url: str
) -> None:
    sent = count_multis(store)
    assert store.enqueue("mail", "m/1", b"hello") is True
    assert store.enqueue("mail", "m.2", b"") is True
    # the queue's head, buckets and tallies; then head + the first bucket (6) + 4 per
    # job; then head + 4
    assert sent == [6, 11, 5]
    nodes = tree(zk_url)
    one, two = member(1, "m/1"), member(2, "m.2")
    assert set(nodes) == {
        "jobs", "jobs/m%2F1", "jobs/m%2F1/queue", "jobs/m%2E2", "jobs/m%2E2/queue",
        "queues", *queue_dirs("mail"),
        f"queues/mail/{B0}/jobs/{one}", f"queues/mail/{B0}/jobs/{two}",
        f"queues/mail/{B0}/open/{one}", f"queues/mail/{B0}/open/{two}",
    }
    assert nodes[f"queues/mail/{B0}/jobs/{one}"] == b"hello"
    assert nodes["jobs/m%2F1"] == b""  # a never-claimed job
    assert version_of(zk_url, "jobs/m%2F1") == 0
    assert head_of(zk_url, "mail") == {"layout": 2, "seq": 2, "jobs": 2, "bytes": 5}
    assert b'"member":"' + one.encode() + b'"' in nodes["jobs/m%2F1/queue"]
    record = store.get("m/1")
    assert record is not None and (record.state, record.generation) == (JobState.AVAILABLE, 0)
    jobs = store.queue_jobs("mail")
    assert [(j.record.job_id, j.seq, j.payload) for j in jobs] == [
        ("m/1", 1, b"hello"), ("m.2", 2, b"")
    ]


def test_claim_and_completion_of_a_queued_job(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str
) -> None:
    """A queued job is an ordinary job (generation 1 on the first claim, +1 per claim);
    its completion deletes the open marker in the same multi and keeps the member."""
    store.enqueue("q", "j", b"p")
    a = opened("A")
    first = a.claim_next("q")
    assert first is not None and (first.job_id, first.generation, first.payload) == ("j", 1, b"p")
    held = f"{chroot_of(zk_url)}/queues/q/{B0}/held/{member(1, 'j')}"
    client = raw_client(zk_url)
    try:  # the held marker is the claiming session's ephemeral, like the owner znode
        assert client.exists(held).ephemeralOwner == a.handle.sid  # type: ignore[attr-defined]
    finally:
        client.stop()
        client.close()
    first.release()
    assert f"queues/q/{B0}/held/{member(1, 'j')}" not in tree(zk_url)
    again = a.claim("j")  # by name
    assert again is not None and again.generation == 2
    assert f"queues/q/{B0}/open/{member(1, 'j')}" in tree(zk_url)
    assert f"queues/q/{B0}/held/{member(1, 'j')}" in tree(zk_url)
    again.complete(b"result")
    nodes = tree(zk_url)
    assert f"queues/q/{B0}/open/{member(1, 'j')}" not in nodes
    assert f"queues/q/{B0}/held/{member(1, 'j')}" not in nodes
    assert nodes[f"queues/q/{B0}/jobs/{member(1, 'j')}"] == b"p"
    with pytest.raises(JobCompleted):
        a.claim("j")
    (job,) = store.queue_jobs("q")
    assert (job.record.state, job.record.generation, job.record.result) == (
        JobState.COMPLETED, 2, b"result"
    )


def test_release_and_completion_survive_markers_deleted_by_hand(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str
) -> None:
    store.enqueue("q", "j")
    store.enqueue("q", "k")
    a = opened("A")
    first, second = a.claim_next("q"), a.claim_next("q")
    assert first is not None and second is not None
    client = raw_client(zk_url)
    try:
        base = f"{chroot_of(zk_url)}/queues/q/{B0}"
        for job in (first.job_id, second.job_id):
            client.delete(f"{base}/held/{member(1 if job == 'j' else 2, job)}")
        client.delete(f"{base}/open/{member(1 if first.job_id == 'j' else 2, first.job_id)}")
    finally:
        client.stop()
        client.close()
    assert first.complete(b"ok").state is JobState.COMPLETED
    second.release()
    record = store.get(second.job_id)
    assert record is not None and record.state is JobState.AVAILABLE
    assert store.purge("q") == 1


def test_enqueue_conflicts(store: LeaseStore, opened: Callable[..., Session]) -> None:
    lease = opened("A").claim("named")
    assert lease is not None
    with pytest.raises(InvalidArgument, match="claimed by name"):
        store.enqueue("q", "named")
    store.enqueue("q1", "shared", b"first")
    with pytest.raises(InvalidArgument, match="another queue"):
        store.enqueue("q2", "shared")
    assert store.enqueue("q1", "shared", b"second") is False
    assert [j.payload for j in store.queue_jobs("q1")] == [b"first"]
    assert store.queue_jobs("q2") == []
    assert store.queue_jobs("never-used") == []
    assert store.backend.queue_candidates("never-used", 10) == []


def test_queue_names_and_job_ids_are_encoded(store: LeaseStore, opened: Callable[..., Session]) -> None:
    """Names with '/', '..', '-', spaces and non-ASCII neither nest nor collide."""
    queues = ["a/b", "a", "..", "a-b", "ü q"]
    for i, queue in enumerate(queues):
        store.enqueue(queue, f"{queue}/job-{i}", queue.encode())
    for i, queue in enumerate(queues):
        (job,) = store.queue_jobs(queue)
        assert (job.record.job_id, job.payload) == (f"{queue}/job-{i}", queue.encode())
    lease = opened("A").claim_next("a")
    assert lease is not None and lease.job_id == "a/job-1"


def test_queues_under_digest_acls(zk_url: str) -> None:
    """Every znode a queue makes carries the configured ACL: the owner's credentials do
    everything, others cannot read or enqueue."""
    owner = open_store(zk_url, user="svc", password="right", connect_timeout_s=30)
    intruder = open_store(zk_url, user="svc", password="wrong", connect_timeout_s=30)
    try:
        assert owner.enqueue("q", "j", b"secret") is True
        with owner.session("A") as a:
            lease = a.claim_next("q")
            assert lease is not None and lease.payload == b"secret"
            lease.complete(b"")
        for call in (lambda: intruder.queue_jobs("q"), lambda: intruder.enqueue("q", "k"),
                     lambda: intruder.backend.queue_candidates("q", 5),
                     lambda: intruder.purge("q")):
            with pytest.raises(AuthenticationFailed):
                call()
        assert owner.purge("q") == 1
    finally:
        owner.close()
        intruder.close()


# -- candidates -----------------------------------------------------------------------------


def test_candidates_are_fifo_skip_held_and_a_released_job_keeps_its_place(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    backend = backend_of(store)
    for i in range(5):
        store.enqueue("q", f"j{i}", f"p{i}".encode())
    a = opened("A")
    held = a.claim("j0")
    assert held is not None
    assert backend.queue_candidates("q", 3) == [("j1", b"p1"), ("j2", b"p2"), ("j3", b"p3")]
    held.release()
    assert [j for j, _ in backend.queue_candidates("q", 2)] == ["j0", "j1"]
    done = a.claim("j1")
    assert done is not None
    done.complete(b"")
    assert [j for j, _ in backend.queue_candidates("q", 10)] == ["j0", "j2", "j3", "j4"]


def test_candidates_are_three_listings_and_cached_payloads(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    """One round trip reads the queue's head and lists its oldest bucket's open, held and
    delayed markers; payloads are read once (a member's data never changes), later calls
    take them from the cache."""
    backend = backend_of(store)
    for i in range(40):
        store.enqueue("q", f"j{i:02d}", f"p{i}".encode())
    trips: list[int] = []
    real = backend._wire.reader_read

    def counting(reads: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append(len(reads))
        return real(reads, *args, **kwargs)

    backend._wire.reader_read = counting  # type: ignore[method-assign]
    first = backend.queue_candidates("q", 32)
    # sync + head + failed, three listings, failed again; then 32 payloads
    assert trips == [7, 32]
    trips.clear()
    lease = opened("A").claim("j00")
    assert lease is not None
    again = backend.queue_candidates("q", 32)
    assert trips == [7, 1]  # only the one payload not seen before (j32)
    assert again == [*first[1:], ("j32", b"p32")]


def test_candidates_after_a_wake_are_read_without_a_sync(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    """A waiting claim's tries once subscribed read the same listing without its
    ``sync`` (the subscription's watches tell it of anything newer); the same answer."""
    backend = backend_of(store)
    for i in range(3):
        store.enqueue("q", f"j{i}", f"p{i}".encode())
    kinds: list[list[str]] = []
    real = backend._wire.reader_read

    def recording(reads: Any, *args: Any, **kwargs: Any) -> Any:
        kinds.append([kind for kind, _ in reads])
        return real(reads, *args, **kwargs)

    backend._wire.reader_read = recording  # type: ignore[method-assign]
    plain = backend.queue_candidates("q", 32)
    assert kinds[0][0] == "sync" and len(kinds[0]) == 7
    kinds.clear()
    assert backend.queue_candidates_after_wake("q", 32) == plain
    assert kinds == [["get", "exists", "children", "children", "children", "exists"]]


def test_candidates_skip_many_held_jobs(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    ids = [f"j{i:03d}" for i in range(60)]
    for job in ids:
        store.enqueue("q", job)
    a = opened("A")
    assert all(lease is not None for lease in a.claim_many(ids[:50]))
    got = backend_of(store).queue_candidates("q", 5)
    assert [j for j, _ in got] == ids[50:55]


def test_concurrent_enqueues_get_distinct_fifo_seqs(zk_url: str) -> None:
    """Producers on separate clients race for the queue's next seq: every job lands
    once, seqs are distinct, and each producer's jobs keep their order."""
    stores = [open_store(zk_url, connect_timeout_s=30) for _ in range(4)]
    errors: list[BaseException] = []

    def produce(index: int) -> None:
        try:
            for n in range(25):
                assert stores[index].enqueue("race", f"p{index}-{n:02d}", b"") is True
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=produce, args=(i,)) for i in range(len(stores))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        jobs = stores[0].queue_jobs("race")
        assert len(jobs) == 100
        assert sorted(j.seq for j in jobs) == list(range(1, 101))
        for index in range(len(stores)):
            mine = [j.record.job_id for j in jobs if j.record.job_id.startswith(f"p{index}-")]
            assert mine == sorted(mine)
    finally:
        for s in stores:
            s.close()


# -- payload limit --------------------------------------------------------------------------


def test_payload_over_the_limit_is_refused_before_sending(store: LeaseStore) -> None:
    assert store.capabilities.max_payload_bytes == MAX_PAYLOAD_BYTES < JUTE_MAXBUFFER
    sent = count_multis(store)
    with pytest.raises(InvalidArgument, match="at most"):
        store.enqueue("q", "big", b"x" * (MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(InvalidArgument, match=r"jute\.maxbuffer"):  # the backend's own check
        store.backend.enqueue("q", "bigger", b"x" * JUTE_MAXBUFFER)
    assert sent == []
    assert store.get("big") is None and store.queue_jobs("q") == []


def test_payload_at_the_limit_with_the_longest_names_goes_through(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    """The largest payload, with the longest queue name and job id (every byte
    percent-encoded: three times longer), fits the ensemble's jute.maxbuffer: enqueue,
    claim, completion (with a large result) and purge all go through."""
    queue = "é" * (MAX_JOB_ID_BYTES // 2)
    job = "/" * MAX_JOB_ID_BYTES
    payload = bytes(range(256)) * (MAX_PAYLOAD_BYTES // 256) + b"z" * (MAX_PAYLOAD_BYTES % 256)
    assert len(payload) == MAX_PAYLOAD_BYTES
    assert store.enqueue(queue, job, payload) is True
    lease = opened("A").claim_next(queue)
    assert lease is not None and lease.job_id == job and lease.payload == payload
    lease.complete(b"r" * 1_000_000)
    assert store.purge(queue) == 1


# -- lost answers ---------------------------------------------------------------------------


@pytest.mark.parametrize("apply", [True, False], ids=["applied", "not-applied"])
def test_enqueue_with_a_lost_answer_is_read_back(
    store: LeaseStore, zk_url: str, apply: bool
) -> None:
    assert store.enqueue("q", "first") is True  # the queue exists
    calls = lose_next_answer(backend_of(store)._wire.reader(), apply)
    assert store.enqueue("q", "j", b"p") is True  # read back: ours (applied or sent again)
    assert len(calls) == (1 if apply else 2)
    assert store.enqueue("q", "j", b"other") is False
    nodes = tree(zk_url)
    assert sorted(n for n in nodes if n.startswith(f"queues/q/{B0}/jobs/")) == [
        f"queues/q/{B0}/jobs/{member(1, 'first')}", f"queues/q/{B0}/jobs/{member(2, 'j')}"]
    assert head_of(zk_url, "q")["seq"] == 2 and version_of(zk_url, "jobs/j") == 0


def test_enqueue_lost_answer_of_someone_elses_job_is_not_claimed(
    store: LeaseStore, zk_url: str
) -> None:
    """The answer is lost and another producer's enqueue of the same job landed: the
    read-back finds a tag with another nonce, so this enqueue reports ``False``."""
    other = open_store(zk_url, connect_timeout_s=30)
    try:
        client = backend_of(store)._wire.reader()
        real = client.transaction

        class OtherWins:
            def __init__(self) -> None:
                self.tx = real()

            def __getattr__(self, name: str) -> Any:
                return getattr(self.tx, name)

            def commit_async(self) -> Any:
                client.transaction = real  # once
                assert other.enqueue("q", "j", b"theirs") is True
                return self

            def get(self, timeout: float | None = None) -> Any:
                raise ConnectionLoss()

        client.transaction = OtherWins
        assert store.enqueue("q", "j", b"mine") is False
        assert [j.payload for j in store.queue_jobs("q")] == [b"theirs"]
    finally:
        other.close()


@pytest.mark.parametrize("apply", [True, False], ids=["applied", "not-applied"])
def test_completion_with_a_lost_answer_deletes_the_marker_once(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str, apply: bool
) -> None:
    store.enqueue("q", "j")
    a = opened("A")
    lease = a.claim_next("q")
    assert lease is not None
    handle = lease.session.handle
    lose_next_answer(handle.client, apply)  # type: ignore[attr-defined]
    record = lease.complete(b"r")
    assert (record.state, record.generation) == (JobState.COMPLETED, 1)
    assert not [n for n in tree(zk_url) if n.startswith(f"queues/q/{B0}/open/")]
    assert store.queue_stats("q").completed == 1


# -- waiting --------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["release", "expiry", "completion-then-enqueue"])
def test_waiter_is_woken_well_before_its_timeout(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str, how: str
) -> None:
    """B waits in claim_next for the queue whose only job A holds; A, another session
    (on another client), lets it go: B has it within seconds of a 60 s wait."""
    other = open_store(zk_url, connect_timeout_s=30)
    try:
        other.enqueue("q", "j", b"p")
        a = other.session("A", 30.0, keepalive=False)  # no sync racing expire_session
        held = a.claim_next("q")
        assert held is not None
        b = opened("B")
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(b.claim_next("q", wait_s=60)))
        waiter.start()
        # B subscribed: child watches on the queue's open and held markers
        subs = backend_of(store)._subs
        poll_until(lambda: subs.subscribers() == 1 and subs.watches() >= 2, 20)
        let_go = time.monotonic()
        if how == "release":
            held.release()
        elif how == "expiry":
            backend_of(other).expire_session(a.session_id)
        else:
            held.complete(b"")
            other.enqueue("q", "j2", b"p2")
        waiter.join(timeout=70)
        woke = time.monotonic() - let_go
        assert got and got[0] is not None, got
        assert got[0].job_id == ("j2" if how == "completion-then-enqueue" else "j")
        assert woke < 10, woke  # woken by a watch, not by the 60 s timeout
        a.close()
    finally:
        other.close()


def test_wait_returns_at_once_when_claimable_and_times_out_when_all_held(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    backend = backend_of(store)
    start = time.monotonic()
    backend.wait_for_queue("never-used", 0.3)  # nothing to claim: waits, on a creation watch
    assert time.monotonic() - start >= 0.25
    store.enqueue("q", "j")
    start = time.monotonic()
    backend.wait_for_queue("q", 30)  # claimable now: at once
    assert time.monotonic() - start < 5
    lease = opened("A").claim_next("q")
    assert lease is not None
    waited = []
    for _ in range(3):  # the watch event of A's claim may still be on its way: spurious
        start = time.monotonic()
        backend.wait_for_queue("q", 0.3)
        waited.append(time.monotonic() - start)
    assert max(waited) >= 0.25, waited
    calls: list[int] = []
    real = backend.queue_candidates

    def counting(queue: str, limit: int) -> list[tuple[str, bytes]]:
        calls.append(limit)
        return real(queue, limit)

    backend.queue_candidates = counting  # type: ignore[method-assign]
    with pytest.raises(ClaimTimeout):
        opened("B").claim_next("q", wait_s=1.5)
    assert len(calls) <= 3  # it waited on the watches, it did not poll


def test_waiter_on_an_unknown_queue_is_woken_by_its_first_enqueue(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str
) -> None:
    b = opened("B")
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(b.claim_next("fresh", wait_s=60)))
    waiter.start()
    subs = backend_of(store)._subs  # B subscribed: a creation watch on the queue
    poll_until(lambda: subs.subscribers() == 1 and subs.watches() >= 1, 20)
    other = open_store(zk_url, connect_timeout_s=30)
    try:
        enqueued = time.monotonic()
        other.enqueue("fresh", "j", b"p")
        waiter.join(timeout=70)
        assert got and got[0] is not None and got[0].payload == b"p"
        assert time.monotonic() - enqueued < 10
    finally:
        other.close()


def test_timed_out_waits_leave_one_watch_per_path(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    """Many waits timing out on a held job: the watches stay one per path, and kazoo
    keeps one callback per path (they would pile up with a callback per wait)."""
    backend = backend_of(store)
    store.enqueue("q", "j")
    lease = opened("A").claim_next("q")
    assert lease is not None
    for _ in range(30):
        backend.wait_for_queue("q", 0.01)
    threads = [threading.Thread(target=backend.wait_for_queue, args=("q", 0.2))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    # children of the bucket's open, held and delayed
    assert backend._queues.watches.armed() == 3
    client = backend._wire.reader()
    assert sum(len(v) for v in client._child_watchers.values()) == 3
    assert sum(len(v) for v in client._data_watchers.values()) == 0
    lease.release()  # fires the watch on held
    poll_until(lambda: backend._queues.watches.armed() == 2, 10)
    assert sum(len(v) for v in client._child_watchers.values()) == 2  # until they fire
    store.enqueue("q", "j2")
    poll_until(lambda: backend._queues.watches.armed() == 1, 10)  # delayed's stays
    assert sum(len(v) for v in client._child_watchers.values()) == 1


# -- purge ----------------------------------------------------------------------------------


def test_purge_longer_than_one_timeout_purges_the_whole_queue(zk_url: str) -> None:
    # Each step has its own timeout_s: 4,000 jobs take several 1.5 s steps' worth of
    # time on the whole (about 5 s quiet; one deadline for the call gave
    # BackendUnavailable part way), while one step of 100 stays far inside 1.5 s.
    url = zk_url + ("&" if "?" in zk_url else "?") + "timeout_s=1.5"
    n = 4_000
    took = drain_then_purge_with_a_tight_budget(zk_url, url, n, 128)
    print(f"purge of {n} jobs: {took:.2f} s with timeout_s=1.5")


def test_purge_of_many_jobs_in_several_multis_leaves_no_stray_znodes(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str
) -> None:
    ids = [f"job-{i:03d}" for i in range(230)]
    for job in ids:
        store.enqueue("bulk", job, b"payload")
    a = opened("A")
    leases = [lease for lease in a.claim_many(ids[:225]) if lease is not None]
    assert len(leases) == 225
    for lease in leases[:220]:
        lease.complete(b"done")
    leases[220].release()  # available again; 221..224 stay held
    sent = count_multis(store)
    assert store.purge("bulk") == 220
    # the head + 100 + 100 + 20 jobs, four deletes each (tag, job, member, done tally)
    assert sent == [401, 401, 81]
    assert store.purge("bulk") == 0
    stats = store.queue_stats("bulk")
    assert (stats.available, stats.held, stats.completed) == (6, 4, 0)
    left = ids[220:]
    assert [j.record.job_id for j in store.queue_jobs("bulk")] == left
    expected = {"epoch", "identity", "jobs", "queues", *queue_dirs("bulk")}
    for i, job in enumerate(left, start=221):
        expected |= {f"jobs/{job}", f"jobs/{job}/queue",
                     f"queues/bulk/{B0}/jobs/{member(i, job)}",
                     f"queues/bulk/{B0}/open/{member(i, job)}"}
    expected |= {f"jobs/{job}/owner" for job in ids[221:225]}
    expected |= {f"queues/bulk/{B0}/held/{member(i, ids[i - 1])}" for i in range(222, 226)}
    expected |= {f"queues/bulk/tally/held/{member(i, ids[i - 1])}" for i in range(222, 226)}
    assert head_of(zk_url, "bulk") == {"layout": 2, "seq": 230, "jobs": 10, "bytes": 70}
    assert set(tree(zk_url)) == expected
    a.close()
    for queued in store.queue_jobs("bulk"):
        assert queued.record.state is JobState.AVAILABLE


def test_concurrent_purges_count_each_job_once(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str
) -> None:
    ids = [f"j{i:03d}" for i in range(120)]
    for job in ids:
        store.enqueue("q", job)
    a = opened("A")
    for lease in a.claim_many(ids):
        assert lease is not None
        lease.complete(b"")
    stores = [open_store(zk_url, connect_timeout_s=30) for _ in range(3)]
    counts: list[int] = []
    try:
        threads = [threading.Thread(target=lambda s=s: counts.append(s.purge("q")))
                   for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        for s in stores:
            s.close()
    assert sum(counts) == 120 and len(counts) == 3
    assert store.queue_jobs("q") == []


def test_purge_with_a_lost_answer_is_read_back(
    store: LeaseStore, opened: Callable[..., Session]
) -> None:
    for job in ("a", "b"):
        store.enqueue("q", job)
        lease = opened(f"W-{job}").claim(job)
        assert lease is not None
        lease.complete(b"")
    lose_next_answer(backend_of(store)._wire.reader(), apply=True)
    assert store.purge("q") == 2
    assert store.queue_jobs("q") == [] and store.get("a") is None


def test_the_whole_life_of_a_queue_leaves_only_its_own_znodes(
    store: LeaseStore, opened: Callable[..., Session], zk_url: str
) -> None:
    for i in range(4):
        store.enqueue("life", f"j{i}", b"p")
    a, b = opened("A"), opened("B", ttl_s=2.0)
    for _ in range(2):
        lease = a.claim_next("life")
        assert lease is not None
        lease.complete(b"")
    released = a.claim_next("life")
    assert released is not None
    released.release()
    taken = b.claim_next("life")
    assert taken is not None
    backend_of(store).expire_session(b.session_id)  # its job goes back to the queue
    while (lease := a.claim_next("life")) is not None:
        lease.complete(b"")
    assert store.purge("life") == 4
    assert set(tree(zk_url)) == {"epoch", "identity", "jobs", "queues", *queue_dirs("life")}
    assert head_of(zk_url, "life") == {"layout": 2, "seq": 4, "jobs": 0, "bytes": 0}
