"""Datasets on a head key and a commit log (octavo.client.dataset): what a commit costs, checkpoints, the old
format, concurrent committers, retired ledgers. On a real etcd and real bookies."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import octavo.client.dataset as ds
import octavo.client.datasetstreams as datasetstreams
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.client.dataset import (
    META_DATASET,
    DatasetError,
    DatasetExistsError,
    DatasetLedger,
    Manifest,
    NoSuchDatasetError,
)
from octavo.meta.errors import MetadataUnavailableError
from octavo.meta.etcd import EtcdClient

SCHEMA = '{"fields":[{"metadata":{},"name":"id","nullable":false,"type":"long"}],"type":"struct"}'
NULLABLE = SCHEMA.replace('"nullable":false', '"nullable":true')
OTHER = SCHEMA.replace('"long"', '"string"')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # No dataset maintenance in the background: these tests checkpoint by hand and count what each checkpoint
    # did, and the auditor's maintenance (every 60 s, a log of 100 records or more) could take one first (a CI
    # run found test_a_commit_writes_two_small_keys_whatever_the_dataset_size's checkpoint at 121 taken).
    with LocalCluster(str(tmp_path_factory.mktemp("datasets")), bookies=3,
                      bookie_args=["--dataset-maintenance-interval-s", "0"]) as c:
        yield c


def fake(lid: int, rows: int = 10) -> DatasetLedger:
    """A ledger as a commit lists it (commits do not read the ledgers they list)."""
    return DatasetLedger(lid, rows, rows * 10, 1)


async def dataset_keys(client: Client, name: str) -> dict[bytes, int]:
    """Every etcd key of the dataset and its value's size."""
    out = {}
    for kv in await client.etcd.get_prefix(client.metadata_store.layout.root):
        if b"dataset" in kv.key and (kv.key.endswith(b"/" + name.encode()) or b"/" + name.encode() + b"/" in kv.key):
            out[kv.key] = len(kv.value)
    return out


# -- pure -------------------------------------------------------------------------------------------------
def test_a_merged_ledger_tells_which_entries_hold_which_seq() -> None:
    merged = DatasetLedger(9, 60, 600, 6, seq=7, segments=((0, 3), (2, 5), (5, 7)))
    assert merged.seq_runs() == [(0, 1, 3), (2, 4, 5), (5, 5, 7)]
    assert merged.entries_in(0, 7) == (0, 5)
    assert merged.entries_in(3, 7) == (2, 5)  # a reader at seq 3 reads what came after it, once
    assert merged.entries_in(3, 5) == (2, 4)
    assert merged.entries_in(5, 6) is None
    assert merged.entries_in(7, 9) is None
    plain = DatasetLedger(4, 10, 100, 3, seq=2)
    assert plain.entries_in(1, 2) == (0, 2) and plain.entries_in(2, 9) is None
    assert DatasetLedger.from_json(merged.to_json()) == merged
    assert DatasetLedger.from_json(plain.to_json()) == plain


# -- cost of a commit ---------------------------------------------------------------------------------------
async def test_a_commit_writes_two_small_keys_whatever_the_dataset_size(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint) as client:
        store = client.datasets
        sizes = []
        await store.commit("flat", SCHEMA, [fake(99_999)])
        await store.set_retention("flat", 0)  # no time travel: a checkpoint deletes all the log it can
        for k in range(1, 350):
            before = await dataset_keys(client, "flat")
            result = await store.commit("flat", SCHEMA, [fake(100_000 + k)], stream=("s", k))
            after = await dataset_keys(client, "flat")
            assert result.applied and result.version == k + 1 and result.added[0].seq == k + 1
            written = {key: n for key, n in after.items() if before.get(key) != n or key not in before}
            sizes.append(sum(written.values()) + sum(len(key) for key in written))
            if k in (120, 240):
                assert await store.checkpoint("flat") == k + 1
        # The first commit also writes the schema; every other one writes the head and one log record.
        assert max(sizes[1:]) < 1024, sizes
        assert max(sizes[300:]) <= max(sizes[1:50]) + 16, "what a commit writes does not grow with the dataset"
        keys = await dataset_keys(client, "flat")
        log_keys = [k for k in keys if b"/dataset-log/" in k]
        # After the checkpoint at 241, records up to the one before it (121) were deleted.
        assert len(log_keys) == 350 - 121
        head = await store.head("flat")
        assert (head.version, head.rows, head.ledger_count, head.checkpoint, head.last_seq) == (350, 3500, 350, 241,
                                                                                              350)
        manifest = await store.get("flat")
        assert [x.ledger_id for x in manifest.ledgers] == [99_999] + [100_000 + k for k in range(1, 350)]
        assert [x.seq for x in manifest.ledgers] == list(range(1, 351))


async def test_long_commits_and_large_checkpoints_go_into_ledgers(cluster: LocalCluster,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    async with Client(cluster.etcd_endpoint) as client:
        store = client.datasets
        await store.commit("big", SCHEMA, [fake(1, 5)])
        many = [fake(10_000 + i) for i in range(5000)]  # ~150 KB of record: over an etcd value we keep small
        result = await store.commit("big", SCHEMA, many)
        assert [x.seq for x in result.added][:2] == [2, 3]
        keys = await dataset_keys(client, "big")
        assert max(keys.values()) < ds.RECORD_INLINE_BYTES_MAX, "the long list is in a ledger, not in etcd"
        blobs = [m for m in await client.all_ledger_metadata()
                 if m.custom_metadata.get(META_DATASET) == "big" and m.custom_metadata.get(ds.META_BLOB)]
        assert [m.custom_metadata[ds.META_BLOB] for m in blobs] == ["commit"]
        manifest = await store.get("big")
        assert len(manifest.ledgers) == 5001 and manifest.rows == 50_005
        monkeypatch.setattr(ds, "CHECKPOINT_INLINE_BYTES_MAX", 1000)
        assert await store.checkpoint("big", min_records=1) == 2
        await store.commit("big", SCHEMA, [fake(2, 7)])
        again = await store.get("big")
        assert [x.ledger_id for x in again.ledgers] == [1, *range(10_000, 15_000), 2]
        kinds = sorted(m.custom_metadata.get(ds.META_BLOB, "") for m in await client.all_ledger_metadata()
                       if m.custom_metadata.get(META_DATASET) == "big")
        assert kinds == ["checkpoint", "commit"]
        # The commit's ledger is no longer needed by the newest version, but a reader of the version before the
        # checkpoint may still read it: it is retired, not deleted.
        assert {lid for lid, _ in again.retired} == {blobs[0].ledger_id}
        dropped = await store.drop("big")
        assert len(dropped) == 5002
        assert not await dataset_keys(client, "big")
        assert not [m for m in await client.all_ledger_metadata() if m.custom_metadata.get(META_DATASET) == "big"]


async def test_a_committer_checkpoints_by_itself_when_no_maintenance_does(cluster: LocalCluster,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "CHECKPOINT_FORCED_COMMITS", 25)
    async with Client(cluster.etcd_endpoint) as client:
        for k in range(60):
            await client.datasets.commit("forced", SCHEMA, [fake(200_000 + k)])
            if k == 0:
                await client.datasets.set_retention("forced", 0)
        head = await client.datasets.head("forced")
        assert head.checkpoint == 50
        assert len([k for k in await dataset_keys(client, "forced") if b"/dataset-log/" in k]) == 35
        assert len((await client.datasets.get("forced")).ledgers) == 60


# -- modes and conflicts ------------------------------------------------------------------------------------
async def test_modes_replays_and_real_conflicts(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint) as client:
        store = client.datasets
        with pytest.raises(NoSuchDatasetError):
            await store.head("modes")
        first = await store.commit("modes", SCHEMA, [fake(1)], mode="error")
        assert first.applied and first.version == 1
        with pytest.raises(DatasetExistsError, match="already exists"):
            await store.commit("modes", SCHEMA, [fake(2)], mode="error")
        ignored = await store.commit("modes", SCHEMA, [fake(2)], mode="ignore")
        assert not ignored.applied and ignored.version == 1
        assert (await store.commit("modes", SCHEMA, [fake(3)], stream=("q", 4))).applied
        replayed = await store.commit("modes", SCHEMA, [fake(4)], stream=("q", 4))
        assert not replayed.applied and replayed.version == 2
        with pytest.raises(DatasetError, match="another schema"):
            await store.commit("modes", OTHER, [fake(5)])
        widened = await store.commit("modes", NULLABLE, [fake(6)])
        assert widened.head is not None and widened.head.schema == NULLABLE and widened.head.schema_version == 1
        assert (await store.head("modes")).schema == NULLABLE
        with pytest.raises(DatasetError, match=r"ledgers \[99\] are gone"):
            await store.commit("modes", SCHEMA, [fake(7)], replace=[1, 99])
        swapped = await store.commit("modes", SCHEMA, [DatasetLedger(8, 20, 200, 2)], replace=[1, 3])
        assert swapped.replaced == [1, 3] and swapped.added[0].seq == 2  # the highest seq it replaced
        manifest = await store.get("modes")
        assert [(x.ledger_id, x.seq) for x in manifest.ledgers] == [(8, 2), (6, 3)]
        assert manifest.streams == {"q": 4} and manifest.rows == 30
        over = await store.commit("modes", OTHER, [fake(9)], mode="overwrite")
        assert sorted(over.replaced) == [6, 8] and over.added[0].seq == 4
        manifest = await store.get("modes")
        assert [x.ledger_id for x in manifest.ledgers] == [9] and manifest.schema == OTHER
        assert sorted(lid for lid, _ in manifest.retired) == [1, 3, 6, 8]
        with pytest.raises(DatasetError, match="listed twice"):
            await store.commit("modes", OTHER, [fake(10), fake(10)])


async def test_a_commit_whose_answer_was_lost_is_applied_once(cluster: LocalCluster,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """etcd applied the transaction but the answer never came (a timeout, a leader change): the commit finds
    its own record in the log and does not append a second time."""
    real_txn = EtcdClient.txn
    dropped = []

    async def answer_lost(self: EtcdClient, txn: object, read_only: bool = False) -> object:
        result = await real_txn(self, txn, read_only)  # type: ignore[arg-type]
        if not dropped and result[0] and any(op.HasField("request_put") and b"/dataset-log/lost/" in
                                              op.request_put.key for op in txn.success):  # type: ignore[attr-defined]
            dropped.append(True)
            raise MetadataUnavailableError("etcd unavailable: deadline exceeded (injected)")
        return result

    async with Client(cluster.etcd_endpoint) as client:
        await client.datasets.commit("lost", SCHEMA, [fake(1)])
        monkeypatch.setattr(EtcdClient, "txn", answer_lost)
        result = await client.datasets.commit("lost", SCHEMA, [fake(2)])
        monkeypatch.setattr(EtcdClient, "txn", real_txn)
        assert dropped and result.applied and result.version == 2
        manifest = await client.datasets.get("lost")
        assert [x.ledger_id for x in manifest.ledgers] == [1, 2]


async def test_idle_streams_are_forgotten_and_a_dataset_keeps_a_bounded_number(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The streams map lives in the head every commit reads: a stream idle for STREAM_IDLE_EXPIRY_S is forgotten
    (a batch it replays after that lands again, as after a Kafka producer id's expiry), and a new stream beyond
    STREAMS_MAX is refused with nothing committed. A head from before the times were kept counts its streams as
    seen at its last update."""
    day_ms = 86_400_000
    async with Client(cluster.etcd_endpoint) as client:
        store = client.datasets
        for k, stream in enumerate(("old", "recent", "kept")):
            await store.commit("streams", SCHEMA, [fake(10 + k)], stream=(stream, 1))
        head = await store.head("streams")
        assert set(head.stream_seen) == {"old", "recent", "kept"}
        now = head.updated_unix_ms
        head.stream_seen = {"old": now - 8 * day_ms, "recent": now - day_ms, "kept": now}
        await client.etcd.put(store.key("streams"), head.encode())
        result = await store.commit("streams", SCHEMA, [fake(20)], stream=("new", 5))
        assert result.applied and result.head is not None
        assert result.head.streams == {"recent": 1, "kept": 1, "new": 5}
        assert result.head.stream_seen["recent"] == now - day_ms and result.head.stream_seen["new"] >= now
        assert (await store.commit("streams", SCHEMA, [fake(21)], stream=("old", 1))).applied  # forgotten
        assert not (await store.commit("streams", SCHEMA, [fake(22)], stream=("recent", 1))).applied  # a replay

        # A head written before the times were kept, last updated 8 days ago: every stream but the committer's
        # is forgotten at the next stream commit; one updated a day ago forgets none.
        for age_days, left in ((1, {"old", "recent", "kept", "new", "again"}), (8, {"again"})):
            head = await store.head("streams")
            head.stream_seen, head.updated_unix_ms = {}, now - age_days * day_ms
            await client.etcd.put(store.key("streams"), head.encode())
            assert (await store.commit("streams", SCHEMA, [fake(30 + age_days)], stream=("again", age_days))).applied
            assert set((await store.head("streams")).streams) == left

        monkeypatch.setattr(datasetstreams, "STREAMS_MAX", 2)
        await store.commit("streams", SCHEMA, [fake(40)], stream=("second", 1))
        version = (await store.head("streams")).version
        with pytest.raises(DatasetError, match=r"refuses stream 'third'.*STREAMS_MAX"):
            await store.commit("streams", SCHEMA, [fake(41)], stream=("third", 1))
        assert (await store.head("streams")).version == version
        assert 41 not in [x.ledger_id for x in (await store.get("streams")).ledgers]
        assert (await store.commit("streams", SCHEMA, [fake(42)], stream=("second", 2))).applied


# -- the format before 2 -----------------------------------------------------------------------------------
async def test_a_dataset_in_the_old_format_reads_and_moves_to_the_new_one(cluster: LocalCluster) -> None:
    old = Manifest("legacy", SCHEMA, "id", version=3, next_seq=4,
                   ledgers=[DatasetLedger(1, 10, 100, 1, 1, 1000), DatasetLedger(2, 10, 100, 1, 2, 1000),
                            DatasetLedger(3, 10, 100, 1, 3, 1000)],
                   streams={"q": 7}, created_unix_ms=1000, updated_unix_ms=2000)
    async with Client(cluster.etcd_endpoint) as client:
        await client.etcd.put(client.datasets.key("legacy"), old.encode_v1())
        assert "ledgers" in json.loads(old.encode_v1())  # what the old code wrote: one value with every ledger
        head = await client.datasets.head("legacy")
        assert (head.version, head.rows, head.ledger_count, head.last_seq, head.format) == (3, 30, 3, 3, 1)
        assert (await client.datasets.get("legacy")).ledgers == old.ledgers
        assert "legacy" in await client.datasets.names()
        assert not (await client.datasets.commit("legacy", SCHEMA, [fake(4)], stream=("q", 7))).applied
        result = await client.datasets.commit("legacy", SCHEMA, [fake(5)], stream=("q", 8))
        assert result.applied and result.version == 4 and result.added[0].seq == 4
        head = await client.datasets.head("legacy")
        assert (head.format, head.checkpoint, head.key_column, head.streams) == (2, 3, "id", {"q": 8})
        manifest = await client.datasets.get("legacy")
        assert [x.ledger_id for x in manifest.ledgers] == [1, 2, 3, 5]
        assert manifest.created_unix_ms == 1000


# -- concurrent committers ----------------------------------------------------------------------------------
COMMITTER = """
import asyncio, sys
from octavo.client import Client
from octavo.client.dataset import DatasetLedger

async def main(etcd, worker, commits):
    async with Client(etcd) as client:
        for k in range(commits):
            lid = 1_000_000 + worker * 10_000 + k
            r = await client.datasets.commit("contended", {schema!r}, [DatasetLedger(lid, 3, 30, 1)])
            assert r.applied
        print("done", worker)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def test_sixteen_processes_appending_at_once_all_land(cluster: LocalCluster, tmp_path: Path) -> None:
    script = tmp_path / "committer.py"
    script.write_text(COMMITTER.replace("{schema!r}", repr(SCHEMA)))
    workers, commits = 16, 25
    procs = [subprocess.Popen([sys.executable, str(script), cluster.etcd_endpoint, str(w), str(commits)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(workers)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs if err]

    async def check() -> None:
        async with Client(cluster.etcd_endpoint) as client:
            manifest = await client.datasets.get("contended")
            ids = [x.ledger_id for x in manifest.ledgers]
            expected = {1_000_000 + w * 10_000 + k for w in range(workers) for k in range(commits)}
            assert len(ids) == len(set(ids)) == workers * commits and set(ids) == expected
            assert manifest.version == workers * commits and manifest.rows == 3 * workers * commits
            assert sorted(x.seq for x in manifest.ledgers) == list(range(1, workers * commits + 1))

    asyncio.run(check())


# -- retired ledgers and orphans ---------------------------------------------------------------------------
async def test_ledgers_that_leave_stay_readable_for_the_retention_then_are_collected(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint) as client:
        async def real(rows: int) -> DatasetLedger:
            handle = await client.create_ledger(3, 3, 2, metadata={META_DATASET: "retired"})
            await handle.append_many([b"x" * 10] * rows)
            await handle.close()
            return DatasetLedger(handle.ledger_id, rows, rows * 10, rows)

        a, b = await real(2), await real(3)
        orphan = await real(1)  # written for the dataset, never committed
        await client.datasets.commit("retired", SCHEMA, [a, b])
        c = await real(4)
        await client.datasets.commit("retired", SCHEMA, [c], mode="overwrite")
        assert await client.datasets.collect_orphans("retired", 0) == [orphan.ledger_id]
        handle = await client.open_ledger(a.ledger_id, recovery=False)  # a read planned before the overwrite
        assert [e.data async for e in handle.read(0, 1)] == [b"x" * 10] * 2
        await client.datasets.set_retention("retired", 0.5)
        await asyncio.sleep(1.0)
        assert sorted(await client.datasets.collect_orphans("retired", 0)) == sorted([a.ledger_id, b.ledger_id])
        assert [x.ledger_id for x in (await client.datasets.get("retired")).ledgers] == [c.ledger_id]
        assert (await client.datasets.head("retired")).retention_s == 0.5
        with pytest.raises(DatasetError, match="at most"):
            await client.datasets.set_retention("retired", 10 * ds.RETIRED_RETENTION_S_MAX)
        all_deleted = await client.datasets.collect_all_orphans(0)
        assert "retired" not in all_deleted  # nothing left to collect
        assert await client.datasets.drop("retired") == [c.ledger_id]


# -- key compaction keeps every row's seq -----------------------------------------------------------------
async def test_key_compaction_keeps_the_seq_of_every_row_it_keeps(cluster: LocalCluster) -> None:
    """Issue 39: a reader at seq 2 of a compaction of commits 1-3 read the compacted rows of commits 1 and 2
    again (the merged ledger took seq 3). Now every kept row keeps its commit's seq."""
    pa = pytest.importorskip("pyarrow")
    from octavo.spark.arrowio import Options, decode_entry, new_write_id, write_ledger
    from octavo.spark.keycompact import compact_dataset

    opts = Options.parse({"etcd": cluster.etcd_endpoint, "dataset": "keyed-seqs", "rows_per_entry": "5"})
    schema = ('{"fields":[{"metadata":{},"name":"k","nullable":true,"type":"long"},'
              '{"metadata":{},"name":"v","nullable":true,"type":"long"}],"type":"struct"}')
    async with Client(cluster.etcd_endpoint) as client:
        for commit in range(3):  # keys 0..19 each commit; commit 2 rewrites keys 0..9 only
            keys = list(range(20)) if commit < 2 else list(range(10))
            batch = pa.record_batch([pa.array(keys, pa.int64()), pa.array([commit] * len(keys), pa.int64())],
                                    names=["k", "v"])
            written = await write_ledger(opts, [batch], new_write_id())
            assert written is not None
            await client.datasets.commit("keyed-seqs", schema, [written], key_column="k")
        before = await client.datasets.get("keyed-seqs")
        assert [x.seq for x in before.ledgers] == [1, 2, 3]
        result = await compact_dataset(opts, seed=b"seed")
        assert (result.rows_before, result.rows_after) == (50, 20)
        after = await client.datasets.get("keyed-seqs")
        [merged] = after.ledgers
        assert merged.seq == 3 and [seq for _, seq in merged.segments] == [2, 3]

        async def rows_after(seq: int) -> list[tuple[int, int]]:
            span = merged.entries_in(seq, 3)
            if span is None:
                return []
            handle = await client.open_ledger(merged.ledger_id, recovery=False)
            out = []
            async for entry in handle.read(*span):
                for b in decode_entry(entry.data):
                    out += list(zip(b.column("k").to_pylist(), b.column("v").to_pylist(), strict=True))
            return out

        assert sorted(await rows_after(0)) == sorted([(k, 2) for k in range(10)] + [(k, 1) for k in range(10, 20)])
        assert sorted(await rows_after(2)) == [(k, 2) for k in range(10)]  # only what commit 3 wrote
        assert await rows_after(3) == []


async def test_a_key_compaction_that_loses_its_swap_to_a_merge_starts_over(cluster: LocalCluster,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The auditor's maintenance merged the dataset's small ledgers while a key compaction ran: the
    compaction's swap found its ledgers gone, deleted its output and compacted the new version."""
    pa = pytest.importorskip("pyarrow")
    import octavo.spark.keycompact as keycompact
    from octavo.client.datasetmerge import merge_dataset
    from octavo.spark.arrowio import Options, new_write_id, write_ledger

    opts = Options.parse({"etcd": cluster.etcd_endpoint, "dataset": "keyed-race"})
    schema = ('{"fields":[{"metadata":{},"name":"k","nullable":true,"type":"long"},'
              '{"metadata":{},"name":"v","nullable":true,"type":"long"}],"type":"struct"}')
    merged_by_rival = []
    real_write = keycompact.write_ledger

    async def write_then_rival_merges(*args: object, **kwargs: object) -> object:
        written = await real_write(*args, **kwargs)  # type: ignore[arg-type]
        if not merged_by_rival:
            async with Client(cluster.etcd_endpoint) as rival:
                merged_by_rival.append(await merge_dataset(rival, "keyed-race", target_bytes=1 << 20))
        return written

    async with Client(cluster.etcd_endpoint) as client:
        for commit in range(3):
            batch = pa.record_batch([pa.array(list(range(10)), pa.int64()), pa.array([commit] * 10, pa.int64())],
                                    names=["k", "v"])
            written = await write_ledger(opts, [batch], new_write_id())
            assert written is not None
            await client.datasets.commit("keyed-race", schema, [written], key_column="k")
        ids_before = set(await client.list_ledgers())
        monkeypatch.setattr(keycompact, "write_ledger", write_then_rival_merges)
        result = await keycompact.compact_dataset(opts, seed=b"seed")
        assert merged_by_rival and merged_by_rival[0].merges == 1
        assert (result.ledgers_before, result.rows_before, result.rows_after) == (1, 30, 10)  # the merged version
        manifest = await client.datasets.get("keyed-race")
        assert len(manifest.ledgers) == 1 and manifest.rows == 10
        leftover = set(await client.list_ledgers()) - ids_before - {manifest.ledgers[0].ledger_id}
        # The rival's merged ledger is retired; the compaction's first output, never published, was deleted.
        assert leftover == {merged_by_rival[0].merged[0].ledger.ledger_id}


# -- time travel and history ---------------------------------------------------------------------------------
async def test_versions_within_the_retention_read_as_they_were(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint) as client:
        store = client.datasets
        await store.commit("travel", SCHEMA, [fake(1), fake(2)])  # version 1
        await store.commit("travel", SCHEMA, [fake(3)], stream=("q", 0))  # 2
        await store.commit("travel", SCHEMA, [DatasetLedger(4, 20, 200, 2)], replace=[1, 2])  # 3: a merge
        assert await store.checkpoint("travel", min_records=1) == 3
        await store.commit("travel", NULLABLE, [fake(5)])  # 4: the schema widens
        between = (await store.head("travel")).updated_unix_ms
        await store.commit("travel", OTHER, [fake(6)], mode="overwrite")  # 5
        assert await store.checkpoint("travel", min_records=1) == 5
        await store.commit("travel", OTHER, [fake(7)])  # 6
        seen = {v: [x.ledger_id for x in (await store.get_version("travel", v)).ledgers] for v in range(1, 7)}
        assert seen == {1: [1, 2], 2: [1, 2, 3], 3: [4, 3], 4: [4, 3, 5], 5: [6], 6: [6, 7]}
        assert (await store.get_version("travel", 4)).schema == NULLABLE
        assert (await store.get_version("travel", 2)).schema == SCHEMA
        assert (await store.get_version("travel", 5)).schema == OTHER
        assert await store.version_at("travel", between) == 4
        with pytest.raises(DatasetError, match="versions 1 to 6, not 7"):
            await store.get_version("travel", 7)
        history = await store.history("travel")
        assert [(c["version"], c["operation"], c["ledgers_added"], c["rows_added"], c["ledgers_removed"])
                for c in history] == [(1, "append", 2, 20, 0), (2, "append", 1, 10, 0), (3, "replace", 1, 20, 2),
                                      (4, "append", 1, 10, 0), (5, "overwrite", 1, 10, 3), (6, "append", 1, 10, 0)]
        assert history[1]["stream"] == ["q", 0] and history[3]["schema_changed"]
        # With no retention a checkpoint deletes the log it can: the old versions are gone, and say so.
        await store.set_retention("travel", 0)
        await store.commit("travel", OTHER, [fake(8)])  # 7
        assert await store.checkpoint("travel", min_records=1) == 7
        with pytest.raises(DatasetError, match="version 2 of dataset 'travel' is no longer kept"):
            await store.get_version("travel", 2)
        assert [x.ledger_id for x in (await store.get_version("travel", 6)).ledgers] == [6, 7]
        assert [c["version"] for c in await store.history("travel")] == [6, 7]
        out = subprocess.run([sys.executable, "-m", "octavo.cli.main", "dataset", "history", "travel", "--etcd",
                              cluster.etcd_endpoint, "--json"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert [c["version"] for c in json.loads(out.stdout)["commits"]] == [6, 7]
        out = subprocess.run([sys.executable, "-m", "octavo.cli.main", "dataset", "history", "travel", "--etcd",
                              cluster.etcd_endpoint], capture_output=True, text=True, timeout=60)
        assert out.stdout.splitlines()[0].split()[:3] == ["VERSION", "TIME", "OPERATION"]
        assert out.stdout.splitlines()[1].split()[0] == "6" and "overwrite" not in out.stdout
