"""Recovery open of ledgers whose writer stopped with a tail of 0, 1, 17 and 3000 entries past the LAC (real
etcd, three real bookie processes, real gRPC).

The writer's entries are acknowledged through the client; the tail is what a writer that crashed mid-flight
leaves: entries on their whole write set that no LAC covers. After the recovery open every entry reads back
byte-identical, the ledger is closed at the tail's last entry, and the bookies' own counters show the reads
recovery sent: one read per bookie per window, the windows starting at 16 ids and doubling while every id is
found (3000 entries cross six doublings), not 1000 ids per window whatever the tail. On bookies whose read limit
cuts every answer short, the window keeps its size and the tail is still found whole."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from octavo.cli.clustertesting import FAILOVER as FAST
from octavo.cli.clustertesting import PASSWORD as PW
from octavo.cli.clustertesting import entry_data, sized
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.client.recovery import RecoveryWindow, recover_ledger
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


def expected_reads(window_sizes: list[int], meta: LedgerMetadata) -> tuple[int, int]:
    """(read requests, entries answered) of recovery's reads forward in windows of these sizes: each window asks
    each bookie of the ensemble once (a window of 16 or more ids touches all three), and each id of each bookie
    of its write set."""
    return len(meta.last_ensemble) * len(window_sizes), meta.write_quorum * sum(window_sizes)


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


# The windows: 16 ids, doubled after each window found whole, at most 1,000; the last holds the first missing id.
@pytest.mark.parametrize(("tail", "window_sizes"), [
    (0, [16]),
    (1, [16]),
    (17, [16, 32]),
    (3000, [16, 32, 64, 128, 256, 512, 1000, 1000]),
])
async def test_recovery_open_finds_the_whole_tail_with_a_growing_window(cluster: LocalCluster, tail: int,
                                                                        window_sizes: list[int]) -> None:
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
        assert (after[0] - before[0], after[1] - before[1]) == expected_reads(window_sizes, meta)
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
        assert (after[0] - before[0], after[1] - before[1]) == expected_reads([1000], meta) == (3, 2000)
        assert expected_reads([16, 32], meta) == (6, 96)  # the growing window's, in the test above
        reader = await other.open_ledger(meta.ledger_id, password=PW)
        assert [e.data async for e in reader.read(0, reader.last_entry_id)] == data


CUT_ENTRY_BYTES = 10_000  # three fit in one answer of the bookies below, a fourth does not


@pytest.fixture(scope="module")
def small_reads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    args = ["--metrics-port", "0", "--entry-size-bytes-max", str(32 * 1024), "--read-bytes-max", str(32 * 1024)]
    with LocalCluster(str(tmp_path_factory.mktemp("small-reads")), bookies=3, bookie_args=args) as c:
        yield c


async def test_answers_cut_by_the_read_limit_are_asked_again_and_the_window_does_not_grow(
        small_reads: LocalCluster) -> None:
    """Bookies answering at most 32 KiB per read, entries of 10 KB: every answer stops after three entries and
    the rest of the window is cut short (RETRY), so each window finds three and the next one starts after them
    at the same size; the tail is found whole all the same (E = Qw = 3: each id is on every bookie)."""
    tail = 40
    async with Client(small_reads.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        ledger = writer.ledger_id
        data = [sized(f"ledger {ledger} entry {i} ", CUT_ENTRY_BYTES) for i in range(ACKED + tail)]
        assert await writer.append_many(data[:ACKED]) == list(range(ACKED))
        meta = writer.metadata
    for bookie in meta.last_ensemble:
        with BookieConnection(small_reads.bookies[bookie].address) as conn:
            for e in range(ACKED, ACKED + tail):  # one at a time: a batch is limited too
                resp = conn.add(ledger, master_key(PW), [e], [data[e]], last_add_confirmed=ACKED - 1)
                assert list(resp.results[0].codes) == [pb.OK]
            assert conn.read_lac(ledger).last_add_confirmed == ACKED - 1
    async with Client(small_reads.etcd_endpoint, options=FAST) as other:
        before = read_counters(small_reads)
        reader = await other.open_ledger(ledger, password=PW)
        after = read_counters(small_reads)
        assert reader.last_entry_id == ACKED + tail - 1
        # Windows from LAC + 1, 3 ids found in each; the last one finds the tail's last entry and the end.
        windows = tail // 3 + 1
        assert after[0] - before[0] == 3 * windows
        # Each bookie answered three entries per window, and the whole last window: still 16 ids (the one found
        # and 15 missing), where a window grown after every cut one would have asked for 1,000.
        assert after[1] - before[1] == 3 * (3 * (windows - 1) + 16)
        got = [e.data async for e in reader.read(0, reader.last_entry_id)]
        assert got == data
