"""Observability shared by every Octavo process: OpenTelemetry metrics served as Prometheus text on /metrics (and
pushed over OTLP when an endpoint is set), sampled traces with W3C trace context, and structured logs.

One vocabulary: a metric's OpenTelemetry name (`octavo.bookie.add.latency`) is what the code records and the
docs list; Prometheus shows it with dots as underscores and its unit as a suffix
(`octavo_bookie_add_latency_seconds`, counters end in `_total`). docs/operations.md lists every metric.
"""

from octavo.telemetry.logs import JsonFormatter, configure_logging
from octavo.telemetry.metrics import LATENCY_BUCKETS_S, MetricsEndpoint, ServerTls, Telemetry, prometheus_name
from octavo.telemetry.tracing import (
    TRACEPARENT,
    Sampling,
    context_from_traceparent,
    current_traceparent,
    make_tracer_provider,
)

__all__ = [
    "LATENCY_BUCKETS_S",
    "TRACEPARENT",
    "JsonFormatter",
    "MetricsEndpoint",
    "Sampling",
    "ServerTls",
    "Telemetry",
    "configure_logging",
    "context_from_traceparent",
    "current_traceparent",
    "make_tracer_provider",
    "prometheus_name",
]
