"""Workers as real OS processes, for fault injection: pause (SIGSTOP), resume (SIGCONT),
kill (SIGKILL), or cut one worker off the network by giving it its own group id.

::

    with WorkerProcess("A") as a:
        a.request("open", url=url, owner="A", ttl_s=2.0)
        a.request("claim", job="j1")          # {"ok": True, "claimed": True, "generation": 1}
        a.pause()                              # SIGSTOP: A's keepalive stops with it
        ...
        a.resume()
        a.request("ensure_held", job="j1")    # {"ok": False, "error": "LeaseLost", ...}

The classes live in the core module :mod:`consensus_lease._workerproc` (``consensus-lease
demo`` runs them too, and the core does not import the test kit); this is their public home.
"""

from __future__ import annotations

from consensus_lease._workerproc import WorkerError, WorkerProcess

__all__ = ["WorkerError", "WorkerProcess"]
