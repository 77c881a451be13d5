"""What a run measures (sizes, TTLs) and what it runs against (targets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BACKENDS", "FULL", "QUICK", "Sizes", "Target"]

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
    w1_repeats: int
    w1_warmup: int
    w2_samples: int
    w3_sizes: tuple[int, ...]
    w3_window_s: float
    w3_ttl_s: float
    w4_trials: int
    w4_ttl_s: float
    w5_rounds: int
    w5_batch: int
    w6_duration_s: float
    w6_repeats: int
    session_ttl_s: float = 10.0
    """TTL of the sessions of W1, W2, W5, W6, W8 (long enough never to matter)."""
    w8_tasks: int = 200
    """asyncio tasks of W8's one process."""
    w8_processes: int = 8
    """Sync worker processes W8 compares them with."""
    w8_duration_s: float = 5.0
    w8_repeats: int = 3

    @property
    def pool_size(self) -> int:
        return max(*self.w1_workers, self.w8_processes)


QUICK = Sizes(
    quick=True,
    w1_workers=(1, 8),
    w1_duration_s=1.5,
    w1_repeats=1,
    w1_warmup=10,
    w2_samples=100,
    w3_sizes=(10, 100, 1000),
    w3_window_s=4.0,
    w3_ttl_s=5.0,
    w4_trials=3,
    w4_ttl_s=2.0,
    w5_rounds=3,
    w5_batch=128,
    w6_duration_s=1.5,
    w6_repeats=1,
    w8_duration_s=1.5,
    w8_repeats=1,
)

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
    w5_rounds=10,
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
