"""The `octavo` Spark data source: batch and streaming reads and writes of datasets (docs/spark.md).

Write: each task writes its partition into a ledger of its own (Arrow IPC entries) and sends the driver a
small commit message (ledger id, rows, bytes); the driver's commit publishes every ledger of the write in
one etcd transaction (the manifest), so readers see all of a write or none of it. Abort deletes the ledgers
it was told about; a failed task's ledger (no message) is an orphan, deleted by the next commit to the
dataset once older than `orphan_grace_s`. Streaming writes record the batch id in the same transaction:
a batch replayed after a failure or a restart is applied once.

Read: input partitions planned by size, as Spark plans files: small ledgers share a partition up to
`max_partition_bytes` (each counted at least LEDGER_OPEN_COST_BYTES), a large ledger is split into entry
ranges of about that size (or of `entries_per_partition` entries). The schema comes from the dataset's head.
Streaming read: offsets are commit sequence numbers; each micro-batch reads the entries whose seq is past the
last offset (a merged ledger keeps each entry's seq, so a merge neither repeats nor skips a row).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
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
    Filter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from octavo.client.client import Client, SyncClient
from octavo.client.colstats import LedgerStats, Predicate, may_match
from octavo.client.dataset import DatasetExistsError, DatasetHead, DatasetLedger, NoSuchDatasetError
from octavo.meta.errors import NotEnoughBookiesError
from octavo.spark.arrowio import OptionError, Options, client_options, decode_entry, new_write_id, write_ledger
from octavo.spark.skipping import ledger_stats, predicates
from octavo.spark.sparkmetrics import spark_metrics

log = logging.getLogger(__name__)


@dataclass
class LedgerWritten(WriterCommitMessage):  # type: ignore[misc]
    ledger: DatasetLedger | None  # None: the partition had no row, no ledger was written


@dataclass
class LedgerSlices(InputPartition):  # type: ignore[misc]
    """One input partition: entry ranges (ledger id, first entry, last entry), read in order."""

    pieces: tuple[tuple[int, int, int], ...]


# Like spark.sql.files.openCostInBytes: what opening one more ledger costs a task, counted as bytes when small
# ledgers are grouped, so a partition of tiny ledgers does not open tens of thousands of them.
LEDGER_OPEN_COST_BYTES = 4 * 1024 * 1024


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _manifest(opts: Options) -> Any:
    """The dataset as a batch read sees it: the newest version, or the one versionAsOf / timestampAsOf name."""
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        if opts.timestamp_as_of_ms:
            version = await client.datasets.version_at(opts.dataset, opts.timestamp_as_of_ms)
            return await client.datasets.get_version(opts.dataset, version)
        if opts.version_as_of:
            return await client.datasets.get_version(opts.dataset, opts.version_as_of)
        return await client.datasets.get(opts.dataset)


async def _head(opts: Options) -> DatasetHead:
    """The dataset's head: schema, version, next seq (two small etcd keys, whatever the dataset's size)."""
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        return await client.datasets.head(opts.dataset)


async def _preflight(opts: Options, mode: str) -> None:
    """On the driver, while Spark plans the write, before any task runs: etcd must answer (an unreachable one
    fails here at once, not after every task has failed), enough bookies must be writable for the ensemble,
    and error-if-exists fails here when the dataset exists (the commit checks it again, atomically)."""
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        try:
            await client.datasets.head(opts.dataset)
            exists = True
        except NoSuchDatasetError:
            exists = False
        if exists and mode == "error":
            raise DatasetExistsError(f"dataset {opts.dataset!r} already exists (if_exists error); use append or "
                                     "overwrite")
        writable = await client.writable_bookies()
        if len(writable) < opts.ensemble_size:
            raise NotEnoughBookiesError(f"writing dataset {opts.dataset!r} needs {opts.ensemble_size} writable "
                                        f"bookies in cluster {opts.cluster!r} (etcd {opts.etcd}); "
                                        f"{len(writable)} are registered ({', '.join(writable) or 'none'})")


async def _commit(opts: Options, schema: str, ledgers: list[DatasetLedger], mode: str,
                  stream: tuple[str, int] | None = None) -> None:
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        # Orphans (a failed task's ledger) are collected by the auditor's dataset maintenance, in the
        # background, not here: a scan of the cluster's ledgers after every commit grew with the cluster.
        await client.datasets.commit(opts.dataset, schema, ledgers, mode=mode, key_column=opts.key_column,
                                     stream=stream, merge_schema=opts.merge_schema)
    measured = spark_metrics(opts.otlp_endpoint)
    measured.commits.add(1, {"kind": "stream" if stream is not None else "batch"})
    measured.flush()


async def _delete(opts: Options, ledger_ids: list[int]) -> None:
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        for lid in ledger_ids:
            with contextlib.suppress(Exception):  # else an orphan: collected after the grace period
                await client.delete_ledger(lid)


def _written(messages: Any) -> list[DatasetLedger]:
    """The ledgers the tasks wrote (a task whose partition had no row wrote none)."""
    return [m.ledger for m in messages if m is not None and m.ledger is not None]


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
            head = _run(_manifest(self.opts) if self.opts.version_as_of or self.opts.timestamp_as_of_ms
                        else _head(self.opts))
        except NoSuchDatasetError:
            raise NoSuchDatasetError(f"dataset {self.opts.dataset!r} does not exist in cluster "
                                     f"{self.opts.cluster!r} (etcd {self.opts.etcd})") from None
        schema = StructType.fromJson(json.loads(head.schema))
        if self.opts.columns:
            missing = [c for c in self.opts.columns if c not in schema.fieldNames()]
            if missing:
                raise ValueError(f"option columns names {missing}, not in the dataset's schema "
                                 f"{schema.fieldNames()}")
            schema = StructType([schema[c] for c in self.opts.columns])
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        # pushFilters only with data_skipping: PySpark fails every read of a reader that implements it while
        # spark.sql.python.filterPushdown.enabled is false, and a source cannot see that setting.
        return OctavoSkippingReader(self.opts, schema) if self.opts.data_skipping else OctavoReader(self.opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        _check_storable(schema)
        # Spark passes only append or overwrite to Python sources; error-if-exists and ignore come through the
        # if_exists option (with Spark's mode append).
        mode = "overwrite" if overwrite else self.opts.if_exists
        _run(_preflight(self.opts, mode))
        return OctavoWriter(self.opts, schema.json(), mode)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        _check_storable(schema)
        return OctavoStreamWriter(self.opts, schema.json())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return OctavoStreamReader(self.opts, schema)


def _check_storable(schema: StructType) -> None:
    """Refuse, while the write is planned, a column of a type PySpark cannot put in Arrow (year-month and
    calendar intervals, CHAR/VARCHAR): its tasks would fail one by one otherwise."""
    from pyspark.sql.pandas.types import to_arrow_type

    for f in schema.fields:
        try:
            to_arrow_type(f.dataType, timezone="UTC")
        except Exception:  # PySpark's UNSUPPORTED_DATA_TYPE_FOR_ARROW_CONVERSION (its classes vary by version)
            raise OptionError(f"column {f.name} has type {f.dataType.simpleString().upper()}, which Octavo cannot "
                              "store: PySpark has no Arrow form for it; cast it first (an interval to a number of "
                              "months or to a string)") from None


def _pieces(opts: Options, ledgers: Sequence[DatasetLedger], after_seq: int | None = None,
            upto_seq: int = 0) -> list[tuple[int, int, int, int]]:
    """(ledger id, first entry, last entry, estimated bytes) to read, in dataset order: every entry, or those
    whose seq is in (after_seq, upto_seq]. A ledger over max_partition_bytes (or entries_per_partition
    entries) is cut into ranges."""
    out = []
    for x in ledgers:
        if x.entries <= 0:
            continue
        span = (0, x.entries - 1) if after_seq is None else x.entries_in(after_seq, upto_seq)
        if span is None:
            continue
        per_entry = x.bytes / x.entries
        step = opts.entries_per_partition or max(1, int(opts.max_partition_bytes // max(per_entry, 1.0)))
        for first in range(span[0], span[1] + 1, step):
            last = min(first + step, span[1] + 1) - 1
            out.append((x.ledger_id, first, last, int(per_entry * (last - first + 1))))
    return out


def _plan(opts: Options, pieces: list[tuple[int, int, int, int]]) -> list[LedgerSlices]:
    """Input partitions: consecutive pieces grouped up to max_partition_bytes, each piece counted at least
    LEDGER_OPEN_COST_BYTES (spark.sql.files.openCostInBytes' role); with entries_per_partition, one piece each."""
    if opts.entries_per_partition:
        return [LedgerSlices((p[:3],)) for p in pieces]
    out: list[LedgerSlices] = []
    group: list[tuple[int, int, int]] = []
    size = 0
    for lid, first, last, nbytes in pieces:
        cost = max(nbytes, LEDGER_OPEN_COST_BYTES)
        if group and size + cost > opts.max_partition_bytes:
            out.append(LedgerSlices(tuple(group)))
            group, size = [], 0
        group.append((lid, first, last))
        size += cost
    if group:
        out.append(LedgerSlices(tuple(group)))
    return out


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    # Timestamps as PySpark's read planner requires them (plan_data_source_read.py): timestamp[us, tz=UTC],
    # whatever the session's time zone.
    return to_arrow_schema(schema, timezone="UTC")


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """A batch as the dataset's schema wants it: its columns by name in the target's order (projected), cast
    where nullability or a time zone differs, and nulls for a column added after the batch was written
    (mergeSchema)."""
    names = batch.schema.names
    columns = [_cast(batch.column(names.index(f.name)), f.type) if f.name in names
               else pa.nulls(batch.num_rows, f.type) for f in target]
    return pa.RecordBatch.from_arrays(columns, schema=target)


def _cast(column: pa.Array, to: pa.DataType) -> pa.Array:
    # A column of the very type is kept as it is: Arrow refuses to cast a VARIANT's struct (whose fields are
    # non-nullable) with null rows to itself.
    return column if column.type == to else column.cast(to)


def _read_slice(opts: Options, target: pa.Schema, part: LedgerSlices) -> Iterator[pa.RecordBatch]:
    """The partition's rows as batches of exactly the dataset's schema (rows appended with another nullability
    are cast: the dataset's schema is the union)."""
    measured = spark_metrics(opts.otlp_endpoint)
    rows = 0
    try:
        with SyncClient(opts.etcd, opts.cluster, client_options(opts), meter_provider=measured.provider) as client:
            for ledger_id, first, last in part.pieces:
                handle = client.open_ledger(ledger_id, password=opts.password, recovery=False)
                for entry in handle.read(first, last):
                    for batch in decode_entry(entry.data):
                        rows += batch.num_rows
                        yield batch if batch.schema == target else conform(batch, target)
    finally:
        measured.rows_read.add(rows)
        measured.flush()


class OctavoReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.target = _arrow_schema(schema)

    def partitions(self) -> list[LedgerSlices]:
        manifest = _run(_manifest(self.opts))
        return _plan(self.opts, _pieces(self.opts, manifest.ledgers))

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LedgerSlices):  # PySpark's one empty partition when none was planned
            return iter(())
        return _read_slice(self.opts, self.target, partition)


class OctavoSkippingReader(OctavoReader):
    """A batch read with `data_skipping`: Spark's filters, pushed, prune the ledgers whose column statistics prove
    they hold no matching row. Every filter is handed back, so Spark still evaluates each one on the rows read:
    skipping changes what is read, never the result."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        super().__init__(opts, schema)
        self.schema = schema
        self.predicates: list[Predicate] = []
        self.skipped = 0

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.predicates = predicates(filters, self.schema)
        yield from filters

    def partitions(self) -> list[LedgerSlices]:
        manifest = _run(_manifest(self.opts))
        ledgers = list(manifest.ledgers)
        if self.predicates and ledgers:
            stats = _run(_ledger_stats(self.opts, ledgers))
            kept = [x for x, s in zip(ledgers, stats, strict=True) if may_match(s, self.predicates)]
            self.skipped = len(ledgers) - len(kept)
            log.info("dataset %s: data skipping read %d of %d ledgers (%s)", self.opts.dataset, len(kept),
                     len(ledgers), ", ".join(f"{p.column} {p.op}" for p in self.predicates))
            ledgers = kept
        return _plan(self.opts, _pieces(self.opts, ledgers))


async def _ledger_stats(opts: Options, ledgers: list[DatasetLedger]) -> list[LedgerStats | None]:
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        return await ledger_stats(client, ledgers)


class OctavoWriter(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, opts: Options, schema_json: str, mode: str) -> None:
        self.opts = opts
        self.schema_json = schema_json
        self.mode = mode
        self.write_id = new_write_id()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerWritten:
        return LedgerWritten(_run(write_ledger(self.opts, iterator, self.write_id)))

    def commit(self, messages: Any) -> None:
        _run(_commit(self.opts, self.schema_json, _written(messages), self.mode))

    def abort(self, messages: Any) -> None:
        _run(_delete(self.opts, [x.ledger_id for x in _written(messages)]))


class OctavoStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    def __init__(self, opts: Options, schema_json: str) -> None:
        self.opts = opts
        self.schema_json = schema_json
        self.write_id = new_write_id()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerWritten:
        return LedgerWritten(_run(write_ledger(self.opts, iterator, self.write_id)))

    def commit(self, messages: Any, batchId: int) -> None:
        _run(_commit(self.opts, self.schema_json, _written(messages), "append",
                     stream=(self.opts.stream_id, batchId)))

    def abort(self, messages: Any, batchId: int) -> None:
        _run(_delete(self.opts, [x.ledger_id for x in _written(messages)]))


class OctavoStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Offsets are {"seq": N}: everything committed up to commit sequence N has been read. A new query starts at
    `startingVersion` / `startingTimestamp` (earliest by default); `maxRowsPerTrigger` / `maxBytesPerTrigger`
    bound a micro-batch softly (whole commits, at least one), Trigger.AvailableNow included."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.target = _arrow_schema(schema)
        self.available_now: int | None = None  # Trigger.AvailableNow: the last seq at the query's start

    def initialOffset(self) -> dict[str, int]:
        return {"seq": _run(_starting_seq(self.opts))}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_rows_per_trigger:
            return ReadMaxRows(self.opts.max_rows_per_trigger)
        if self.opts.max_bytes_per_trigger:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = self._last_seq()

    def _last_seq(self) -> int:
        try:
            head = _run(_head(self.opts))
        except NoSuchDatasetError:
            return 0
        return int(head.last_seq)

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        last = self._last_seq()
        if self.available_now is not None:
            last = min(last, self.available_now)
        if start is None or limit is None or isinstance(limit, ReadAllAvailable) or last <= start["seq"]:
            return {"seq": max(last, start["seq"]) if start is not None else last}
        manifest = _run(_manifest(self.opts))
        return {"seq": _limited_end(manifest.ledgers, start["seq"], last, limit)}

    def reportLatestOffset(self) -> dict[str, int]:
        return {"seq": self._last_seq()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[LedgerSlices]:
        if end["seq"] <= start["seq"]:
            return []
        manifest = _run(_manifest(self.opts))
        return _plan(self.opts, _pieces(self.opts, manifest.ledgers, start["seq"], end["seq"]))

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        return _read_slice(self.opts, self.target, partition)

    def commit(self, end: dict[str, int]) -> None:
        return None


async def _starting_seq(opts: Options) -> int:
    """The offset a new streaming query starts from (its options)."""
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        if opts.starting_version == "earliest" and not opts.starting_timestamp_ms:
            return 0
        try:
            if opts.starting_version == "latest":
                return int((await client.datasets.head(opts.dataset)).last_seq)
            version = 0 if opts.starting_timestamp_ms else int(opts.starting_version)
            return await client.datasets.seq_before(opts.dataset, version, opts.starting_timestamp_ms)
        except NoSuchDatasetError:
            return 0


def _limited_end(ledgers: Sequence[DatasetLedger], after: int, last: int, limit: Any) -> int:
    """The highest seq in (after, last] whose commits fit the limit's rows or bytes, counted in seq order; at
    least the first seq with rows (a soft limit: one commit larger than the limit is read whole)."""
    rows: dict[int, float] = {}
    nbytes: dict[int, float] = {}
    for x in ledgers:
        for first, end, seq in x.seq_runs():
            if after < seq <= last and x.entries:
                share = (end - first + 1) / x.entries
                rows[seq] = rows.get(seq, 0.0) + x.rows * share
                nbytes[seq] = nbytes.get(seq, 0.0) + x.bytes * share
    budget = float(limit.max_rows if isinstance(limit, ReadMaxRows) else limit.max_bytes)
    sizes = rows if isinstance(limit, ReadMaxRows) else nbytes
    used, end_seq = 0.0, after
    for seq in sorted(sizes):
        if end_seq > after and used + sizes[seq] > budget:
            break
        used += sizes[seq]
        end_seq = seq
    return end_seq if end_seq > after else last
