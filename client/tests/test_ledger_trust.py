"""What a bookie takes on faith, tried by calling its gRPC methods directly (as anyone who reaches its port can):
it acts only on ledgers etcd has, with the key etcd records, keeps nothing past a writer's close or a delete.
Real etcd and bookie processes."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions
from octavo.meta.etcd import EtcdClient
from octavo.meta.layout import Layout
from octavo.meta.ledger_metadata import CLOSED, master_key, password_digest
from octavo.meta.metadata import MetadataStore
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

PW = b"the-real-password"
KEY = master_key(PW)
WRONG = master_key(b"a squatter's password")
FAST = ClientOptions(add_timeout_s=5.0, metadata_timeout_s=3.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("trust")), bookies=4) as c:
        yield c


def connections(cluster: LocalCluster) -> dict[str, BookieConnection]:
    return {bookie_id: BookieConnection(b.address) for bookie_id, b in cluster.bookies.items()}


def tail_now(conn: BookieConnection, ledger: int) -> pb.ReadResponse:
    return conn.bookie.ReadTail(pb.ReadTailRequest(ledger_id=ledger, previous_lac=-1, wait_ms=3000, max_entries=1),
                                timeout=30)


def assert_nothing_held(conn: BookieConnection, ledger: int) -> None:
    lac = conn.read_lac(ledger)
    assert lac.code == pb.NO_SUCH_LEDGER, f"the bookie holds state for ledger {ledger}: {lac}"


async def test_ids_etcd_never_gave_out_cannot_be_squatted(cluster: LocalCluster) -> None:
    """Adds, fences, write-closes and tailing reads of ids etcd never allocated are refused NO_SUCH_LEDGER on
    every bookie and bind nothing; ledgers created on those ids afterwards work, recovery opens included."""
    async with EtcdClient(cluster.etcd_endpoint) as etcd:
        counter = await etcd.get(Layout().ledger_id_counter)
    first = int(counter.value) if counter is not None else 0
    squatted = range(first, first + 150)
    conns = connections(cluster)
    try:
        for conn in conns.values():
            for ledger in squatted:
                assert conn.add(ledger, WRONG, [0], [b"squat"]).results[0].codes == [pb.NO_SUCH_LEDGER]
            for ledger in squatted[:20]:
                fence = conn.read_lac(ledger, fence=True, master_key=WRONG)
                assert fence.code == pb.NO_SUCH_LEDGER and "does not exist" in fence.message
                close = conn.bookie.WriteClose(pb.WriteCloseRequest(ledger_id=ledger, master_key=WRONG))
                assert close.code == pb.NO_SUCH_LEDGER
                t0 = time.monotonic()
                tail = tail_now(conn, ledger)
                assert tail.error == pb.NO_SUCH_LEDGER and time.monotonic() - t0 < 2.5, "held a poll for no ledger"
                assert_nothing_held(conn, ledger)
        async with Client(cluster.etcd_endpoint, options=FAST) as client:
            writers = [await client.create_ledger(3, 3, 2, password=PW) for _ in range(40)]
            assert any(w.ledger_id in squatted for w in writers)
            await asyncio.gather(*(w.append_many([b"a", b"b"]) for w in writers))
            for w in writers[:20]:
                await w.close()
        async with Client(cluster.etcd_endpoint, options=FAST) as other:
            for w in writers:  # the open half through a recovery open (their writer's client is gone)
                reader = await other.open_ledger(w.ledger_id, password=PW)
                assert reader.last_entry_id == 1
                assert [e.data async for e in reader.read(0, 1)] == [b"a", b"b"]
    finally:
        for conn in conns.values():
            conn.close()


async def test_a_first_contact_needs_the_key_etcd_records(cluster: LocalCluster) -> None:
    """A ledger etcd has but this bookie never saw: an add or a fence with another key is refused UNAUTHORIZED
    and binds nothing, so the real writer's adds and a recovery open's fence still work."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        conns = connections(cluster)
        try:
            for bookie_id in writer.metadata.last_ensemble:
                conn = conns[bookie_id]
                refused = conn.add(writer.ledger_id, WRONG, [0], [b"mine now"])
                assert refused.results[0].codes == [pb.UNAUTHORIZED]
                assert "wrong master key" in refused.results[0].message
                fence = conn.read_lac(writer.ledger_id, fence=True, master_key=WRONG)
                assert fence.code == pb.UNAUTHORIZED
                recovery = conn.add(writer.ledger_id, WRONG, [0], [b"x"], recovery=True)
                assert recovery.results[0].codes == [pb.UNAUTHORIZED]
                assert_nothing_held(conn, writer.ledger_id)
        finally:
            for conn in conns.values():
                conn.close()
        assert await writer.append(b"real") == 0
        await writer.close()
        assert (await client.ledger_metadata(writer.ledger_id)).last_entry_id == 0


async def test_a_closed_ledger_takes_no_more_entries_across_a_restart(cluster: LocalCluster) -> None:
    """After the writer's close (its write-close), an add of the next entry with the right key is refused on
    every bookie of the ensemble, also after a SIGKILL and restart, and on a bookie outside the ensemble; the
    recovery adds of re-replication still reach a bookie outside it."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.append_many([b"e0", b"e1", b"e2"])
        await writer.close()
        await client.close()  # sends the write-closes queued on the add streams
    ensemble = writer.metadata.last_ensemble
    outside = next(b for b in cluster.bookies if b not in ensemble)
    conns = connections(cluster)
    try:
        for bookie_id in ensemble:
            added = conns[bookie_id].add(writer.ledger_id, KEY, [3], [b"after the close"], last_add_confirmed=2)
            assert added.results[0].codes == [pb.FENCED], bookie_id
        stranger = conns[outside].add(writer.ledger_id, KEY, [3], [b"after the close"])
        assert stranger.results[0].codes[0] in (pb.FENCED, pb.INVALID)
        copy = conns[outside].add(writer.ledger_id, KEY, [0], [b"e0"], recovery=True)
        assert copy.results[0].codes == [pb.OK]
    finally:
        for conn in conns.values():
            conn.close()
    victim = ensemble[0]
    cluster.bookies[victim].kill()
    cluster.bookies[victim].start()
    with BookieConnection(cluster.bookies[victim].address) as conn:
        added = conn.add(writer.ledger_id, KEY, [3], [b"after the restart"], last_add_confirmed=2)
        assert added.results[0].codes == [pb.FENCED]
        assert conn.read_all(writer.ledger_id, 3, 3)[3][0] != pb.OK
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        meta = await client.ledger_metadata(writer.ledger_id)
        assert meta.state == CLOSED and meta.last_entry_id == 2


async def test_a_deleted_ledger_stays_gone_for_every_method(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.append_many([b"x"] * 5)
        await writer.close()
        await client.delete_ledger(writer.ledger_id)
    conns = connections(cluster)
    try:
        deadline = time.monotonic() + 30
        for bookie_id in writer.metadata.last_ensemble:
            conn = conns[bookie_id]
            while conn.read(writer.ledger_id, 0, 0).error != pb.NO_SUCH_LEDGER:  # the deletion watch drops it
                assert time.monotonic() < deadline, f"bookie {bookie_id} still serves the deleted ledger"
                await asyncio.sleep(0.1)
            fence = conn.read_lac(writer.ledger_id, fence=True, master_key=KEY)
            assert fence.code == pb.NO_SUCH_LEDGER
            added = conn.add(writer.ledger_id, KEY, [5], [b"back?"])
            assert added.results[0].codes == [pb.NO_SUCH_LEDGER], added
            assert tail_now(conn, writer.ledger_id).error == pb.NO_SUCH_LEDGER
            assert_nothing_held(conn, writer.ledger_id)
    finally:
        for conn in conns.values():
            conn.close()


async def test_a_closed_then_deleted_ledger_is_no_such_ledger_not_fenced(cluster: LocalCluster) -> None:
    """A bookie of the ensemble that holds nothing of a closed ledger remembers etcd's answer to a late add
    (FENCED: closed); once the ledger is deleted, the same add sent straight to the bookie is refused
    NO_SUCH_LEDGER (the deletion watch, and any lookup that finds it gone, make the bookie forget it)."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.close()  # no entry: no bookie of the ensemble holds any state for it
        conns = connections(cluster)
        try:
            for bookie_id in writer.metadata.last_ensemble:
                for _ in range(2):  # the second is answered from what the bookie remembers
                    late = conns[bookie_id].add(writer.ledger_id, KEY, [0], [b"late"])
                    assert late.results[0].codes == [pb.FENCED], (bookie_id, late)
            await client.delete_ledger(writer.ledger_id)
            deadline = time.monotonic() + 20
            for bookie_id in writer.metadata.last_ensemble:
                conn = conns[bookie_id]
                while (added := conn.add(writer.ledger_id, KEY, [0], [b"late"])).results[0].codes != \
                        [pb.NO_SUCH_LEDGER]:
                    assert added.results[0].codes == [pb.FENCED], (bookie_id, added)
                    assert time.monotonic() < deadline, f"bookie {bookie_id} still answers FENCED for a deleted ledger"
                    await asyncio.sleep(0.1)
                assert "does not exist" in added.results[0].message
                assert_nothing_held(conn, writer.ledger_id)
        finally:
            for conn in conns.values():
                conn.close()


async def test_metadata_without_a_recorded_key_still_takes_its_writer(cluster: LocalCluster) -> None:
    """Ledgers written before the metadata carried master_key_hex (an upgrade): their key cannot be checked
    against etcd, and their writer is not refused for it."""
    async with EtcdClient(cluster.etcd_endpoint) as etcd:
        store = MetadataStore(etcd, Layout())
        bookies = sorted(cluster.bookies)[:3]
        meta, _ = await store.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2,
                                            ensembles=((0, tuple(bookies)),), password_digest=password_digest(PW))
    assert meta.master_key_hex == ""
    payload = os.urandom(64)
    for bookie_id in bookies:
        with BookieConnection(cluster.bookies[bookie_id].address) as conn:
            assert conn.add(meta.ledger_id, KEY, [0], [payload]).results[0].codes == [pb.OK]
            assert conn.read_all(meta.ledger_id, 0, 0) == {0: (pb.OK, payload)}
