"""fsync_policy = "batch": how long a roll holds the engine lock (and so the bookie's event loop, where adds
run), this tree against an earlier commit in the same run.

Each measurement is a child process whose PYTHONPATH points at one tree's packages. In it, an engine (Storage,
on disk under /tmp, the flusher running) takes adds from WRITERS writers on its event loop, each waiting for its
group sync as the data plane does, while the loop rolls the active log every ROLL_EVERY_S and times each roll
(Storage.roll: the engine lock held on the loop). The adds' latencies (write to sync answered) are kept too.
The trees alternate within a round; figures are medians over the rounds.

    python bench/batch_roll_bench.py --before 6bfceee~1
    python bench/batch_roll_bench.py --before 6bfceee~1 --rounds 1 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from common import machine_line, median, table, write_section  # noqa: E402

PACKAGE_DIRS = ("shared", "node", "client", "cli", "proto")
WRITERS = 8
ENTRY_BYTES = 1024
ENTRIES_PER_ADD = 4
ROLL_EVERY_S = 0.05
SECONDS = 8.0


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def workload(data_dir: str) -> dict[str, float]:
    from octavo.node.storage import LedgerBatch, Storage
    from octavo.node.testing import small_config

    s = Storage.open(small_config(data_dir, fsync_policy="batch", log_size_bytes_max=1 << 30))
    assert s.group_sync is not None
    gs = s.group_sync
    payload = os.urandom(ENTRY_BYTES)
    rolls: list[float] = []
    adds: list[float] = []
    deadline = time.monotonic() + SECONDS

    async def writer(ledger: int) -> None:
        next_id = 0
        while time.monotonic() < deadline:
            ids = list(range(next_id, next_id + ENTRIES_PER_ADD))
            t0 = time.perf_counter()
            s.add_batch([LedgerBatch(ledger, b"k", ids, [payload] * len(ids))], sync_wait=False)
            assert await gs.wait(gs.point()) is None
            adds.append((time.perf_counter() - t0) * 1000)
            next_id += len(ids)

    async def roller() -> None:
        while time.monotonic() < deadline:
            await asyncio.sleep(ROLL_EVERY_S)
            t0 = time.perf_counter()
            rolled = s.roll()
            if rolled:
                rolls.append((time.perf_counter() - t0) * 1000)

    try:
        await asyncio.gather(roller(), *(writer(ledger) for ledger in range(1, WRITERS + 1)))
    finally:
        s.close()
    return {"roll_p50": pct(rolls, 50), "roll_p99": pct(rolls, 99), "roll_max": max(rolls), "rolls": len(rolls),
            "add_p50": pct(adds, 50), "add_p99": pct(adds, 99), "adds_per_s": len(adds) / SECONDS}


def measure() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="octavo-roll-", dir="/var/tmp") as d:
        return asyncio.run(workload(d))


def run_child(tree: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / d) for d in PACKAGE_DIRS)}
    out = subprocess.run([sys.executable, __file__, "--measure"], env=env, capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: exit {out.returncode}\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--before", default="6bfceee~1", help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure()))
        return
    commit = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    before_tree = Path(tempfile.gettempdir()) / f"octavo-before-{commit}"
    if not before_tree.exists():
        subprocess.run(["git", "worktree", "add", "-f", str(before_tree), commit], cwd=ROOT, check=True,
                       capture_output=True)
    runs: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    for r in range(args.rounds):
        trees = (("before", before_tree), ("after", ROOT))
        for name, tree in trees if r % 2 == 0 else trees[::-1]:
            figures = run_child(tree)
            runs[name].append(figures)
            print(f"round {r + 1} {name}: {json.dumps({k: round(v, 3) for k, v in figures.items()})}", flush=True)
    keys = ["roll_p50", "roll_p99", "roll_max", "add_p50", "add_p99", "adds_per_s"]
    rows = []
    for name in ("before", "after"):
        m = {k: median([x[k] for x in runs[name]]) for k in keys}
        rows.append([name, *(f"{m[k]:.3f}" for k in keys[:3]), *(f"{m[k]:.2f}" for k in keys[3:5]),
                     f"{m['adds_per_s']:,.0f}"])
    ratio = median([x["roll_p99"] for x in runs["after"]]) / median([x["roll_p99"] for x in runs["before"]])
    body = "\n".join([
        "## fsync_policy = batch: what a roll holds the event loop for",
        "",
        f"{machine_line()}. `python bench/batch_roll_bench.py --before {commit}`: in a child process per tree, an "
        f"engine (Storage, fsync_policy=batch, on disk under /var/tmp, the flusher running) takes adds of "
        f"{ENTRIES_PER_ADD} x {ENTRY_BYTES} B from {WRITERS} writers on its event loop, each waiting for its group "
        f"sync as the data plane does, while the loop rolls the active log every {ROLL_EVERY_S * 1000:g} ms for "
        f"{SECONDS:g} s and times each roll (the engine lock held on the loop); medians of {args.rounds} rounds, the "
        f"trees alternating. Before: {commit}, whose roll waited for the round in flight and fdatasynced the old "
        "log and the logs directory itself. After: this tree, where the roll hands the old log to the next round "
        "(node/octavo/node/groupsync.py).",
        "",
        table(["tree", "roll p50, ms", "roll p99, ms", "roll max, ms", "add p50, ms", "add p99, ms", "adds/s"],
              rows),
        "",
        f"p99 of a roll after / before: **{ratio:.3f}x**. A roll comes every `log_size_bytes_max` of adds (64 MiB "
        "by default); here every 50 ms, to see many. fsync latencies on these virtual disks may not reach stable "
        "storage (docs/DESIGN): read the ratio, not the absolute figures.",
    ])
    print(body)
    if not args.no_write:
        write_section("batch-roll", body)


if __name__ == "__main__":
    main()
