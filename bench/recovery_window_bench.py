"""Recovery open's reads past the LAC: the old fixed window of 1,000 ids against the growing window (16 ids,
doubled while every id is found, up to 1,000), in one run on one cluster.

A local cluster of 3 bookies and etcd. Each case is a ledger (E3/Qw3/Qa2, entries of 100 B) whose writer got
10 entries acknowledged and stopped with a tail of 0, 10, 1,000 or 5,000 entries past the LAC on every bookie of
their write sets (sent as plain adds carrying the LAC, as a writer's in-flight adds would be). Then
`recover_ledger` with one window or the other, the two alternating run by run. Measured on the recovering
client: the read requests sent (round trips: one per bookie per window), the bytes of the read answers (their
protobuf size: payloads, ids, codes and each NO_SUCH_ENTRY item's message), and the time of the whole
recovery open (CAS, fence, reads, recovery adds of the tail, closing CAS). Medians of --runs runs. Writes the
`recovery_window` section of docs/benchmarks.md.

With --sim-seeds, also the deterministic simulation (octavo.sim) of those seeds (3 virtual seconds of workload,
as its CI smoke run) with each window: the CPU seconds of each seed's run in this process, and whether it
passed. A seed runs differently with the other window (recovery sends fewer reads, so later events shift), so
the figure is the sum over seeds, not a seed against itself.

Usage: python bench/recovery_window_bench.py [--runs N] [--tails 0,10,1000,5000] [--sim-seeds 1000-1012]
       [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_line, median, table, write_section

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions
from octavo.client.bookie_client import BookieClient
from octavo.client.recovery import DEFAULT_WINDOW, RecoveryWindow, recover_ledger
from octavo.meta.ledger_metadata import CLOSED, LedgerMetadata, master_key
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

PASSWORD = b"bench"
ACKED = 10
PAYLOAD = b"p" * 100
ADD_CHUNK = 1000
OLD = RecoveryWindow(1000, 1000)
WINDOWS = {"old (1,000 fixed)": OLD, "new (16 doubling to 1,000)": DEFAULT_WINDOW}


@dataclass
class Counted:
    """The read requests the recovering client sent and the protobuf bytes of their answers."""

    requests: int = 0
    answer_bytes: int = 0
    missing_items: int = 0


COUNTED = Counted()
_plain_read = BookieClient.read


async def _counted_read(self: BookieClient, ledger_id: int, entry_ids: Any, timeout_s: float = 30.0) -> Any:
    response = await _plain_read(self, ledger_id, entry_ids, timeout_s)
    COUNTED.requests += 1
    COUNTED.answer_bytes += response.ByteSize()
    COUNTED.missing_items += sum(1 for item in response.entries if item.code == pb.NO_SUCH_ENTRY)
    return response


async def stopped_writer(cluster: LocalCluster, options: ClientOptions, tail: int) -> LedgerMetadata:
    """A ledger whose writer got ACKED entries acknowledged and stopped with `tail` more past the LAC."""
    async with Client(cluster.etcd_endpoint, options=options) as client:
        writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
        await writer.append_many([PAYLOAD] * ACKED)
        meta = writer.metadata
    per_bookie: dict[str, list[int]] = {b: [] for b in meta.last_ensemble}
    for e in range(ACKED, ACKED + tail):
        for bookie in meta.write_set_bookies(e):
            per_bookie[bookie].append(e)
    key = master_key(PASSWORD)
    for bookie, ids in per_bookie.items():
        with BookieConnection(cluster.bookies[bookie].address) as conn:
            for i in range(0, len(ids), ADD_CHUNK):
                chunk = ids[i:i + ADD_CHUNK]
                resp = conn.add(meta.ledger_id, key, chunk, [PAYLOAD] * len(chunk), last_add_confirmed=ACKED - 1)
                if set(resp.results[0].codes) != {pb.OK}:
                    raise RuntimeError(f"tail add to {bookie} failed: {resp}")
            conn.add(meta.ledger_id, key, [], [], last_add_confirmed=ACKED - 1)
    return meta


async def one_recovery(cluster: LocalCluster, options: ClientOptions, tail: int, window: RecoveryWindow
                       ) -> tuple[int, int, int, float]:
    """(read requests, answer bytes, NO_SUCH_ENTRY items, seconds) of one recovery open."""
    meta = await stopped_writer(cluster, options, tail)
    async with Client(cluster.etcd_endpoint, options=options) as client:
        await client.bookies(refresh=True)
        for bookie in meta.last_ensemble:  # connect first: the first call's channel setup is not recovery's
            await client.bookie_client(bookie).read_lac(meta.ledger_id)
        before = (COUNTED.requests, COUNTED.answer_bytes, COUNTED.missing_items)
        started = time.perf_counter()
        closed = await recover_ledger(client, meta.ledger_id, master_key(PASSWORD), window=window)
        seconds = time.perf_counter() - started
    if closed.state != CLOSED or closed.last_entry_id != ACKED + tail - 1:
        raise RuntimeError(f"recovery closed at {closed.last_entry_id}, expected {ACKED + tail - 1}")
    return (COUNTED.requests - before[0], COUNTED.answer_bytes - before[1], COUNTED.missing_items - before[2],
            seconds)


async def run(tails: list[int], runs: int) -> dict[tuple[str, int], list[tuple[int, int, int, float]]]:
    BookieClient.read = _counted_read  # type: ignore[method-assign]
    options = ClientOptions(add_timeout_s=10.0, read_timeout_s=10.0, metadata_timeout_s=5.0)
    out: dict[tuple[str, int], list[tuple[int, int, int, float]]] = {}
    with tempfile.TemporaryDirectory() as root, LocalCluster(root, bookies=3) as cluster:
        for i in range(runs):
            for tail in tails:
                names = list(WINDOWS) if i % 2 == 0 else list(WINDOWS)[::-1]
                for name in names:
                    sample = await one_recovery(cluster, options, tail, WINDOWS[name])
                    out.setdefault((name, tail), []).append(sample)
                    print(f"run {i} tail {tail:5d} {name:28s} requests {sample[0]:3d} answer bytes {sample[1]:8d} "
                          f"missing items {sample[2]:5d} {sample[3] * 1000:7.1f} ms", flush=True)
    return out


def sim_cpu(seeds: list[int], workload_s: float) -> dict[str, list[tuple[int, float, bool]]]:
    """(seed, CPU seconds, passed) of each seed's simulated run, with each window (the default of recover_ledger
    replaced for the run: the simulation's clients open ledgers with recovery through Client.open_ledger)."""
    from octavo.client import recovery
    from octavo.sim.run import run_seed
    from octavo.sim.seeds import base_dir

    plain = recovery.recover_ledger.__defaults__
    out: dict[str, list[tuple[int, float, bool]]] = {name: [] for name in WINDOWS}
    logging.disable(logging.CRITICAL)  # the simulated bookies' logs of the faults injected (outcome.ok checks)
    try:
        for i, seed in enumerate(seeds):
            for name in list(WINDOWS) if i % 2 == 0 else list(WINDOWS)[::-1]:
                recovery.recover_ledger.__defaults__ = (WINDOWS[name],)
                started = time.process_time()
                outcome = run_seed(seed, workload_s, base_dir())
                out[name].append((seed, time.process_time() - started, outcome.ok))
                print(f"seed {seed} {name:28s} {out[name][-1][1]:6.2f} s CPU ok={outcome.ok}", flush=True)
    finally:
        recovery.recover_ledger.__defaults__ = plain
        logging.disable(logging.NOTSET)
    return out


def sim_report(sim: dict[str, list[tuple[int, float, bool]]], seeds: list[int], workload_s: float) -> str:
    rows = [[name, f"{sum(s[1] for s in samples):.1f}", f"{median([s[1] for s in samples]):.2f}",
             f"{sum(1 for s in samples if s[2])} of {len(samples)}"] for name, samples in sim.items()]
    return "\n".join([
        "",
        f"The simulation (octavo.sim), seeds {seeds[0]}-{seeds[-1]} with {workload_s:g} virtual seconds of workload "
        "each, run in this process with each window (alternating): CPU seconds.",
        "",
        table(["window", "CPU s, all seeds", "median per seed", "seeds passed"], rows),
    ])


def report(results: dict[tuple[str, int], list[tuple[int, int, int, float]]], tails: list[int], runs: int) -> str:
    rows = []
    for tail in tails:
        for name in WINDOWS:
            samples = results[(name, tail)]
            rows.append([f"{tail:,}", name, f"{median([s[0] for s in samples]):.0f}",
                         f"{median([s[1] for s in samples]):,.0f}", f"{median([s[2] for s in samples]):,.0f}",
                         f"{median([s[3] for s in samples]) * 1000:.1f}"])
    return "\n".join([
        "## Recovery open: the read window past the LAC (bench/recovery_window_bench.py)",
        "",
        f"{machine_line()}. A 3-bookie local cluster; ledgers E3/Qw3/Qa2 of 100 B entries, 10 acknowledged and a "
        "tail past the LAC on every bookie of its write sets; `recover_ledger` with the old fixed window of 1,000 "
        "ids and with the growing one (16 ids, doubled while every id is found, up to 1,000), alternating run by "
        f"run; medians of {runs} runs. Read requests and answer bytes (protobuf size) counted on the recovering "
        "client; time is the whole recovery open (CAS, fence, reads, recovery adds of the tail, close).",
        "",
        table(["tail past the LAC", "window", "read requests", "answer bytes", "NO_SUCH_ENTRY items",
               "recovery open (ms)"], rows),
        "",
        "New against old, by tail: " + "; ".join(_ratios(results, tail) for tail in tails) + ". Each window is a "
        "read round and then a round of recovery adds, one after the other, so a long tail pays for the doublings "
        "(tail 5,000: 10 windows instead of 6) and saves only the NO_SUCH_ENTRY items of its last window; a tail "
        "shorter than 16 entries costs one window of 16 ids instead of 1,000 on every bookie of the write sets.",
    ])


def _ratios(results: dict[tuple[str, int], list[tuple[int, int, int, float]]], tail: int) -> str:
    old, new = (results[(name, tail)] for name in WINDOWS)
    answer = median([s[1] for s in new]) / median([s[1] for s in old])
    seconds = median([s[3] for s in new]) / median([s[3] for s in old])
    return f"{tail:,}: answer bytes x{answer:.2f}, time x{seconds:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tails", default="0,10,1000,5000")
    parser.add_argument("--sim-seeds", default="", help="a range of simulation seeds, e.g. 1000-1012")
    parser.add_argument("--sim-workload-s", type=float, default=3.0)
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    tails = [int(t) for t in args.tails.split(",")]
    results = asyncio.run(run(tails, args.runs))
    text = report(results, tails, args.runs)
    if args.sim_seeds:
        low, _, high = args.sim_seeds.partition("-")
        seeds = list(range(int(low), int(high or low) + 1))
        text += "\n" + sim_report(sim_cpu(seeds, args.sim_workload_s), seeds, args.sim_workload_s)
    print(text)
    if not args.no_report:
        write_section("recovery_window", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
