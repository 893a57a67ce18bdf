"""The quickstart pipeline (`make demo`): a PySpark job writes a dataset into Octavo, survives a bookie killed
mid-write, reads it back exactly, and compacts a keyed update stream. Copy it as the start of your own job.

1. Start a local cluster: a real etcd and four bookies on 127.0.0.1 (what `octavo dev up` runs).
2. Start Spark in local mode; the `octavo` data source is found by itself (package `pyspark_octavo`).
3. Write 1,000,000 order rows in 8 partitions, three replicas (E=3, Qw=3, Qa=2); one bookie is SIGKILLed
   mid-write. Every task's ledger changes ensembles and goes on; the write commits atomically.
4. Read the dataset back and compare row count and a checksum with the source DataFrame.
5. Write a keyed stream of account balances (an initial load, two update rounds and some deletes) and run
   key compaction: exactly the latest row per account remains, deleted accounts are gone.
6. Print a summary with throughput.

Run: `make demo`, or `.venv/bin/python examples/spark_pipeline.py [--rows N] [--data-dir DIR]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from octavo.cli.localcluster import LocalCluster


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def spark_session():  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("octavo-quickstart")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "8")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def checksum(df):  # type: ignore[no-untyped-def]
    row = df.selectExpr("count(*) as n",
                        "sum(crc32(concat_ws('|', order_id, customer, amount_cents, item))) as c").collect()[0]
    return int(row["n"]), int(row["c"])


def kill_when_writing(etcd: str, victim, victim_id: str, stop: threading.Event,  # type: ignore[no-untyped-def]
                      hit: list[int]) -> None:
    """SIGKILL the victim once tasks are writing into ledgers of its ensembles (seen in etcd)."""
    from octavo.client import SyncClient
    from octavo.client.dataset import META_DATASET

    with SyncClient(etcd) as client:
        while not stop.is_set():
            metas = client._loop.run(client._client.all_ledger_metadata())
            writing = [m for m in metas if m.custom_metadata.get(META_DATASET) == "orders" and m.state == "OPEN"
                       and victim_id in m.ensembles[0][1]]
            if writing:
                victim.kill()
                hit.extend(m.ledger_id for m in writing)
                print(f"   !! {victim_id} killed (SIGKILL) while {len(writing)} tasks write to it", flush=True)
                return
            time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--data-dir", default=".demo/spark")
    args = parser.parse_args()
    root = Path(args.data_dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)

    step("1. a local cluster: etcd + 4 bookies")
    with LocalCluster(str(root / "cluster"), bookies=4) as cluster:
        etcd = cluster.etcd_endpoint
        for bookie_id, b in cluster.bookies.items():
            print(f"   {bookie_id} at {b.address}")
        print(f"   etcd at {etcd}")

        step("2. Spark (local mode)")
        t0 = time.monotonic()
        spark = spark_session()
        print(f"   Spark {spark.version} up in {time.monotonic() - t0:.1f}s")
        from pyspark.sql import functions as F

        orders = (spark.range(0, args.rows, numPartitions=args.partitions)
                  .select(F.col("id").alias("order_id"),
                          (F.col("id") * 7919 % 50_000).alias("customer"),
                          (F.col("id") * 104_729 % 100_000).alias("amount_cents"),
                          F.concat(F.lit("item-"), (F.col("id") % 1000).cast("string")).alias("item")))
        expected = checksum(orders)

        step(f"3. write {args.rows:,} rows with three replicas; a bookie is SIGKILLed mid-write")
        victim_id = "bookie-2"
        victim = cluster.bookies[victim_id]
        stop_watch = threading.Event()
        hit: list[int] = []
        killer = threading.Thread(target=kill_when_writing, args=(etcd, victim, victim_id, stop_watch, hit),
                                  daemon=True)
        killer.start()
        t0 = time.monotonic()
        (orders.write.format("octavo").option("etcd", etcd).option("ensemble_size", "3")
         .option("write_quorum", "3").option("ack_quorum", "2").mode("overwrite").save("orders"))
        write_s = time.monotonic() - t0
        stop_watch.set()
        killer.join()
        from octavo.client import SyncClient

        with SyncClient(etcd) as client:
            manifest = client._loop.run(client._client.datasets.get("orders"))
            in_manifest = {x.ledger_id for x in manifest.ledgers}
            replaced = [lid for lid in hit if lid in in_manifest
                        and victim_id not in client.ledger_metadata(lid).last_ensemble]
        mib = manifest.payload_bytes / 2**20
        print(f"   committed {manifest.rows:,} rows in {len(manifest.ledgers)} ledgers ({mib:.1f} MiB of Arrow "
              f"entries) in {write_s:.1f}s; of the {len(hit)} ledgers writing to {victim_id} when it died, "
              f"{len(replaced)} replaced it (ensemble change) and went on")
        if not victim.alive():
            victim.start()
            print(f"   {victim_id} restarted")

        step("4. read it back and compare")
        t0 = time.monotonic()
        back = spark.read.format("octavo").option("etcd", etcd).load("orders")
        got = checksum(back)
        read_s = time.monotonic() - t0
        ok = got == expected
        print(f"   rows {got[0]:,} (expected {expected[0]:,}); checksum {got[1]} (expected {expected[1]}): "
              f"{'IDENTICAL' if ok else 'MISMATCH'}")

        step("5. a keyed update stream, then key compaction")
        accounts = 20_000
        load = spark.range(0, accounts, numPartitions=4).select(
            F.col("id").alias("account"), F.lit(0).cast("long").alias("version"),
            (F.col("id") * 10).alias("balance"), F.lit(False).alias("deleted"))
        load.write.format("octavo").option("etcd", etcd).option("key_column", "account").mode("overwrite") \
            .save("balances")
        for version in (1, 2):
            updates = spark.range(0, accounts, 3, numPartitions=2).select(
                F.col("id").alias("account"), F.lit(version).cast("long").alias("version"),
                (F.col("id") * 10 + version).alias("balance"), F.lit(False).alias("deleted"))
            updates.write.format("octavo").option("etcd", etcd).mode("append").save("balances")
        deletes = spark.range(0, 1000, numPartitions=1).select(
            F.col("id").alias("account"), F.lit(3).cast("long").alias("version"), F.lit(0).cast("long")
            .alias("balance"), F.lit(True).alias("deleted"))
        deletes.write.format("octavo").option("etcd", etcd).mode("append").save("balances")
        before = spark.read.format("octavo").option("etcd", etcd).load("balances").count()
        from octavo.spark.arrowio import Options
        from octavo.spark.keycompact import compact_dataset

        result = asyncio.run(compact_dataset(Options.parse({"etcd": etcd, "dataset": "balances"}),
                                             tombstone_retention_s=0))
        after = spark.read.format("octavo").option("etcd", etcd).load("balances")
        rows_after = after.count()
        per_key = after.groupBy("account").count().where("count > 1").count()
        deleted_left = after.where("account < 1000").count()
        newest_ok = after.where("account % 3 = 0 and version != 2 and account >= 1000").count() == 0
        compaction_ok = per_key == 0 and deleted_left == 0 and newest_ok and rows_after == accounts - 1000
        print(f"   {before:,} rows -> {rows_after:,} after compaction in {result.duration_s:.1f}s "
              f"({result.tombstones_dropped} tombstones dropped); one row per account: {per_key == 0}; "
              f"deleted accounts gone: {deleted_left == 0}; latest versions kept: {newest_ok}")
        spark.stop()

        step("summary")
        print(f"   write: {args.rows / write_s:,.0f} rows/s, {mib / write_s:.1f} MiB/s of entries x3 replicas "
              "(a bookie killed during it)")
        print(f"   read:  {args.rows / read_s:,.0f} rows/s")
        print(f"   read-back identical: {ok}; key compaction correct: {compaction_ok}")
    return 0 if ok and compaction_ok else 1


if __name__ == "__main__":
    sys.exit(main())
