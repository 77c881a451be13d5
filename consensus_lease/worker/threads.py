"""Running a worker's slots as threads of this process, and stopping them gracefully."""

from __future__ import annotations

import logging
import threading
import time

from ..store import LeaseStore
from .config import WorkerConfig
from .control import StopControl
from .handler import Handler, HandlerCall
from .slot import Slot
from .stats import WorkerStats

__all__ = ["run_threads"]

log = logging.getLogger("consensus_lease.worker")

IDLE_POLL_S = 0.2
"""How often the runner looks whether every slot has ended by itself (they end by
themselves only after crashing; a stop request wakes it at once)."""


def run_threads(store: LeaseStore, config: WorkerConfig, handler: Handler,
                control: StopControl, prefix: str = "") -> WorkerStats:
    """Run ``config.concurrency`` slots on ``store`` until ``control`` says stop (or every
    slot ended), then give jobs in flight ``config.grace_s`` seconds (less if hurried) to
    finish, then release what is still held and return the summed counts.

    Slot threads are daemon threads: one still running a handler after the grace period
    is left behind (its lease released, its session closed) and does not keep the
    process alive.
    """
    slots = [Slot(f"{prefix}{i}", store, config, HandlerCall(handler), control)
             for i in range(config.concurrency)]
    threads = [threading.Thread(target=s.run, name=f"consensus-lease-worker-{s.name}",
                                daemon=True) for s in slots]
    log.info("worker started", extra={"queue": config.queue, "slots": len(slots),
                                      "ttl_s": config.ttl_s, "until_empty": config.until_empty,
                                      "fused_claim": config.fused_claim,
                                      "prefetch": config.prefetch,
                                      "complete_batch": config.complete_batch})
    for thread in threads:
        thread.start()
    while not control.wait(IDLE_POLL_S):
        if not any(t.is_alive() for t in threads):
            break
    if control.stopping:
        log.info("stopping: no new claims; waiting up to %.1f s for jobs in flight",
                 config.grace_s, extra={"reason": control.reason})
    give_up = (control.requested_at or time.monotonic()) + config.grace_s
    for thread in threads:
        while thread.is_alive() and not control.hurried:
            left = give_up - time.monotonic()
            if left <= 0:
                break
            thread.join(min(left, IDLE_POLL_S))
    stats = WorkerStats(stopped_by=control.reason)
    for slot, thread in zip(slots, threads, strict=True):
        if thread.is_alive():
            slot.abandon()
        stats.add(slot.stats)
    log.info("worker stopped", extra={"summary": stats.summary()})
    return stats
