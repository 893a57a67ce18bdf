"""A recovery open replaces a bookie of the last ensemble that is lost for good (real etcd, real bookies).

With Qw = Qa an entry past the LAC needs a copy on every bookie of its write set; with one of them gone the
ledger could never be closed (the simulation's finding, seed 1011). Recovery now does what BookKeeper's does:
it writes the recovered entries to a replacement and closes with a new last segment naming it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from octavo.cli.clustertesting import FAILOVER as FAST
from octavo.cli.clustertesting import PASSWORD as PW
from octavo.cli.clustertesting import entry_data
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, RecoveryError
from octavo.meta.ledger_metadata import CLOSED, master_key
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

BOOKIE_ARGS = ["--log-size-bytes-max", str(16 << 20), "--batch-bytes-max", str(8 << 20)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("cluster")), bookies=4, bookie_args=BOOKIE_ARGS) as c:
        yield c


async def test_recovery_replaces_a_lost_bookie_when_qw_equals_qa(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 3, password=PW)
        ledger = writer.ledger_id
        assert await writer.append_many([entry_data(ledger, i) for i in range(10)]) == list(range(10))
        victim, *survivors = writer.metadata.last_ensemble
        (spare,) = set(cluster.bookies) - set(writer.metadata.last_ensemble)
        # A writer that crashed after entries 10 and 11 reached two bookies of three; then one of the three is
        # lost for good (SIGKILL, never restarted).
        for bookie in survivors:
            with BookieConnection(cluster.bookies[bookie].address) as conn:
                resp = conn.add(ledger, master_key(PW), [10, 11], [entry_data(ledger, 10), entry_data(ledger, 11)],
                                last_add_confirmed=9)
                assert list(resp.results[0].codes) == [pb.OK, pb.OK]
        cluster.bookies[victim].kill()

        async with Client(cluster.etcd_endpoint, options=FAST) as other:
            reader = await other.open_ledger(ledger, password=PW)
            assert reader.last_entry_id == 11
            meta = await other.ledger_metadata(ledger)
            assert meta.state == CLOSED and meta.last_entry_id == 11
            first, bookies = meta.ensembles[-1]
            assert victim not in bookies and spare in bookies and set(survivors) <= set(bookies)
            assert first <= 10  # the recovered entries are in the new segment
            assert meta.ensembles[0][1] == writer.metadata.ensembles[0][1]  # what came before stays
            got = [e.data async for e in reader.read(0, 11)]
            assert got == [entry_data(ledger, i) for i in range(12)]
        with BookieConnection(cluster.bookies[spare].address) as conn:  # the replacement holds the recovered tail
            stored = conn.read_all(ledger, 10, 11)
            assert stored[10] == (pb.OK, entry_data(ledger, 10)) and stored[11] == (pb.OK, entry_data(ledger, 11))


async def test_recovery_with_nothing_to_replace_it_by_still_fails(cluster: LocalCluster) -> None:
    """Every bookie outside the ensemble gone too: the entries cannot get Qa copies, recovery says so and
    closes nothing (the ledger stays in recovery for a later attempt)."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        alive = [b for b, bookie in cluster.bookies.items() if bookie.alive()]
        assert len(alive) == 3
        writer = await client.create_ledger(3, 3, 3, password=PW)
        ledger = writer.ledger_id
        await writer.append_many([entry_data(ledger, i) for i in range(5)])
        victim, *survivors = writer.metadata.last_ensemble
        for bookie in survivors:
            with BookieConnection(cluster.bookies[bookie].address) as conn:
                conn.add(ledger, master_key(PW), [5], [entry_data(ledger, 5)], last_add_confirmed=4)
        cluster.bookies[victim].kill()
        async with Client(cluster.etcd_endpoint, options=FAST) as other:
            with pytest.raises(RecoveryError, match=r"could be re-replicated to fewer than 3|no bookie can replace"):
                await other.open_ledger(ledger, password=PW)
            assert (await other.ledger_metadata(ledger)).state != CLOSED
