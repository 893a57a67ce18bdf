"""Datasets that live for months (issue 39): commit cost against the dataset's size, concurrent committers, a
long streaming query, merging small ledgers, and planning a read over many small ledgers.

Parts (--part, comma-separated; default all), each on a fresh local cluster (etcd and bookies as real processes):

  commits     --commits one-ledger appends into one dataset, one after the other from one client. The ledgers
              are fake DatasetLedger entries (ids no ledger has): a commit does not read its ledgers, only etcd.
              The log is folded into checkpoints the way the auditor's maintenance does it: a separate process
              calls `DatasetStore.checkpoint(name)` (threshold CHECKPOINT_EVERY_COMMITS) as often as it can.
              etcd compaction is off on this cluster, so the etcd figures are before compaction. Commit p50/p99
              over windows of commits around 1,000, 10,000 and 100,000; etcd bytes per commit (the key and value
              bytes of the head and the log record it wrote, read back; checkpoints' bytes amortized; and dbSize
              growth). Beside it, on its own cluster, the format before (one manifest value with every ledger,
              rewritten whole with a CAS per commit) for --old-commits commits.
  contention  --processes (e.g. 16,8) processes, each with its own Client, appending --per-process one-ledger
              commits to one dataset at once: failed commits, p50/p99, commits/s; every commit present once.
  stream      a Spark streaming query: rate source (--rows-per-s) `.repartition(--stream-partitions)` into the
              octavo sink, trigger --trigger-s; runs --micro-batches or until --stop-at (UTC HH:MM). A query that
              fails is counted and restarted from its checkpoint. Then a batch read (count, distinct count, min,
              max of `value`) before and after a merge (`merge_dataset`).
  merge       --merge-ledgers real small ledgers (150 rows of Arrow IPC each, committed 64 per commit), then
              `merge_dataset` with its defaults: ledgers/s and MB/s; rows read back before and after.
  plan        --plan-ledgers fake ledgers (entries=1, 2 KB) committed 1,000 per commit, then the time to plan a
              read: OctavoReader.partitions() and Spark's `load(name).rdd.getNumPartitions()`.

Each part's results are kept in --results (JSON), and the `datasets` section of docs/benchmarks.md is written from
every part found there, so parts can be run separately.

Usage: python bench/dataset_bench.py [--part commits,contention,stream,merge,plan] [--quick] [--stop-at 03:25]
       [--micro-batches 2000] [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, table, write_section

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.client.dataset import (
    CHECKPOINT_EVERY_COMMITS,
    CHECKPOINT_FORCED_COMMITS,
    META_DATASET,
    META_WRITE,
    DatasetLedger,
    Manifest,
)
from octavo.meta.etcd import EtcdClient

PARTS = ("commits", "contention", "stream", "merge", "plan")
BOOKIES = 3
SCHEMA = json.dumps({"type": "struct", "fields": [{"name": "value", "type": "long", "nullable": True,
                                                   "metadata": {}}]}, separators=(",", ":"))
FAKE_ID_BASE = 1 << 40  # fake ledger ids: no ledger has them (ids are allocated upwards from 1)
FAKE_ROWS, FAKE_BYTES = 150, 2048  # what one micro-batch partition of the stream held
WINDOW = 1000  # commits per latency window
COMMITS_TARGET_RATIO = 2.0
BYTES_PER_COMMIT_TARGET = 2048
RESULTS_DEFAULT = Path(tempfile.gettempdir()) / "octavo-dataset-bench.json"
MIB = 1 << 20


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


def fake(i: int, entries: int = 1) -> DatasetLedger:
    return DatasetLedger(FAKE_ID_BASE + i, FAKE_ROWS, FAKE_BYTES, entries)


def version_key(prefix: bytes, version: int) -> bytes:
    return prefix + str(version).zfill(20).encode()  # dataset.py's layout of log keys


def cluster(root: Path, name: str, bookies: int = BOOKIES, args: list[str] | None = None) -> LocalCluster:
    return LocalCluster(str(root / name), bookies=bookies, bookie_args=args or [], new_session=True)


def now_utc() -> str:
    return time.strftime("%H:%M:%S", time.gmtime())


# -- part 1: commits -----------------------------------------------------------------------------------------
def windows(latencies_ms: list[float], n: int) -> list[dict[str, float]]:
    out = []
    for target in (1_000, 10_000, 100_000):
        if target > n:
            continue
        lo, hi = max(0, target - WINDOW // 2), min(n, target + WINDOW // 2)
        if hi - lo < WINDOW:
            lo = max(0, hi - WINDOW)
        part = latencies_ms[lo:hi]
        out.append({"at": target, "from": lo + 1, "to": hi, "p50_ms": pct(part, 0.5), "p99_ms": pct(part, 0.99)})
    if not out or out[-1]["to"] < n:  # a short run: its last window too
        part = latencies_ms[max(0, n - WINDOW):]
        out.append({"at": n, "from": max(0, n - WINDOW) + 1, "to": n, "p50_ms": pct(part, 0.5),
                    "p99_ms": pct(part, 0.99)})
    return out


class _Forced(logging.Handler):
    """Counts the checkpoints this process's committer made itself (the log past CHECKPOINT_FORCED_COMMITS)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "checkpoint at version" in record.getMessage():
            self.count += 1


async def commits_new(endpoint: str, n: int, checkpoints: str, name: str = "commits") -> dict[str, Any]:
    forced = _Forced()
    dataset_log = logging.getLogger("octavo.client.dataset")
    dataset_log.addHandler(forced)
    dataset_log.setLevel(logging.INFO)
    async with Client(endpoint) as client, EtcdClient(endpoint) as etcd:
        store = client.datasets
        root = client.metadata_store.layout.root
        head_key, log_prefix = store.key(name), root + b"dataset-log/" + name.encode() + b"/"
        cp_prefix = root + b"dataset-checkpoints/" + name.encode() + b"/"
        status0 = await etcd.status()
        checkpointer = None
        if checkpoints == "process":
            checkpointer = subprocess.Popen([sys.executable, __file__, "worker-checkpointer", endpoint, name],
                                            stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
        latencies: list[float] = []
        written: list[int] = []
        tenths: list[float] = []  # seconds since the start at every tenth of the commits
        seen_checkpoints: set[int] = set()
        checkpoint_bytes = 0
        t_start = time.monotonic()
        for i in range(n):
            t0 = time.perf_counter()
            result = await store.commit(name, SCHEMA, [fake(i)])
            latencies.append((time.perf_counter() - t0) * 1000)
            if i % 10 == 0 and i > 0:  # what this commit wrote: the head and its log record, read back
                head_kv, rec_kv = await etcd.get(head_key), await etcd.get(version_key(log_prefix, result.version))
                if head_kv is not None and rec_kv is not None:
                    written.append(len(head_kv.key) + len(head_kv.value) + len(rec_kv.key) + len(rec_kv.value))
            cp_version = result.head.checkpoint if result.head is not None else 0
            if checkpoints == "auditor" and cp_version and cp_version not in seen_checkpoints:
                seen_checkpoints.add(cp_version)  # a new checkpoint: its key and the head it rewrote
                kv, head_kv = await etcd.get(version_key(cp_prefix, cp_version)), await etcd.get(head_key)
                checkpoint_bytes += ((len(kv.key) + len(kv.value) if kv else 0)
                                     + (len(head_kv.key) + len(head_kv.value) if head_kv else 0))
            if (i + 1) % max(1, n // 10) == 0:
                tenths.append(time.monotonic() - t_start)
                last = latencies[-min(len(latencies), WINDOW):]
                print(f"  {now_utc()} {i + 1:,} commits in {time.monotonic() - t_start:.0f}s: last {len(last)} "
                      f"p50 {pct(last, 0.5):.1f} ms p99 {pct(last, 0.99):.1f} ms; checkpoints "
                      f"{len(seen_checkpoints)} (forced {forced.count})", flush=True)
        elapsed = time.monotonic() - t_start
        final = await store.head(name)
        if checkpoints == "auditor" and final.checkpoint and final.checkpoint not in seen_checkpoints:
            seen_checkpoints.add(final.checkpoint)
            kv = await etcd.get(version_key(cp_prefix, final.checkpoint))
            checkpoint_bytes += (len(kv.key) + len(kv.value) if kv else 0) + len(head_key) + len(final.encode())
        if checkpointer is not None:
            cp = json.loads(checkpointer.communicate(input="", timeout=600)[0])  # its stdin closed: it stops
        else:
            cp = {"checkpoints": len(seen_checkpoints), "durations_s": [], "bytes": checkpoint_bytes}
        status1 = await etcd.status()
        head = await store.head(name)
        t0 = time.perf_counter()
        manifest = await store.get(name)
        get_s = time.perf_counter() - t0
        ids = [x.ledger_id for x in manifest.ledgers]
        ok = ids == [FAKE_ID_BASE + i for i in range(n)]
    dataset_log.removeHandler(forced)
    return {"commits": n, "elapsed_s": elapsed, "windows": windows(latencies, n), "checkpointing": checkpoints,
            "tenths_s": tenths,
            "p50_ms": pct(latencies, 0.5), "p99_ms": pct(latencies, 0.99), "p999_ms": pct(latencies, 0.999),
            "max_ms": max(latencies), "over_100ms": sum(1 for x in latencies if x > 100),
            "written_bytes_p50": pct([float(x) for x in written], 0.5),
            "written_bytes_max": max(written) if written else 0,
            "checkpoint_bytes_per_commit": cp["bytes"] / n, "checkpoints": cp["checkpoints"],
            "forced_checkpoints": forced.count,
            "checkpoint_p50_s": pct(cp["durations_s"], 0.5), "checkpoint_max_s": max(cp["durations_s"] or [0]),
            "db_growth_per_commit": (status1.db_size_bytes - status0.db_size_bytes) / n,
            "db_size_bytes": status1.db_size_bytes, "revisions_per_commit": (status1.revision - status0.revision) / n,
            "ledgers": head.ledger_count, "version": head.version, "checkpoint_version": head.checkpoint,
            "get_s": get_s, "all_present_in_order": ok}


async def checkpointer_worker(endpoint: str, name: str) -> None:
    """The maintenance's checkpointing, as a process of its own: while stdin is open, checkpoint the dataset
    whenever its log holds CHECKPOINT_EVERY_COMMITS records; prints what it did (JSON)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.read(1) else None)
    durations: list[float] = []
    written = 0
    async with Client(endpoint) as client, EtcdClient(endpoint) as etcd:
        store = client.datasets
        root = client.metadata_store.layout.root
        cp_prefix = root + b"dataset-checkpoints/" + name.encode() + b"/"
        while not stop.is_set():
            try:
                t0 = time.perf_counter()
                version = await store.checkpoint(name)
            except Exception as e:  # shown: a failing checkpoint is a finding
                print(f"checkpoint failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                version = None
            if version is not None:
                durations.append(time.perf_counter() - t0)
                kv, head_kv = await etcd.get(version_key(cp_prefix, version)), await etcd.get(store.key(name))
                written += (len(kv.key) + len(kv.value) if kv else 0) + (len(head_kv.key) + len(head_kv.value)
                                                                          if head_kv else 0)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
    print(json.dumps({"checkpoints": len(durations), "durations_s": durations, "bytes": written}), flush=True)


async def commits_old(endpoint: str, n: int) -> dict[str, Any]:
    """The format before (3c74a1d): one value listing every ledger, read, extended and CAS-written whole."""
    key = b"/octavo/default/bench-old-format/commits"
    latencies: list[float] = []
    written: list[int] = []
    async with EtcdClient(endpoint) as etcd:
        status0 = await etcd.status()
        for i in range(n):
            t0 = time.perf_counter()
            while True:
                kv = await etcd.get(key)
                now = int(time.time() * 1000)
                m = Manifest.decode_v1(kv.value) if kv else Manifest("commits", SCHEMA, created_unix_ms=now)
                x = fake(i)
                m.ledgers.append(DatasetLedger(x.ledger_id, x.rows, x.bytes, x.entries, m.next_seq, now))
                m.next_seq += 1
                m.version += 1
                m.updated_unix_ms = now
                value = m.encode_v1()
                if await etcd.cas_put(key, value, kv.mod_revision if kv else 0):
                    break
            latencies.append((time.perf_counter() - t0) * 1000)
            written.append(len(key) + len(value))
            if (i + 1) % max(1, n // 5) == 0:
                print(f"  old format: {i + 1:,} commits, last p50 {pct(latencies[-WINDOW:], 0.5):.1f} ms, value "
                      f"{len(value):,} bytes", flush=True)
        status1 = await etcd.status()
    return {"commits": n, "windows": windows(latencies, n), "written_bytes_mean": sum(written) / n,
            "written_bytes_last": written[-1],
            "db_growth_per_commit": (status1.db_size_bytes - status0.db_size_bytes) / n}


def part_commits(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # etcd compaction off: the etcd figures are what commits write before compaction.
    with cluster(root, "commits", args=["--etcd-compaction-interval-s", "0"]) as c:
        print(f"{now_utc()} commits: {args.commits:,} one-ledger commits (new format)", flush=True)
        out["new"] = asyncio.run(commits_new(c.etcd_endpoint, args.commits, args.checkpoints))
    if args.old_commits:
        with cluster(root, "commits-old", bookies=0) as c:
            print(f"{now_utc()} commits: {args.old_commits:,} one-ledger commits (the format before)", flush=True)
            out["old"] = asyncio.run(commits_old(c.etcd_endpoint, args.old_commits))
    return out


# -- part 2: contention ---------------------------------------------------------------------------------------
async def contention_worker(endpoint: str, name: str, index: int, count: int, start_at: float) -> None:
    latencies: list[float] = []
    failures: list[str] = []
    async with Client(endpoint) as client:
        await client.datasets.names()  # connected before the start
        await asyncio.sleep(max(0.0, start_at - time.time()))
        t_start = time.time()
        for i in range(count):
            t0 = time.perf_counter()
            try:
                await client.datasets.commit(name, SCHEMA, [fake(index * 1_000_000 + i)])
                latencies.append((time.perf_counter() - t0) * 1000)
            except Exception as e:  # counted: the figure is failures
                failures.append(f"{type(e).__name__}: {e}")
        t_end = time.time()
    print(json.dumps({"latencies_ms": latencies, "failures": failures, "start": t_start, "end": t_end}), flush=True)


async def contention_check(endpoint: str, name: str, procs: int, count: int) -> dict[str, Any]:
    async with Client(endpoint) as client:
        manifest = await client.datasets.get(name)
    ids = [x.ledger_id for x in manifest.ledgers]
    expected = {FAKE_ID_BASE + p * 1_000_000 + i for p in range(procs) for i in range(count)}
    return {"ledgers": len(ids), "each_once": len(ids) == len(set(ids)) and set(ids) == expected,
            "seqs_distinct": len({x.seq for x in manifest.ledgers}) == len(ids)}


def part_contention(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with cluster(root, "contention") as c:
        for procs in args.processes:
            name = f"contention{procs}"
            start_at = time.time() + 3 + procs * 0.4
            running = [subprocess.Popen([sys.executable, __file__, "worker-contention", c.etcd_endpoint, name,
                                         str(p), str(args.per_process), str(start_at)], stdout=subprocess.PIPE,
                                        text=True) for p in range(procs)]
            outputs = [json.loads(p.communicate(timeout=1800)[0]) for p in running]
            latencies = [x for o in outputs for x in o["latencies_ms"]]
            failures = [f for o in outputs for f in o["failures"]]
            seconds = max(o["end"] for o in outputs) - min(o["start"] for o in outputs)
            check = asyncio.run(contention_check(c.etcd_endpoint, name, procs, args.per_process))
            out[str(procs)] = {"processes": procs, "per_process": args.per_process,
                               "attempted": procs * args.per_process,
                               "landed": len(latencies), "failed": len(failures),
                               "first_failure": failures[0][:300] if failures else "",
                               "p50_ms": pct(latencies, 0.5), "p99_ms": pct(latencies, 0.99),
                               "max_ms": max(latencies or [0.0]), "per_s": len(latencies) / seconds, **check}
            print(f"{now_utc()} contention {procs} processes: {out[str(procs)]}", flush=True)
    return out


# -- Spark ------------------------------------------------------------------------------------------------------
def spark_session(checkpoints: Path) -> Any:
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("octavo-dataset-bench")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", "2g")
               .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
               .config("spark.sql.streaming.checkpointLocation", str(checkpoints))
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def scan(spark: Any, endpoint: str, name: str) -> dict[str, Any]:
    """count, distinct count, min and max of `value` in a batch read of the whole dataset."""
    t0 = time.perf_counter()
    # Only `value`: a read that includes the rate source's TimestampType column fails in OctavoReader
    # (pyspark's to_arrow_schema needs a time zone for timestamps and the source passes none).
    row = (spark.read.format("octavo").option("etcd", endpoint).option("columns", "value").load(name)
           .selectExpr("count(*)", "count(distinct value)", "min(value)", "max(value)").collect()[0])
    count, distinct, lo, hi = (int(x) if x is not None else -1 for x in row)
    return {"rows": count, "distinct": distinct, "min": lo, "max": hi, "seconds": time.perf_counter() - t0,
            "exactly_once": count == distinct and (count == 0 or (lo == 0 and hi == count - 1))}


async def dataset_facts(endpoint: str, name: str) -> dict[str, Any]:
    async with Client(endpoint) as client, EtcdClient(endpoint) as etcd:
        head = await client.datasets.head(name)
        st = await etcd.status()
        return {"ledgers": head.ledger_count, "rows": head.rows, "version": head.version,
                "payload_bytes": head.payload_bytes, "db_size_bytes": st.db_size_bytes,
                "db_size_in_use_bytes": st.db_size_in_use_bytes}


async def merge(endpoint: str, name: str) -> dict[str, Any] | None:
    try:
        from octavo.client.datasetmerge import merge_dataset
    except ImportError:
        return None
    async with Client(endpoint) as client:
        t0 = time.perf_counter()
        results = []
        while True:  # one call copies at most its budget; the maintenance calls it again each interval
            r = await merge_dataset(client, name)
            results.append(r)
            if not r.merges:
                break
        seconds = time.perf_counter() - t0
    merged = sum(r.ledgers_merged for r in results)
    nbytes = sum(r.bytes_merged for r in results)
    return {"calls": len(results), "merges": sum(r.merges for r in results), "ledgers_merged": merged,
            "bytes_merged": nbytes, "abandoned": sum(r.abandoned for r in results), "seconds": seconds,
            "ledgers_per_s": merged / seconds, "mb_per_s": nbytes / MIB / seconds,
            "ledgers_before": results[0].ledgers_before, "ledgers_after": results[-1].ledgers_after}


# -- part 3: a streaming query -------------------------------------------------------------------------------
def batch_durations(progress: list[dict[str, Any]]) -> list[tuple[int, float, int]]:
    """(batch id, triggerExecution ms, input rows) of every micro-batch that ran."""
    return [(int(p["batchId"]), float(p["durationMs"].get("triggerExecution", 0)), int(p["numInputRows"]))
            for p in progress if p.get("durationMs", {}).get("addBatch") is not None]


def part_stream(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    name = "stream"
    stop_at = deadline(args.stop_at)
    out: dict[str, Any] = {"rows_per_s": args.rows_per_s, "partitions": args.stream_partitions,
                           "trigger_s": args.trigger_s, "micro_batches_asked": args.micro_batches,
                           "stop_at": args.stop_at}
    with cluster(root, "stream", bookies=4) as c:
        spark = spark_session(root / "spark-checkpoints")
        checkpoint = str(root / "stream-checkpoint")
        failures: list[str] = []
        progress: list[dict[str, Any]] = []
        early: dict[str, Any] | None = None
        samples: list[dict[str, Any]] = []
        next_sample = 100
        t_start = time.monotonic()
        done = 0
        while done < args.micro_batches and time.time() < stop_at:
            source = (spark.readStream.format("rate").option("rowsPerSecond", args.rows_per_s).load()
                      .repartition(args.stream_partitions))
            query = (source.writeStream.format("octavo").option("etcd", c.etcd_endpoint)
                     .option("checkpointLocation", checkpoint).option("stream_id", "bench")
                     .trigger(processingTime=f"{args.trigger_s} seconds").start(name))
            try:
                while query.isActive:
                    time.sleep(2)
                    last = query.lastProgress
                    if last is not None:
                        done = int(last["batchId"]) + 1
                    if early is None and done >= min(50, args.micro_batches):
                        early = asyncio.run(dataset_facts(c.etcd_endpoint, name))
                        early["batches"] = done
                    if done >= next_sample:
                        facts = asyncio.run(dataset_facts(c.etcd_endpoint, name))
                        samples.append({"batches": done, "minutes": (time.monotonic() - t_start) / 60, **facts})
                        next_sample = done + 100
                        print(f"  {now_utc()} {done} micro-batches: {facts}", flush=True)
                    if done >= args.micro_batches or time.time() >= stop_at:
                        break
            finally:
                progress += [json.loads(p.json) for p in query.recentProgress]
                error = query.exception()
                query.stop()
            if error is not None:
                failures.append(str(error)[:500])
                print(f"  {now_utc()} the query failed ({len(failures)}): {str(error)[:300]}", flush=True)
                if len(failures) >= 10:
                    break
        elapsed = time.monotonic() - t_start
        batches = sorted({b: (b, ms, rows) for b, ms, rows in batch_durations(progress)}.values())
        first, last = batches[:50], batches[-50:]
        out.update({"micro_batches": len(batches), "elapsed_s": elapsed, "failures": len(failures),
                    "failure_messages": failures[:3], "input_rows": sum(x[2] for x in batches),
                    "first50_p50_ms": pct([x[1] for x in first], 0.5),
                    "first50_p99_ms": pct([x[1] for x in first], 0.99),
                    "last50_p50_ms": pct([x[1] for x in last], 0.5), "last50_p99_ms": pct([x[1] for x in last], 0.99),
                    "all_p50_ms": pct([x[1] for x in batches], 0.5), "all_p99_ms": pct([x[1] for x in batches], 0.99),
                    "early": early, "end": asyncio.run(dataset_facts(c.etcd_endpoint, name)), "samples": samples})
        logs = [Path(b.log_path).read_text(errors="replace") for b in c.bookies.values()]
        out["auditor_merges"] = sum(t.count(f"dataset {name}: merged") for t in logs)
        out["auditor_checkpoints"] = sum(t.count(f"dataset {name}: checkpoint at version") for t in logs)
        print(f"{now_utc()} stream: {out}", flush=True)
        out["read_before_merge"] = scan(spark, c.etcd_endpoint, name)
        print(f"{now_utc()} read before merge: {out['read_before_merge']}", flush=True)
        if args.stream_merge:
            out["merge"] = asyncio.run(merge(c.etcd_endpoint, name))
            print(f"{now_utc()} merge: {out['merge']}", flush=True)
            if out["merge"] is not None:
                out["after_merge"] = asyncio.run(dataset_facts(c.etcd_endpoint, name))
                out["read_after_merge"] = scan(spark, c.etcd_endpoint, name)
                print(f"{now_utc()} read after merge: {out['read_after_merge']}", flush=True)
        spark.stop()
    return out


def deadline(hhmm: str) -> float:
    if not hhmm:
        return float("inf")
    h, m = (int(x) for x in hhmm.split(":"))
    now = time.time()
    t = now - now % 86400 + h * 3600 + m * 60
    return t if t > now else t + 86400


# -- part 4: merge throughput and read planning ----------------------------------------------------------------
async def write_small_ledgers(endpoint: str, name: str, n: int, per_commit: int = 64) -> dict[str, Any]:
    """n real ledgers of 150 rows each (one Arrow IPC entry of about 2 KB, like one partition of a micro-batch of
    the issue's stream), committed per_commit at a time."""
    import pyarrow as pa

    from octavo.spark.arrowio import encode_entries

    write_id = os.urandom(8).hex()
    sem = asyncio.Semaphore(32)
    t0 = time.perf_counter()
    async with Client(endpoint) as client:
        async def one(i: int) -> DatasetLedger:
            batch = pa.record_batch([pa.array(range(i * FAKE_ROWS, (i + 1) * FAKE_ROWS), pa.int64())], ["value"])
            entries = list(encode_entries(batch, 8192, "lz4"))
            async with sem:
                handle = await client.create_ledger(3, 3, 2, password=b"",
                                                    metadata={META_DATASET: name, META_WRITE: write_id})
                await handle.append_many([data for data, _ in entries])
                await handle.close()
            return DatasetLedger(int(handle.ledger_id), FAKE_ROWS, sum(len(d) for d, _ in entries), len(entries))

        for start in range(0, n, per_commit):
            ledgers = await asyncio.gather(*(one(i) for i in range(start, min(n, start + per_commit))))
            await client.datasets.commit(name, SCHEMA, list(ledgers))
    return {"ledgers": n, "write_s": time.perf_counter() - t0}


def read_rows(endpoint: str, name: str) -> dict[str, Any]:
    """Every row of the dataset through the source's reader (no Spark): count, distinct count, exactly once."""
    from pyspark.sql.types import StructType

    from octavo.spark.arrowio import Options
    from octavo.spark.source import OctavoReader

    reader = OctavoReader(Options.parse({"etcd": endpoint, "path": name}), StructType.fromJson(json.loads(SCHEMA)))
    values: list[int] = []
    t0 = time.perf_counter()
    parts = reader.partitions()
    for p in parts:
        for batch in reader.read(p):
            values += batch.column(0).to_pylist()
    return {"rows": len(values), "distinct": len(set(values)), "partitions": len(parts),
            "exactly_once": sorted(values) == list(range(len(values))), "seconds": time.perf_counter() - t0}


def part_merge(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    name = "merge"
    # The auditor's maintenance off: it would merge the ledgers while they are written, under the measure.
    with cluster(root, "merge", args=["--dataset-maintenance-interval-s", "0"]) as c:
        print(f"{now_utc()} merge: writing {args.merge_ledgers:,} small ledgers", flush=True)
        out: dict[str, Any] = {"written": asyncio.run(write_small_ledgers(c.etcd_endpoint, name, args.merge_ledgers))}
        out["before"] = asyncio.run(dataset_facts(c.etcd_endpoint, name))
        out["read_before"] = read_rows(c.etcd_endpoint, name)
        print(f"{now_utc()} merge: before {out['before']} {out['read_before']}", flush=True)
        out["merge"] = asyncio.run(merge(c.etcd_endpoint, name))
        print(f"{now_utc()} merge: {out['merge']}", flush=True)
        if out["merge"] is not None:
            out["after"] = asyncio.run(dataset_facts(c.etcd_endpoint, name))
            out["read_after"] = read_rows(c.etcd_endpoint, name)
            print(f"{now_utc()} merge: after {out['after']} {out['read_after']}", flush=True)
    return out


async def commit_fake_many(endpoint: str, name: str, n: int, per_commit: int = 1000) -> float:
    t0 = time.perf_counter()
    async with Client(endpoint) as client:
        for start in range(0, n, per_commit):
            await client.datasets.commit(name, SCHEMA, [fake(i) for i in range(start, min(n, start + per_commit))])
        await client.datasets.checkpoint(name, 1)  # as the maintenance leaves a long-lived dataset
    return time.perf_counter() - t0


def part_plan(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql.types import StructType

    from octavo.spark.arrowio import Options
    from octavo.spark.source import OctavoReader

    name = "plan"
    out: dict[str, Any] = {"ledgers": args.plan_ledgers}
    with cluster(root, "plan", args=["--dataset-maintenance-interval-s", "0"]) as c:
        out["commit_s"] = asyncio.run(commit_fake_many(c.etcd_endpoint, name, args.plan_ledgers))
        reader = OctavoReader(Options.parse({"etcd": c.etcd_endpoint, "path": name}),
                              StructType.fromJson(json.loads(SCHEMA)))
        took = []
        for _ in range(3):
            t0 = time.perf_counter()
            parts = reader.partitions()
            took.append(time.perf_counter() - t0)
        out.update({"reader_s": sorted(took)[1], "partitions": len(parts),
                    "max_ledgers_per_partition": max(len(p.pieces) for p in parts)})
        print(f"{now_utc()} plan: {out}", flush=True)
        if not args.no_spark_plan:
            spark = spark_session(root / "plan-spark")
            took = []
            for _ in range(3):
                t0 = time.perf_counter()
                n = spark.read.format("octavo").option("etcd", c.etcd_endpoint).load(name).rdd.getNumPartitions()
                took.append(time.perf_counter() - t0)
            out.update({"spark_s": sorted(took)[1], "spark_partitions": n})
            spark.stop()
            print(f"{now_utc()} plan (Spark): {out}", flush=True)
    return out


# -- the report ----------------------------------------------------------------------------------------------
def report(results: dict[str, Any]) -> str:
    lines = ["## Datasets: commits, contention, a long stream, merging, planning (bench/dataset_bench.py)", "",
             "Issue 39's figures. Each part on a fresh local cluster (etcd and bookies as real processes, 3 bookies; "
             "the stream 4) on a shared 2-core machine (other engineers' tests ran beside it: see each part's load "
             "average). Ratios are measured within one run."]
    r = results.get("commits")
    if r:
        new, old = r["data"]["new"], r["data"].get("old")
        w = new["windows"]
        ratio = w[-1]["p50_ms"] / w[0]["p50_ms"]
        total_bytes = new["written_bytes_p50"] + new["checkpoint_bytes_per_commit"]
        rows = [[f"{x['at']:,} (commits {x['from']:,}-{x['to']:,})", f"{x['p50_ms']:.1f}", f"{x['p99_ms']:.1f}"]
                for x in w]
        lines += ["", f"### {new['commits']:,} one-ledger commits into one dataset", "",
                  f"{r['machine']}. `{r['command']}`. One client commits one ledger per commit, one commit after "
                  "the other. The ledgers are fake `DatasetLedger` entries (ids no ledger has): a commit reads and "
                  "writes etcd only, never its ledgers. " + (
                      "Checkpointing as in production: the bookies' elected auditor runs its dataset maintenance "
                      "(every dataset_maintenance_interval_s = 60 s, it folds a log of at least "
                      f"CHECKPOINT_EVERY_COMMITS = {CHECKPOINT_EVERY_COMMITS} records into a checkpoint), and a "
                      "committer folds the log itself, inside its commit, once it reaches "
                      f"CHECKPOINT_FORCED_COMMITS = {CHECKPOINT_FORCED_COMMITS} records (at this commit rate that is "
                      "most checkpoints: their time is in the commit latencies)."
                      if new.get("checkpointing") == "auditor" else
                      "Checkpointing from a separate process calling `DatasetStore.checkpoint(name)` in a loop (it "
                      f"folds the log once it holds CHECKPOINT_EVERY_COMMITS = {CHECKPOINT_EVERY_COMMITS} records); "
                      "a committer folds it itself past CHECKPOINT_FORCED_COMMITS = "
                      f"{CHECKPOINT_FORCED_COMMITS}.") + " etcd compaction is off on this cluster: the etcd figures "
                  "are before compaction.",
                  "", table(["window", "commit p50 ms", "commit p99 ms"], rows), "",
                  f"p50 at {w[-1]['at']:,} / p50 at {w[0]['at']:,}: **{ratio:.2f}x** (target: within "
                  f"{COMMITS_TARGET_RATIO:.0f}x: {'met' if ratio <= COMMITS_TARGET_RATIO else 'NOT met'}). "
                  f"{new['commits']:,} commits in {new['elapsed_s']:.0f} s; p99.9 {new.get('p999_ms', 0):.0f} ms, "
                  f"slowest {new['max_ms']:.0f} ms, {new.get('over_100ms', 0)} commits over 100 ms"
                  + (f"; {new['commits'] / 10 / new['tenths_s'][0]:.0f} commits/s over the first tenth, "
                     f"{new['commits'] / 10 / (new['tenths_s'][-1] - new['tenths_s'][-2]):.0f} over the last"
                     if len(new.get("tenths_s", [])) >= 2 else "") + ". "
                  f"etcd bytes per commit: the head and the log record it wrote, key and value, "
                  f"{new['written_bytes_p50']:.0f} bytes (median; largest {new['written_bytes_max']}), plus "
                  f"{new['checkpoint_bytes_per_commit']:.0f} bytes per commit of checkpoint keys and head rewrites "
                  + (f"({new['checkpoints']} checkpoints, {new.get('forced_checkpoints', 0)} of them forced by the "
                     "committer; " if new.get("checkpointing") == "auditor" else
                     f"({new['checkpoints']} checkpoints, p50 {new['checkpoint_p50_s']:.2f} s, slowest "
                     f"{new['checkpoint_max_s']:.2f} s; ")
                  + "a checkpoint over 256 KiB goes into a ledger and etcd holds its id; that ledger's metadata is "
                  f"in the dbSize figure, not in this sum): **{total_bytes:,.0f} bytes per commit** (target: at most "
                  f"{BYTES_PER_COMMIT_TARGET:,}: "
                  f"{'met' if total_bytes <= BYTES_PER_COMMIT_TARGET else 'NOT met'}). etcd's dbSize grew "
                  f"{new['db_growth_per_commit']:,.0f} bytes per commit ({new['db_size_bytes'] / MIB:.0f} MiB at the "
                  f"end; {new['revisions_per_commit']:.2f} revisions per commit). At the end the dataset held "
                  f"{new['ledgers']:,} ledgers, every one present once and in commit order: "
                  f"{new['all_present_in_order']}; a full read (`get`) took {new['get_s']:.2f} s."]
        if old:
            ow = old["windows"]
            lines += ["", f"The format before (one value listing every ledger, read, extended and CAS-written whole "
                      f"per commit, as at 3c74a1d; replayed with `Manifest.encode_v1`) on its own etcd, "
                      f"{old['commits']:,} commits: p50 " + ", ".join(
                          f"{x['p50_ms']:.1f} ms around {x['at']:,}" for x in ow)
                      + f"; {old['written_bytes_mean']:,.0f} bytes written per commit on average "
                      f"({old['written_bytes_last']:,} at the last); dbSize grew {old['db_growth_per_commit']:,.0f} "
                      "bytes per commit."]
    r = results.get("contention")
    if r:
        rows = [[str(x["processes"]), f"{x['landed']:,} of {x['attempted']:,}", str(x["failed"]),
                 f"{x['p50_ms']:.0f}", f"{x['p99_ms']:.0f}", f"{x['max_ms']:.0f}", f"{x['per_s']:.0f}",
                 str(x["each_once"])] for x in sorted(r["data"].values(), key=lambda x: -x["processes"])]
        first = next((x["first_failure"] for x in r["data"].values() if x["first_failure"]), "")
        lines += ["", "### Concurrent committers", "",
                  f"{r['machine']}. `{r['command']}`. Processes, each with its own Client, append one-ledger "
                  "commits (fake ledgers) to one dataset, all starting together; afterwards every commit's ledger "
                  "is in the dataset exactly once.", "",
                  table(["processes", "commits landed", "failed", "p50 ms", "p99 ms", "max ms",
                         "commits/s (all)", "each ledger once"], rows)]
        if first:
            lines += ["", f"First failure: `{first}`"]
    r = results.get("stream")
    if r:
        s = r["data"]
        early, end = s.get("early") or {}, s["end"]
        lines += ["", "### A streaming query", "",
                  f"{r['machine']}. `{r['command']}`. Local Spark (local[2]); the rate source at "
                  f"{s['rows_per_s']:,} rows/s, `.repartition({s['partitions']})`, the octavo sink, a "
                  f"{s['trigger_s']} s processing-time trigger; etcd compaction by the auditor at its default. "
                  f"**{s['micro_batches']:,} micro-batches** ran in {s['elapsed_s'] / 60:.0f} minutes "
                  f"({s['input_rows']:,} rows; {s['micro_batches_asked']:,} were asked for"
                  + (f", the run stopped at {s['stop_at']} UTC to fit its time budget" if s['micro_batches']
                     < s['micro_batches_asked'] else "") + f"), with **{s['failures']} failures**"
                  + (f" (first: `{s['failure_messages'][0][:300]}`)" if s["failures"] else "") + ".", "",
                  table(["", "micro-batches", "ledgers", "rows", "etcd dbSize MiB (in use)",
                         "micro-batch p50 ms", "p99 ms"], [
                      ["start", str(early.get("batches", "-")), f"{early.get('ledgers', 0):,}",
                       f"{early.get('rows', 0):,}",
                       f"{early.get('db_size_bytes', 0) / MIB:.1f} ({early.get('db_size_in_use_bytes', 0) / MIB:.1f})",
                       f"{s['first50_p50_ms']:.0f} (first 50)", f"{s['first50_p99_ms']:.0f}"],
                      ["end", f"{s['micro_batches']:,}", f"{end['ledgers']:,}", f"{end['rows']:,}",
                       f"{end['db_size_bytes'] / MIB:.1f} ({end['db_size_in_use_bytes'] / MIB:.1f})",
                       f"{s['last50_p50_ms']:.0f} (last 50)", f"{s['last50_p99_ms']:.0f}"]])]
        if s.get("samples"):
            lines += ["", "Along the way (every 100 micro-batches): " + "; ".join(
                f"{x['batches']:,} batches ({x['minutes']:.0f} min): {x['ledgers']:,} ledgers, dbSize "
                f"{x['db_size_bytes'] / MIB:.0f} MiB ({x['db_size_in_use_bytes'] / MIB:.0f} in use)"
                for x in s["samples"]) + f". The auditor's maintenance logged {s.get('auditor_checkpoints', 0)} "
                f"checkpoints and {s.get('auditor_merges', 0)} merges of this dataset during the run"
                + (f" ({s['auditor_merged_sources']:,} source ledgers, {s['auditor_merge_bytes'] / MIB:,.0f} MiB "
                   f"copied for {s['end']['payload_bytes'] / MIB:,.0f} MiB of payload)"
                   if s.get("auditor_merge_bytes") else "") + "."]
        b = s["read_before_merge"]
        lines += ["", f"A batch read afterwards: {b['rows']:,} rows, {b['distinct']:,} distinct values, from "
                  f"{b['min']} to {b['max']}: every row exactly once: **{b['exactly_once']}** ({b['seconds']:.1f} s)."]
        m = s.get("merge")
        if m and not m["merges"]:
            a = s["read_after_merge"]
            lines[-1] += (f" By then the auditor's maintenance had merged the dataset again (it held "
                          f"{s['end']['ledgers']:,} ledgers when the stream stopped and {m['ledgers_before']:,} when "
                          "the read finished: the read's ledgers were merged under it, and retired, not deleted), so "
                          f"`merge_dataset` found nothing left to merge; the read after it: {a['rows']:,} rows, "
                          f"{a['distinct']:,} distinct: exactly once: **{a['exactly_once']}** ({a['seconds']:.1f} s).")
        elif m:
            a = s["read_after_merge"]
            lines[-1] += (f" `merge_dataset` (called until it merged nothing, {m['calls'] - 1} passes) then took "
                          f"the dataset from {m['ledgers_before']:,} ledgers to {s['after_merge']['ledgers']:,} in "
                          f"{m['seconds']:.1f} s ({m['ledgers_before'] / m['seconds']:.0f} ledgers/s, "
                          f"{s['end']['payload_bytes'] / MIB / m['seconds']:.2f} MiB/s of payload); the read "
                          f"after it: {a['rows']:,} rows, {a['distinct']:,} distinct: exactly once: "
                          f"**{a['exactly_once']}** ({a['seconds']:.1f} s).")
        elif "merge" in s:
            lines[-1] += " No merge: `merge_dataset` had not landed when this ran."
    r = results.get("merge")
    if r:
        d = r["data"]
        m = d.get("merge")
        lines += ["", "### Merge throughput", "",
                  f"{r['machine']}. `{r['command']}`. {d['written']['ledgers']:,} real ledgers of {FAKE_ROWS} rows "
                  "(one lz4 Arrow IPC entry each, as one partition of a micro-batch of the issue's stream), E3 Qw3 "
                  "Qa2, committed 64 per commit; then `merge_dataset` with its defaults (target 128 MiB, at most "
                  "1,000 ledgers per merged ledger), called until it merges nothing."]
        if m:
            payload = d["before"]["payload_bytes"]
            lines += ["", table(["ledgers before", "after", "merges (passes)", "payload MiB", "MiB copied",
                                 "seconds", "ledgers/s", "payload MiB/s", "copied MiB/s"], [[
                f"{m['ledgers_before']:,}", f"{m['ledgers_after']:,}", f"{m['merges']} ({m['calls'] - 1})",
                f"{payload / MIB:.1f}", f"{m['bytes_merged'] / MIB:.1f}", f"{m['seconds']:.1f}",
                f"{m['ledgers_before'] / m['seconds']:.0f}", f"{payload / MIB / m['seconds']:.2f}",
                f"{m['mb_per_s']:.2f}"]]), "",
                "A merged ledger takes at most MERGE_LEDGERS_MAX_DEFAULT = 1,000 sources, and one still under half "
                "the target is small, so the ledgers were merged in passes (1,000 into 1, then the merged ones "
                "together): `copied` counts every pass, `ledgers/s` and `payload MiB/s` the dataset's own ledgers "
                "and bytes over the whole time. "
                f"Read back through the source's reader: before, {d['read_before']['rows']:,} rows in "
                f"{d['read_before']['partitions']} partitions ({d['read_before']['seconds']:.1f} s); after, "
                f"{d['read_after']['rows']:,} rows in {d['read_after']['partitions']} partition(s) "
                f"({d['read_after']['seconds']:.1f} s), each exactly once: {d['read_after']['exactly_once']}."]
        else:
            lines += ["", "Not measured: `merge_dataset` had not landed when this ran."]
    r = results.get("plan")
    if r:
        d = r["data"]
        lines += ["", "### Planning a read over many small ledgers", "",
                  f"{r['machine']}. `{r['command']}`. {d['ledgers']:,} fake ledgers (1 entry, {FAKE_BYTES} bytes "
                  f"each) committed 1,000 per commit ({d['commit_s']:.0f} s), then checkpointed. Planning "
                  f"(`OctavoReader.partitions()`: reading the checkpoint and the log, grouping by size) took "
                  f"**{d['reader_s']:.2f} s** for **{d['partitions']:,} partitions** (at most "
                  f"{d['max_ledgers_per_partition']} ledgers each: each ledger counts at least "
                  "LEDGER_OPEN_COST_BYTES = 4 MiB against max_partition_bytes = 128 MiB)"
                  + (f"; Spark's `load(name).rdd.getNumPartitions()` took **{d['spark_s']:.2f} s** "
                     f"({d['spark_partitions']:,} partitions)" if "spark_s" in d else "") + ". Medians of 3."]
    return "\n".join(lines)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1].startswith("worker-"):
        kind, rest = sys.argv[1], sys.argv[2:]
        if kind == "worker-checkpointer":
            asyncio.run(checkpointer_worker(rest[0], rest[1]))
        else:
            asyncio.run(contention_worker(rest[0], rest[1], int(rest[2]), int(rest[3]), float(rest[4])))
        return 0
    signal.signal(signal.SIGTERM, _interrupt)  # stop the local clusters on the way out
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a minute or two")
    parser.add_argument("--commits", type=int, default=100_000)
    parser.add_argument("--checkpoints", choices=("auditor", "process"), default="auditor",
                        help="who folds the commit log: the bookies' auditor (its dataset maintenance, every "
                             "dataset_maintenance_interval_s) or a bench process calling checkpoint() in a loop")
    parser.add_argument("--old-commits", type=int, default=5_000, help="the format before (0: skip)")
    parser.add_argument("--processes", default="16,8")
    parser.add_argument("--per-process", type=int, default=150)
    parser.add_argument("--micro-batches", type=int, default=2000)
    parser.add_argument("--stop-at", default="", help="UTC HH:MM: the stream stops then if not done")
    parser.add_argument("--rows-per-s", type=int, default=2000)
    parser.add_argument("--stream-partitions", type=int, default=64)
    parser.add_argument("--trigger-s", type=int, default=1)
    parser.add_argument("--no-stream-merge", dest="stream_merge", action="store_false")
    parser.add_argument("--merge-ledgers", type=int, default=5_000)
    parser.add_argument("--plan-ledgers", type=int, default=100_000)
    parser.add_argument("--no-spark-plan", action="store_true")
    parser.add_argument("--results", default=str(RESULTS_DEFAULT), help="JSON file the parts' results are kept in")
    parser.add_argument("--no-report", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="write the section from --results, run nothing")
    args = parser.parse_args()
    if args.quick:
        args.commits, args.old_commits, args.per_process = 2_000, 300, 20
        args.micro_batches, args.merge_ledgers, args.plan_ledgers = 5, 300, 5_000
        args.processes = "4"
    args.processes = [int(x) for x in args.processes.split(",")]
    parts = [p.strip() for p in args.part.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; choose among {', '.join(PARTS)}")
    command = "python bench/dataset_bench.py " + " ".join(sys.argv[1:])
    results_path = Path(args.results)
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    root = Path(tempfile.mkdtemp(prefix="octavo-dataset-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR")))
    runners = {"commits": part_commits, "contention": part_contention, "stream": part_stream,
               "merge": part_merge, "plan": part_plan}
    try:
        for part in [] if args.report_only else parts:
            machine = machine_line()  # the load average as the part starts
            data = runners[part](root, args)
            results[part] = {"machine": machine, "command": command, "quick": args.quick, "data": data}
            results_path.write_text(json.dumps(results, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = report({k: v for k, v in results.items() if v.get("quick") == args.quick})
    print(text)
    if not args.no_report and not args.quick:
        write_section("datasets", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
