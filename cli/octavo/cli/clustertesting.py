"""Helpers for tests that run a client against real bookies of a LocalCluster: the payloads they write, a
ledger read back, waits for a condition, a bookie lost for good, stopped or killed bookies brought back, and
`octavo` run against the cluster. The single-bookie harness (BookieProcess, BookieConnection) is
octavo.node.testing."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions, WriteHandle

PASSWORD = b"pw"  # the password the tests' ledgers are created with
# Timeouts for a cluster on this machine: a request that takes seconds is stuck, not slow.
SHORT_TIMEOUTS = ClientOptions(add_timeout_s=5.0, read_timeout_s=3.0, metadata_timeout_s=2.0)
# For tests that fail bookies: a read goes to another replica after 0.1 s, and the bookie list a writer picks
# replacements from is at most 0.2 s old.
FAILOVER = replace(SHORT_TIMEOUTS, speculative_read_delay_s=0.1, bookie_list_ttl_s=0.2)
OCTAVO_TIMEOUT_S = 180.0


def entry_data(ledger: int, entry: int, repeat: int = 6) -> bytes:
    """`ledger L entry E ` repeated: an entry that names itself, so a mix-up shows in a failed comparison."""
    return f"ledger {ledger} entry {entry} ".encode() * repeat


def sized(seed: str, size: int) -> bytes:
    """`seed` repeated and cut to exactly `size` bytes."""
    unit = seed.encode()
    return (unit * (size // len(unit) + 1))[:size]


async def read_all(client: Client, ledger: int, password: bytes = PASSWORD) -> list[bytes]:
    """Every entry of the ledger, opened with recovery (which closes it if it is open)."""
    reader = await client.open_ledger(ledger, password=password)
    return [e.data async for e in reader.read(0, reader.last_entry_id)] if reader.last_entry_id >= 0 else []


async def write_closed(client: Client, ledgers: int, entries: int, quorum: int = 2) -> dict[int, list[bytes]]:
    """`ledgers` closed ledgers (E = Qw = Qa = `quorum`) of `entries` entries each (entry_data): ledger id ->
    its entries."""
    written: dict[int, list[bytes]] = {}
    for _ in range(ledgers):
        writer = await client.create_ledger(quorum, quorum, quorum, password=PASSWORD)
        written[writer.ledger_id] = [entry_data(writer.ledger_id, i) for i in range(entries)]
        await writer.append_many(written[writer.ledger_id])
        await writer.close()
    return written


async def most_named(client: Client, bookie_ids: Iterable[str]) -> tuple[str, int]:
    """The bookie the most ledgers name (placement is random: a test's victim), and how many name it."""
    counts = {b: len(await naming(client, b)) for b in sorted(bookie_ids)}
    victim = max(counts, key=counts.__getitem__)
    return victim, counts[victim]


async def naming(client: Client, bookie_id: str) -> list[int]:
    """The ledgers whose ensembles (any segment) name the bookie."""
    return [m.ledger_id async for m in client.iter_ledger_metadata()
            if any(bookie_id in bookies for _, bookies in m.ensembles)]


async def quiet(writer: WriteHandle, timeout_s: float = 10) -> None:
    """Wait until every bookie answered the writer, not only the ack quorum: a bookie killed with a request in
    flight would make the writer replace it by itself."""
    deadline = time.monotonic() + timeout_s
    while writer.outstanding_requests:
        assert time.monotonic() < deadline, "the writer's requests were never all answered"
        await asyncio.sleep(0.01)


async def wait_for(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float,
                   interval_s: float = 0.25) -> float:
    """Wait until `check()` is true, checking every `interval_s`; returns the seconds it took. Fails naming
    `what` after `timeout_s`."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s}s"
        await asyncio.sleep(interval_s)
    return time.monotonic() - started


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.1) -> float:
    """`wait_for` for a synchronous check, outside an event loop."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s}s"
        time.sleep(interval_s)
    return time.monotonic() - started


def destroy(cluster: LocalCluster, bookie_id: str) -> None:
    """The bookie is gone for good: killed, its disk lost."""
    cluster.bookies[bookie_id].kill()
    shutil.rmtree(cluster.bookies[bookie_id].data_dir)


def revive(cluster: LocalCluster) -> None:
    """Every bookie serving again: a stopped one (SIGSTOP) continued, a dead one started with its id and data."""
    for bookie in cluster.bookies.values():
        if bookie.alive() and bookie.proc is not None:
            os.kill(bookie.proc.pid, signal.SIGCONT)
        else:
            bookie.start()


def octavo(cluster: LocalCluster, *args: str, timeout_s: float = OCTAVO_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`octavo ARGS --etcd <the cluster's etcd>`, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "octavo.cli.main", *args, "--etcd", cluster.etcd_endpoint],
                          capture_output=True, text=True, timeout=timeout_s)
