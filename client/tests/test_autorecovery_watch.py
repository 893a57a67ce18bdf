"""Self-healing woken by etcd, not by a clock (node/octavo/node/wakeups.py): idle bookies leave etcd's KV service
alone, and a lost bookie is still noticed, its ledgers marked and re-replicated, and the auditor still moves,
with the safety-net pass (autorecovery_idle_interval_s) an hour away. Real etcd (its own request counters on /metrics),
real bookie processes, SIGKILL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from octavo.cli.clustertesting import FAILOVER, destroy, most_named, naming, read_all, wait_for, write_closed
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.meta.etcd import EtcdClient
from octavo.meta.keyrange import WatchRange
from octavo.meta.layout import Layout

FAST = replace(FAILOVER, ensemble_change_wait_s=2.0)
# Only the watch can wake the self-healing passes within a test's time: the idle pass is an hour away, and
# nothing else in the background uses etcd's KV service (no GC pass, no replicas check, no dataset maintenance,
# no etcd compaction, no damage check; registrations' keepalives use the Lease service, the deletion watch
# the Watch service).
WATCHED = ["--autorecovery-idle-interval-s", "3600", "--lost-bookie-delay-s", "2", "--audit-interval-s", "3600",
           "--registration-ttl-s", "3", "--replication-rate-bytes-per-s", "0", "--gc-interval-ms", "3600000",
           "--replicas-check-interval-s", "0", "--dataset-maintenance-interval-s", "0",
           "--dataset-orphan-interval-s", "0", "--etcd-compaction-interval-s", "0",
           "--damage-check-interval-s", "3600"]
# KV requests four idle bookies may make in IDLE_S: nothing is due, but a pass or two may still be finishing.
IDLE_S = 8.0
IDLE_KV_REQUESTS_MAX = 8


def kv_requests(endpoint: str) -> int:
    """KV requests (Range, Txn, Put, DeleteRange, ...) etcd has handled since it started."""
    import urllib.request

    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5).read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("grpc_server_handled_total{") and 'grpc_service="etcdserverpb.KV"' in line)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path / "c"), bookies=4, bookie_args=WATCHED) as c:
        yield c


async def _auditor(client: Client) -> str | None:
    kv = await client.etcd.get(client.metadata_store.layout.auditor)
    return kv.value.decode() if kv is not None else None


async def test_idle_bookies_leave_etcd_alone_and_a_lost_bookie_still_heals(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        written = await write_closed(client, 4, 50)

        async def elected() -> bool:
            return await _auditor(client) is not None

        await wait_for("an auditor is elected", elected, 20)
        await asyncio.sleep(2.0)  # the first passes after the writes finish
        before = kv_requests(cluster.etcd_endpoint)
        await asyncio.sleep(IDLE_S)
        idle = kv_requests(cluster.etcd_endpoint) - before
        # Before the watch: 4 bookies x (election 2 + worker 2 + restore 2) requests a second, about 190 here.
        assert idle <= IDLE_KV_REQUESTS_MAX, f"{idle} KV requests from 4 idle bookies in {IDLE_S:g}s"

        auditor = await _auditor(client)
        victim, named = await most_named(client, [b for b in cluster.bookies if b != auditor])
        assert named, "no ledger on the victim: the test would prove nothing"
        destroy(cluster, victim)

        async def healed() -> bool:
            return not await naming(client, victim)

        # The registration's delete wakes the auditor, the delay runs out on its due time, the marks' puts wake
        # the workers: all of it long before the hour-long idle pass.
        await wait_for("every ensemble stops naming the lost bookie", healed, 90)
        for lid, entries in written.items():
            assert await read_all(client, lid) == entries


async def test_the_auditor_moves_on_the_keys_delete(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        async def elected() -> bool:
            return await _auditor(client) is not None

        await wait_for("an auditor is elected", elected, 20)
        first = await _auditor(client)
        assert first in cluster.bookies
        cluster.bookies[first].kill()

        async def moved() -> bool:
            now = await _auditor(client)
            return now is not None and now != first

        await wait_for("another bookie becomes the auditor", moved, 30)


async def test_a_watch_over_several_ranges_says_when_it_is_established_then_reports_each_change(
        cluster: LocalCluster) -> None:
    layout = Layout("watch-ranges")
    async with EtcdClient(cluster.etcd_endpoint) as etcd:
        ranges = [WatchRange.prefix(layout.underreplicated, deletes=False), WatchRange.key(layout.auditor, puts=False)]
        seen: list[list[bytes]] = []
        established = asyncio.Event()

        async def watch() -> None:
            async for keys in etcd.watch_changes(ranges):
                seen.append(keys)
                established.set()

        task = asyncio.create_task(watch())
        try:
            await asyncio.wait_for(established.wait(), 10)
            assert seen == [[]]  # established: nothing changed yet
            await etcd.put(layout.auditor, b"bookie-1")  # a put of the auditor key: not watched
            await etcd.put(layout.underreplicated_ledger(7), b"{}")
            await etcd.delete(layout.underreplicated_ledger(7))  # a delete of a mark: not watched
            await etcd.delete(layout.auditor)

            async def both() -> bool:
                return len(seen) >= 3

            await wait_for("both watched changes arrive", both, 10)
            await asyncio.sleep(0.5)
            assert seen == [[], [layout.underreplicated_ledger(7)], [layout.auditor]]
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
