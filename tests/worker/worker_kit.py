"""Helpers of the worker tests: ``consensus-lease worker`` as a process, and polling."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from consensus_lease import Lease, LeaseStore, Session

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


class WorkerCommand:
    """A ``consensus-lease worker`` process; stdout and stderr go to files in ``dir``."""

    def __init__(self, directory: Path, args: list[str], env: dict[str, str] | None = None
                 ) -> None:
        self.dir = directory
        self.out_path = directory / "worker.out"
        self.err_path = directory / "worker.err"
        self._out: IO[str] = open(self.out_path, "w")  # noqa: SIM115 - closed in wait()
        self._err: IO[str] = open(self.err_path, "w")  # noqa: SIM115
        environ = dict(os.environ)
        environ["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), str(HERE), environ.get("PYTHONPATH", "")])
        environ["WORKER_TEST_DIR"] = str(directory)
        environ.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "consensus_lease.cli", "worker", *args],
            stdout=self._out, stderr=self._err, env=environ, cwd=directory,
            start_new_session=True,  # its own process group: cleanup reaches the children
        )

    def log(self) -> str:
        return self.err_path.read_text()

    def output(self) -> str:
        return self.out_path.read_text()

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self._out.close()
            self._err.close()

    def stop(self) -> None:
        """Kill whatever is left of the command's process group (a failed test can
        leave worker processes, even stopped ones, behind)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._out.close()
        self._err.close()

    def summary(self) -> dict[str, str]:
        """The ``worker stopped: name=value ...`` line, as a dict."""
        for line in self.output().splitlines():
            if line.startswith("worker stopped:"):
                pairs = line.split(":", 1)[1].split()
                return dict(p.split("=", 1) for p in pairs)
        raise AssertionError(f"no summary line in:\n{self.output()}\n{self.log()[-3000:]}")


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str,
             interval_s: float = 0.02) -> Any:
    """Poll ``predicate`` until truthy (returned) or ``timeout_s`` passes (AssertionError
    naming ``what``)."""
    give_up = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > give_up:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(interval_s)  # poll interval


def taking_over_the_first(store: LeaseStore, other: Session,
                          result: bytes = b"worker") -> tuple[Callable[[Lease, bytes], bytes],
                                                              list[Lease]]:
    """A handler returning ``result``, and the list of what it took over: the first job
    it is given is taken over behind the worker's back (its hold ended in the store,
    then claimed by ``other``) before it returns, so the worker's completion of it is
    stale. The list gets ``other``'s newer lease."""
    taken: list[Lease] = []

    def handler(lease: Lease, payload: bytes) -> bytes:
        if not taken:
            store.backend.release(lease.session.handle, lease.job_id, lease.claim_result)
            claimed = other.claim(lease.job_id)
            assert claimed is not None
            taken.append(claimed)
        return result

    return handler, taken
