"""Data skipping: a 1%-selective filter on an event-time column over a dataset of 1,000 ledgers, read with
`data_skipping` against a full scan, side by side in one run.

The dataset: --ledgers ledgers of --rows rows each, written as the Spark sink writes them (octavo.spark.arrowio,
so each carries its column statistics) and committed in one commit; ledger i holds one hour of event time, so
a filter on one percent of the hours matches one percent of the ledgers. Local Spark (local[2]) then runs
`filter(ts in window).count()` on both reads, in alternating order, --rounds times after a warm-up round;
medians. "Ledgers read" is what the planner handed to tasks (one input partition per ledger). Writes the
`skipping` section of docs/benchmarks.md.

Usage: python bench/skipping_bench.py [--ledgers N] [--rows N] [--rounds N] [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, median, table, write_section

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import pyarrow as pa
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType, TimestampType

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.spark.arrowio import Options, new_write_id, write_ledger

BASE = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
SCHEMA = StructType([StructField("id", LongType()), StructField("ts", TimestampType()),
                     StructField("value", DoubleType()), StructField("item", StringType())])


def hour_batch(hour: int, rows: int) -> pa.RecordBatch:
    first = hour * rows
    ids = list(range(first, first + rows))
    start = BASE + datetime.timedelta(hours=hour)
    return pa.RecordBatch.from_arrays([
        pa.array(ids, pa.int64()),
        pa.array([start + datetime.timedelta(seconds=3600 * i / rows) for i in range(rows)],
                 pa.timestamp("us", tz="UTC")),
        pa.array([i / 7 for i in ids], pa.float64()),
        pa.array([f"item-{i % 1000}" for i in ids], pa.string()),
    ], names=SCHEMA.fieldNames())


async def build(etcd: str, name: str, ledgers: int, rows: int) -> float:
    opts = Options(etcd=etcd, dataset=name, rows_per_entry=max(1, rows // 4))
    gate = asyncio.Semaphore(16)
    write_id = new_write_id()

    async def one(hour: int):  # type: ignore[no-untyped-def]
        async with gate:
            return await write_ledger(opts, [hour_batch(hour, rows)], write_id)

    t0 = time.perf_counter()
    written = await asyncio.gather(*(one(h) for h in range(ledgers)))
    async with Client(etcd) as client:
        await client.datasets.commit(name, SCHEMA.json(), [w for w in written if w is not None], mode="append")
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ledgers", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="octavo-skipping-bench-", dir=os.environ.get("BENCH_DIR")))
    from pyspark.sql import SparkSession

    selected = max(1, args.ledgers // 100)
    lo = args.ledgers // 2
    window = (BASE + datetime.timedelta(hours=lo), BASE + datetime.timedelta(hours=lo + selected))
    condition = (f"ts >= timestamp'{window[0]:%Y-%m-%d %H:%M:%S}Z' and "
                 f"ts < timestamp'{window[1]:%Y-%m-%d %H:%M:%S}Z'")
    took: dict[str, list[float]] = {"full": [], "skip": [], "plan_full": [], "plan_skip": []}
    read: dict[str, int] = {}
    try:
        with LocalCluster(str(root / "cluster"), bookies=3,
                          bookie_args=["--dataset-maintenance-interval-s", "0"]) as cluster:
            built = asyncio.run(build(cluster.etcd_endpoint, "events", args.ledgers, args.rows))
            print(f"wrote {args.ledgers} ledgers of {args.rows} rows in {built:.1f}s", flush=True)
            spark = (SparkSession.builder.master("local[2]").appName("octavo-skipping-bench")
                     .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                     .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                     .config("spark.sql.python.filterPushdown.enabled", "true")
                     .config("spark.driver.memory", "2g").getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")

            def frame(skipping: bool, **extra: str):  # type: ignore[no-untyped-def]
                reader = (spark.read.format("octavo").option("etcd", cluster.etcd_endpoint)
                          .option("data_skipping", str(skipping).lower()))
                for k, v in extra.items():
                    reader = reader.option(k, v)
                return reader.load("events").filter(condition)

            for label, skipping in (("full", False), ("skip", True)):
                read[label] = frame(skipping, entries_per_partition="1000000000").rdd.getNumPartitions()
            expected = selected * args.rows
            for r in range(args.rounds + 1):  # round 0 warms up and is not counted
                order = (("full", False), ("skip", True)) if r % 2 == 0 else (("skip", True), ("full", False))
                for label, skipping in order:
                    t0 = time.perf_counter()
                    frame(skipping).rdd.getNumPartitions()
                    planned = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    count = frame(skipping).count()
                    seconds = time.perf_counter() - t0
                    if count != expected:
                        raise SystemExit(f"{label}: {count} rows, expected {expected}")
                    if r > 0:
                        took[label].append(seconds)
                        took[f"plan_{label}"].append(planned)
                print(f"round {r}{' (warm-up)' if r == 0 else ''}: full {took['full'][-1:] or '-'} "
                      f"skipping {took['skip'][-1:] or '-'}", flush=True)
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: median(v) for k, v in took.items()}
    body = "\n".join([
        f"## Data skipping: a 1%-selective event-time filter over {args.ledgers:,} ledgers (bench/skipping_bench.py)",
        "",
        f"{machine_line()}. Local Spark (local[2]), 3 bookies (E=3 Qw=3 Qa=2). {args.ledgers:,} ledgers of "
        f"{args.rows:,} rows, each one hour of event time, written as the sink writes them; the query is "
        f"`filter({condition}).count()`, {selected} hours ({selected * args.rows:,} rows). Medians of "
        f"{args.rounds} rounds in alternating order after a warm-up round; `spark.sql.python.filterPushdown."
        "enabled` true for both.",
        "",
        table(["read", "ledgers read", "planning (s)", "query (s)"], [
            ["full scan", f"{read['full']:,}", f"{med['plan_full']:.2f}", f"{med['full']:.2f}"],
            ["data_skipping", f"{read['skip']:,}", f"{med['plan_skip']:.2f}", f"{med['skip']:.2f}"],
        ]),
        "",
        f"Skipping reads {read['skip'] / read['full']:.1%} of the ledgers and takes {med['skip'] / med['full']:.0%}"
        f" of the full scan's time. Its planning reads each ledger's metadata from etcd (64 at a time) to get the "
        f"statistics: that cost grows with the dataset's ledgers, which the background merge keeps few.",
    ])
    print(body)
    if not args.no_report:
        write_section("skipping", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
