"""Re-replication speed, and what a writer keeps while it runs, in one run.

A local cluster of 4 bookies (autorecovery on, lost_bookie_delay_s 1 for the bench, 2 workers per bookie, the
replication rate per bookie compared: the default, half of it and twice it, each on a fresh cluster) and etcd.
First, ledgers (E2/Qw2/Qa2, 1 MiB per ledger in entries of 64 KB) are written until the bookie to be lost holds
--gib GiB: the cluster's write throughput is measured on the way. Then one writer appends 1 KB entries in batches
of 100 without pause: its throughput for 5 s is the baseline. The bookie is SIGKILLed and its data directory
deleted; the auditor marks its ledgers after the delay and the workers on the 3 others copy its share back.
Measured: the time from the kill until no ledger names the lost bookie, the copy rate (its share of the data over
that time), and the writer's throughput during re-replication against the baseline (target: at least 70%). Writes
the `replication` section of docs/benchmarks.md.

Usage: python bench/replication_bench.py [--gib G] [--rates-mib-s R1,R2] [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_line, table, write_section

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions
from octavo.node.config import NodeConfig

MIB = 1 << 20
ENTRY = b"r" * (64 << 10)
PER_LEDGER = 16  # entries of 64 KB: 1 MiB per ledger
VICTIM = "bookie-3"
SMALL = b"w" * 1024


async def fill(client: Client, gib: float) -> tuple[float, int]:
    """Write ledgers until the victim holds `gib` GiB; returns (MB/s written by the client, ledgers)."""
    target = gib * 1024 * MIB
    held = 0
    ledgers = 0
    written = 0
    started = time.monotonic()

    async def one() -> None:
        nonlocal held, ledgers, written
        w = await client.create_ledger(2, 2, 2)
        await w.append_many([ENTRY] * PER_LEDGER)
        await w.close()
        size = len(ENTRY) * PER_LEDGER
        written += size
        ledgers += 1
        if VICTIM in w.metadata.last_ensemble:
            held += size

    while held < target:
        await asyncio.gather(*(one() for _ in range(16)))
    return written / MIB / (time.monotonic() - started), ledgers


async def steady_writer(client: Client, samples: list[tuple[float, int]], stop: asyncio.Event) -> None:
    w = await client.create_ledger(3, 3, 2)
    while not stop.is_set():
        await w.append_many([SMALL] * 100)
        samples.append((time.monotonic(), 100))
    await w.close()


def rate(samples: list[tuple[float, int]], start: float, end: float) -> float:
    return sum(n for t, n in samples if start <= t < end) / max(end - start, 1e-9)


async def run(gib: float, rate_mib_s: float, control_s: float = 0.0, batch_kib: int = 0) -> dict[str, object]:
    root = tempfile.mkdtemp(prefix="octavo-replication-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR"))
    try:
        return await _run_in(root, gib, rate_mib_s, control_s, batch_kib)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # gigabytes of logs: never leave them behind


async def _run_in(root: str, gib: float, rate_mib_s: float, control_s: float, batch_kib: int) -> dict[str, object]:
    """One cluster: fill, start the writer, lose the bookie. With control_s, autorecovery is off and the writer
    is watched for control_s after the loss (the same loss, nothing copied); otherwise until healed."""
    args = ["--lost-bookie-delay-s", "1", "--log-size-bytes-max", str(256 * MIB),
            "--replication-rate-bytes-per-s", str(int(rate_mib_s * MIB))]
    if control_s:
        args += ["--autorecovery-enabled", "false"]
    if batch_kib:
        args += ["--replication-batch-bytes-max", str(batch_kib << 10)]
    with LocalCluster(root, bookies=4, bookie_args=args) as cluster:
        async with Client(cluster.etcd_endpoint, options=ClientOptions(bookie_list_ttl_s=0.5)) as client:
            write_mb_s, ledgers = await fill(client, gib)
            print(f"filled: {ledgers} ledgers, {gib:g} GiB on {VICTIM}; client writes {write_mb_s:.1f} MB/s",
                  flush=True)
            samples: list[tuple[float, int]] = []
            stop = asyncio.Event()
            writer = asyncio.ensure_future(steady_writer(client, samples, stop))
            await asyncio.sleep(6.0)
            killed = time.monotonic()
            baseline = rate(samples, killed - 5.0, killed)
            cluster.bookies[VICTIM].kill()
            shutil.rmtree(cluster.bookies[VICTIM].data_dir)
            share = 0
            async for meta in client.iter_ledger_metadata():
                if VICTIM in meta.last_ensemble and meta.closed and meta.write_quorum == meta.ensemble_size:
                    share += max(meta.length, 0)  # every bookie of the ensemble holds every entry
            # Watched cheaply, in the writer's own process: one key of the marks once a second (the control
            # does the same); the ledgers' metadata is read in full only when no mark is left.
            marks = client.metadata_store.layout.underreplicated
            seen_marks = False
            while time.monotonic() - killed < (control_s or 3600):
                await asyncio.sleep(1.0)
                if await client.etcd.get_prefix(marks, limit=1, keys_only=True):
                    seen_marks = True
                    continue
                if control_s or (not seen_marks and time.monotonic() - killed < 15):
                    continue
                if not [m async for m in client.iter_ledger_metadata() if any(VICTIM in b for _, b in m.ensembles)]:
                    break
            healed = time.monotonic()
            stop.set()
            await writer
    took = healed - killed
    return {"write_mb_s": write_mb_s, "ledgers": float(ledgers), "heal_s": took,
            "copy_mb_s": share / MIB / took, "share_mib": share / MIB, "baseline": baseline,
            "after_kill": [(t - killed, n) for t, n in samples if t >= killed]}


def during(r: dict[str, object], until_s: float) -> float:
    """The writer's entries/s from 2 s after the loss (the writer's own ensemble change) to until_s."""
    after: list[tuple[float, int]] = r["after_kill"]  # type: ignore[assignment]
    return rate(after, 2.0, until_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="GiB the lost bookie holds (default 1)")
    parser.add_argument("--rates-mib-s", default="", help="replication_rate_bytes_per_s values to compare, in "
                        "MiB/s, comma-separated (default: the default, half of it and twice it)")
    parser.add_argument("--batch-kib", type=int, default=0,
                        help="replication_batch_bytes_max in KiB for every run (default: the bookie's default)")
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    default = NodeConfig(data_dir="").replication_rate_bytes_per_s / MIB
    rates = [float(x) for x in args.rates_mib_s.split(",") if x] or [default / 2, default, default * 2]
    runs = []
    for rate_mib_s in rates:
        r = asyncio.run(run(args.gib, rate_mib_s, batch_kib=args.batch_kib))
        print(f"{rate_mib_s:g} MiB/s per bookie: healed in {r['heal_s']:.1f}s, {r['share_mib']:.0f} MiB copied at "
              f"{r['copy_mb_s']:.1f} MiB/s (the cluster wrote {r['write_mb_s']:.1f} MB/s); the writer "
              f"{during(r, r['heal_s']):,.0f} entries/s during it ({r['baseline']:,.0f} before)", flush=True)
        runs.append((rate_mib_s, r))
    longest = max(float(r["heal_s"]) for _, r in runs)  # type: ignore[arg-type]
    control = asyncio.run(run(args.gib, default, control_s=longest + 1))
    print(f"control (autorecovery off, the same loss): the writer {during(control, longest):,.0f} entries/s "
          f"({control['baseline']:,.0f} before)", flush=True)
    rows = []
    for rate_mib_s, r in runs:
        heal_s = float(r["heal_s"])  # type: ignore[arg-type]
        with_copy, without = during(r, heal_s), during(control, heal_s)
        kept = with_copy / without if without else 0.0
        print(f"{rate_mib_s:g} MiB/s: the writer kept {kept:.0%} of the control's throughput over the same "
              f"{heal_s:.0f} s", flush=True)
        rows.append([f"{rate_mib_s:g}" + (" (default)" if rate_mib_s == default else ""),
                     f"{r['write_mb_s']:.1f} MB/s", f"{r['share_mib']:.0f} MiB", f"{heal_s:.1f} s",
                     f"{r['copy_mb_s']:.1f} MiB/s", f"{r['baseline']:,.0f}", f"{with_copy:,.0f}",
                     f"{without:,.0f}", f"{kept:.0%}"])
    if not args.no_report:
        write_section("replication", "\n".join([
            "## Re-replication of a lost bookie (bench/replication_bench.py)",
            "",
            f"{machine_line()}. 4 bookies and etcd, autorecovery at its defaults (2 workers per bookie) but for "
            "lost_bookie_delay_s 1 and the rate compared. For each rate, a fresh cluster: ledgers E2/Qw2/Qa2 of "
            f"1 MiB (64 KB entries) until the bookie to be lost holds {args.gib:g} GiB (the cluster's write "
            "throughput is measured on the way); then one writer appends 1 KB entries in batches of 100 "
            "(E3/Qw3/Qa2) without pause, the bookie is SIGKILLed and its data directory deleted, and the workers of "
            "the other three copy its share back. Healed: no ledger names the lost bookie any more (from the kill, "
            "including the 1 s delay and the registration's expiry). The control is the same loss on a cluster "
            "with autorecovery off (nothing is copied). Kept: the writer's entries/s during re-replication (from "
            "2 s after the kill, past its own ensemble change) over the control's in the same seconds after the "
            "kill (target: at least 70% at the default rate). The writer before the loss is shown for scale: it "
            "varies from cluster to cluster on this shared machine.",
            "",
            table(["replication_rate_bytes_per_s (MiB/s per bookie)", "cluster writes (filling)", "copied",
                   "healed in", "copy rate", "writer before the loss (entries/s)", "writer during re-replication",
                   "writer in the control", "kept"], rows),
        ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
