"""The exhaustive checker: breadth-first over every reachable state, up to a depth.

Each state is reduced before it is looked up (state hashing): tokens renumbered by rank
(only their order matters) and the workers put in a canonical order (symmetry
reduction: the workers run the same program, so a state and the one with two workers'
roles swapped behave alike). Every transition is checked against the invariants as it
is generated (:func:`.protocol.successors`); since the search is breadth-first, the first
violation found has a shortest trace. The trace is replayed from the initial state in
one frame of worker names and printed as a timeline (:func:`format_timeline`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .protocol import Config, Dest, Msg, State, Step, Worker, initial, successors

__all__ = ["CheckResult", "canonical", "check", "format_timeline"]

Progress = Callable[[int, int, int], None]
"""``progress(depth done, distinct states so far, states at that depth)``."""


@dataclass(frozen=True)
class CheckResult:
    """What a check explored, and the shortest counterexample if one exists.

    Attributes:
        config: what was explored.
        max_depth: the bound asked for (steps from the initial state).
        depth: the depth reached (< ``max_depth`` when every reachable state was seen:
            ``exhausted``).
        states: distinct reduced states seen.
        transitions: transitions generated and checked.
        seconds: wall time of the search.
        exhausted: no new state was found at ``depth``: the whole reachable state
            space (within ``Config.max_in_flight``) was explored.
        trace: the steps of a shortest counterexample (empty: no violation).
    """

    config: Config
    max_depth: int
    depth: int
    states: int
    transitions: int
    seconds: float
    exhausted: bool
    trace: tuple[Step, ...]

    @property
    def violation(self) -> str:
        """The invariant the counterexample breaks (``""``: none found)."""
        return self.trace[-1].violation if self.trace else ""


def check(config: Config, max_depth: int, progress: Progress | None = None) -> CheckResult:
    """Explore every state reachable from :func:`.protocol.initial` in at most
    ``max_depth`` steps; stop at the first violation (with a shortest trace)."""
    perms = list(itertools.permutations(range(config.workers)))
    start = time.monotonic()
    root = canonical(initial(config), perms)
    parent: dict[State, State | None] = {root: None}
    frontier = [root]
    transitions = depth = 0
    while frontier and depth < max_depth:
        found: list[State] = []
        for state in frontier:
            for step in successors(state, config):
                transitions += 1
                if step.violation:
                    trace = _replay(_path(parent, state), config, perms)
                    return CheckResult(config, max_depth, depth + 1, len(parent),
                                       transitions, time.monotonic() - start, False, trace)
                key = canonical(step.state, perms)
                if key not in parent:
                    parent[key] = state
                    found.append(key)
        depth += 1
        frontier = found
        if progress is not None:
            progress(depth, len(parent), len(found))
    return CheckResult(config, max_depth, depth, len(parent), transitions,
                       time.monotonic() - start, not frontier, ())


def _path(parent: dict[State, State | None], last: State) -> list[State]:
    path = [last]
    while (before := parent[path[-1]]) is not None:
        path.append(before)
    return path[::-1]


def _replay(path: list[State], config: Config, perms: Sequence[tuple[int, ...]]
            ) -> tuple[Step, ...]:
    """The concrete steps from the initial state through the reduced states of ``path``
    (each step's successor reduces to the next one), then the violating step."""
    state = initial(config)
    steps: list[Step] = []
    for key in path[1:]:
        step = next(s for s in successors(state, config)
                    if not s.violation and canonical(s.state, perms) == key)
        steps.append(step)
        state = step.state
    steps.append(next(s for s in successors(state, config) if s.violation))
    return tuple(steps)


# -- reduction ---------------------------------------------------------------------------


def canonical(state: State, perms: Sequence[tuple[int, ...]]) -> State:
    """``state`` with its tokens renumbered by rank and its workers in the order that
    makes the smallest tuple among ``perms`` (each maps worker ``i`` to ``perm[i]``).

    The order compares the record first, then the workers: only the permutations that
    give the holder the lowest number, then the smallest worker tuple, are built whole.
    """
    state = _rank_tokens(state)
    owner = state.record.owner
    if owner >= 0:
        perms = [p for p in perms if p[owner] == 0]
    if len(perms) > 1:
        orders = [(_permuted_workers(state.workers, p), p) for p in perms]
        least = min(order for order, _ in orders)
        perms = [p for order, p in orders if order == least]
    best: State | None = None
    for perm in perms:
        candidate = state if perm == _IDENTITY[len(perm)] else _permute(state, perm)
        if best is None or candidate < best:
            best = candidate
    assert best is not None
    return best


_IDENTITY = {n: tuple(range(n)) for n in range(1, 9)}


def _permuted_workers(workers: tuple[Worker, ...], perm: tuple[int, ...]
                      ) -> tuple[Worker, ...]:
    out: list[Worker] = list(workers)
    for i, w in enumerate(workers):
        out[perm[i]] = w if w.read <= 0 else w._replace(read=_bits(w.read, perm))
    return tuple(out)


def _tokens(state: State) -> set[int]:
    tokens = {state.record.generation, state.dest.highest, *state.dest.applied}
    tokens.update(w.generation for w in state.workers)
    tokens.update(m.generation for m in state.net)
    tokens.discard(0)
    return tokens


def _rank_tokens(state: State) -> State:
    if state.record.generation <= 1:  # the record's is the highest token: 0 or 1, dense
        return state
    tokens = sorted(_tokens(state))
    if not tokens or tokens[-1] == len(tokens):
        return state
    rank = {t: i for i, t in enumerate(tokens, 1)}
    rank[0] = 0
    rec, dest = state.record, state.dest
    return State(
        rec._replace(generation=rank[rec.generation]),
        tuple(w._replace(generation=rank[w.generation]) for w in state.workers),
        tuple(sorted(m._replace(generation=rank[m.generation]) for m in state.net)),
        Dest(rank[dest.highest], tuple(rank[t] for t in dest.applied),
             dest.value, dest.acked),
    )


def _bits(value: int, perm: tuple[int, ...]) -> int:
    if value <= 0:
        return value
    out = 0
    for i, j in enumerate(perm):
        if value >> i & 1:
            out |= 1 << j
    return out


def _permute(state: State, perm: tuple[int, ...]) -> State:
    rec, dest = state.record, state.dest
    owner = perm[rec.owner] if rec.owner >= 0 else rec.owner
    net = tuple(sorted(Msg(m.type, m.kind, perm[m.worker], m.generation, m.send, m.answer,
                           _bits(m.value, perm)) for m in state.net))
    if dest.value or dest.acked:
        dest = Dest(dest.highest, dest.applied, _bits(dest.value, perm),
                    _bits(dest.acked, perm))
    return State(rec._replace(owner=owner), _permuted_workers(state.workers, perm), net,
                 dest)


# -- the timeline --------------------------------------------------------------------------


def format_timeline(trace: Sequence[Step]) -> str:
    """A counterexample as a timeline like the demo's: step, store time, who, what, and
    the store's record after it."""
    lines = [f"{'step':>4}  {'t':>3}  {'who':<6} {'what':<66} store record after"]
    t = 0
    for n, step in enumerate(trace, 1):
        if step.actor == "clock":
            t += 1
        rec = step.state.record
        holder = "-" if rec.owner < 0 else f"w{rec.owner}"
        until = "" if rec.owner < 0 or rec.completed else f" until t={t + rec.lease_until}"
        done = " completed" if rec.completed else ""
        record = f"holder {holder} gen {rec.generation}{until}{done}"
        lines.append(f"{n:>4}  {t:>3}  {step.actor:<6} {step.action:<66} {record}")
    if trace and trace[-1].violation:
        lines.append(f"VIOLATION: {trace[-1].violation}")
    return "\n".join(lines)
