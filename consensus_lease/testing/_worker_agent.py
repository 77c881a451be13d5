"""A worker process driven over stdin/stdout, one JSON object per line.

Started by :class:`consensus_lease.testing.workers.WorkerProcess` (the test kit's fault
tests and ``consensus-lease demo`` drive it); not meant to be run by hand. Each request
is ``{"id": N, "op": NAME, ...}``; each reply is ``{"id": N, "ok": true, ...}`` or
``{"id": N, "ok": false, "error": "LeaseLost", "message": "..."}``. Requests are served
one at a time, in order, so a request sent while the process is stopped (SIGSTOP) is
served right after SIGCONT — exactly as a paused worker resumes where it was.

Operations: ``open`` (url, owner, ttl_s, keepalive, clock_offset_s), ``claim`` (job,
wait_s), ``campaign`` (name, value, wait_s: the leadership is then addressed as
``job=name`` by the operations below), ``proclaim`` (job, value), ``ensure_held`` (job),
``renew`` (job), ``complete`` (job, result), ``release`` (job), ``lease`` (job: state,
generation, remaining_s), ``fence`` (path, job, effect, enforce), ``close``, ``exit``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from .. import errors
from ..clock import SkewedClock, SystemClock
from ..election import Leadership
from ..fencing import SqliteFence
from ..lease import Lease
from ..session import Session
from ..store import LeaseStore, open_store


class Agent:
    def __init__(self) -> None:
        self.store: LeaseStore | None = None
        self.session: Session | None = None
        self.leases: dict[str, Lease] = {}
        self.fences: dict[str, SqliteFence] = {}

    def _lease(self, job: str) -> Lease:
        try:
            return self.leases[job]
        except KeyError:
            raise errors.InvalidArgument(f"this worker never claimed {job!r}") from None

    def op_open(self, url: str, owner: str, ttl_s: float, keepalive: bool = True,
                clock_offset_s: float = 0.0) -> dict[str, Any]:
        clock = SkewedClock(clock_offset_s) if clock_offset_s else SystemClock()
        self.store = open_store(url, clock=clock)
        self.session = self.store.session(owner, ttl_s, keepalive=keepalive)
        return {"session_id": self.session.session_id, "granted_ttl_s": self.session.granted_ttl_s}

    def op_claim(self, job: str, wait_s: float | None = None) -> dict[str, Any]:
        assert self.session is not None, "open first"
        lease = self.session.claim(job, wait_s=wait_s)
        if lease is None:
            return {"claimed": False}
        self.leases[job] = lease
        return {"claimed": True, "generation": lease.generation}

    def op_campaign(self, name: str, value: str = "", wait_s: float | None = None
                    ) -> dict[str, Any]:
        assert self.session is not None, "open first"
        leadership = self.session.campaign(name, value.encode(), wait_s=wait_s)
        if leadership is None:
            return {"leader": False}
        self.leases[name] = leadership
        return {"leader": True, "generation": leadership.generation}

    def op_proclaim(self, job: str, value: str) -> dict[str, Any]:
        lease = self._lease(job)
        if not isinstance(lease, Leadership):
            raise errors.InvalidArgument(f"{job!r} is a job, not an election")
        lease.proclaim(value.encode())
        return {}

    def op_ensure_held(self, job: str) -> dict[str, Any]:
        self._lease(job).ensure_held()
        return {}

    def op_renew(self, job: str) -> dict[str, Any]:
        self._lease(job).renew()
        return {}

    def op_complete(self, job: str, result: str = "") -> dict[str, Any]:
        record = self._lease(job).complete(result.encode())
        return {"generation": record.generation}

    def op_release(self, job: str) -> dict[str, Any]:
        self._lease(job).release()
        return {}

    def op_lease(self, job: str) -> dict[str, Any]:
        lease = self._lease(job)
        return {"state": lease.state.value, "generation": lease.generation,
                "remaining_s": lease.remaining_s()}

    def op_fence(self, path: str, job: str, effect: str, enforce: bool = True,
                 generation: int | None = None) -> dict[str, Any]:
        """Write an effect to a fenced destination with the lease's token, *without*
        checking the lease first: what a paused worker's in-flight request does."""
        fence = self.fences.get(path)
        if fence is None:
            fence = self.fences[path] = SqliteFence(path, enforce_tokens=enforce)
        token = generation if generation is not None else self._lease(job).generation
        outcome = fence.apply(job, token, effect, effect.encode())
        return {"outcome": outcome.value, "token": token}

    def op_close(self) -> dict[str, Any]:
        if self.session is not None:
            self.session.close()
        return {}


def main() -> int:
    agent = Agent()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        reply: dict[str, Any] = {"id": request.get("id"), "t": time.time()}
        op = request.pop("op")
        request.pop("id", None)
        if op == "exit":
            print(json.dumps({**reply, "ok": True}), flush=True)
            return 0
        try:
            reply.update(getattr(agent, f"op_{op}")(**request), ok=True)
        except errors.LeaseError as exc:
            reply.update(ok=False, error=type(exc).__name__, message=str(exc),
                         generation=exc.generation)
        except Exception as exc:  # report, do not die: the driver decides
            reply.update(ok=False, error=type(exc).__name__, message=repr(exc))
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
