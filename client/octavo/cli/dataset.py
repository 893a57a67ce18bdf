"""`octavo dataset ls|show|compact|drop|gc --etcd HOST:PORT`: datasets written by the Spark data source.

    octavo dataset ls      --etcd E [--cluster C] [--json]
    octavo dataset show NAME --etcd E [--json]
    octavo dataset compact NAME --etcd E [--slots N] [--tombstone-column C] [--tombstone-retention-s S] [--json]
                               [--spark [--spark-master M]]    both passes as Spark jobs
    octavo dataset drop NAME --etcd E
    octavo dataset gc NAME --etcd E [--grace-s S]        delete ledgers no manifest references (orphans)

`compact` keeps the latest row per key of a keyed dataset (needs the `spark` extra: pyarrow).
Exit codes: 0 success, 1 the operation failed (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import asyncio
import json
import sys
from argparse import Namespace
from dataclasses import asdict
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dataset", help="list, show, compact and drop datasets")
    dsub = p.add_subparsers(dest="dataset_cmd", required=True)
    for name, help_text in (("ls", "list datasets"), ("show", "show a dataset's manifest"),
                            ("compact", "key compaction: keep the latest row per key"),
                            ("drop", "delete a dataset and its ledgers"),
                            ("gc", "delete the dataset's ledgers that no manifest references")):
        c = dsub.add_parser(name, help=help_text)
        if name != "ls":
            c.add_argument("name")
        c.add_argument("--etcd", required=True, help="etcd endpoints host:port[,host:port...]")
        c.add_argument("--cluster", default="default")
        c.add_argument("--json", action="store_true", help="print JSON")
        if name == "compact":
            from octavo.client.dataset import KEY_MAP_SLOTS_DEFAULT, TOMBSTONE_RETENTION_S_DEFAULT

            c.add_argument("--slots", type=int, default=KEY_MAP_SLOTS_DEFAULT,
                           help="offset-map slots (24 bytes each; a key collision only keeps a duplicate)")
            c.add_argument("--tombstone-column", default="deleted", help="boolean column marking deletes")
            c.add_argument("--tombstone-retention-s", type=float, default=TOMBSTONE_RETENTION_S_DEFAULT,
                           help="tombstones are dropped once older than this")
            c.add_argument("--password", default="", help="the dataset's ledger password")
            c.add_argument("--spark", action="store_true",
                           help="run both passes as Spark jobs, one task per ledger (for large datasets)")
            c.add_argument("--spark-master", default="local[2]", help="the Spark master for --spark")
        if name == "gc":
            c.add_argument("--grace-s", type=float, default=3600.0, help="only ledgers older than this")


def run(args: Namespace) -> int:
    from octavo.client.errors import OctavoError

    try:
        out = asyncio.run(_run(args))
    except (OctavoError, ValueError) as e:
        print(f"octavo dataset {args.dataset_cmd}: {e}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(out, indent=2))
    elif isinstance(out, dict) and "text" in out:
        print(out["text"])
    return EXIT_OK


async def _run(args: Namespace) -> Any:
    from octavo.client.client import Client

    async with Client(args.etcd, args.cluster) as client:
        cmd = args.dataset_cmd
        if cmd == "ls":
            names = await client.datasets.names()
            return names if args.json else {"text": "\n".join(names)}
        if cmd == "show":
            m = await client.datasets.get(args.name)
            if args.json:
                return asdict(m)
            return {"text": (f"dataset {m.name} (version {m.version}): {m.rows} rows in {len(m.ledgers)} ledgers, "
                             f"{m.payload_bytes / 2**20:.1f} MiB; key column {m.key_column or '-'}; streams "
                             f"{m.streams or '-'}\nschema {m.schema}")}
        if cmd == "drop":
            ids = await client.datasets.drop(args.name)
            return {"dropped": args.name, "ledgers": ids, "text": f"dropped {args.name} ({len(ids)} ledgers)"}
        if cmd == "gc":
            doomed = await client.datasets.collect_orphans(args.name, await client.all_ledger_metadata(), args.grace_s)
            return {"deleted": doomed, "text": f"deleted {len(doomed)} orphan ledgers"}
        assert cmd == "compact"
        from octavo.spark.arrowio import Options
        from octavo.spark.keycompact import compact_dataset

        opts = Options.parse({"etcd": args.etcd, "cluster": args.cluster, "dataset": args.name,
                              "password": args.password})
        if args.spark:
            r = await asyncio.get_running_loop().run_in_executor(None, _compact_with_spark, args, opts)
        else:
            r = await compact_dataset(opts, slots=args.slots, tombstone_column=args.tombstone_column,
                                      tombstone_retention_s=args.tombstone_retention_s)
        return {**asdict(r), "text": (f"compacted {r.dataset}: {r.rows_before} rows in {r.ledgers_before} ledgers -> "
                                      f"{r.rows_after} rows in {r.ledgers_after}; {r.tombstones_dropped} tombstones "
                                      f"dropped; {r.duration_s:.1f}s")}


def _compact_with_spark(args: Namespace, opts: Any) -> Any:
    import os

    from octavo.spark.keycompact import compact_with_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(args.spark_master).appName(f"octavo-compact-{args.name}")
    if args.spark_master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.ui.enabled", "false"))
    spark = builder.getOrCreate()
    try:
        return compact_with_spark(spark, opts, slots=args.slots, tombstone_column=args.tombstone_column,
                                  tombstone_retention_s=args.tombstone_retention_s)
    finally:
        spark.stop()
