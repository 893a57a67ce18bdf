"""A Spark job that writes a dataset into Octavo and reads it back exactly: what the e2e scenarios run, on the
emulated Kubernetes (a local process) and on kind (a Job in the octavo-spark image).

    python e2e/jobs/spark_roundtrip.py --etcd HOST:PORT[,...] --cluster NAME [--dataset NAME] [--rows N]

Exit 0 when the read-back has the same rows (count and a checksum over every column) as what was written; 1 with
a message otherwise. $OCTAVO_ETCD and $OCTAVO_CLUSTER stand in for the flags (the chart's ConfigMap sets them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--etcd", default=os.environ.get("OCTAVO_ETCD", ""))
    parser.add_argument("--cluster", default=os.environ.get("OCTAVO_CLUSTER", "default"))
    parser.add_argument("--dataset", default="e2e-orders")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    if not args.etcd:
        parser.error("--etcd (or $OCTAVO_ETCD) is required")

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("octavo-e2e-roundtrip")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(args.partitions)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        rows = spark.range(args.rows, numPartitions=args.partitions).selectExpr(
            "id as order_id", "concat('customer-', id % 97) as customer", "cast(id * 7 % 10000 as long) as cents")

        def digest(df):  # type: ignore[no-untyped-def]
            row = df.selectExpr("count(*) as n", "sum(crc32(concat_ws('|', order_id, customer, cents))) as c"
                                ).collect()[0]
            return int(row["n"]), int(row["c"] or 0)

        expected = digest(rows)
        started = time.monotonic()
        (rows.write.format("octavo").option("etcd", args.etcd).option("cluster", args.cluster)
         .option("ensemble_size", "3").option("write_quorum", "3").option("ack_quorum", "2")
         .mode("overwrite").save(args.dataset))
        wrote_s = time.monotonic() - started
        back = spark.read.format("octavo").option("etcd", args.etcd).option("cluster", args.cluster).load(
            args.dataset)
        got = digest(back)
    finally:
        spark.stop()
    if got != expected:
        print(f"spark roundtrip: read back {got[0]} rows (checksum {got[1]}), wrote {expected[0]} "
              f"(checksum {expected[1]})", file=sys.stderr)
        return 1
    print(f"ok: dataset {args.dataset}: wrote {expected[0]} rows in {wrote_s:.1f} s and read them back identical",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
