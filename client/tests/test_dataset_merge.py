"""Merging a dataset's small ledgers (octavo.client.datasetmerge), `octavo dataset compact` on a dataset without
a key column, and the auditor's dataset maintenance: on a real etcd and real bookies."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

from octavo.cli.clustertesting import octavo
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.client.colstats import STATS_KEY, ColumnStats, LedgerStats
from octavo.client.dataset import CHECKPOINT_EVERY_COMMITS, META_DATASET, META_WRITE, DatasetLedger, Manifest
from octavo.client.datasetmerge import (
    MergeResult,
    Shape,
    _merge_group,
    merge_dataset,
    merged_ledger,
    plan_merges,
    small_runs,
)
from octavo.meta.errors import NoSuchLedgerError
from octavo.node.datasetmaintenance import budget_left, due, merge_order
from octavo.spark.arrowio import decode_entry, encode_entries
from octavo.spark.skipping import StatsCollector

PW = b"merge-pw"
SCHEMA = '{"type":"struct","fields":[{"name":"v","type":"long","nullable":false,"metadata":{}}]}'
TARGET = 64 * 1024  # the smallest target: every test ledger (a few hundred bytes) is small


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # No maintenance: these tests merge by hand and must not race the auditor's merges.
    with LocalCluster(str(tmp_path_factory.mktemp("merge")), bookies=3,
                      bookie_args=["--dataset-maintenance-interval-s", "0", "--dataset-orphan-interval-s", "0"]) as c:
        yield c


# -- pure ------------------------------------------------------------------------------------------------
def _l(i: int, nbytes: int = 100, seq: int = 0, entries: int = 2) -> DatasetLedger:
    return DatasetLedger(i, 10, nbytes, entries, seq or i, 1000 + i)


def test_the_plan_merges_adjacent_small_ledgers_of_one_shape_within_the_limits() -> None:
    a, b = Shape("d", "k", 3, 3, 2), Shape("d2", "k2", 3, 3, 2)
    ledgers = [_l(1), _l(2), _l(3, nbytes=10_000), _l(4), _l(5), _l(6), _l(7), _l(8)]
    shapes = [a, a, a, a, a, b, b, None]
    groups = plan_merges(list(zip(ledgers, shapes, strict=True)), 1000, 500, 10, 10_000)
    assert [[x.ledger_id for x in g] for g in groups] == [[1, 2], [4, 5], [6, 7]]
    assert small_runs(ledgers, 500) == [(0, 1), (3, 7)]
    # ledgers_max, target_bytes, budget_bytes each cut the groups.
    run = [(_l(i), a) for i in range(1, 8)]
    assert [len(g) for g in plan_merges(run, 1000, 500, 3, 10_000)] == [3, 3]
    assert [len(g) for g in plan_merges(run, 250, 200, 10, 10_000)] == [2, 2, 2]
    assert [len(g) for g in plan_merges(run, 1000, 500, 10, 450)] == [4]
    # Seqs never go down inside a merged ledger (a key compaction's ledger may carry a higher seq).
    odd = [(_l(1), a), (_l(2, seq=9), a), (_l(3), a), (_l(4), a)]
    assert [[x.ledger_id for x in g] for g in plan_merges(odd, 1000, 500, 10, 10_000)] == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="small_bytes"):
        plan_merges(run, 100, 200, 10, 10)
    # Size-tiered: a ledger is copied only with at least as many bytes after it, so a merged ledger is not copied
    # again for every few new ones (the stream benchmark copied 22x its payload before).
    merged_before = [(_l(1, nbytes=300), a), (_l(2), a), (_l(3), a)]  # 300 bytes, then 2 x 100
    assert [[x.ledger_id for x in g] for g in plan_merges(merged_before, 1000, 500, 10, 10_000)] == [[2, 3]]
    grown = [(_l(1, nbytes=300), a), *[(_l(i), a) for i in range(2, 5)]]  # 300, then 3 x 100: merged together
    assert [[x.ledger_id for x in g] for g in plan_merges(grown, 1000, 500, 10, 10_000)] == [[1, 2, 3, 4]]


def test_a_merged_ledger_keeps_every_entrys_seq() -> None:
    merged = merged_ledger(99, [_l(1, entries=2), DatasetLedger(2, 5, 50, 3, 4, 7, ((0, 2), (1, 4))), _l(5)])
    assert merged.segments == ((0, 1), (2, 2), (3, 4), (5, 5))
    assert (merged.rows, merged.bytes, merged.entries, merged.seq, merged.committed_unix_ms) == (25, 250, 7, 5, 1005)
    assert merged.entries_in(1, 4) == (2, 4) and merged.entries_in(0, 1) == (0, 1) and merged.entries_in(5, 9) is None


def test_the_maintenance_decisions() -> None:
    assert due(0, None, 60) and not due(30, 0, 60) and due(60, 0, 60) and not due(1e9, None, 0)
    assert budget_left(100, 30) == 70 and budget_left(100, 130) == 0
    with pytest.raises(ValueError):
        budget_left(-1, 0)


def test_a_merge_budget_that_runs_out_every_interval_still_reaches_every_dataset_in_turn() -> None:
    """Each interval's budget covers two datasets: the next interval starts at the first one it did not reach (the
    last names were never merged before, whatever the backlog of the first ones)."""
    names = ["e", "a", "d", "b", "c"]
    assert merge_order(names, None) == ["a", "b", "c", "d", "e"]
    assert merge_order(names, "d") == ["d", "e", "a", "b", "c"]
    assert merge_order(names, "bb") == ["c", "d", "e", "a", "b"]  # it was dropped since: the next name on
    assert merge_order(names, "z") == ["a", "b", "c", "d", "e"]
    reached: list[str] = []
    resume: str | None = None
    for _ in range(3):
        order = merge_order(names, resume)
        reached += order[:2]
        resume = order[2]
    assert sorted(set(reached)) == sorted(names)


# -- on a cluster ----------------------------------------------------------------------------------------
async def _write(client: Client, name: str, values: list[int], rows_per_entry: int = 4) -> DatasetLedger:
    batch = pa.record_batch({"v": pa.array(values, pa.int64())})
    entries = [data for data, _ in encode_entries(batch, rows_per_entry, "none")]
    handle = await client.create_ledger(3, 3, 2, password=PW, metadata={META_DATASET: name, META_WRITE: "t"})
    await handle.append_many(entries)
    stats = StatsCollector()  # column statistics, as the Spark sink keeps them (data skipping)
    stats.add(batch)
    await handle.close(metadata=stats.metadata())
    return DatasetLedger(handle.ledger_id, len(values), sum(len(e) for e in entries), len(entries))


async def _commit_batches(client: Client, name: str, commits: int, first_value: int = 0,
                          per_commit: int = 3) -> int:
    """`commits` commits of `per_commit` ledgers of 10 rows each, values counting up; returns the next value."""
    v = first_value
    for _ in range(commits):
        ledgers = []
        for _ in range(per_commit):
            ledgers.append(await _write(client, name, list(range(v, v + 10))))
            v += 10
        await client.datasets.commit(name, SCHEMA, ledgers)
    return v


async def _read(client: Client, ledger_id: int, first: int, last: int) -> list[int]:
    handle = await client.open_ledger(ledger_id, password=PW, recovery=False)
    out: list[int] = []
    async for entry in handle.read(first, last):
        for batch in decode_entry(entry.data):
            out += batch.column("v").to_pylist()
    return out


async def _rows(client: Client, m: Manifest) -> list[int]:
    out: list[int] = []
    for x in m.ledgers:
        out += await _read(client, x.ledger_id, 0, x.entries - 1)
    return out


async def _rows_between(client: Client, m: Manifest, after: int, upto: int) -> list[int]:
    """What a streaming reader resuming from {"seq": after} reads up to seq `upto`."""
    out: list[int] = []
    for x in m.ledgers:
        span = x.entries_in(after, upto)
        if span is not None:
            out += await _read(client, x.ledger_id, *span)
    return out


async def test_a_merge_keeps_every_row_once_in_order_and_every_seq(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint) as client:
        name = "merge-basic"
        end = await _commit_batches(client, name, 4)
        before = await client.datasets.get(name)
        assert len(before.ledgers) == 12 and await _rows(client, before) == list(range(end))
        top = before.next_seq - 1
        windows = {(a, b): await _rows_between(client, before, a, b) for a in range(0, top + 1, 2)
                   for b in (a + 1, a + 5, top)}

        r = await merge_dataset(client, name, target_bytes=TARGET, max_ledgers_per_merge=5)
        assert (r.ledgers_before, r.ledgers_after, r.merges, r.ledgers_merged, r.abandoned) == (12, 3, 3, 12, 0)
        assert r.rows_merged == end and r.bytes_merged == before.payload_bytes
        after = await client.datasets.get(name)
        assert len(after.ledgers) == 3 and after.rows == before.rows and after.payload_bytes == before.payload_bytes
        assert await _rows(client, after) == list(range(end)), "every row once, in the order committed"
        for (a, b), rows in windows.items():
            assert await _rows_between(client, after, a, b) == rows, f"a reader at seq {a} up to {b}"
        # The merged ledgers have the sources' password and the dataset's metadata; the sources stay readable.
        meta = await client.ledger_metadata(after.ledgers[0].ledger_id)
        assert meta.custom_metadata[META_DATASET] == name and META_WRITE in meta.custom_metadata
        # ... and the sources' column statistics, combined: the merged ledger's own bounds.
        for x in after.ledgers:
            stats = LedgerStats.decode((await client.ledger_metadata(x.ledger_id)).custom_metadata.get(STATS_KEY))
            values = await _read(client, x.ledger_id, 0, x.entries - 1)
            assert stats is not None and stats.rows == x.rows
            assert stats.columns["v"] == ColumnStats("int", 0, min(values), max(values))
        old = before.ledgers[0]
        assert await _read(client, old.ledger_id, 0, old.entries - 1) == list(range(10))
        assert {x.ledger_id for x in before.ledgers} <= {i for i, _ in after.retired}

        # Merging merged ledgers again keeps the seqs too.
        r2 = await merge_dataset(client, name, target_bytes=TARGET)
        assert (r2.ledgers_after, r2.merges) == (1, 1)
        again = await client.datasets.get(name)
        assert await _rows(client, again) == list(range(end))
        for (a, b), rows in windows.items():
            assert await _rows_between(client, again, a, b) == rows
        assert (await merge_dataset(client, name, target_bytes=TARGET)).merges == 0, "nothing left to merge"


async def test_a_merge_that_loses_to_an_overwrite_is_abandoned_and_leaves_nothing(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint) as client:
        name = "merge-race"
        await _commit_batches(client, name, 2)
        snapshot = await client.datasets.get(name)
        metas = {x.ledger_id: await client.ledger_metadata(x.ledger_id) for x in snapshot.ledgers}
        fresh = await _write(client, name, [7, 8, 9])
        await client.datasets.commit(name, SCHEMA, [fresh], mode="overwrite")  # lands between plan and swap
        known = set(await client.list_ledgers())
        assert await _merge_group(client, name, SCHEMA, snapshot.ledgers, metas, "w") is None
        assert set(await client.list_ledgers()) == known, "the abandoned merge's ledger was deleted"
        assert await _rows(client, await client.datasets.get(name)) == [7, 8, 9]
        # Through merge_dataset, after the overwrite: nothing to merge, no error.
        r = await merge_dataset(client, name, target_bytes=TARGET)
        assert (r.merges, r.abandoned, r.ledgers_after) == (0, 0, 1)


async def test_appends_committed_during_a_merge_stay_after_it(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint) as client:
        name = "merge-appends"
        v = await _commit_batches(client, name, 3)
        snapshot = await client.datasets.get(name)
        metas = {x.ledger_id: await client.ledger_metadata(x.ledger_id) for x in snapshot.ledgers}
        v = await _commit_batches(client, name, 1, first_value=v)  # after the snapshot, before the swap
        merged = await _merge_group(client, name, SCHEMA, snapshot.ledgers, metas, "w")
        assert merged is not None and merged.sources == [x.ledger_id for x in snapshot.ledgers]
        m = await client.datasets.get(name)
        assert len(m.ledgers) == 4 and await _rows(client, m) == list(range(v))
        # And a merge running while appends commit: every row once, in order.
        done = asyncio.Event()

        async def appender() -> int:
            nonlocal v
            while not done.is_set():
                v = await _commit_batches(client, name, 1, first_value=v, per_commit=1)
            return v

        task = asyncio.create_task(appender())
        try:
            r: MergeResult = await merge_dataset(client, name, target_bytes=TARGET)
        finally:
            done.set()
            await task
        assert r.merges >= 1
        m = await client.datasets.get(name)
        assert await _rows(client, m) == list(range(v))
        # The first ledger (the earlier merge, larger than what came after it) stays as it is (size-tiered); the
        # new small ones were merged after it.
        assert r.merged[0].ledger.ledger_id in {x.ledger_id for x in m.ledgers}


async def test_the_cli_merges_a_dataset_without_a_key_column(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint) as client:
        name = "merge-cli"
        end = await _commit_batches(client, name, 3)
    done = await asyncio.to_thread(octavo, cluster, "dataset", "compact", name, "--target-bytes", str(TARGET), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["operation"], out["ledgers_before"], out["ledgers_after"], out["ledgers_merged"]) == ("merge", 9, 1, 9)
    assert out["bytes_merged"] > 0 and out["duration_s"] >= 0
    text = await asyncio.to_thread(octavo, cluster, "dataset", "compact", name, "--target-bytes", str(TARGET))
    assert text.returncode == 0 and "nothing to merge (1 ledgers" in text.stdout, text.stdout + text.stderr
    listed = await asyncio.to_thread(octavo, cluster, "dataset", "ls", "--json")
    row = next(d for d in json.loads(listed.stdout)["datasets"] if d["name"] == name)
    assert (row["ledgers"], row["rows"]) == (1, end)
    async with Client(cluster.etcd_endpoint) as client:
        assert await _rows(client, await client.datasets.get(name)) == list(range(end))


async def test_the_auditor_checkpoints_merges_and_collects_orphans_by_itself(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    args = ["--dataset-maintenance-interval-s", "1", "--dataset-merge-target-bytes", str(TARGET),
            "--dataset-orphan-interval-s", "1", "--dataset-orphan-grace-s", "20"]
    with LocalCluster(str(tmp_path_factory.mktemp("maintained")), bookies=3, bookie_args=args) as cluster:
        async with Client(cluster.etcd_endpoint) as client:
            name = "maintained"
            end = await _commit_batches(client, name, 3)
            for _ in range(CHECKPOINT_EVERY_COMMITS):  # a long log: the maintenance folds it
                await client.datasets.commit(name, SCHEMA, [])
            orphan = await _write(client, name, [1])  # never committed
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                head = await client.datasets.head(name)
                try:
                    await client.ledger_metadata(orphan.ledger_id)
                except NoSuchLedgerError:
                    orphan_gone = True
                else:
                    orphan_gone = False
                if head.ledger_count == 1 and head.checkpoint > 0 and orphan_gone:
                    break
                await asyncio.sleep(0.5)
            assert (head.ledger_count, head.checkpoint > 0, orphan_gone) == (1, True, True), head
            assert await _rows(client, await client.datasets.get(name)) == list(range(end))
