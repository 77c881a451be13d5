"""Handlers that the worker tests run in ``consensus-lease worker`` processes
(``worker_handlers:NAME``; the tests put this directory on PYTHONPATH).

They read their files from the directory named by ``WORKER_TEST_DIR``:

* ``fence.db`` — the SqliteFence every effect goes to;
* ``pause`` — if present, the first handler to reach step 2 of a job removes it, writes
  ``paused.json`` (pid, job, generation) and SIGSTOPs its own process right after its
  ``ensure_held()``: the window in which only the fence can stop a stale write;
* ``go`` — what :func:`wait_for_go` waits for; ``started-JOB`` — written when it starts.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import threading
import time
from contextlib import nullcontext
from pathlib import Path

from consensus_lease import Lease, SqliteFence

STEPS = 3
STEP_S = 0.02
"""Work time after each effect: spreads the run so faults land mid-run."""

ONCE_PER_JOB = "once_per_job" in inspect.signature(SqliteFence.apply).parameters
"""Use the fence's own once-per-job mode where it exists; else dedupe by reading
``fence.effects()`` after raising the fence's token (see :func:`_steps_done`)."""

_fence: SqliteFence | None = None
_fence_lock = threading.Lock()


def _dir() -> Path:
    return Path(os.environ["WORKER_TEST_DIR"])


def _get_fence() -> SqliteFence:
    global _fence
    with _fence_lock:
        if _fence is None:
            _fence = SqliteFence(str(_dir() / "fence.db"))
        return _fence


def _steps_done(fence: SqliteFence, lease: Lease) -> set[str]:
    """Steps an earlier holder already applied. A ``begin`` effect with this lease's
    token comes first: from then on the fence refuses every older token, so the effects
    read afterwards can no longer grow behind our back."""
    if ONCE_PER_JOB:
        return set()  # the fence answers ALREADY_APPLIED itself
    fence.apply(lease.job_id, lease.generation, f"begin-{lease.generation}")
    return {e.effect_id for e in fence.effects(lease.job_id) if e.effect_id.startswith("step-")}


def _apply(fence: SqliteFence, lease: Lease, step: str) -> None:
    if ONCE_PER_JOB:
        fence.apply(lease.job_id, lease.generation, step, once_per_job=True)  # type: ignore[call-arg]
    else:
        fence.apply(lease.job_id, lease.generation, step)


def _maybe_pause(lease: Lease) -> None:
    try:
        (_dir() / "pause").unlink()
    except FileNotFoundError:
        return
    info = {"pid": os.getpid(), "job": lease.job_id, "generation": lease.generation}
    tmp = _dir() / "paused.json.tmp"
    tmp.write_text(json.dumps(info))
    tmp.rename(_dir() / "paused.json")
    # The SQLite store's connection lock is held while stopped, so that no other thread
    # of this process (the keepalive) is stopped inside a store transaction, which would
    # lock every other worker out of the store until SIGCONT (a SQLite property, not the
    # scenario under test). Duck-typed: other backends have no such lock.
    store_lock = getattr(lease.session.backend, "_lock", None)
    with store_lock if isinstance(store_lock, type(threading.Lock())) else nullcontext():
        # Sent to this thread, not the process: a process-directed SIGSTOP may be taken
        # by another thread, and this one would run on (into the fence's transaction)
        # until the group stop reaches it; a thread-directed one stops it at once.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def fenced_steps(lease: Lease, payload: bytes) -> bytes:
    """``STEPS`` fenced effects, each applied once per job whoever holds it when."""
    fence = _get_fence()
    done = _steps_done(fence, lease)
    for k in range(1, STEPS + 1):
        step = f"step-{k}"
        if step in done:
            continue
        lease.ensure_held()
        if k == 2:
            _maybe_pause(lease)
        _apply(fence, lease, step)
        time.sleep(STEP_S)  # the work between effects
    return f"gen={lease.generation}".encode()


def wait_for_go(lease: Lease, payload: bytes) -> bytes:
    """Write ``started-JOB``, then wait (at most 60 s) for the file ``go``."""
    (_dir() / f"started-{lease.job_id}").write_text(str(time.time()))
    give_up = time.monotonic() + 60
    while not (_dir() / "go").exists():
        if time.monotonic() > give_up:
            raise TimeoutError("no go file within 60 s")
        time.sleep(0.02)  # poll interval of the file check
    return b"finished"


def not_bytes(lease: Lease, payload: bytes) -> object:
    return 42
