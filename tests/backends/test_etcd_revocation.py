"""A lease that etcd ends before its TTL ends the holder's session from the store's own
event (the session keys' watch), is logged at ERROR and counted (issue 25, item 1), on a
real 3-member etcd cluster.

The store's revocation time is measured by the test itself: a raw watch on a member
that is not frozen records when each owner key's deletion arrives, or the return of the
revoke that another client sends (etcd answers after the deletion is committed).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from pyetcd import etcdrpc

from consensus_lease import SessionExpired, SessionState, open_store
from consensus_lease.observe import Observer
from consensus_lease.testing.conformance import poll_until

LOSS_BOUND_S = 1.0
"""Most seconds from the store's revocation to the holder's loss. The watch delivers in
milliseconds; the bound is for a busy 2-core machine. Without the watch the loss waits
for the next keepalive: up to TTL / 3 later (3.3 s with TTL 10 below)."""


class _Early(Observer):
    """Early revocations and losses, with their monotonic times."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.early: list[tuple[str, float]] = []

    def early_revocation(self, store: str, session_id: str, early_by_s: float) -> None:
        with self._lock:
            self.early.append((session_id, early_by_s))


def _lost_at(sessions: list[Any]) -> dict[str, float]:
    """Each session's loss time (monotonic), filled in by its on_lost callback (called
    right after the session turned LOST, when ensure_held() starts raising)."""
    times: dict[str, float] = {}
    for session in sessions:
        session.on_lost(lambda s, _reason: times.setdefault(s.session_id, time.monotonic()))
    return times


class _Deletions:
    """A raw watch of every owner-key DELETE under ``root`` on one member: when the
    store's deletion of each key arrived (monotonic)."""

    def __init__(self, endpoint: str, root: bytes) -> None:
        self.seen: dict[bytes, float] = {}
        self._done = threading.Event()
        self._ready = threading.Event()
        self._channel = grpc.insecure_channel(endpoint)
        stub = etcdrpc.WatchStub(self._channel)
        create = etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
            key=root, range_end=root[:-1] + bytes([root[-1] + 1]),
            filters=[etcdrpc.WatchCreateRequest.NOPUT]))

        def requests() -> Iterator[Any]:
            yield create
            self._done.wait()

        self._call = stub.Watch(requests())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self._ready.wait(10.0), "the test's watch was not created"

    def _read(self) -> None:
        try:
            for response in self._call:
                now = time.monotonic()
                if response.created:
                    self._ready.set()
                for event in response.events:
                    self.seen.setdefault(bytes(event.kv.key), now)
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self._done.set()
        self._call.cancel()
        self._thread.join(timeout=5.0)
        self._channel.close()


def _owner_key(prefix: str, job_id: str) -> bytes:
    return f"/{prefix}/{job_id.encode().hex()}/o".encode()


def test_lease_revoked_by_another_client_ends_the_session_at_once(
    etcd_cluster: Any, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Three sessions of TTL 10 s hold a job each; another client revokes their leases.
    Each holder is LOST (ensure_held raises SessionExpired) within LOSS_BOUND_S of the
    revoke's answer, long before its next keepalive (3.3 s); to the holder's driver the
    store ended the lease before its TTL: counted once per session, logged at ERROR."""
    observer = _Early()
    url = etcd_cluster.url_with_prefix(key_prefix)
    caplog.set_level(logging.ERROR, logger="consensus_lease.etcd")
    with open_store(url, observer=observer) as store, open_store(url) as other:
        sessions = [store.session(f"w{i}", ttl_s=10.0) for i in range(3)]
        lost_at = _lost_at(sessions)
        leases = [s.claim(f"job-{i}") for i, s in enumerate(sessions)]
        revoked_at: dict[str, float] = {}
        for session in sessions:
            other.backend.expire_session(session.session_id)
            revoked_at[session.session_id] = time.monotonic()  # committed by now
        poll_until(lambda: len(lost_at) == len(sessions), 3 * LOSS_BOUND_S)
        lags = {sid: lost_at[sid] - revoked_at[sid] for sid in lost_at}
        assert all(lag <= LOSS_BOUND_S for lag in lags.values()), lags
        for lease in leases:
            assert lease is not None
            with pytest.raises(SessionExpired, match="session key was deleted"):
                lease.ensure_held()
        # The session is lost first, then the early end is reported (same thread, right
        # after): a loss seen by the test may come a moment before its report.
        poll_until(lambda: len(observer.early) >= len(sessions), 3 * LOSS_BOUND_S)
        assert sorted(sid for sid, _ in observer.early) == sorted(lost_at)
        assert all(0 < by <= 10.0 for _, by in observer.early), observer.early
        errors = [r for r in caplog.records if "before the granted TTL" in r.getMessage()]
        assert len(errors) == len(sessions)
        assert all(r.levelno == logging.ERROR for r in errors)
        for session in sessions:
            session.close()


def test_own_close_and_expiry_hook_are_no_early_revocation(
    etcd_cluster: Any, key_prefix: str
) -> None:
    """Closing a session revokes its lease (its key goes with it): not reported. The
    test hook expiring a session of the same driver is not an early revocation either,
    and its owner still hears of it from the watch."""
    observer = _Early()
    with open_store(etcd_cluster.url_with_prefix(key_prefix), observer=observer) as store:
        closed = store.session("closed", ttl_s=10.0)
        closed.claim("a")
        closed.close()
        expired = store.session("expired", ttl_s=10.0)
        lease = expired.claim("b")
        store.backend.expire_session(expired.session_id)
        poll_until(lambda: expired.state is SessionState.LOST, 3.0)
        assert lease is not None
        with pytest.raises(SessionExpired):
            lease.ensure_held()
        assert observer.early == []


SCENARIO_SESSIONS = 5
SCENARIO_TTL_S = 3.0
SCENARIO_PAUSE_S = 5.0
SCENARIO_ROUNDS = 2


def _settled(lost_at: dict[str, float], sessions: int, thawed: float) -> bool:
    """Every session lost, or one TTL passed since the thaw."""
    return len(lost_at) == sessions or time.monotonic() > thawed + SCENARIO_TTL_S


def _watch_saw_counted(deletions: Any, observer: Any, prefix: Any, jobs: dict[str, str]
                       ) -> bool:
    """Whether the test's watch has seen the owner key of every session counted early."""
    return all(_owner_key(prefix, jobs[sid]) in deletions.seen
               for sid, _ in list(observer.early))


def test_stale_leader_revoking_early_is_heard_within_a_delivery(
    fresh_etcd_cluster: Any, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 25's scenario, small: 5 sessions of TTL 3 s hold a job each; the leader is
    frozen 5 s (``docker pause``) and thawed. etcd 3.4.23 (before 3.4.31, etcd#15247)
    then revokes leases that were renewed with the new leader a moment before. Every
    holder whose owner key the store deleted while its session was still ACTIVE is LOST
    within LOSS_BOUND_S of the deletion (the test's own watch on a member that was not
    frozen), and counted as an early revocation with an ERROR log.

    The bug is a race in etcd: a round where no lease was revoked early (every holder
    still held, or lost by its own deadline first) is repeated, at most
    SCENARIO_ROUNDS times; if etcd never misbehaves, what is left checked is that no
    round reported an early revocation that did not happen."""
    caplog.set_level(logging.ERROR, logger="consensus_lease.etcd")
    for round_ in range(SCENARIO_ROUNDS):
        prefix = f"{key_prefix}-{round_}"
        observer = _Early()
        with open_store(fresh_etcd_cluster.url_with_prefix(prefix), observer=observer) as store:
            sessions = [store.session(f"h{i}", SCENARIO_TTL_S)
                        for i in range(SCENARIO_SESSIONS)]
            lost_at = _lost_at(sessions)
            jobs = {s.session_id: f"job-{i}" for i, s in enumerate(sessions)}
            for session in sessions:
                assert session.claim(jobs[session.session_id]) is not None
            leader = fresh_etcd_cluster.leader(timeout_s=15.0)
            follower = next(m for m in fresh_etcd_cluster.members if m is not leader)
            deletions = _Deletions(follower.endpoint, f"/{prefix}/".encode())
            try:
                # A renewal of every session on the leader before it is frozen (pacing
                # the fault: real time must pass).
                time.sleep(SCENARIO_TTL_S / 3)  # real time must pass: one renewal each
                fresh_etcd_cluster.pause(leader)
                try:
                    time.sleep(SCENARIO_PAUSE_S)  # the fault's length: real time must pass
                finally:
                    fresh_etcd_cluster.unpause(leader)
                thawed = time.monotonic()
                # Settled: every session lost, or still held one TTL after the thaw.
                poll_until(functools.partial(_settled, lost_at, len(sessions), thawed),
                           3 * SCENARIO_TTL_S)
                # The test's own watch can deliver a deletion after the session heard it
                # (a busy host): wait until it has seen every key the library counted.
                poll_until(functools.partial(_watch_saw_counted, deletions, observer,
                                             prefix, jobs), 3 * LOSS_BOUND_S)
            finally:
                deletions.close()
            early = []  # (session id, seconds from the deletion to the loss)
            for session in sessions:
                deleted = deletions.seen.get(_owner_key(prefix, jobs[session.session_id]))
                lost = lost_at.get(session.session_id)
                by_deadline = "local deadline passed" in str(session.lost_reason)
                if deleted is not None and not by_deadline:  # the store ended it first
                    early.append((session.session_id, None if lost is None else lost - deleted))
            counted = {sid for sid, _ in observer.early}
            for session in sessions:
                session.close()
        print(f"round {round_}: deleted {len(deletions.seen)} keys, at "
              f"{sorted(round(t - thawed, 3) for t in deletions.seen.values())}; lost "
              f"{sorted((round(t - thawed, 3)) for t in lost_at.values())}; early {early}")
        if not counted and not early:
            continue  # etcd revoked nothing early this round
        report = f"round {round_}: deletion -> loss {early}; counted {sorted(counted)}"
        assert early, report
        for sid, lag in early:
            assert lag is not None and lag <= LOSS_BOUND_S, report
            assert sid in counted, report
        errors = [r for r in caplog.records if "before the granted TTL" in r.getMessage()]
        assert len(errors) >= len(early), report
        print(f"stale leader: {report}")
        return
    # etcd revoked nothing early in any round (the race did not happen): what each round
    # still checked (the ``continue`` above) is that nothing was reported as an early
    # revocation and no holder was ended by the store; the prompt loss itself is proven
    # deterministically by test_lease_revoked_by_another_client_ends_the_session_at_once.
    print(f"stale leader: etcd revoked no lease early in {SCENARIO_ROUNDS} rounds of a "
          f"{SCENARIO_PAUSE_S} s leader pause; no early revocation was reported")
