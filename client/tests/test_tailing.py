"""Tailing and catch-up reads against a real cluster: a reader on an open ledger learns its LAC, follows the
writer entry by entry (each acknowledged entry exactly once, in order) across an ensemble change, a bookie
SIGKILL and a stopped bookie holding a long poll, and stops at the close or at a recovery's close; catch-up
reads return large ranges byte-identical past the bookies' read limits and release their read-ahead when the
consumer stops early; bad input gets the typed errors."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from octavo.cli.clustertesting import revive, sized
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions, NoSuchLedgerError, ReadError, SyncClient
from octavo.client.reader import ReadHandle

PW = b"pw"
FAST = ClientOptions(add_timeout_s=2.0, read_timeout_s=3.0, metadata_timeout_s=2.0, tail_wait_ms=1000,
                     speculative_read_delay_s=0.1, bookie_list_ttl_s=0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("tailing")), bookies=4) as c:
        yield c


@pytest.fixture(autouse=True)
def all_bookies_up(cluster: LocalCluster) -> Iterator[None]:
    yield
    revive(cluster)


def data(ledger: int, i: int, size: int = 300) -> bytes:
    return sized(f"{ledger}:{i}:", size)


async def collect(reader: ReadHandle, from_entry: int, out: list[tuple[int, bytes]]) -> None:
    async for entry in reader.tail(from_entry):
        out.append((entry.entry_id, entry.data))


async def test_open_without_recovery_learns_the_lac(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as w, Client(cluster.etcd_endpoint, options=FAST) as r:
        writer = await w.create_ledger(3, 3, 2, password=PW)
        await writer.append_many([data(writer.ledger_id, i) for i in range(100)])
        await asyncio.sleep(0.2)  # the writer is idle: its explicit LAC reaches the bookies
        reader = await r.open_ledger(writer.ledger_id, password=PW, recovery=False)
        assert reader.last_entry_id == 99
        assert [e.data async for e in reader.read(0, 99)] == [data(writer.ledger_id, i) for i in range(100)]
        await writer.close()


async def test_tail_follows_the_writer_and_ends_at_the_close(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as w, Client(cluster.etcd_endpoint, options=FAST) as r:
        writer = await w.create_ledger(3, 3, 2, password=PW)
        lid = writer.ledger_id
        await writer.append_many([data(lid, i) for i in range(50)])
        reader = await r.open_ledger(lid, password=PW, recovery=False)
        from_start: list[tuple[int, bytes]] = []
        from_middle: list[tuple[int, bytes]] = []
        tails = [asyncio.create_task(collect(reader, 0, from_start)),
                 asyncio.create_task(collect(await r.open_ledger(lid, password=PW, recovery=False), 30,
                                             from_middle))]
        total = 50
        for burst in range(20):  # one record at a time, with pauses longer and shorter than the explicit LAC
            for _ in range(10 + burst):
                writer.append_nowait(data(lid, total))
                total += 1
            await writer.flush()
            await asyncio.sleep(0.002 if burst % 2 else 0.1)
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in tails), "a tail ended while the ledger was open"
        assert len(from_start) == total, "the tail is behind an idle writer's last acknowledged entry"
        await writer.close()
        await asyncio.wait_for(asyncio.gather(*tails), 15)
        assert from_start == [(i, data(lid, i)) for i in range(total)]
        assert from_middle == [(i, data(lid, i)) for i in range(30, total)]


async def test_tail_across_an_ensemble_change_and_a_sigkilled_bookie(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as w, Client(cluster.etcd_endpoint, options=FAST) as r:
        writer = await w.create_ledger(3, 3, 2, password=PW)
        lid = writer.ledger_id
        reader = await r.open_ledger(lid, password=PW, recovery=False)
        seen: list[tuple[int, bytes]] = []
        tail = asyncio.create_task(collect(reader, 0, seen))
        acked: list[int] = []
        for i in range(3000):
            writer.append_nowait(data(lid, i)).add_done_callback(lambda f: acked.append(f.result()))
            if i % 100 == 99:
                await writer.flush()
                await asyncio.sleep(0.01)
            if i == 1000:
                cluster.bookies[writer.metadata.last_ensemble[0]].kill()
        await writer.flush()
        assert writer.ensemble_changes >= 1
        await writer.close()
        await asyncio.wait_for(tail, 30)
        assert acked == list(range(3000))
        assert seen == [(i, data(lid, i)) for i in range(3000)]


async def test_a_long_poll_held_on_a_stopped_bookie_fails_over(cluster: LocalCluster) -> None:
    """A bookie SIGSTOPped holds its long poll (its connection stays open); the reader goes on with the
    others' answers while the writer, Qa = 2, is acknowledged by the two left."""
    async with Client(cluster.etcd_endpoint, options=FAST) as w, Client(cluster.etcd_endpoint, options=FAST) as r:
        writer = await w.create_ledger(3, 3, 2, password=PW)
        lid = writer.ledger_id
        await writer.append_many([data(lid, i) for i in range(10)])
        reader = await r.open_ledger(lid, password=PW, recovery=False)
        seen: list[tuple[int, bytes]] = []
        tail = asyncio.create_task(collect(reader, 0, seen))
        await asyncio.sleep(0.3)  # the polls are held now
        proc = cluster.bookies[writer.metadata.last_ensemble[1]].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            for i in range(10, 200):
                await writer.append(data(lid, i))
            deadline = asyncio.get_running_loop().time() + 10
            while len(seen) < 199 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
            assert len(seen) >= 199, f"the tail stalled at {len(seen)} entries behind a stopped bookie"
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        await writer.close()
        await asyncio.wait_for(tail, 15)
        assert seen == [(i, data(lid, i)) for i in range(200)]


async def test_tail_ends_at_a_recovery_close_and_never_passes_it(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as w, Client(cluster.etcd_endpoint, options=FAST) as r:
        writer = await w.create_ledger(3, 3, 2, password=PW)
        lid = writer.ledger_id
        await writer.append_many([data(lid, i) for i in range(500)])
        reader = await r.open_ledger(lid, password=PW, recovery=False)
        seen: list[tuple[int, bytes]] = []
        tail = asyncio.create_task(collect(reader, 0, seen))
        await asyncio.sleep(0.3)
        recovered = await r.open_ledger(lid, password=PW)  # fences: the old writer is done
        await asyncio.wait_for(tail, 15)
        assert recovered.last_entry_id == 499
        assert seen == [(i, data(lid, i)) for i in range(500)]


async def test_catch_up_read_of_large_entries_past_the_read_limits(cluster: LocalCluster) -> None:
    """40 MiB in 64 KiB entries: every bookie's answer is cut by read_bytes_max (16 MiB) and continued; the
    range is spread over the three bookies and comes back byte-identical, also with a tiny read-ahead."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        lid = writer.ledger_id
        for start in range(0, 640, 64):
            await writer.append_many([data(lid, i, 64 * 1024) for i in range(start, start + 64)])
        await writer.close()
        reader = await client.open_ledger(lid, password=PW)
        parts = reader._spread(range(0, 3000), frozenset())
        assert parts is not None and len(parts) == 3
        assert sorted(e for p in parts.values() for e in p) == list(range(3000))
        got = [e async for e in reader.read(0, 639)]
        assert [(e.entry_id, e.data) for e in got] == [(i, data(lid, i, 64 * 1024)) for i in range(640)]
    small = ClientOptions(read_batch_bytes=100_000, read_ahead_bytes_max=300_000, read_timeout_s=3.0)
    async with Client(cluster.etcd_endpoint, options=small) as client:
        reader = await client.open_ledger(lid, password=PW)
        batches = [b async for b in reader.read_batches(100, 639)]
        assert len(batches) > 20
        assert [e.data for b in batches for e in b] == [data(lid, i, 64 * 1024) for i in range(100, 640)]


async def test_stopping_a_catch_up_read_early_cancels_its_read_ahead(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        lid = writer.ledger_id
        for start in range(0, 20_000, 5000):
            await writer.append_many([data(lid, i, 100) for i in range(start, start + 5000)])
        await writer.close()
        reader = await client.open_ledger(lid, password=PW)
        def chunk_reads() -> int:
            return sum(1 for t in asyncio.all_tasks() if "_read_chunk" in repr(t.get_coro()))

        batches = reader.read_batches(0, 19_999)
        first = await batches.__anext__()  # the first chunk alone: nothing is read ahead before it is consumed
        # The bookies frozen, the read-ahead the next batch starts cannot finish: it is in flight for sure when
        # the consumer stops (with them running it could all be done already, and the test proved nothing).
        procs = [p.proc for p in cluster.bookies.values() if p.proc is not None]
        for proc in procs:
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            following = asyncio.ensure_future(batches.__anext__())
            await asyncio.sleep(0.2)
            assert chunk_reads() > 1, "no read-ahead in flight"
            following.cancel()  # the consumer stops (a cancelled task) while it waits
            await asyncio.gather(following, return_exceptions=True)
            assert chunk_reads() == 0
        finally:
            for proc in procs:
                os.kill(proc.pid, signal.SIGCONT)
        await batches.aclose()
        assert [e.data for e in first] == [data(lid, i, 100) for i in range(len(first))]


async def test_bad_input_gets_typed_errors(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.append_many([b"x"] * 5)
        reader = await client.open_ledger(writer.ledger_id, password=PW, recovery=False)
        with pytest.raises(ValueError, match="from_entry must be >= 0"):
            await reader.tail(-1).__anext__()
        with pytest.raises(ValueError, match="invalid range"):
            await reader.read(3, 1).__anext__()
        with pytest.raises(ReadError, match="past the last readable entry"):
            await reader.read(0, 50).__anext__()
        tail = reader.tail(5)
        waiting = asyncio.ensure_future(tail.__anext__())
        await asyncio.sleep(0.2)
        await writer.close()
        await client.delete_ledger(writer.ledger_id)
        with pytest.raises((NoSuchLedgerError, StopAsyncIteration)):
            await asyncio.wait_for(waiting, 10)


def test_sync_tail_follows_a_writer_thread(cluster: LocalCluster) -> None:
    with SyncClient(cluster.etcd_endpoint, options=FAST) as client:
        writer = client.create_ledger(3, 3, 2, password=PW)
        lid = writer.ledger_id
        reader = client.open_ledger(lid, password=PW, recovery=False)
        import threading

        def write() -> None:
            for i in range(300):
                writer.append_async(data(lid, i))
                if i % 50 == 0:
                    writer.flush()
            writer.close()

        thread = threading.Thread(target=write)
        thread.start()
        got = [(e.entry_id, e.data) for e in reader.tail(0)]
        thread.join()
        assert got == [(i, data(lid, i)) for i in range(300)]
        assert [e.data for e in reader.read(0, 9)] == [data(lid, i) for i in range(10)]
