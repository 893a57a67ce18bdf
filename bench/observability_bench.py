"""What observability costs: the cluster benchmark's 1 KB write throughput (E=3, Qw=3, Qa=2, the same driver as
bench/cluster_bench.py) with metrics on and off, side by side in one run.

Two local clusters of three bookies each, alternating run by run (order swapped every round, so neither
always goes first on this shared machine):
- on: bookies with --metrics-port, each scraped every --scrape-interval-s (5 s, three times as often as a
  usual 15 s Prometheus) by a thread of this process; the client with an OpenTelemetry SDK MeterProvider (a
  Prometheus reader) and tracing configured but not sampled (trace_sample_ratio 0, the default);
- off: bookies without a metrics endpoint (the data plane still counts in integers, nothing reads them),
  the client with no SDK (OpenTelemetry's no-op API).
A third row samples 1% of the client's append batches into an SDK tracer provider (spans kept in memory) on
the "on" cluster.

Also measured: the wall time of one scrape of a bookie under load (its CPU is spent on the bookie's loop).
Target (issue 14): the instrumentation costs at most 3% of the 1 KB throughput. Writes the `observability`
section of docs/benchmarks.md.

Usage: python bench/observability_bench.py [--rounds N] [--seconds S] [--ledgers 1,100] [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_bench import run_octavo
from common import machine_line, median, table, write_section
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions
from octavo.telemetry import Telemetry

SIZE = 1024
BOOKIE_ARGS = ["--log-size-bytes-max", str(64 << 20)]


class Scraper(threading.Thread):
    """Scrapes every bookie's /metrics every `interval_s`, as Prometheus would; keeps each scrape's time."""

    def __init__(self, addresses: list[str], interval_s: float) -> None:
        super().__init__(daemon=True)
        self.addresses = addresses
        self.interval_s = interval_s
        self.stop = threading.Event()
        self.times: list[float] = []
        self.failures = 0

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            for address in self.addresses:
                t0 = time.perf_counter()
                try:
                    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
                        r.read()
                    self.times.append(time.perf_counter() - t0)
                except OSError:
                    self.failures += 1


async def one_run(etcd: str, ledgers: int, seconds: float, traced: bool, sdk: bool) -> float:
    meter_provider = tracer_provider = None
    options = ClientOptions()
    if sdk:
        meter_provider = Telemetry("octavo-bench-client").provider  # an SDK provider with a Prometheus reader
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        if traced:
            options = ClientOptions(trace_sample_ratio=0.01)
    client_kw = {"meter_provider": meter_provider, "tracer_provider": tracer_provider} if sdk else {}
    async with Client(etcd, options=options, **client_kw) as client:  # type: ignore[arg-type]
        rate = await run_octavo(client, SIZE, ledgers, seconds)
    if isinstance(meter_provider, MeterProvider):
        meter_provider.shutdown()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--ledgers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 100])
    ap.add_argument("--scrape-interval-s", type=float, default=5.0)
    ap.add_argument("--no-report", action="store_true")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="octavo-obs-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR"))
    on = LocalCluster(os.path.join(root, "on"), bookies=3, bookie_args=[*BOOKIE_ARGS, "--metrics-port", "0"],
                      new_session=True)
    off = LocalCluster(os.path.join(root, "off"), bookies=3, bookie_args=BOOKIE_ARGS, new_session=True)
    runs: dict[tuple[str, int], list[float]] = {}
    try:
        on.start()
        off.start()
        scraper = Scraper([b.metrics_address for b in on.bookies.values()], args.scrape_interval_s)
        scraper.start()
        for r in range(args.rounds):
            for ledgers in args.ledgers:
                order = [("off", off, False, False), ("on", on, False, True), ("on+traces", on, True, True)]
                if r % 2:
                    order.reverse()
                for name, cluster, traced, sdk in order:
                    rate = asyncio.run(one_run(cluster.etcd_endpoint, ledgers, args.seconds, traced, sdk))
                    runs.setdefault((name, ledgers), []).append(rate)
                    print(f"round {r + 1} {ledgers:>4} ledgers {name:>10}: {rate:,.0f} entries/s", flush=True)
        scraper.stop.set()
        scraper.join()
    finally:
        on.stop()
        off.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for ledgers in args.ledgers:
        base = runs[("off", ledgers)]
        for name in ("off", "on", "on+traces"):
            values = runs[(name, ledgers)]
            # Per-round ratios against the same round's "off" run, then their median: the noise of the
            # machine moves both runs of a round together.
            ratio = median([v / b for v, b in zip(values, base, strict=True)])
            rows.append([f"{SIZE:,} B x {ledgers}", name, f"{median(values):,.0f}", f"{ratio:.1%}"])
            print(f"{ledgers:>4} ledgers {name:>10}: median {median(values):,.0f}/s, {ratio:.1%} of off", flush=True)
    scrape_ms = median(scraper.times) * 1000 if scraper.times else float("nan")
    print(f"scrape of one bookie under load: median {scrape_ms:.1f} ms over {len(scraper.times)} scrapes "
          f"({scraper.failures} failed)")
    body = "\n".join([
        "## Observability overhead",
        "",
        f"`python bench/observability_bench.py --rounds {args.rounds} --seconds {args.seconds:g}` ({machine_line()}).",
        "The cluster benchmark's 1 KB writes (E=3, Qw=3, Qa=2) on two local clusters of three bookies, run by run "
        "in alternation (order swapped each round): **off**: bookies without a metrics endpoint, the client on "
        "OpenTelemetry's no-op API; **on**: bookies serving `/metrics`, each scraped every "
        f"{args.scrape_interval_s:g} s, the client on an SDK MeterProvider with tracing set up but not sampled; "
        "**on+traces**: the same with 1% of the client's append batches traced (the bookies' request spans are "
        "made only with an exporter, so this row is the client side). Medians of "
        f"{args.rounds} runs of {args.seconds:g} s; the share is the median of per-round ratios to the same "
        "round's off run.",
        "",
        table(["entries", "metrics", "entries/s", "of off"], rows),
        "",
        f"One scrape of a bookie under this load took {scrape_ms:.1f} ms (median of {len(scraper.times)}). "
        "Target: instrumentation costs at most 3% of the 1 KB throughput.",
    ])
    if not args.no_report:
        write_section("observability", body)
        print("wrote docs/benchmarks.md (observability)")


if __name__ == "__main__":
    main()
