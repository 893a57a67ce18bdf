"""What the paths that run once per ledger cost in etcd requests (bench/scale_bench.py found them growing).

Counted by etcd itself: its gRPC server's handled-request counters for the KV service on /metrics. A path that
grows a round trip per ledger, where a page or one transaction would do, fails here long before a cluster of
millions of ledgers notices it.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

from octavo.cli.localcluster import EtcdProcess, LocalCluster
from octavo.client import Client, ClientOptions
from octavo.client.replication import NOTHING_TO_DO, REPLICATED, Replicator
from octavo.meta.etcd import TXN_OPS_MAX, EtcdClient, Txn
from octavo.meta.layout import Layout
from octavo.meta.metadata import MetadataStore
from octavo.meta.underreplication import Taken, UnderReplication

PW = b"pw"
# Nothing in the background talks to etcd's KV service while a test counts: no GC pass, no autorecovery (the
# registrations' keepalives and the deletion watch use other services).
QUIET = ["--autorecovery-enabled", "false", "--gc-interval-ms", "3600000"]
# The client trusts its list of registrations for the whole test once read.
STEADY = ClientOptions(bookie_list_ttl_s=600.0, add_timeout_s=5.0, read_timeout_s=3.0)


def kv_requests(endpoint: str) -> int:
    """KV requests (Range, Txn, Put, DeleteRange, ...) etcd has handled since it started."""
    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5).read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("grpc_server_handled_total{") and 'grpc_service="etcdserverpb.KV"' in line)


async def test_a_worker_takes_a_ledger_and_finishes_it_in_one_transaction_each(etcd: EtcdProcess) -> None:
    layout = Layout("take-finish")
    async with EtcdClient(etcd.endpoint) as client:
        marks = UnderReplication(client, layout)
        lease = await client.grant_lease(30)
        await marks.mark(7, ["bookie-9"], by="test")
        await client.put(layout.ledger(7), b"metadata")
        before = kv_requests(etcd.endpoint)
        taken = await marks.take(7, lease, "worker-a")
        assert kv_requests(etcd.endpoint) - before == 1
        assert taken.locked and taken.mark is not None and taken.mark.missing == ("bookie-9",)
        assert taken.ledger is not None and taken.ledger.value == b"metadata"
        assert await marks.take(7, lease, "worker-b") == Taken(False, None, None)  # the lock is held
        assert await marks.lock_owner(7) == "worker-a"
        before = kv_requests(etcd.endpoint)
        assert await marks.finish(taken.mark)
        assert kv_requests(etcd.endpoint) - before == 1
        assert await marks.get(7) is None and await marks.lock_owner(7) is None

        # A mark that changed meanwhile (another bookie lost) stays for the next pass; the lock goes.
        await marks.mark(8, ["bookie-9"], by="test")
        taken = await marks.take(8, lease, "worker-a")
        assert taken.locked and taken.mark is not None and taken.ledger is None
        await marks.mark(8, ["bookie-8"], by="test")
        assert not await marks.finish(taken.mark)
        left = await marks.get(8)
        assert left is not None and left.missing == ("bookie-8", "bookie-9")
        assert await marks.lock_owner(8) is None
        assert await marks.take(9, lease, "worker-a") == Taken(True, None, None)  # no mark: nothing to do


async def test_re_replicating_a_small_ledger_reads_its_metadata_and_writes_it_once(tmp_path: Path) -> None:
    """Two etcd requests per ledger from the replicator (its metadata read, the ensemble's CAS) and one from the
    replacement, which looks up a ledger it has not seen before its first add: the registrations the replacement
    is chosen from come from the client's list, not from etcd again for every ledger."""
    with LocalCluster(str(tmp_path / "c"), bookies=4, bookie_args=QUIET) as cluster:
        async with Client(cluster.etcd_endpoint, options=STEADY) as client:
            w = await client.create_ledger(3, 3, 2, password=PW)
            await w.append_many([b"entry %d" % i for i in range(3)])
            await w.close()
            victim = w.metadata.last_ensemble[0]
            cluster.bookies[victim].kill()
            deadline = time.monotonic() + 30
            while victim in await client.bookies(refresh=True):  # its registration expires with its lease
                assert time.monotonic() < deadline, f"{victim} still registered"
                await asyncio.sleep(0.2)
            before = kv_requests(cluster.etcd_endpoint)
            report = await Replicator(client).replicate(w.ledger_id, {victim})
            assert kv_requests(cluster.etcd_endpoint) - before <= 3
            assert report.outcome == REPLICATED and report.entries_copied == 3
            # A worker hands over the metadata it read with the ledger's lock: it is not read again (this one,
            # created after the loss, has nothing to do).
            other = await client.create_ledger(3, 3, 2, password=PW)
            await other.close()
            meta, revision = await client.metadata_store.read_ledger(other.ledger_id)
            before = kv_requests(cluster.etcd_endpoint)
            report = await Replicator(client).replicate(other.ledger_id, {victim}, first_read=(meta, revision))
            assert kv_requests(cluster.etcd_endpoint) - before == 0
            assert report.outcome == NOTHING_TO_DO
            reader = await client.open_ledger(w.ledger_id, password=PW)
            assert [e.data async for e in reader.read(0, 2)] == [b"entry %d" % i for i in range(3)]


async def test_a_gc_pass_confirms_deleted_ledgers_in_pages(etcd: EtcdProcess) -> None:
    """GC confirms the ledgers it found missing from the listing (deleted, or created after it) with reads made
    after it, TXN_OPS_MAX per transaction: a bookie that missed a mass delete pays a few requests, not one per
    ledger."""
    layout = Layout("gc-confirm")
    async with EtcdClient(etcd.endpoint) as client:
        existing = list(range(0, 300, 2))
        for start in range(0, len(existing), TXN_OPS_MAX):
            txn = Txn()
            for lid in existing[start:start + TXN_OPS_MAX]:
                txn.put(layout.ledger(lid), b"{}")
            assert (await client.txn(txn))[0]
        before = kv_requests(etcd.endpoint)
        found = await MetadataStore(client, layout).ledgers_existing(list(range(300)))
        assert kv_requests(etcd.endpoint) - before == 3  # 300 candidates, 128 per transaction
        assert found == set(existing)


async def test_marking_a_ledger_with_no_mark_yet_is_one_request(etcd: EtcdProcess) -> None:
    """The auditor marks every ledger of a lost bookie: one etcd request each; an existing mark is merged."""
    async with EtcdClient(etcd.endpoint) as client:
        marks = UnderReplication(client, Layout("mark-new"))
        before = kv_requests(etcd.endpoint)
        assert await marks.mark_new(3, ["bookie-1"], by="auditor bookie-0")
        assert kv_requests(etcd.endpoint) - before == 1
        assert await marks.mark_new(3, ["bookie-2"], by="auditor bookie-0")
        assert not await marks.mark_new(3, ["bookie-2"], by="auditor bookie-0")
        mark = await marks.get(3)
        assert mark is not None and mark.missing == ("bookie-1", "bookie-2") and mark.by == "auditor bookie-0"


async def test_listing_the_ledgers_makes_etcd_count_each_key_about_once(etcd: EtcdProcess) -> None:
    """etcd counts every key of a range to answer it, whatever the limit: open-ended pages would make a listing
    quadratic. Ledgers are listed from windows of ids, gaps in the ids crossed by widening the window."""
    layout = Layout("listing")
    ids = [*range(0, 1500), *range(200_000, 201_500), 5_000_000]
    async with EtcdClient(etcd.endpoint, range_page_keys=100) as client:
        for start in range(0, len(ids), TXN_OPS_MAX):
            txn = Txn()
            for lid in ids[start:start + TXN_OPS_MAX]:
                txn.put(layout.ledger(lid), b"{}")
            assert (await client.txn(txn))[0]
        store = MetadataStore(client, layout)
        before = client.range_keys_counted
        pages = [[layout.ledger_id_of(kv.key) for kv in page] async for page in store.ledger_pages(keys_only=True)]
        assert [lid for page in pages for lid in page] == ids
        assert max(len(page) for page in pages) <= 100
        counted = client.range_keys_counted - before
        assert counted <= 3 * len(ids), f"etcd counted {counted} keys to list {len(ids)}"
        assert await store.list_ledgers() == ids


async def test_reading_the_marks_makes_etcd_count_each_mark_about_once(etcd: EtcdProcess) -> None:
    """Every worker pass and the auditor's count read all the marks: from windows of ids too."""
    async with EtcdClient(etcd.endpoint, range_page_keys=50) as client:
        marks = UnderReplication(client, Layout("mark-pages"))
        ids = [*range(0, 400, 2), *range(90_000, 90_100)]
        for lid in ids:
            await marks.mark_new(lid, ["bookie-1"], by="test")
        before = client.range_keys_counted
        assert [m.ledger_id async for m in marks.marks()] == ids
        counted = client.range_keys_counted - before
        assert counted <= 3 * len(ids), f"etcd counted {counted} keys to read {len(ids)} marks"
