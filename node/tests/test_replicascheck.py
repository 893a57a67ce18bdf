"""The auditor's replicas check (issue 37): an entry of a closed ledger missing on one live bookie of its write set
is found, marked and written back to that bookie; a copy on a bookie outside the ensemble is counted. Real bookie
processes and etcd; the pure part (find_missing) on its own."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions
from octavo.meta.ledger_metadata import CLOSED, LedgerMetadata
from octavo.node.replicascheck import ReplicasMark, find_missing
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

ENTRIES = 10
MISSING = 5


def meta_of(ensembles: tuple[tuple[int, tuple[str, ...]], ...], last: int, state: str = CLOSED) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=7, ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles=ensembles,
                          password_digest="", state=state, last_entry_id=last)


def test_find_missing_names_each_bookie_of_the_write_set_and_counts_copies_outside() -> None:
    meta = meta_of(((0, ("a", "b", "c")), (4, ("a", "b", "d"))), last=5)
    # Entry e goes to positions e % 3 and (e + 1) % 3 of its segment's ensemble.
    held = {"a": {0, 2, 3}, "b": {0, 1, 3, 4, 5}, "c": {1, 2, 4}, "d": {4, 5}}
    missing, extra = find_missing(meta, held)
    # Segment [0, 3] on (a, b, c): 0 -> a b, 1 -> b c, 2 -> c a, 3 -> a b: all there. Segment [4, 5] on (a, b, d):
    # 4 -> b d, 5 -> d a: a misses 5. c's copy of 4 is outside that segment's ensemble: one extra copy.
    assert missing == {"a": [5]}
    assert extra == 1
    # A bookie that did not answer is not judged; an open ledger's last segment is not checked.
    assert find_missing(meta, {"b": held["b"]}) == ({}, 0)
    assert find_missing(meta_of(((0, ("a", "b", "c")),), last=-1, state="OPEN"), {"a": set()}) == ({}, 0)


def test_mark_round_trips() -> None:
    mark = ReplicasMark(3, {"b": ((1, 2), (5, 5))}, 123)
    assert ReplicasMark.decode(mark.encode(), 9) == ReplicasMark(3, {"b": ((1, 2), (5, 5))}, 123, 9)
    assert mark.entries("b") == [1, 2, 5] and mark.entries("x") == []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("replicas")), bookies=4,
                      bookie_args=["--replicas-check-interval-s", "2"]) as c:
        yield c


def payload(entry: int) -> bytes:
    return f"entry {entry} ".encode() * 20


async def test_replicas_check_restores_an_entry_missing_on_a_live_bookie(cluster: LocalCluster) -> None:
    options = ClientOptions(bookie_list_ttl_s=0.2)
    async with Client(cluster.etcd_endpoint, cluster.cluster, options) as client:
        writer = await client.create_ledger(3, 3, 2, password=b"pw")
        ledger_id, key = writer.ledger_id, writer._master_key
        ensemble = writer.metadata.last_ensemble
        outside = next(b for b in cluster.bookies if b not in ensemble)
        short = ensemble[2]
        ids = list(range(ENTRIES))
        # The copies as a writer leaves them when one bookie misses an entry acknowledged by the other two.
        for bookie in ensemble:
            with BookieConnection(cluster.bookies[bookie].address) as conn:
                kept = [e for e in ids if not (bookie == short and e == MISSING)]
                resp = conn.add(ledger_id, key, kept, [payload(e) for e in kept])
                assert not resp.error and all(c == pb.OK for r in resp.results for c in r.codes), resp
        with BookieConnection(cluster.bookies[outside].address) as conn:  # a copy outside the ensemble
            resp = conn.add(ledger_id, key, [3], [payload(3)], recovery=True)
            assert all(c == pb.OK for r in resp.results for c in r.codes), resp
        with BookieConnection(cluster.bookies[short].address) as conn:  # what the check asks (no bytes read)
            listed = conn.bookie.ListEntries(pb.ListEntriesRequest(
                ledger_id=ledger_id, first_entry_id=0, last_entry_id=ENTRIES + 5), timeout=30)
            assert list(listed.entry_ids) == [e for e in ids if e != MISSING] and listed.next_entry_id == -1
            bad = conn.bookie.ListEntries(pb.ListEntriesRequest(ledger_id=ledger_id, first_entry_id=5,
                                                                last_entry_id=2), timeout=30)
            assert bad.error == pb.INVALID and "first <= last" in bad.error_message
            unknown = conn.bookie.ListEntries(pb.ListEntriesRequest(ledger_id=ledger_id + 1000, first_entry_id=0,
                                                                    last_entry_id=2), timeout=30)
            assert unknown.error == pb.NO_SUCH_LEDGER and not unknown.entry_ids
        closed = writer.metadata.with_state(CLOSED, last_entry_id=ENTRIES - 1,
                                            length=sum(len(payload(e)) for e in ids))
        assert await client.metadata_store.update_ledger(closed, writer._revision) is not None

        with BookieConnection(cluster.bookies[short].address) as conn:
            resp = conn.bookie.ReadEntries(pb.ReadRequest(ledger_id=ledger_id, entry_ids=[MISSING]), timeout=30)
            assert resp.entries[0].code == pb.NO_SUCH_ENTRY
        deadline = time.monotonic() + 120
        while True:
            with BookieConnection(cluster.bookies[short].address) as conn:
                resp = conn.bookie.ReadEntries(pb.ReadRequest(ledger_id=ledger_id, entry_ids=[MISSING]), timeout=30)
            if resp.entries and resp.entries[0].code == pb.OK:
                break
            assert time.monotonic() < deadline, "the missing copy was not restored within 120s"
            await asyncio.sleep(0.5)
        assert resp.entries[0].payload == payload(MISSING)

        statuses = []
        for process in cluster.bookies.values():
            with BookieConnection(process.address) as conn:
                statuses.append(conn.status().autorecovery)
        auditor = next(s for s in statuses if s.is_auditor)
        assert auditor.replicas_check_interval_s == 2
        assert auditor.replicas_check_last_unix_ms > 0
        assert auditor.replicas_extra_copies >= 1  # the copy on `outside` stays until it is collected
        assert sum(s.replicas_entries_restored for s in statuses) >= 1
        # The mark is gone once restored.
        deadline = time.monotonic() + 60
        while await client.etcd.get(client.metadata_store.layout.replicas_missing_ledger(ledger_id)) is not None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
    shown = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "octavo.cli.main", "cluster", "status", "--etcd", cluster.etcd_endpoint],
        capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("replicas check: every 2s, last pass"))
    assert "marks left to restore" in line and "copies outside their ensembles" in line, line
