"""Prometheus metrics for leases (``pip install consensus_lease[metrics]``).

::

    from prometheus_client import start_http_server
    from consensus_lease import open_store
    from consensus_lease.metrics import PrometheusObserver

    store = open_store(url, observer=PrometheusObserver())
    start_http_server(9100, addr="127.0.0.1")

===========================================  ===========  ==================================
metric                                       type         labels
===========================================  ===========  ==================================
consensus_lease_claims_total                 counter      store
consensus_lease_completions_total            counter      store
consensus_lease_losses_total                 counter      store, scope (lease / session)
consensus_lease_stale_rejections_total       counter      store, by (store / fence)
consensus_lease_early_revocations_total      counter      store (sessions ended before TTL)
consensus_lease_skipped_deliveries_total     counter      store, reason (completed / held /
                                                          failed: copies not run, Celery)
consensus_lease_renewal_latency_seconds      histogram    store
consensus_lease_renewal_headroom_seconds     histogram    store
consensus_lease_wal_bytes                    gauge        store, path (SQLite: the -wal file)
consensus_lease_wal_checkpoint_blocked       gauge        store, path (1: a reader blocks)
===========================================  ===========  ==================================

Every counter's series of a store (each label value listed; a fence's stale rejections)
is exported at 0 from the moment the store (or the fence) is made with the observer, not
only after its first event.
"""

from __future__ import annotations

from typing import Any

from ._extras import install_hint, missing_dependency
from .observe import Observer

__all__ = ["PrometheusObserver"]

_HEADROOM_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0)
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class PrometheusObserver(Observer):
    """Counts lease events into prometheus_client metrics.

    Args:
        registry: a ``prometheus_client.CollectorRegistry`` (default: the global one).
        namespace: metric name prefix.

    Raises:
        ImportError: prometheus_client is not installed (the message names the
            ``metrics`` extra).
    """

    def __init__(self, registry: Any = None, namespace: str = "consensus_lease") -> None:
        try:
            from prometheus_client import REGISTRY, Counter, Gauge, Histogram
        except ModuleNotFoundError as exc:
            if missing_dependency(exc) != "prometheus_client":
                raise
            raise ImportError(
                f"PrometheusObserver needs prometheus_client: {install_hint('metrics')}"
            ) from exc

        reg = REGISTRY if registry is None else registry
        self.claims = Counter(f"{namespace}_claims", "Successful claims", ["store"],
                              registry=reg)
        self.completions = Counter(f"{namespace}_completions", "Recorded completions",
                                   ["store"], registry=reg)
        self.losses = Counter(f"{namespace}_losses", "Leases or sessions lost",
                              ["store", "scope"], registry=reg)
        self.stale = Counter(f"{namespace}_stale_rejections",
                             "Stale operations rejected by the store or a fence",
                             ["store", "by"], registry=reg)
        self.callback_failures = Counter(
            f"{namespace}_callback_failures", "User callbacks (on_lost) that raised",
            ["store", "registration"], registry=reg)
        self.early_revocations = Counter(
            f"{namespace}_early_revocations",
            "Sessions the store ended before the TTL its last renewal granted",
            ["store"], registry=reg)
        self.skipped = Counter(
            f"{namespace}_skipped_deliveries",
            "Delivered copies of a job not run (completed, held elsewhere, failed)",
            ["store", "reason"], registry=reg)
        self.renewal_latency = Histogram(
            f"{namespace}_renewal_latency_seconds", "Send-to-answer time of renewals",
            ["store"], buckets=_LATENCY_BUCKETS, registry=reg)
        self.renewal_headroom = Histogram(
            f"{namespace}_renewal_headroom_seconds",
            "Time left before the local deadline when a renewal succeeded",
            ["store"], buckets=_HEADROOM_BUCKETS, registry=reg)
        self.wal_bytes = Gauge(f"{namespace}_wal_bytes",
                               "Size of the store file's write-ahead log, bytes",
                               ["store", "path"], registry=reg)
        self.wal_blocked = Gauge(
            f"{namespace}_wal_checkpoint_blocked",
            "1 while checkpoints cannot bring the write-ahead log under its bound",
            ["store", "path"], registry=reg)

    def attached(self, store: str, kind: str = "store") -> None:
        """Every counter's series of ``store`` exported at 0 from the start (Prometheus
        convention: a series that appears only at its first event breaks ``rate()`` and
        alerts on ``increase()``); a fence's one series, its stale rejections."""
        if kind == "fence":
            self.stale.labels(store, "fence")
            return
        self.claims.labels(store)
        self.completions.labels(store)
        for scope in ("lease", "session"):
            self.losses.labels(store, scope)
        self.stale.labels(store, "store")
        self.early_revocations.labels(store)
        for registration in ("Session.on_lost", "Lease.on_lost", "AsyncSession.on_lost"):
            self.callback_failures.labels(store, registration)

    def claimed(self, store: str, job_id: str, generation: int, owner: str) -> None:
        self.claims.labels(store).inc()

    def completed(self, store: str, job_id: str, generation: int, owner: str) -> None:
        self.completions.labels(store).inc()

    def renewed(self, store: str, latency_s: float, headroom_s: float) -> None:
        self.renewal_latency.labels(store).observe(latency_s)
        self.renewal_headroom.labels(store).observe(headroom_s)

    def lost(self, store: str, job_id: str | None, generation: int | None, reason: str) -> None:
        self.losses.labels(store, "session" if job_id is None else "lease").inc()

    def stale_rejected(self, store: str, by: str, job_id: str, generation: int) -> None:
        self.stale.labels(store, by).inc()

    def early_revocation(self, store: str, session_id: str, early_by_s: float) -> None:
        self.early_revocations.labels(store).inc()

    def delivery_skipped(self, store: str, job_id: str, reason: str) -> None:
        self.skipped.labels(store, reason).inc()

    def wal_measured(self, store: str, path: str, wal_bytes: int, blocked: bool) -> None:
        self.wal_bytes.labels(store, path).set(wal_bytes)
        self.wal_blocked.labels(store, path).set(1 if blocked else 0)

    def callback_failed(self, store: str, registration: str) -> None:
        self.callback_failures.labels(store, registration).inc()
