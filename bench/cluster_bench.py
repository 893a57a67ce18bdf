"""A client writing to a local 3-bookie cluster (E=3, Qw=3, Qa=2) against NATS JetStream with 3 replicas,
side by side in one run.

Octavo: etcd and three bookie processes on 127.0.0.1; the client library in this process. JetStream: three
nats-server processes (Debian's `nats-server`) clustered on loopback, one file stream with 3 replicas,
driven by nats-py in this process. Both get the same entries and the same in-flight limit; "ledgers" are
ledgers for Octavo and subjects of the stream for JetStream, written concurrently.

Measured: throughput (entries/s, MB/s) for 100 B, 1 KB and 64 KB entries with 1, 50 and 500 ledgers; add
latency p50/p99/p99.9 at a fixed 2,000 entries/s of 1 KB on one ledger. Medians of --rounds; the two
systems alternate within each round. Writes the `cluster` section of docs/benchmarks.md and
docs/benchmarks-cluster.svg.

Usage: python bench/cluster_bench.py [--rounds N] [--seconds S] [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpc
from common import REPORT, machine_line, median, table, write_section

from octavo.client import Client
from octavo.client.localcluster import LocalCluster, free_port
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc

SIZES = [100, 1024, 64 * 1024]
LEDGER_COUNTS = [1, 50, 500]
# The client's in-flight budget, shared by its ledgers: bytes, as a producer's buffer memory is (Kafka's
# buffer.memory defaults to 32 MiB). A cap on entries starves small entries (2,000 x 100 B is 200 KB).
INFLIGHT_BYTES = 8 * 1024 * 1024
# The window of earlier runs, kept to show how many ledgers fare when each gets only a few entries.
SMALL_WINDOW_ENTRIES = 2000
LATENCY_RATE = 2000
PLOT = REPORT.parent / "benchmarks-cluster.svg"


def inflight(size: int, entries_max: int | None = None) -> int:
    return max(1, min(entries_max or INFLIGHT_BYTES, INFLIGHT_BYTES // size))


# -- NATS JetStream ------------------------------------------------------------------------------------
class NatsCluster:
    def __init__(self, root: str) -> None:
        self.root = root
        self.ports = [free_port() for _ in range(3)]
        self.routes = [free_port() for _ in range(3)]
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> str:
        binary = shutil.which("nats-server")
        if binary is None:
            raise SystemExit("nats-server not found: install Debian's nats-server package "
                             "(apt-get install nats-server)")
        for i in range(3):
            store = os.path.join(self.root, f"n{i}")
            os.makedirs(store, exist_ok=True)
            routes = ", ".join(f"nats-route://127.0.0.1:{r}" for j, r in enumerate(self.routes) if j != i)
            conf = os.path.join(self.root, f"n{i}.conf")
            Path(conf).write_text(
                f'port: {self.ports[i]}\nhost: 127.0.0.1\nserver_name: n{i}\n'
                f'jetstream {{ store_dir: "{store}" }}\n'
                f'cluster {{ name: octavo-bench, listen: 127.0.0.1:{self.routes[i]}, routes: [{routes}] }}\n')
            log = open(os.path.join(self.root, f"n{i}.log"), "wb")  # noqa: SIM115 - lives as long as the process
            self.procs.append(subprocess.Popen([binary, "-c", conf], stdout=log, stderr=subprocess.STDOUT))
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.ports)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=30)


async def nats_stream(servers: str):  # type: ignore[no-untyped-def]
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(servers.split(","), pending_size=256 * 1024 * 1024)
    js = nc.jetstream(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            await js.add_stream(StreamConfig(name="BENCH", subjects=["bench.>"], num_replicas=3,
                                             storage=StorageType.FILE, max_msg_size=8 * 1024 * 1024))
            return nc, js
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


# -- drivers --------------------------------------------------------------------------------------------
async def drive(ledgers: int, chunk: int, seconds: float, write: Callable[[int, int], Awaitable[object]]) -> float:
    """Every ledger writes `chunk` entries and waits for all of them, again and again, until `seconds` have
    passed (the chunk under way finishes). Returns entries per second over the whole run."""
    done = [0] * ledgers
    t0 = time.perf_counter()
    deadline = t0 + seconds

    async def one(i: int) -> None:
        while time.perf_counter() < deadline:
            await write(i, chunk)
            done[i] += chunk

    await asyncio.gather(*(one(i) for i in range(ledgers)))
    return sum(done) / (time.perf_counter() - t0)


async def run_octavo(client: Client, size: int, ledgers: int, seconds: float,
                     entries_max: int | None = None) -> float:
    writers = [await client.create_ledger(3, 3, 2, password=b"bench") for _ in range(ledgers)]
    payload = os.urandom(size)
    chunk = max(1, inflight(size, entries_max) // ledgers)
    rate = await drive(ledgers, chunk, seconds, lambda i, n: writers[i].append_many([payload] * n))
    await asyncio.gather(*(w.close() for w in writers))
    # Drop what the run wrote, as the JetStream side purges its stream: the ledgers are deleted and every
    # bookie runs a GC pass, so runs do not pile gigabytes of page cache on one another.
    for writer in writers:
        await client.delete_ledger(writer.ledger_id)
    for bookie in (await client.bookies(refresh=True)).values():
        async with grpc.aio.insecure_channel(bookie.address) as channel:
            await pb_grpc.BookieAdminStub(channel).RunGc(pb.RunGcRequest(), timeout=60)
    return rate


async def run_nats(js, size: int, ledgers: int, seconds: float, run_id: int) -> float:  # type: ignore[no-untyped-def]
    payload = os.urandom(size)
    chunk = max(1, inflight(size) // ledgers)

    async def write(i: int, n: int) -> None:
        subject = f"bench.r{run_id}.l{i}"
        await asyncio.gather(*(js.publish(subject, payload) for _ in range(n)))

    rate = await drive(ledgers, chunk, seconds, write)
    await js.purge_stream("BENCH")
    return rate


async def fixed_rate(send: Callable[[], Awaitable[object]], seconds: float) -> list[float]:
    """Latencies (ms) of sends issued at LATENCY_RATE per second, measured from their scheduled time. Finished
    sends are not kept (thousands of finished tasks held to the end would only feed the garbage collector)."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    running: set[asyncio.Future[None]] = set()
    n = int(LATENCY_RATE * seconds)
    t0 = loop.time()

    async def timed(scheduled: float) -> None:
        await send()
        latencies.append((loop.time() - scheduled) * 1000)

    for i in range(n):
        scheduled = t0 + i / LATENCY_RATE
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(timed(scheduled))
        running.add(task)
        task.add_done_callback(running.discard)
    while running:
        await asyncio.gather(*running)
    return latencies


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


# -- report ---------------------------------------------------------------------------------------------
def svg_plot(rows: list[tuple[str, float, float]]) -> str:
    """A grouped bar chart of MB/s: Octavo and JetStream per scenario."""
    width, bar, gap, height = 60 + len(rows) * 70, 24, 22, 300
    top = max(max(o, n) for _, o, n in rows) or 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 90}" '
             'font-family="sans-serif" font-size="11">',
             '<text x="10" y="16" font-size="13">Write throughput, MB/s (3 replicas): '
             '<tspan fill="#2b6cb0">Octavo</tspan> vs <tspan fill="#c05621">NATS JetStream</tspan></text>']
    for i, (label, octavo, nats) in enumerate(rows):
        x = 50 + i * (2 * bar + gap)
        for j, (value, color) in enumerate(((octavo, "#2b6cb0"), (nats, "#c05621"))):
            h = value / top * height
            parts.append(f'<rect x="{x + j * bar}" y="{30 + height - h:.1f}" width="{bar - 2}" height="{h:.1f}" '
                         f'fill="{color}"><title>{label}: {value:.1f} MB/s</title></rect>')
            parts.append(f'<text x="{x + j * bar + bar / 2 - 1}" y="{26 + height - h:.1f}" text-anchor="middle" '
                         f'font-size="9">{value:.0f}</text>')
        parts.append(f'<text x="{x + bar}" y="{height + 48}" text-anchor="middle" transform="rotate(35 {x + bar} '
                     f'{height + 48})">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


async def bench(args: argparse.Namespace, etcd: str, nats_servers: str) -> str:
    nc, js = await nats_stream(nats_servers)
    rows = []
    plot_rows = []
    ratios: dict[tuple[int, int], float] = {}
    kept: dict[int, float] = {}
    async with Client(etcd) as client:
        run_id = 0
        # Rounds go over every ledger count in turn (and the two systems alternate), so the runs compared
        # with each other see the same state of a shared, noisy machine; "kept" ratios are taken per round.
        octavo_runs: dict[tuple[int, int], list[float]] = {}
        nats_runs: dict[tuple[int, int], list[float]] = {}
        for size in args.sizes:
            for _ in range(args.rounds):
                for ledgers in args.ledgers:
                    run_id += 1
                    octavo_runs.setdefault((size, ledgers), []).append(
                        await run_octavo(client, size, ledgers, args.seconds))
                    nats_runs.setdefault((size, ledgers), []).append(
                        await run_nats(js, size, ledgers, args.seconds, run_id))
            for ledgers in args.ledgers:
                o, n = median(octavo_runs[(size, ledgers)]), median(nats_runs[(size, ledgers)])
                ratios[(size, ledgers)] = o / n
                mb = size / 1e6
                label = f"{size:,} B x {ledgers}"
                rows.append([f"{size:,} B", str(ledgers), f"{o:,.0f} ({o * mb:,.1f} MB/s)",
                             f"{n:,.0f} ({n * mb:,.1f} MB/s)", f"{o / n:.1f}x"])
                plot_rows.append((label, o * mb, n * mb))
                print(f"{label:>16}: octavo {o:,.0f}/s  jetstream {n:,.0f}/s  ({o / n:.1f}x)", flush=True)
            if {1, 500} <= set(args.ledgers):
                kept[size] = median([b / a for a, b in zip(octavo_runs[(size, 1)], octavo_runs[(size, 500)],
                                                           strict=True)])
                print(f"{size:,} B: 500 ledgers keep {kept[size]:.0%} of one ledger (median of per-round ratios)",
                      flush=True)
        # The same 1-vs-500 comparison with the small window of earlier runs (2,000 entries, 4 per ledger).
        small: dict[int, float] = {}
        for size in (100, 1024):
            if size not in args.sizes or not {1, 500} <= set(args.ledgers):
                continue
            pairs = []
            for _ in range(args.rounds):
                one = await run_octavo(client, size, 1, args.seconds, SMALL_WINDOW_ENTRIES)
                pairs.append((one, await run_octavo(client, size, 500, args.seconds, SMALL_WINDOW_ENTRIES)))
            small[size] = median([b / a for a, b in pairs])
            print(f"small window {size:,} B: 1 ledger {median([a for a, _ in pairs]):,.0f}/s, 500 ledgers "
                  f"{median([b for _, b in pairs]):,.0f}/s ({small[size]:.0%})", flush=True)
        if args.no_report:
            await nc.close()
            return ""
        # Latency at a fixed rate, 1 KB, one ledger: the two systems alternate, samples of all rounds pooled.
        payload = os.urandom(1024)
        octavo_lat: list[float] = []
        nats_lat: list[float] = []
        for _ in range(args.rounds):
            writer = await client.create_ledger(3, 3, 2, password=b"bench")
            octavo_lat += await fixed_rate(lambda: writer.append(payload), args.seconds)  # noqa: B023
            await writer.close()
            nats_lat += await fixed_rate(lambda: js.publish("bench.latency", payload), args.seconds)
    await nc.close()
    lat_rows = [[name, f"{percentile(v, 50):.2f}", f"{percentile(v, 99):.2f}", f"{percentile(v, 99.9):.2f}"]
                for name, v in (("Octavo", octavo_lat), ("NATS JetStream", nats_lat))]
    print("latency ms p50/p99/p99.9:", lat_rows, flush=True)
    one_kb_1 = ratios[(1024, 1)]
    mb64 = ratios[(64 * 1024, 1)]
    kept_500 = [(size, float(rows_at(rows, size, 500)) / float(rows_at(rows, size, 1))) for size in SIZES]
    p99_octavo, p99_nats = percentile(octavo_lat, 99), percentile(nats_lat, 99)
    PLOT.write_text(svg_plot(plot_rows))
    return "\n".join([
        "## A client on a local 3-bookie cluster against NATS JetStream (3 replicas)",
        "",
        f"`python bench/cluster_bench.py --rounds {args.rounds} --seconds {args.seconds}`; {machine_line()}. Octavo: "
        "etcd and three bookie processes, ledgers with E=3, Qw=3, Qa=2, written with `append_many`. JetStream: "
        "three `nats-server` processes clustered on loopback, one file stream with 3 replicas, `nats-py` "
        "publishes (each awaits its acknowledgement). Same entries, same in-flight limit (min(2,000 entries, "
        f"8 MiB)) split over the ledgers (subjects); median of {args.rounds} rounds, the two alternating. "
        "Servers and client share the machine's two cores.",
        "",
        table(["entry", "ledgers", "Octavo (entries/s)", "JetStream (entries/s)", "Octavo / JetStream"], rows),
        "",
        "![throughput](benchmarks-cluster.svg)",
        "",
        f"Add latency at a fixed {LATENCY_RATE:,} entries/s of 1 KB, one ledger, {args.seconds:.0f} s (ms, from the "
        "scheduled send to the acknowledgement):",
        "",
        table(["system", "p50", "p99", "p99.9"], lat_rows),
        "",
        "Reading the table: the in-flight limit is split between the ledgers (500 ledgers: 4 entries each), so "
        "every ledger's batch to every bookie is tiny, and Octavo pays per (ledger, bookie) batch on both sides "
        "(message parts, callbacks, bookkeeping), while a JetStream publish costs the same whatever its subject. "
        "Profiled on this kind of machine: the client spent about 65 us of CPU per entry at 500 ledgers against "
        "under 7 us at one ledger, 38 us after the per-add future and timer were removed. The latency tail at a "
        "fixed rate comes from three Python bookie processes, etcd and the client sharing two cores, each add "
        "travelling alone at that rate: stalls of 10-30 ms followed by a draining queue, not periodic, and not "
        "garbage collection (unchanged with it disabled). At 64 KB the bound is the page cache and disk path "
        "shared by all servers (see the gRPC section).",
        "",
        "Targets: 1 KB throughput >= 5x JetStream's: "
        f"{one_kb_1:.1f}x ({'met' if one_kb_1 >= 5 else 'NOT met'}); 64 KB MB/s >= 2x JetStream's: "
        f"{mb64:.1f}x ({'met' if mb64 >= 2 else 'NOT met'}); p99 at {LATENCY_RATE:,}/s below JetStream's: "
        f"{p99_octavo:.2f} vs {p99_nats:.2f} ms ({'met' if p99_octavo < p99_nats else 'NOT met'}); 500 ledgers keep "
        ">= 80% of the 1-ledger throughput: "
        + ", ".join(f"{size:,} B {k:.0%} ({'met' if k >= 0.8 else 'NOT met'})" for size, k in kept_500) + ".",
    ])


def rows_at(rows: list[list[str]], size: int, ledgers: int) -> str:
    for r in rows:
        if r[0] == f"{size:,} B" and r[1] == str(ledgers):
            return r[2].split(" ")[0].replace(",", "")
    raise KeyError((size, ledgers))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="about how long each run lasts")
    ap.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=SIZES,
                    help="entry sizes to run, comma-separated (a partial run writes no report)")
    ap.add_argument("--ledgers", type=lambda v: [int(x) for x in v.split(",")], default=LEDGER_COUNTS,
                    help="ledger counts to run, comma-separated (a partial run writes no report)")
    ap.add_argument("--no-report", action="store_true")
    args = ap.parse_args()
    if args.sizes != SIZES or args.ledgers != LEDGER_COUNTS:
        args.no_report = True
    root = tempfile.mkdtemp(prefix="octavo-cluster-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR"))
    cluster = LocalCluster(os.path.join(root, "octavo"), bookies=3,
                           bookie_args=["--log-size-bytes-max", str(64 << 20)], new_session=True)
    nats = NatsCluster(os.path.join(root, "nats"))
    try:
        cluster.start()
        servers = nats.start()
        body = asyncio.run(bench(args, cluster.etcd_endpoint, servers))
    finally:
        nats.stop()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    if not args.no_report:
        write_section("cluster", body)
        print("wrote docs/benchmarks.md (cluster) and docs/benchmarks-cluster.svg")


if __name__ == "__main__":
    main()
