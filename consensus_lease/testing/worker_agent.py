"""The worker agent moved to :mod:`consensus_lease._worker_agent`.

Kept so ``python -m consensus_lease.testing.worker_agent`` still runs it.
"""

from __future__ import annotations

from consensus_lease._worker_agent import Agent, main

__all__ = ["Agent", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
