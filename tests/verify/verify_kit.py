"""Helpers of the verifier's run tests."""

from __future__ import annotations

from consensus_lease.verify.runner import VerifyResult


def explain(result: VerifyResult) -> str:
    """A run's figures, for an assertion's message."""
    r = result.report
    return (f"violations={dict(r.violations)} counts={dict(r.counts)} faults={dict(r.faults)} "
            f"examples={r.examples[:5]} crashes={result.worker_crashes} "
            f"inconclusive={result.inconclusive} notes={result.notes} "
            f"history={result.history_path}")
