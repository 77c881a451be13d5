"""Metrics after a takeover: counters and the renewal-headroom histogram."""

from __future__ import annotations

from pathlib import Path

import pytest

from consensus_lease import FenceRejected, LeaseLost, open_store
from consensus_lease.fencing import SqliteFence
from consensus_lease.testing.conformance import poll_until

prometheus_client = pytest.importorskip("prometheus_client")  # the [metrics] extra
from consensus_lease.metrics import PrometheusObserver  # noqa: E402


def test_takeover_shows_in_metrics(tmp_path: Path) -> None:
    registry = prometheus_client.CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    fence = SqliteFence(str(tmp_path / "dest.db"), observer=observer)
    with open_store(f"sqlite:///{tmp_path}/l.db", observer=observer) as store:
        a = store.session("A", ttl_s=0.5, keepalive=False)
        b = store.session("B", ttl_s=10)
        old = a.claim("job")
        assert old is not None
        fence.apply("job", old.generation, "step-1")
        new = poll_until(lambda: b.claim("job"), 10)
        fence.apply("job", new.generation, "step-1")
        with pytest.raises(FenceRejected):
            fence.apply("job", old.generation, "step-2")
        with pytest.raises(LeaseLost):
            old.complete(b"stale")
        b.keepalive()
        new.complete(b"ok")
        a.close()
        b.close()

    # Scrape the exposition text, as Prometheus would.
    from prometheus_client.parser import text_string_to_metric_families

    scraped = prometheus_client.generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scraped)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("consensus_lease_claims_total", store="sqlite") == 2
    assert value("consensus_lease_completions_total", store="sqlite") == 1
    assert value("consensus_lease_stale_rejections_total", store="sqlite", by="store") == 1
    assert value("consensus_lease_stale_rejections_total", store="sqlite-fence", by="fence") == 1
    assert value("consensus_lease_losses_total", store="sqlite", scope="lease") >= 1
    assert value("consensus_lease_renewal_headroom_seconds_count", store="sqlite") >= 1
    assert value("consensus_lease_renewal_headroom_seconds_sum", store="sqlite") > 0


def test_counters_are_exported_at_zero_before_their_first_event(tmp_path: Path) -> None:
    registry = prometheus_client.CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    SqliteFence(str(tmp_path / "dest.db"), observer=observer)
    with open_store(f"sqlite:///{tmp_path}/l.db", observer=observer):
        scraped = prometheus_client.generate_latest(registry).decode()
    for series in (
        'consensus_lease_claims_total{store="sqlite"} 0.0',
        'consensus_lease_completions_total{store="sqlite"} 0.0',
        'consensus_lease_losses_total{scope="lease",store="sqlite"} 0.0',
        'consensus_lease_losses_total{scope="session",store="sqlite"} 0.0',
        'consensus_lease_stale_rejections_total{by="store",store="sqlite"} 0.0',
        'consensus_lease_stale_rejections_total{by="fence",store="sqlite-fence"} 0.0',
        'consensus_lease_early_revocations_total{store="sqlite"} 0.0',
        'consensus_lease_callback_failures_total{registration="Lease.on_lost",store="sqlite"} 0.0',
    ):
        assert series in scraped, series


def test_wal_size_is_a_gauge_per_store_file() -> None:
    registry = prometheus_client.CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    observer.wal_measured("sqlite", "/a.db", 40 * 2**20, True)
    observer.wal_measured("sqlite", "/b.db", 4096, False)
    observer.wal_measured("sqlite", "/a.db", 3 * 2**20, False)  # the reader ended

    def value(name: str, path: str) -> float | None:
        return registry.get_sample_value(name, {"store": "sqlite", "path": path})

    assert value("consensus_lease_wal_bytes", "/a.db") == 3 * 2**20
    assert value("consensus_lease_wal_bytes", "/b.db") == 4096
    assert value("consensus_lease_wal_checkpoint_blocked", "/a.db") == 0
    observer.wal_measured("sqlite", "/b.db", 20 * 2**20, True)
    assert value("consensus_lease_wal_checkpoint_blocked", "/b.db") == 1


def test_skipped_deliveries_are_counted_by_reason() -> None:
    registry = prometheus_client.CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    observer.delivery_skipped("sqlite", "celery:1", "held")
    observer.delivery_skipped("sqlite", "celery:1", "completed")
    observer.delivery_skipped("sqlite", "celery:2", "held")
    labels = {"store": "sqlite", "reason": "held"}
    assert registry.get_sample_value("consensus_lease_skipped_deliveries_total", labels) == 2
