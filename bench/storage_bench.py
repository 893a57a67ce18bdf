"""Storage-engine add throughput against its ceiling, measured side by side in one run.

For each entry size (100 B, 1 KB, 64 KB), several rounds of, in turn:
  (a) ceiling: the same records (24-byte header with CRC32C + payload) built in Python and written with one
      plain os.write per batch, no fsync: what any Python appender pays;
  (d) Octavo's engine, default policy (no fsync on the add path; background flusher running);
  (c) Octavo's engine, fsync_policy=batch (fdatasync before each batch is acknowledged).
Batches of 1,000 entries (100 for 64 KB) over 8 ledgers, written round-robin. Prints medians and ratios and
writes the `storage` section of docs/benchmarks.md.

Usage: python bench/storage_bench.py [--rounds N] [--mb MB] [--no-report]
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

from octavo.node.config import GIB, MIB, NodeConfig
from octavo.node.record import encode_record
from octavo.node.storage import Storage

SIZES = [(100, 1000), (1024, 1000), (64 * 1024, 100)]  # (entry bytes, entries per batch)
LEDGERS = 8
KEY = b"bench-key"


def make_batches(size: int, per_batch: int, total_bytes: int) -> list[tuple[int, list[int], list[bytes]]]:
    payload = os.urandom(size)
    batches = []
    next_id = [0] * LEDGERS
    n_batches = max(4, total_bytes // (size * per_batch))
    for b in range(n_batches):
        ledger = b % LEDGERS
        ids = list(range(next_id[ledger], next_id[ledger] + per_batch))
        next_id[ledger] += per_batch
        batches.append((ledger, ids, [payload] * per_batch))
    return batches


def run_plain(path: str, batches: list[tuple[int, list[int], list[bytes]]]) -> float:
    fd = os.open(os.path.join(path, "plain.log"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    t0 = time.perf_counter()
    for ledger, ids, payloads in batches:
        parts = []
        for eid, payload in zip(ids, payloads, strict=True):
            header, _ = encode_record(ledger, eid, payload)
            parts.append(header)
            parts.append(payload)
        data = b"".join(parts)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    elapsed = time.perf_counter() - t0
    os.close(fd)
    return elapsed


def run_engine(path: str, batches: list[tuple[int, list[int], list[bytes]]], policy: str) -> float:
    cfg = NodeConfig(data_dir=os.path.join(path, f"engine-{policy}"), fsync_policy=policy,
                     log_size_bytes_max=1 * GIB, batch_bytes_max=64 * MIB, write_cache_entries_max=2_000_000,
                     batch_entries_max=10_000)
    s = Storage.open(cfg)
    t0 = time.perf_counter()
    for ledger, ids, payloads in batches:
        codes, message = s.add_entries(ledger, KEY, ids, payloads, ids[0] - 1)
        if codes[-1] != 0:
            raise RuntimeError(message)
    elapsed = time.perf_counter() - t0
    s.close()
    return elapsed


FSYNC_BATCHES = [10, 100, 1000]  # entries per batch for the fsync-policy comparison (1 KB entries)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mb", type=int, default=128, help="MB written per run and size")
    ap.add_argument("--fsync-mb", type=int, default=16, help="MB written per fsync comparison run")
    ap.add_argument("--no-report", action="store_true")
    args = ap.parse_args()
    rows = []
    summary = {}
    for size, per_batch in SIZES:
        batches = make_batches(size, per_batch, args.mb * MIB)
        entries = len(batches) * per_batch
        rates: dict[str, list[float]] = {"plain": [], "engine": []}
        for _ in range(args.rounds):
            tmp = tempfile.mkdtemp(prefix="octavo-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR"))
            try:
                rates["plain"].append(entries / run_plain(tmp, batches))
                rates["engine"].append(entries / run_engine(tmp, batches, "none"))
            finally:
                shutil.rmtree(tmp)
        plain, engine = median(rates["plain"]), median(rates["engine"])
        summary[size] = (plain, engine)
        mb = size / 1e6
        rows.append([f"{size:,} B", f"{plain:,.0f} ({plain * mb:,.0f} MB/s)",
                     f"{engine:,.0f} ({engine * mb:,.0f} MB/s)", f"{engine / plain:.0%}"])
        print(f"{size:>6} B: plain {plain:,.0f}/s  engine {engine:,.0f}/s ({engine / plain:.0%})", flush=True)
    fsync_rows = []
    fsync_ratio = {}
    for per_batch in FSYNC_BATCHES:
        batches = make_batches(1024, per_batch, args.fsync_mb * MIB)
        entries = len(batches) * per_batch
        rates = {"none": [], "batch": []}
        for _ in range(args.rounds):
            tmp = tempfile.mkdtemp(prefix="octavo-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR"))
            try:
                for policy in ("none", "batch"):
                    rates[policy].append(entries / run_engine(tmp, batches, policy))
            finally:
                shutil.rmtree(tmp)
        default, fsync = median(rates["none"]), median(rates["batch"])
        fsync_ratio[per_batch] = default / fsync
        fsync_rows.append([f"{per_batch:,}", f"{default:,.0f}", f"{fsync:,.0f}", f"{default / fsync:.1f}x"])
        print(f"1 KB x {per_batch:>4}/batch: default {default:,.0f}/s  fsync {fsync:,.0f}/s  "
              f"{default / fsync:.1f}x", flush=True)
    met_engine = summary[1024][1] >= 0.5 * summary[1024][0]
    met_fsync = [b for b, r in fsync_ratio.items() if r >= 5]
    body = "\n".join([
        "## Storage engine: add throughput (entries/s)",
        "",
        f"`python bench/storage_bench.py --rounds {args.rounds} --mb {args.mb}`; {machine_line()}. Median of "
        f"{args.rounds} rounds; in each round the variants run back to back on the same data. Batches of "
        "1,000 entries (100 for 64 KB) round-robin over 8 ledgers; the background flusher runs during the "
        "engine runs.",
        "",
        table(["entry", "(a) batched os.write + CRC, no engine", "engine, default policy", "engine / (a)"], rows),
        "",
        f"Target: engine >= 50% of (a) for 1 KB entries: {'met' if met_engine else 'NOT met'}.",
        "",
        "### Default policy against fsync_policy=batch (1 KB entries)",
        "",
        table(["entries per batch", "default (entries/s)", "fsync per batch (entries/s)", "default / fsync"],
              fsync_rows),
        "",
        "Target: default >= 5x the fsync policy on 1 KB entries: "
        + (f"met at {', '.join(map(str, met_fsync))} entries per batch" if met_fsync else "NOT met")
        + (f", not at {', '.join(str(b) for b in FSYNC_BATCHES if b not in met_fsync)}"
           if len(met_fsync) < len(FSYNC_BATCHES) else "")
        + ". The ratio depends on how many entries share one fdatasync; a writer's batches are as large as "
        "its load makes them. These fdatasync figures come from a virtual disk whose fdatasync may not reach "
        "stable storage: read only the ratio.",
    ])
    if not args.no_report:
        write_section("storage", body)
        print("wrote docs/benchmarks.md (storage)")


if __name__ == "__main__":
    main()
