"""Metrics: an OpenTelemetry MeterProvider per process (or per bookie, when tests run several in one process),
read by a Prometheus reader into a private registry that /metrics serves, and by an OTLP exporter when
`otlp_endpoint` is set.

Cost (../shared/notes/ops-research.md): a synchronous instrument call costs 3-6 us, so the hot paths count in
plain integers that observable instruments read at collection time, and record histograms once per request,
never per entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import ssl
from collections.abc import Callable, Mapping

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

# Every Octavo histogram measures seconds: from half a millisecond (an add on an idle bookie) to half a minute
# (a compaction pass's step, a reconcile waiting on the API).
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# How often metrics are pushed over OTLP.
OTLP_EXPORT_INTERVAL_MS = 15_000
# A scrape request's head (request line and headers) larger than this is refused; so is one slower than this.
REQUEST_HEAD_BYTES_MAX = 16 * 1024
REQUEST_READ_TIMEOUT_S = 10.0

_UNIT_SUFFIXES = {"s": "seconds", "By": "bytes", "1": "ratio"}


def prometheus_name(name: str, unit: str = "", kind: str = "gauge") -> str:
    """The name Prometheus shows for an OpenTelemetry instrument (as the exporter writes it): dots become
    underscores, the unit's word is appended unless the name already ends with it, counters end in _total."""
    out = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    suffix = _UNIT_SUFFIXES.get(unit, "")
    if suffix and suffix != "ratio" and not out.endswith("_" + suffix):
        out += "_" + suffix
    if kind == "counter":
        out += "_total"
    return out


class Telemetry:
    """One MeterProvider with its Prometheus registry (always) and an OTLP push (when an endpoint is given)."""

    def __init__(self, service_name: str, attributes: Mapping[str, str] | None = None,
                 otlp_endpoint: str = "", extra_readers: tuple[MetricReader, ...] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        readers: list[MetricReader] = [PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False,
                                                              registry=self.registry), *extra_readers]
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

            readers.append(PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=otlp_endpoint, insecure=not otlp_endpoint.startswith("https://")),
                export_interval_millis=OTLP_EXPORT_INTERVAL_MS))
        resource = Resource.create({"service.name": service_name, **(attributes or {})})
        self.provider = MeterProvider(metric_readers=readers, resource=resource, views=[
            View(instrument_type=Histogram, aggregation=ExplicitBucketHistogramAggregation(LATENCY_BUCKETS_S))])
        self.endpoint: MetricsEndpoint | None = None
        # Called before each scrape's collection (to take a fresh snapshot the callbacks then share).
        self.before_collect: list[Callable[[], None]] = []

    def meter(self, name: str) -> Meter:
        return self.provider.get_meter(name)

    def text(self) -> bytes:
        """Every metric as Prometheus text (the observable instruments' callbacks run here)."""
        for hook in self.before_collect:
            hook()
        return generate_latest(self.registry)  # type: ignore[no-any-return]

    async def serve(self, host: str, port: int, health: Callable[[], bool] | None = None,
                    tls: ServerTls | None = None) -> int:
        """Serve /metrics on host:port (0: a free port), and /healthz when `health` is given; over TLS with
        `tls`. Returns the port."""
        self.endpoint = MetricsEndpoint(self.text, health, tls)
        return await self.endpoint.start(host, port)

    async def shutdown(self) -> None:
        if self.endpoint is not None:
            await self.endpoint.stop()
            self.endpoint = None
        # The OTLP reader's last export may wait on a slow collector: not on the loop.
        await asyncio.get_running_loop().run_in_executor(None, self.provider.shutdown)


class ServerTls:
    """Server-side TLS for the endpoint: the certificate and key are loaded again when their files change,
    checked after each connection (a renewal serves from the next one; a half-written pair keeps the old)."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._stamp = self._stamps()
        self.context.load_cert_chain(cert_file, key_file)
        self.reloads = 0

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        out = []
        for path in (self.cert_file, self.key_file):
            try:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, 0))
        return tuple(out)

    def refresh(self) -> None:
        stamp = self._stamps()
        if stamp == self._stamp:
            return
        try:
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError):
            return  # try again after the next connection
        self._stamp = stamp
        self.reloads += 1


class MetricsEndpoint:
    """A small HTTP/1.1 server on the event loop for Prometheus scrapes: GET /metrics answers the text format;
    GET /healthz 200 while `health()` is true and 503 otherwise (for Kubernetes probes: the kubelet cannot probe
    a gRPC port that needs TLS); other paths 404, other methods 405. No thread: the observable instruments'
    callbacks run on the loop, so they may read the bookie's state without locks."""

    def __init__(self, collect: object, health: Callable[[], bool] | None = None,
                 tls: ServerTls | None = None) -> None:
        self._collect = collect
        self._health = health
        self._tls = tls
        self._server: asyncio.Server | None = None
        self.port = 0
        self.scrapes = 0

    async def start(self, host: str, port: int) -> int:
        try:
            self._server = await asyncio.start_server(
                self._handle, host, port, limit=REQUEST_HEAD_BYTES_MAX,
                ssl=self._tls.context if self._tls is not None else None,
                ssl_handshake_timeout=REQUEST_READ_TIMEOUT_S if self._tls is not None else None)
        except OSError as e:
            raise OSError(e.errno, f"cannot serve metrics on {host}:{port} (metrics_port): {e.strerror}") from e
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._tls is not None:
            self._tls.refresh()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_READ_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            await self._answer(writer, 431, b"request head too large\n")
            return
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        if len(head) > REQUEST_HEAD_BYTES_MAX:
            await self._answer(writer, 431, b"request head too large\n")
            return
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3:
            await self._answer(writer, 400, b"bad request line\n")
            return
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            await self._answer(writer, 405, b"only GET and HEAD\n", extra=b"Allow: GET, HEAD\r\n")
            return
        if target == b"/healthz" and self._health is not None:
            serving = self._health()
            await self._answer(writer, 200 if serving else 503, b"serving\n" if serving else b"not serving\n",
                               head_only=method == b"HEAD")
            return
        if target != b"/metrics":
            await self._answer(writer, 404, b"metrics are at /metrics\n")
            return
        try:
            body = self._collect()  # type: ignore[operator]
        except Exception as e:  # a broken callback must not take the endpoint down
            log.exception("metrics collection failed")
            await self._answer(writer, 500, f"collection failed: {type(e).__name__}: {e}\n".encode())
            return
        self.scrapes += 1
        await self._answer(writer, 200, body, content_type=CONTENT_TYPE_LATEST.encode(), head_only=method == b"HEAD")

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: bytes = b"text/plain",
                      extra: bytes = b"", head_only: bool = False) -> None:
        reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed",
                  431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
                  503: b"Service Unavailable"}[status]
        writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n"
                     % (status, reason, content_type, len(body), extra))
        if not head_only:
            writer.write(body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
