"""Writing and reading a DataFrame through Octavo against local Parquet, side by side in one run.

A DataFrame of --rows rows (an id, two longs, a double and a short string; cached in memory first so both
sides pay only for the write) in --partitions partitions, on local Spark (local[2]). Each round writes it
  (a) to Parquet on the local disk (snappy, Spark's default), and
  (b) to an Octavo dataset on a local cluster of 3 bookies (E=3, Qw=3, Qa=2: three replicas),
then reads each back (count + a sum over every column, so every row is decoded). Medians of --rounds rounds,
ratios Octavo / Parquet. Writes the `spark` section of docs/benchmarks.md.

Usage: python bench/spark_bench.py [--rows N] [--partitions N] [--rounds N] [--no-report]
"""

from __future__ import annotations

import argparse
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

from octavo.cli.localcluster import LocalCluster
from octavo.client import SyncClient


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="octavo-spark-bench-", dir=os.environ.get("BENCH_DIR")))
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    results: dict[str, list[float]] = {k: [] for k in ("pq_w", "oc_w", "pq_r", "oc_r")}
    sizes = {"pq": 0, "oc": 0}
    try:
        with LocalCluster(str(root / "cluster"), bookies=3) as cluster:
            spark = (SparkSession.builder.master("local[2]").appName("octavo-bench")
                     .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                     .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                     .config("spark.driver.memory", "2g").getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            df = (spark.range(0, args.rows, numPartitions=args.partitions)
                  .select("id", (F.col("id") * 7919 % 50_000).alias("customer"),
                          (F.col("id") * 104_729 % 100_000).alias("amount"), (F.col("id") / 7).alias("ratio"),
                          F.concat(F.lit("item-"), (F.col("id") % 1000).cast("string")).alias("item"))
                  .cache())
            df.count()

            def scan(frame) -> int:  # type: ignore[no-untyped-def]
                row = frame.selectExpr("count(*)", "sum(id + customer + amount + ratio + length(item))").collect()[0]
                return int(row[0])

            for r in range(args.rounds + 1):  # round 0 warms up (Python workers, JIT) and is not counted
                took: dict[str, float] = {}
                pq = root / f"parquet-{r}"
                t0 = time.perf_counter()
                df.write.parquet(str(pq))
                took["pq_w"] = time.perf_counter() - t0
                sizes["pq"] = dir_bytes(pq)
                t0 = time.perf_counter()
                (df.write.format("octavo").option("etcd", cluster.etcd_endpoint).option("ensemble_size", "3")
                 .option("write_quorum", "3").option("ack_quorum", "2").mode("overwrite").save(f"bench{r}"))
                took["oc_w"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                assert scan(spark.read.parquet(str(pq))) == args.rows
                took["pq_r"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                assert scan(spark.read.format("octavo").option("etcd", cluster.etcd_endpoint)
                            .load(f"bench{r}")) == args.rows
                took["oc_r"] = time.perf_counter() - t0
                with SyncClient(cluster.etcd_endpoint) as client:
                    sizes["oc"] = client._loop.run(client._client.datasets.get(f"bench{r}")).payload_bytes
                if r > 0:
                    for k, v in took.items():
                        results[k].append(v)
                print(f"round {r}{' (warm-up)' if r == 0 else ''}: parquet write {took['pq_w']:.2f}s read "
                      f"{took['pq_r']:.2f}s; octavo write {took['oc_w']:.2f}s read {took['oc_r']:.2f}s", flush=True)
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: median(v) for k, v in results.items()}
    mib = 2**20

    def row(name: str, key: str, size: int) -> list[str]:
        return [name, f"{args.rows / med[key]:,.0f}", f"{size / mib / med[key]:.1f}", f"{med[key]:.2f}"]

    write_ratio = med["pq_w"] / med["oc_w"]
    read_ratio = med["pq_r"] / med["oc_r"]
    body = "\n".join([
        "## Spark: a DataFrame through Octavo against local Parquet (bench/spark_bench.py)",
        "",
        f"{machine_line()}. Local Spark (local[2]); {args.rows:,} cached rows (id, two longs, a double, a short "
        f"string) in {args.partitions} partitions. Octavo: 3 bookies on this machine, E=3 Qw=3 Qa=2 (three "
        f"replicas of every entry), Arrow IPC entries with lz4 ({sizes['oc'] / mib:.1f} MiB per copy); Parquet: "
        f"snappy on the local disk, one copy ({sizes['pq'] / mib:.1f} MiB). Medians of {args.rounds} rounds; "
        "a warm-up round before them is not counted; reads decode every column.",
        "",
        table(["", "rows/s", "MiB/s (of its own format)", "seconds"], [
            row("write: Parquet, local disk", "pq_w", sizes["pq"]),
            row("write: Octavo, 3 replicas", "oc_w", sizes["oc"]),
            row("read: Parquet", "pq_r", sizes["pq"]),
            row("read: Octavo", "oc_r", sizes["oc"]),
        ]),
        "",
        f"Octavo / Parquet: write {write_ratio:.0%}, read {read_ratio:.0%}. Target: Octavo's write >= 50% of the "
        f"local Parquet write while keeping three replicas: {'met' if write_ratio >= 0.5 else 'NOT met'}.",
    ])
    print(body)
    if not args.no_report:
        write_section("spark", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
