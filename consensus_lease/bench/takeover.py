"""W4: how long a job stays unowned when its holder dies, and when it hands over.

*After a kill*: holder A is a real worker process
(:class:`~consensus_lease.testing.workers.WorkerProcess`) with a session of TTL
``w4_ttl_s``; it claims the job and writes a fenced effect. Waiter B (in this process,
its own session) is blocked in ``session.claim(job, wait_s=...)``. The bench sends A
SIGKILL and measures until B's first write is **accepted** by the fenced destination
(:class:`~consensus_lease.fencing.SqliteFence`) with B's generation. A's late write with
its old token is then tried and must be rejected.

*Graceful*: A releases instead (``lease.release()`` in A); measured from just before
the release request is sent to A until B's ``claim`` returns.

B is known to be waiting before the kill or release because the bench wraps B's
backend instance's ``subscribe_job`` to signal when B's claim subscribed to the job.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from ..backend import Unsubscribe, WakeCallback
from ..errors import FenceRejected
from ..fencing import SqliteFence
from ..session import Session
from ..store import open_store
from ..testing.workers import WorkerProcess
from .config import Sizes, Target
from .stats import summarize

__all__ = ["w4_takeover"]


PHASE_S = 0.1
"""After the waiter starts waiting, the kill or release comes a random 0-100 ms later,
so it does not always fall at the same point of a polling waiter's cycle (SQLite polls
every 50 ms by default)."""


def _random_phase() -> None:
    threading.Event().wait(random.uniform(0.0, PHASE_S))


MAX_ATTEMPTS = 3
"""A trial whose *holder* fails before the measured moment (e.g. a starved holder lost
its 2 s session before it could claim) is discarded, reported, and run again with a
fresh holder, at most this many times per trial."""


class _HolderFailed(RuntimeError):
    """The holder could not set the trial up; the trial measures nothing."""


def _ok(reply: dict[str, Any], what: str) -> dict[str, Any]:
    if not reply.get("ok"):
        raise _HolderFailed(f"holder {what} failed: {reply.get('error')}: "
                            f"{reply.get('message')}")
    return reply


class _Waiter:
    """B's blocking claim (and fenced write) in a thread."""

    def __init__(self, session: Session, fence: SqliteFence | None, job: str,
                 wait_s: float) -> None:
        self.result: dict[str, Any] = {}
        self._thread = threading.Thread(
            target=self._run, args=(session, fence, job, wait_s), daemon=True,
            name=f"clbench-waiter-{job}",
        )

    def _run(self, session: Session, fence: SqliteFence | None, job: str, wait_s: float) -> None:
        try:
            lease = session.claim(job, wait_s=wait_s)
            assert lease is not None  # with wait_s, claim raises instead
            if fence is not None:
                fence.apply(job, lease.generation, "b-first-write")
            self.result["t"] = time.monotonic()
            self.result["generation"] = lease.generation
            lease.complete(b"")
        except Exception as exc:
            self.result["error"] = f"{type(exc).__name__}: {exc}"

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> dict[str, Any]:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError(f"waiter still blocked after {timeout_s:.0f} s")
        if "error" in self.result:
            raise RuntimeError(f"waiter failed: {self.result['error']}")
        return self.result


def _kill_trial(target: Target, b: Session, waiting: threading.Event, fence: SqliteFence,
                a: WorkerProcess, job: str, ttl_s: float) -> dict[str, Any]:
    granted = float(_ok(a.request("open", url=target.url, owner=f"A-{job}", ttl_s=ttl_s),
                        "open")["granted_ttl_s"])
    claim = _ok(a.request("claim", job=job), "claim")
    if not claim.get("claimed"):
        raise _HolderFailed(f"holder could not claim fresh job {job!r}")
    _ok(a.request("fence", path=fence.path, job=job, effect="a-first-write"), "fenced write")
    waiting.clear()
    waiter = _Waiter(b, fence, job, wait_s=5 * granted + 10)
    waiter.start()
    if not waiting.wait(10.0):
        raise RuntimeError("waiter never started waiting")
    _random_phase()
    t_kill = time.monotonic()
    a.kill()
    got = waiter.join(5 * granted + 20)
    try:
        fence.apply(job, int(claim["generation"]), "a-late-write")
        stale_rejected = False
    except FenceRejected:
        stale_rejected = True
    return {"takeover_s": got["t"] - t_kill, "granted_ttl_s": granted,
            "a_generation": claim["generation"], "b_generation": got["generation"],
            "stale_write_rejected": stale_rejected}


def _graceful_trial(a: WorkerProcess, b: Session, waiting: threading.Event,
                    job: str) -> float:
    claim = _ok(a.request("claim", job=job), "claim")
    if not claim.get("claimed"):
        raise _HolderFailed(f"holder could not claim fresh job {job!r}")
    waiting.clear()
    waiter = _Waiter(b, None, job, wait_s=30.0)
    waiter.start()
    if not waiting.wait(10.0):
        raise RuntimeError("waiter never started waiting")
    _random_phase()
    t_release = time.monotonic()
    request_id = a.send("release", job=job)
    got = waiter.join(40.0)
    _ok(a.reply(request_id), "release")
    return float(got["t"]) - t_release


def _kill_trials(target: Target, sizes: Sizes, b: Session, waiting: threading.Event,
                 fence: SqliteFence, prefix: str, discarded: list[str]) -> list[dict[str, Any]]:
    kills = []
    spare = WorkerProcess("holder").start()  # the next holder starts while a trial runs
    try:
        for t in range(sizes.w4_trials):
            for attempt in range(MAX_ATTEMPTS):
                a, spare = spare, WorkerProcess("holder").start()
                try:
                    kills.append(_kill_trial(target, b, waiting, fence, a,
                                             f"{prefix}-kill-{t}-{attempt}", sizes.w4_ttl_s))
                    break
                except _HolderFailed as exc:
                    discarded.append(f"kill trial {t} attempt {attempt}: {exc}"[:300])
                finally:
                    a.kill()
            else:
                raise RuntimeError(f"kill trial {t}: the holder failed {MAX_ATTEMPTS} times: "
                                   f"{discarded[-1]}")
    finally:
        spare.kill()
    return kills


def _graceful_trials(target: Target, sizes: Sizes, b: Session, waiting: threading.Event,
                     prefix: str, discarded: list[str]) -> list[float]:
    handovers: list[float] = []
    a: WorkerProcess | None = None
    try:
        for t in range(sizes.w4_trials):
            for attempt in range(MAX_ATTEMPTS):
                try:
                    if a is None:
                        a = WorkerProcess("holder-graceful").start()
                        _ok(a.request("open", url=target.url, owner="A-graceful",
                                      ttl_s=sizes.w4_ttl_s), "open")
                    handovers.append(_graceful_trial(a, b, waiting,
                                                     f"{prefix}-graceful-{t}-{attempt}"))
                    break
                except _HolderFailed as exc:
                    discarded.append(f"graceful trial {t} attempt {attempt}: {exc}"[:300])
                    if a is not None:
                        a.kill()
                    a = None
            else:
                raise RuntimeError(f"graceful trial {t}: the holder failed {MAX_ATTEMPTS} "
                                   f"times: {discarded[-1]}")
    finally:
        if a is not None:
            a.stop()
    return handovers


def w4_takeover(target: Target, sizes: Sizes, workdir: str, prefix: str) -> dict[str, Any]:
    assert target.url is not None
    fence = SqliteFence(f"{workdir}/fence-{target.backend}.db")
    kills: list[dict[str, Any]] = []
    handovers: list[float] = []
    discarded: list[str] = []
    try:
        with open_store(target.url) as store:
            waiting = threading.Event()
            original = store.backend.subscribe_job

            def signalling_subscribe(job_id: str, callback: WakeCallback) -> Unsubscribe:
                unsubscribe = original(job_id, callback)
                waiting.set()
                return unsubscribe

            setattr(store.backend, "subscribe_job", signalling_subscribe)  # noqa: B010
            with store.session("bench-w4-B", sizes.session_ttl_s) as b:
                kills = _kill_trials(target, sizes, b, waiting, fence, prefix, discarded)
                handovers = _graceful_trials(target, sizes, b, waiting, prefix, discarded)
    finally:
        fence.close()
    granted = max(k["granted_ttl_s"] for k in kills)
    return {
        "trials": sizes.w4_trials,
        "requested_ttl_s": sizes.w4_ttl_s,
        "granted_ttl_s": granted,
        "tick_s": target.tick_s,
        "kill_s": summarize([k["takeover_s"] for k in kills]),
        "graceful_ms": summarize(handovers, 1000.0),
        "stale_writes_rejected": sum(bool(k["stale_write_rejected"]) for k in kills),
        "kill_trials": kills,
        "graceful_trials_ms": [h * 1000.0 for h in handovers],
        "discarded_trials": discarded,
    }
