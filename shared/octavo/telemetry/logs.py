"""Logs: text for a terminal, JSON lines (one object per line) for a log pipeline.

Structured fields come from `extra=` on a log call: `log.info("...", extra={"ledger_id": 7, "bookie_id": b})`.
The JSON form carries them as fields of their own, with the trace and span ids of the current span when one is
recording; the text form shows the message only (the fields are in it already). Logs are written per state
change (a mode change, an ensemble change, a fence, a compaction pass, an unclean restart), never per entry.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

from opentelemetry import trace

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str = "") -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.service:
            out["service"] = self.service
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            out["trace_id"] = format(span_context.trace_id, "032x")
            out["span_id"] = format(span_context.span_id, "016x")
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"))


def add_log_format_argument(parser: Any) -> None:
    """The --log-format flag every long-running command takes (default: $OCTAVO_LOG_FORMAT, else text)."""
    import os

    parser.add_argument("--log-format", choices=list(LOG_FORMATS), default=os.environ.get("OCTAVO_LOG_FORMAT", "text"),
                        help="text lines, or one JSON object per line with the ledger, bookie and trace ids as "
                             "fields (default: text, or $OCTAVO_LOG_FORMAT)")


def configure_logging(level: str | int = "INFO", fmt: str = "text", service: str = "", stream: Any = None) -> None:
    """Set up the root logger for a process: `fmt` is 'text' or 'json'."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
