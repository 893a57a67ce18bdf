"""`octavo dataset ls|show|compact|drop|gc --etcd HOST:PORT`: datasets written by the Spark data source.

Every command finds etcd with --etcd, OCTAVO_ETCD or --data-dir of a dev cluster (see `octavo ledger`).

    octavo dataset ls      --etcd E [--cluster C] [--json]
    octavo dataset show NAME --etcd E [--json]
    octavo dataset history NAME --etcd E [--json]    the commits the log keeps (the retention period)
    octavo dataset compact NAME --etcd E [--merge] [--target-bytes B] [--small-bytes B] [--budget-bytes B]
                               [--slots N] [--tombstone-column C] [--tombstone-retention-s S] [--json]
                               [--spark [--spark-master M]]    both passes as Spark jobs
    octavo dataset drop NAME --etcd E [--yes]           asks first on a terminal
    octavo dataset gc NAME --etcd E [--grace-s S]        delete ledgers no manifest references (orphans)

`compact` on a dataset without a key column merges its small ledgers (adjacent ledgers under --small-bytes,
half the target by default) into ledgers of up to --target-bytes, copying at most --budget-bytes
(octavo.client.datasetmerge; no pyarrow needed). On a keyed dataset it keeps the latest row per key (key
compaction, needs the `spark` extra: pyarrow); with --merge it merges small ledgers instead.
`ls` reads only each dataset's head (its counts), never its list of ledgers.
Exit codes: 0 success, 1 the operation failed (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from argparse import Namespace
from dataclasses import asdict
from typing import Any

from octavo.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    add_etcd_arguments,
    add_password_arguments,
    cluster_client,
    confirm,
    fmt_age,
    fmt_bytes,
    non_negative_int,
    positive_float,
    print_json,
    resolve_password,
    resolve_target,
    table,
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dataset", help="list, show, compact and drop datasets")
    dsub = p.add_subparsers(dest="dataset_cmd", required=True)
    for name, help_text in (("ls", "list datasets"), ("show", "show a dataset's manifest"),
                            ("history", "list the commits the dataset's log keeps"),
                            ("compact", "merge small ledgers; on a keyed dataset, keep the latest row per key"),
                            ("drop", "delete a dataset and its ledgers"),
                            ("gc", "delete the dataset's ledgers that no manifest references")):
        c = dsub.add_parser(name, help=help_text)
        if name != "ls":
            c.add_argument("name")
        add_etcd_arguments(c)
        c.add_argument("--json", action="store_true", help="print JSON")
        if name == "drop":
            c.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        if name == "compact":
            from octavo.client.dataset import KEY_MAP_SLOTS_DEFAULT, TOMBSTONE_RETENTION_S_DEFAULT
            from octavo.client.datasetmerge import MERGE_BUDGET_BYTES_DEFAULT, MERGE_TARGET_BYTES_DEFAULT

            c.add_argument("--merge", action="store_true",
                           help="merge small ledgers, also on a keyed dataset (without a key column it is the default)")
            c.add_argument("--target-bytes", type=non_negative_int, default=MERGE_TARGET_BYTES_DEFAULT,
                           help="a merged ledger holds at most this many payload bytes")
            c.add_argument("--small-bytes", type=non_negative_int, default=None,
                           help="ledgers under this many bytes are merged (default: half of --target-bytes)")
            c.add_argument("--budget-bytes", type=non_negative_int, default=MERGE_BUDGET_BYTES_DEFAULT,
                           help="copy at most this many bytes in this run (run again for the rest)")
            c.add_argument("--slots", type=int, default=KEY_MAP_SLOTS_DEFAULT,
                           help="offset-map slots (24 bytes each; a key collision only keeps a duplicate)")
            c.add_argument("--tombstone-column", default="deleted", help="boolean column marking deletes")
            c.add_argument("--tombstone-retention-s", type=positive_float, default=TOMBSTONE_RETENTION_S_DEFAULT,
                           help="tombstones are dropped once older than this")
            add_password_arguments(c)
            c.add_argument("--spark", action="store_true",
                           help="run both passes as Spark jobs, one task per ledger (for large datasets)")
            c.add_argument("--spark-master", default="local[2]", help="the Spark master for --spark")
        if name == "gc":
            c.add_argument("--grace-s", type=positive_float, default=3600.0,
                           help="only ledgers older than this many seconds (a write still running has not "
                                "committed yet)")


def run(args: Namespace) -> int:
    from octavo.meta.errors import OctavoError

    try:
        out = asyncio.run(_run(args))
    except CliError as e:
        print(f"octavo dataset {args.dataset_cmd}: {e}", file=sys.stderr)
        return e.code
    except (OctavoError, ValueError) as e:
        print(f"octavo dataset {args.dataset_cmd}: {e}", file=sys.stderr)
        return EXIT_FAILED
    text = out.pop("text", None)
    if args.json:
        print_json(out)
    elif text:
        print(text)
    return EXIT_OK


def _schema_text(schema_json: str) -> str:
    """A Spark schema (StructType JSON) as one `name: type` line per column."""
    try:
        fields = json.loads(schema_json).get("fields", [])
    except (ValueError, AttributeError):
        return schema_json
    lines = []
    for f in fields:
        kind = f.get("type")
        kind = kind if isinstance(kind, str) else json.dumps(kind, separators=(",", ":"))
        lines.append(f"  {f.get('name')}: {kind}{'' if f.get('nullable', True) else ' not null'}")
    return "\n".join(lines)


async def _run(args: Namespace) -> dict[str, Any]:
    async with cluster_client(args) as client:
        cmd = args.dataset_cmd
        if cmd == "ls":
            now = time.time()
            heads = [await client.datasets.head(n) for n in await client.datasets.names()]
            rows = [{"name": h.name, "version": h.version, "ledgers": h.ledger_count, "rows": h.rows,
                     "payload_bytes": h.payload_bytes, "key_column": h.key_column or None,
                     "updated_unix_ms": h.updated_unix_ms} for h in heads]
            text = table(["DATASET", "VERSION", "LEDGERS", "ROWS", "SIZE", "KEY", "UPDATED"], [
                [r["name"], str(r["version"]), str(r["ledgers"]), str(r["rows"]), fmt_bytes(r["payload_bytes"]),
                 r["key_column"] or "-",
                 fmt_age(now - r["updated_unix_ms"] / 1000) + " ago" if r["updated_unix_ms"] else "-"]
                for r in rows]) if rows else "(no datasets)"
            return {"datasets": rows, "text": text}
        if cmd == "history":
            commits = await client.datasets.history(args.name)
            text = table(["VERSION", "TIME", "OPERATION", "STREAM", "+LEDGERS", "+ROWS", "-LEDGERS", "-ROWS"], [
                [str(c["version"]), time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(c["unix_ms"] / 1000)),
                 c["operation"] + (" (schema)" if c["schema_changed"] else ""),
                 f"{c['stream'][0]}@{c['stream'][1]}" if c["stream"] else "-", str(c["ledgers_added"]),
                 "-" if c["rows_added"] is None else str(c["rows_added"]),
                 "-" if c["ledgers_removed"] is None else str(c["ledgers_removed"]),
                 "-" if c["rows_removed"] is None else str(c["rows_removed"])]
                for c in commits]) if commits else "(no commits kept)"
            return {"commits": commits, "text": text}
        if cmd == "show":
            m = await client.datasets.get(args.name)
            return {**asdict(m), "rows": m.rows, "payload_bytes": m.payload_bytes, "text": (
                f"dataset {m.name} (version {m.version}): {m.rows} rows in {len(m.ledgers)} ledgers, "
                f"{fmt_bytes(m.payload_bytes)}; key column {m.key_column or '-'}; streams "
                f"{', '.join(f'{k} at batch {v}' for k, v in m.streams.items()) or '-'}\n"
                f"schema\n{_schema_text(m.schema)}")}
        if cmd == "drop":
            m = await client.datasets.get(args.name)
            confirm(f"drop dataset {m.name}: {len(m.ledgers)} ledgers, {m.rows} rows, {fmt_bytes(m.payload_bytes)}",
                    args.yes)
            ids = await client.datasets.drop(args.name)
            return {"dropped": args.name, "ledgers": ids, "text": f"dropped {args.name} ({len(ids)} ledgers)"}
        if cmd == "gc":
            from octavo.client.dataset import NoSuchDatasetError

            manifest, _ = await client.datasets.read(args.name)
            if manifest is None and not await client.datasets.has_ledgers(args.name):
                raise NoSuchDatasetError(f"dataset {args.name!r} does not exist and no ledger was written for it")
            doomed = await client.datasets.collect_orphans(args.name, args.grace_s)
            return {"deleted": doomed, "text": f"deleted {len(doomed)} orphan ledgers"}
        assert cmd == "compact"
        head = await client.datasets.head(args.name)
        if args.merge or not head.key_column:
            return await _merge(client, args)
        from octavo.spark.arrowio import Options
        from octavo.spark.keycompact import compact_dataset

        target = resolve_target(args)
        assert target is not None
        opts = Options.parse({"etcd": target.etcd, "cluster": target.cluster, "dataset": args.name,
                              "password": resolve_password(args).decode(errors="surrogateescape")})
        if args.spark:
            r = await asyncio.get_running_loop().run_in_executor(None, _compact_with_spark, args, opts)
        else:
            r = await compact_dataset(opts, slots=args.slots, tombstone_column=args.tombstone_column,
                                      tombstone_retention_s=args.tombstone_retention_s)
        return {"operation": "key compaction", **asdict(r),
                "text": (f"compacted {r.dataset}: {r.rows_before} rows in {r.ledgers_before} ledgers -> "
                         f"{r.rows_after} rows in {r.ledgers_after}; {r.tombstones_dropped} tombstones "
                         f"dropped; {r.duration_s:.1f}s")}


async def _merge(client: Any, args: Namespace) -> dict[str, Any]:
    from octavo.client.datasetmerge import merge_dataset

    small = args.small_bytes
    if small is not None and small > args.target_bytes:
        raise CliError(f"--small-bytes ({small}) must be at most --target-bytes ({args.target_bytes})", EXIT_USAGE)
    r = await merge_dataset(client, args.name, target_bytes=args.target_bytes, small_bytes=small,
                            budget_bytes=args.budget_bytes)
    out = {"operation": "merge", **asdict(r)}
    text = (f"merged {r.dataset}: {r.ledgers_merged} small ledgers into {r.merges} ({fmt_bytes(r.bytes_merged)}, "
            f"{r.rows_merged} rows); {r.ledgers_before} ledgers -> {r.ledgers_after}; {r.duration_s:.1f}s")
    if r.abandoned:
        text += f"; {r.abandoned} merges abandoned (an overwrite or another merge replaced their ledgers first)"
    if not r.merges and not r.abandoned:
        text = f"merged {r.dataset}: nothing to merge ({r.ledgers_before} ledgers, none in a run of small ones)"
    return {**out, "text": text}


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
