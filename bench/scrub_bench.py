"""Bit rot (issue 43): how fast damaged copies are repaired, what a scrub reads per second, and what it costs
the writers. One local cluster (etcd and 3 bookies, default scrub and repair settings but the period: scrub
passes are asked for through the admin plane; 16 MiB logs so that the fill rolls some), one run:

1. Fill: ledgers of 1 KiB entries, E3 Qw3 Qa2, until each bookie holds --fill-mib of them.
2. Read repair: 20 entries of one closed ledger get a flipped byte on one bookie (in its rolled logs, as a bad
   sector would); a client reads the ledger once. Timed: from the read to every damaged copy reading back good
   from that bookie (it checks the marks naming it every damage_check_interval_s, default 10 s, and with a
   confirmed one the ledger's other records in the same logs).
3. Scrub: 20 more flipped bytes on another bookie, in a ledger nobody reads; a scrub pass is asked for at
   once (the background period is scrub_interval_s, default a day). Timed: from the pass's start to every
   damaged copy reading back good; and the pass's throughput at the default scrub_rate_bytes_per_s.
4. Cost: a writer paced at --rate entries/s (1 KiB) while a scrub pass runs on every bookie, then as long
   again without one, twice; the add latency's p50 and p99 in each phase.

    .venv/bin/python bench/scrub_bench.py [--fill-mib 160] [--rate 2000]

Writes the "Bit rot" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_line, table, write_section

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.meta.damage import Damage
from octavo.meta.errors import BookieUnavailableError
from octavo.node.config import NodeConfig
from octavo.node.files import LOGS_DIR
from octavo.node.record import LOG_HEADER_BYTES, RECORD_HEADER
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc

PW = b"pw"
SIZE = 1024
LEDGER_ENTRIES = 20_000
DAMAGED = 20
MIB = 1024 * 1024


def payload(ledger: int, entry: int) -> bytes:
    head = f"ledger {ledger} entry {entry} ".encode()
    return (head * (SIZE // len(head) + 1))[:SIZE]


def flip(cluster: LocalCluster, bookie_id: str, ledger: int, count: int) -> list[int]:
    """A flipped payload byte in `count` records of the ledger in the bookie's rolled logs (every 97th)."""
    logs = sorted((Path(cluster.bookies[bookie_id].data_dir) / LOGS_DIR).glob("*.log"))[:-1]
    damaged: list[int] = []
    for path in logs:
        data = path.read_bytes()
        with open(path, "r+b") as f:
            pos = LOG_HEADER_BYTES
            while pos + RECORD_HEADER.size <= len(data) and len(damaged) < count:
                _, body_len, lid, eid = RECORD_HEADER.unpack_from(data, pos)
                if lid == ledger and eid >= 0 and eid % 97 == 5:
                    f.seek(pos + body_len + 8 - 100)
                    f.write(bytes([data[pos + body_len + 8 - 100] ^ 0x10]))
                    damaged.append(eid)
                pos += body_len + 8
    return damaged


async def direct_ok(client: Client, bookie_id: str, ledger: int, entries: list[int]) -> bool:
    try:
        response = await client.bookie_client(bookie_id).read(ledger, entries, timeout_s=10)
    except BookieUnavailableError:
        return False
    return all(item.code == pb.OK and bytes(item.payload) == payload(ledger, item.entry_id)
               for item in response.entries) and len(response.entries) == len(entries)


async def until_repaired(client: Client, bookie_id: str, ledger: int, entries: list[int], t0: float,
                         timeout_s: float = 300) -> float:
    damage = Damage(client.etcd, client.metadata_store.layout)
    while time.monotonic() - t0 < timeout_s:
        if await direct_ok(client, bookie_id, ledger, entries) and await damage.get(ledger, bookie_id) is None:
            return time.monotonic() - t0
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{bookie_id}: ledger {ledger} entries not repaired within {timeout_s}s")


async def fill(client: Client, mib: int) -> list[tuple[int, tuple[str, ...]]]:
    ledgers = []
    for _ in range(max(2, mib * MIB // (LEDGER_ENTRIES * SIZE))):
        writer = await client.create_ledger(3, 3, 2, password=PW)
        for first in range(0, LEDGER_ENTRIES, 1000):
            await writer.append_many([payload(writer.ledger_id, e) for e in range(first, first + 1000)])
        await writer.close()
        ledgers.append((writer.ledger_id, writer.metadata.last_ensemble))
    return ledgers


async def run_scrub(address: str) -> pb.ScrubState:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.BookieAdminStub(channel)  # type: ignore[no-untyped-call]
        state: pb.ScrubState = await stub.RunScrub(pb.RunScrubRequest(), timeout=3600)
        return state


async def paced_writer(client: Client, rate: int, done: Callable[[float], bool]) -> tuple[list[float], float]:
    """Adds of 1 KiB at `rate` entries/s (a tick every 10 ms) until done(elapsed s); each add's latency and the
    phase's length."""
    writer = await client.create_ledger(3, 3, 2, password=PW)
    latencies: list[float] = []
    pending: set[asyncio.Task[None]] = set()

    async def one(data: bytes) -> None:
        t = time.perf_counter()
        await writer.append(data)
        latencies.append(time.perf_counter() - t)

    per_tick, tick_s = max(1, rate // 100), 0.01
    start = time.monotonic()
    n = 0
    while not done(time.monotonic() - start):
        for _ in range(per_tick):
            task = asyncio.create_task(one(payload(writer.ledger_id, n)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            n += 1
        await asyncio.sleep(max(0.0, start + (n / per_tick) * tick_s - time.monotonic()))
    elapsed = time.monotonic() - start
    await asyncio.gather(*pending)
    await writer.close()
    return latencies, elapsed


def all_done(tasks: list[asyncio.Task[pb.ScrubState]]) -> Callable[[float], bool]:
    return lambda _: all(t.done() for t in tasks)


def after(seconds: float) -> Callable[[float], bool]:
    return lambda elapsed: elapsed >= seconds


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    root = tempfile.mkdtemp(prefix="octavo-scrub-bench-")
    with LocalCluster(root, bookies=3, bookie_args=[
            "--scrub-interval-s", "0", "--metrics-port", "-1", "--log-size-bytes-max", str(16 * MIB),
            "--batch-bytes-max", str(8 * MIB)]) as cluster:
        async with Client(cluster.etcd_endpoint) as client:
            t = time.monotonic()
            ledgers = await fill(client, args.fill_mib)
            fill_s = time.monotonic() - t
            await asyncio.sleep(2)  # rolled logs flushed
            # Read repair.
            (ledger_a, ensemble_a), (ledger_b, ensemble_b) = ledgers[0], ledgers[1]
            victim_a = ensemble_a[0]
            damaged_a = flip(cluster, victim_a, ledger_a, DAMAGED)
            t0 = time.monotonic()
            reader = await client.open_ledger(ledger_a, password=PW)
            async for _ in reader.read(0, LEDGER_ENTRIES - 1):
                pass
            read_s = time.monotonic() - t0
            await asyncio.sleep(0.5)
            marked = await Damage(client.etcd, client.metadata_store.layout).get(ledger_a, victim_a)
            reported = sorted(set(e for a, b in (marked.ranges if marked else ()) for e in range(a, b + 1)))
            read_repair_s = await until_repaired(client, victim_a, ledger_a, damaged_a, t0)
            # Scrub.
            victim_b = ensemble_b[1]
            damaged_b = flip(cluster, victim_b, ledger_b, DAMAGED)
            t0 = time.monotonic()
            state = await run_scrub(cluster.bookies[victim_b].address)
            scrub_repair_s = await until_repaired(client, victim_b, ledger_b, damaged_b, t0)
            # Cost to the writers: a phase without a scrub, then one exactly as long as a scrub pass runs on
            # every bookie, twice over (the machine is shared: the pairs show the noise).
            phases: list[tuple[str, list[float], float]] = []
            for _ in range(2):
                scrubs = [asyncio.create_task(run_scrub(b.address)) for b in cluster.bookies.values()]
                busy, busy_s = await paced_writer(client, args.rate, all_done(scrubs))
                await asyncio.gather(*scrubs)
                quiet, quiet_s = await paced_writer(client, args.rate, after(busy_s))
                phases += [("a scrub on every bookie", busy, busy_s), ("no scrub", quiet, quiet_s)]
    return {"fill_s": fill_s, "ledgers": len(ledgers), "read_s": read_s, "met": len(reported),
            "read_repair_s": read_repair_s, "scrub_repair_s": scrub_repair_s,
            "scrub_bytes": state.last_pass_bytes, "scrub_s": state.last_pass_duration_s,
            "scrub_found": state.last_pass_damaged, "phases": phases}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fill-mib", type=int, default=160)
    parser.add_argument("--rate", type=int, default=2000)
    args = parser.parse_args()
    r = asyncio.run(main_async(args))
    default_rate = NodeConfig(data_dir="x").scrub_rate_bytes_per_s
    phases = r["phases"]
    assert isinstance(phases, list)
    scrub_bytes, scrub_s = float(r["scrub_bytes"]), float(r["scrub_s"])  # type: ignore[arg-type]
    rate_mib_s = scrub_bytes / MIB / scrub_s
    rows = [
        ["one read over damage -> every damaged copy repaired (read repair)", f"{r['read_repair_s']:.1f} s",
         f"{DAMAGED} flipped records; the read reported {r['met']} of them (a range read stops at a bookie's "
         "first damaged entry and goes on at the next replica), the bookie found the others in the same logs; "
         f"damage_check_interval_s default {NodeConfig(data_dir='x').damage_check_interval_s:g} s"],
        ["scrub pass started -> repaired (scrub)", f"{r['scrub_repair_s']:.1f} s",
         f"{r['scrub_found']} of {DAMAGED} found; add the wait for the pass: scrub_interval_s, default "
         f"{NodeConfig(data_dir='x').scrub_interval_s // 3600} h"],
        ["scrub throughput at the default rate", f"{rate_mib_s:.1f} MiB/s",
         f"{scrub_bytes / MIB:.0f} MiB in {scrub_s:.1f} s; scrub_rate_bytes_per_s default "
         f"{default_rate / MIB:g} MiB/s"],
    ] + [[f"add latency at {args.rate} entries/s, {what}", f"p50 {pct(lat, 0.5) * 1000:.1f} ms, "
           f"p99 {pct(lat, 0.99) * 1000:.1f} ms", f"{len(lat)} adds of 1 KiB in {secs:.1f} s"]
          for what, lat, secs in phases]
    body = "\n".join([
        "## Bit rot: repair times and the scrub's cost (bench/scrub_bench.py)", "",
        f"{machine_line()}. One local cluster (etcd, 3 bookies), {r['ledgers']} closed ledgers of "
        f"{LEDGER_ENTRIES:,} entries of 1 KiB (E3 Qw3 Qa2), {args.fill_mib} MiB on each bookie, written in "
        f"{r['fill_s']:.0f} s. Damage is a flipped byte in a rolled log's record (what a bad sector does); repaired "
        "means every damaged copy reads back byte-identical from the damaged bookie itself and no damage mark "
        "is left. A one-off run on a shared 2-core machine: read the ratios, not the last digit.", "",
        table(["what", "measured", "how"], rows), ""])
    write_section("scrub", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
