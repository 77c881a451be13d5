"""The lease protocol, model-checked: an explicit-state model and an exhaustive checker.

:mod:`.store` holds the store's rules as pure functions, :mod:`.protocol` the workers,
the network and the fenced destination as a transition system, :mod:`.checker` the
breadth-first search with its invariants, and :mod:`.mutations` the broken variants the
checker must catch. ``consensus-lease model-check`` runs it (docs/model.md).
"""

from __future__ import annotations

from .checker import CheckResult, canonical, check, format_timeline
from .protocol import Config, State, Step, initial, successors
from .store import Answer, Mutation, Record

__all__ = [
    "Answer",
    "CheckResult",
    "Config",
    "Mutation",
    "Record",
    "State",
    "Step",
    "canonical",
    "check",
    "format_timeline",
    "initial",
    "successors",
]
