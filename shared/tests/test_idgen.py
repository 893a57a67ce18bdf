"""Ledger ids from blocks reserved in etcd, and bounded CAS retries with backoff: on a real etcd and real bookies."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.cli.localcluster import EtcdProcess, LocalCluster
from octavo.client import Client
from octavo.client.bookie_client import CLOSE_LINGER_S
from octavo.meta.etcd import EtcdClient, Txn
from octavo.meta.groupcas import GroupCas
from octavo.meta.idgen import LedgerIdAllocator
from octavo.meta.layout import Layout
from octavo.meta.ledger_metadata import CLOSED, password_digest
from octavo.meta.metadata import MetadataStore
from octavo.meta.retry import CasRetry, ContentionError
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
CREATORS = ROOT / "e2e" / "jobs" / "creators.py"
FIELDS: dict[str, object] = {"ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1, "ensembles": ((0, ("a",)),),
                             "password_digest": password_digest(b"x")}


# -- CasRetry (pure but for the sleep) -----------------------------------------------------------------
def test_backoff_is_full_jitter_under_a_doubling_cap() -> None:
    retry = CasRetry("x", 100, delay_ms_initial=2, delay_ms_max=64, rng=random.Random(7))
    for lost in range(1, 12):
        retry.lost_count = lost
        ceiling = min(64, 2 * 2 ** (lost - 1)) / 1000
        delays = [retry.delay_s() for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8, "the whole range is used (full jitter), not only its bottom"
    with pytest.raises(ValueError, match="attempts_max"):
        CasRetry("x", 0)
    with pytest.raises(ValueError, match="delay_ms_initial"):
        CasRetry("x", 3, delay_ms_initial=10, delay_ms_max=5)


async def test_a_loop_that_gives_up_says_what_it_raced_with() -> None:
    retry = CasRetry("ledger 5: the close", 3, delay_ms_initial=1, delay_ms_max=2)
    await retry.lost("revision 10")
    await retry.lost("revision 11")
    with pytest.raises(ContentionError) as e:
        await retry.lost("revision 12 (OPEN, 2 segments)")
    text = str(e.value)
    assert "ledger 5: the close" in text and "3 times in a row" in text and "attempts_max=3" in text
    assert "revision 12 (OPEN, 2 segments)" in text
    retry = CasRetry("dataset d: commit", 1, error=KeyError)
    with pytest.raises(KeyError):
        await retry.lost("another commit")


# -- group commit of CASes on a real etcd ----------------------------------------------------------------
async def test_cases_made_meanwhile_share_a_transaction_and_each_gets_its_own_answer(etcd: EtcdProcess,
                                                                                     cluster_name: str) -> None:
    prefix = f"/{cluster_name}/g/".encode()
    async with EtcdClient(etcd.endpoint) as client:
        group = GroupCas(client, ops_max=16)
        revisions = await asyncio.gather(*(group.put_if(prefix + b"%d" % i, b"v", 0) for i in range(100)))
        assert all(r is not None for r in revisions)
        assert group.transactions < 20, "100 CASes made at once went one transaction each"
        # One CAS of a group loses (its key exists): it alone gets None, the others are applied.
        await client.put(prefix + b"taken", b"x")
        keys = [prefix + b"n%d" % i for i in range(10)] + [prefix + b"taken"]
        before = group.fallbacks
        answers = await asyncio.gather(*(group.put_if(k, b"w", 0) for k in keys))
        assert answers[-1] is None and all(a is not None for a in answers[:-1])
        assert group.fallbacks > before
        assert (await client.get(prefix + b"taken")).value == b"x"  # type: ignore[union-attr]
        # Two CASes of one key at once: never in one transaction (etcd would refuse it); the second loses.
        first, second = await asyncio.gather(group.put_if(prefix + b"dup", b"1", 0), group.put_if(prefix + b"dup",
                                                                                                   b"2", 0))
        assert (first is None) != (second is None)
        kv = await client.get(prefix + b"dup")
        assert kv is not None and kv.value == (b"1" if first is not None else b"2")
        # An update CAS on the revision a group returned.
        assert await group.put_if(prefix + b"0", b"v2", revisions[0]) is not None  # type: ignore[arg-type]
        assert await group.put_if(prefix + b"0", b"v3", revisions[0]) is None  # type: ignore[arg-type]


# -- the allocator on a real etcd ----------------------------------------------------------------------
async def test_many_stores_and_creators_get_unique_ids_and_none_fails(etcd: EtcdProcess, cluster_name: str) -> None:
    """40 clients with 16 creators each (640 at once) on one counter: every creation succeeds, ids are unique.
    With one CAS on the counter per id (the old scheme, 50 attempts) this many creators failed."""
    clients = [EtcdClient(etcd.endpoint) for _ in range(40)]
    try:
        stores = [MetadataStore(c, Layout(cluster_name)) for c in clients]

        async def creator(store: MetadataStore) -> list[int]:
            return [(await store.create_ledger(**FIELDS))[0].ledger_id for _ in range(5)]

        results = await asyncio.gather(*(creator(s) for s in stores for _ in range(16)))
        ids = [i for r in results for i in r]
        assert len(ids) == 40 * 16 * 5 and len(set(ids)) == len(ids)
        # Every id names the ledger created under it, and the counter is past every block handed out.
        listed = await stores[0].list_ledgers()
        assert sorted(listed) == sorted(ids)
        counter = await clients[0].get(Layout(cluster_name).ledger_id_counter)
        assert counter is not None and int(counter.value) > max(ids)
        # Blocks grow with use: these clients reserved far fewer blocks than they created ledgers.
        assert sum(s.ids.blocks_reserved for s in stores) < len(ids) / 4
    finally:
        await asyncio.gather(*(c.close() for c in clients))


async def test_blocks_start_small_and_double_up_to_their_limit(etcd: EtcdProcess, cluster_name: str) -> None:
    async with EtcdClient(etcd.endpoint) as client:
        allocator = LedgerIdAllocator(client, Layout(cluster_name), block_ids_initial=4, block_ids_max=16)
        ids = [await allocator.next_id() for _ in range(4 + 8 + 16 + 16)]
        assert ids == list(range(44)) and allocator.blocks_reserved == 4
        counter = await client.get(Layout(cluster_name).ledger_id_counter)
        assert counter is not None and int(counter.value) == 44
        with pytest.raises(ValueError, match="block_ids_initial"):
            LedgerIdAllocator(client, Layout(cluster_name), block_ids_initial=0)


async def test_ids_continue_from_a_counter_written_by_older_clients(etcd: EtcdProcess, cluster_name: str) -> None:
    """The counter's format is unchanged: a cluster whose older clients took one id per CAS goes on from its
    value, and an older client creating beside newer ones still gets ids no one else has."""
    layout = Layout(cluster_name)
    async with EtcdClient(etcd.endpoint) as client:
        await client.put(layout.ledger_id_counter, b"4217")  # as an older client leaves it
        store = MetadataStore(client, layout)
        first, _ = await store.create_ledger(**FIELDS)
        assert first.ledger_id == 4217

        async def old_client_create() -> int:
            """The allocation of clients before blocks: read the counter, CAS it one up with the ledger."""
            while True:
                current = await client.get(layout.ledger_id_counter)
                assert current is not None
                next_id = int(current.value)
                meta_key = layout.ledger(next_id)
                ok, _ = await client.txn(Txn().mod_revision_is(layout.ledger_id_counter, current.mod_revision)
                                         .mod_revision_is(meta_key, 0)
                                         .put(layout.ledger_id_counter, str(next_id + 1).encode())
                                         .put(meta_key, b"{}"))
                if ok:
                    return next_id

        other = MetadataStore(client, layout)
        new_ids = [(await s.create_ledger(**FIELDS))[0].ledger_id for s in (store, other) for _ in range(20)]
        old_ids = [await old_client_create() for _ in range(5)]
        more = [(await other.create_ledger(**FIELDS))[0].ledger_id for _ in range(40)]
        everything = [first.ledger_id, *new_ids, *old_ids, *more]
        assert len(set(everything)) == len(everything)
        assert all(i >= 4217 for i in everything)


async def test_an_id_that_exists_is_skipped_never_overwritten(etcd: EtcdProcess, cluster_name: str) -> None:
    """A counter set back by hand (a restored backup) hands out ids that exist: creation skips them."""
    layout = Layout(cluster_name)
    async with EtcdClient(etcd.endpoint) as client:
        store = MetadataStore(client, layout)
        made = [(await store.create_ledger(**FIELDS))[0] for _ in range(3)]
        await client.put(layout.ledger_id_counter, b"0")
        fresh = MetadataStore(client, layout)
        created, _ = await fresh.create_ledger(**FIELDS)
        assert created.ledger_id not in {m.ledger_id for m in made}
        for m in made:
            assert (await store.read_ledger(m.ledger_id))[0] == m, "an existing ledger was overwritten"


async def test_a_crashed_clients_block_is_never_handed_out_again(etcd: EtcdProcess, cluster_name: str) -> None:
    """A process that reserved a block and was killed with SIGKILL mid-way leaves its unused ids unused."""
    script = (
        "import asyncio, sys\n"
        "from octavo.meta.etcd import EtcdClient\n"
        "from octavo.meta.layout import Layout\n"
        "from octavo.meta.metadata import MetadataStore\n"
        "from octavo.meta.ledger_metadata import password_digest\n"
        "async def main():\n"
        "    client = EtcdClient(sys.argv[1])\n"
        "    store = MetadataStore(client, Layout(sys.argv[2]))\n"
        "    for _ in range(3):\n"
        "        m, _ = await store.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1,\n"
        "                                         ensembles=((0, ('a',)),), password_digest=password_digest(b'x'))\n"
        "        print(m.ledger_id, flush=True)\n"
        "    print('end', store.ids._end, flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", script, etcd.endpoint, cluster_name], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        crashed = [int(proc.stdout.readline()) for _ in range(3)]
        block_end = int(proc.stdout.readline().split()[1])
        assert block_end > max(crashed) + 1, "the crashed client still had ids of its block left"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    async with EtcdClient(etcd.endpoint) as client:
        store = MetadataStore(client, Layout(cluster_name))
        after = [(await store.create_ledger(**FIELDS))[0].ledger_id for _ in range(50)]
    assert min(after) >= block_end and not set(after) & set(crashed)


# -- 256 concurrent creators over several processes, on real bookies ---------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("cluster")), bookies=4) as c:
        yield c


def test_256_concurrent_creators_over_4_processes_all_succeed(cluster: LocalCluster) -> None:
    """Each of 4 processes runs 64 creators that create a ledger (E3 Qw3 Qa2), append a 1 KB entry and close
    it; they start at the same moment. Every creation succeeds and every id is unique."""
    start_at = time.time() + 3
    procs = [subprocess.Popen([sys.executable, str(CREATORS), cluster.etcd_endpoint, "default", "--creators", "64",
                               "--ledgers", "192", "--start-at", str(start_at)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    outputs = [json.loads(p.communicate(timeout=240)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    failures = [f for o in outputs for f in o["failures"]]
    assert failures == []
    ids = [i for o in outputs for i in o["ids"]]
    assert len(ids) == 4 * 192 and len(set(ids)) == len(ids)


async def test_a_closed_ledgers_bookies_learn_of_the_close_over_the_add_stream(cluster: LocalCluster) -> None:
    """The advisory write-close rides the add stream: after close() every bookie of the ledger's ensemble says
    the writer closed it (tailing readers stop on it)."""
    async with Client(cluster.etcd_endpoint) as client:
        writers = [await client.create_ledger(3, 3, 2, password=b"pw") for _ in range(20)]
        await asyncio.gather(*(w.append(os.urandom(100)) for w in writers))
        await asyncio.gather(*(w.close() for w in writers))
        await asyncio.sleep(CLOSE_LINGER_S * 5)  # close() does not wait for the advisory write-close
        for w in writers:
            assert (await client.ledger_metadata(w.ledger_id)).state == CLOSED
            assert_write_closed(client, w.ledger_id, w.metadata.last_ensemble)
        # A client closed right after closing a ledger still sends its write-closes before it goes.
        last = await client.create_ledger(3, 3, 2, password=b"pw")
        await last.append(b"x")
        await last.close()
    async with Client(cluster.etcd_endpoint) as reader:
        await reader.bookies(refresh=True)
        assert_write_closed(reader, last.ledger_id, last.metadata.last_ensemble)


def assert_write_closed(client: Client, ledger_id: int, bookies: tuple[str, ...]) -> None:
    for bookie_id in bookies:
        with BookieConnection(client.registrations[bookie_id].address) as conn:
            tail = conn.bookie.ReadTail(pb.ReadTailRequest(ledger_id=ledger_id, previous_lac=-1, wait_ms=0,
                                                           max_entries=1))
            assert tail.write_closed, f"bookie {bookie_id} did not learn of ledger {ledger_id}'s close"
