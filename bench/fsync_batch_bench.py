"""fsync_policy = "batch" (the paranoid policy) with group commit, against the per-request fdatasync it replaced:
add latency at a fixed rate and the most entries a second, this tree against an earlier commit in the same run,
and the default policy ("none") both ways to show it did not move.

Each measurement is a fresh local cluster (etcd and 3 bookies started with `--fsync-policy POLICY`) in a child
process whose PYTHONPATH points at one tree's packages. In it, one ledger E=3 Qw=3 Qa=2 gets 1 KiB entries one
per call at each fixed rate for LATENCY_S (open loop: each entry's latency runs from its scheduled time to its
acknowledgement, as in bench/peers), then THROUGHPUT_LEDGERS ledgers are written as fast as they go for
THROUGHPUT_S (append_many of THROUGHPUT_CHUNK entries per call, one task per ledger). The trees alternate within a
round; figures are medians over the rounds.

    python bench/fsync_batch_bench.py --before 77625fb           # a git worktree of that commit is made in /tmp
    python bench/fsync_batch_bench.py --before 77625fb --rounds 1 --no-write
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
ENTRY_BYTES = 1024
RATES = (500, 2000)
LATENCY_S = 10.0
THROUGHPUT_S = 10.0
THROUGHPUT_LEDGERS = 8
THROUGHPUT_CHUNK = 64
POLICIES = ("batch", "none")


async def open_loop(writer: object, payload: bytes, rate: int, seconds: float) -> list[float]:
    """Latencies (ms) of `rate * seconds` entries appended one per call on a fixed schedule."""
    from octavo.client import BufferFullError

    loop = asyncio.get_running_loop()
    n = int(rate * seconds)
    latencies = [0.0] * n
    futures = []
    t0 = loop.time()
    for i in range(n):
        scheduled = t0 + i / rate
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            future = writer.append_nowait(payload)  # type: ignore[attr-defined]
        except BufferFullError:
            future = asyncio.ensure_future(writer.append(payload))  # type: ignore[attr-defined]

        def done(f: asyncio.Future[int], i: int = i, scheduled: float = scheduled) -> None:
            latencies[i] = (loop.time() - scheduled) * 1000
        future.add_done_callback(done)
        futures.append(future)
    await asyncio.wait_for(asyncio.gather(*futures), 300)
    return latencies


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def workload(etcd: str) -> dict[str, float]:
    from octavo.client import Client

    out: dict[str, float] = {}
    payload = os.urandom(ENTRY_BYTES)
    async with Client(etcd) as client:
        for rate in RATES:
            writer = await client.create_ledger(3, 3, 2, password=b"bench")
            lat = await open_loop(writer, payload, rate, LATENCY_S)
            out[f"p50_{rate}"], out[f"p99_{rate}"] = pct(lat, 50), pct(lat, 99)
            await writer.close()
        writers = [await client.create_ledger(3, 3, 2, password=b"bench") for _ in range(THROUGHPUT_LEDGERS)]
        count = [0]
        deadline = time.monotonic() + THROUGHPUT_S

        async def drive(w: object) -> None:
            while time.monotonic() < deadline:
                await w.append_many([payload] * THROUGHPUT_CHUNK)  # type: ignore[attr-defined]
                count[0] += THROUGHPUT_CHUNK

        t0 = time.monotonic()
        await asyncio.gather(*(drive(w) for w in writers))
        out["throughput"] = count[0] / (time.monotonic() - t0)
        await asyncio.gather(*(w.close() for w in writers))
    return out


def measure(policy: str) -> dict[str, float]:
    """In the child: a fresh cluster of 3 bookies with the policy; the workload's figures."""
    from octavo.cli.localcluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="octavo-fsync-") as d, \
            LocalCluster(d, bookies=3, bookie_args=["--fsync-policy", policy]) as cluster:
        return asyncio.run(workload(cluster.etcd_endpoint))


def run_child(tree: Path, policy: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / d) for d in PACKAGE_DIRS)}
    out = subprocess.run([sys.executable, __file__, "--measure", policy], env=env, capture_output=True,
                         text=True, timeout=1200)
    if out.returncode != 0:
        raise RuntimeError(f"{tree} {policy}: exit {out.returncode}\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--before", default="77625fb", help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    before_tree = Path(tempfile.gettempdir()) / f"octavo-before-{args.before}"
    if not before_tree.exists():
        subprocess.run(["git", "worktree", "add", "-f", str(before_tree), args.before], cwd=ROOT, check=True,
                       capture_output=True)
    policies = args.policies.split(",")
    runs: dict[tuple[str, str], list[dict[str, float]]] = collections.defaultdict(list)
    for r in range(args.rounds):
        for policy in policies:
            trees = (("before", before_tree), ("after", ROOT))
            for name, tree in trees if r % 2 == 0 else trees[::-1]:
                figures = run_child(tree, policy)
                runs[(policy, name)].append(figures)
                print(f"round {r + 1} {policy} {name}: {json.dumps({k: round(v, 1) for k, v in figures.items()})}",
                      flush=True)
    keys = [*(f"p{p}_{rate}" for rate in RATES for p in (50, 99)), "throughput"]
    rows = []
    for policy in policies:
        for name in ("before", "after"):
            m = {k: median([x[k] for x in runs[(policy, name)]]) for k in keys}
            rows.append([policy, name, *(f"{m[k]:,.1f}" for k in keys[:-1]), f"{m['throughput']:,.0f}"])
    body = "\n".join([
        "## fsync_policy = batch: group commit",
        "",
        f"{machine_line()}. `python bench/fsync_batch_bench.py --before {args.before}`: for each policy a fresh "
        f"local cluster (etcd, 3 bookies started with `--fsync-policy`), one ledger E=3 Qw=3 Qa=2 written with "
        f"{ENTRY_BYTES} B entries one per call at {' and '.join(f'{r:,}' for r in RATES)}/s for {LATENCY_S:g} s "
        f"each (open loop: latency from each entry's scheduled time to its acknowledgement), then "
        f"{THROUGHPUT_LEDGERS} ledgers as fast as they go for {THROUGHPUT_S:g} s (append_many of "
        f"{THROUGHPUT_CHUNK}); medians of {args.rounds} rounds, the trees alternating. Before: {args.before}, "
        "whose add path ran one fdatasync per add request under the engine lock on the bookie's event loop. "
        "After: this tree, where one fdatasync on a thread of its own covers every add written while the "
        "previous one ran (node/octavo/node/groupsync.py) and a stream's next requests are written while "
        "earlier ones wait for it (syncedadds.py). `none` is the default policy, unchanged: its rows show the "
        "noise between two runs of the same add path.",
        "",
        table(["policy", "tree", *(f"{'p50' if k.startswith('p50') else 'p99'} at {k.split('_')[1]}/s, ms"
                                   for k in keys[:-1]), "entries/s, 8 ledgers"], rows),
        "",
        "fsync latencies on these virtual disks (~100-200 us) may not reach stable storage (docs/DESIGN): the "
        "ratio between the trees is the figure to read, not the absolute one.",
    ])
    print(body)
    if not args.no_write:
        write_section("fsync-batch", body)


if __name__ == "__main__":
    main()
