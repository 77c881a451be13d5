"""The worker runner: claim jobs from a work queue and run a handler on each.

::

    from consensus_lease.worker import Retry, run_worker

    def send_invoice(lease, payload):          # or: async def send_invoice(lease, payload)
        lease.ensure_held()                    # before every effect
        mailer.send(payload, idempotency_key=(lease.job_id, lease.generation))
        return b"sent"                         # stored with the completion

    run_worker("sqlite:////var/lib/jobs.db", "invoices", send_invoice, concurrency=4)

or from a shell (``consensus-lease worker --help``)::

    consensus-lease worker --backend sqlite:////var/lib/jobs.db --queue invoices \\
        --concurrency 4 --processes billing.jobs:send_invoice

The handler contract is in :mod:`.handler`; what one slot does, in :mod:`.slot`; the
process supervisor, in :mod:`.processes`. Summary:

* each slot (a thread, or a ``spawn``-ed process) has its own session; a session found
  LOST is replaced by a new one (``sessions_lost``, logged at WARNING);
* ``claim_next(queue, wait_s=claim_wait_s)`` -> ``lease.ensure_held()`` -> handler ->
  ``complete(result)`` (by default ``complete_and_claim_next(result, queue)``, whose
  lease, if any, is the next job, with no ``claim_next`` for it; ``fused_claim=False``
  turns that off); an exception -> ``lease.fail(exc)`` with the retry policy's delay
  (:class:`Retry` chooses the delay); ``LeaseLost`` -> logged, not completed;
  ``JobCompleted``/``JobFailed`` races -> skipped;
* ``prefetch`` > 0 (leases claimed ahead) or ``complete_batch`` > 1 (completions queued
  and sent with ``session.complete_many``, always well before the lease's deadline): a
  feeder thread beside each slot, :mod:`.feeder`; both off by default;
* a stop (``stop_event``; SIGTERM/SIGINT in the command) stops claiming, gives jobs in
  flight ``grace_s`` to finish, then releases what is still held;
* ``until_empty``: stop once the queue has nothing available or held (jobs waiting out a
  retry delay are waited for; FAILED ones are not).

There is no "fail for good now": the store makes a job FAILED only when its
``max_attempts`` (recorded at ``enqueue``) are used up.
"""

from .config import ENVIRONMENT, WorkerConfig
from .handler import Handler, Retry, load_handler
from .runner import run_worker
from .stats import WorkerStats

__all__ = ["ENVIRONMENT", "Handler", "Retry", "WorkerConfig", "WorkerStats", "load_handler",
           "run_worker"]
