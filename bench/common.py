"""Shared helpers for the benchmarks: medians, machine facts, and writing docs/benchmarks.md sections."""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from pathlib import Path

REPORT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine_line() -> str:
    load = os.getloadavg()
    return (f"{platform.python_implementation()} {platform.python_version()} on {platform.machine()}, "
            f"{os.cpu_count()} cores, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def write_section(name: str, body: str) -> None:
    """Replace the section between `<!-- bench:NAME -->` markers in docs/benchmarks.md (append if missing)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = REPORT.read_text() if REPORT.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    REPORT.write_text(text)


def table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)
