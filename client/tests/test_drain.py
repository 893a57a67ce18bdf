"""Controlled shutdown (issue 37): a bookie that gets SIGTERM tells its writers, they move their ensembles off it
while it still stores adds, and it stops once they have, within the grace period; every acknowledged entry ends
up on every bookie of its segment. Real bookie processes, real etcd."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions
from octavo.client.writer import WriteHandle
from octavo.meta.ledger_metadata import LedgerMetadata, write_set
from octavo.node.server import SHUTDOWN_GRACE_S
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

PW = b"pw"
OPTIONS = ClientOptions(add_timeout_s=10.0, bookie_list_ttl_s=0.5)
LEDGERS = 4
BATCH = 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("drain")), bookies=4) as c:
        yield c


def payload(ledger: int, entry: int) -> bytes:
    return f"ledger {ledger} entry {entry} ".encode().ljust(1024, b".")


def segments(meta: LedgerMetadata) -> list[tuple[int, int, tuple[str, ...]]]:
    """(first, last, bookies) of each non-empty segment of a closed ledger."""
    ends = [first - 1 for first, _ in meta.ensembles[1:]] + [meta.last_entry_id]
    return [(first, last, bookies) for (first, bookies), last in zip(meta.ensembles, ends, strict=True)
            if last >= first]


def assert_every_copy(cluster: LocalCluster, metas: list[LedgerMetadata]) -> None:
    """Read replica by replica: every entry is on every bookie of its segment's write set, with its bytes."""
    connections = {b: BookieConnection(p.address) for b, p in cluster.bookies.items()}
    try:
        for meta in metas:
            for first, last, bookies in segments(meta):
                for position, bookie in enumerate(bookies):
                    wanted = [e for e in range(first, last + 1)
                              if position in write_set(e, meta.ensemble_size, meta.write_quorum)]
                    while wanted:
                        resp = connections[bookie].bookie.ReadEntries(pb.ReadRequest(
                            ledger_id=meta.ledger_id, entry_ids=wanted[:500]), timeout=30)
                        assert not resp.error and resp.entries, (meta.ledger_id, bookie, resp.error_message)
                        for got in resp.entries:
                            assert got.code == pb.OK, (f"ledger {meta.ledger_id} entry {got.entry_id} missing on "
                                                       f"{bookie}: {pb.ResultCode.Name(got.code)} {got.message}")
                            assert got.payload == payload(meta.ledger_id, got.entry_id)
                        wanted = wanted[len(resp.entries):]
    finally:
        for connection in connections.values():
            connection.close()


async def test_sigterm_drains_writers_off_the_bookie_before_the_grace_period(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, cluster.cluster, OPTIONS) as client:
        writers = [await client.create_ledger(3, 3, 2, password=PW) for _ in range(LEDGERS)]
        victim = writers[0].metadata.last_ensemble[0]
        on_victim = [w.ledger_id for w in writers if victim in w.metadata.last_ensemble]
        errors: list[BaseException] = []
        acknowledged = {w.ledger_id: 0 for w in writers}
        stop = asyncio.Event()

        async def write(w: WriteHandle) -> None:
            while not stop.is_set():
                first = w.last_add_confirmed + 1
                try:
                    ids = await w.append_many([payload(w.ledger_id, first + k) for k in range(BATCH)])
                except Exception as e:  # counted: the test wants none
                    errors.append(e)
                    return
                acknowledged[w.ledger_id] = ids[-1] + 1
                await asyncio.sleep(0.005)

        tasks = [asyncio.create_task(write(w)) for w in writers]
        await asyncio.sleep(1.0)  # the writers are busy
        process = cluster.bookies[victim].proc
        assert process is not None
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 60)
        exited_after_s = time.monotonic() - sent
        cluster.bookies[victim].proc = None
        await asyncio.sleep(0.5)  # the writers go on without it
        stop.set()
        await asyncio.gather(*tasks)
        for w in writers:
            await w.close()
        assert errors == [], errors
        assert code == 0
        log = cluster.bookies[victim].log_tail(200)
        assert "drained in" in log, log
        assert exited_after_s < SHUTDOWN_GRACE_S, (exited_after_s, log)
        metas = [await client.ledger_metadata(w.ledger_id) for w in writers]
        assert on_victim
        for meta in metas:
            assert victim not in meta.last_ensemble, (meta.ledger_id, meta.ensembles)
            assert meta.last_entry_id + 1 >= acknowledged[meta.ledger_id] > BATCH
        moved = [m for m in metas if m.ledger_id in on_victim]
        assert all(len(m.ensembles) >= 2 for m in moved)
    cluster.bookies[victim].start()
    assert_every_copy(cluster, metas)


@pytest.fixture(scope="module")
def cluster_of_three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("drain3")), bookies=3) as c:
        yield c


async def test_a_writer_with_no_spare_bookie_writes_to_the_draining_one_until_the_grace_period_ends(
        cluster_of_three: LocalCluster) -> None:
    """E3 on three bookies: nothing to move to, so the writer keeps its ensemble and its entries keep being
    acknowledged while the bookie drains; the bookie stops when the grace period runs out, and the writer then
    handles its loss as it does any failure (here: no bookie to replace it, NotEnoughBookiesError)."""
    cluster = cluster_of_three
    options = ClientOptions(add_timeout_s=10.0, bookie_list_ttl_s=0.5, ensemble_change_wait_s=1.0)
    async with Client(cluster.etcd_endpoint, cluster.cluster, options) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        victim = w.metadata.last_ensemble[1]
        process = cluster.bookies[victim].proc
        assert process is not None
        await w.append_many([payload(w.ledger_id, e) for e in range(BATCH)])
        exited = asyncio.Event()
        acknowledged_while_draining = 0
        error: BaseException | None = None

        async def write() -> None:
            nonlocal acknowledged_while_draining, error
            while True:
                first = w.last_add_confirmed + 1
                try:
                    await w.append_many([payload(w.ledger_id, first + k) for k in range(BATCH)])
                except Exception as e:  # expected only once the bookie is gone
                    error = e
                    return
                if not exited.is_set():
                    acknowledged_while_draining += BATCH
                await asyncio.sleep(0.01)

        task = asyncio.create_task(write())
        await asyncio.sleep(0.3)
        acknowledged_while_draining = 0
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 60)
        exited.set()
        cluster.bookies[victim].proc = None
        assert w.metadata.last_ensemble == (await client.ledger_metadata(w.ledger_id)).last_ensemble
        assert victim in w.metadata.last_ensemble  # it was never moved off: there was nowhere to go
        assert acknowledged_while_draining > BATCH
        await asyncio.wait_for(task, 60)
        assert type(error).__name__ == "NotEnoughBookiesError", error
    assert code == 0
    assert "grace period over with" in cluster.bookies[victim].log_tail(200)
    cluster.bookies[victim].start()


async def test_a_client_that_ignores_the_flag_is_served_until_the_grace_period_ends(
        cluster_of_three: LocalCluster) -> None:
    """An older client knows nothing of `draining`: its add stream stays busy, its adds are stored until the grace
    period runs out, and only then is its stream cancelled, as every clean stop did before."""
    cluster = cluster_of_three
    async with Client(cluster.etcd_endpoint, cluster.cluster, OPTIONS) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        ledger_id, key = w.ledger_id, w._master_key
        victim = w.metadata.last_ensemble[2]
    process = cluster.bookies[victim].proc
    assert process is not None
    signalled = threading.Event()
    answers: list[tuple[bool, bool, int]] = []  # (sent after SIGTERM, draining, error) per answer

    def requests() -> Iterator[pb.AddRequest]:
        for entry in range(100_000):
            after = signalled.is_set()
            yield pb.AddRequest(request_id=entry + 1, ledgers=[pb.LedgerAdds(
                ledger_id=ledger_id, master_key=key, last_add_confirmed=entry - 1, entry_ids=[entry],
                payloads=[payload(ledger_id, entry)])])
            if after and len(answers) > 10_000:
                return
            time.sleep(0.02)

    def old_client() -> str:
        with BookieConnection(cluster.bookies[victim].address) as conn:
            try:
                for response in conn.bookie.AddEntries(requests(), timeout=120):
                    answers.append((signalled.is_set(), response.draining,
                                    response.error or max((c for r in response.results for c in r.codes), default=0)))
            except Exception as e:  # the stream is cancelled when the bookie stops
                return type(e).__name__
        return "ended"

    stream = asyncio.create_task(asyncio.to_thread(old_client))
    await asyncio.sleep(1.0)
    signalled.set()
    process.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(process.wait, 60)
    cluster.bookies[victim].proc = None
    outcome = await asyncio.wait_for(stream, 60)
    assert code == 0 and outcome != "ended"
    assert all(error == 0 for _, _, error in answers), answers[-5:]
    during = [draining for after, draining, _ in answers if after]
    assert len(during) > 10 and during[-1], during[-5:]  # served on, told it was draining, until the end
    assert "grace period over with 1 add streams" in cluster.bookies[victim].log_tail(200)
    cluster.bookies[victim].start()
