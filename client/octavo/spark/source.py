"""The `octavo` Spark data source: batch and streaming reads and writes of datasets (docs/spark.md).

Write: each task writes its partition into a ledger of its own (Arrow IPC entries) and sends the driver a
small commit message (ledger id, rows, bytes); the driver's commit publishes every ledger of the write in
one etcd transaction (the manifest), so readers see all of a write or none of it. Abort deletes the ledgers
it was told about; a failed task's ledger (no message) is an orphan, deleted by the next commit to the
dataset once older than `orphan_grace_s`. Streaming writes record the batch id in the same transaction:
a batch replayed after a failure or a restart is applied once.

Read: one input partition per ledger (or per `entries_per_partition` entries), the schema from the manifest.
Streaming read: offsets are the manifest's commit sequence numbers; each micro-batch reads the ledgers
committed since the last offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from octavo.client.client import Client, SyncClient
from octavo.client.dataset import DatasetExistsError, DatasetLedger, NoSuchDatasetError
from octavo.meta.errors import NotEnoughBookiesError
from octavo.spark.arrowio import Options, client_options, decode_entry, new_write_id, write_ledger
from octavo.spark.metrics import spark_metrics


@dataclass
class LedgerWritten(WriterCommitMessage):  # type: ignore[misc]
    ledger: DatasetLedger


@dataclass
class LedgerSlice(InputPartition):  # type: ignore[misc]
    ledger_id: int
    first: int
    last: int


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _manifest(opts: Options) -> Any:
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        return await client.datasets.get(opts.dataset)


async def _preflight(opts: Options, mode: str) -> None:
    """On the driver, while Spark plans the write, before any task runs: etcd must answer (an unreachable one
    fails here at once, not after every task has failed), enough bookies must be writable for the ensemble,
    and error-if-exists fails here when the dataset exists (the commit checks it again, atomically)."""
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        manifest, _ = await client.datasets.read(opts.dataset)
        if manifest is not None and mode == "error":
            raise DatasetExistsError(f"dataset {opts.dataset!r} already exists (if_exists error); use append or "
                                     "overwrite")
        writable = await client.writable_bookies()
        if len(writable) < opts.ensemble_size:
            raise NotEnoughBookiesError(f"writing dataset {opts.dataset!r} needs {opts.ensemble_size} writable "
                                        f"bookies in cluster {opts.cluster!r} (etcd {opts.etcd}); "
                                        f"{len(writable)} are registered ({', '.join(writable) or 'none'})")


# Orphan collection reads every ledger's metadata (a page at a time): every batch write does it, a stream every
# this many batches.
ORPHAN_SCAN_EVERY_STREAM_BATCHES = 50


async def _commit(opts: Options, schema: str, ledgers: list[DatasetLedger], mode: str,
                  stream: tuple[str, int] | None = None) -> None:
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        await client.datasets.commit(opts.dataset, schema, ledgers, mode=mode, key_column=opts.key_column,
                                     stream=stream)
        if stream is None or stream[1] % ORPHAN_SCAN_EVERY_STREAM_BATCHES == 0:
            await client.datasets.collect_orphans(opts.dataset, opts.orphan_grace_s)
    measured = spark_metrics(opts.otlp_endpoint)
    measured.commits.add(1, {"kind": "stream" if stream is not None else "batch"})
    measured.flush()


async def _delete(opts: Options, ledger_ids: list[int]) -> None:
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        for lid in ledger_ids:
            with contextlib.suppress(Exception):  # else an orphan: collected after the grace period
                await client.delete_ledger(lid)


class OctavoDataSource(DataSource):  # type: ignore[misc]
    """`spark.read.format("octavo").option("etcd", E).load("dataset")`; `df.write.format("octavo")...`"""

    @classmethod
    def name(cls) -> str:
        return "octavo"

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.opts = Options.parse(options)

    def schema(self) -> StructType:
        try:
            manifest = _run(_manifest(self.opts))
        except NoSuchDatasetError:
            raise NoSuchDatasetError(f"dataset {self.opts.dataset!r} does not exist in cluster "
                                     f"{self.opts.cluster!r} (etcd {self.opts.etcd})") from None
        schema = StructType.fromJson(json.loads(manifest.schema))
        if self.opts.columns:
            missing = [c for c in self.opts.columns if c not in schema.fieldNames()]
            if missing:
                raise ValueError(f"option columns names {missing}, not in the dataset's schema "
                                 f"{schema.fieldNames()}")
            schema = StructType([schema[c] for c in self.opts.columns])
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        return OctavoReader(self.opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        # Spark passes only append or overwrite to Python sources; error-if-exists and ignore come through the
        # if_exists option (with Spark's mode append).
        mode = "overwrite" if overwrite else self.opts.if_exists
        _run(_preflight(self.opts, mode))
        return OctavoWriter(self.opts, schema.json(), mode)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return OctavoStreamWriter(self.opts, schema.json())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return OctavoStreamReader(self.opts, schema)


def _slices(opts: Options, ledgers: Sequence[DatasetLedger]) -> list[LedgerSlice]:
    out = []
    for x in ledgers:
        if x.entries <= 0:
            continue
        step = opts.entries_per_partition or x.entries
        out += [LedgerSlice(x.ledger_id, first, min(first + step, x.entries) - 1)
                for first in range(0, x.entries, step)]
    return out


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)


def _read_slice(opts: Options, target: pa.Schema, part: LedgerSlice) -> Iterator[pa.RecordBatch]:
    """The slice's rows as batches of exactly the dataset's schema (rows appended with another nullability
    are cast: the manifest's schema is the union)."""
    measured = spark_metrics(opts.otlp_endpoint)
    rows = 0
    try:
        with SyncClient(opts.etcd, opts.cluster, client_options(opts), meter_provider=measured.provider) as client:
            handle = client.open_ledger(part.ledger_id, password=opts.password, recovery=False)
            for entry in handle.read(part.first, part.last):
                for batch in decode_entry(entry.data, opts.columns):
                    rows += batch.num_rows
                    yield batch if batch.schema == target else batch.cast(target)
    finally:
        measured.rows_read.add(rows)
        measured.flush()


class OctavoReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.target = _arrow_schema(schema)

    def partitions(self) -> list[LedgerSlice]:
        manifest = _run(_manifest(self.opts))
        return _slices(self.opts, manifest.ledgers)

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        return _read_slice(self.opts, self.target, partition)


class OctavoWriter(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, opts: Options, schema_json: str, mode: str) -> None:
        self.opts = opts
        self.schema_json = schema_json
        self.mode = mode
        self.write_id = new_write_id()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerWritten:
        return LedgerWritten(_run(write_ledger(self.opts, iterator, self.write_id)))

    def commit(self, messages: Any) -> None:
        ledgers = [m.ledger for m in messages if m is not None]
        _run(_commit(self.opts, self.schema_json, ledgers, self.mode))

    def abort(self, messages: Any) -> None:
        _run(_delete(self.opts, [m.ledger.ledger_id for m in messages if m is not None]))


class OctavoStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    def __init__(self, opts: Options, schema_json: str) -> None:
        self.opts = opts
        self.schema_json = schema_json
        self.write_id = new_write_id()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerWritten:
        return LedgerWritten(_run(write_ledger(self.opts, iterator, self.write_id)))

    def commit(self, messages: Any, batchId: int) -> None:
        ledgers = [m.ledger for m in messages if m is not None and m.ledger.rows > 0]
        empty = [m.ledger.ledger_id for m in messages if m is not None and m.ledger.rows == 0]
        if empty:
            _run(_delete(self.opts, empty))
        _run(_commit(self.opts, self.schema_json, ledgers, "append", stream=(self.opts.stream_id, batchId)))

    def abort(self, messages: Any, batchId: int) -> None:
        _run(_delete(self.opts, [m.ledger.ledger_id for m in messages if m is not None]))


class OctavoStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    """Offsets are {"seq": N}: everything committed up to commit sequence N has been read."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.target = _arrow_schema(schema)

    def initialOffset(self) -> dict[str, int]:
        return {"seq": 0}

    def latestOffset(self, *args: Any) -> dict[str, int]:
        try:
            manifest = _run(_manifest(self.opts))
        except NoSuchDatasetError:
            return {"seq": 0}
        return {"seq": max((x.seq for x in manifest.ledgers), default=0)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[LedgerSlice]:
        manifest = _run(_manifest(self.opts))
        fresh = [x for x in manifest.ledgers if start["seq"] < x.seq <= end["seq"]]
        return _slices(self.opts, fresh)

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        return _read_slice(self.opts, self.target, partition)

    def commit(self, end: dict[str, int]) -> None:
        return None
