"""Self-healing when its own parts fail (issue 10): the auditor SIGKILLed in the middle of marking a lost
bookie's ledgers, a replication worker SIGKILLed holding a ledger's lock in the middle of a copy, and the lost
bookie coming back while its ledgers are being copied. Real etcd and bookie processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

from octavo.cli.clustertesting import FAILOVER, PASSWORD, naming, read_all, sized, wait_for
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.meta.underreplication import UnderReplication
from octavo.node.faults import AUDITOR_AFTER_MARK, FAULT_POINTS_ENV
from octavo.node.files import LOG_FILE_SUFFIX

FAST = replace(FAILOVER, ensemble_change_wait_s=2.0)
HEALING = ["--lost-bookie-delay-s", "3", "--audit-interval-s", "5", "--open-ledger-grace-s", "4"]
# Slow copies (256 KiB/s per worker, 64 KiB per request): a 2 MiB share takes about 8 s, long enough to kill
# or restart something in the middle of it.
SLOW = ["--replication-rate-bytes-per-s", str(256 << 10), "--replication-batch-bytes-max", str(64 << 10)]


def data(ledger: int, entry: int, size: int = 120) -> bytes:
    return sized(f"ledger {ledger} entry {entry} ", size)


async def no_ensemble_names_a_bookie_twice(client: Client) -> None:
    async for meta in client.iter_ledger_metadata():
        for first, bookies in meta.ensembles:
            assert len(set(bookies)) == len(bookies), (meta.ledger_id, first, bookies)


def log_bytes(cluster: LocalCluster, bookies: list[str]) -> int:
    """Bytes in the entry logs of these bookies, as the files stand (written, whether synced or not)."""
    total = 0
    for b in bookies:
        for dirpath, _, files in os.walk(cluster.bookies[b].data_dir):
            total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files if f.endswith(LOG_FILE_SUFFIX))
    return total


async def test_an_auditor_killed_while_marking_is_followed_by_one_that_finishes(tmp_path: Path) -> None:
    """Every bookie is armed to die after writing its K-th mark: the first auditor dies with K of the lost
    bookie's K+3 ledgers marked; the next one (elected when its lease expires) marks the rest, and the workers
    heal every ledger."""
    k = 6
    cluster = LocalCluster(str(tmp_path / "c"), bookies=4, bookie_args=HEALING)
    for bookie in cluster.bookies.values():
        bookie.env = {FAULT_POINTS_ENV: f"{AUDITOR_AFTER_MARK}@{k}"}
    with cluster:
        async with Client(cluster.etcd_endpoint, options=FAST) as client:
            layout = client.metadata_store.layout

            async def elected() -> bool:
                return await client.etcd.get(layout.auditor) is not None

            await wait_for("an auditor is elected", elected, 15)
            holder = await client.etcd.get(layout.auditor)
            assert holder is not None
            auditor = holder.value.decode()
            victim = sorted(b for b in cluster.bookies if b != auditor)[0]
            # Ledgers on the victim and not on the auditor (whose death would leave some with no copy for a
            # while): K + 3 of them, so the first auditor dies part way.
            written: dict[int, list[bytes]] = {}
            while len(set(written) & set(await naming(client, victim))) < k + 3:
                assert len(written) < 200, "placement never chose the victim"
                w = await client.create_ledger(2, 2, 2, password=PASSWORD)
                if auditor in w.metadata.last_ensemble:
                    await w.close()
                    await client.delete_ledger(w.ledger_id, password=PASSWORD)
                    continue
                entries = [data(w.ledger_id, i) for i in range(50)]
                await w.append_many(entries)
                await w.close()
                written[w.ledger_id] = entries
            cluster.bookies[victim].kill()
            shutil.rmtree(cluster.bookies[victim].data_dir)

            proc = cluster.bookies[auditor].proc
            assert proc is not None
            deadline = time.monotonic() + 30
            while proc.poll() is None:
                assert time.monotonic() < deadline, "the auditor never reached its K-th mark"
                await asyncio.sleep(0.05)
            assert proc.returncode == -signal.SIGKILL
            marked = [m async for m in UnderReplication(client.etcd, layout).marks()]
            assert len(marked) <= k, "the fault point fired after more than K marks"
            cluster.bookies[auditor].env = {}
            cluster.bookies[auditor].start()  # back at once: the next auditor finds it registered

            async def healed() -> bool:
                return not await naming(client, victim)

            await wait_for("every ensemble stops naming the lost bookie", healed, 90)

            async def unmarked() -> bool:
                return [m async for m in UnderReplication(client.etcd, layout).marks()] == []

            await wait_for("the marks are gone", unmarked, 30)
            await no_ensemble_names_a_bookie_twice(client)
            for lid, entries in written.items():
                assert await read_all(client, lid) == entries


async def test_a_worker_killed_mid_copy_is_finished_by_another_without_a_second_copy(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path / "c"), bookies=4, bookie_args=HEALING + SLOW) as cluster:
        async with Client(cluster.etcd_endpoint, options=FAST) as client:
            w = await client.create_ledger(2, 2, 2, password=PASSWORD)
            entries = [data(w.ledger_id, i, 4096) for i in range(512)]  # 2 MiB: about 8 s to copy
            await w.append_many(entries)
            await w.close()
            victim, survivor = w.metadata.last_ensemble
            others = [b for b in cluster.bookies if b not in (victim, survivor)]
            before = log_bytes(cluster, others)
            cluster.bookies[victim].kill()
            shutil.rmtree(cluster.bookies[victim].data_dir)
            marks = UnderReplication(client.etcd, client.metadata_store.layout)

            async def copying() -> bool:
                return log_bytes(cluster, others) - before >= 512 << 10

            await wait_for("a worker copies a quarter of the share", copying, 30)
            worker = await marks.lock_owner(w.ledger_id)
            assert worker is not None and worker != victim, "the copy runs without the ledger's lock"
            partial = log_bytes(cluster, others) - before
            assert partial < len(entries) * 4096, "the copy finished before the kill: the test would prove nothing"
            assert cluster.bookies[worker].kill() == -signal.SIGKILL
            cluster.bookies[worker].start()  # its lock goes with its old lease; a worker starts over

            async def healed() -> bool:
                return victim not in (await client.ledger_metadata(w.ledger_id)).last_ensemble

            await wait_for("the ledger stops naming the lost bookie", healed, 90)

            async def unmarked() -> bool:
                return await marks.get(w.ledger_id) is None

            await wait_for("the mark is gone", unmarked, 20)
            meta = await client.ledger_metadata(w.ledger_id)
            assert len(set(meta.last_ensemble)) == 2 and survivor in meta.last_ensemble
            assert await read_all(client, w.ledger_id) == entries
            grown = log_bytes(cluster, others) - before
            share = len(entries) * 4096
            # One full copy, plus at most the partial one if the copy restarted on another bookie; entries
            # re-sent to the same bookie are not stored twice.
            assert share <= grown <= share + partial + 64 * len(entries) + (64 << 10), (grown, share, partial)


async def test_a_bookie_back_during_re_replication_does_no_harm(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path / "c"), bookies=4, bookie_args=HEALING + SLOW) as cluster:
        async with Client(cluster.etcd_endpoint, options=FAST) as client:
            written: dict[int, list[bytes]] = {}
            victim = "bookie-0"
            while len(set(written) & set(await naming(client, victim))) < 2:
                assert len(written) < 40, "placement never chose the victim"
                w = await client.create_ledger(2, 2, 2, password=PASSWORD)
                entries = [data(w.ledger_id, i, 4096) for i in range(256)]  # 1 MiB each
                await w.append_many(entries)
                await w.close()
                written[w.ledger_id] = entries
            marks = UnderReplication(client.etcd, client.metadata_store.layout)
            on_victim = await naming(client, victim)
            cluster.bookies[victim].kill()  # down, its disk kept

            async def copying() -> bool:
                for lid in on_victim:
                    if await marks.lock_owner(lid) is not None:
                        return True
                return False

            await wait_for("a worker takes a ledger of the bookie that is gone", copying, 30)
            await asyncio.sleep(1.0)
            cluster.bookies[victim].start()  # back in the middle of the copy

            async def settled() -> bool:
                return [m async for m in marks.marks()] == []

            await wait_for("the marks are gone", settled, 60)
            await no_ensemble_names_a_bookie_twice(client)
            for lid, entries in written.items():
                assert await read_all(client, lid) == entries
