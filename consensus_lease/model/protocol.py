"""The protocol as a transition system: workers, the network, the store and the fence.

One job; ``Config.workers`` workers. Time is in ticks. The store's clock decides expiry
(:mod:`.store`); each worker has its own monotonic clock, which a *tick* advances with
the store's, except that a worker's clock may fall behind the store's by up to
``Config.drift`` ticks in all (a slow clock: the case the margin covers; a fast clock
only ends leases earlier locally). A worker may pause for any time: it simply takes no
step while ticks happen.

A worker (as :class:`consensus_lease.Session` and :class:`consensus_lease.Lease` do):

* sends ``claim``; on OK it holds the job at the new generation, with the local deadline
  ``send time + ttl - margin`` on its own clock (:mod:`consensus_lease._liveness`);
* while ``clock < deadline`` it may send ``renew`` (an OK moves the deadline to that
  request's send time + ttl - margin, only forward and only if it was sent before the
  deadline, as ``Liveness.renewed`` does), send its effect to the destination with its
  token, and end the hold: ``complete`` (after its effect), ``release`` or ``fail``.
  Once it has sent an ending it produces no more effects;
* once ``clock >= deadline`` the lease is lost (final, as the watchdog makes it): the
  worker is idle again and may claim anew, as the same owner;
* may give up waiting for an answer at any moment (a timeout): a late answer to a
  request it gave up on is ignored. One request at a time.

The network delays every message (request, answer, effect) for any time, loses it
(``Config.loss``) or delivers it more than once (``Config.duplication``). A message
delayed after the worker's deadline check is the worker paused between the check and the
effect: the fence's case.

The destination fences effects: accepts a token only if ``>=`` the highest it has seen,
and dedupes ``(token, effect)``. In the read-modify-write client (``Config.rmw``) each
holder reads the destination's set, then writes back the set plus its own item; the read
records the token (the fenced read, :meth:`consensus_lease.SqliteFence.read_fenced`) unless
:attr:`Mutation.WRITE_ONLY_FENCED`.

States are tuples of small ints, hashable. Times are stored *relative* (store times
relative to the store's now, a worker's to its own clock) and generations by rank, so
states that differ only by a shift of time or a renumbering of tokens are one state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from .store import Answer, Mutation, Record, claim, complete, end_hold, holds, renew

__all__ = ["Config", "Dest", "Msg", "State", "Step", "Worker", "initial", "successors"]

# worker phases
IDLE, HOLDING, ENDING, DONE = 0, 1, 2, 3
PHASES = ("idle", "holding", "ending", "done")
# request kinds
CLAIM, RENEW, COMPLETE, RELEASE, FAIL = 0, 1, 2, 3, 4
KINDS = ("claim", "renew", "complete", "release", "fail")
# message types
REQ, REP, EFFECT, WRITE = 0, 1, 2, 3
NO_READ = -1


@dataclass(frozen=True)
class Config:
    """What to explore.

    Attributes:
        workers: number of workers (2 or 3 are practical).
        ttl: lease TTL in ticks.
        margin: safety margin in ticks (the local deadline is ``ttl - margin`` after the
            send time); ``Mutation.MARGIN_BELOW_DRIFT`` uses ``drift - 1``.
        drift: most ticks a worker's clock may fall behind the store's.
        loss / duplication: the network may lose / duplicate messages.
        release_fail: workers may also release or fail (else only complete).
        rmw: the read-modify-write client instead of one effect per holder.
        max_in_flight: most messages in the network at once (a bound on the search).
        mutations: protocol rules switched off (:class:`Mutation`).
    """

    workers: int = 2
    ttl: int = 3
    margin: int = 1
    drift: int = 1
    loss: bool = True
    duplication: bool = True
    release_fail: bool = True
    rmw: bool = False
    max_in_flight: int = 3
    mutations: frozenset[Mutation] = field(default_factory=frozenset)

    @property
    def effective_margin(self) -> int:
        if Mutation.MARGIN_BELOW_DRIFT in self.mutations:
            return self.drift - 1
        return self.margin

    def with_mutation(self, mutation: Mutation) -> Config:
        extra = {"rmw": True} if mutation is Mutation.WRITE_ONLY_FENCED else {}
        return Config(**{**self.__dict__, **extra,
                         "mutations": self.mutations | {mutation}})


class Worker(NamedTuple):
    """One worker. Times relative to its own clock (``deadline`` > 0: not yet passed).

    ``pending`` is ``(kind, send time)`` of the request it waits for, or ``()``.
    ``effect_sent``: this holder sent its effect (or write). ``read``: the set it read
    (read-modify-write), or ``NO_READ``. ``lag_left``: ticks its clock may still lose.
    """

    phase: int
    generation: int
    deadline: int
    effect_sent: bool
    pending: tuple[int, ...]
    lag_left: int
    read: int


class Msg(NamedTuple):
    """A message in flight. ``send`` is the sender's send time (relative to its clock);
    ``answer`` the store's answer (replies); ``value`` the set written (writes)."""

    type: int
    kind: int
    worker: int
    generation: int
    send: int
    answer: int
    value: int


class Dest(NamedTuple):
    """The destination: ``highest`` token seen (fence), ``applied`` tokens of accepted
    effects (sorted), ``value`` the set (bit i: worker i's item), ``acked`` the items whose
    write the destination acknowledged."""

    highest: int
    applied: tuple[int, ...]
    value: int
    acked: int


class State(NamedTuple):
    record: Record
    workers: tuple[Worker, ...]
    net: tuple[Msg, ...]
    dest: Dest


class Step(NamedTuple):
    """A transition: who acted, what it did, the state after, and the invariant it broke
    (``""`` if none)."""

    actor: str
    action: str
    state: State
    violation: str


def initial(config: Config) -> State:
    worker = Worker(IDLE, 0, 0, False, (), config.drift, NO_READ)
    return State(Record(), (worker,) * config.workers, (), Dest(0, (), 0, 0))


def successors(state: State, config: Config) -> Iterator[Step]:
    """Every step possible from ``state``; each checked against the invariants."""
    for step in _steps(state, config):
        if step is not None:
            yield step._replace(state=_drop_dead_answers(step.state))


def _steps(state: State, config: Config) -> Iterator[Step | None]:
    yield from _ticks(state, config)
    for w in range(len(state.workers)):
        yield from _worker_steps(state, config, w)
    seen: set[Msg] = set()
    for i, msg in enumerate(state.net):
        if msg in seen:
            continue
        seen.add(msg)
        yield from _network_steps(state, config, i, msg)


def _drop_dead_answers(state: State) -> State:
    """Answers to a request the worker no longer waits for are dropped: the worker
    would ignore them (a call's answer belongs to that call; a new call, a timeout or
    the end of the lease ends the wait)."""
    workers = state.workers
    net = tuple(m for m in state.net
                if m.type != REP or workers[m.worker].pending == (m.kind, m.send))
    return state if len(net) == len(state.net) else state._replace(net=net)


# -- time ------------------------------------------------------------------------------


def _ticks(state: State, config: Config) -> Iterator[Step]:
    """The store's clock advances one tick; every worker's too, or all but one whose
    clock lags (drift)."""
    yield _tick(state, config, None)
    for w, worker in enumerate(state.workers):
        if worker.lag_left > 0 and _clock_matters(state, w):
            yield _tick(state, config, w)


def _clock_matters(state: State, w: int) -> bool:
    """Whether worker ``w``'s clock is read by anything in ``state`` (else a lagging
    tick is a plain tick that spends lag budget: left out, the budget kept for later)."""
    worker = state.workers[w]
    if worker.pending or worker.phase in (HOLDING, ENDING):
        return True
    return any(m.worker == w and m.type in (REQ, REP) for m in state.net)


def _tick(state: State, config: Config, lagging: int | None) -> Step:
    rec = state.record
    record = rec._replace(lease_until=max(rec.lease_until - 1, 0))
    floor = -(config.ttl - config.effective_margin)  # any send time below: lost at once
    workers = []
    for w, worker in enumerate(state.workers):
        if w == lagging:
            workers.append(worker._replace(lag_left=worker.lag_left - 1))
            continue
        pending = worker.pending
        if pending:
            pending = (pending[0], max(pending[1] - 1, floor))
        deadline = worker.deadline - 1 if worker.phase in (HOLDING, ENDING) else 0
        workers.append(worker._replace(deadline=deadline, pending=pending))
    net = tuple(sorted(m if (m.type != REQ and m.type != REP) or m.worker == lagging
                       else m._replace(send=max(m.send - 1, floor)) for m in state.net))
    after = _settle(State(record, tuple(workers), net, state.dest))
    action = "tick" if lagging is None else f"tick (w{lagging}'s clock lags)"
    return Step("clock", action, after, _believers(after))


def _settle(state: State) -> State:
    """A holder whose local deadline passed has lost the lease (final)."""
    if not any(w.phase in (HOLDING, ENDING) and w.deadline <= 0 for w in state.workers):
        return state
    workers = tuple(
        Worker(IDLE, 0, 0, False, (), w.lag_left, NO_READ)
        if w.phase in (HOLDING, ENDING) and w.deadline <= 0 else w
        for w in state.workers)
    return state._replace(workers=workers)


def _believers(state: State) -> str:
    """Invariant: at most one worker believes it holds the job (holding, deadline not
    passed) at any store time."""
    if sum(w.phase == HOLDING for w in state.workers) > 1:
        return "two workers hold the job at the same store time"
    return ""


# -- workers ---------------------------------------------------------------------------


def _send(state: State, w: int, worker: Worker, msg: Msg, config: Config) -> State | None:
    if len(state.net) >= config.max_in_flight:
        return None
    workers = list(state.workers)
    workers[w] = worker
    return state._replace(workers=tuple(workers), net=tuple(sorted((*state.net, msg))))


def _request(state: State, config: Config, w: int, kind: int, phase: int) -> Step | None:
    worker = state.workers[w]
    msg = Msg(REQ, kind, w, worker.generation, 0, 0, 0)
    after = _send(state, w, worker._replace(phase=phase, pending=(kind, 0)), msg, config)
    if after is None:
        return None
    token = f" (token {worker.generation})" if kind != CLAIM else ""
    return Step(f"w{w}", f"sends {KINDS[kind]}{token}", after, "")


def _worker_steps(state: State, config: Config, w: int) -> Iterator[Step | None]:
    worker = state.workers[w]
    if worker.pending:
        workers = list(state.workers)
        workers[w] = worker._replace(pending=())
        kind = KINDS[worker.pending[0]]
        yield Step(f"w{w}", f"gives up waiting for its {kind} (timeout)",
                   state._replace(workers=tuple(workers)), "")
        return
    if worker.phase == IDLE:
        yield _request(state, config, w, CLAIM, IDLE)
    elif worker.phase == HOLDING:
        yield _request(state, config, w, RENEW, HOLDING)
        if not worker.effect_sent:
            yield from _effect_steps(state, config, w)
        else:
            yield _request(state, config, w, COMPLETE, ENDING)
        if config.release_fail:
            yield _request(state, config, w, RELEASE, ENDING)
            yield _request(state, config, w, FAIL, ENDING)
    elif worker.phase == ENDING and worker.effect_sent:
        yield _request(state, config, w, COMPLETE, ENDING)  # a retried completion


def _effect_steps(state: State, config: Config, w: int) -> Iterator[Step | None]:
    """The holder's effect, sent before its local deadline: checked against the store."""
    worker = state.workers[w]
    g = worker.generation
    if not config.rmw:
        msg = Msg(EFFECT, 0, w, g, 0, 0, 0)
        after = _send(state, w, worker._replace(effect_sent=True), msg, config)
        if after is not None:
            yield Step(f"w{w}", f"sends its effect (token {g})", after,
                       _effect_in_lease(state, w))
        return
    if worker.read == NO_READ:
        yield _fenced_read(state, config, w)
        return
    value = worker.read | (1 << w)
    msg = Msg(WRITE, 0, w, g, 0, 0, value)
    after = _send(state, w, worker._replace(effect_sent=True), msg, config)
    if after is not None:
        yield Step(f"w{w}", f"writes back {_set(value)} (token {g})", after,
                   _effect_in_lease(state, w))


def _effect_in_lease(state: State, w: int) -> str:
    """Invariant: an effect sent before the local deadline is sent while the store
    still holds the sender's lease."""
    if holds(state.record, w, state.workers[w].generation, 0):
        return ""
    return (f"w{w} sent an effect before its local deadline while the store no longer "
            f"held its lease")


def _fenced_read(state: State, config: Config, w: int) -> Step:
    """Read the destination's set (one atomic read); fenced: the token is recorded as
    the highest, or the read is refused when below it."""
    worker, dest = state.workers[w], state.dest
    workers = list(state.workers)
    fenced = Mutation.WRITE_ONLY_FENCED not in config.mutations
    g = worker.generation
    if fenced and g < dest.highest:
        workers[w] = Worker(IDLE, 0, 0, False, (), worker.lag_left, NO_READ)
        return Step(f"w{w}", f"fenced read (token {g}): FenceRejected, gives up the job",
                    state._replace(workers=tuple(workers)), "")
    workers[w] = worker._replace(read=dest.value)
    highest = max(dest.highest, g) if fenced else dest.highest
    after = state._replace(workers=tuple(workers), dest=dest._replace(highest=highest))
    what = "fenced read" if fenced else "read (unfenced)"
    return Step(f"w{w}", f"{what} (token {g}): {_set(dest.value)}", after, "")


def _set(value: int) -> str:
    return "{" + ",".join(f"w{i}" for i in range(8) if value >> i & 1) + "}"


# -- the network, the store, the destination --------------------------------------------


def _network_steps(state: State, config: Config, i: int, msg: Msg) -> Iterator[Step]:
    rest = state.net[:i] + state.net[i + 1:]
    what = _describe(msg)
    # An answer is never lost or duplicated here: a lost one is an answer delayed until
    # the worker gives up waiting (then it is dropped), and the copy of a delivered
    # answer is one the worker no longer waits for. Fewer states, the same behaviours.
    if config.loss and msg.type != REP:
        yield Step("net", f"loses {what}", state._replace(net=rest), "")
    yield _deliver(state._replace(net=rest), config, msg, what)
    if config.duplication and msg.type != REP:
        step = _deliver(state, config, msg, what)
        yield step._replace(action=step.action + " (a duplicate stays in flight)")


def _describe(msg: Msg) -> str:
    if msg.type == REQ and msg.kind == CLAIM:
        return f"w{msg.worker}'s claim"
    if msg.type == REQ:
        return f"w{msg.worker}'s {KINDS[msg.kind]} (token {msg.generation})"
    if msg.type == REP:
        return f"the answer {Answer(msg.answer).name} to w{msg.worker}'s {KINDS[msg.kind]}"
    if msg.type == EFFECT:
        return f"w{msg.worker}'s effect (token {msg.generation})"
    return f"w{msg.worker}'s write {_set(msg.value)} (token {msg.generation})"


def _deliver(state: State, config: Config, msg: Msg, what: str) -> Step:
    if msg.type == REQ:
        return _at_store(state, config, msg, what)
    if msg.type == REP:
        return _at_worker(state, config, msg, what)
    return _at_destination(state, config, msg, what)


def _at_store(state: State, config: Config, msg: Msg, what: str) -> Step:
    rec, w, g, m = state.record, msg.worker, msg.generation, config.mutations
    violation = ""
    if msg.kind == CLAIM:
        after, answer = claim(rec, w, 0, config.ttl, m)
        g = after.generation
        if answer is Answer.OK:
            violation = _claim_violation(rec, after)
    else:
        if msg.kind == RENEW:
            after, answer = renew(rec, w, g, 0, config.ttl, m)
        elif msg.kind == COMPLETE:
            after, answer = complete(rec, w, g, 0, m)
        else:
            after, answer = end_hold(rec, w, g, 0, m)
        repeat = rec.completed and msg.kind == COMPLETE
        if answer is Answer.OK and not repeat and not holds(rec, w, g, 0):
            violation = f"the store accepted a stale {KINDS[msg.kind]} (token {g})"
    reply = Msg(REP, msg.kind, w, g, msg.send, int(answer), 0)
    net = state.net
    if len(net) < config.max_in_flight:
        net = tuple(sorted((*net, reply)))
    after_state = state._replace(record=after, net=net)
    return Step("store", f"receives {what}: {answer.name}", after_state, violation)


def _claim_violation(before: Record, after: Record) -> str:
    if before.completed:
        return "a completed job was claimed again"
    if after.generation <= before.generation:
        return (f"the generation did not increase ({before.generation} -> "
                f"{after.generation})")
    return ""


def _at_worker(state: State, config: Config, msg: Msg, what: str) -> Step:
    """An answer arrives; ignored unless it answers the request the worker waits for."""
    w = msg.worker
    worker = state.workers[w]
    if worker.pending != (msg.kind, msg.send):
        return Step(f"w{w}", f"receives {what}: ignored (not waiting for it)", state, "")
    worker = _answered(worker, msg, config)
    workers = list(state.workers)
    workers[w] = worker
    after = _settle(state._replace(workers=tuple(workers)))
    return Step(f"w{w}", f"receives {what}", after, _believers(after))


def _answered(worker: Worker, msg: Msg, config: Config) -> Worker:
    ok = msg.answer == Answer.OK
    lifetime = config.ttl - config.effective_margin
    start = 0 if Mutation.DEADLINE_FROM_RECEIVE in config.mutations else msg.send
    idle = Worker(IDLE, 0, 0, False, (), worker.lag_left, NO_READ)
    if msg.kind == CLAIM:
        if ok:
            return Worker(HOLDING, msg.generation, start + lifetime, False, (),
                          worker.lag_left, NO_READ)
        if msg.answer == Answer.COMPLETED:
            return idle._replace(phase=DONE)
        return idle
    if msg.kind == RENEW and ok:
        moved = start + lifetime
        if msg.send < worker.deadline and moved > worker.deadline:
            return worker._replace(pending=(), deadline=moved)
        return worker._replace(pending=())
    if msg.kind == COMPLETE and ok:
        return idle._replace(phase=DONE)
    return idle


def _at_destination(state: State, config: Config, msg: Msg, what: str) -> Step:
    dest, g = state.dest, msg.generation
    fenced = Mutation.NO_FENCE not in config.mutations
    if fenced and g < dest.highest:
        return Step("dest", f"receives {what}: FenceRejected", state, "")
    if msg.type == EFFECT and g in dest.applied:
        return Step("dest", f"receives {what}: DUPLICATE", state, "")
    violation = ""
    if dest.applied and g < dest.applied[-1]:
        violation = f"the destination accepted token {g} after token {dest.applied[-1]}"
    applied = tuple(sorted({*dest.applied, g}))
    after = dest._replace(highest=max(dest.highest, g), applied=applied)
    if msg.type == WRITE:
        after = after._replace(value=msg.value, acked=after.acked | (1 << msg.worker))
        lost = after.acked & ~after.value
        if lost and not violation:
            violation = f"an acknowledged update was lost: {_set(lost)} is not in the set"
    return Step("dest", f"receives {what}: ACCEPTED", state._replace(dest=after), violation)
