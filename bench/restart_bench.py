"""Writers through a rolling restart of the bookies: how many appends are acknowledged per second in the 5 s
after each bookie comes back, against the 5 s before the first kill, in one run.

A local cluster of 5 bookies on fixed ports (a restarted bookie comes back on its port, as behind a Kubernetes
Service; entry logs of 64 MiB, so a restart replays little) and etcd. 16 writers, each on its own E3/Qw3/Qa2
ledger, append batches of 100 entries of 1 KB without pause and keep their handles for the whole run. Each
round SIGKILLs the next bookie, starts it again at once on the same port, and counts the entries acknowledged
in the 5 s after it serves again; then the next round starts (a rolling restart, as a StatefulSet's). A writer
whose handle fails (NotEnoughBookiesError and the like) counts the failure and carries on with a new ledger.
Prints per-round figures and medians, and writes the `restart` section of docs/benchmarks.md.

Usage: python bench/restart_bench.py [--rounds N] [--writers N] [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_line, median, table, write_section

from octavo.cli.localcluster import LocalCluster, free_port
from octavo.client import Client, ClientOptions

WINDOW_S = 5.0
BATCH = 100
ENTRY = b"x" * 1024
BOOKIES = 5


class Load:
    """The writers, and a log of (time, entries acknowledged) for counting any window afterwards."""

    def __init__(self, client: Client, writers: int) -> None:
        self.client = client
        self.writers = writers
        self.acked: list[tuple[float, int]] = []
        self.failures: list[tuple[float, str]] = []
        self.ensemble_changes = 0
        self.stop = False

    async def writer(self) -> None:
        while not self.stop:
            try:
                handle = await self.client.create_ledger(3, 3, 2)
            except Exception as e:  # not enough bookies at this moment: try again shortly
                self.failures.append((time.monotonic(), type(e).__name__))
                await asyncio.sleep(0.1)
                continue
            try:
                while not self.stop:
                    await handle.append_many([ENTRY] * BATCH)
                    self.acked.append((time.monotonic(), BATCH))
            except Exception as e:
                self.failures.append((time.monotonic(), type(e).__name__))
            finally:
                self.ensemble_changes += handle.ensemble_changes

    def count(self, start: float, end: float) -> int:
        times = [t for t, _ in self.acked]
        return sum(n for _, n in self.acked[bisect.bisect_left(times, start):bisect.bisect_left(times, end)])

    def failed_in(self, start: float, end: float) -> collections.Counter[str]:
        return collections.Counter(kind for t, kind in self.failures if start <= t < end)


async def run(rounds: int, writers: int) -> list[dict[str, float]]:
    root = tempfile.mkdtemp(prefix="octavo-restart-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR"))
    try:
        return await _run_in(root, rounds, writers)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # gigabytes of logs: never leave them behind


async def _run_in(root: str, rounds: int, writers: int) -> list[dict[str, float]]:
    ports = {f"bookie-{i}": free_port() for i in range(BOOKIES)}
    results = []
    with LocalCluster(root, bookies=BOOKIES, bookie_ports=ports,
                      bookie_args=["--log-size-bytes-max", str(64 << 20)]) as cluster:
        options = ClientOptions(add_timeout_s=5.0, bookie_list_ttl_s=0.5)
        async with Client(cluster.etcd_endpoint, options=options) as client:
            load = Load(client, writers)
            tasks = [asyncio.ensure_future(load.writer()) for _ in range(writers)]
            await asyncio.sleep(3.0 + WINDOW_S)  # warm up, then a full window of steady load
            loop = asyncio.get_running_loop()
            first_kill = time.monotonic()
            before = load.count(first_kill - WINDOW_S, first_kill) / WINDOW_S
            for r in range(rounds):
                victim = f"bookie-{r % BOOKIES}"
                killed = time.monotonic()
                cluster.bookies[victim].kill()
                await loop.run_in_executor(None, cluster.bookies[victim].start)  # returns once it serves
                up = time.monotonic()
                await asyncio.sleep(WINDOW_S + 0.5)
                after = load.count(up, up + WINDOW_S) / WINDOW_S
                failures = load.failed_in(killed, up + WINDOW_S)
                results.append({"before": before, "after": after, "down_s": up - killed,
                                "failures": float(sum(failures.values()))})
                print(f"round {r + 1}: {victim} down {up - killed:.2f}s; acknowledged/s 5 s before "
                      f"{before:,.0f}, 5 s after it served again {after:,.0f} ({after / before:.0%}); handle "
                      f"failures {dict(failures) or 0}", flush=True)
            load.stop = True
            await asyncio.gather(*tasks, return_exceptions=True)
            print(f"ensemble changes (handles that ended): {load.ensemble_changes}")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    results = asyncio.run(run(args.rounds, args.writers))
    before = median([r["before"] for r in results])
    after = median([r["after"] for r in results])
    ratio = median([r["after"] / r["before"] for r in results if r["before"]])
    failures = sum(r["failures"] for r in results)
    print(f"median acknowledged/s: before {before:,.0f}, after {after:,.0f}, after/before {ratio:.0%}; "
          f"handle failures over all rounds: {failures:.0f}")
    if not args.no_report:
        rows = [[str(i + 1), f"{r['down_s']:.2f}", f"{r['before']:,.0f}", f"{r['after']:,.0f}",
                 f"{r['after'] / r['before']:.0%}", f"{r['failures']:.0f}"] for i, r in enumerate(results)]
        write_section("restart", "\n".join([
            "## Writers through a rolling restart of the bookies (bench/restart_bench.py)",
            "",
            f"{machine_line()}. 5 bookies on fixed ports (entry logs of 64 MiB) and etcd; {args.writers} "
            f"writers, each on its own E3/Qw3/Qa2 ledger kept for the whole run, appending batches of {BATCH} "
            "entries of 1 KB without pause. Each round SIGKILLs the next bookie and starts it again at once on "
            "its port; \"after\" counts the entries acknowledged in the "
            f"{WINDOW_S:g} s after it serves again, \"before\" those in the {WINDOW_S:g} s before the first kill. "
            "A handle that fails is replaced by a new ledger and counted.",
            "",
            table(["round", "bookie down (s)", "acknowledged/s before", "after", "after / before",
                   "handle failures"], rows),
            "",
            f"Medians: before {before:,.0f}/s, after {after:,.0f}/s, after/before {ratio:.0%}; handle failures "
            f"over all rounds: {failures:.0f}.",
        ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
