"""What a run measures (sizes, TTLs) and what it runs against (targets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BACKENDS", "FULL", "QUICK", "SMOKE", "Sizes", "Target"]

BACKENDS = ("sqlite", "etcd", "zookeeper", "postgresql")
"""Backend names accepted by ``--backends``, in the order they run."""

ALIASES = {"zk": "zookeeper", "sqlite3": "sqlite", "etcd3": "etcd", "pg": "postgresql",
           "postgres": "postgresql"}


@dataclass(frozen=True)
class Sizes:
    """How much each workload does. Durations in seconds; TTLs are requested TTLs."""

    quick: bool
    w1_workers: tuple[int, ...]
    w1_duration_s: float
    """Measured seconds of one W1 run (``w1_windows`` windows), after ``w1_warmup_s``."""
    w1_repeats: int
    w1_warmup: int
    """Untimed cycles of each worker right after opening its client."""
    w2_samples: int
    w3_sizes: tuple[int, ...]
    w3_window_s: float
    w3_ttl_s: float
    w4_trials: int
    w4_ttl_s: float
    w5_rounds: int
    """Most measured W5 rounds (after one untimed warm-up round)."""
    w5_batch: int
    w6_duration_s: float
    """Measured seconds per peer and repeat (``w6_windows`` windows)."""
    w6_repeats: int
    session_ttl_s: float = 10.0
    """TTL of the sessions of W1, W2, W5, W6, W8 (long enough never to matter)."""
    w8_tasks: int = 200
    """asyncio tasks of W8's one process."""
    w8_processes: int = 8
    """Sync worker processes W8 compares them with."""
    w8_duration_s: float = 5.0
    """Measured seconds per side and repeat (``w8_windows`` windows)."""
    w8_repeats: int = 3
    w9_processes: int = 10
    """Worker processes of W9's spread phase."""
    w9_sessions_per_process: int = 1_000
    w9_single_sessions: int = 2_000
    """Sessions of W9's one-process phase."""
    w9_ttl_s: float = 10.0
    w9_hold_s: float = 60.0
    """Seconds each W9 phase holds its sessions."""
    w9_hogs: int = 2
    """Busy-loop processes beside W9's clients."""
    w10_jobs: int = 10_000
    """No-op jobs W10 enqueues and drains per side and round."""
    w10_rounds: int = 3
    """W10 rounds: every side once per round, in turn (the order reversed every other
    round)."""
    w10_wake_samples: int = 50
    """Jobs enqueued one at a time to an idle worker (W10's wake-up latency)."""
    w10_wake_gap_s: float = 0.1
    """Seconds between two of those enqueues (the worker goes idle)."""
    w7_depths: tuple[int, ...] = (1_000, 10_000, 100_000)
    """Open jobs in W7's queue at which claim_next and queue_stats are timed."""
    w7_deep_depths: tuple[int, ...] = (1_000_000,)
    """Further W7 depths, on ``w7_deep_backends`` only."""
    w7_deep_backends: tuple[str, ...] = ("sqlite", "etcd")
    w7_samples: int = 500
    """claim_next+complete cycles timed at each W7 depth (fewer if ``w7_step_budget_s``
    runs out)."""
    w7_stats_samples: int = 10
    """queue_stats calls timed at each W7 depth."""
    w7_step_budget_s: float = 120.0
    """Most seconds of cycles (and, separately, of queue_stats calls) at one depth."""
    w7_fill_budget_s: float = 1200.0
    """Most seconds spent filling W7's queue with enqueue_many, over all depths."""
    w7_rate_jobs: int = 1_000
    """Single enqueues of W7's rate measure; its enqueue_many carries 10 x as many."""
    w7_rate_budget_s: float = 15.0
    """Most seconds of single enqueues in W7's rate measure."""
    w7_payload_bytes: int = 64
    w7_cleanup_budget_s: float = 600.0
    """Most seconds deleting W7's keys / znodes afterwards."""
    w1_windows: int = 10
    """Equal measured windows of a W1 run: its rate is their median, with their spread."""
    w1_warmup_s: float = 1.0
    """Seconds every worker cycles, all at once, before the first measured window of a
    W1 or W8 run (after the ``w1_warmup`` cycles): not measured."""
    w1_count_cycles: int = 50
    """Cycles whose store requests are counted (on a client of their own) per side."""
    w6_windows: int = 8
    w6_warmup_s: float = 1.0
    """Seconds of unmeasured cycles of each peer before its windows."""
    w8_windows: int = 5
    w5_budget_s: float = 120.0
    """Most seconds of measured W5 rounds: no round starts after it (at least one runs)."""

    @property
    def pool_size(self) -> int:
        return max(*self.w1_workers, self.w8_processes)


QUICK = Sizes(
    quick=True,
    w1_workers=(1, 8),
    w1_duration_s=2.5,
    w1_repeats=2,
    w1_warmup=10,
    w1_windows=5,
    w1_warmup_s=0.5,
    w1_count_cycles=20,
    w2_samples=100,
    w3_sizes=(10, 100, 1000),
    w3_window_s=4.0,
    w3_ttl_s=5.0,
    w4_trials=3,
    w4_ttl_s=2.0,
    w5_rounds=21,
    w5_batch=128,
    w5_budget_s=30.0,
    w6_duration_s=2.0,
    w6_repeats=2,
    w6_windows=5,
    w6_warmup_s=0.3,
    w8_duration_s=2.0,
    w8_windows=4,
    w8_repeats=1,
    w7_depths=(1_000, 10_000),
    w7_deep_depths=(),
    w7_samples=100,
    w7_stats_samples=5,
    w7_step_budget_s=20.0,
    w7_fill_budget_s=90.0,
    w7_rate_jobs=300,
    w7_rate_budget_s=5.0,
    w7_cleanup_budget_s=60.0,
    w10_jobs=2_000,
    w10_rounds=2,
    w10_wake_samples=20,
)

SMOKE = Sizes(
    quick=True,
    w1_workers=(1, 2),
    w1_duration_s=0.4,
    w1_repeats=1,
    w1_warmup=3,
    w1_windows=2,
    w1_warmup_s=0.1,
    w1_count_cycles=5,
    w2_samples=10,
    w3_sizes=(10, 50),
    w3_window_s=4.0,  # at least one keepalive (every TTL/3) per window
    w3_ttl_s=5.0,
    w4_trials=1,
    w4_ttl_s=2.0,
    w5_rounds=1,
    w5_batch=16,
    w5_budget_s=10.0,
    w6_duration_s=0.4,
    w6_repeats=1,
    w6_windows=2,
    w6_warmup_s=0.1,
    w8_tasks=20,
    w8_processes=2,
    w9_processes=2,
    w9_sessions_per_process=10,
    w9_single_sessions=20,
    w9_hold_s=1.0,
    w9_hogs=1,
    w8_duration_s=0.4,
    w8_windows=2,
    w8_repeats=1,
    w7_depths=(200, 1_000),
    w7_deep_depths=(),
    w7_samples=10,
    w7_stats_samples=2,
    w7_step_budget_s=10.0,
    w7_fill_budget_s=30.0,
    w7_rate_jobs=30,
    w7_rate_budget_s=3.0,
    w7_cleanup_budget_s=30.0,
    w10_jobs=100,
    w10_rounds=1,
    w10_wake_samples=3,
    w10_wake_gap_s=0.05,
)
"""The smallest sizes, only to check that every workload runs end to end (the test
suite's bench runs): its numbers mean nothing."""

FULL = Sizes(
    quick=False,
    w1_workers=(1, 8),
    w1_duration_s=5.0,
    w1_repeats=3,
    w1_warmup=30,
    w2_samples=1000,
    w3_sizes=(10, 100, 1000, 10_000),
    w3_window_s=10.0,
    w3_ttl_s=5.0,
    w4_trials=20,
    w4_ttl_s=2.0,
    w5_rounds=41,
    w5_batch=128,
    w6_duration_s=4.0,
    w6_repeats=3,
)


@dataclass
class Target:
    """One backend to measure, and where its store is.

    Attributes:
        backend: ``sqlite``, ``etcd``, ``zookeeper`` or ``postgresql``.
        url: our store URL (with this run's own key prefix / chroot), or ``None`` when
            the backend cannot run (see ``reason``).
        raw: how the raw client and the peers reach the same store (see :mod:`.raw`).
        reason: why this backend is not measured, or ``None``.
        origin: where the store came from, for the report.
        tick_s: ZooKeeper's tick (for the takeover goal), if known.
    """

    backend: str
    url: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    origin: str = ""
    tick_s: float | None = None
    tick_source: str = ""

    @property
    def available(self) -> bool:
        return self.url is not None and self.reason is None
