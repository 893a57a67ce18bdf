"""What idle bookies cost etcd: KV requests a second from a cluster doing nothing, by cluster size, this tree
against an earlier commit in the same run (issue 31 found the self-healing loops polling etcd every second).

Each measurement is a fresh local cluster (etcd and N bookies, every setting at its default) in a child process
whose PYTHONPATH points at one tree's packages: WARMUP_S after start, then etcd's own request counters
(grpc_server_handled_total on /metrics) over MEASURE_S. The trees alternate within a round; figures are medians
over the rounds.

    python bench/idle_etcd_bench.py --before 8ceb94f           # a git worktree of that commit is made in /tmp
    python bench/idle_etcd_bench.py --before 8ceb94f --sizes 3,12 --rounds 2 --no-write
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from common import machine_line, median, table, write_section  # noqa: E402

PACKAGE_DIRS = ("shared", "node", "client", "cli", "proto", "operator")
WARMUP_S = 15.0
MEASURE_S = 30.0


def per_method(endpoint: str) -> collections.Counter[str]:
    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5).read().decode()
    counts: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if line.startswith("grpc_server_handled_total{"):
            service = re.search(r'grpc_service="([\w.]+)"', line)
            method = re.search(r'grpc_method="(\w+)"', line)
            if service and method:
                counts[f"{service.group(1).rsplit('.', 1)[-1]}.{method.group(1)}"] += int(float(line.rsplit(" ", 1)[1]))
    return counts


def measure(bookies: int) -> dict[str, float]:
    """In the child: a fresh cluster of `bookies`, idle; requests a second by service and method."""
    from octavo.cli.localcluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="octavo-idle-") as d, LocalCluster(d, bookies=bookies) as cluster:
        time.sleep(WARMUP_S)
        before = per_method(cluster.etcd_endpoint)
        time.sleep(MEASURE_S)
        after = per_method(cluster.etcd_endpoint)
    return {k: (after[k] - before[k]) / MEASURE_S for k in after if after[k] - before[k]}


def run_child(tree: Path, bookies: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / d) for d in PACKAGE_DIRS)}
    out = subprocess.run([sys.executable, __file__, "--measure", str(bookies)], env=env, capture_output=True,
                         text=True, check=True, timeout=600)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def kv(rates: dict[str, float]) -> float:
    return sum(v for k, v in rates.items() if k.startswith("KV."))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--before", default="8ceb94f", help="the commit to compare against")
    parser.add_argument("--sizes", default="3,12", help="cluster sizes (bookies), comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    before_tree = Path(tempfile.gettempdir()) / f"octavo-before-{args.before}"
    if not before_tree.exists():
        subprocess.run(["git", "worktree", "add", "-f", str(before_tree), args.before], cwd=ROOT, check=True,
                       capture_output=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    runs: dict[tuple[str, int], list[dict[str, float]]] = collections.defaultdict(list)
    for r in range(args.rounds):
        for n in sizes:
            for name, tree in (("before", before_tree), ("after", ROOT)):
                rates = run_child(tree, n)
                runs[(name, n)].append(rates)
                print(f"round {r + 1} {name} {n} bookies: KV {kv(rates):.2f}/s {json.dumps(rates)}", flush=True)
    rows = []
    for n in sizes:
        b = median([kv(x) for x in runs[("before", n)]])
        a = median([kv(x) for x in runs[("after", n)]])
        methods = collections.Counter[str]()
        for x in runs[("after", n)]:
            methods.update({k: v / len(runs[("after", n)]) for k, v in x.items() if k.startswith("KV.")})
        rows.append([str(n), f"{b:.2f}", f"{b / n:.2f}", f"{a:.2f}", f"{a / n:.3f}", f"{a / b:.3f}" if b else "-",
                     ", ".join(f"{k[3:]} {v:.2f}" for k, v in methods.most_common())])
    body = "\n".join([
        "## Idle etcd load: what bookies doing nothing cost etcd",
        "",
        f"{machine_line()}. `python bench/idle_etcd_bench.py --before {args.before}`: for each size a fresh local "
        f"cluster with every setting at its default, idle; etcd's KV requests (its own counters) over "
        f"{MEASURE_S:g} s after {WARMUP_S:g} s of warm-up, medians of {args.rounds} rounds, the two trees alternating. "
        f"Before: {args.before}, whose self-healing loops read etcd every second in every bookie (the election, the "
        "registrations, the marks). After: this tree, where they wait on one etcd watch per bookie "
        "(node/octavo/node/wakeups.py) and pass at least every `autorecovery_idle_interval_s` (30 s).",
        "",
        table(["bookies", "before, KV req/s", "before, per bookie", "after, KV req/s", "after, per bookie",
               "after/before", "after, by method (req/s)"], rows),
        "",
        "What is left at idle: every bookie's damage check (every `damage_check_interval_s`, 10 s) and GC pass "
        "(every `gc_interval_ms`, 60 s), and each bookie's safety-net passes (every `autorecovery_idle_interval_s`, "
        "30 s). The registrations' lease keepalives (the Lease service, one every `registration_ttl_s`/3 per "
        "bookie) are the same before and after and not counted here.",
    ])
    print(body)
    if not args.no_write:
        write_section("idle-etcd", body)


if __name__ == "__main__":
    main()
