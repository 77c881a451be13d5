"""``consensus-lease demo``: the worked example, with two real worker processes.

1. Worker A claims ``invoice-42`` and writes step 1 to a fenced destination.
2. A is paused (SIGSTOP) past its TTL; the *store* expires A's lease.
3. Worker B claims the next generation and writes step 1 with the newer token.
4. A resumes: its ``ensure_held()`` reports the loss, its completion is rejected by the
   store, and its late write (old token) is rejected by the destination's fence.
5. B completes.

Every expected rejection is checked; the demo fails (exit 1) if any did not happen —
e.g. with ``--unfenced``, where the destination stops checking tokens and A's late write
gets through.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from ..backend import Capabilities
from ..errors import InvalidArgument, LeaseError, UnsupportedBackend, UnsupportedOperation
from ..options import redact_url
from ..record import JobState
from ..store import LeaseStore, backend_class, open_store
from ..testing.workers import WorkerProcess

__all__ = ["DemoStep", "run_demo"]

JOB_PREFIX = "invoice-42"


@dataclass
class DemoStep:
    t_s: float
    store_time: str
    worker: str
    generation: int | None
    action: str
    outcome: str
    expected: str
    ok: bool


class _Timeline:
    def __init__(self, console: Console, store: LeaseStore) -> None:
        self.start = time.monotonic()
        self.steps: list[DemoStep] = []
        self.console = console
        self.store = store

    def add(self, worker: str, generation: int | None, action: str, reply: dict[str, Any] | str,
            expected: str, ok: bool) -> None:
        if isinstance(reply, dict):
            if reply.get("ok"):
                outcome = str(reply.get("outcome", "ok"))
            else:
                outcome = str(reply.get("error"))
        else:
            outcome = reply
        try:
            store_now = self.store.backend.store_time()
        except LeaseError:
            store_now = None
        clock = (
            time.strftime("%H:%M:%S", time.gmtime(store_now)) + f".{int(store_now % 1 * 1000):03d}"
            if store_now is not None
            else "n/a"
        )
        step = DemoStep(time.monotonic() - self.start, clock, worker, generation, action,
                        outcome, expected, ok)
        self.steps.append(step)
        mark = "[green]ok [/]" if ok else "[red]BAD[/]"
        gen = "-" if generation is None else str(generation)
        self.console.print(
            f"{mark} +{step.t_s:5.2f}s  store {clock}  {worker:<5} gen {gen:<3} "
            f"{action:<31} -> {outcome:<15} (expected: {expected})",
            highlight=False,
        )


def run_demo(backend_url: str | None, ttl_s: float, *, unfenced: bool = False,
             console: Console | None = None) -> bool:
    """Run the worked example; return True iff every expectation held."""
    console = console or Console()
    with tempfile.TemporaryDirectory(prefix="consensus-lease-demo-") as tmp:
        url = backend_url or f"sqlite:///{Path(tmp) / 'leases.db'}"
        fence_path = str(Path(tmp) / "destination.db")
        console.print(f"[bold]store[/]       {redact_url(url)}")
        console.print(f"[bold]destination[/] {fence_path} "
                      f"({'UNFENCED: tokens not checked' if unfenced else 'fenced by token'})")
        console.print(f"[bold]TTL[/]         {ttl_s} s (times: since start; the store's clock)\n")
        store = _open_demo_store(url, ttl_s)
        job = f"{JOB_PREFIX}-{uuid.uuid4().hex[:6]}"  # a fresh job: the demo can run again
        console.print(f"[bold]job[/]         {job}\n")
        timeline = _Timeline(console, store)
        a, b = WorkerProcess("A"), WorkerProcess("B")
        fence: dict[str, Any] = {"path": fence_path, "job": job, "enforce": not unfenced}
        scenario = _Scenario(timeline, store, a, b, job, ttl_s, fence)
        try:
            a.start()
            b.start()
            if not scenario.open_sessions(url) or not scenario.a_claims_and_writes():
                return False
            scenario.a_paused_until_the_store_expires_it()
            scenario.b_claims_and_writes()
            scenario.a_resumes_and_is_rejected()
            scenario.b_completes()
        finally:
            for w in (a, b):
                if w.alive():
                    w.resume()
                w.stop()
            store.close()
        ok = all(step.ok for step in timeline.steps)
        _summary(console, timeline.steps, ok)
        return ok


def _open_demo_store(url: str, ttl_s: float) -> LeaseStore:
    """The store at ``url``, checked to serve several processes and to accept ``ttl_s``.

    Both checks are made first against the capabilities the backend declares as a class
    attribute (known without connecting), so that a refused demo creates nothing (no
    SQLite file), then against the opened store's own.

    Raises:
        UnsupportedOperation: the store serves one process only.
        InvalidArgument: ``ttl_s`` is outside the store's TTL range.
    """
    try:
        declared = getattr(backend_class(url), "capabilities", None)
    except UnsupportedBackend:
        declared = None  # open_store reports it, naming the installed schemes
    if isinstance(declared, Capabilities):
        _check_demo_capabilities(declared, url, ttl_s)
    store = open_store(url)
    try:
        _check_demo_capabilities(store.capabilities, url, ttl_s)
    except LeaseError:
        store.close()
        raise
    return store


def _check_demo_capabilities(caps: Capabilities, url: str, ttl_s: float) -> None:
    if not caps.cross_process:
        raise UnsupportedOperation(
            f"the demo runs two worker processes, but {redact_url(url)!r} is a store of one "
            "process only; use sqlite:///..., postgresql://..., etcd://... or zk://..."
        )
    if not caps.min_ttl_s <= ttl_s <= caps.max_ttl_s:
        raise InvalidArgument(
            f"--ttl-s {ttl_s} is outside this store's range [{caps.min_ttl_s}, "
            f"{caps.max_ttl_s}] s"
        )


@dataclass
class _Scenario:
    """The worked example's steps, each recorded on the timeline with what was expected."""

    timeline: _Timeline
    store: LeaseStore
    a: WorkerProcess
    b: WorkerProcess
    job: str
    ttl_s: float
    fence: dict[str, Any]
    gen_a: int | None = None
    gen_b: int | None = None

    def open_sessions(self, url: str) -> bool:
        """Open a session in each worker; False (recorded) if one could not."""
        for w in (self.a, self.b):
            reply = w.request("open", url=url, owner=f"worker-{w.name}", ttl_s=self.ttl_s)
            if not reply["ok"]:
                self.timeline.add(w.name, None, "open session", reply, "ok", False)
                return False
        return True

    def a_claims_and_writes(self) -> bool:
        """Step 1: A claims the job and writes step 1; False if A could not claim it."""
        r = self.a.request("claim", job=self.job, wait_s=self.ttl_s * 5)
        self.gen_a = r.get("generation")
        self.timeline.add("A", self.gen_a, "claim", r, "claimed", bool(r.get("claimed")))
        if not r.get("claimed"):
            return False
        r = self.a.request("fence", effect="step-1", **self.fence)
        self.timeline.add("A", self.gen_a, "write step-1 (token A)", r, "accepted",
                          r.get("outcome") == "accepted")
        return True

    def a_paused_until_the_store_expires_it(self) -> None:
        """Step 2: A is stopped; wait (bounded) until the store has expired its lease."""
        ttl_s, job, gen_a = self.ttl_s, self.job, self.gen_a
        self.a.pause()
        self.timeline.add("A", gen_a, "SIGSTOP (paused past its TTL)", "paused", "paused", True)
        give_up = time.monotonic() + 10 * ttl_s + 10
        record = self.store.get(job)
        while record is not None and record.state is JobState.HELD:
            if time.monotonic() > give_up:
                break
            time.sleep(min(0.05, ttl_s / 10))  # waiting for the store's TTL to run out
            record = self.store.get(job)
        expired = record is not None and record.state is JobState.AVAILABLE
        self.timeline.add("store", gen_a, "expires A's lease (store clock)",
                          f"state={record.state.value if record else None}", "available",
                          expired)

    def b_claims_and_writes(self) -> None:
        """Step 3: B claims a newer generation and writes step 1 with its token."""
        gen_a = self.gen_a
        r = self.b.request("claim", job=self.job, wait_s=self.ttl_s * 5)
        gen_b = self.gen_b = r.get("generation")
        self.timeline.add("B", gen_b, "claim", r, "claimed a newer generation",
                          bool(r.get("claimed")) and gen_b is not None and gen_a is not None
                          and gen_b > gen_a)
        r = self.b.request("fence", effect="step-1", **self.fence)
        self.timeline.add("B", gen_b, "write step-1 (token B)", r, "accepted",
                          r.get("outcome") == "accepted")

    def a_resumes_and_is_rejected(self) -> None:
        """Step 4: A resumes; its check, its completion and its late write all fail."""
        a, gen_a, add = self.a, self.gen_a, self.timeline.add
        a.resume()
        add("A", gen_a, "SIGCONT (resumes)", "running", "running", True)
        r = a.request("ensure_held", job=self.job)
        add("A", gen_a, "ensure_held()", r, "LeaseLost",
            not r["ok"] and r.get("error") == "LeaseLost")
        r = a.request("complete", job=self.job, result="from A")
        add("A", gen_a, "complete() (store compares gen)", r, "rejected by store",
            not r["ok"] and r.get("error") in ("StaleLeaseError", "SessionExpired"))
        r = a.request("fence", effect="step-2", **self.fence)
        add("A", gen_a, "late write step-2 (token A)", r, "FenceRejected",
            not r["ok"] and r.get("error") == "FenceRejected")

    def b_completes(self) -> None:
        """Step 5: B writes step 2 and completes; the final record is B's."""
        b, gen_b, add = self.b, self.gen_b, self.timeline.add
        r = b.request("fence", effect="step-2", **self.fence)
        add("B", gen_b, "write step-2 (token B)", r, "accepted", r.get("outcome") == "accepted")
        r = b.request("complete", job=self.job, result="from B")
        add("B", gen_b, "complete()", r, "completed", r["ok"] and r.get("generation") == gen_b)
        final = self.store.get(self.job)
        add("store", final.generation if final else None, "final record",
            f"state={final.state.value if final else None} owner="
            f"{final.owner if final else None}", "completed by B",
            final is not None and final.state is JobState.COMPLETED
            and final.generation == gen_b)


def _summary(console: Console, steps: list[DemoStep], ok: bool) -> None:
    console.print()
    if ok:
        console.print("[bold green]PASS: every expected rejection happened; no stale effect "
                      "got through.[/]")
    else:
        failed = [s.action for s in steps if not s.ok]
        console.print(f"[bold red]FAIL: {len(failed)} step(s) not as expected: "
                      f"{'; '.join(failed)}[/]")
