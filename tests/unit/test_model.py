"""The protocol model (consensus_lease.model): the exhaustive check finds no violation at
the CI bound, and finds every mutation with its shortest counterexample (docs/model.md
gives the deeper bound, ``consensus-lease model-check``). The configurations the mutations
are checked in are those of the CI bound, or fewer faults of them: without the mutation
they have no violation to that bound."""

from __future__ import annotations

import itertools

import pytest

from consensus_lease.model import Config, Mutation, canonical, check, format_timeline
from consensus_lease.model.command import CI
from consensus_lease.model.mutations import CASES, run_case
from consensus_lease.model.protocol import HOLDING, initial


@pytest.mark.parametrize(("name", "config", "depth"), CI, ids=[c[0] for c in CI])
def test_no_violation_up_to_the_ci_bound(name: str, config: Config, depth: int) -> None:
    result = check(config, depth)
    assert result.trace == (), format_timeline(result.trace)
    assert result.depth == depth and not result.exhausted
    assert result.states > 10_000


def test_every_mutation_has_a_case() -> None:
    assert sorted(c.mutation.value for c in CASES) == sorted(m.value for m in Mutation)


@pytest.mark.parametrize("case", CASES, ids=[c.mutation.value for c in CASES])
def test_every_mutation_is_caught_with_its_shortest_trace(case: object) -> None:
    from consensus_lease.model.mutations import MutationCase

    assert isinstance(case, MutationCase)
    result = run_case(case)
    assert case.breaks in result.violation, format_timeline(result.trace)
    assert len(result.trace) == case.length, format_timeline(result.trace)


def test_counterexample_is_a_timeline_from_the_initial_state() -> None:
    case = next(c for c in CASES if c.mutation is Mutation.DEADLINE_FROM_RECEIVE)
    text = format_timeline(run_case(case).trace)
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["1", "0", "w0", "sends"]
    assert lines[-1].startswith("VIOLATION: w0 sent an effect before its local deadline")
    assert sum(" tick " in line for line in lines) == 3  # the answer delayed past the TTL


def test_symmetric_states_are_one_state() -> None:
    config = Config(workers=3)
    state = initial(config)
    w = state.workers[0]
    holding = w._replace(phase=HOLDING, generation=1, deadline=2)
    perms = list(itertools.permutations(range(3)))
    variants = {
        canonical(state._replace(workers=tuple(holding if i == k else w for i in range(3)),
                                 record=state.record._replace(owner=k, generation=1,
                                                              lease_until=3)), perms)
        for k in range(3)
    }
    assert len(variants) == 1
