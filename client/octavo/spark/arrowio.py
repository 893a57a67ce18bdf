"""Rows in ledger entries: Arrow IPC streams, many rows per entry; and the options of the data source.

An entry is one Arrow IPC stream (schema + one record batch, compressed with lz4 by default): self-describing,
readable without Spark (`pyarrow.ipc.open_stream(entry)`). A batch is sliced into `rows_per_entry` rows; a
slice whose encoding is over the entry limit is halved until it fits (one row over the limit is an error).
Tasks write their partition into one ledger with several appends in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import os
from collections.abc import AsyncIterable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from octavo.client.client import Client
from octavo.client.dataset import META_DATASET, META_WRITE, DatasetLedger, check_name
from octavo.client.options import ClientOptions
from octavo.meta.errors import EntryTooLargeError, OctavoError
from octavo.spark.skipping import StatsCollector

# Appended bytes a task keeps in flight (the client bounds this too); entries go out in groups of this size.
GROUP_BYTES = 1024 * 1024
ENTRY_BYTES_MAX = 4 * 1024 * 1024 - 64 * 1024  # under the bookies' default entry limit, room for framing
COMPRESSIONS = ("lz4", "zstd", "none")
# Reads plan by size, as Spark's spark.sql.files.maxPartitionBytes does for files: small ledgers share an input
# partition up to this many payload bytes, and a larger ledger is split into entry ranges of about this size.
MAX_PARTITION_BYTES_DEFAULT = 128 * 1024 * 1024
MAX_PARTITION_BYTES_MIN = 1024
MAX_PARTITION_BYTES_MAX = 1 << 40


class OptionError(ValueError):
    """A data-source option with a bad value; the message names it."""


@dataclass(frozen=True)
class Options:
    etcd: str
    dataset: str
    cluster: str = "default"
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    password: bytes = b""
    rows_per_entry: int = 8192
    compression: str = "lz4"
    key_column: str = ""
    orphan_grace_s: float = 3600.0
    stream_id: str = "default"
    entries_per_partition: int = 0  # reads: split ledgers into ranges of this many entries (0: by size)
    max_partition_bytes: int = MAX_PARTITION_BYTES_DEFAULT  # reads: small ledgers grouped up to this many bytes
    # Streaming reads: where a new query starts ("earliest", "latest", a version, or a time in unix ms), and soft
    # limits of a micro-batch (at least one commit's rows each; 0: none).
    version_as_of: int = 0  # batch reads: time travel to this version (0: the newest)
    timestamp_as_of_ms: int = 0  # batch reads: time travel to the version current at this time (0: now)
    merge_schema: bool = False  # appends: add the frame's new (nullable) columns to the dataset's schema
    data_skipping: bool = False  # batch reads: prune ledgers by their column statistics (pushFilters)
    starting_version: str = "earliest"
    starting_timestamp_ms: int = 0
    max_rows_per_trigger: int = 0
    max_bytes_per_trigger: int = 0
    columns: tuple[str, ...] = ()  # reads: project to these columns (empty: all)
    if_exists: str = "append"  # batch writes with Spark's mode append: append | error | ignore
    otlp_endpoint: str = ""  # push the tasks' and the client's metrics to this OpenTelemetry collector
    # TLS to the bookies and to etcd, etcd credentials (docs/security.md): the ClientOptions of the same names.
    tls: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def parse(options: Any) -> Options:
        o = {str(k).lower(): str(v) for k, v in dict(options).items()}
        unknown = sorted(set(o) - KNOWN_OPTIONS - SPARK_OPTIONS)
        if unknown:
            raise OptionError("; ".join(_unknown_option(name) for name in unknown))

        def integer(name: str, default: int, lo: int, hi: int) -> int:
            raw = o.get(name)
            if raw is None:
                return default
            try:
                value = int(raw)
            except ValueError:
                raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
            if not lo <= value <= hi:
                raise OptionError(f"option {name} must be in [{lo}, {hi}], got {value}")
            return value

        etcd = o.get("etcd", "")
        if not o:
            raise OptionError("the octavo data source got no options: PySpark passes none to a Python data source "
                              "for a catalog table (saveAsTable, CREATE TABLE ... USING octavo); read with "
                              "CREATE TEMPORARY VIEW v USING octavo OPTIONS (etcd '...', path '...') and write with "
                              "df.write.format('octavo').option('etcd', ...).save(name) (docs/spark.md, \"SQL\")")
        if not etcd:
            raise OptionError("option etcd is required: etcd endpoints host:port[,host:port...]")
        dataset = o.get("dataset") or o.get("path") or ""
        if not dataset:
            raise OptionError("option dataset is required (or pass the name to load()/save())")
        try:
            check_name(dataset)
        except OctavoError as e:
            raise OptionError(str(e)) from None
        password = o.get("password", "").encode()
        if "password_file" in o:
            try:
                with open(o["password_file"], "rb") as f:
                    password = f.read().strip()
            except OSError as e:
                raise OptionError(f"option password_file: cannot read {o['password_file']}: {e}") from None
        ensemble = integer("ensemble_size", 3, 1, 64)
        qw = integer("write_quorum", min(3, ensemble), 1, ensemble)
        qa = integer("ack_quorum", min(2, qw), 1, qw)
        compression = o.get("compression", "lz4").lower()
        if compression not in COMPRESSIONS:
            raise OptionError(f"option compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
        try:
            grace = float(o.get("orphan_grace_s", "3600"))
        except ValueError:
            raise OptionError(f"option orphan_grace_s must be a number, got {o['orphan_grace_s']!r}") from None
        columns = tuple(c.strip() for c in o.get("columns", "").split(",") if c.strip())
        starting_version = o.get("startingversion", "earliest").lower()
        if starting_version not in ("earliest", "latest") and not (starting_version.isdigit()
                                                                   and int(starting_version) >= 1):
            raise OptionError(f"option startingVersion must be earliest, latest or a version (1 or more), got "
                              f"{o['startingversion']!r}")
        starting_ms = _timestamp_ms(o["startingtimestamp"], "startingTimestamp") if "startingtimestamp" in o else 0
        if "versionasof" in o and "timestampasof" in o:
            raise OptionError("options versionAsOf and timestampAsOf exclude each other: give one")
        as_of_ms = _timestamp_ms(o["timestampasof"], "timestampAsOf") if "timestampasof" in o else 0
        if "startingversion" in o and "startingtimestamp" in o:
            raise OptionError("options startingVersion and startingTimestamp exclude each other: give one")
        if_exists = o.get("if_exists", "append").lower().replace("errorifexists", "error")
        if if_exists not in ("append", "error", "ignore"):
            raise OptionError(f"option if_exists must be append, error or ignore, got {if_exists!r}")
        return Options(etcd=etcd, dataset=dataset, cluster=o.get("cluster", "default"), ensemble_size=ensemble,
                       write_quorum=qw, ack_quorum=qa, password=password,
                       rows_per_entry=integer("rows_per_entry", 8192, 1, 10_000_000), compression=compression,
                       key_column=o.get("key_column", ""), orphan_grace_s=grace,
                       stream_id=o.get("stream_id", "default"),
                       entries_per_partition=integer("entries_per_partition", 0, 0, 1 << 40), columns=columns,
                       max_partition_bytes=integer("max_partition_bytes", MAX_PARTITION_BYTES_DEFAULT,
                                                   MAX_PARTITION_BYTES_MIN, MAX_PARTITION_BYTES_MAX),
                       if_exists=if_exists, otlp_endpoint=o.get("otlp_endpoint", ""),
                       starting_version=starting_version, starting_timestamp_ms=starting_ms,
                       version_as_of=integer("versionasof", 0, 1, 1 << 62), timestamp_as_of_ms=as_of_ms,
                       merge_schema=_boolean(o, "mergeschema"), data_skipping=_boolean(o, "data_skipping"),
                       max_rows_per_trigger=integer("maxrowspertrigger", 0, 1, 1 << 62),
                       max_bytes_per_trigger=integer("maxbytespertrigger", 0, 1, 1 << 62),
                       tls=tuple((name, o[name]) for name in TLS_OPTIONS if o.get(name)))


def encode_entries(batch: pa.RecordBatch, rows_per_entry: int, compression: str,
                   entry_bytes_max: int = ENTRY_BYTES_MAX) -> Iterator[tuple[bytes, int]]:
    """(entry bytes, rows) for a record batch."""
    options = pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
    for start in range(0, batch.num_rows, rows_per_entry):
        yield from _fitting(batch.slice(start, rows_per_entry), options, entry_bytes_max)


def _fitting(part: pa.RecordBatch, options: pa.ipc.IpcWriteOptions,
             entry_bytes_max: int) -> Iterator[tuple[bytes, int]]:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, part.schema, options=options) as writer:
        writer.write_batch(part)
    data = sink.getvalue().to_pybytes()
    if len(data) <= entry_bytes_max:
        yield data, part.num_rows
        return
    if part.num_rows <= 1:
        raise EntryTooLargeError(f"one row encodes to {len(data)} bytes, over the entry limit of {entry_bytes_max}")
    half = part.num_rows // 2
    yield from _fitting(part.slice(0, half), options, entry_bytes_max)
    yield from _fitting(part.slice(half), options, entry_bytes_max)


def decode_entry(data: bytes, columns: tuple[str, ...] = ()) -> list[pa.RecordBatch]:
    table = pa.ipc.open_stream(data).read_all()
    if columns:
        table = table.select(list(columns))
    batches: list[pa.RecordBatch] = table.to_batches()
    return batches


def _boolean(o: dict[str, str], name: str) -> bool:
    raw = o.get(name, "false").strip().lower()
    if raw not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, got {o[name]!r}")
    return raw == "true"


def _timestamp_ms(raw: str, option: str) -> int:
    """A time option: an ISO-8601 time (UTC unless it says otherwise) or unix milliseconds."""
    import datetime

    if raw.strip().isdigit():
        return int(raw)
    try:
        when = datetime.datetime.fromisoformat(raw.strip())
    except ValueError:
        raise OptionError(f"option {option} must be an ISO-8601 time (2026-11-25T10:00:00Z) or unix "
                          f"milliseconds, got {raw!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def _unknown_option(name: str) -> str:
    close = difflib.get_close_matches(name, sorted(KNOWN_OPTIONS), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f"; the options are {', '.join(sorted(KNOWN_OPTIONS))}"
    return f"unknown option {name}{hint}"


# Options passed as they are to ClientOptions: files every executor must be able to read (mount them).
TLS_OPTIONS = ("tls_ca_file", "tls_cert_file", "tls_key_file", "etcd_tls_ca_file", "etcd_tls_cert_file",
               "etcd_tls_key_file", "etcd_username", "etcd_password_file")
# Every option of the data source (docs/spark.md, "Options"); names are case-insensitive. Any other is refused
# at planning with the closest known name: a misspelled option must not read or write as if it were absent.
KNOWN_OPTIONS = frozenset({
    "etcd", "dataset", "path", "cluster", "ensemble_size", "write_quorum", "ack_quorum", "password",
    "password_file", "rows_per_entry", "compression", "key_column", "orphan_grace_s", "stream_id",
    "entries_per_partition", "max_partition_bytes", "columns", "if_exists", "otlp_endpoint", "startingversion",
    "startingtimestamp", "maxrowspertrigger", "maxbytespertrigger", "versionasof", "timestampasof", "mergeschema",
    "data_skipping", *TLS_OPTIONS})
# Options Spark itself passes to a data source on some paths (a load's paths, a stream's checkpoint location):
# accepted and ignored.
SPARK_OPTIONS = frozenset({"checkpointlocation", "paths"})


def client_options(opts: Options | None = None) -> ClientOptions:
    tls: dict[str, Any] = dict(opts.tls) if opts is not None else {}
    return ClientOptions(add_timeout_s=30.0, read_timeout_s=30.0, metadata_timeout_s=10.0, **tls)


async def write_ledger(opts: Options, batches: Iterable[Any] | AsyncIterable[Any], write_id: str,
                       in_flight_max: int = 8, with_seqs: bool = False) -> DatasetLedger | None:
    """Write record batches into a new ledger of the dataset; returns what the commit needs, or None when
    there was no row (no ledger is created for an empty partition). With `with_seqs` the batches come as
    (seq, batch) pairs, in seq order, and the ledger records which entries hold which seq (its segments:
    key compaction and merges keep the seq of every row)."""
    from octavo.spark.sparkmetrics import spark_metrics

    measured = spark_metrics(opts.otlp_endpoint)
    try:
        written = await _write_ledger(opts, batches, write_id, in_flight_max, measured.provider, with_seqs)
        if written is not None:
            measured.rows_written.add(written.rows)
            measured.bytes_written.add(written.bytes)
            measured.ledgers_written.add(1)
    finally:
        measured.flush()
    return written


async def _write_ledger(opts: Options, batches: Iterable[Any] | AsyncIterable[Any], write_id: str,
                        in_flight_max: int, meter_provider: Any, with_seqs: bool) -> DatasetLedger | None:
    async with Client(opts.etcd, opts.cluster, client_options(opts), meter_provider=meter_provider) as client:
        handle: Any = None
        try:
            rows = nbytes = entries = 0
            group: list[bytes] = []
            group_bytes = 0
            in_flight: list[asyncio.Future[list[int]]] = []
            segments: list[tuple[int, int]] = []
            stats = StatsCollector()  # column statistics, kept in the ledger's metadata (data skipping)

            async def send() -> None:
                nonlocal group, group_bytes
                in_flight.append(asyncio.ensure_future(handle.append_many(group)))
                group, group_bytes = [], 0
                while len(in_flight) >= in_flight_max:
                    await in_flight.pop(0)

            async def take(item: Any) -> None:
                nonlocal group_bytes, rows, nbytes, entries, handle
                seq, batch = item if with_seqs else (0, item)
                stats.add(batch)
                for data, n in encode_entries(batch, opts.rows_per_entry, opts.compression):
                    if handle is None:  # created at the first row: an empty partition writes no ledger
                        handle = await client.create_ledger(
                            opts.ensemble_size, opts.write_quorum, opts.ack_quorum, password=opts.password,
                            metadata={META_DATASET: opts.dataset, META_WRITE: write_id})
                    if with_seqs and (not segments or segments[-1][1] != seq):
                        segments.append((entries, seq))
                    group.append(data)
                    group_bytes += len(data)
                    rows += n
                    nbytes += len(data)
                    entries += 1
                    if group_bytes >= GROUP_BYTES:
                        await send()

            if isinstance(batches, AsyncIterable):
                async for item in batches:
                    await take(item)
            else:
                for item in batches:
                    await take(item)
            if handle is None:
                return None
            if group:
                await send()
            for f in in_flight:
                await f
            await handle.close(metadata=stats.metadata())
        except BaseException as e:
            if handle is not None:
                handle.abandon(OctavoError(f"the write of this partition failed: {e}"))
                with contextlib.suppress(Exception):  # else an orphan: collected after the grace period
                    await client.delete_ledger(handle.ledger_id)
            raise
        top = max((seq for _, seq in segments), default=0)
        return DatasetLedger(handle.ledger_id, rows, nbytes, entries, seq=top, segments=tuple(segments))


def new_write_id() -> str:
    return os.urandom(8).hex()
