"""Every store held to the model: a differential hypothesis stateful test.

:func:`run_differential` drives a real store driver (:class:`~consensus_lease.backend.Backend`)
and the model's store rules (:mod:`consensus_lease.model.store`) with the same random
operations: open a session, ``claim``, ``claim_next`` (stores with queues; with
``queue_batches=True`` also its batch, ``claim_from_queue_many``), ``renew``,
``complete``, ``release``, ``fail`` (no retry delay), close a session, expire a session
(the driver's ``expire_session`` test hook, when it has one) — each on any claim made
so far, stale ones included. After each operation the store's answer (success, ``None``,
or the error type: ``JobCompleted``, ``StaleLeaseError``, ``SessionExpired``) must be the
model's, and the state (``get``) of each job it may have changed the model's; tokens are
compared by order (each claim's above every earlier one of the job), not value, since
stores number them differently (etcd: revisions)::

    from consensus_lease.testing.differential import run_differential

    def test_my_store_agrees_with_the_model():
        run_differential(lambda: open_store("mystore://fresh-prefix").backend)

A disagreement fails with the operations that led to it (hypothesis shrinks them).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ..backend import Backend, SessionHandle
from ..errors import JobCompleted, SessionExpired, StaleLeaseError, UnsupportedOperation
from ..model.store import NO_OWNER, Answer, Record, claim, complete, end_hold, renew
from ..record import ClaimResult, JobState

__all__ = ["OpenBackend", "run_differential"]

OpenBackend = Callable[[], Backend]
"""Returns a driver on empty, isolated data (called once per random sequence)."""

JOBS = ("job-a", "job-b")
QUEUE = "diff-q"
QUEUED = ("q-1", "q-2")
MAX_SESSIONS = 3
TTL_S = 30.0
"""Long: a session ends only when the test closes or expires it."""


@dataclass
class _Claim:
    """A claim made: by which session, of which job, the store's answer and the model's
    generation for it (the store's token may be numbered differently)."""

    session: int
    job: str
    result: ClaimResult
    generation: int


@dataclass
class _Model:
    alive: list[bool] = field(default_factory=list)
    records: dict[str, Record] = field(default_factory=dict)

    def record(self, job: str) -> Record:
        rec = self.records.get(job, Record())
        live = rec.owner != NO_OWNER and not rec.completed and self.alive[rec.owner]
        return rec._replace(lease_until=1 if live else 0)

    def state(self, job: str) -> JobState:
        rec = self.record(job)
        if rec.completed:
            return JobState.COMPLETED
        return JobState.HELD if rec.lease_until else JobState.AVAILABLE


def _answer(call: Callable[[], object]) -> tuple[Answer, object]:
    """The store's answer as the model's :class:`Answer`, and the returned value."""
    try:
        value = call()
    except JobCompleted:
        return Answer.COMPLETED, None
    except StaleLeaseError:
        return Answer.STALE, None
    except SessionExpired:
        return Answer.EXPIRED, None
    return (Answer.HELD if value is None else Answer.OK), value


class _Machine(RuleBasedStateMachine):
    open_backend: OpenBackend
    close_backend: bool

    def __init__(self) -> None:
        super().__init__()
        self.backend = type(self).open_backend()
        self.model = _Model()
        self.sessions: list[SessionHandle] = []
        self.claims: list[_Claim] = []
        self.tokens: dict[str, int] = {}
        self.queues = self.backend.capabilities.queues
        tag = uuid.uuid4().hex[:8]  # names of this sequence's own: a store may be shared
        self.queue = f"{QUEUE}-{tag}"
        self.queued = tuple(f"{j}-{tag}" for j in QUEUED) if self.queues else ()
        self.jobs = (*(f"{j}-{tag}" for j in JOBS), *self.queued)
        self.touched = set(self.jobs)
        for job in self.queued:
            self.backend.enqueue(self.queue, job, b"", None)

    def teardown(self) -> None:
        for handle, alive in zip(self.sessions, self.model.alive, strict=True):
            if alive:
                self.backend.close_session(handle)
        if type(self).close_backend:
            self.backend.close()

    def _live(self, s: int) -> bool:
        return s < len(self.sessions) and self.model.alive[s]

    # -- sessions --------------------------------------------------------------------

    @precondition(lambda self: len(self.sessions) < MAX_SESSIONS)
    @rule()
    def open_session(self) -> None:
        owner = f"diff-{len(self.sessions)}-{uuid.uuid4().hex[:6]}"
        self.sessions.append(self.backend.open_session(owner, TTL_S))
        self.model.alive.append(True)

    @rule(s=st.integers(0, MAX_SESSIONS - 1), expire=st.booleans())
    def end_session(self, s: int, expire: bool) -> None:
        if not self._live(s):
            return
        hook = getattr(self.backend, "expire_session", None)
        if expire and hook is not None:
            hook(self.sessions[s].session_id)
        else:
            self.backend.close_session(self.sessions[s])
        self.model.alive[s] = False
        self.touched.update(self.jobs)

    # -- claims ----------------------------------------------------------------------

    @rule(s=st.integers(0, MAX_SESSIONS - 1), n=st.integers(0, len(JOBS + QUEUED) - 1))
    def claim(self, s: int, n: int) -> None:
        j = self.jobs[n % len(self.jobs)]
        if not self._live(s):
            return
        self.touched.add(j)
        after, expected = claim(self.model.record(j), s, 0, 1, frozenset())
        got, value = _answer(lambda: self.backend.claim(self.sessions[s], j))
        assert got is expected, (
            f"claim({j}) by session {s}: store {got.name}, model {expected.name}")
        if got is Answer.OK:
            assert isinstance(value, ClaimResult)
            self._claimed(s, j, value, after)

    def _claimed(self, s: int, job: str, result: ClaimResult, after: Record) -> None:
        before = self.tokens.get(job)
        assert before is None or result.generation > before, (
            f"{job}: token {result.generation} after {before}")
        self.tokens[job] = result.generation
        self.model.records[job] = after
        self.claims.append(_Claim(s, job, result, after.generation))

    @precondition(lambda self: self.queues)
    @rule(s=st.integers(0, MAX_SESSIONS - 1))
    def claim_next(self, s: int) -> None:
        if not self._live(s):
            return
        claimable = [j for j in self.queued if self.model.state(j) is JobState.AVAILABLE]
        self.touched.update(self.queued)
        got = _claim_next(self.backend, self.sessions[s], self.queue)
        if got is None:
            assert not claimable, f"claim_next by session {s}: None, model: {claimable}"
            return
        job, result = got
        assert job in claimable, f"claim_next by session {s} took {job}; model: {claimable}"
        after, _ = claim(self.model.record(job), s, 0, 1, frozenset())
        self._claimed(s, job, result, after)

    # -- operations on a claim (any claim made so far: stale ones too) -------------------

    @precondition(lambda self: bool(self.claims))
    @rule(c=st.integers(0, 50), op=st.sampled_from(("renew", "complete", "release", "fail")))
    def on_claim(self, c: int, op: str) -> None:
        made = self.claims[c % len(self.claims)]
        s, job, result = made.session, made.job, made.result
        self.touched.add(job)
        rec, alive, token = self.model.record(job), self.model.alive[s], made.generation
        if op == "renew":
            after, expected = renew(rec, s, token, 0, 1, frozenset(), alive)
        elif op == "complete":
            after, expected = complete(rec, s, token, 0, frozenset(), alive)
        else:
            after, expected = end_hold(rec, s, token, 0, frozenset(), alive)
        got, _ = _answer(lambda: self._call(op, made) or True)
        assert got is expected, (
            f"{op}({job}, token {result.generation}) by session {s}: store {got.name}, "
            f"model {expected.name}")
        if got is Answer.OK and op != "renew":
            self.model.records[job] = after._replace(lease_until=0)

    def _call(self, op: str, made: _Claim) -> object:
        handle, job, result = self.sessions[made.session], made.job, made.result
        if op == "renew":
            return self.backend.renew(handle, job, result)
        if op == "complete":
            return self.backend.complete(handle, job, result, b"done")
        if op == "release":
            return self.backend.release(handle, job, result)
        return self.backend.fail(handle, job, result, "boom", 0.0)

    @invariant()
    def states_agree(self) -> None:
        """Each job an operation may have changed is in the model's state."""
        for job in sorted(self.touched):
            record = self.backend.get(job)
            state = JobState.AVAILABLE if record is None else record.state
            assert state is self.model.state(job), (
                f"{job}: store {state.name}, model {self.model.state(job).name}")
        self.touched.clear()


class _BatchMachine(_Machine):
    """:class:`_Machine` with the batched queue claim as one more rule."""

    @precondition(lambda self: self.queues)
    @rule(s=st.integers(0, MAX_SESSIONS - 1), n=st.integers(1, len(QUEUED) + 1))
    def claim_next_many(self, s: int, n: int) -> None:
        """``min(n, claimable)`` distinct claimable jobs (a batch is never cut short
        without others claiming); the oldest ones where the store orders a batch."""
        if not self._live(s):
            return
        claimable = [j for j in self.queued if self.model.state(j) is JobState.AVAILABLE]
        self.touched.update(self.queued)
        size = min(n, self.backend.capabilities.max_queue_claim_batch)
        got = self.backend.claim_from_queue_many(self.sessions[s], self.queue, size)
        jobs = [job for job, _, _ in got]
        assert len(set(jobs)) == len(jobs) == min(size, len(claimable)) and set(
            jobs) <= set(claimable), (
            f"claim_next_many({size}) by session {s} took {jobs}; model: {claimable}")
        if self.backend.capabilities.max_queue_claim_batch > 1:
            assert jobs == claimable[: len(jobs)], (
                f"claim_next_many({size}) took {jobs}, not the oldest of {claimable}")
        for job, result, _ in got:
            after, _ = claim(self.model.record(job), s, 0, 1, frozenset())
            self._claimed(s, job, result, after)


def _claim_next(backend: Backend, session: SessionHandle, queue: str
                ) -> tuple[str, ClaimResult] | None:
    """The store's one-step queue claim, or its candidates claimed one by one (what
    :meth:`consensus_lease.Session.claim_next` does, without waiting)."""
    try:
        picked = backend.claim_from_queue(session, queue)
    except UnsupportedOperation:
        for job, _payload in backend.queue_candidates(queue, 32):
            try:
                result = backend.claim(session, job)
            except JobCompleted:
                continue
            if result is not None:
                return job, result
        return None
    if picked is None or picked[1] is None:
        return None
    return picked[0], picked[1]


def run_differential(open_backend: OpenBackend, *, examples: int = 200, steps: int = 25,
                     shrink: bool = True, close: bool = True,
                     queue_batches: bool = False) -> None:
    """Run ``examples`` random sequences of up to ``steps`` operations against the
    model, each on the driver ``open_backend()`` returns; raise AssertionError on the
    first disagreement (shrunk to a minimal sequence unless ``shrink`` is false).

    Each sequence uses job and queue names of its own and closes the sessions it opened,
    so ``open_backend`` may return one shared driver every time (then pass ``close=False``,
    and close it yourself): cheaper on a server than fresh data per sequence.
    ``close=True`` closes each driver after its sequence. ``queue_batches=True`` adds
    the batched queue claim (``claim_from_queue_many``, up to
    ``capabilities.max_queue_claim_batch``) to the operations: a sequence of its own (the
    default keeps the sequences it always ran)."""
    base = _BatchMachine if queue_batches else _Machine
    machine = type("DifferentialMachine", (base,), {
        "open_backend": staticmethod(open_backend), "close_backend": close})
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    machine.TestCase.settings = settings(  # type: ignore[attr-defined]
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
        phases=phases, suppress_health_check=list(HealthCheck), derandomize=True,
    )
    machine.TestCase().runTest()  # type: ignore[attr-defined]
