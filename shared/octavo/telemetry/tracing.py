"""Traces: sampled spans, W3C trace context (`traceparent`) between processes.

Sampling is one ratio per process (`trace_sample_ratio`, 0 by default: no spans are made at all, so tracing
off costs one comparison per operation). A span whose parent was sampled is always sampled (a bookie follows
its client's decision); a root operation is sampled at the ratio.

Context crosses gRPC as the `traceparent` metadata entry of a unary call. The add stream is one long call
carrying many requests, so each AddRequest carries its own `trace_parent` field (the same W3C string).
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "traceparent"
_propagator = TraceContextTextMapPropagator()


class Sampling:
    """The sampling decision of one process: `start(parent)` says whether an operation gets a span."""

    def __init__(self, ratio: float) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"trace_sample_ratio must be in [0, 1], got {ratio}")
        self.ratio = ratio
        # Only a ratio strictly between 0 and 1 draws (seeding a generator reads the OS's entropy: made once
        # per process part that traces, not for every client or bookie service that never samples).
        self._random = random.Random() if 0.0 < ratio < 1.0 else None

    @property
    def enabled(self) -> bool:
        return self.ratio > 0.0

    def root(self) -> bool:
        """Whether a root operation (no sampled parent) is sampled."""
        return self.ratio >= 1.0 or (self._random is not None and self._random.random() < self.ratio)

    def wants_span(self) -> bool:
        """For an operation inside the current context: yes under a recording span, else at the ratio."""
        if not self.enabled:
            return False
        return trace.get_current_span().is_recording() or self.root()


def make_tracer_provider(service_name: str, otlp_endpoint: str = "", exporter: SpanExporter | None = None,
                         attributes: Mapping[str, str] | None = None) -> TracerProvider:
    """A provider whose spans go to `exporter` (tests) or over OTLP. Its sampler keeps every span it is asked
    for: which operations get one is decided by Sampling, before any span object is made."""
    provider = TracerProvider(sampler=ParentBased(ALWAYS_ON),
                              resource=Resource.create({"service.name": service_name, **(attributes or {})}))
    if exporter is None and otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=otlp_endpoint, insecure=not otlp_endpoint.startswith("https://"))
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def current_traceparent() -> str:
    """The W3C traceparent of the current span if it is sampled, else ''."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    value = carrier.get(TRACEPARENT, "")
    try:
        sampled = int(value[-2:], 16) & 1  # the flags byte: bit 0 is "sampled" (bit 1 "random", W3C level 2)
    except ValueError:
        return ""
    return value if sampled else ""


def traceparent_of(span: trace.Span) -> str:
    """The W3C traceparent naming `span` as the parent."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT, "")


def context_from_traceparent(value: str) -> Context | None:
    """The context a W3C traceparent names, None if it is empty, malformed or not sampled."""
    if not value:
        return None
    ctx = _propagator.extract({TRACEPARENT: value})
    span_context = trace.get_current_span(ctx).get_span_context()
    if not span_context.is_valid or not span_context.trace_flags.sampled:
        return None
    return ctx


def context_from_metadata(metadata: object) -> Context | None:
    """The sampled parent carried in a gRPC call's metadata (a sequence of (key, value)), if any."""
    if not metadata:
        return None
    for key, value in metadata:  # type: ignore[attr-defined]
        if key == TRACEPARENT:
            return context_from_traceparent(value if isinstance(value, str) else value.decode())
    return None


def attach(ctx: Context) -> object:
    return otel_context.attach(ctx)


def detach(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]
