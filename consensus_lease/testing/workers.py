"""Workers as real OS processes, for fault injection: pause (SIGSTOP), resume (SIGCONT),
kill (SIGKILL), or cut one worker off the network by giving it its own group id.

gRPC and kazoo run background threads, and forking a process that holds such a client
is unsafe, so workers are started with ``subprocess`` and create their clients inside.

::

    with WorkerProcess("A") as a:
        a.request("open", url=url, owner="A", ttl_s=2.0)
        a.request("claim", job="j1")          # {"ok": True, "claimed": True, "generation": 1}
        a.pause()                              # SIGSTOP: A's keepalive stops with it
        ...
        a.resume()
        a.request("ensure_held", job="j1")    # {"ok": False, "error": "LeaseLost", ...}

Each worker runs the agent :mod:`consensus_lease.testing._worker_agent` (one JSON request
and reply per line). This module needs only the standard library, as importing
:mod:`consensus_lease.testing` does: ``consensus-lease demo`` runs two workers with just
the ``cli`` extra installed.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

__all__ = ["WorkerError", "WorkerProcess"]


class WorkerError(RuntimeError):
    """The worker process died, or did not answer in time."""


class WorkerProcess:
    """A ``consensus_lease.testing._worker_agent`` subprocess.

    Args:
        name: label for messages.
        gid: run the process with this real/effective group id (``setpriv``), so
            iptables ``-m owner --gid-owner`` rules can cut its traffic alone. Root only.
        env: extra environment variables.
        python: the interpreter (default: this one).
    """

    def __init__(
        self,
        name: str,
        *,
        gid: int | None = None,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.name = name
        self.gid = gid
        self._env = {**os.environ, **(env or {})}
        self._python = python
        self._ids = itertools.count(1)
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._pending: dict[int, dict[str, Any]] = {}
        self._stderr: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> WorkerProcess:
        argv: Sequence[str] = [self._python, "-m", "consensus_lease.testing._worker_agent"]
        if self.gid is not None:
            argv = ["setpriv", f"--regid={self.gid}", "--clear-groups",
                    *argv]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, env=self._env,
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        return self

    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._replies.put(json.loads(line))
            except json.JSONDecodeError:
                self._stderr.append(f"[stdout] {line}")
        self._replies.put(None)  # EOF: the process ended

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise WorkerError(f"worker {self.name} not started")
        return self.proc.pid

    @property
    def stderr(self) -> str:
        """What the worker printed on stderr so far (for failure reports)."""
        return "".join(self._stderr)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- requests --------------------------------------------------------------------

    def send(self, op: str, **args: Any) -> int:
        """Send a request without waiting; returns its id for :meth:`reply`."""
        if self.proc is None or self.proc.stdin is None:
            raise WorkerError(f"worker {self.name} not started")
        request_id = next(self._ids)
        try:
            self.proc.stdin.write(json.dumps({"id": request_id, "op": op, **args}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerError(f"worker {self.name} is gone: {self.stderr[-2000:]}") from exc
        return request_id

    def reply(self, request_id: int, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait up to ``timeout_s`` for the reply to ``request_id``."""
        give_up = time.monotonic() + timeout_s
        while request_id not in self._pending:
            left = give_up - time.monotonic()
            if left <= 0:
                raise WorkerError(f"worker {self.name}: no reply to #{request_id} in {timeout_s} s")
            try:
                message = self._replies.get(timeout=left)
            except queue.Empty:
                continue
            if message is None:
                self._replies.put(None)
                raise WorkerError(
                    f"worker {self.name} exited ({self.proc and self.proc.poll()}): "
                    f"{self.stderr[-2000:]}"
                )
            self._pending[int(message["id"])] = message
        return self._pending.pop(request_id)

    def request(self, op: str, timeout_s: float = 30.0, **args: Any) -> dict[str, Any]:
        """Send ``op`` and wait for its reply (a dict with ``ok`` and the result)."""
        return self.reply(self.send(op, **args), timeout_s)

    # -- faults ----------------------------------------------------------------------

    def pause(self) -> None:
        """SIGSTOP: the whole process, keepalive thread included, stops."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, then reap."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not within ``timeout_s``."""
        if not self.alive():
            return
        try:
            self.resume()
            self.request("exit", timeout_s=timeout_s)
            assert self.proc is not None
            self.proc.wait(timeout=timeout_s)
        except (WorkerError, subprocess.TimeoutExpired, OSError):
            self.kill()

    def __enter__(self) -> WorkerProcess:
        return self.start() if self.proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
