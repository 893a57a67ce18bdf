"""Recovery open of ledgers whose writer stopped with a tail of 0, 1, 17 and 3000 entries past the LAC (real
etcd, three real bookie processes, real gRPC).

The writer's entries are acknowledged through the client; the tail is what a writer that crashed mid-flight
leaves: entries on their whole write set that no LAC covers. After the recovery open every entry reads back
byte-identical, the ledger is closed at the tail's last entry, and the bookies' own counters show the reads
recovery sent: one read per bookie per window, the windows starting at 16 ids and doubling while every id is
found (3000 entries cross six doublings), not 1000 ids per window whatever the tail."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from octavo.cli.clustertesting import FAILOVER as FAST
from octavo.cli.clustertesting import PASSWORD as PW
from octavo.cli.clustertesting import entry_data
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.client.recovery import DEFAULT_WINDOW, RecoveryWindow, recover_ledger
from octavo.meta.ledger_metadata import CLOSED, LedgerMetadata, master_key
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

ACKED = 25  # entries the writer got acknowledged before it stopped: ids 0..24, the LAC 24
ADD_CHUNK = 500  # tail entries per direct add


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("cluster")), bookies=3, bookie_args=["--metrics-port", "0"]) as c:
        yield c


def read_counters(cluster: LocalCluster) -> tuple[int, int]:
    """(read requests, entries answered) summed over the bookies, from their /metrics."""
    requests = entries = 0
    for bookie in cluster.bookies.values():
        with urllib.request.urlopen(f"http://{bookie.metrics_address}/metrics", timeout=10) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "octavo_bookie_read_requests_total":
                    requests += int(sample.value)
                elif sample.name == "octavo_bookie_read_entries_total":
                    entries += int(sample.value)
    return requests, entries


def expected_reads(window: RecoveryWindow, tail: int, meta: LedgerMetadata) -> tuple[int, int]:
    """(read requests, entries answered) of recovery's reads forward for `tail` entries past the LAC: every
    window before the one holding the first missing id is found whole; each window asks every bookie holding
    one of its ids once, and each id of each bookie of its write set."""
    requests = entries = 0
    start, size = 0, window.first_entries
    while True:
        ids = range(ACKED + start, ACKED + start + size)
        requests += len({b for e in ids for b in meta.write_set_bookies(e)})
        entries += size * meta.write_quorum
        if tail < start + size:
            return requests, entries
        start += size
        size = window.next_entries(size, all_found=True)


async def stopped_writer(cluster: LocalCluster, tail: int) -> tuple[LedgerMetadata, list[bytes]]:
    """A ledger (E = 3, Qw = Qa = 2) whose writer got ACKED entries acknowledged and stopped with `tail` more on
    their write sets past the LAC; its metadata and every entry it holds."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 2, 2, password=PW)
        ledger = writer.ledger_id
        data = [entry_data(ledger, i) for i in range(ACKED + tail)]
        assert await writer.append_many(data[:ACKED]) == list(range(ACKED))
        meta = writer.metadata
    # The client went away without closing the ledger. What it had in flight reached the whole write set; the
    # LAC every bookie knows is the last acknowledged entry (a LAC-only add, as an idle writer sends).
    per_bookie: dict[str, list[int]] = {b: [] for b in meta.last_ensemble}
    for e in range(ACKED, ACKED + tail):
        for bookie in meta.write_set_bookies(e):
            per_bookie[bookie].append(e)
    for bookie, ids in per_bookie.items():
        with BookieConnection(cluster.bookies[bookie].address) as conn:
            for i in range(0, len(ids), ADD_CHUNK):
                chunk = ids[i:i + ADD_CHUNK]
                resp = conn.add(ledger, master_key(PW), chunk, [data[e] for e in chunk], last_add_confirmed=ACKED - 1)
                assert set(resp.results[0].codes) == {pb.OK}
            resp = conn.add(ledger, master_key(PW), [], [], last_add_confirmed=ACKED - 1)
            assert not resp.error and not resp.results[0].message
            assert conn.read_lac(ledger).last_add_confirmed == ACKED - 1
    return meta, data


@pytest.mark.parametrize("tail", [0, 1, 17, 3000])
async def test_recovery_open_finds_the_whole_tail_with_a_growing_window(cluster: LocalCluster, tail: int) -> None:
    meta, data = await stopped_writer(cluster, tail)
    ledger = meta.ledger_id
    async with Client(cluster.etcd_endpoint, options=FAST) as other:
        before = read_counters(cluster)
        reader = await other.open_ledger(ledger, password=PW)
        after = read_counters(cluster)
        assert reader.last_entry_id == ACKED + tail - 1
        closed = await other.ledger_metadata(ledger)
        assert closed.state == CLOSED and closed.last_entry_id == ACKED + tail - 1
        assert closed.ensembles == meta.ensembles
        requests, entries = expected_reads(DEFAULT_WINDOW, tail, meta)
        assert (after[0] - before[0], after[1] - before[1]) == (requests, entries)
        got = [e.data async for e in reader.read(0, reader.last_entry_id)]
        assert got == data  # every acknowledged entry, and the recovered tail, byte-identical
    for e in range(ACKED, ACKED + tail, 97):  # the tail is on its whole write set (recovery adds are idempotent)
        for bookie in meta.write_set_bookies(e):
            with BookieConnection(cluster.bookies[bookie].address) as conn:
                assert conn.read_all(ledger, e, e)[e] == (pb.OK, data[e])


async def test_a_fixed_window_of_1000_recovers_the_same_with_more_answers(cluster: LocalCluster) -> None:
    """The window is a parameter (the benchmark compares the old fixed window with the growing one): with
    first = max = 1000, a tail of 17 costs 1000 ids per bookie of each write set, and recovers the same."""
    tail = 17
    meta, data = await stopped_writer(cluster, tail)
    old = RecoveryWindow(1000, 1000)
    async with Client(cluster.etcd_endpoint, options=FAST) as other:
        before = read_counters(cluster)
        closed = await recover_ledger(other, meta.ledger_id, master_key(PW), window=old)
        after = read_counters(cluster)
        assert closed.state == CLOSED and closed.last_entry_id == ACKED + tail - 1
        assert (after[0] - before[0], after[1] - before[1]) == expected_reads(old, tail, meta) == (3, 2000)
        assert expected_reads(DEFAULT_WINDOW, tail, meta) == (6, 96)
        reader = await other.open_ledger(meta.ledger_id, password=PW)
        assert [e.data async for e in reader.read(0, reader.last_entry_id)] == data
