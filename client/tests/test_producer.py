"""The producer path against a real cluster: one record per call at batch cost (`append_nowait` / `send` /
`flush` on the async handle, `append_async` from many threads on the sync one), linger, back-pressure by the
in-flight byte budget (raising or blocking), in-order acknowledgement, and a fence failing every pending
future with the typed error."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator

import pytest

from octavo.cli.localcluster import LocalCluster
from octavo.client import (
    BufferFullError,
    Client,
    ClientOptions,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    SyncClient,
)

PW = b"pw"
FAST = ClientOptions(add_timeout_s=5.0, read_timeout_s=3.0, metadata_timeout_s=2.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("producer")), bookies=3) as c:
        yield c


def record(tag: str, i: int, size: int = 200) -> bytes:
    seed = f"{tag}:{i}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


async def read_all(client: Client, ledger_id: int) -> list[bytes]:
    reader = await client.open_ledger(ledger_id, password=PW)
    return [e.data async for e in reader.read(0, reader.last_entry_id)]


async def test_append_nowait_one_record_at_a_time_is_acknowledged_in_order(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        futures = []
        for i in range(3000):
            futures.append(writer.append_nowait(record("a", i)))
            if i % 500 == 499:
                await asyncio.sleep(0)  # the producer yields now and then: batches go out
        order: list[int] = []
        for future in futures:
            future.add_done_callback(lambda f: order.append(f.result()))
        await writer.flush()
        assert all(f.done() for f in futures) and [f.result() for f in futures] == list(range(3000))
        assert writer.last_add_confirmed == 2999
        await asyncio.sleep(0)
        assert order == sorted(order)  # resolved in entry-id order
        await writer.close()
        assert await read_all(client, writer.ledger_id) == [record("a", i) for i in range(3000)]


async def test_send_waits_for_room_and_append_nowait_raises_when_the_budget_is_full(cluster: LocalCluster) -> None:
    options = ClientOptions(add_timeout_s=5.0, inflight_bytes_max=10_000)
    async with Client(cluster.etcd_endpoint, options=options) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        with pytest.raises(BufferFullError, match="inflight_bytes_max=10000"):
            for i in range(1000):
                writer.append_nowait(record("b", i, 1000))  # no yield: nothing is acknowledged meanwhile
        appended = writer._next_entry
        assert 0 < appended <= 10
        futures = [await writer.send(record("b", i, 1000)) for i in range(appended, 500)]
        await writer.flush()
        assert [f.result() for f in futures] == list(range(appended, 500))
        await writer.close()
        assert await read_all(client, writer.ledger_id) == [record("b", i, 1000) for i in range(500)]


async def test_linger_holds_a_batch_until_it_expires_or_fills(cluster: LocalCluster) -> None:
    options = ClientOptions(add_timeout_s=5.0, linger_ms=300, linger_bytes_max=5000)
    async with Client(cluster.etcd_endpoint, options=options) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        first = writer.append_nowait(record("c", 0))
        await asyncio.sleep(0.05)
        assert writer._sent_to == 0 and not first.done()  # lingering (without linger it would be sent by now)
        assert await first == 0  # sent when the linger expired
        # A batch that reaches linger_bytes_max goes out at once.
        futures = [writer.append_nowait(record("c", i, 1000)) for i in range(1, 6)]
        await asyncio.sleep(0.05)
        assert writer._sent_to == 6
        assert [await f for f in futures] == [1, 2, 3, 4, 5]
        # flush() and close() send what lingers without waiting for the linger.
        late = writer.append_nowait(record("c", 6))
        await asyncio.wait_for(writer.flush(), 0.25)
        assert late.result() == 6
        writer.append_nowait(record("c", 7))
        await asyncio.wait_for(writer.close(), 2)
        assert len(await read_all(client, writer.ledger_id)) == 8


async def test_a_fence_fails_every_pending_future_with_the_typed_error(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client, \
            Client(cluster.etcd_endpoint, options=FAST) as other:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        done = [writer.append_nowait(record("d", i)) for i in range(100)]
        await writer.flush()
        reader = await other.open_ledger(writer.ledger_id, password=PW)  # recovery open: fences
        assert reader.last_entry_id == 99
        pending = [writer.append_nowait(record("d", i)) for i in range(100, 200)]
        results = await asyncio.gather(*pending, return_exceptions=True)
        assert all(isinstance(r, LedgerFencedError) for r in results), results[:3]
        with pytest.raises(LedgerFencedError):
            writer.append_nowait(b"x")
        with pytest.raises(LedgerFencedError):
            await writer.flush()
        assert [f.result() for f in done] == list(range(100))


async def test_bad_records_raise_at_once_with_nothing_appended(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=ClientOptions(entry_size_bytes_max=1000)) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        with pytest.raises(TypeError, match=r"^data must be bytes, bytearray or memoryview, got str"):
            writer.append_nowait("text")  # type: ignore[arg-type]
        with pytest.raises(EntryTooLargeError, match="entry_size_bytes_max=1000"):
            writer.append_nowait(b"x" * 1001)
        assert await writer.append_nowait(bytearray(b"ok")) == 0  # bytes-like is taken
        await writer.close()
        with pytest.raises(LedgerClosedError):
            writer.append_nowait(b"late")


def test_sync_append_async_from_many_threads(cluster: LocalCluster) -> None:
    with SyncClient(cluster.etcd_endpoint, options=FAST) as client:
        writer = client.create_ledger(3, 3, 2, password=PW)
        results: dict[int, list[tuple[bytes, concurrent.futures.Future[int]]]] = {}

        def produce(thread: int) -> None:
            mine = results[thread] = []
            for i in range(1000):
                data = record(f"t{thread}", i)
                mine.append((data, writer.append_async(data)))

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        writer.flush()
        by_id: dict[int, bytes] = {}
        for mine in results.values():
            ids = [future.result(timeout=0) for _, future in mine]
            assert ids == sorted(ids)  # each thread's records keep its order
            by_id.update((eid, data) for (data, _), eid in zip(mine, ids, strict=True))
        assert sorted(by_id) == list(range(4000))
        writer.close()
        reader = client.open_ledger(writer.ledger_id, password=PW)
        assert [e.data for e in reader.read(0, reader.last_entry_id)] == [by_id[i] for i in range(4000)]


def test_sync_back_pressure_blocks_or_raises(cluster: LocalCluster) -> None:
    options = ClientOptions(add_timeout_s=5.0, inflight_bytes_max=20_000)
    with SyncClient(cluster.etcd_endpoint, options=options) as client:
        writer = client.create_ledger(3, 3, 2, password=PW)
        futures = [writer.append_async(record("s", i, 1000)) for i in range(300)]  # blocks as needed
        raised = 0
        for i in range(300, 400):
            try:
                futures.append(writer.append_async(record("s", i, 1000), block=False))
            except BufferFullError as e:
                assert "inflight_bytes_max=20000" in str(e)
                raised += 1
                futures.append(writer.append_async(record("s", i, 1000), timeout_s=10))
        assert raised > 0  # 100 records at 1 KB, a 20 KB budget: some found it full
        with pytest.raises(TypeError):
            writer.append_async("text")  # type: ignore[arg-type]
        writer.close()  # waits for everything queued or in flight
        assert [f.result(timeout=0) for f in futures] == list(range(400))
        with pytest.raises(LedgerClosedError):
            writer.append_async(b"late")


def test_entry_futures_behave_as_concurrent_futures() -> None:
    """EntryFuture makes its Condition only when someone waits: results set before or after a waiter, from
    another thread, with callbacks, exceptions, wait() and as_completed() all behave as a Future's."""
    from octavo.client.client import EntryFuture

    lock = threading.Lock()
    early = EntryFuture(lock)
    early.set_result(1)
    assert early.done() and early.result(timeout=0) == 1 and early._cond is None  # no Condition was needed
    with pytest.raises(concurrent.futures.InvalidStateError):
        early.set_result(2)
    # Waiters first (many threads), results later from another thread.
    futures = [EntryFuture(lock) for _ in range(200)]
    got: list[int] = []
    seen = threading.Lock()

    def wait_for(f: EntryFuture) -> None:
        value = f.result(timeout=10)
        with seen:
            got.append(value)

    waiters = [threading.Thread(target=wait_for, args=(f,)) for f in futures[::2]]
    for t in waiters:
        t.start()
    called: list[int] = []
    futures[1].add_done_callback(lambda f: called.append(f.result()))
    setter = threading.Thread(target=lambda: [f.set_result(i) for i, f in enumerate(futures)])
    setter.start()
    setter.join()
    for t in waiters:
        t.join(10)
    assert sorted(got) == list(range(0, 200, 2)) and called == [1]
    done, pending = concurrent.futures.wait(futures, timeout=1)
    assert len(done) == 200 and not pending
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures, timeout=1)) == list(range(200))
    failed = EntryFuture(lock)
    failed.set_exception(LedgerFencedError("fenced"))
    with pytest.raises(LedgerFencedError):
        failed.result(timeout=0)
    slow = EntryFuture(lock)
    with pytest.raises(concurrent.futures.TimeoutError):
        slow.result(timeout=0.05)
    late: list[int] = []
    slow.add_done_callback(lambda f: late.append(f.result()))
    slow.set_result(7)
    assert late == [7] and slow.result() == 7
