"""Celery with a real Redis broker: redelivery past the visibility timeout, a worker
SIGKILLed mid-run, fenced tasks against the control.

One run: a throw-away ``redis-server`` on 127.0.0.1 (a free port), 2 Celery worker
processes (prefork, ``--concurrency 2`` each, ``acks_late``, ``visibility_timeout``
shorter than a task), ``tasks`` fenced tasks and as many plain ones (the control)
interleaved, each writing 3 effects ``step_s`` apart; once a third of the fenced tasks
ended, worker 1 and its pool processes are SIGKILLed mid-task; then a pool process of
worker 2 is frozen (SIGSTOP) mid-task for longer than its lease, and thawed. Then, per
task:

- fenced: exactly 3 effects accepted by the fence, once each; no accepted effect with a
  token below an earlier accepted one (no stale write accepted); runs of a task never
  overlap in time, except a run that was frozen past its lease (it overlaps its
  successor in time, but held no lease by then: its local check or the fence stopped
  its next write); the job is COMPLETED in the lease store;
- plain: the control: counts of runs and effects (duplicates expected).

As a script (the full acceptance run; its result is committed under benchmarks/results/)::

    python tests/celery/redelivery.py --tasks 100 --out benchmarks/results/celery_redelivery.json

The test (tests/celery/test_celery_tasks.py) runs a small one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


@dataclass
class Settings:
    tasks: int = 100
    plain_tasks: int | None = None  # the control's tasks (default: as many as ``tasks``)
    step_s: float = 0.6          # 3 steps: a task takes ~1.8 s
    visibility_s: float = 1.0    # shorter than a task: every task is redelivered
    ttl_s: float = 4.0           # the lease store session's TTL
    concurrency: int = 2
    pause: bool = True           # after the kill: SIGSTOP a pool process of worker 2
                                 # mid-task past its lease, then SIGCONT (a stale holder)
    deadline_s: float = 600.0


@dataclass
class Result:
    settings: dict[str, Any]
    wall_s: float = 0.0
    fenced_done_s: float = 0.0
    killed_at_s: float = 0.0
    killed_in_flight: int = 0
    killed_fenced_in_flight: int = 0
    fenced_runs: int = 0
    fenced_tasks_run_more_than_once: int = 0
    fenced_effects_wrong: list[str] = field(default_factory=list)
    fenced_overlaps: list[str] = field(default_factory=list)
    stale_accepted: list[str] = field(default_factory=list)
    fenced_rejected_runs: int = 0
    paused_task: int | None = None
    paused_for_s: float = 0.0
    paused_run_outcome: str | None = None
    not_completed: list[str] = field(default_factory=list)
    skipped_log_lines: int = 0
    plain_runs: int = 0
    plain_tasks_with_duplicate_effects: int = 0
    plain_overlapping_tasks: int = 0
    plain_effects: int = 0

    @property
    def fenced_ok(self) -> bool:
        return not (self.fenced_effects_wrong or self.fenced_overlaps or self.stale_accepted
                    or self.not_completed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    """A throw-away redis-server on 127.0.0.1 (no persistence), stopped by its PID."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.port = free_port()
        self.log = open(workdir / "redis.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        import redis

        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not start: {self.tail()}") from None
                time.sleep(0.05)  # poll interval of the start-up deadline loop

    def tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


class Worker:
    """``celery worker`` in its own process group (so it and its pool processes can be
    SIGKILLed together, by the group id of the process started here)."""

    def __init__(self, name: str, env: dict[str, str], workdir: Path, concurrency: int) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool",
             "prefork", "--concurrency", str(concurrency), "-n", f"{name}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "INFO"],
            cwd=HERE, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this process leads
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.log.close()

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")


def run(settings: Settings, workdir: Path) -> Result:
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    result = Result(settings=asdict(settings))
    redis = Redis(workdir)
    workers: list[Worker] = []
    try:
        store_url = f"sqlite:///{data}/leases.db"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
            "CL_CELERY_BROKER": redis.url,
            "CL_CELERY_STORE": store_url,
            "CL_CELERY_DATA": str(data),
            "CL_CELERY_STEP_S": str(settings.step_s),
            "CL_CELERY_VISIBILITY_S": str(settings.visibility_s),
            "CL_CELERY_TTL_S": str(settings.ttl_s),
        }
        saved = {k: os.environ.get(k) for k in env if k.startswith("CL_CELERY_")}
        os.environ.update({k: v for k, v in env.items() if k.startswith("CL_CELERY_")})
        sys.path.insert(0, str(HERE))
        try:
            import importlib

            import celery_app  # configured from the environment set just above

            celery_app = importlib.reload(celery_app)  # a second run: its own broker
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        celery_app.runs_db().close()
        start = time.monotonic()
        workers = [Worker(f"w{i}", env, workdir, settings.concurrency) for i in (1, 2)]
        plain_tasks = settings.tasks if settings.plain_tasks is None else settings.plain_tasks
        job_ids: dict[int, str] = {}  # task number -> the lease's job id
        for n in range(settings.tasks):
            job_ids[n] = f"celery:{celery_app.fenced_job.delay(n).id}"
            if n < plain_tasks:
                celery_app.plain_job.delay(n)

        def runs(query: str, *args: Any) -> list[tuple[Any, ...]]:
            db = sqlite3.connect(data / "runs.db", timeout=30)
            try:
                return list(db.execute(query, args))
            finally:
                db.close()

        deadline = start + settings.deadline_s

        def fenced_ok() -> int:
            return int(runs("SELECT count(*) FROM runs WHERE kind = 'fenced' AND "
                            "outcome = 'ok'")[0][0])

        def w1_mid_task() -> bool:  # a fenced task on worker 1 has written an effect
            return bool(runs("SELECT count(*) FROM runs WHERE kind = 'fenced' AND worker "
                             "LIKE 'w1@%' AND end IS NULL AND start < ?",
                             time.time() - settings.step_s)[0][0])

        # Kill worker 1 once a third of the fenced tasks ended, in the middle of a fenced
        # task (it wrote at least one effect); should it never be caught mid-task, kill
        # it anyway before the last task ends.
        while fenced_ok() < settings.tasks / 3 or not (
                w1_mid_task() or fenced_ok() >= settings.tasks - 1):
            if time.monotonic() > deadline or workers[0].proc.poll() is not None:
                raise RuntimeError(f"too slow before the kill: {workers[0].text()[-3000:]}")
            time.sleep(0.05)  # poll interval of the deadline loop
        kill_wall = time.time()
        workers[0].kill()
        result.killed_at_s = time.monotonic() - start
        result.killed_in_flight = runs(
            "SELECT count(*) FROM runs WHERE worker LIKE 'w1@%' AND end IS NULL")[0][0]
        result.killed_fenced_in_flight = runs(
            "SELECT count(*) FROM runs WHERE kind = 'fenced' AND worker LIKE 'w1@%' AND "
            "end IS NULL")[0][0]

        if settings.pause:
            _pause_one(settings, runs, result, deadline)

        from consensus_lease import JobState, open_store

        with open_store(store_url) as store:
            def fenced_done() -> bool:
                return all(
                    (r := store.get(job)) is not None and r.state is JobState.COMPLETED
                    for job in job_ids.values())

            def plain_done() -> bool:
                done = runs("SELECT count(DISTINCT task) FROM runs WHERE kind = 'plain' AND "
                            "outcome = 'ok'")[0][0]
                return bool(done >= plain_tasks)

            while not (result.fenced_done_s or fenced_done()) or not plain_done():
                if not result.fenced_done_s and fenced_done():
                    result.fenced_done_s = time.monotonic() - start
                if time.monotonic() > deadline or workers[1].proc.poll() is not None:
                    raise RuntimeError(f"did not finish: {workers[1].text()[-3000:]}")
                time.sleep(0.2)  # poll interval of the deadline loop
            result.wall_s = time.monotonic() - start
            result.fenced_done_s = result.fenced_done_s or result.wall_s
            result.not_completed = [
                job for job in job_ids.values()
                if (r := store.get(job)) is None or r.state is not JobState.COMPLETED]
        _check(result, runs, data, settings, kill_wall)
        result.skipped_log_lines = sum(w.text().count(": not run: job ") for w in workers)
        return result
    finally:
        for worker in workers:
            worker.stop()
        redis.stop()
        sys.path[:] = [p for p in sys.path if p != str(HERE)]


def _pause_one(settings: Settings, runs: Any, result: Result, deadline: float) -> None:
    """SIGSTOP the pool process running a fenced task on worker 2, in its second sleep
    (one effect written, two to go; a wide window, so that a loaded machine's slow polls
    still find one), for longer than its lease lives and the task needs to run again
    elsewhere; then SIGCONT it: a stale holder that wakes up mid-task."""
    pause_s = settings.ttl_s + 4 * settings.step_s + 3.0
    while True:
        now = time.time()
        rows = runs("SELECT id, task, pid FROM runs WHERE kind = 'fenced' AND worker LIKE "
                    "'w2@%' AND end IS NULL AND start BETWEEN ? AND ?",
                    now - 1.9 * settings.step_s, now - 1.1 * settings.step_s)
        if rows:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("no fenced task to pause on worker 2")
        time.sleep(0.02)  # poll interval of the deadline loop
    run_id, task, pid = rows[0]
    os.kill(pid, signal.SIGSTOP)  # a pool process of the worker started here
    try:
        time.sleep(pause_s)  # real time must pass: the paused holder's lease expires
    finally:
        os.kill(pid, signal.SIGCONT)
    result.paused_task, result.paused_for_s = int(task), pause_s
    while True:  # its outcome, once it noticed
        (outcome,), = runs("SELECT outcome FROM runs WHERE id = ?", run_id)
        if outcome is not None or time.monotonic() > deadline:
            result.paused_run_outcome = outcome
            return
        time.sleep(0.05)  # poll interval of the deadline loop


def _check(result: Result, runs: Any, data: Path, settings: Settings,
           kill_wall: float) -> None:
    from consensus_lease.fencing import SqliteFence

    fence = SqliteFence(str(data / "fence.db"))
    try:
        by_task: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
        for row in runs("SELECT task, token, start, end, outcome FROM runs WHERE "
                        "kind = 'fenced' ORDER BY start"):
            by_task[int(row[0])].append(row)
        result.fenced_runs = sum(len(v) for v in by_task.values())
        result.fenced_rejected_runs = sum(
            1 for v in by_task.values() for r in v if r[4] == "fenced")
        for n in range(settings.tasks):
            task_runs = by_task.get(n, [])
            if len(task_runs) > 1:
                result.fenced_tasks_run_more_than_once += 1
            for a, b in itertools.pairwise(task_runs):
                end = a[3] if a[3] is not None else kill_wall
                if end > b[2] and a[4] not in ("fenced", "lost"):
                    result.fenced_overlaps.append(
                        f"task {n}: token {a[1]} ran until {end:.3f}, token {b[1]} "
                        f"started {b[2]:.3f}")
            effects = fence.effects(f"task-{n}")
            names = sorted(e.effect_id for e in effects)
            if names != ["step-0", "step-1", "step-2"]:
                result.fenced_effects_wrong.append(f"task {n}: {names}")
            highest = 0
            for effect in effects:  # in acceptance order
                if effect.token < highest:
                    result.stale_accepted.append(
                        f"task {n}: {effect.effect_id} at token {effect.token} after "
                        f"{highest}")
                highest = max(highest, effect.token)
    finally:
        fence.close()
    plain: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in runs("SELECT task, start, end FROM runs WHERE kind = 'plain' ORDER BY start"):
        plain[int(row[0])].append(row)
    result.plain_runs = sum(len(v) for v in plain.values())
    result.plain_overlapping_tasks = sum(
        1 for v in plain.values()
        if any((a[2] if a[2] is not None else kill_wall) > b[1]
               for a, b in itertools.pairwise(v)))
    counts = runs("SELECT task, step, count(*) FROM plain_effects GROUP BY task, step")
    result.plain_effects = sum(c for _, _, c in counts)
    result.plain_tasks_with_duplicate_effects = len({t for t, _, c in counts if c > 1})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--plain-tasks", type=int, default=None,
                        help="tasks of the control (default: --tasks)")
    parser.add_argument("--step-s", type=float, default=Settings.step_s)
    parser.add_argument("--visibility-s", type=float, default=Settings.visibility_s)
    parser.add_argument("--ttl-s", type=float, default=Settings.ttl_s)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args()
    settings = Settings(tasks=args.tasks, plain_tasks=args.plain_tasks, step_s=args.step_s,
                        visibility_s=args.visibility_s, ttl_s=args.ttl_s)
    import tempfile

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="celery-redelivery-"))
    result = run(settings, workdir)
    out = {**asdict(result), "fenced_ok": result.fenced_ok}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if result.fenced_ok else 1


if __name__ == "__main__":
    sys.exit(main())
