"""What the data plane counts, per request, in plain integers (an OpenTelemetry counter call costs 3-6 us, an
integer add a few ns); metrics.py reads them when a scrape or an export collects."""

from __future__ import annotations

from opentelemetry.metrics import Histogram

from octavo.v1 import bookie_pb2 as pb


class RequestStats:
    """Counts kept by the data plane as plain integers; the histograms are set when metrics are on."""

    __slots__ = ("add_bytes", "add_entries", "add_latency", "add_refused", "add_requests", "fences", "read_bytes",
                 "read_entries", "read_errors", "read_latency", "read_requests", "tail_requests", "write_closes")

    def __init__(self) -> None:
        self.add_requests = 0
        self.add_entries = 0   # entries stored
        self.add_bytes = 0     # payload bytes stored
        self.add_refused: dict[str, int] = {}  # entries refused, by result code name
        self.read_requests = 0
        self.read_entries = 0
        self.read_bytes = 0
        self.read_errors: dict[str, int] = {}  # read requests answered with an error, by code name
        self.tail_requests = 0
        self.fences = 0
        self.write_closes = 0
        self.add_latency: Histogram | None = None
        self.read_latency: Histogram | None = None

    def refused(self, code: int, entries: int) -> None:
        name = pb.ResultCode.Name(code)  # type: ignore[arg-type]
        self.add_refused[name] = self.add_refused.get(name, 0) + entries

    def read_error(self, code: int) -> None:
        name = pb.ResultCode.Name(code)  # type: ignore[arg-type]
        self.read_errors[name] = self.read_errors.get(name, 0) + 1
