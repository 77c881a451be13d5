"""The checker can fail: each protocol mutation, with the invariant it must break.

Each :class:`MutationCase` is one :class:`~.store.Mutation` switched on in a
configuration where the checker finds its counterexample; ``length`` is the number of
steps of the shortest one (breadth-first), which the tests assert and docs/model.md
shows. The two whose counterexample needs the longest trace run with fewer faults, to
keep the test suite fast: no-fence without message loss and duplication (``LEAN``: the
same shortest trace, a fifth of the states), write-only-fenced also without release
and fail (``LEANER``: one step longer than with them, 14, and half the states).
"""

from __future__ import annotations

from dataclasses import dataclass

from .checker import CheckResult, check
from .protocol import Config
from .store import Mutation

__all__ = ["CASES", "FULL", "LEAN", "LEANER", "MutationCase", "run_case"]

FULL = Config()
"""2 workers, TTL 3, margin 1, drift 1, loss, duplication, release and fail."""
LEAN = Config(loss=False, duplication=False)
"""As :data:`FULL` without message loss and duplication."""
LEANER = Config(loss=False, duplication=False, release_fail=False)
"""As :data:`LEAN`, and holders only complete (a lease ends by expiry otherwise)."""


@dataclass(frozen=True)
class MutationCase:
    """A mutation, the configuration it is checked in, the invariant it breaks (a part
    of the violation's text) and the length of its shortest counterexample."""

    mutation: Mutation
    base: Config
    breaks: str
    length: int

    @property
    def config(self) -> Config:
        return self.base.with_mutation(self.mutation)


CASES: tuple[MutationCase, ...] = (
    MutationCase(Mutation.RENEW_WITHOUT_GENERATION, FULL, "stale renew", 9),
    MutationCase(Mutation.COMPLETE_WITHOUT_GENERATION, FULL, "accepted a stale", 7),
    MutationCase(Mutation.DEADLINE_FROM_RECEIVE, FULL, "before its local deadline", 7),
    MutationCase(Mutation.CLAIM_IGNORES_EXPIRY, FULL, "before its local deadline", 5),
    MutationCase(Mutation.CLAIM_IGNORES_COMPLETION, FULL, "completed job was claimed", 7),
    MutationCase(Mutation.NO_GENERATION_BUMP, FULL, "generation did not increase", 6),
    MutationCase(Mutation.NO_FENCE, LEAN, "accepted token", 12),
    MutationCase(Mutation.MARGIN_BELOW_DRIFT, FULL, "before its local deadline", 7),
    MutationCase(Mutation.WRITE_ONLY_FENCED, LEANER, "acknowledged update was lost", 15),
)
"""Every :class:`~.store.Mutation`, once."""


def run_case(case: MutationCase, max_depth: int = 16) -> CheckResult:
    """Check ``case.config`` up to ``max_depth`` steps (stops at the first violation)."""
    return check(case.config, max_depth)
