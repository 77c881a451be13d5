"""The Celery app the redelivery test's worker processes run (``celery -A celery_app``).

Configured from the environment by tests/celery/redelivery.py. Two tasks, the same body:
``fenced_job`` (base FencedTask: each of its 3 effects goes through a SqliteFence with the
lease's token, once per job) and ``plain_job`` (the control: no lease, plain inserts).
Every run records its start, end and outcome in ``runs.db`` for the checks.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

from celery import Celery

from consensus_lease import FenceRejected, LeaseLost
from consensus_lease.celery import FencedTask
from consensus_lease.fencing import SqliteFence

DATA = os.environ["CL_CELERY_DATA"]
STEP_S = float(os.environ["CL_CELERY_STEP_S"])
VISIBILITY_S = float(os.environ["CL_CELERY_VISIBILITY_S"])
TTL_S = float(os.environ["CL_CELERY_TTL_S"])

app = Celery("cl_redelivery", broker=os.environ["CL_CELERY_BROKER"])
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={
        "visibility_timeout": VISIBILITY_S,
        # Look for messages past their visibility timeout every second (default 10 s).
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    consensus_lease_store=os.environ["CL_CELERY_STORE"],
)

_fence: SqliteFence | None = None


def fence() -> SqliteFence:
    global _fence
    if _fence is None:  # opened in the pool process that uses it, after the fork
        _fence = SqliteFence(os.path.join(DATA, "fence.db"), busy_timeout_s=30)
    return _fence


def runs_db() -> sqlite3.Connection:
    db = sqlite3.connect(os.path.join(DATA, "runs.db"), timeout=30, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, kind TEXT, task INT,"
               " worker TEXT, pid INT, token INT, start REAL, end REAL, outcome TEXT)")
    db.execute("CREATE TABLE IF NOT EXISTS plain_effects (task INT, step INT, pid INT, ts REAL)")
    return db


def run_body(kind: str, n: int, hostname: str, token: int | None,
             effect: Any) -> None:
    db = runs_db()
    run = db.execute("INSERT INTO runs (kind, task, worker, pid, token, start) VALUES "
                     "(?, ?, ?, ?, ?, ?)", (kind, n, hostname, os.getpid(), token,
                                            time.time())).lastrowid
    outcome = "error"
    try:
        for step in range(3):
            time.sleep(STEP_S)  # the task's work: real time, so it outlives the timeout
            effect(step)
        outcome = "ok"
    except FenceRejected:
        outcome = "fenced"  # the fence refused a write: another holder took over
        raise
    except LeaseLost:
        outcome = "lost"  # the local check refused first: nothing written
        raise
    finally:
        db.execute("UPDATE runs SET end = ?, outcome = ? WHERE id = ?",
                   (time.time(), outcome, run))
        db.close()


# --8<-- [start:fenced]
@app.task(bind=True, base=FencedTask, lease_ttl_s=TTL_S)
def fenced_job(self: Any, n: int) -> None:
    lease = self.lease
    token = lease.generation  # the fencing token of this delivery's lease

    def effect(step: int) -> None:
        lease.ensure_held()  # cheap and local: stop at once when the lease is gone
        fence().apply(f"task-{n}", token, f"step-{step}", once_per_job=True)  # the race

    run_body("fenced", n, self.request.hostname, token, effect)
# --8<-- [end:fenced]


@app.task(bind=True)
def plain_job(self: Any, n: int) -> None:
    def effect(step: int) -> None:
        db = runs_db()
        db.execute("INSERT INTO plain_effects VALUES (?, ?, ?, ?)",
                   (n, step, os.getpid(), time.time()))
        db.close()

    run_body("plain", n, self.request.hostname, None, effect)
