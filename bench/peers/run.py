"""Octavo against Apache Kafka, Apache BookKeeper and NATS JetStream on this machine, the same workloads in one run
(issue 41). The entry point is bench/peers_bench.py (`make bench-peers`).

Every server is its own process on 127.0.0.1, its data under one temporary directory (OCTAVO_BENCH_DIR, else
/tmp), so that its CPU time and peak RSS can be read from /proc:

- Octavo: two local clusters (etcd and three bookies each, as bench/cluster_bench.py starts them), one with the
  default `fsync_policy="none"`, one with `fsync_policy="batch"`; ledgers E=3 Qw=3 with Qa=2 and Qa=3, written by
  the Python client in this process with `append_many`.
- Kafka 4.4: three combined broker+controller processes in KRaft mode (`kafka.tools.StorageTool format`, then
  `kafka.Kafka`), a fresh topic per run with replication factor 3 and `min.insync.replicas=2`, producers with
  `acks=all`; Kafka flushes no message by default and that is kept.
- BookKeeper 4.17: one ZooKeeper and two sets of three bookies (`org.apache.bookkeeper.server.Main`,
  `DbLedgerStorage`), one with `journalSyncData=true` (the default), one with `false`; ledgers E=3 Qw=3 with
  Qa=2 (and Qa=3 on the no-sync set).
- NATS JetStream: three clustered `nats-server` processes (Debian's package), one file stream with 3 replicas
  (a publish is acknowledged once a Raft majority has it; nats-server syncs its files every 2 minutes).

Kafka and BookKeeper are driven by PeerDriver.java, a small Java client built with javac against the jars that
Maven fetches (pom-kafka.xml, pom-bookkeeper.xml), JetStream by jsdriver.py (the NATS protocol on a socket); each
driver is one process per system kept for the whole run, so a JVM's JIT is warmed once by a discarded run. Every
system gets the workloads of bench/cluster_bench.py:

1. Throughput: 100 B, 1 KiB and 64 KiB entries, 1 and 100 ledgers (Kafka: partitions of one topic; JetStream:
   subjects of the stream); an in-flight budget of 8 MiB of payload shared by the ledgers, each of which writes
   its share and waits for all of it, again and again. Kafka keeps its default `linger.ms=5` here, batches of up
   to 1 MiB per partition and `buffer.memory` of twice the budget (the payload budget is the limit; the buffer
   also holds the framing).
2. Latency at a fixed rate, open loop (2,000/s and 20,000/s of 1 KiB, one record per call, one ledger), measured
   in microseconds from the scheduled send to the acknowledgement; Kafka with `linger.ms=0`.
3. Reads: a catch-up read of --catchup-bytes (1 GiB) written earlier to one ledger, once per kind of system
   (CATCHUP_SYSTEMS); tailing latency, a writer on the schedule of 2. at --tail-rate and a reader following the
   ledger, from the scheduled send to the reader holding the entry.
4. Many ledgers: --many-ledgers (1,000) ledgers or partitions of --many-size (100 B) entries, as 1.
5. Efficiency: CPU seconds per GiB written for the servers (etcd and ZooKeeper included; Kafka's controllers
   are in its brokers) and, separately, for the client process; the peak RSS of each server process.

Within a round, the configurations and the systems alternate (the systems' order rotates from round to round);
throughput ratios are medians of per-round ratios, latency samples of all rounds are pooled. The 1-minute load
average is recorded between rounds: on a shared 2-core machine it says how noisy the figures are.

Usage:
    python bench/peers_bench.py --quick      # a smoke run of a few minutes; writes no report
    python bench/peers_bench.py              # the full run; writes the `peers` section of docs/benchmarks.md
                                             # and bench/results/peers.json
The first run resolves the jars with `mvn` (about 155 MB into ~/.m2) and compiles the driver (bench/peers/.cache).
Kafka and BookKeeper need Java 17 (java, javac) and Maven on PATH; JetStream needs nats-server.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import configs  # noqa: E402
import grpc  # noqa: E402
import servers  # noqa: E402
from cluster_bench import NatsCluster, drive, inflight, percentile  # noqa: E402
from common import machine_line, median, table, write_section  # noqa: E402

from octavo.cli.localcluster import LocalCluster, free_port  # noqa: E402
from octavo.client import BufferFullError, Client, WriteHandle  # noqa: E402
from octavo.v1 import bookie_pb2 as pb  # noqa: E402
from octavo.v1 import bookie_pb2_grpc as pb_grpc  # noqa: E402

SIZES = [100, 1024, 64 * 1024]
LEDGER_COUNTS = [1, 100]
LATENCY_RATES = [2000, 20000]
LATENCY_ENTRY_BYTES = 1024
RESULTS = HERE.parent / "results" / "peers.json"  # bench/results/, beside the other benchmarks' JSON
GIB = float(1 << 30)


@dataclass
class System:
    """One row of the tables: a system and its settings."""

    key: str
    label: str
    kind: str  # "octavo", "kafka" or "bookkeeper"
    ack_quorum: int
    fsync: str  # what is on disk when an add is acknowledged
    server_pids: Callable[[], list[int]] = field(default=lambda: [])
    client_pid: Callable[[], int] = field(default=servers.self_pid)


SYSTEMS = [
    System("octavo-qa2", "Octavo Qa=2", "octavo", 2, "no fsync"),
    System("octavo-qa3", "Octavo Qa=3", "octavo", 3, "no fsync"),
    System("octavo-fsync-qa2", "Octavo fsync=batch Qa=2", "octavo", 2, "fdatasync per batch"),
    System("kafka", "Kafka acks=all", "kafka", 3, "no flush"),
    System("bk-nosync-qa2", "BookKeeper nosync Qa=2", "bookkeeper", 2, "journalSyncData=false"),
    System("bk-nosync-qa3", "BookKeeper nosync Qa=3", "bookkeeper", 3, "journalSyncData=false"),
    System("bk-sync-qa2", "BookKeeper sync Qa=2", "bookkeeper", 2, "journalSyncData=true"),
    System("jetstream", "JetStream R3", "jetstream", 2, "no fsync (nats-server syncs every 2 min)"),
]
# Octavo's row / the peer's row with the same durability and acknowledgement.
PAIRS = [("octavo-qa2", "bk-nosync-qa2"), ("octavo-qa3", "bk-nosync-qa3"), ("octavo-qa3", "kafka"),
         ("octavo-fsync-qa2", "bk-sync-qa2"), ("octavo-qa2", "jetstream")]
# The catch-up read of workload 3 runs once per kind of system (how the data was acknowledged does not change
# how it is read back): these rows.
CATCHUP_SYSTEMS = {"octavo-qa2", "kafka", "bk-nosync-qa2", "jetstream"}
WORKLOADS = ("throughput", "latency", "catchup", "tail", "many")


# -- the systems ----------------------------------------------------------------------------------------------
class Bench:
    """Every system started, with a way to run each workload on each."""

    def __init__(self, root: str, keys: set[str]) -> None:
        self.root = root
        self.keys = keys
        kinds = {s.kind for s in SYSTEMS if s.key in keys}
        octavo_policies = {("batch" if "fsync" in s.key else "none") for s in SYSTEMS
                           if s.key in keys and s.kind == "octavo"}
        self.octavo = {policy: LocalCluster(os.path.join(root, f"octavo-{policy}"), bookies=3,
                                            bookie_args=["--log-size-bytes-max", str(64 << 20),
                                                         "--fsync-policy", policy], new_session=True)
                       for policy in sorted(octavo_policies)}
        self.kafka = (servers.KafkaCluster(os.path.join(root, "kafka"), [(free_port(), free_port()) for _ in range(3)])
                      if "kafka" in kinds else None)
        self.zookeeper = servers.ZooKeeper(os.path.join(root, "zookeeper"), free_port()) if "bookkeeper" in kinds \
            else None
        self.bookies: dict[bool, servers.Bookies] = {}
        if self.zookeeper is not None:
            for sync in (True, False):
                if any(s.key in keys and s.kind == "bookkeeper" and (s.key.startswith("bk-sync") == sync)
                       for s in SYSTEMS):
                    name = "sync" if sync else "nosync"
                    self.bookies[sync] = servers.Bookies(os.path.join(root, f"bk-{name}"), self.zookeeper.port,
                                                         f"/ledgers-{name}", [free_port() for _ in range(3)], sync)
        self.nats = NatsCluster(os.path.join(root, "nats")) if "jetstream" in kinds else None
        self.drivers: dict[str, servers.Driver] = {}
        self.clients: dict[str, Client] = {}

    def start(self) -> None:
        for cluster in self.octavo.values():
            cluster.start()
        if self.kafka is not None:
            self.kafka.start()
            self.drivers["kafka"] = servers.Driver("kafka", self.kafka.bootstrap, os.path.join(self.root, "kd.log"))
        if self.zookeeper is not None:
            self.zookeeper.start()
            for sync, bookies in self.bookies.items():
                bookies.start()
                self.drivers[f"bk-{sync}"] = servers.Driver("bookkeeper", bookies.metadata_service_uri,
                                                            os.path.join(self.root, f"bd-{sync}.log"))
        if self.nats is not None:
            url = self.nats.start()
            for port, proc in zip(self.nats.ports, self.nats.procs, strict=True):
                servers.wait_port(port, proc, os.path.join(self.root, "nats"))
            self.drivers["jetstream"] = servers.Driver("jetstream", url, os.path.join(self.root, "jd.log"))
        for s in SYSTEMS:
            if s.key not in self.keys:
                continue
            s.server_pids = self._server_pids(s)
            s.client_pid = self._client_pid(s)

    async def open_clients(self) -> None:
        for policy, cluster in self.octavo.items():
            self.clients[policy] = await Client(cluster.etcd_endpoint).__aenter__()

    async def close_clients(self) -> None:
        for client in self.clients.values():
            await client.close()

    def _octavo_policy(self, s: System) -> str:
        return "batch" if "fsync" in s.key else "none"

    def _server_pids(self, s: System) -> Callable[[], list[int]]:
        if s.kind == "octavo":
            cluster = self.octavo.get(self._octavo_policy(s))
            if cluster is None:
                return lambda: []
            return lambda: ([b.proc.pid for b in cluster.bookies.values() if b.proc is not None]
                            + ([cluster.etcd.proc.pid] if cluster.etcd is not None and cluster.etcd.proc else []))
        if s.kind == "kafka":
            return self.kafka.pids if self.kafka is not None else (lambda: [])
        if s.kind == "jetstream":
            nats = self.nats
            return lambda: [p.pid for p in nats.procs] if nats is not None else []
        bookies = self.bookies.get(s.key.startswith("bk-sync"))
        zk = self.zookeeper
        return lambda: ((bookies.pids() if bookies else [])
                        + ([zk.proc.pid] if zk is not None and zk.proc is not None else []))

    def _client_pid(self, s: System) -> Callable[[], int]:
        if s.kind == "octavo":
            return servers.self_pid
        driver = self._driver(s)
        return lambda: driver.proc.pid

    def _driver(self, s: System) -> servers.Driver:
        if s.kind in ("kafka", "jetstream"):
            return self.drivers[s.kind]
        return self.drivers[f"bk-{s.key.startswith('bk-sync')}"]

    def stop(self) -> None:
        for driver in self.drivers.values():
            driver.stop()
        for bookies in self.bookies.values():
            bookies.stop()
        if self.zookeeper is not None:
            self.zookeeper.stop()
        if self.kafka is not None:
            self.kafka.stop()
        if self.nats is not None:
            self.nats.stop()
        for cluster in self.octavo.values():
            cluster.stop()

    # -- workloads ----------------------------------------------------------------------------------------
    async def throughput(self, s: System, size: int, ledgers: int, seconds: float) -> float:
        if s.kind == "octavo":
            return await octavo_throughput(self.clients[self._octavo_policy(s)], size, ledgers, seconds,
                                           s.ack_quorum)
        result = await asyncio.to_thread(self._driver(s).call, "throughput", size, ledgers, seconds, s.ack_quorum)
        return float(result["rate"])  # type: ignore[arg-type]

    async def latency(self, s: System, rate: int, seconds: float) -> list[int]:
        if s.kind == "octavo":
            client = self.clients[self._octavo_policy(s)]
            writer = await client.create_ledger(3, 3, s.ack_quorum, password=b"bench")
            payload = os.urandom(LATENCY_ENTRY_BYTES)
            latencies = await open_loop_nowait(writer, lambda i: payload, rate, seconds)
            await writer.close()
            await client.delete_ledger(writer.ledger_id)
            return latencies
        result = await asyncio.to_thread(self._driver(s).call, "latency", rate, seconds, s.ack_quorum)
        return list(result["latencies_us"])  # type: ignore[call-overload]

    async def catchup(self, s: System, size: int, total_bytes: int) -> dict[str, float]:
        """Workload 3a: `total_bytes` written in `size` entries to one ledger, then read from the start."""
        if s.kind == "octavo":
            return await octavo_catchup(self.clients[self._octavo_policy(s)], size, total_bytes, s.ack_quorum)
        result = await asyncio.to_thread(self._driver(s).call, "catchup", size, total_bytes, s.ack_quorum)
        return {k: float(result[k]) for k in ("write_rate", "read_rate", "entries")}  # type: ignore[arg-type]

    async def tail(self, s: System, rate: int, seconds: float) -> tuple[list[int], list[int]]:
        """Workload 3b: latencies (us) from each entry's scheduled send to a tailing reader holding it, and to
        its acknowledgement."""
        if s.kind == "octavo":
            return await octavo_tail(self.clients[self._octavo_policy(s)], rate, seconds, s.ack_quorum)
        result = await asyncio.to_thread(self._driver(s).call, "tail", rate, seconds, s.ack_quorum)
        return list(result["tail_us"]), list(result["latencies_us"])  # type: ignore[call-overload]


async def octavo_throughput(client: Client, size: int, ledgers: int, seconds: float, ack_quorum: int) -> float:
    """bench/cluster_bench.py's run_octavo with the ack quorum as a parameter."""
    writers = [await client.create_ledger(3, 3, ack_quorum, password=b"bench") for _ in range(ledgers)]
    payload = os.urandom(size)
    chunk = max(1, inflight(size) // ledgers)
    rate = await drive(ledgers, chunk, seconds, lambda i, n: writers[i].append_many([payload] * n))
    await asyncio.gather(*(w.close() for w in writers))
    for writer in writers:
        await client.delete_ledger(writer.ledger_id)
    for bookie in (await client.bookies(refresh=True)).values():
        async with grpc.aio.insecure_channel(bookie.address) as channel:
            await pb_grpc.BookieAdminStub(channel).RunGc(pb.RunGcRequest(), timeout=60)
    return rate


async def octavo_catchup(client: Client, size: int, total_bytes: int, ack_quorum: int) -> dict[str, float]:
    """One ledger of `total_bytes` written with the in-flight budget and closed, then opened again and read from
    the start with `read_batches` (what a consumer catching up does)."""
    count = max(1, total_bytes // size)
    writer = await client.create_ledger(3, 3, ack_quorum, password=b"bench")
    payload = os.urandom(size)
    chunk = inflight(size)
    t0 = time.perf_counter()
    for start in range(0, count, chunk):
        await writer.append_many([payload] * min(chunk, count - start))
    write_s = time.perf_counter() - t0
    await writer.close()
    reader = await client.open_ledger(writer.ledger_id, password=b"bench")
    got = 0
    t1 = time.perf_counter()
    async for batch in reader.read_batches(0, count - 1):
        got += sum(len(e.data) for e in batch)
    read_s = time.perf_counter() - t1
    await reader.close()
    await client.delete_ledger(writer.ledger_id)
    if got != count * size:
        raise RuntimeError(f"read {got} bytes, wrote {count * size}")
    return {"write_rate": count / write_s, "read_rate": count / read_s, "entries": float(count)}


async def octavo_tail(client: Client, rate: int, seconds: float, ack_quorum: int) -> tuple[list[int], list[int]]:
    """The open loop of the latency workload, entries carrying their index, and a reader of the same client
    following the ledger with `tail_batches`: us from an entry's scheduled send to the reader holding it."""
    writer = await client.create_ledger(3, 3, ack_quorum, password=b"bench")
    reader = await client.open_ledger(writer.ledger_id, password=b"bench", recovery=False)
    n = int(rate * seconds)
    scheduled_at = [0.0] * n
    tail_us = [-1] * n
    loop = asyncio.get_running_loop()

    async def follow() -> None:
        got = 0
        async for batch in reader.tail_batches(0):
            now = loop.time()
            for entry in batch:
                i = int.from_bytes(entry.data[:8], "big")
                tail_us[i] = int((now - scheduled_at[i]) * 1e6)
            got += len(batch)
            if got >= n:
                return

    following = asyncio.ensure_future(follow())
    body = os.urandom(LATENCY_ENTRY_BYTES - 8)

    try:
        # Each entry carries its index in its first 8 bytes: the reader finds its schedule by it.
        add_us = await open_loop_nowait(writer, lambda i: i.to_bytes(8, "big") + body, rate, seconds, scheduled_at)
        await asyncio.wait_for(following, 120)
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        await writer.close()
        await reader.close()
        await client.delete_ledger(writer.ledger_id)
    return tail_us, add_us


async def open_loop_nowait(writer: WriteHandle, make: Callable[[int], bytes], rate: int, seconds: float,
                           schedule: list[float] | None = None) -> list[int]:
    """Latencies (us) of entries `make(i)` appended one per call at `rate` per second, from their scheduled time
    to their acknowledgement: `append_nowait` and a callback on its future, no task per record (as the peers'
    drivers send and take a callback). When the in-flight budget is full the record waits for room with
    `append`, as the peers' clients block, and that wait is in its latency. Records issued while the loop runs
    behind its schedule go out in one request, as Kafka's producer does with the records that accumulate."""
    loop = asyncio.get_running_loop()
    n = int(rate * seconds)
    latencies = [0] * n
    left = [n]
    failure: list[BaseException] = []
    all_done: asyncio.Future[None] = loop.create_future()

    def finished(i: int, scheduled: float, future: asyncio.Future[int]) -> None:
        latencies[i] = int((loop.time() - scheduled) * 1e6)
        if not future.cancelled() and future.exception() is not None:
            failure.append(future.exception())  # type: ignore[arg-type]
        left[0] -= 1
        if left[0] == 0 and not all_done.done():
            all_done.set_result(None)

    t0 = loop.time()
    for i in range(n):
        scheduled = t0 + i / rate
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if schedule is not None:
            schedule[i] = scheduled
        data = make(i)
        try:
            future: asyncio.Future[int] = writer.append_nowait(data)
        except BufferFullError:
            future = asyncio.ensure_future(writer.append(data))
        future.add_done_callback(functools.partial(finished, i, scheduled))
        if failure:
            break
    if n and not failure:
        await asyncio.wait_for(all_done, 120)
    if failure:
        raise failure[0]
    return latencies


# -- measuring ------------------------------------------------------------------------------------------------
@dataclass
class Usage:
    """CPU seconds and bytes written, summed over a system's throughput runs of one entry size."""

    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    written_bytes: float = 0.0


def cpu_of(pids: list[int]) -> float:
    return sum(servers.cpu_seconds(p) for p in pids)


async def measured_throughput(bench: Bench, s: System, size: int, ledgers: int, seconds: float,
                              usage: Usage) -> float | None:
    """Entries per second, or None when the run failed (said on stdout; the run goes on with the next)."""
    pids, client = s.server_pids(), s.client_pid()
    server0, client0, t0 = cpu_of(pids), servers.cpu_seconds(client), time.perf_counter()
    try:
        rate = await bench.throughput(s, size, ledgers, seconds)
    except Exception as e:
        print(f"FAILED {s.label} {size} B x {ledgers}: {e}", flush=True)
        return None
    elapsed = time.perf_counter() - t0
    usage.server_cpu_s += cpu_of(pids) - server0
    usage.client_cpu_s += servers.cpu_seconds(client) - client0
    # The rate is over the writing; the CPU is over the whole run (creation and deletion included), so the
    # bytes are the rate times the whole run's time only up to that small difference: take the rate's.
    usage.written_bytes += rate * size * min(elapsed, seconds * 1.05 + 1)
    return rate


@dataclass
class Figures:
    """What a run measured, per system key."""

    rates: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)  # "SIZExLEDGERS" -> per round
    usage: dict[str, dict[str, Usage]] = field(default_factory=dict)  # str(size) or "many" -> CPU and bytes
    latencies: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    tail: dict[str, list[int]] = field(default_factory=dict)
    tail_add: dict[str, list[int]] = field(default_factory=dict)  # the acks of the tailed entries
    catchup: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)  # write_rate/read_rate
    failures: list[str] = field(default_factory=list)


async def throughput_round(args: argparse.Namespace, bench: Bench, order: list[System], f: Figures,
                           round_no: int, configs_: list[tuple[int, int, str]]) -> None:
    for size, ledgers, usage_key in configs_:
        for s in order:
            rate = await measured_throughput(bench, s, size, ledgers, args.seconds,
                                             f.usage[s.key].setdefault(usage_key, Usage()))
            f.rates[s.key].setdefault(f"{size}x{ledgers}", []).append(rate)
            if rate is None:
                f.failures.append(f"{s.key} {size} B x {ledgers} round {round_no + 1}")
            else:
                print(f"round {round_no + 1} {size:>6} B x {ledgers:>4}  {s.label:<26} {rate:>10,.0f}/s "
                      f"{rate * size / 1e6:>7.1f} MB/s  (load {os.getloadavg()[0]:.1f})", flush=True)


async def latency_round(args: argparse.Namespace, bench: Bench, order: list[System], f: Figures,
                        round_no: int) -> None:
    for rate_per_s in args.rates:
        for s in order:
            try:
                lat = await bench.latency(s, rate_per_s, args.latency_seconds)
            except Exception as e:
                print(f"FAILED {s.label} latency at {rate_per_s}/s: {e}", flush=True)
                f.failures.append(f"{s.key} latency {rate_per_s}/s: {e}")
                continue
            f.latencies[s.key][rate_per_s] += lat
            print(f"round {round_no + 1} latency {rate_per_s:>6}/s {s.label:<26} "
                  f"p50 {percentile(lat, 50) / 1e3:.2f} p99 {percentile(lat, 99) / 1e3:.2f} ms", flush=True)


async def read_round(args: argparse.Namespace, bench: Bench, order: list[System], f: Figures, round_no: int,
                     workloads: set[str]) -> None:
    """Workload 3: tailing latency on every system, the catch-up read on one row of each kind."""
    for s in order if "tail" in workloads else []:
        try:
            lat, add = await bench.tail(s, args.tail_rate, args.latency_seconds)
        except Exception as e:
            print(f"FAILED {s.label} tail at {args.tail_rate}/s: {e}", flush=True)
            f.failures.append(f"{s.key} tail {args.tail_rate}/s: {e}")
            continue
        f.tail[s.key] += lat
        f.tail_add[s.key] += add
        print(f"round {round_no + 1} tail {args.tail_rate:>6}/s {s.label:<26} p50 {percentile(lat, 50) / 1e3:.2f} "
              f"p99 {percentile(lat, 99) / 1e3:.2f} ms (acks p50 {percentile(add, 50) / 1e3:.2f} ms)", flush=True)
    for s in order if "catchup" in workloads else []:
        if s.key not in CATCHUP_SYSTEMS:
            continue
        try:
            r = await bench.catchup(s, args.catchup_size, args.catchup_bytes)
        except Exception as e:
            print(f"FAILED {s.label} catch-up: {e}", flush=True)
            f.failures.append(f"{s.key} catch-up round {round_no + 1}: {e}")
            r = {"write_rate": None, "read_rate": None}  # type: ignore[dict-item]
        for k in ("write_rate", "read_rate"):
            f.catchup[s.key].setdefault(k, []).append(r[k])
        if r["read_rate"] is not None:
            print(f"round {round_no + 1} catch-up {args.catchup_size} B {s.label:<26} write {r['write_rate']:,.0f}/s "
                  f"read {r['read_rate']:,.0f}/s  (load {os.getloadavg()[0]:.1f})", flush=True)


async def run(args: argparse.Namespace, bench: Bench) -> dict[str, object]:
    systems = [s for s in SYSTEMS if s.key in bench.keys]
    f = Figures(rates={s.key: {} for s in systems}, usage={s.key: {} for s in systems},
                latencies={s.key: {r: [] for r in args.rates} for s in systems},
                tail={s.key: [] for s in systems}, tail_add={s.key: [] for s in systems},
                catchup={s.key: {} for s in systems})
    workloads = set(args.workloads)
    started = time.time()
    loads = [os.getloadavg()[0]]
    print("warming up (a discarded run of each system)", flush=True)
    for s in systems:
        try:
            await bench.throughput(s, 1024, 1, args.seconds)
            await bench.latency(s, 2000, min(args.seconds, 3.0))
        except Exception as e:  # the measured runs say whether the system works
            print(f"warm-up of {s.label} failed: {e}", flush=True)
    configs_ = [(size, ledgers, str(size)) for size in args.sizes for ledgers in args.ledgers] \
        if "throughput" in workloads else []
    if "many" in workloads:
        configs_.append((args.many_size, args.many_ledgers, "many"))
    for round_no in range(args.rounds):
        order = systems[round_no % len(systems):] + systems[:round_no % len(systems)]
        await throughput_round(args, bench, order, f, round_no, configs_)
        loads.append(os.getloadavg()[0])
        if "latency" in workloads:
            await latency_round(args, bench, order, f, round_no)
        await read_round(args, bench, order, f, round_no, workloads)
        loads.append(os.getloadavg()[0])
        if args.results:  # what the rounds so far measured, kept should a later round not finish
            so_far = argparse.Namespace(**{**vars(args), "rounds": round_no + 1})
            Path(args.results).write_text(json.dumps(collect(so_far, systems, f, loads, started), indent=1,
                                                     default=str) + "\n")
    return collect(args, systems, f, loads, started)


def collect(args: argparse.Namespace, systems: list[System], f: Figures, loads: list[float],
            started: float) -> dict[str, object]:
    """The results file's contents: the figures so far, summarized."""
    peak_rss = {s.key: {"servers_bytes": [servers.peak_rss_bytes(p) for p in s.server_pids()],
                        "client_bytes": servers.peak_rss_bytes(s.client_pid())} for s in systems}
    return {"args": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()},
            "machine": machine_line(), "load_average_1min": {"min": min(loads), "max": max(loads), "samples": loads},
            "minutes": (time.time() - started) / 60, "systems": {s.key: vars_of(s) for s in systems},
            "throughput": f.rates,
            "usage": {k: {key: vars(u) for key, u in v.items()} for k, v in f.usage.items()},
            "latency_us": {k: {str(r): summarize(v) for r, v in by_rate.items()} for k, by_rate in f.latencies.items()},
            "tail_us": {k: summarize(v) for k, v in f.tail.items()},
            "tail_add_us": {k: summarize(v) for k, v in f.tail_add.items()}, "catchup": f.catchup,
            "peak_rss": peak_rss, "failures": f.failures}


PERCENTILES = (50, 90, 99, 99.9, 99.99)


def summarize(latencies_us: list[int]) -> dict[str, float]:
    """What the results file keeps of a pooled latency sample (millions of samples would not fit in git)."""
    if not latencies_us:
        return {"count": 0}
    return {"count": len(latencies_us), "max": max(latencies_us),
            **{f"p{p:g}": percentile(latencies_us, p) for p in PERCENTILES}}


def vars_of(s: System) -> dict[str, object]:
    return {"label": s.label, "kind": s.kind, "ack_quorum": s.ack_quorum, "fsync": s.fsync}


# -- report ---------------------------------------------------------------------------------------------------
def ratio_of_rounds(a: list[float | None], b: list[float | None]) -> str:
    """The median of per-round ratios, over the rounds where both runs succeeded."""
    ratios = [x / y for x, y in zip(a, b, strict=True) if x is not None and y]
    return f"{median(ratios):.2f}x" if ratios else "failed"


def median_rate(rates: list[float | None], size: int) -> str:
    ok = [r for r in rates if r is not None]
    if not ok:
        return "failed"
    failed = f", {len(rates) - len(ok)} of {len(rates)} runs failed" if len(ok) < len(rates) else ""
    return f"{median(ok):,.0f} ({median(ok) * size / 1e6:,.1f} MB/s{failed})"


def report(data: dict[str, object]) -> str:
    args = data["args"]
    assert isinstance(args, dict)
    systems: dict[str, dict[str, object]] = data["systems"]  # type: ignore[assignment]
    rates: dict[str, dict[str, list[float | None]]] = data["throughput"]  # type: ignore[assignment]
    keys = [s.key for s in SYSTEMS if s.key in systems]
    pairs = [(a, b) for a, b in PAIRS if a in systems and b in systems]
    label = {k: str(systems[k]["label"]) for k in keys}

    thr_rows, ratio_rows = [], []
    for size in args["sizes"]:
        for ledgers in args["ledgers"]:
            cfg = f"{size}x{ledgers}"
            thr_rows.append([f"{size:,} B", str(ledgers)] + [median_rate(rates[k][cfg], size) for k in keys])
            ratio_rows.append([f"{size:,} B", str(ledgers)] + [
                ratio_of_rounds(rates[a][cfg], rates[b][cfg]) for a, b in pairs])

    lat: dict[str, dict[str, dict[str, float]]] = data["latency_us"]  # type: ignore[assignment]
    lat_rows = []
    for rate in args["rates"]:
        for k in keys:
            v = lat[k][str(rate)]
            lat_rows.append([f"{rate:,}/s", label[k]] + ([f"{v[f'p{p:g}'] / 1e3:,.2f}" for p in (50, 99, 99.9)]
                                                          if v["count"] else ["failed"] * 3))
    lat_ratio_rows = []
    for rate in args["rates"]:
        for a, b in pairs:
            va, vb = lat[a][str(rate)], lat[b][str(rate)]
            if not va["count"] or not vb["count"]:
                continue
            lat_ratio_rows.append([f"{rate:,}/s", f"{label[a]} / {label[b]}"] + [
                f"{va[f'p{p:g}'] / max(1, vb[f'p{p:g}']):.2f}x" for p in (50, 99, 99.9)])

    usage: dict[str, dict[str, dict[str, float]]] = data["usage"]  # type: ignore[assignment]
    rss: dict[str, dict[str, object]] = data["peak_rss"]  # type: ignore[assignment]
    usage_keys = [str(size) for size in args["sizes"] if any(str(size) in usage[k] for k in keys)]
    usage_keys += ["many"] if any("many" in usage[k] for k in keys) else []
    eff_rows = []
    for k in keys:
        cells = [label[k]]
        for key in usage_keys:
            u = usage[k].get(key, {"written_bytes": 0})
            gib = u["written_bytes"] / GIB
            cells.append(f"{u['server_cpu_s'] / gib:,.0f} / {u['client_cpu_s'] / gib:,.0f}" if gib else "-")
        servers_rss = rss[k]["servers_bytes"]
        assert isinstance(servers_rss, list)
        cells.append(", ".join(f"{b / 2**20:,.0f}" for b in servers_rss))
        cells.append(f"{int(rss[k]['client_bytes']) / 2**20:,.0f}")  # type: ignore[call-overload]
        eff_rows.append(cells)

    failures: list[str] = data.get("failures", [])  # type: ignore[assignment]
    settings = "; ".join(f"{label[k]}: {systems[k]['fsync']}" for k in keys)
    return "\n".join([
        "## Octavo against Apache Kafka, Apache BookKeeper and NATS JetStream (bench/peers_bench.py)",
        "",
        f"`python bench/peers_bench.py --rounds {args['rounds']} --seconds {args['seconds']:g} "
        f"--latency-seconds {args['latency_seconds']:g}` (`make bench-peers`); {data['machine']}; the run took "
        f"{float(data['minutes']):.0f} minutes{load_range(data)} (raw figures: bench/results/peers.json).",
        "",
        f"Versions: Kafka {configs.KAFKA_VERSION} (3 KRaft brokers, each broker+controller), BookKeeper "
        f"{configs.BOOKKEEPER_VERSION} (ZooKeeper 3.9.3 and 3 bookies per set, `org.apache.bookkeeper.server.Main`, "
        "`DbLedgerStorage`, the storage Pulsar runs), Octavo from this checkout (etcd and 3 bookies per cluster, "
        "64 MiB entry logs); Java 17, heaps of 1 GiB for brokers and bookies (plus 1 GiB of direct memory for "
        "a bookie's caches). Every server is its own process on loopback; all data on the same volume. "
        "Replication: 3 copies everywhere (E=3 Qw=3; Kafka RF 3, `min.insync.replicas=2`, `acks=all`, which "
        "waits for every in-sync replica, so its fair Octavo row is Qa=3). Durability when an add is "
        f"acknowledged: {settings}. Clients: Octavo's Python client in the benchmark's process "
        "(`append_many`, one `append` per record for latency); Kafka's and BookKeeper's Java clients in "
        "bench/peers/PeerDriver.java, one JVM per system warmed by a discarded run (Kafka: `linger.ms=5`, its "
        "default, for throughput and 0 for latency, batches up to 1 MiB, `buffer.memory` 16 MiB, no "
        "compression, `enable.idempotence=false` (see below); BookKeeper: the v2 wire protocol as Pulsar runs "
        "it, no client throttle, CRC32C digests); JetStream's by bench/peers/jsdriver.py, a Python process of its own "
        "speaking the NATS protocol on one connection (no client library; publishes with a reply subject each, "
        "pipelined up to the budget). "
        "The same in-flight budget for all: 8 MiB of payload shared by the ledgers (partitions). The machine: "
        "2 shared cores for servers, clients and, during this run, other sessions' test suites: the load average "
        "above says how busy it was. Ratios between systems are measured in the same run, alternating; absolute "
        "figures move from run to run.",
        "",
        f"### Throughput (entries/s, medians of {args['rounds']} rounds of {args['seconds']:g} s)",
        "",
        table(["entry", "ledgers", *[label[k] for k in keys]], thr_rows),
        "",
        "Octavo / peer, with the same durability and acknowledgement (median of per-round ratios; above 1 means "
        "Octavo is faster):",
        "",
        table(["entry", "ledgers", *[f"{label[a]} / {label[b]}" for a, b in pairs]], ratio_rows),
        "",
        f"### Latency at a fixed rate (ms, 1 KiB, one record per call, one ledger, open loop; {args['rounds']} runs "
        f"of {args['latency_seconds']:g} s pooled, from the scheduled send to the acknowledgement)",
        "",
        table(["rate", "system", "p50", "p99", "p99.9"], lat_rows),
        "",
        "Octavo's latency / the peer's, same durability and acknowledgement (above 1 means Octavo is slower):",
        "",
        table(["rate", "Octavo / peer", "p50", "p99", "p99.9"], lat_ratio_rows),
        "",
        *reads_and_many_report(data, keys, label, pairs),
        "### Efficiency: CPU seconds per GiB written (servers / client) over the throughput runs, and peak RSS",
        "",
        table(["system", *[(f"{int(key):,} B" if key != "many" else f"{args.get('many_size', 100)} B x "
                            f"{args.get('many_ledgers', 1000):,} ledgers") + ": CPU s/GiB" for key in usage_keys],
               "peak RSS per server (MiB)", "client peak RSS (MiB)"], eff_rows),
        "",
        "Failed runs (left out of the medians): " + ("; ".join(failures) if failures else "none") + ".",
        "",
        "Peak RSS is VmHWM over the whole run; the last figure of Octavo's and BookKeeper's rows is etcd's and "
        "ZooKeeper's, and rows that share servers (Octavo Qa=2 and Qa=3; BookKeeper nosync Qa=2 and Qa=3) show "
        "the same processes. "
        "Server CPU includes the metadata store (Octavo's etcd, BookKeeper's ZooKeeper; Kafka's controllers run "
        "in its brokers). Octavo's client is the benchmark's own Python process, which holds both Octavo "
        "clusters' clients; Kafka's and BookKeeper's client is the driver JVM (its JIT and garbage collector "
        "included), JetStream's the jsdriver.py process.",
        "",
        "The run of 2026-11-26 05:48 UTC (workloads 1, 2 and 5, without JetStream, at load 12-45), its "
        "supplementary runs and what they said: bench/peers/results/reading.md and the JSON files beside it.",
    ])


def load_range(data: dict[str, object]) -> str:
    """The 1-minute load average between the rounds, as the run recorded it."""
    load = data.get("load_average_1min")
    if not isinstance(load, dict):
        return ""
    return f", the 1-minute load average between rounds {load['min']:.1f} to {load['max']:.1f}"


def reads_and_many_report(data: dict[str, object], keys: list[str], label: dict[str, str],
                          pairs: list[tuple[str, str]]) -> list[str]:
    """The tables of workloads 3 (catch-up read, tailing latency) and 4 (many ledgers), when the run had them."""
    args: dict[str, object] = data["args"]  # type: ignore[assignment]
    out: list[str] = []
    rates: dict[str, dict[str, list[float | None]]] = data["throughput"]  # type: ignore[assignment]
    many = f"{args.get('many_size')}x{args.get('many_ledgers')}"
    many_keys = [k for k in keys if rates[k].get(many)]
    if many_keys:
        size = int(args["many_size"])  # type: ignore[call-overload]
        out += [f"### Workload 4: {int(args['many_ledgers']):,} concurrent ledgers (partitions) of "  # type: ignore[call-overload]
                f"{size} B entries (entries/s, medians of {args['rounds']} rounds of {args['seconds']:g} s)", "",
                "The in-flight budget (8 MiB of payload) is shared by the ledgers: each writes chunks of "
                f"{max(1, (8 << 20) // size // int(args['many_ledgers'])):,} entries.", "",  # type: ignore[call-overload]
                table(["system", "entries/s (MB/s)"], [[label[k], median_rate(rates[k][many], size)]
                                                        for k in many_keys]), "",
                table(["Octavo / peer", "ratio (median of per-round ratios; above 1 means Octavo is faster)"],
                      [[f"{label[a]} / {label[b]}", ratio_of_rounds(rates[a][many], rates[b][many])]
                       for a, b in pairs if a in many_keys and b in many_keys]), ""]
    catchup: dict[str, dict[str, list[float | None]]] = data.get("catchup", {})  # type: ignore[assignment]
    cu_keys = [k for k in keys if catchup.get(k, {}).get("read_rate")]
    if cu_keys:
        size = int(args["catchup_size"])  # type: ignore[call-overload]
        gib = int(args["catchup_bytes"]) / GIB  # type: ignore[call-overload]
        rows = [[label[k], median_rate(catchup[k]["write_rate"], size), median_rate(catchup[k]["read_rate"], size)]
                for k in cu_keys]
        ratio_rows = [[f"{label[a]} / {label[b]}", ratio_of_rounds(catchup[a]["read_rate"], catchup[b]["read_rate"])]
                      for a, b in pairs if a in cu_keys and b in cu_keys]
        out += [f"### Workload 3a: catch-up read of {gib:g} GiB written earlier ({size:,} B entries; entries/s, "
                f"medians of {args['rounds']} rounds)", "",
                "One ledger (partition, subject) written with the in-flight budget and, for Octavo and BookKeeper, "
                "closed; then read from the start by a reader of the same client process (Octavo: `read_batches`; "
                "Kafka: a consumer assigned to the partition, `max.poll.records` 10,000; BookKeeper: the ledger "
                "opened again, 8 reads of up to 1,000 entries and 8 MiB in flight; JetStream: a pull consumer "
                "without acks, two batches of 2,000 outstanding). The page cache holds the data in every case.", "",
                table(["system", "write (entries/s)", "catch-up read (entries/s)"], rows), "",
                table(["Octavo / peer", "read ratio (above 1 means Octavo is faster)"], ratio_rows), ""]
    tail: dict[str, dict[str, float]] = data.get("tail_us", {})  # type: ignore[assignment]
    acks: dict[str, dict[str, float]] = data.get("tail_add_us", {})  # type: ignore[assignment]
    tail_keys = [k for k in keys if tail.get(k, {}).get("count")]
    if tail_keys:
        out += [f"### Workload 3b: tailing latency ({int(args['tail_rate']):,}/s of 1 KiB, one record per call, "  # type: ignore[call-overload]
                f"open loop; {args['rounds']} runs of {args['latency_seconds']:g} s pooled; ms from the scheduled "
                "send to a tailing reader holding the entry)", "",
                "Octavo: a reader of the same client following the ledger with `tail_batches` (long polls). Kafka: "
                "a consumer at the end of the partition (`fetch.min.bytes=1`), which sees a record once the "
                "high watermark passes it, i.e. once every in-sync replica has it. BookKeeper: a second client "
                "polling `tryReadLastAddConfirmed` every 0.2 ms and reading up to it (`readUnconfirmed`); an entry "
                "becomes readable when the next add carries its LAC. JetStream: a push consumer (deliver new, no "
                "acks). The ack columns are the same entries' add latency (scheduled send to acknowledgement).",
                "",
                table(["system", "tail p50", "tail p99", "tail p99.9", "ack p50", "ack p99"],
                      [[label[k], *[f"{tail[k][f'p{q:g}'] / 1e3:,.2f}" for q in (50, 99, 99.9)],
                        *[f"{acks[k][f'p{q:g}'] / 1e3:,.2f}" if acks.get(k, {}).get("count") else "-"
                          for q in (50, 99)]] for k in tail_keys]),
                "",
                table(["Octavo / peer", "p50", "p99", "p99.9"],
                      [[f"{label[a]} / {label[b]}", *[f"{tail[a][f'p{q:g}'] / max(1, tail[b][f'p{q:g}']):.2f}x"
                                                       for q in (50, 99, 99.9)]]
                       for a, b in pairs if a in tail_keys and b in tail_keys]), ""]
    return out


def check_prerequisites(keys: set[str]) -> None:
    """What the chosen systems need, resolved before any server starts (SystemExit naming what is missing)."""
    kinds = {s.kind for s in SYSTEMS if s.key in keys}
    if kinds & {"kafka", "bookkeeper"}:
        for tool in ("java", "javac", "mvn"):
            if shutil.which(tool) is None:
                raise SystemExit(f"{tool} not found: Kafka and BookKeeper need Java 17 (java, javac) and Maven")
        for system in sorted(kinds & {"kafka", "bookkeeper"}):
            servers.classpath(system)
    if "jetstream" in kinds and shutil.which("nats-server") is None:
        raise SystemExit("nats-server not found: JetStream needs Debian's nats-server (apt-get install nats-server, "
                         "or `make system-packages`)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="about how long each throughput run lasts")
    ap.add_argument("--latency-seconds", type=float, default=10.0, help="how long each fixed-rate run lasts")
    ap.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=SIZES)
    ap.add_argument("--ledgers", type=lambda v: [int(x) for x in v.split(",")], default=LEDGER_COUNTS)
    ap.add_argument("--rates", type=lambda v: [int(x) for x in v.split(",")], default=LATENCY_RATES)
    ap.add_argument("--systems", type=lambda v: set(v.split(",")), default={s.key for s in SYSTEMS},
                    help="comma-separated keys: " + ", ".join(s.key for s in SYSTEMS))
    ap.add_argument("--workloads", type=lambda v: v.split(","), default=list(WORKLOADS),
                    help="comma-separated: " + ", ".join(WORKLOADS) + " (many: workload 4)")
    ap.add_argument("--catchup-bytes", type=int, default=1 << 30, help="what workload 3's catch-up reads back")
    ap.add_argument("--catchup-size", type=int, default=64 * 1024,
                    help="the entry size of the catch-up ledger (1 GiB of 1 KiB entries is a million: BookKeeper "
                         "read them at under 1,000/s on the loaded machine)")
    ap.add_argument("--tail-rate", type=int, default=2000, help="the writer's rate while a reader tails")
    ap.add_argument("--many-ledgers", type=int, default=1000, help="workload 4's ledgers (partitions)")
    ap.add_argument("--many-size", type=int, default=100, help="workload 4's entry size")
    ap.add_argument("--quick", action="store_true", help="one short round of 1 KiB on one ledger, 2,000/s; no report")
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("--results", metavar="JSON", help="also write the figures to this file (a partial run too)")
    ap.add_argument("--report-from", metavar="JSON", help="write the report from a results file, running nothing")
    args = ap.parse_args()
    if args.report_from:
        data = json.loads(Path(args.report_from).read_text())
        for by_rate in data["latency_us"].values():  # a file of raw samples (an earlier format) is summarized
            for rate, v in by_rate.items():
                by_rate[rate] = summarize(v) if isinstance(v, list) else v
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(data, indent=1, default=str) + "\n")
        write_section("peers", report(data))
        return
    if args.quick:
        args.rounds, args.seconds, args.latency_seconds = 1, 2.0, 2.0
        args.sizes, args.ledgers, args.rates = [1024], [1], [2000]
        args.workloads = ["throughput", "latency"]
    unknown = set(args.workloads) - set(WORKLOADS) or args.systems - {s.key for s in SYSTEMS}
    if unknown:
        raise SystemExit(f"unknown workloads or systems: {', '.join(sorted(unknown))}")
    full = (args.sizes == SIZES and args.ledgers == LEDGER_COUNTS and args.rates == LATENCY_RATES
            and args.systems == {s.key for s in SYSTEMS} and set(args.workloads) == set(WORKLOADS))
    if args.quick or not full:
        args.no_report = True
    check_prerequisites(args.systems)
    # SIGTERM and SIGINT (ignored by a background job of a non-interactive shell) stop every server started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    root = tempfile.mkdtemp(prefix="octavo-peers-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR"))
    bench = Bench(root, args.systems)
    print(f"starting servers under {root}", flush=True)
    try:
        bench.start()

        async def go() -> dict[str, object]:
            await bench.open_clients()
            try:
                return await run(args, bench)
            finally:
                await bench.close_clients()

        data = asyncio.run(go())
    except BaseException:
        print(f"failed: the servers' logs are kept under {root}", flush=True)
        bench.stop()
        raise
    bench.stop()
    shutil.rmtree(root, ignore_errors=True)
    data["args"]["systems"] = sorted(args.systems)  # type: ignore[index]
    if args.results:
        Path(args.results).write_text(json.dumps(data, indent=1, default=str) + "\n")
    if args.no_report:
        print(json.dumps({k: v for k, v in data.items() if k != "latency_us"}, indent=1, default=str)[:4000])
        return
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1, default=str) + "\n")
    write_section("peers", report(data))
    print(f"wrote docs/benchmarks.md (peers) and {RESULTS.relative_to(HERE.parent.parent)}")


if __name__ == "__main__":
    main()
