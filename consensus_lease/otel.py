"""OpenTelemetry spans and metrics for leases (``pip install consensus_lease[otel]``).

Needs only ``opentelemetry-api``; what is exported, and where, is the application's
OpenTelemetry SDK set-up (without an SDK the API's no-op providers make every call here
a no-op). One call turns it on for every store opened afterwards::

    from consensus_lease import open_store
    from consensus_lease.otel import instrument

    instrument()                       # the global tracer and meter providers
    store = open_store(url)            # observed

or per store: ``open_store(url, observer=OTelObserver())``. Without either, no
observer is set and nothing is measured (no clock read, no call).

Spans (kind ``CLIENT``) join the caller's trace: a claim made inside your own span (a
Celery task's, a request's) is its child, so the trace shows claim -> your work ->
complete. Claim, complete, release and fail spans are made only inside a recording span,
unless ``root_spans=True``: a bare worker loop then pays for metrics only (see
``benchmarks/cycle_ab.py``). Loss spans are always made, renew spans unless
``renew_spans=False`` (both are rare: a loss, one renewal per session every TTL/3). Each
span covers the store call (all its round trips): it starts at the send time and ends at the answer
(measured on the session's monotonic clock, placed on the wall clock at the answer).

=============================  ======================================================
span                           when
=============================  ======================================================
``consensus_lease.claim``      a claim attempt (``claim``; outcome ``held`` when the
                               job was held elsewhere)
``consensus_lease.claim_next`` a ``claim_next`` attempt (outcome ``empty`` when the
                               queue had nothing claimable)
``consensus_lease.complete``   a completion
``consensus_lease.release``    a release
``consensus_lease.fail``       a failed attempt recorded
``consensus_lease.renew``      a session renewal that succeeded (``renew_spans=False``
                               turns these off: one per session every TTL/3)
``consensus_lease.loss``       a lease or session was lost (zero length, status ERROR;
                               not for the leases of a session its worker closed)
=============================  ======================================================

Span attributes: ``consensus_lease.store`` (the backend's scheme), ``consensus_lease.job_id``,
``consensus_lease.generation`` (the fencing token), ``consensus_lease.outcome`` (one of
:data:`consensus_lease.observe.OUTCOMES`; ``lost`` on a loss span), and on renew spans
``consensus_lease.headroom_s``, on loss spans ``consensus_lease.scope`` (``lease`` or
``session``) and ``consensus_lease.reason``. A span whose outcome is not ``ok``, ``held``
or ``empty`` has status ERROR.

==========================================  ==============  ============================
metric                                      instrument      attributes
==========================================  ==============  ============================
``consensus_lease.leases.held``             up-down counter store (observed at collection)
``consensus_lease.operations``              counter         store, op, outcome
``consensus_lease.claim.duration``          histogram, s    store, op (claim /
                                                            claim_next), outcome
``consensus_lease.renewal.headroom``        histogram, s    store
``consensus_lease.renewal.duration``        histogram, s    store
``consensus_lease.losses``                  counter         store, scope
``consensus_lease.stale_rejections``        counter         store, by (store / fence)
``consensus_lease.early_revocations``       counter         store
``consensus_lease.deliveries.skipped``      counter         store, reason
``consensus_lease.callback_failures``       counter         store, registration
==========================================  ==============  ============================

``operations`` counts every claim, claim_next, complete, release and fail by outcome
(completions: ``op="complete", outcome="ok"``). It and ``leases.held`` are kept by this
observer and read by the SDK when a metric reader collects, and the claim latencies are
queued and handed to the SDK in batches (at collection, and every 512 claims): an SDK
record made right after a store round trip costs several times one made in a batch, and
this keeps the hot path at one list append and two dictionary updates per operation. What
a collection exports is complete up to the collection; the histogram carries no
exemplars. The latency of complete, release and fail is on their spans.

``leases.held`` goes up at each claim and down at each completion, release, recorded
failure and lease loss (a lost session loses each of its leases). The renewal headroom is
the time left before the local deadline when a renewal succeeded (see
:mod:`consensus_lease.observe`): alert on its low quantiles before leases are lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from ._extras import install_hint, missing_dependency
from .observe import Observer, set_default_observer

try:
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
except ModuleNotFoundError as _exc:  # pragma: no cover - exercised by check-wheel
    if missing_dependency(_exc) != "opentelemetry":
        raise
    raise ImportError(
        f"consensus_lease.otel needs opentelemetry-api: {install_hint('otel')}"
    ) from _exc

__all__ = ["OTelObserver", "instrument", "uninstrument"]

_SCOPE = "consensus_lease"
_PENDING_MAX = 512
"""Operation latencies queued before they are recorded without waiting for a reader."""
_OK = ("ok", "held", "empty")
_HEADROOM_BOUNDARIES = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0)
_LATENCY_BOUNDARIES = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                       1.0, 2.5)


def _version() -> str:
    from . import __version__

    return __version__


class OTelObserver(Observer):
    """Emits the spans and metrics of the module docstring.

    Args:
        tracer_provider: an ``opentelemetry.trace.TracerProvider`` (default: the global
            one, as set by the SDK's ``trace.set_tracer_provider``).
        meter_provider: an ``opentelemetry.metrics.MeterProvider`` (default: the global
            one).
        renew_spans: emit a ``consensus_lease.renew`` span per successful renewal
            (the renewal metrics are recorded either way).
        root_spans: also emit claim, complete, release and fail spans that have no
            parent (an operation made outside any recording span). Off by default: a
            worker loop then costs one histogram record per operation, and the spans
            appear wherever the application traces (a Celery task's span, a request's).

    Raises:
        ImportError: opentelemetry-api is not installed (raised by the import of this
            module; the message names the ``otel`` extra).

    Called from worker and keepalive threads; the OpenTelemetry API is thread-safe. Like
    every observer it can never break lease handling: what it raises is logged and
    dropped (:func:`consensus_lease.observe.notify`).
    """

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None,
                 renew_spans: bool = True, root_spans: bool = False) -> None:
        version = _version()
        self.tracer = _trace.get_tracer(_SCOPE, version, tracer_provider=tracer_provider)
        meter = _metrics.get_meter(_SCOPE, version, meter_provider=meter_provider)
        self.renew_spans = bool(renew_spans)
        self.root_spans = bool(root_spans)
        # Leases held: counted here (a lock and an int per event), read by the SDK only
        # when it collects: far cheaper on the claim/complete path than an up-down
        # counter's add.
        self._held: dict[str, int] = {}
        self._held_lock = threading.Lock()
        meter.create_observable_up_down_counter(
            "consensus_lease.leases.held", callbacks=[self._observe_held], unit="{lease}",
            description="Leases held now")
        # Operations (claim, complete, ...) counted the same way, by store, op and
        # outcome; the claim latency is the one histogram on the hot path, one record per
        # claim attempt, queued (a list append) and handed to the SDK in batches: when a
        # reader collects (the observable instruments' callbacks run first) or every
        # _PENDING_MAX claims. Right after a store round trip (a syscall, often a sleep)
        # one SDK record took 60-80 us here, against 10 us in a batch. The latency of
        # complete, release and fail is on their spans.
        self._ops: dict[tuple[str, str, str], int] = {}
        meter.create_observable_counter(
            "consensus_lease.operations", callbacks=[self._observe_ops], unit="{operation}",
            description="Lease operations (claim, claim_next, complete, release, fail) by "
                        "outcome")
        self._pending: list[tuple[float, dict[str, str]]] = []
        self._pending_lock = threading.Lock()
        self.claim_duration = meter.create_histogram(
            "consensus_lease.claim.duration", unit="s",
            description="Send-to-answer time of claim attempts (claim, claim_next)",
            explicit_bucket_boundaries_advisory=_LATENCY_BOUNDARIES)
        self.headroom = meter.create_histogram(
            "consensus_lease.renewal.headroom", unit="s",
            description="Time left before the local deadline when a renewal succeeded",
            explicit_bucket_boundaries_advisory=_HEADROOM_BOUNDARIES)
        self.renewal_duration = meter.create_histogram(
            "consensus_lease.renewal.duration", unit="s",
            description="Send-to-answer time of renewals",
            explicit_bucket_boundaries_advisory=_LATENCY_BOUNDARIES)
        self.losses = meter.create_counter(
            "consensus_lease.losses", unit="{loss}", description="Leases or sessions lost")
        self.stale = meter.create_counter(
            "consensus_lease.stale_rejections", unit="{operation}",
            description="Stale operations rejected by the store or a fence")
        self.early_revocations = meter.create_counter(
            "consensus_lease.early_revocations", unit="{session}",
            description="Sessions the store ended before the TTL its last renewal granted")
        self.skipped = meter.create_counter(
            "consensus_lease.deliveries.skipped", unit="{delivery}",
            description="Delivered copies of a job not run (completed, held elsewhere)")
        self.callback_failures = meter.create_counter(
            "consensus_lease.callback_failures", unit="{call}",
            description="User callbacks (on_lost) that raised")

    # -- spans -------------------------------------------------------------------------

    def _span(self, name: str, latency_s: float, attributes: dict[str, Any], ok: bool) -> None:
        end = time.time_ns()
        span = self.tracer.start_span(
            name, kind=_trace.SpanKind.CLIENT, attributes=attributes,
            start_time=end - max(0, int(latency_s * 1e9)))
        if not ok:
            span.set_status(_trace.Status(_trace.StatusCode.ERROR))
        span.end(end_time=end)

    def operation(self, store: str, op: str, job_id: str | None, generation: int | None,
                  outcome: str, latency_s: float) -> None:
        if self.root_spans or _trace.get_current_span().is_recording():
            attributes: dict[str, Any] = {"consensus_lease.store": store,
                                          "consensus_lease.outcome": outcome}
            if job_id is not None:
                attributes["consensus_lease.job_id"] = job_id
            if generation is not None:
                attributes["consensus_lease.generation"] = generation
            self._span(f"consensus_lease.{op}", latency_s, attributes, outcome in _OK)
        key = (store, op, outcome)
        with self._pending_lock:
            self._ops[key] = self._ops.get(key, 0) + 1
            if op not in ("claim", "claim_next"):
                return
            self._pending.append((latency_s, {"store": store, "op": op, "outcome": outcome}))
            full = len(self._pending) >= _PENDING_MAX
        if full:
            self._record_pending()

    def _record_pending(self) -> None:
        """Hand the queued claim latencies to the SDK's histogram, in one batch."""
        with self._pending_lock:
            pending, self._pending = self._pending, []
        record = self.claim_duration.record
        for value, attributes in pending:
            record(value, attributes)

    def _observe_ops(self, options: Any) -> Iterable[Any]:
        self._record_pending()  # a reader collects: the histogram first gets what waits
        with self._pending_lock:
            ops = dict(self._ops)
        return [_metrics.Observation(count, {"store": store, "op": op, "outcome": outcome})
                for (store, op, outcome), count in ops.items()]

    def _add_held(self, store: str, delta: int) -> None:
        with self._held_lock:
            self._held[store] = self._held.get(store, 0) + delta

    def _observe_held(self, options: Any) -> Iterable[Any]:
        self._record_pending()  # a reader collects: the histograms first get what waits
        with self._held_lock:
            held = dict(self._held)
        return [_metrics.Observation(count, {"store": store})
                for store, count in held.items()]

    def renewed(self, store: str, latency_s: float, headroom_s: float) -> None:
        labels = {"store": store}
        self.renewal_duration.record(latency_s, labels)
        self.headroom.record(max(0.0, headroom_s), labels)
        if self.renew_spans:
            self._span("consensus_lease.renew", latency_s,
                       {"consensus_lease.store": store, "consensus_lease.outcome": "ok",
                        "consensus_lease.headroom_s": headroom_s}, True)

    def lost(self, store: str, job_id: str | None, generation: int | None, reason: str) -> None:
        scope = "session" if job_id is None else "lease"
        attributes: dict[str, Any] = {"consensus_lease.store": store,
                                      "consensus_lease.outcome": "lost",
                                      "consensus_lease.scope": scope,
                                      "consensus_lease.reason": reason[:200]}
        if job_id is not None:
            attributes["consensus_lease.job_id"] = job_id
            self._add_held(store, -1)
        if generation is not None:
            attributes["consensus_lease.generation"] = generation
        self._span("consensus_lease.loss", 0.0, attributes, False)
        self.losses.add(1, {"store": store, "scope": scope})

    # -- counters ----------------------------------------------------------------------

    def claimed(self, store: str, job_id: str, generation: int, owner: str) -> None:
        self._add_held(store, 1)

    def completed(self, store: str, job_id: str, generation: int, owner: str) -> None:
        self._add_held(store, -1)

    def released(self, store: str, job_id: str, generation: int, owner: str) -> None:
        self._add_held(store, -1)

    def failed(self, store: str, job_id: str, generation: int, owner: str, state: str) -> None:
        self._add_held(store, -1)

    def stale_rejected(self, store: str, by: str, job_id: str, generation: int) -> None:
        self.stale.add(1, {"store": store, "by": by})

    def early_revocation(self, store: str, session_id: str, early_by_s: float) -> None:
        self.early_revocations.add(1, {"store": store})

    def delivery_skipped(self, store: str, job_id: str, reason: str) -> None:
        self.skipped.add(1, {"store": store, "reason": reason})

    def callback_failed(self, store: str, registration: str) -> None:
        self.callback_failures.add(1, {"store": store, "registration": registration})


def instrument(*, tracer_provider: Any = None, meter_provider: Any = None,
               renew_spans: bool = True, root_spans: bool = False) -> OTelObserver:
    """Observe every store :func:`~consensus_lease.open_store` opens from now on without
    an ``observer=`` argument with a new :class:`OTelObserver` (arguments as there), and
    return it. Stores already open are not changed. Undo with :func:`uninstrument`."""
    observer = OTelObserver(tracer_provider=tracer_provider, meter_provider=meter_provider,
                            renew_spans=renew_spans, root_spans=root_spans)
    set_default_observer(observer)
    return observer


def uninstrument() -> None:
    """Stores opened from now on have no default observer again."""
    set_default_observer(None)
