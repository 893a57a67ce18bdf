"""Ledger churn and etcd's history: many concurrent creators create a ledger (E3 Qw3 Qa2), close it and delete
it, again and again, on a local cluster of etcd and 3 bookies (real processes), while etcd's database size
(dbSize: the file the quota counts) and the part of it in use (dbSizeInUse: the rest is free pages a
defragmentation gives back) are sampled from etcd's Maintenance Status.

Two clusters in one run, one after the other with the same load: one whose auditor compacts etcd every
--interval-s (etcd_compaction_interval_s), one with compaction off (0), as before issue 35. Each ends with a
defragmentation (what an operator's scheduled `etcdctl defrag` gives back). Writes the `churn` section of
docs/benchmarks.md.

Usage: python bench/churn_bench.py [--cycles 100000] [--creators 64] [--interval-s 30] [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from aetcd import rpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, table, write_section

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.meta.etcd import EtcdClient

BOOKIES = 3
SAMPLE_POINTS = 10  # samples taken at every tenth of the cycles
MIB = 1 << 20


@dataclass
class Sample:
    cycles: int
    elapsed_s: float
    db_size_bytes: int
    db_size_in_use_bytes: int
    revision: int


@dataclass
class Run:
    interval_s: int
    samples: list[Sample] = field(default_factory=list)
    failures: int = 0
    first_failure: str = ""
    elapsed_s: float = 0.0
    defragmented: Sample | None = None
    compactions: int = 0


async def sample(etcd: EtcdClient, cycles: int, t0: float) -> Sample:
    st = await etcd.status()
    return Sample(cycles, time.monotonic() - t0, st.db_size_bytes, st.db_size_in_use_bytes, st.revision)


async def churn(endpoint: str, cycles: int, creators: int, run: Run) -> None:
    done = 0
    next_sample = cycles // SAMPLE_POINTS
    t0 = time.monotonic()
    async with Client(endpoint) as client, EtcdClient(endpoint) as etcd:
        run.samples.append(await sample(etcd, 0, t0))
        taken = 0
        sampling: set[asyncio.Task[None]] = set()

        async def take(n: int) -> None:
            run.samples.append(await sample(etcd, n, t0))

        async def creator() -> None:
            nonlocal taken, done, next_sample
            while taken < cycles:
                taken += 1
                try:
                    writer = await client.create_ledger(3, 3, 2, password=b"churn")
                    await writer.close()
                    await client.delete_ledger(writer.ledger_id)
                except Exception as e:  # counted and shown: a churn that fails is a finding
                    run.failures += 1
                    run.first_failure = run.first_failure or f"{type(e).__name__}: {e}"
                done += 1
                if done >= next_sample:
                    next_sample += cycles // SAMPLE_POINTS
                    task = asyncio.create_task(take(done))
                    sampling.add(task)
                    task.add_done_callback(sampling.discard)
                    print(f"  {done:,} cycles in {time.monotonic() - t0:.0f}s", flush=True)

        await asyncio.gather(*(creator() for _ in range(creators)))
        await asyncio.gather(*sampling)
        run.elapsed_s = time.monotonic() - t0
        run.samples.sort(key=lambda s: s.cycles)
        # What a scheduled defragmentation gives back (the member blocks while it runs).
        async with grpc.aio.insecure_channel(endpoint) as channel:
            await rpc.MaintenanceStub(channel).Defragment(rpc.DefragmentRequest(), timeout=600)
        run.defragmented = await sample(etcd, done, t0)


def one(root: str, cycles: int, creators: int, interval_s: int) -> Run:
    run = Run(interval_s)
    args = ["--etcd-compaction-interval-s", str(interval_s)]
    with LocalCluster(root, bookies=BOOKIES, bookie_args=args, new_session=True) as cluster:
        asyncio.run(churn(cluster.etcd_endpoint, cycles, creators, run))
        logs = [Path(b.log_path).read_text(errors="replace") for b in cluster.bookies.values()]
        run.compactions = sum(text.count("etcd compacted to revision") for text in logs)
    return run


def mib(n: int) -> str:
    return f"{n / MIB:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100_000)
    parser.add_argument("--creators", type=int, default=64)
    parser.add_argument("--interval-s", type=int, default=30)
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    if args.cycles < SAMPLE_POINTS or args.interval_s < 1:
        parser.error(f"--cycles must be >= {SAMPLE_POINTS} and --interval-s >= 1")

    root = tempfile.mkdtemp(prefix="octavo-churn-")
    runs: list[Run] = []
    try:
        for interval_s in (args.interval_s, 0):
            print(f"etcd_compaction_interval_s {interval_s}: {args.cycles:,} cycles, {args.creators} creators",
                  flush=True)
            runs.append(one(str(Path(root) / f"i{interval_s}"), args.cycles, args.creators, interval_s))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    on, off = runs
    rows = []
    for a, b in zip(on.samples, off.samples, strict=False):
        rows.append([f"{a.cycles:,}", f"{a.elapsed_s:.0f} / {b.elapsed_s:.0f}", mib(a.db_size_bytes),
                     mib(a.db_size_in_use_bytes), mib(b.db_size_bytes), mib(b.db_size_in_use_bytes)])
    for r in (on, off):
        assert r.defragmented is not None
    rows.append(["after defrag", "-", mib(on.defragmented.db_size_bytes),  # type: ignore[union-attr]
                 mib(on.defragmented.db_size_in_use_bytes), mib(off.defragmented.db_size_bytes),  # type: ignore[union-attr]
                 mib(off.defragmented.db_size_in_use_bytes)])  # type: ignore[union-attr]
    headers = ["cycles", "elapsed s (on / off)", f"compaction {on.interval_s} s: dbSize MiB", "dbSizeInUse MiB",
               "compaction off: dbSize MiB", "dbSizeInUse MiB"]
    print(table(headers, rows))
    for r in runs:
        print(f"interval {r.interval_s}: {args.cycles / r.elapsed_s:,.0f} cycles/s, {r.failures} failures "
              f"{r.first_failure[:200]}, {r.compactions} compactions logged")
    peak_on = max(x.db_size_in_use_bytes for x in on.samples)
    growth_off = off.samples[-1].db_size_in_use_bytes - off.samples[len(off.samples) // 2].db_size_in_use_bytes
    per_cycle_off = (off.samples[-1].db_size_in_use_bytes - off.samples[0].db_size_in_use_bytes) / args.cycles
    if not args.no_report:
        write_section("churn", "\n".join([
            "## Ledger churn and etcd's history (bench/churn_bench.py)",
            "",
            f"{machine_line()}. etcd and {BOOKIES} bookies as local processes; {args.creators} concurrent "
            f"creators in one client process each create a ledger (E3 Qw3 Qa2), close it and delete it, "
            f"{args.cycles:,} times; etcd's Maintenance Status sampled at every tenth. Two clusters one after the "
            f"other with the same load: the auditor compacting etcd every {on.interval_s} s "
            f"(`etcd_compaction_interval_s`; the default is 300 s), and compaction off (0: what every cluster did "
            f"before, unless its etcd compacted itself). Each ends with a defragmentation. Rates: "
            f"{args.cycles / on.elapsed_s:,.0f} and {args.cycles / off.elapsed_s:,.0f} cycles/s; failures: "
            f"{on.failures} and {off.failures}; compactions logged by the auditor: {on.compactions} and "
            f"{off.compactions} (the rates come from a shared machine, see its load average: they do not "
            "compare the two settings).",
            "",
            table(headers, rows),
            "",
            f"Without compaction every cycle leaves its revisions behind: dbSizeInUse grew by "
            f"{per_cycle_off:,.0f} bytes per cycle ({mib(growth_off)} MiB over the second half of the run), and "
            f"etcd's default 2 GiB quota would be reached after about {2 * 1024 * MIB / max(per_cycle_off, 1):,.0f} "
            f"cycles. With the auditor compacting, dbSizeInUse peaked at {mib(peak_on)} MiB and ended at "
            f"{mib(on.samples[-1].db_size_in_use_bytes)} MiB: the live keys and one to two intervals of history, "
            f"whatever the number of cycles. dbSize, the file, keeps its high-water mark "
            f"({mib(on.samples[-1].db_size_bytes)} MiB against {mib(off.samples[-1].db_size_bytes)} MiB without "
            "compaction) until a defragmentation: compaction frees pages for reuse, it does not shrink the file, "
            "which is why docs/operations.md asks operators to schedule `etcdctl defrag`.",
        ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
