"""Garbage collection on a real cluster: deleting a ledger gives its space back on its bookies."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.cli.clustertesting import SHORT_TIMEOUTS, wait_until
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.node.files import LOGS_DIR
from octavo.node.testing import BookieConnection

PW = b"pw"
FAST = SHORT_TIMEOUTS
ARGS = ["--log-size-bytes-max", str(8 << 20), "--batch-bytes-max", str(4 << 20), "--gc-interval-ms", "300"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("gc")), bookies=3, bookie_args=ARGS) as c:
        yield c


def log_bytes(bookie_dir: str) -> int:
    return sum(p.stat().st_size for p in Path(bookie_dir, LOGS_DIR).glob("*.log"))


async def write_ledger(client: Client, mb: int) -> tuple[int, int]:
    """A closed ledger of about `mb` MB; returns its id and entry count."""
    writer = await client.create_ledger(3, 3, 2, password=PW)
    for start in range(0, mb * 1024, 2000):
        await writer.append_many([b"%d " % (start + i) * 100 for i in range(2000)])
    await writer.close()
    return writer.ledger_id, writer.last_add_confirmed + 1


async def test_deleting_a_ledger_gives_its_space_back(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        doomed, _ = await write_ledger(client, 24)
        kept, kept_entries = await write_ledger(client, 8)
        before = {b: log_bytes(p.data_dir) for b, p in cluster.bookies.items()}
        await client.delete_ledger(doomed)
        for bookie_id, bookie in cluster.bookies.items():
            wait_until(f"{bookie_id} gives 8 MiB back",
                       lambda b=bookie, was=before[bookie_id]: log_bytes(b.data_dir) < was - 8 * 1024 * 1024)
            with BookieConnection(bookie.address) as conn:  # a pass ran (its figures may be a later, empty one)
                assert conn.status().gc_last_run_unix_ms > 0
        reader = await client.open_ledger(kept, password=PW)
        count = 0
        async for entry in reader.read(0, reader.last_entry_id):
            assert entry.data == b"%d " % entry.entry_id * 100
            count += 1
        assert count == kept_entries > 0


async def test_a_ledger_deleted_while_a_bookie_is_down_is_collected_when_it_returns(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        doomed, _ = await write_ledger(client, 16)
        await write_ledger(client, 4)  # so the doomed ledger's logs are rolled and flushed
        down = cluster.bookies["bookie-1"]
        down.stop()
        was = log_bytes(down.data_dir)
        await client.delete_ledger(doomed)
        await asyncio.sleep(1.0)
        assert log_bytes(down.data_dir) == was  # nothing happens to a stopped bookie's disk
        down.start()
        wait_until("the returned bookie gives 8 MiB back", lambda: log_bytes(down.data_dir) < was - 8 * 1024 * 1024)


def test_octavo_bookie_gc_runs_a_pass_now(cluster: LocalCluster, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    bookie = cluster.bookies["bookie-0"]
    run = subprocess.run([sys.executable, "-m", "octavo.cli.main", "bookie", "gc", "--bookie", bookie.address,
                          "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["logs_checked"] >= 0
    from octavo.node.testing import BookieProcess

    alone = BookieProcess(str(tmp_path / "standalone"))
    address = alone.start()
    try:
        run = subprocess.run([sys.executable, "-m", "octavo.cli.main", "bookie", "gc", "--bookie", address],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 1 and "FAILED_PRECONDITION" in run.stderr and "needs cluster membership" in run.stderr
    finally:
        alone.stop()
