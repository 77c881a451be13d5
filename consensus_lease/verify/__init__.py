"""``consensus-lease verify``: a history checker that proves zero stale effects under faults.

* :mod:`~consensus_lease.verify.worker` — the worker process (claim, check, write with
  the token, complete), recording every operation;
* :mod:`~consensus_lease.verify.pool` — worker processes by slot (pause, kill, restart);
* :mod:`~consensus_lease.verify.nemesis` — the seeded fault schedule and the faults;
* :mod:`~consensus_lease.verify.kit` — a container cluster as the nemesis sees it;
* :mod:`~consensus_lease.verify.history` — the JSONL history;
* :mod:`~consensus_lease.verify.checker` — ``check(history, effects)``, a pure function
  (violations, and why a run without any may still be inconclusive);
* :mod:`~consensus_lease.verify.destination` — the fenced destination (SQLite file or SQL);
* :mod:`~consensus_lease.verify.progress` — a run's progress as it runs (the terminal bar,
  or a line every 30 s in a log);
* :mod:`~consensus_lease.verify.interrupts` — SIGTERM/SIGINT as an exception at a safe
  point, so an interrupted run still heals every fault and ends every worker;
* :mod:`~consensus_lease.verify.runner` — one run; :mod:`~consensus_lease.verify.command`
  — the CLI subcommand (exit status 0 PASS, 1 FAIL, 2 INCONCLUSIVE);
* :mod:`~consensus_lease.verify.lockset` — ``--workload lock-set``: Jepsen's lock-set
  workload (a set read and written back under the lease, a worker paused past its TTL
  every 5 s), its lost-update accounting (``account``, pure) and its run
  (``run_lockset``).

Run one from Python with ``consensus_lease.verify.runner.run_verify(VerifyConfig(...))``.
This package module imports only the pure parts (checker, history), so the worker
process (``python -m consensus_lease.verify.worker``) starts without the rest.
Nothing here is imported by the library itself.
"""

from .checker import COUNTS, VIOLATIONS, JobReport, Report, check, inconclusive_reasons
from .history import Op, read_history

__all__ = [
    "COUNTS",
    "VIOLATIONS",
    "JobReport",
    "Op",
    "Report",
    "check",
    "inconclusive_reasons",
    "read_history",
]
