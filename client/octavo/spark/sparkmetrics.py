"""The Spark data source's metrics. Executors are short-lived Python workers that nothing scrapes, so with the
`otlp_endpoint` option each worker pushes its metrics (these, and the client library's under them) to an
OpenTelemetry collector, flushing at the end of every task; without it they go to the process's global
OpenTelemetry provider (a no-op unless the application installed the SDK).

octavo.spark.rows_written / .bytes_written / .ledgers_written (tasks' writes), octavo.spark.rows_read
(tasks' reads), octavo.spark.commits (driver: manifests published, by kind batch or stream).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import MeterProvider

from octavo.telemetry import Telemetry

FLUSH_TIMEOUT_MS = 5_000


class SparkMetrics:
    def __init__(self, provider: MeterProvider) -> None:
        meter = provider.get_meter("octavo.spark")
        self.provider = provider
        self.rows_written = meter.create_counter("octavo.spark.rows_written", unit="{row}",
                                                 description="rows written into ledgers by tasks")
        self.bytes_written = meter.create_counter("octavo.spark.bytes_written", unit="By",
                                                  description="entry bytes (Arrow IPC) written by tasks")
        self.ledgers_written = meter.create_counter("octavo.spark.ledgers_written", unit="{ledger}",
                                                    description="ledgers written by tasks (one per task)")
        self.rows_read = meter.create_counter("octavo.spark.rows_read", unit="{row}",
                                              description="rows read from ledgers by tasks")
        self.commits = meter.create_counter("octavo.spark.commits", unit="{commit}",
                                            description="manifests published by the driver (batch or stream)")

    def flush(self) -> None:
        """Push what was recorded now (a Spark worker may be ended right after its task)."""
        force_flush: Any = getattr(self.provider, "force_flush", None)
        if force_flush is not None:
            force_flush(timeout_millis=FLUSH_TIMEOUT_MS)


_by_endpoint: dict[str, SparkMetrics] = {}
_lock = threading.Lock()


def spark_metrics(otlp_endpoint: str) -> SparkMetrics:
    """The metrics of this process for the option's endpoint (made once per process and endpoint)."""
    with _lock:
        known = _by_endpoint.get(otlp_endpoint)
        if known is None:
            provider: MeterProvider = Telemetry(
                "octavo-spark", {"process.pid": str(os.getpid())}, otlp_endpoint).provider \
                if otlp_endpoint else metrics.get_meter_provider()
            known = _by_endpoint[otlp_endpoint] = SparkMetrics(provider)
        return known
