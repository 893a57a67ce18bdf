"""The client library's metrics and spans. As a library it records into the application's providers (the
global OpenTelemetry ones unless the Client is given its own): with no SDK installed every call is a no-op
costing ~0.2 us, made once per request or operation, never per entry.

Metrics (docs/operations.md): octavo.client.add.latency (s, from a batch handed to the bookies until an ack
quorum stored all of it), octavo.client.add.in_flight_bytes (appended, not yet acknowledged),
octavo.client.ensemble_changes, octavo.client.read.speculative (second requests sent for a slow read),
octavo.client.recovery_opens, octavo.client.read.latency (s, one read request to a bookie).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import Span, SpanKind, Tracer, TracerProvider

from octavo.telemetry.tracing import Sampling, traceparent_of

SCOPE = "octavo.client"


class ClientMetrics:
    """The instruments of one meter provider, shared by every Client using it."""

    def __init__(self, provider: MeterProvider) -> None:
        meter = provider.get_meter(SCOPE)
        self.handles: weakref.WeakSet[Any] = weakref.WeakSet()  # live write handles (their in-flight bytes)
        self.add_latency = meter.create_histogram(
            "octavo.client.add.latency", unit="s",
            description="time from a batch of appends handed to the bookies until an ack quorum stored all of it")
        self.read_latency = meter.create_histogram(
            "octavo.client.read.latency", unit="s", description="time one read request to a bookie took")
        self.ensemble_changes = meter.create_counter(
            "octavo.client.ensemble_changes", unit="{change}",
            description="ensemble changes made by writers (a bookie replaced in a new segment)")
        self.speculative_reads = meter.create_counter(
            "octavo.client.read.speculative", unit="{request}",
            description="second read requests sent to another replica because the first was slow")
        self.recovery_opens = meter.create_counter(
            "octavo.client.recovery_opens", unit="{open}",
            description="recovery opens (fence, recover the tail, close)")
        meter.create_observable_up_down_counter(
            "octavo.client.add.in_flight_bytes", [self._in_flight], unit="By",
            description="bytes appended and not yet acknowledged, over every open write handle")

    def _in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(sum(h._inflight_bytes for h in list(self.handles)))]


_metrics: dict[int, tuple[MeterProvider, ClientMetrics]] = {}
_lock = threading.Lock()


def client_metrics(provider: MeterProvider | None = None) -> ClientMetrics:
    """The instruments for `provider` (the global one by default), made once per provider."""
    provider = provider or metrics.get_meter_provider()
    with _lock:
        known = _metrics.get(id(provider))
        if known is None or known[0] is not provider:
            known = _metrics[id(provider)] = (provider, ClientMetrics(provider))
        return known[1]


class ClientTracing:
    """Spans for client operations, made only when sampled (ClientOptions.trace_sample_ratio)."""

    def __init__(self, ratio: float, provider: TracerProvider | None = None) -> None:
        self.sampling = Sampling(ratio)
        self.tracer: Tracer = (provider or trace.get_tracer_provider()).get_tracer(SCOPE)

    def start(self, name: str, **attributes: Any) -> Span | None:
        """A span for an operation, or None when it is not sampled (the common case: nothing made)."""
        if not self.sampling.wants_span():
            return None
        return self.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)

    @contextlib.contextmanager
    def operation(self, name: str, **attributes: Any) -> Iterator[Span | None]:
        """The operation's span as the current one while the block runs (None and nothing made when not
        sampled); an exception ends it with an error status."""
        span = self.start(name, **attributes)
        if span is None:
            yield None
            return
        with trace.use_span(span, end_on_exit=True, record_exception=True, set_status_on_exception=True):
            yield span

    @staticmethod
    def traceparent(span: Span | None) -> str:
        return traceparent_of(span) if span is not None else ""
