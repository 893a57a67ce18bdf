"""A scale ladder: how Octavo's costs grow with the number of ledgers (BookKeeper clusters hold millions).

For each rung (1,000, 10,000 and 100,000 ledgers by default), a fresh local cluster: etcd and 4 bookies as real
processes on fixed ports (lost_bookie_delay_s 2 for the bench; every other setting at its default, the
replication rate too). Then, in this order:

1. creation: the rung's ledgers (E3/Qw3/Qa2, 3 entries of 1 KB each, closed), from CREATOR_PROCESSES processes
   with CREATOR_CONCURRENCY creations in flight each; a failed creation is retried and counted;
2. memory: each bookie's RSS before and after, and etcd's database file;
3. listing: `octavo ledger ls` through the real CLI (a subprocess; its output read and counted), and
   `Client.iter_ledger_metadata` in this process;
4. `octavo cluster status` through the real CLI;
5. restart: bookie-0 SIGKILLed and started again on its port, until it serves (its ready file: SERVING);
6. the auditor's full audit (autorecovery.audit_ledgers, the code the auditor runs, from this process);
7. healing: bookie-3 SIGKILLed and its data directory deleted; from the kill until no ledger names it (the
   auditor marks its ledgers after the delay and the 3 others' replication workers copy its share back);
8. GC: half the ledgers deleted (the oldest half), then one GC pass on each remaining bookie (`RunGc`).

Per-ledger cost is each measure over the rung's ledgers (for healing: over the lost bookie's share; for memory:
the RSS growth over the ledgers the bookie holds). Writes the `scale` section of docs/benchmarks.md and
docs/benchmarks-scale.svg (per-ledger cost of each measure against the rung, relative to the first rung).

Usage: python bench/scale_bench.py [--rungs 1000,10000,100000] [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPORT, machine_line, table, write_section

from octavo.cli.localcluster import LocalCluster, free_port
from octavo.client import Client, ClientOptions
from octavo.meta.underreplication import UnderReplication
from octavo.node.autorecovery import audit_ledgers
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

RUNGS = [1_000, 10_000, 100_000]
BOOKIES = 4
RESTARTED = "bookie-0"
LOST = "bookie-3"
ENTRIES_PER_LEDGER = 3
ENTRY = b"s" * 1024
CREATOR_PROCESSES = 3
CREATOR_CONCURRENCY = 12  # per process: creation collapses under many concurrent creators today
DELETE_CONCURRENCY = 32
HEAL_TIMEOUT_S = 1800.0
PLOT = REPORT.parent / "benchmarks-scale.svg"
PASSWORD = b"scale"

# The measures, in the table's and the plot's order: (key, label, unit of the per-ledger figure).
MEASURES = [
    ("create_s", "creation", "ms"),
    ("ls_cli_s", "`octavo ledger ls`", "ms"),
    ("iter_s", "iter_ledger_metadata", "ms"),
    ("status_s", "`octavo cluster status`", "ms"),
    ("restart_s", "restart after SIGKILL", "ms"),
    ("audit_s", "full audit", "ms"),
    ("heal_s", "heal a lost bookie", "ms"),
    ("gc_s", "GC pass after deleting half", "ms"),
]


# -- creation and deletion, in worker processes ---------------------------------------------------------------
def _create_worker(etcd: str, count: int, concurrency: int) -> tuple[int, int]:
    return asyncio.run(_create(etcd, count, concurrency))


async def _create(etcd: str, count: int, concurrency: int) -> tuple[int, int]:
    """Create `count` small closed ledgers; returns (created, failed attempts retried)."""
    left = count
    retries = 0
    async with Client(etcd, options=ClientOptions(bookie_list_ttl_s=1.0)) as client:
        async def one() -> None:
            nonlocal left, retries
            while left > 0:
                left -= 1
                for attempt in range(20):
                    try:
                        w = await client.create_ledger(3, 3, 2, password=PASSWORD)
                        await w.append_many([ENTRY] * ENTRIES_PER_LEDGER)
                        await w.close()
                        break
                    except Exception:
                        retries += 1
                        await asyncio.sleep(0.05 * (attempt + 1))
                else:
                    raise RuntimeError("a ledger could not be created in 20 attempts")

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return count, retries


def _delete_worker(etcd: str, ids: list[int]) -> int:
    async def run() -> int:
        async with Client(etcd) as client:
            queue = list(ids)

            async def one() -> None:
                while queue:
                    await client.delete_ledger(queue.pop())

            await asyncio.gather(*(one() for _ in range(DELETE_CONCURRENCY)))
        return len(ids)
    return asyncio.run(run())


def in_processes(fn, args_list: list[tuple]) -> list:  # type: ignore[no-untyped-def,type-arg]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(len(args_list)) as pool:
        return pool.starmap(fn, args_list)


# -- measures ------------------------------------------------------------------------------------------------
def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cli(*args: str) -> tuple[float, int]:
    """Run `octavo ARGS`; returns (seconds, lines printed). Fails on a non-zero exit."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "octavo.cli.main", *args], capture_output=True, check=False)
    took = time.monotonic() - t0
    if out.returncode != 0:
        raise RuntimeError(f"octavo {' '.join(args)} exited {out.returncode}: {out.stderr.decode()[-2000:]}")
    return took, out.stdout.count(b"\n")


def status(address: str) -> pb.BookieStatus:
    with BookieConnection(address) as conn:
        return conn.status()


async def heal(client: Client, cluster: LocalCluster) -> dict[str, float]:
    """Lose LOST for good; returns the seconds until no ledger names it, and its share."""
    share = 0
    async for meta in client.iter_ledger_metadata():
        share += any(LOST in b for _, b in meta.ensembles)
    killed = time.monotonic()
    cluster.bookies[LOST].kill()
    shutil.rmtree(cluster.bookies[LOST].data_dir)
    marks = client.metadata_store.layout.underreplicated
    first_mark = 0.0
    healed = 0.0
    left = share
    while time.monotonic() - killed < HEAL_TIMEOUT_S:
        await asyncio.sleep(1.0)
        if await client.etcd.get_prefix(marks, limit=1, keys_only=True):
            first_mark = first_mark or time.monotonic()
            continue
        if not first_mark and time.monotonic() - killed < 30:
            continue
        left = 0
        async for meta in client.iter_ledger_metadata():
            left += any(LOST in b for _, b in meta.ensembles)
        if not left:
            healed = time.monotonic()
            break
    return {"share": float(share), "heal_s": (healed - killed) if healed else float("nan"),
            "first_mark_s": (first_mark - killed) if first_mark else float("nan"), "unhealed": float(left)}


async def rung(root: str, ledgers: int) -> dict[str, float]:
    ports = {f"bookie-{i}": free_port() for i in range(BOOKIES)}
    out: dict[str, float] = {"ledgers": float(ledgers)}
    with LocalCluster(root, bookies=BOOKIES, bookie_ports=ports,
                      bookie_args=["--lost-bookie-delay-s", "2"]) as cluster:
        etcd = cluster.etcd_endpoint
        bookies = cluster.bookies
        rss_before = {b: rss_bytes(p.proc.pid) for b, p in bookies.items() if p.proc}

        t0 = time.monotonic()
        per = [ledgers // CREATOR_PROCESSES + (i < ledgers % CREATOR_PROCESSES) for i in range(CREATOR_PROCESSES)]
        results = in_processes(_create_worker, [(etcd, n, CREATOR_CONCURRENCY) for n in per])
        out["create_s"] = time.monotonic() - t0
        out["create_retries"] = float(sum(r for _, r in results))
        print(f"{ledgers:,}: created in {out['create_s']:.1f}s ({ledgers / out['create_s']:,.0f}/s, "
              f"{out['create_retries']:.0f} retries)", flush=True)
        await asyncio.sleep(2.0)

        held = {b: status(p.address).ledger_count for b, p in bookies.items()}
        rss_after = {b: rss_bytes(p.proc.pid) for b, p in bookies.items() if p.proc}
        growth = [(rss_after[b] - rss_before[b]) / held[b] for b in bookies if held[b]]
        out["rss_mib"] = max(rss_after.values()) / (1 << 20)
        out["rss_per_ledger_b"] = sorted(growth)[len(growth) // 2]
        assert cluster.etcd is not None
        db = Path(cluster.etcd.data_dir) / "member" / "snap" / "db"
        out["etcd_db_mib"] = db.stat().st_size / (1 << 20)
        print(f"  bookie RSS {out['rss_mib']:.0f} MiB (+{out['rss_per_ledger_b']:,.0f} B per ledger held), "
              f"etcd db {out['etcd_db_mib']:.1f} MiB", flush=True)

        out["ls_cli_s"], lines = cli("ledger", "ls", "--etcd", etcd)
        if lines < ledgers:
            raise RuntimeError(f"octavo ledger ls printed {lines} lines for {ledgers} ledgers")
        async with Client(etcd, options=ClientOptions(bookie_list_ttl_s=0.5)) as client:
            t0 = time.monotonic()
            count = 0
            async for _ in client.iter_ledger_metadata():
                count += 1
            out["iter_s"] = time.monotonic() - t0
            out["status_s"], _ = cli("cluster", "status", "--etcd", etcd)
            print(f"  ledger ls {out['ls_cli_s']:.2f}s, iter_ledger_metadata {out['iter_s']:.2f}s ({count}), "
                  f"cluster status {out['status_s']:.2f}s", flush=True)

            t0 = time.monotonic()
            bookies[RESTARTED].kill()
            bookies[RESTARTED].start()
            out["restart_s"] = time.monotonic() - t0
            proc = bookies[RESTARTED].proc
            assert proc is not None
            out["rss_restarted_mib"] = rss_bytes(proc.pid) / (1 << 20)
            # The restarted bookie holds its ledger table (loaded from the index) and no traffic's leftovers.
            out["rss_restarted_per_ledger_b"] = (rss_bytes(proc.pid) - rss_before[RESTARTED]) / held[RESTARTED]
            print(f"  restart after SIGKILL {out['restart_s']:.2f}s (RSS then {out['rss_restarted_mib']:.0f} MiB)",
                  flush=True)

            marks = UnderReplication(client.etcd, client.metadata_store.layout)
            registered = set(await client.bookies(refresh=True))
            cookies = await client.metadata_store.cookie_holders()
            t0 = time.monotonic()
            marked = await audit_ledgers(client, marks, registered, cookies, set(), "scale bench")
            out["audit_s"] = time.monotonic() - t0
            assert marked == 0, f"the audit of a healthy cluster marked {marked} ledgers"
            print(f"  full audit {out['audit_s']:.2f}s", flush=True)

            out.update(await heal(client, cluster))
            print(f"  healed {LOST}'s {out['share']:,.0f} ledgers in {out['heal_s']:.1f}s (first mark after "
                  f"{out['first_mark_s']:.1f}s, {out['unhealed']:.0f} left)", flush=True)

            ids = [m.ledger_id async for m in client.iter_ledger_metadata()][:ledgers // 2]
            chunks = [ids[i::CREATOR_PROCESSES] for i in range(CREATOR_PROCESSES)]
            t0 = time.monotonic()
            in_processes(_delete_worker, [(etcd, c) for c in chunks])
            out["delete_s"] = time.monotonic() - t0
        # The deletion watch drops them on every bookie; the GC pass after it finds what the watch left.
        left_ledgers = ledgers - len(ids)
        survivors = [p for b, p in bookies.items() if b != LOST]
        while time.monotonic() - t0 < 300:
            if all(status(p.address).ledger_count <= left_ledgers for p in survivors):
                break
            await asyncio.sleep(0.5)
        out["watch_s"] = time.monotonic() - t0
        print(f"  deleted {len(ids):,} in {out['delete_s']:.1f}s; the watch dropped them everywhere after "
              f"{out['watch_s']:.1f}s", flush=True)
        gc_s = []
        for bookie_id, proc_ in bookies.items():
            if bookie_id == LOST:
                continue
            with BookieConnection(proc_.address) as conn:
                t0 = time.monotonic()
                report = conn.admin.RunGc(pb.RunGcRequest(), timeout=600)
                gc_s.append(time.monotonic() - t0)
            print(f"  GC on {bookie_id}: {gc_s[-1]:.2f}s ({report.ledgers_dropped} dropped, {report.logs_deleted} "
                  f"logs deleted of {report.logs_checked})", flush=True)
        out["gc_s"] = max(gc_s)
    return out


# -- report --------------------------------------------------------------------------------------------------
def per_ledger(r: dict[str, float], key: str) -> float:
    """Milliseconds per ledger (healing: per ledger of the lost bookie's share)."""
    n = r["share"] if key == "heal_s" else r["ledgers"] // 2 if key == "watch_s" else r["ledgers"]
    return r[key] / n * 1000


def svg_plot(results: list[dict[str, float]]) -> str:
    """Per-ledger cost of each measure at each rung, relative to the first rung (log-scaled rungs)."""
    import math

    width, height, left, top = 640, 300, 60, 40
    rungs = [r["ledgers"] for r in results]
    ratios = {key: [per_ledger(r, key) / per_ledger(results[0], key) for r in results] for key, _, _ in MEASURES}
    ratios["rss"] = [r["rss_per_ledger_b"] / results[0]["rss_per_ledger_b"] for r in results]
    high = max(2.5, max(max(v) for v in ratios.values() if all(math.isfinite(x) for x in v)) * 1.1)
    lo_r, hi_r = math.log10(min(rungs)), math.log10(max(rungs)) if len(rungs) > 1 else math.log10(min(rungs)) + 1

    def x(n: float) -> float:
        return left + (math.log10(n) - lo_r) / max(hi_r - lo_r, 1e-9) * (width - left - 200)

    def y(v: float) -> float:
        return top + height - min(v, high) / high * height

    colors = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b7791f", "#c53030", "#319795", "#4a5568", "#d53f8c"]
    labels = {key: label.strip("`") for key, label, _ in MEASURES} | {"rss": "bookie RSS per ledger"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 90}" '
             'font-family="sans-serif" font-size="11">',
             '<text x="10" y="16" font-size="13">Per-ledger cost against the number of ledgers, relative to '
             f'{int(rungs[0]):,} (target: at most 2)</text>',
             f'<line x1="{left}" y1="{y(2):.1f}" x2="{width - 200}" y2="{y(2):.1f}" stroke="#999" '
             'stroke-dasharray="4 3"/>',
             f'<text x="{left - 6}" y="{y(2) + 4:.1f}" text-anchor="end">2x</text>',
             f'<text x="{left - 6}" y="{y(1) + 4:.1f}" text-anchor="end">1x</text>',
             f'<line x1="{left}" y1="{top + height}" x2="{width - 200}" y2="{top + height}" stroke="#333"/>']
    for n in rungs:
        parts.append(f'<text x="{x(n):.1f}" y="{top + height + 16}" text-anchor="middle">{int(n):,}</text>')
    for i, (key, values) in enumerate(ratios.items()):
        color = colors[i % len(colors)]
        points = [(x(n), y(v)) for n, v in zip(rungs, values, strict=True) if math.isfinite(v)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                     + " ".join(f"{px:.1f},{py:.1f}" for px, py in points) + '"/>')
        for (px, py), v in zip(points, values, strict=False):
            parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{color}"><title>{labels[key]}: '
                         f'{v:.2f}x</title></circle>')
        parts.append(f'<text x="{width - 190}" y="{top + 12 + i * 16}" fill="{color}">{labels[key]}</text>')
    parts.append(f'<text x="{left + (width - left - 200) / 2}" y="{top + height + 36}" text-anchor="middle">'
                 'ledgers in the cluster</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def report(results: list[dict[str, float]]) -> str:
    rows = []
    for key, label, _ in MEASURES:
        cells = [label]
        for r in results:
            cells.append(f"{r[key]:.2f} s ({per_ledger(r, key):.3f})")
        cells.append(f"{per_ledger(results[-1], key) / per_ledger(results[0], key):.2f}x")
        rows.append(cells)
    rows.append(["bookie RSS, largest (growth per ledger held, median)"]
                + [f"{r['rss_mib']:.0f} MiB ({r['rss_per_ledger_b']:,.0f} B)" for r in results]
                + [f"{results[-1]['rss_per_ledger_b'] / results[0]['rss_per_ledger_b']:.2f}x"])
    rows.append(["restarted bookie's RSS (growth per ledger held)"]
                + [f"{r['rss_restarted_mib']:.0f} MiB ({r['rss_restarted_per_ledger_b']:,.0f} B)" for r in results]
                + [f"{results[-1]['rss_restarted_per_ledger_b'] / results[0]['rss_restarted_per_ledger_b']:.2f}x"])
    rows.append(["deleting half, until every bookie's watch dropped them"]
                + [f"{r['watch_s']:.1f} s ({per_ledger(r, 'watch_s'):.3f})" for r in results]
                + [f"{per_ledger(results[-1], 'watch_s') / per_ledger(results[0], 'watch_s'):.2f}x"])
    rows.append(["etcd database file (per ledger)"]
                + [f"{r['etcd_db_mib']:.1f} MiB ({r['etcd_db_mib'] * (1 << 20) / r['ledgers']:,.0f} B)"
                   for r in results] + ["-"])
    rows.append(["creation retries"] + [f"{r['create_retries']:.0f}" for r in results] + ["-"])
    rows.append(["lost bookie's share (ledgers)"] + [f"{r['share']:,.0f}" for r in results] + ["-"])
    headers = ["measure"] + [f"{int(r['ledgers']):,} ledgers: s (ms per ledger)" for r in results] + [
        f"per ledger, {int(results[-1]['ledgers']):,} / {int(results[0]['ledgers']):,}"]
    return "\n".join([
        "## How costs grow with the number of ledgers (bench/scale_bench.py)",
        "",
        f"{machine_line()}. For each rung a fresh cluster: etcd and 4 bookies on fixed ports, every setting at its "
        "default but lost_bookie_delay_s 2. Ledgers E3/Qw3/Qa2 with 3 entries of 1 KB, closed, created by "
        f"{CREATOR_PROCESSES} processes with {CREATOR_CONCURRENCY} creations in flight each (a failed creation is "
        "retried and counted). Then: `octavo ledger ls` and `octavo cluster status` through the real CLI; "
        "`Client.iter_ledger_metadata`; a bookie SIGKILLed and started again until it serves; the auditor's full "
        "audit (its code, run from the bench); a bookie SIGKILLed with its data deleted, until no ledger names it "
        "(from the kill, so the 2 s delay and its registration's expiry count); half the ledgers deleted and one "
        "GC pass on each bookie (the slowest shown). Each cell: seconds, and in brackets milliseconds per ledger "
        "(healing: per ledger of the lost bookie's share). The last column is the per-ledger cost at the top rung "
        "over that at the bottom one (target: at most 2).",
        "",
        table(headers, rows),
        "",
        "![per-ledger cost against the rung](benchmarks-scale.svg)",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rungs", default=",".join(str(r) for r in RUNGS),
                        help="ledger counts, comma-separated (default: 1000,10000,100000)")
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    results = []
    for ledgers in [int(x) for x in args.rungs.split(",") if x]:
        root = tempfile.mkdtemp(prefix="octavo-scale-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR"))
        try:
            results.append(asyncio.run(rung(root, ledgers)))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    for key, label, _ in MEASURES:
        print(f"{label}: " + ", ".join(f"{int(r['ledgers']):,}: {per_ledger(r, key):.3f} ms/ledger"
                                       for r in results))
    if not args.no_report:
        write_section("scale", report(results))
        PLOT.write_text(svg_plot(results))
        print("wrote docs/benchmarks.md (scale) and docs/benchmarks-scale.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
