"""One record per call against a batch, and against NATS JetStream driven one message at a time, in one run.

Octavo: etcd and three bookie processes on 127.0.0.1 (E=3, Qw=3, Qa=2), one ledger, one producer:
- `append_many` of 1,000 entries at a time (the batch path: the baseline);
- `append_nowait`, one record per call from one asyncio task (a future per record, no coroutine; when the
  in-flight budget is full it awaits `send`, which waits for room);
- `SyncWriteHandle.append_async`, one record per call from one thread of a `SyncClient` (a
  concurrent.futures.Future per record; blocks when the budget is full);
JetStream: three clustered `nats-server` processes, a file stream with 3 replicas, `nats-py`'s
`publish_async` one message per call with up to 1,000 pending (its own back-pressure).
Every Octavo variant has the same 8 MiB in-flight budget. Medians of --rounds; within a round the variants
alternate, and the ratios are taken per round. Writes the `producer` section of docs/benchmarks.md.

Usage: python bench/producer_bench.py [--rounds N] [--seconds S] [--no-report]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_bench import NatsCluster, nats_stream
from common import machine_line, median, table, write_section

from octavo.cli.localcluster import LocalCluster
from octavo.client import BufferFullError, Client, ClientOptions, SyncClient

SIZES = [100, 1024]
INFLIGHT_BYTES = 8 * 1024 * 1024
BATCH = 1000
NATS_PENDING = 1000
OPTIONS = ClientOptions(inflight_bytes_max=INFLIGHT_BYTES)


async def batch_rate(client: Client, size: int, seconds: float) -> float:
    writer = await client.create_ledger(3, 3, 2, password=b"bench")
    payload = os.urandom(size)
    batch = [payload] * BATCH
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await writer.append_many(batch)
        n += BATCH
    rate = n / (time.perf_counter() - t0)
    await writer.close()
    await client.delete_ledger(writer.ledger_id)
    return rate


async def nowait_rate(client: Client, size: int, seconds: float) -> float:
    writer = await client.create_ledger(3, 3, 2, password=b"bench")
    payload = os.urandom(size)
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    last = None
    while time.perf_counter() < deadline:
        for _ in range(BATCH):  # the clock is read once per thousand records
            try:
                last = writer.append_nowait(payload)
            except BufferFullError:
                last = await writer.send(payload)
        n += BATCH
    assert last is not None
    await last
    rate = n / (time.perf_counter() - t0)
    await writer.close()
    await client.delete_ledger(writer.ledger_id)
    return rate


def sync_rate(etcd: str, size: int, seconds: float) -> float:
    with SyncClient(etcd, options=OPTIONS) as client:
        writer = client.create_ledger(3, 3, 2, password=b"bench")
        payload = os.urandom(size)
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        append = writer.append_async
        while time.perf_counter() < deadline:
            for _ in range(BATCH):
                append(payload)
            n += BATCH
        writer.flush()
        rate = n / (time.perf_counter() - t0)
        writer.close()
        client.delete_ledger(writer.ledger_id)
    return rate


async def nats_rate(js, size: int, seconds: float, run: int) -> float:  # type: ignore[no-untyped-def]
    payload = os.urandom(size)
    subject = f"bench.producer.{run}"
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        for _ in range(BATCH):
            await js.publish_async(subject, payload)
        n += BATCH
    await js.publish_async_completed()
    rate = n / (time.perf_counter() - t0)
    await js.purge_stream("BENCH")
    return rate


async def bench(args: argparse.Namespace, etcd: str, nats_servers: str) -> str:
    nc, js = await nats_stream(nats_servers)
    js._publish_async_pending_semaphore = asyncio.Semaphore(NATS_PENDING)  # publish_async_max_pending
    rows, target_rows = [], []
    met = []
    async with Client(etcd, options=OPTIONS) as client:
        run = 0
        for size in args.sizes:
            runs: dict[str, list[float]] = {"batch": [], "nowait": [], "sync": [], "nats": []}
            ratios: dict[str, list[float]] = {"nowait": [], "sync": [], "nats": []}
            for _ in range(args.rounds):
                run += 1
                b = await batch_rate(client, size, args.seconds)
                a = await nowait_rate(client, size, args.seconds)
                s = await asyncio.to_thread(sync_rate, etcd, size, args.seconds)
                j = await nats_rate(js, size, args.seconds, run)
                for key, value in (("batch", b), ("nowait", a), ("sync", s), ("nats", j)):
                    runs[key].append(value)
                ratios["nowait"].append(a / b)
                ratios["sync"].append(s / b)
                ratios["nats"].append(a / j)
                print(f"{size} B round: batch {b:,.0f}/s, append_nowait {a:,.0f}/s ({a / b:.0%}), sync "
                      f"append_async {s:,.0f}/s ({s / b:.0%}), JetStream publish_async {j:,.0f}/s "
                      f"(Octavo {a / j:.1f}x)", flush=True)
            mb = size / 1e6
            for label, key in (("`append_many` of 1,000 (batch)", "batch"),
                               ("`append_nowait`, one record per call, one task", "nowait"),
                               ("`SyncWriteHandle.append_async`, one record per call, one thread", "sync"),
                               ("JetStream `publish_async`, one message per call", "nats")):
                value = median(runs[key])
                rows.append([f"{size:,} B", label, f"{value:,.0f}", f"{value * mb:,.1f}"])
            nowait, sync, nats_x = (median(ratios[k]) for k in ("nowait", "sync", "nats"))
            target_rows += [
                [f"{size:,} B", "append_nowait / append_many", ">= 60%", f"{nowait:.0%}", _met(nowait >= 0.6)],
                [f"{size:,} B", "sync append_async / append_many", ">= 50%", f"{sync:.0%}", _met(sync >= 0.5)],
                [f"{size:,} B", "append_nowait / JetStream one at a time", ">= 5x", f"{nats_x:.1f}x",
                 _met(nats_x >= 5)],
            ]
            met += [nowait >= 0.6, sync >= 0.5, nats_x >= 5]
    await nc.close()
    return "\n".join([
        "## The producer path: one record per call",
        "",
        f"`python bench/producer_bench.py --rounds {args.rounds} --seconds {args.seconds}`; {machine_line()}. "
        "A local 3-bookie cluster (E=3, Qw=3, Qa=2), one ledger, one producer; every Octavo variant with an "
        f"{INFLIGHT_BYTES >> 20} MiB in-flight budget. JetStream: three clustered `nats-server` processes, a file "
        f"stream with 3 replicas, `publish_async` with up to {NATS_PENDING:,} pending. Medians of "
        f"{args.rounds} rounds of {args.seconds:.0f} s per variant; the variants alternate within a round and "
        "the ratios are medians of per-round ratios.",
        "",
        table(["entry", "producer", "entries/s", "MB/s"], rows),
        "",
        table(["entry", "ratio", "target", "measured", ""], target_rows),
        "",
        "How one record per call costs about what a batch costs: `append_nowait` is a plain method (no "
        "coroutine, no task): it checks the record, gives it the next id, appends it and an asyncio future to the "
        "handle's lists and schedules one flush for the loop turn; every record appended before the task yields "
        "goes out in that flush as one group per bookie, so the bookies see batches as with `append_many`. "
        "What a record costs beyond a batch's entry is its future (created, resolved in id order). The sync "
        "handle queues records from any thread under one lock and wakes the loop once per batch "
        "(`call_soon_threadsafe` only when the queue was empty), so a thread pays a lock and a "
        "`concurrent.futures.Future` per record, not a loop round trip.",
    ]), all(met)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=SIZES)
    ap.add_argument("--no-report", action="store_true")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="octavo-producer-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR"))
    cluster = LocalCluster(os.path.join(root, "octavo"), bookies=3,
                           bookie_args=["--log-size-bytes-max", str(64 << 20)], new_session=True)
    nats = NatsCluster(os.path.join(root, "nats"))
    try:
        cluster.start()
        servers = nats.start()
        body, _ = asyncio.run(bench(args, cluster.etcd_endpoint, servers))
    finally:
        nats.stop()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    if not args.no_report and args.sizes == SIZES:
        write_section("producer", body)
        print("wrote docs/benchmarks.md (producer)")


if __name__ == "__main__":
    threading.current_thread().name = "producer-bench"
    main()
