"""What a worker did: counts per outcome, summed over its slots and processes."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["WorkerStats"]

_COUNTS = (
    "claimed", "fused_claims", "completed", "retried", "dead_lettered", "leases_lost",
    "sessions_lost", "released", "skipped", "errors", "restarts", "prefetched",
    "prefetch_dropped", "prefetch_claims", "complete_batches", "batched_completions",
)


@dataclass(slots=True)
class WorkerStats:
    """Counts of what a worker did (returned by :func:`run_worker`).

    Attributes:
        claimed: leases obtained with ``claim_next``, or by the completion of the job
            before (``complete_and_claim_next``).
        fused_claims: of ``claimed``, those the completion of the job before claimed
            (``WorkerConfig.fused_claim``): each one a ``claim_next`` round trip saved.
        completed: jobs this worker completed (the store recorded the completion).
        retried: failed attempts handed back for a later attempt (``lease.fail``).
        dead_lettered: failed attempts that made the job FAILED (its last attempt).
        leases_lost: leases lost before the job could be settled: the handler saw
            ``LeaseLost``, or the store refused the completion/failure (another holder
            took the job, the session expired) or could not say (``OutcomeUnknown``).
        sessions_lost: sessions found LOST (expired in the store or past their local
            deadline); each was replaced by a new one. Never silent: also logged.
        released: jobs handed back unworked or unfinished when the grace period of a stop
            ended (prefetched and not started, or still running); each used up an
            attempt.
        skipped: claims that raced with a completion or a dead letter (``JobCompleted``,
            ``JobFailed``), and jobs whose handler ended the lease itself with
            ``lease.release()`` or ``lease.fail()`` (one it completed itself counts in
            ``completed``).
        errors: unexpected exceptions below the handler (a bug: logged with its
            traceback; the slot opens a new session and goes on), and worker processes
            that exited with an error or had to be killed after the grace period.
        restarts: worker processes replaced after a signal the runner did not send
            (``mode="process"``).
        prefetched: leases claimed ahead by a slot's feeder (``WorkerConfig.prefetch``):
            one the slot takes counts in ``claimed`` too and is worked (also after a stop
            request, within the grace period); one it never takes counts in
            ``released`` (the grace period ended) or ``prefetch_dropped``.
        prefetch_dropped: prefetched leases never worked because they were lost first
            (their local deadline passed, or their session was lost or closed): the store
            hands them back (at once when closed, else after the TTL).
        prefetch_claims: claim calls that brought leases ahead (the feeder's
            ``claim_next``, or ``claim_next_many`` where the store batches claims, the
            slot's own batched claim included): ``prefetched / prefetch_claims`` is the
            mean number per round trip.
        complete_batches: ``session.complete_many`` calls that sent pending completions
            (``WorkerConfig.complete_batch`` > 1).
        batched_completions: completions those calls carried (each counts in
            ``completed``, ``leases_lost`` or ``skipped`` by its own outcome; one the
            store did not answer is sent, and counted, again);
            ``batched_completions / complete_batches`` is the mean batch size.
        stopped_by: why the worker stopped: ``"drained"`` (``until_empty``),
            ``"stop_event"``, ``"SIGTERM"``, ``"SIGINT"``, ``"error"``; ``None`` if
            every slot ended by itself.
    """

    claimed: int = 0
    fused_claims: int = 0
    completed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    leases_lost: int = 0
    sessions_lost: int = 0
    released: int = 0
    skipped: int = 0
    errors: int = 0
    restarts: int = 0
    prefetched: int = 0
    prefetch_dropped: int = 0
    prefetch_claims: int = 0
    complete_batches: int = 0
    batched_completions: int = 0
    stopped_by: str | None = None

    def add(self, other: WorkerStats) -> None:
        """Add ``other``'s counts to this one's (``stopped_by`` is left as is)."""
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def summary(self) -> str:
        """One line, ``name=value`` pairs: for logs and the command's last line."""
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    @property
    def exit_status(self) -> int:
        """The ``consensus-lease worker`` exit status: 1 if there were errors, 130 if
        stopped by SIGINT, else 0."""
        if self.errors:
            return 1
        return 130 if self.stopped_by == "SIGINT" else 0
