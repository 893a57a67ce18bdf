"""One bookie over gRPC against its ceiling, side by side in one run.

  (b) ceiling: a bare grpc.aio server, in its own process, on the same AddEntries stream, that only counts
      the entries of each request and answers OK for each: what gRPC in Python costs with no storage at all;
  Octavo: a real bookie process (default settings) behind the same stream.
The same client drives both: one grpc.aio stream, requests serialized once up front and sent as bytes, a
window of requests in flight. Entry sizes 100 B, 1 KB (1,000 entries per request) and 64 KB (100 per
request). Prints medians and ratios and writes the `grpc` section of docs/benchmarks.md.

Usage: python bench/grpc_bench.py [--rounds N] [--seconds S] [--no-report]
       python bench/grpc_bench.py --serve-counting PORT_FILE   (the bare server; started by the bench)
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpc
from common import machine_line, median, table, write_section

from octavo.node.testing import BookieConnection, BookieProcess
from octavo.v1 import bookie_pb2 as pb

SIZES = [(100, 1000), (1024, 1000), (64 * 1024, 100)]
WINDOW = 8
SUSTAINED_LOG_BYTES = 64 * 1024 * 1024  # the dev cluster's log size: several rolls and flushes per run
BURST_ENTRIES_MAX = 500_000  # a burst run stays below the roll thresholds (log size, half the write cache)
MAX_MESSAGE = 128 * 1024 * 1024
OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)]
ADD_METHOD = "/octavo.v1.Bookie/AddEntries"


async def serve_counting(port_file: str) -> None:
    async def add_entries(request_iterator, context):  # type: ignore[no-untyped-def]
        async for request in request_iterator:
            yield pb.AddResponse(request_id=request.request_id, results=[
                pb.LedgerAddResult(ledger_id=adds.ledger_id, codes=[pb.OK] * len(adds.entry_ids))
                for adds in request.ledgers])

    server = grpc.aio.server(options=OPTIONS)
    handler = grpc.method_handlers_generic_handler("octavo.v1.Bookie", {
        "AddEntries": grpc.stream_stream_rpc_method_handler(
            add_entries, request_deserializer=pb.AddRequest.FromString,
            response_serializer=pb.AddResponse.SerializeToString)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    Path(port_file).write_text(f"127.0.0.1:{port}")
    await server.wait_for_termination()


def build_requests(size: int, per_batch: int, total_bytes: int, ledger_base: int) -> list[bytes]:
    payload = os.urandom(size)
    n = max(WINDOW * 2, total_bytes // (size * per_batch))
    out = []
    for i in range(n):
        ledger = ledger_base + i % 4
        first = (i // 4) * per_batch
        out.append(pb.AddRequest(request_id=i, ledgers=[pb.LedgerAdds(
            ledger_id=ledger, master_key=b"bench", last_add_confirmed=first - 1,
            entry_ids=list(range(first, first + per_batch)), payloads=[payload] * per_batch)]).SerializeToString())
    return out


async def drive(address: str, requests: list[bytes], per_batch: int) -> float:
    """Send every request on one stream with WINDOW in flight; returns entries acknowledged per second."""
    async with grpc.aio.insecure_channel(address, options=OPTIONS) as channel:
        call = channel.stream_stream(ADD_METHOD, request_serializer=None,
                                     response_deserializer=pb.AddResponse.FromString)()
        window = asyncio.Semaphore(WINDOW)

        async def send() -> None:
            for raw in requests:
                await window.acquire()
                await call.write(raw)
            await call.done_writing()

        t0 = time.perf_counter()
        sender = asyncio.create_task(send())
        acked = 0
        async for resp in call:
            window.release()
            if resp.error or any(resp.results[0].codes):
                raise RuntimeError(f"add failed: {resp.error_message} {resp.results[0].message}")
            acked += per_batch
        elapsed = time.perf_counter() - t0
        await sender
    return acked / elapsed


def wait_flushed(address: str, timeout_s: float = 120) -> None:
    """Wait until the bookie has no rolled log waiting for the flusher, so rounds do not inherit backlog."""
    with BookieConnection(address) as conn:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not any(log.state == "rolled" for log in conn.status().entry_logs):
                return
            time.sleep(0.05)
    raise RuntimeError("bookie did not finish flushing")


def start_counting_server(tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    port_file = os.path.join(tmp, "counting.port")
    proc = subprocess.Popen([sys.executable, __file__, "--serve-counting", port_file])
    deadline = time.monotonic() + 30
    while not os.path.exists(port_file):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("counting server did not start")
        time.sleep(0.05)
    return proc, Path(port_file).read_text()


def disk_write_mb_s(directory: str, mb: int = 256) -> float:
    """What this disk takes right now: `mb` MiB written and fdatasync'ed (the sustained ceiling of any
    store that must eventually sync what it writes)."""
    data = os.urandom(1 << 20)
    path = os.path.join(directory, "disk-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t0 = time.perf_counter()
    for _ in range(mb):
        os.write(fd, data)
    os.fdatasync(fd)
    elapsed = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    return mb * 1.048576 / elapsed


def spread(values: list[float]) -> str:
    return f"{min(values):,.0f}-{max(values):,.0f}"


def run_size(tmp: str, counting_addr: str, size: int, per_batch: int, rounds: int, mb: int) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {"bare": [], "burst": [], "sustained": []}
    sustained = BookieProcess(os.path.join(tmp, f"sustained-{size}"), args=[
        "--log-size-bytes-max", str(SUSTAINED_LOG_BYTES), "--batch-bytes-max", str(16 << 20),
        "--write-cache-entries-max", "2000000"])
    sustained_addr = sustained.start()
    try:
        for r in range(rounds):
            volume = min(mb << 20, BURST_ENTRIES_MAX * size)
            requests = build_requests(size, per_batch, volume, ledger_base=(r + 1) * 1000)
            runs["bare"].append(asyncio.run(drive(counting_addr, requests, per_batch)))
            # Burst: a fresh bookie whose log never rolls during the run: the add path alone.
            burst = BookieProcess(os.path.join(tmp, f"burst-{size}-{r}"),
                                  args=["--write-cache-entries-max", str(4 * BURST_ENTRIES_MAX)])
            try:
                runs["burst"].append(asyncio.run(drive(burst.start(), requests, per_batch)))
            finally:
                burst.kill()
                shutil.rmtree(burst.data_dir, ignore_errors=True)
            # Sustained: 64 MiB logs, so the run rolls and flushes several of them on the way.
            requests = build_requests(size, per_batch, mb << 20, ledger_base=(r + 1) * 1000)
            runs["sustained"].append(asyncio.run(drive(sustained_addr, requests, per_batch)))
            wait_flushed(sustained_addr)
    finally:
        sustained.stop()
        shutil.rmtree(sustained.data_dir, ignore_errors=True)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mb", type=int, default=256, help="MB sent per sustained run")
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("--sizes", default=",".join(str(size) for size, _ in SIZES),
                    help="entry sizes to run, comma-separated (the report needs 1024)")
    ap.add_argument("--serve-counting", metavar="PORT_FILE")
    args = ap.parse_args()
    if args.serve_counting:
        asyncio.run(serve_counting(args.serve_counting))
        return
    tmp = tempfile.mkdtemp(prefix="octavo-grpc-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR"))
    counting, counting_addr = start_counting_server(tmp)
    rows = []
    summary = {}
    disk = []
    try:
        wanted = {int(x) for x in args.sizes.split(",")}
        for size, per_batch in [(size, per_batch) for size, per_batch in SIZES if size in wanted]:
            disk.append(disk_write_mb_s(tmp))
            runs = run_size(tmp, counting_addr, size, per_batch, args.rounds, args.mb)
            b, burst, sus = (median(runs[k]) for k in ("bare", "burst", "sustained"))
            summary[size] = (b, burst, sus)
            mb = size / 1e6
            rows.append([f"{size:,} B", f"{b:,.0f} ({b * mb:,.0f} MB/s)",
                         f"{burst:,.0f} ({burst * mb:,.0f} MB/s)", f"{burst / b:.0%}",
                         f"{sus:,.0f} ({sus * mb:,.0f} MB/s)", f"{sus / b:.0%}",
                         f"{spread(runs['bare'])} / {spread(runs['burst'])} / {spread(runs['sustained'])}"])
            print(f"{size:>6} B: bare {b:,.0f}/s  burst {burst:,.0f}/s ({burst / b:.0%})  sustained {sus:,.0f}/s "
                  f"({sus / b:.0%})  runs: {runs}", flush=True)
    finally:
        counting.terminate()
        counting.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    if 1024 not in summary:
        return
    b1, burst1, sus1 = summary[1024]
    body = "\n".join([
        "## One bookie over gRPC: add throughput from one client (entries/s)",
        "",
        f"`python bench/grpc_bench.py --rounds {args.rounds} --mb {args.mb}`; {machine_line()}. Median of "
        f"{args.rounds} rounds; in each round the variants run back to back on the same serialized requests. One "
        f"grpc.aio stream, {WINDOW} requests in flight, 1,000 entries per request (100 for 64 KB); client and "
        "servers share the machine's two cores.",
        "",
        "- (b) bare: a grpc.aio server on the same AddEntries stream that only counts entries and answers OK; it "
        "does no storage work at all.",
        f"- burst: a fresh bookie whose entry log does not roll during the run (at most {BURST_ENTRIES_MAX:,} "
        "entries): the add path alone, acknowledged from the page cache as in production.",
        f"- sustained: one bookie with {SUSTAINED_LOG_BYTES >> 20} MiB entry logs, {args.mb} MB per run, so "
        "every run rolls, fsyncs and indexes several logs in the background; the flush backlog drains between "
        "runs. Every byte written must eventually be fsynced, so this is bounded by the disk.",
        f"- disk: {', '.join(f'{d:,.0f}' for d in disk)} MB/s written and fdatasync'ed, probed before each size "
        "in this run (this virtual disk swings widely).",
        "",
        table(["entry", "(b) bare gRPC", "bookie, burst", "burst / (b)", "bookie, sustained", "sustained / (b)",
               "spread of runs: (b) / burst / sustained"], rows),
        "",
        "Reading the table: the bare server only counts `len(entry_ids)`, so it never turns a payload into a "
        "Python object; at 100 B the bookie's ratio is the per-entry cost of Python (materialize, encode, "
        "index: about 1.3 us per entry) against almost nothing. At 64 KB the bound is the memory and disk "
        "path (this machine's page cache took 450-970 MB/s for large sustained writes when probed by hand), and "
        "a freshly started bookie (burst) pays for faulting in new page-cache pages, which is why burst can sit "
        "below sustained there.",
        "",
        f"Targets for 1 KB entries: >= 40% of (b): burst {burst1 / b1:.0%} "
        f"({'met' if burst1 >= 0.4 * b1 else 'NOT met'}), sustained {sus1 / b1:.0%} "
        f"({'met' if sus1 >= 0.4 * b1 else 'NOT met'}); >= ~190,000 entries/s: burst {burst1:,.0f} "
        f"({'met' if burst1 >= 190_000 else 'NOT met'}), sustained {sus1:,.0f} "
        f"({'met' if sus1 >= 190_000 else 'NOT met'}).",
    ])
    if not args.no_report:
        write_section("grpc", body)
        print("wrote docs/benchmarks.md (grpc)")


if __name__ == "__main__":
    main()
