"""A real OTLP gRPC receiver for tests (what an OpenTelemetry collector listens with): it keeps every metrics
and traces export it is sent, and sums cumulative counters over the processes that sent them."""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class OtlpReceiver:
    """`with OtlpReceiver() as r:` listens on 127.0.0.1:r.port until the block ends."""

    def __init__(self) -> None:
        self.metrics: list[Any] = []
        self.traces: list[Any] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        receiver = self

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                with receiver._lock:
                    receiver.metrics.append(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                with receiver._lock:
                    receiver.traces.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._server)  # type: ignore[no-untyped-call]
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self._server)  # type: ignore[no-untyped-call]
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> OtlpReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)

    def sums(self) -> dict[tuple[str, str, tuple[tuple[str, str], ...]], float]:
        """(sender, metric name, attributes) -> the last value of each cumulative sum; the sender is the
        resource's `process.pid` or `octavo.bookie_id` (empty if neither)."""
        last: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
        with self._lock:
            requests = list(self.metrics)
        for request in requests:
            for rm in request.resource_metrics:
                attrs = {a.key: a.value.string_value for a in rm.resource.attributes}
                sender = attrs.get("process.pid") or attrs.get("octavo.bookie_id", "")
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if not metric.HasField("sum"):
                            continue
                        for point in metric.sum.data_points:
                            labels = tuple(sorted((a.key, a.value.string_value) for a in point.attributes))
                            value = point.as_int if point.HasField("as_int") else point.as_double
                            last[(sender, metric.name, labels)] = value
        return last

    def total(self, name: str, **labels: str) -> float:
        """A cumulative counter summed over its senders."""
        want = tuple(sorted(labels.items()))
        return sum(v for (_, n, lab), v in self.sums().items() if n == name and lab == want)

    def histogram_count(self, name: str) -> int:
        """Observations of a histogram, summed over its senders (the last cumulative point of each)."""
        counts: dict[str, int] = {}
        with self._lock:
            requests = list(self.metrics)
        for request in requests:
            for rm in request.resource_metrics:
                attrs = {a.key: a.value.string_value for a in rm.resource.attributes}
                sender = attrs.get("process.pid") or attrs.get("octavo.bookie_id", "")
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if metric.name == name and metric.HasField("histogram"):
                            counts[sender] = sum(p.count for p in metric.histogram.data_points)
        return sum(counts.values())

    def spans(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(name, trace id hex, attributes) of every span received."""
        out = []
        with self._lock:
            requests = list(self.traces)
        for request in requests:
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        attrs = {a.key: (a.value.string_value or a.value.int_value) for a in span.attributes}
                        out.append((span.name, span.trace_id.hex(), attrs))
        return out
