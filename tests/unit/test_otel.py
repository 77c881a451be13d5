"""OpenTelemetry: the documented spans and metric points, read back with the SDK's
in-memory span exporter and metric reader (consensus_lease/otel.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from consensus_lease import LeaseLost, open_store
from consensus_lease.observe import default_observer
from consensus_lease.testing.conformance import poll_until

pytest.importorskip("opentelemetry.sdk")  # the [otel] extra's API + the dev extra's SDK
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

from consensus_lease.otel import OTelObserver, instrument, uninstrument


class Telemetry:
    def __init__(self) -> None:
        self.spans_out = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans_out))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def observer(self, **kwargs: Any) -> OTelObserver:
        return OTelObserver(tracer_provider=self.tracer_provider,
                            meter_provider=self.meter_provider, **kwargs)

    def spans(self, name: str) -> list[Any]:
        return [s for s in self.spans_out.get_finished_spans() if s.name == name]

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        data = self.reader.get_metrics_data()
        out = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        out += [(dict(p.attributes or {}), p) for p in metric.data.data_points]
        return out

    def value(self, name: str, **attributes: str) -> Any:
        """A counter's (or up-down counter's) value for exactly these attributes."""
        matches = [p.value for a, p in self.points(name) if a == attributes]
        assert len(matches) <= 1
        return matches[0] if matches else 0


@pytest.fixture
def telemetry() -> Telemetry:
    return Telemetry()


def test_claim_then_complete(tmp_path: Path, telemetry: Telemetry) -> None:
    observer = telemetry.observer()
    tracer = telemetry.tracer_provider.get_tracer("app")
    with open_store(f"sqlite:///{tmp_path}/l.db", observer=observer) as store:
        with store.session("A", ttl_s=10) as session:
            with tracer.start_as_current_span("work") as work:
                lease = session.claim("job-1")
                assert lease is not None
                assert telemetry.value("consensus_lease.leases.held", store="sqlite") == 1
                session.keepalive()
                lease.complete(b"ok")
            other = store.session("B", ttl_s=10)
            theirs = other.claim("job-2")  # outside any span: no span (root_spans=False)
            assert theirs is not None
            with tracer.start_as_current_span("poll"):
                assert session.claim("job-2") is None  # held by B: outcome held
            theirs.release()
            other.close()

    (claim, held) = telemetry.spans("consensus_lease.claim")
    assert not telemetry.spans("consensus_lease.release")  # B's, outside any span
    assert dict(claim.attributes) == {
        "consensus_lease.store": "sqlite", "consensus_lease.outcome": "ok",
        "consensus_lease.job_id": "job-1", "consensus_lease.generation": lease.generation,
    }
    assert claim.parent is not None and claim.parent.span_id == work.get_span_context().span_id
    assert claim.end_time >= claim.start_time
    assert held.attributes["consensus_lease.outcome"] == "held"
    assert held.status.status_code is not StatusCode.ERROR
    (complete,) = telemetry.spans("consensus_lease.complete")
    assert complete.attributes["consensus_lease.generation"] == lease.generation
    assert complete.attributes["consensus_lease.outcome"] == "ok"
    assert complete.parent is not None
    assert complete.start_time >= claim.end_time
    renews = telemetry.spans("consensus_lease.renew")
    assert renews and all(r.attributes["consensus_lease.headroom_s"] > 0 for r in renews)
    assert not telemetry.spans("consensus_lease.loss")

    assert telemetry.value("consensus_lease.leases.held", store="sqlite") == 0  # B released
    # Histogram points: their count is the number of operations.
    ok = [p for a, p in telemetry.points("consensus_lease.claim.duration")
          if a == {"store": "sqlite", "op": "claim", "outcome": "ok"}]
    assert ok[0].count == 2 and ok[0].sum > 0  # metrics with or without a span
    held_out = [p for a, p in telemetry.points("consensus_lease.claim.duration")
                if a == {"store": "sqlite", "op": "claim", "outcome": "held"}]
    assert held_out[0].count == 1
    ops = {tuple(sorted(a.items())): p.value for a, p in telemetry.points(
        "consensus_lease.operations")}

    def count(op: str, outcome: str) -> Any:
        return ops.get(tuple(sorted({"store": "sqlite", "op": op, "outcome": outcome}.items())))

    assert count("claim", "ok") == 2 and count("claim", "held") == 1
    assert count("complete", "ok") == 1 and count("release", "ok") == 1
    headroom = [p for a, p in telemetry.points("consensus_lease.renewal.headroom")]
    assert headroom[0].count >= 1 and headroom[0].sum > 0
    assert telemetry.value("consensus_lease.losses", store="sqlite", scope="lease") == 0


def test_closing_a_session_hands_back_and_an_empty_queue_is_not_held(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    """A worker closing its session with a lease held hands the job back: no loss span,
    no loss counted, held back to 0. ``claim_next`` on an empty queue is ``empty``, not
    ``held``, and not an error."""
    observer = telemetry.observer(root_spans=True)
    with open_store(f"sqlite:///{tmp_path}/c.db", observer=observer) as store:
        a = store.session("A", ttl_s=10)
        assert a.claim("job") is not None
        assert a.claim_next("nothing-queued") is None
        assert telemetry.value("consensus_lease.leases.held", store="sqlite") == 1
        a.close()
    assert not telemetry.spans("consensus_lease.loss")
    assert telemetry.value("consensus_lease.losses", store="sqlite", scope="lease") in (0, None)
    assert telemetry.value("consensus_lease.leases.held", store="sqlite") == 0
    (empty,) = telemetry.spans("consensus_lease.claim_next")
    assert empty.attributes["consensus_lease.outcome"] == "empty"
    assert empty.status.status_code is not StatusCode.ERROR


def test_the_claim_of_a_fused_completion_counts_as_a_claim_next(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    """``complete_and_claim_next`` replaces a ``claim_next``: its claim is reported as
    one (``ok`` with the next job, ``empty`` without), so claim rates stay right."""
    observer = telemetry.observer(root_spans=True)
    with open_store(f"sqlite:///{tmp_path}/f.db", observer=observer) as store:
        store.enqueue_many("q", ["a", "b"])
        with store.session("A", ttl_s=10) as a:
            first = a.claim_next("q")
            assert first is not None
            _, second = first.complete_and_claim_next(b"done")
            assert second is not None and second.job_id != first.job_id
            _, none = second.complete_and_claim_next(b"done")
            assert none is None
    outcomes = [s.attributes["consensus_lease.outcome"]
                for s in telemetry.spans("consensus_lease.claim_next")]
    assert outcomes == ["ok", "ok", "empty"], outcomes
    assert len(telemetry.spans("consensus_lease.complete")) == 2


def test_loss_and_stale_rejection(tmp_path: Path, telemetry: Telemetry) -> None:
    observer = telemetry.observer(renew_spans=False, root_spans=True)
    with open_store(f"sqlite:///{tmp_path}/l.db", observer=observer) as store:
        a = store.session("A", ttl_s=0.5, keepalive=False)
        b = store.session("B", ttl_s=10)
        old = a.claim("job")
        assert old is not None
        new = poll_until(lambda: b.claim("job"), 10)  # A's session expired in the store
        with pytest.raises(LeaseLost):
            old.complete(b"stale")
        new.complete(b"ok")
        a.close()
        b.close()

    (failed,) = [s for s in telemetry.spans("consensus_lease.complete")
                 if s.attributes["consensus_lease.generation"] == old.generation]
    assert failed.attributes["consensus_lease.outcome"] in ("stale", "lost")
    assert failed.status.status_code is StatusCode.ERROR
    losses = [s for s in telemetry.spans("consensus_lease.loss")
              if s.attributes.get("consensus_lease.job_id") == "job"]
    assert len(losses) == 1
    (loss,) = losses
    assert loss.attributes["consensus_lease.generation"] == old.generation
    assert loss.attributes["consensus_lease.scope"] == "lease"
    assert loss.status.status_code is StatusCode.ERROR
    assert not telemetry.spans("consensus_lease.renew")  # renew_spans=False
    assert telemetry.value("consensus_lease.losses", store="sqlite", scope="lease") == 1
    outcome = failed.attributes["consensus_lease.outcome"]
    assert telemetry.value("consensus_lease.operations", store="sqlite", op="complete",
                           outcome=outcome) == 1
    stale = telemetry.value("consensus_lease.stale_rejections", store="sqlite", by="store")
    assert stale == (1 if failed.attributes["consensus_lease.outcome"] == "stale" else 0)
    assert telemetry.value("consensus_lease.leases.held", store="sqlite") == 0


def test_instrument_is_the_default_of_open_store(tmp_path: Path, telemetry: Telemetry) -> None:
    observer = instrument(tracer_provider=telemetry.tracer_provider,
                          meter_provider=telemetry.meter_provider, root_spans=True)
    try:
        assert default_observer() is observer
        with open_store(f"sqlite:///{tmp_path}/l.db") as store:
            assert store.observer is observer
            with store.session("A", ttl_s=10) as session:
                lease = session.claim("job")
                assert lease is not None
                lease.release()
    finally:
        uninstrument()
    assert default_observer() is None
    with open_store(f"sqlite:///{tmp_path}/l.db") as store:
        assert store.observer is None
    (release,) = telemetry.spans("consensus_lease.release")
    assert release.attributes["consensus_lease.job_id"] == "job"
    assert telemetry.value("consensus_lease.leases.held", store="sqlite") == 0


def test_docs_example(tmp_path: Path) -> None:
    """The example on docs/integrations/opentelemetry.md (included from here)."""
    # --8<-- [start:example]

    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from consensus_lease import open_store
    from consensus_lease.otel import OTelObserver

    spans = InMemorySpanExporter()         # in production: an OTLP exporter, batched
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    metrics = InMemoryMetricReader()       # in production: a PeriodicExportingMetricReader
    observer = OTelObserver(tracer_provider=tracer_provider,
                            meter_provider=MeterProvider(metric_readers=[metrics]))
    tracer = trace.get_tracer("shop", tracer_provider=tracer_provider)

    directory = tempfile.mkdtemp()         # the example runs as it is, outside pytest
    with open_store(f"sqlite:///{directory}/leases.db", observer=observer) as store:
        with store.session(ttl_s=10) as session, tracer.start_as_current_span("charge"):
            lease = session.claim("order-42")
            assert lease is not None
            ...                            # the work, fenced with lease.generation
            lease.complete(b"charged")

    names = [span.name for span in spans.get_finished_spans()]
    assert names == ["consensus_lease.claim", "consensus_lease.complete", "charge"]
    # --8<-- [end:example]
    data = metrics.get_metrics_data()
    assert data is not None
    found = {m.name for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics}
    assert {"consensus_lease.claim.duration", "consensus_lease.operations",
            "consensus_lease.leases.held"} <= found
