"""The client library on a real local cluster: etcd and bookie processes, real gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from octavo.cli.localcluster import LocalCluster
from octavo.client import (
    Client,
    ClientOptions,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    SyncClient,
    WrongPasswordError,
)
from octavo.meta.ledger_metadata import CLOSED

PW = b"secret"
FAST = ClientOptions(add_timeout_s=5.0, read_timeout_s=3.0, speculative_read_delay_s=0.1, metadata_timeout_s=2.0)
BOOKIE_ARGS = ["--log-size-bytes-max", str(16 << 20), "--batch-bytes-max", str(8 << 20)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("cluster")), bookies=5, bookie_args=BOOKIE_ARGS) as c:
        yield c


def data(ledger: int, entry: int, size: int = 300) -> bytes:
    seed = f"{ledger}:{entry}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


async def write(client: Client, n: int, e: int = 3, qw: int = 3, qa: int = 2) -> tuple[int, list[int]]:
    writer = await client.create_ledger(e, qw, qa, password=PW, metadata={"app": "test"})
    ids = await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(n)))
    assert writer.last_add_confirmed == n - 1
    await writer.close()
    return writer.ledger_id, list(ids)


async def read_all(client: Client, ledger_id: int) -> list[bytes]:
    reader = await client.open_ledger(ledger_id, password=PW)
    return [entry.data async for entry in reader.read(0, reader.last_entry_id)] if reader.last_entry_id >= 0 else []


@pytest.mark.parametrize(("e", "qw", "qa"), [(3, 3, 2), (5, 3, 2), (4, 2, 2)])
async def test_write_and_read_back(cluster: LocalCluster, e: int, qw: int, qa: int) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        ledger, ids = await write(client, 3000, e, qw, qa)
        assert ids == list(range(3000))
        meta = await client.ledger_metadata(ledger)
        assert meta.state == CLOSED and meta.last_entry_id == 2999 and meta.custom_metadata == {"app": "test"}
        assert (meta.ensemble_size, meta.write_quorum, meta.ack_quorum) == (e, qw, qa)
        got = await read_all(client, ledger)
        assert got == [data(ledger, i) for i in range(3000)]
        assert ledger in await client.list_ledgers()


async def test_empty_ledger_closes_at_minus_one(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.close()
        reader = await client.open_ledger(writer.ledger_id, password=PW)
        assert reader.last_entry_id == -1


async def test_clear_errors(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        with pytest.raises(NotEnoughBookiesError, match="needs 9 writable bookies"):
            await client.create_ledger(9, 3, 2, password=PW)
        with pytest.raises(ValueError, match="ack_quorum"):
            await client.create_ledger(3, 2, 3, password=PW)
        writer = await client.create_ledger(3, 3, 2, password=PW)
        with pytest.raises(EntryTooLargeError, match="entry_size_bytes_max"):
            await writer.append(b"x" * (4 * 1024 * 1024 + 1))
        await writer.append(b"ok")
        await writer.close()
        with pytest.raises(LedgerClosedError):
            await writer.append(b"late")
        with pytest.raises(WrongPasswordError):
            await client.open_ledger(writer.ledger_id, password=b"wrong")
        with pytest.raises(NoSuchLedgerError):
            await client.open_ledger(10**9, password=PW)
        await client.delete_ledger(writer.ledger_id)
        with pytest.raises(NoSuchLedgerError):
            await client.open_ledger(writer.ledger_id, password=PW)


async def test_non_recovery_open_reads_up_to_the_lac_and_leaves_the_writer_alone(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(100)))
        await writer.append(data(writer.ledger_id, 100))  # carries LAC = 99 to the bookies
        reader = await client.open_ledger(writer.ledger_id, password=PW, recovery=False)
        assert reader.last_entry_id >= 99
        got = [e.data async for e in reader.read(0, 99)]
        assert got == [data(writer.ledger_id, i) for i in range(100)]
        await writer.append(b"still writing")
        await writer.close()


async def test_recovery_open_fences_the_writer(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client, \
            Client(cluster.etcd_endpoint, options=FAST) as other:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(50)))
        reader = await other.open_ledger(writer.ledger_id, password=PW)
        assert reader.last_entry_id == 49
        with pytest.raises(LedgerFencedError):
            await writer.append(b"after the fence")
        with pytest.raises(LedgerFencedError):
            await writer.close()
        assert (await other.ledger_metadata(writer.ledger_id)).last_entry_id == 49


async def test_an_idle_writer_tells_the_bookies_its_lac(cluster: LocalCluster) -> None:
    """One batch carries the LAC from before it; once the writer is idle it sends the new LAC by itself, so a
    reader of the open ledger sees every acknowledged entry."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client, \
            Client(cluster.etcd_endpoint, options=FAST) as other:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.append_many([data(writer.ledger_id, i) for i in range(100)])  # one batch, LAC -1 on it
        reader = None
        for _ in range(100):
            reader = await other.open_ledger(writer.ledger_id, password=PW, recovery=False)
            if reader.last_entry_id == 99:
                break
            await asyncio.sleep(0.05)
        assert reader is not None and reader.last_entry_id == 99
        assert [e.data async for e in reader.read(0, 99)] == [data(writer.ledger_id, i) for i in range(100)]
        await writer.close()


async def test_closing_the_client_fails_appends_in_flight(cluster: LocalCluster) -> None:
    client = Client(cluster.etcd_endpoint, options=FAST)
    writer = await client.create_ledger(3, 3, 2, password=PW)
    task = asyncio.create_task(writer.append_many([b"x" * 1000] * 5000))
    await asyncio.sleep(0)  # the batch is queued and waiting for its acknowledgements
    await client.close()
    with pytest.raises(LedgerClosedError, match="client was closed"):
        await asyncio.wait_for(task, 10)


def test_sync_client(cluster: LocalCluster) -> None:
    with SyncClient(cluster.etcd_endpoint, options=FAST) as client:
        with client.create_ledger(3, 3, 2, password=PW) as writer:
            assert writer.append(b"one") == 0
            assert writer.append_many([b"two", b"three"]) == [1, 2]
            ledger = writer.ledger_id
        reader = client.open_ledger(ledger, password=PW)
        assert [e.data for e in reader.read(0, reader.last_entry_id)] == [b"one", b"two", b"three"]
        assert set(client.bookies()) >= {"bookie-0", "bookie-1", "bookie-2"}
