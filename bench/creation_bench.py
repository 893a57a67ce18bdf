"""Ledger creation under many concurrent creators: processes x creators that each create a ledger (E3 Qw3 Qa2),
append one 1 KB entry and close it, over and over, on a local cluster of etcd and 4 bookies (real processes).

Side by side in one run, on the same cluster: Octavo's allocation (id blocks, grouped CASes) and the one it
replaced (one CAS on the counter per id, retried at once 50 times), for each shape of load. Per shape: ledgers
created, written and closed per second (all processes together, from a common start), failures, per-ledger
latency p50/p99, CPU per ledger of the client processes, etcd and the bookies (from /proc), and etcd requests
per ledger (its own metrics). Medians of --rounds. Writes the `creation` section of docs/benchmarks.md.

Usage: python bench/creation_bench.py [--rounds N] [--shapes 8x32,1x32,4x64] [--ledgers 400] [--no-report]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, median, table, write_section

from octavo.cli.localcluster import LocalCluster

CREATORS = Path(__file__).resolve().parents[1] / "e2e" / "jobs" / "creators.py"
BOOKIES = 4
BASELINE_LEDGERS_MAX = 100  # per process: the old allocation is slow and fails half its creations at 8 x 32
TARGET_PER_S = 1000


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def etcd_requests(endpoint: str) -> float:
    url = endpoint if "://" in endpoint else "http://" + endpoint
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("grpc_server_handled_total") and ('"Txn"' in line or '"Range"' in line))


def one_run(cluster: LocalCluster, procs: int, creators: int, ledgers: int, allocation: str) -> dict[str, float]:
    pids = {"etcd": cluster.etcd.proc.pid, **{k: b.proc.pid for k, b in cluster.bookies.items()}}  # type: ignore[union-attr]
    cpu_before = {k: cpu_s(p) for k, p in pids.items()}
    requests_before = etcd_requests(cluster.etcd_endpoint)
    start_at = time.time() + 3 + procs * 0.3  # after every process imported and connected
    running = [subprocess.Popen([sys.executable, str(CREATORS), cluster.etcd_endpoint, "default", "--creators",
                                 str(creators), "--ledgers", str(ledgers), "--start-at", str(start_at),
                                 "--allocation", allocation], stdout=subprocess.PIPE, text=True)
               for _ in range(procs)]
    outputs = [json.loads(p.communicate(timeout=900)[0]) for p in running]
    cpu_after = {k: cpu_s(p) for k, p in pids.items()}
    failures = [f for o in outputs for f in o["failures"]]
    seconds = max(o["seconds"] for o in outputs)
    latencies = sorted(x for o in outputs for x in o["latencies_ms"])
    done = max(1, sum(o["completed"] for o in outputs))
    bookie_cpu = sum(cpu_after[k] - cpu_before[k] for k in pids if k != "etcd")
    return {
        "per_s": done / seconds,
        "failures": float(len(failures)),
        "attempts": float(procs * ledgers),
        "p50_ms": latencies[len(latencies) // 2],
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "client_us": sum(o["cpu_s"] for o in outputs) / done * 1e6,
        "etcd_us": (cpu_after["etcd"] - cpu_before["etcd"]) / done * 1e6,
        "bookies_us": bookie_cpu / done * 1e6,
        "etcd_requests": (etcd_requests(cluster.etcd_endpoint) - requests_before) / done,
        "first_failure": failures[0] if failures else "",  # type: ignore[dict-item]
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default="8x32,1x32,4x64", help="processes x creators, comma-separated")
    parser.add_argument("--ledgers", type=int, default=400, help="per process and run")
    parser.add_argument("--no-baseline", action="store_true", help="skip the old allocation")
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    allocations = ["blocks"] + ([] if args.no_baseline else ["per-id-cas"])
    results: dict[tuple[int, int, str], list[dict[str, float]]] = {}
    root = tempfile.mkdtemp(prefix="octavo-creation-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR"))
    try:
        with LocalCluster(root, bookies=BOOKIES) as cluster:
            for r in range(args.rounds):
                for procs, creators in shapes:
                    for allocation in allocations:  # side by side within each round
                        ledgers = args.ledgers if allocation == "blocks" else min(args.ledgers, BASELINE_LEDGERS_MAX)
                        res = one_run(cluster, procs, creators, ledgers, allocation)
                        results.setdefault((procs, creators, allocation), []).append(res)
                        print(f"round {r + 1} {procs}x{creators} {allocation}: {res['per_s']:,.0f} ledgers/s, "
                              f"{res['failures']:.0f} of {res['attempts']:.0f} failed, p50 {res['p50_ms']:.1f} ms "
                              f"p99 {res['p99_ms']:.1f} ms; CPU us/ledger client {res['client_us']:.0f} etcd "
                              f"{res['etcd_us']:.0f} bookies {res['bookies_us']:.0f}; etcd requests/ledger "
                              f"{res['etcd_requests']:.2f} {res['first_failure'][:100]}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    rows = []
    for (procs, creators, allocation), runs in results.items():
        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return median([x[key] for x in runs])
        rows.append([f"{procs} x {creators}", "id blocks, grouped CASes" if allocation == "blocks" else
                     "one CAS per id (before)", f"{med('per_s'):,.0f}",
                     f"{sum(x['failures'] for x in runs):.0f} of {sum(x['attempts'] for x in runs):.0f}",
                     f"{med('p50_ms'):.1f} / {med('p99_ms'):.1f}", f"{med('client_us'):,.0f}", f"{med('etcd_us'):,.0f}",
                     f"{med('bookies_us'):,.0f}", f"{med('etcd_requests'):.2f}"])
        print(" | ".join(rows[-1]))
    if not args.no_report:
        headline = results.get((8, 32, "blocks"))
        verdict = ""
        if headline:
            rate = median([x["per_s"] for x in headline])
            failed = sum(x["failures"] for x in headline)
            cpu_us = sum(median([x[k] for x in headline]) for k in ("client_us", "etcd_us", "bookies_us"))
            ceiling = (os.cpu_count() or 1) * 1e6 / cpu_us
            verdict = (f" At 8 processes x 32 creators: **{rate:,.0f} ledgers/s** with {failed:.0f} failures (target: "
                       f"at least {TARGET_PER_S:,} ledgers/s, 0 failures: "
                       f"{'met' if rate >= TARGET_PER_S and not failed else 'not met'}). The processes spent "
                       f"{cpu_us:,.0f} us of CPU per ledger together, so this machine's {os.cpu_count()} cores "
                       f"allow at most about {ceiling:,.0f} ledgers/s with nothing else running: the rate is "
                       "bound by CPU, not by contention.")
        write_section("creation", "\n".join([
            "## Ledger creation under concurrent creators (bench/creation_bench.py)",
            "",
            f"{machine_line()}. etcd and {BOOKIES} bookies as local processes; each client process runs its "
            "creators on one event loop, each creator creating a ledger (E3 Qw3 Qa2), appending one 1 KB entry "
            "and closing it, again and again; all processes start together. The old allocation (one CAS on the "
            f"counter per id, retried at once 50 times) runs beside the new one in every round, with at most "
            f"{BASELINE_LEDGERS_MAX} ledgers per process. Medians of {args.rounds} rounds; CPU per ledger done, "
            "from /proc (client: all client processes together); etcd requests are its Range and Txn calls." + verdict,
            "",
            table(["processes x creators", "allocation", "ledgers/s", "failed", "p50 / p99 ms per ledger",
                   "client CPU us/ledger", "etcd CPU us/ledger", "bookies CPU us/ledger", "etcd requests/ledger"],
                  rows),
            "",
            "Where the cost went: before, every creation raced every other for the counter (N creators spent N-1 "
            "wasted round trips per id, and gave up after 50), each close and creation was an etcd call of its "
            "own, and each close sent a unary write-close to each of its three bookies. Now ids come from blocks "
            "reserved with one CAS, the creations and closes a process makes while a transaction is in flight "
            "share the next one, registrations are read once per round trip for all waiting creators, and the "
            "write-close rides the add stream. What remains is gRPC messages (a ledger's add and write-close "
            "reach each of its bookies in a request shared with other ledgers) and each bookie's check of a "
            "ledger it meets for the first time against etcd (one grouped "
            "etcd transaction per round trip per bookie, about 0.3 etcd requests per ledger), which keeps ids "
            "from being squatted (docs/architecture.md, \"What a bookie takes on faith\").",
        ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
