"""Datasets: named sets of ledgers, published atomically through a commit log in etcd (docs/spark.md).

A dataset is what a Spark job writes and reads (`octavo.spark`). Its rows live in ledgers (Arrow IPC record
batches, many rows per entry). Which ledgers make it up is said by four kinds of etcd keys, none of which grows
with the dataset:

    /octavo/<cluster>/datasets/<name>                     the head: version, next commit sequence, key column,
                                                          streams' last batch ids, row/byte/ledger counts, the
                                                          checkpoint's version (a few hundred bytes)
    /octavo/<cluster>/dataset-schemas/<name>              the Spark schema (JSON), rewritten only when it changes
    /octavo/<cluster>/dataset-log/<name>/<version>        one small record per commit: the ledgers it added and
                                                          those it replaced (or, for a long list, the ledger
                                                          that holds them)
    /octavo/<cluster>/dataset-checkpoints/<name>/<version>  the dataset's ledgers as of a version: inline when
                                                          small, else in a ledger this key points to

A commit is one etcd transaction: compare the head's mod revision, put the new head and the commit's log record
(and the schema when it changed). Its cost is the same for a dataset of ten ledgers or a million. A reader of
the whole dataset reads the checkpoint and folds the log records after it; readers of the head (the schema, the
streaming source's latest offset, `octavo dataset ls`) read two small keys. From time to time the log is folded
into a new checkpoint (`checkpoint`: by the elected auditor's dataset maintenance every
CHECKPOINT_EVERY_COMMITS commits, and by a committer itself once the log reaches CHECKPOINT_FORCED_COMMITS),
and the records before the previous checkpoint are deleted.

Modes: append, overwrite, error-if-exists, ignore, and `replace` (compaction: swap exactly these ledgers for
new ones). A commit that loses a race reads the new head and tries again, with backoff, until it lands
(appends commute); only a real conflict fails it. A streaming batch records its batch id in the head in the
same transaction; a batch id at or below the stream's last one is a replay and is dropped (exactly once). A
stream idle for 7 days is forgotten, and a dataset keeps at most 10,000 (datasetstreams.py).

Ledgers that leave the dataset (overwrite, replace) are **retired**, not deleted: they stay readable for the
dataset's retention period (a read planned before the swap still finishes), then orphan collection deletes
them. Ledgers written for a dataset carry `octavo.dataset` in their custom metadata, so ledgers no version
references (a failed task's, an abandoned write's) are found and deleted after a grace period
(`collect_orphans`).

The format before this one kept every ledger in one etcd value (the head key's value had a "ledgers" list);
such a dataset is read as it is and moved to this format by its next commit.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from octavo.client.arguments import check_float, check_instance, check_int, check_str, type_name
from octavo.client.datasetstreams import remember_stream
from octavo.meta.errors import MetadataUnavailableError, NoSuchLedgerError, OctavoError
from octavo.meta.etcd import EtcdClient, Txn, prefix_end
from octavo.meta.layout import Layout
from octavo.meta.ledger_metadata import META_DATASET as META_DATASET
from octavo.meta.ledger_metadata import LedgerMetadata
from octavo.meta.retry import CasRetry

log = logging.getLogger(__name__)

DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
# The custom-metadata keys of a dataset's ledgers: META_DATASET (octavo.meta.ledger_metadata), this, and
# META_BLOB on the ledgers that hold a checkpoint or a long commit record (not rows).
META_WRITE = "octavo.write"
META_BLOB = "octavo.dataset-blob"
MODES = ("append", "overwrite", "error", "ignore")
FORMAT = 2
# Key compaction (octavo.spark.keycompact): offset-map slots (24 bytes each) and tombstone retention.
KEY_MAP_SLOTS_DEFAULT = 1 << 20
KEY_MAP_SLOTS_MAX = 1 << 28
TOMBSTONE_RETENTION_S_DEFAULT = 24 * 3600.0
# A commit that loses a race retries from the new head until it lands: only this much time (a real outage of
# etcd, or a pathological number of committers) makes it give up. Backoff: octavo.meta.retry (full jitter).
COMMIT_CONTENTION_TIMEOUT_S = 600.0
COMMIT_ATTEMPTS_MAX = 1_000_000  # never the binding bound: the timeout above is
COMMIT_DELAY_MS_MAX = 100.0
# The log is folded into a checkpoint by the dataset maintenance (the auditor) once it holds this many records,
# and by a committer itself once it holds the forced number (no maintenance running).
CHECKPOINT_EVERY_COMMITS = 100
CHECKPOINT_FORCED_COMMITS = 1000
# A commit record or a checkpoint larger than these goes into a ledger its key points to (etcd refuses a
# request over 1.5 MiB; small values keep etcd's history small).
RECORD_INLINE_BYTES_MAX = 64 * 1024
CHECKPOINT_INLINE_BYTES_MAX = 256 * 1024
BLOB_ENTRY_BYTES_MAX = 512 * 1024
# Ledgers that left the dataset stay readable this long (a read planned before an overwrite or a merge still
# finishes), then orphan collection deletes them.
RETIRED_RETENTION_S_DEFAULT = 3600.0
RETIRED_RETENTION_S_MAX = 30 * 86400.0
# A read of the whole dataset that raced a checkpoint (the log records it needed were deleted) starts over.
READ_ATTEMPTS_MAX = 5
# Orphan collection deletes what one pass found this many at a time, so the ids it holds stay bounded too.
ORPHANS_DELETED_PER_STEP = 1000
# The schema of a dataset (Spark StructType JSON) is bounded so the head's neighbour key stays small.
SCHEMA_BYTES_MAX = 256 * 1024

_HEADS = b"datasets/"
_SCHEMAS = b"dataset-schemas/"
_LOG = b"dataset-log/"
_CHECKPOINTS = b"dataset-checkpoints/"
_VERSION_DIGITS = 20


class DatasetError(OctavoError):
    """A dataset operation that cannot be done; the message says why."""


class DatasetExistsError(DatasetError):
    pass


class NoSuchDatasetError(DatasetError):
    pass


class DatasetConflictError(DatasetError):
    """A swap (`replace`) over ledgers that are gone: an overwrite, a merge or another compaction won. The
    caller's new ledgers were not published; it may read the dataset again and start over."""


def check_name(name: str) -> str:
    check_str("name", name)
    if not DATASET_NAME.match(name):
        raise DatasetError(f"dataset name must be 1 to 200 letters, digits, '.', '_' or '-' (not first), "
                           f"got {name!r}")
    return name


@dataclass(frozen=True)
class DatasetLedger:
    """One ledger of a dataset: its rows, payload bytes, entries, and when it was committed. `seq` orders
    commits (a streaming reader's offset is a seq): a ledger's rows carry its seq. A merged ledger keeps the
    seqs of the rows it took: `segments` lists (first entry, seq) runs in entry order (its entries from
    `first entry` up to the next run's have that seq), and `seq` is its highest."""

    ledger_id: int
    rows: int
    bytes: int
    entries: int
    seq: int = 0
    committed_unix_ms: int = 0
    segments: tuple[tuple[int, int], ...] = ()

    def seq_runs(self) -> list[tuple[int, int, int]]:
        """(first entry, last entry, seq) of every run of entries, in entry order."""
        if self.entries <= 0:
            return []
        if not self.segments:
            return [(0, self.entries - 1, self.seq)]
        bounds = [first for first, _ in self.segments[1:]] + [self.entries]
        return [(first, end - 1, seq) for (first, seq), end in zip(self.segments, bounds, strict=True)
                if end > first]

    def entries_in(self, after_seq: int, upto_seq: int) -> tuple[int, int] | None:
        """The entries whose seq is in (after_seq, upto_seq], as (first, last); None if there are none. Runs are
        in seq order, so they are one range."""
        runs = [(a, b) for a, b, s in self.seq_runs() if after_seq < s <= upto_seq]
        return (runs[0][0], runs[-1][1]) if runs else None

    def to_json(self) -> list[Any]:
        out: list[Any] = [self.ledger_id, self.rows, self.bytes, self.entries, self.seq, self.committed_unix_ms]
        if self.segments:
            out.append([list(s) for s in self.segments])
        return out

    @staticmethod
    def from_json(d: Any) -> DatasetLedger:
        if isinstance(d, dict):  # the format before 2
            return DatasetLedger(**d)
        segments = tuple((int(a), int(b)) for a, b in d[6]) if len(d) > 6 else ()
        return DatasetLedger(int(d[0]), int(d[1]), int(d[2]), int(d[3]), int(d[4]), int(d[5]), segments)


@dataclass
class DatasetHead:
    """What the head keys say: everything about a dataset but its list of ledgers (cheap to read)."""

    name: str
    schema: str  # the Spark schema as JSON (StructType.json())
    key_column: str = ""
    version: int = 0
    next_seq: int = 1
    streams: dict[str, int] = field(default_factory=dict)  # stream id -> last committed batch id
    rows: int = 0
    payload_bytes: int = 0
    ledger_count: int = 0
    created_unix_ms: int = 0
    updated_unix_ms: int = 0
    checkpoint: int = 0  # the version of the newest checkpoint (0: none, the log starts at version 1)
    schema_version: int = 0
    retention_s: float = RETIRED_RETENTION_S_DEFAULT
    format: int = FORMAT
    stream_seen: dict[str, int] = field(default_factory=dict)  # stream id -> its last commit, unix ms

    @property
    def last_seq(self) -> int:
        """The highest commit sequence number given so far (a streaming source's latest offset)."""
        return self.next_seq - 1

    def encode(self) -> bytes:
        d = asdict(self)
        del d["schema"]
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def decode(data: bytes, schema: str) -> DatasetHead:
        d = json.loads(data)
        known = set(DatasetHead.__dataclass_fields__) - {"schema"}
        return DatasetHead(schema=schema, **{k: v for k, v in d.items() if k in known})


@dataclass
class Manifest:
    """A whole version of a dataset: the head and its ledgers in dataset order (the order rows were
    committed; a merge keeps it). `retired` are the ledgers that left it within the retention period."""

    name: str
    schema: str  # the Spark schema as JSON (StructType.json())
    key_column: str = ""
    version: int = 0
    next_seq: int = 1
    ledgers: list[DatasetLedger] = field(default_factory=list)
    streams: dict[str, int] = field(default_factory=dict)  # stream id -> last committed batch id
    created_unix_ms: int = 0
    updated_unix_ms: int = 0
    retired: list[tuple[int, int]] = field(default_factory=list)  # (ledger id, retired at unix ms)
    retention_s: float = RETIRED_RETENTION_S_DEFAULT

    @property
    def rows(self) -> int:
        return sum(x.rows for x in self.ledgers)

    @property
    def payload_bytes(self) -> int:
        return sum(x.bytes for x in self.ledgers)

    def encode_v1(self) -> bytes:
        """The format before 2 (one etcd value with every ledger): for tests of the upgrade."""
        d = {"name": self.name, "schema": self.schema, "key_column": self.key_column, "version": self.version,
             "next_seq": self.next_seq, "streams": self.streams, "created_unix_ms": self.created_unix_ms,
             "updated_unix_ms": self.updated_unix_ms,
             "ledgers": [{k: v for k, v in asdict(x).items() if k != "segments"} for x in self.ledgers]}
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def decode_v1(data: bytes) -> Manifest:
        d = json.loads(data)
        ledgers = [DatasetLedger.from_json(x) for x in d.pop("ledgers", [])]
        known = set(Manifest.__dataclass_fields__)
        return Manifest(ledgers=ledgers, **{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class CommitResult:
    """What one commit did: the version it made (the current one when not applied), whether it applied (False:
    mode ignore on an existing dataset, or a replayed stream batch), the ledgers it added (with their seqs)
    and those it retired (overwrite, replace)."""

    version: int
    applied: bool
    replaced: list[int]
    added: list[DatasetLedger] = field(default_factory=list)
    head: DatasetHead | None = None


def merge_schemas(stored: str, given: str) -> str | None:
    """The schema of a dataset after appending rows of `given` (Spark StructType JSON): the same column names
    and types in the same order, a column nullable if either side is; None if they do not match."""
    a, b = json.loads(stored), json.loads(given)
    fa, fb = a.get("fields", []), b.get("fields", [])
    if [(f["name"], f["type"]) for f in fa] != [(f["name"], f["type"]) for f in fb]:
        return None
    if all(x.get("nullable") == y.get("nullable") for x, y in zip(fa, fb, strict=True)):
        return stored
    fields = [{**x, "nullable": bool(x.get("nullable") or y.get("nullable"))} for x, y in zip(fa, fb, strict=True)]
    return json.dumps({**a, "fields": fields}, sort_keys=True, separators=(",", ":"))


def evolve_schema(stored: str, given: str) -> str | None:
    """The schema after an append with mergeSchema: every stored column, by name, with its type (nullability
    merged), then the given columns the dataset lacks, as nullable columns (older rows read them as null).
    None if a stored column is missing or changed type."""
    a, b = json.loads(stored), json.loads(given)
    given_fields = {f["name"]: f for f in b.get("fields", [])}
    fields = []
    for f in a.get("fields", []):
        g = given_fields.get(f["name"])
        if g is None or g["type"] != f["type"]:
            return None
        fields.append({**f, "nullable": bool(f.get("nullable") or g.get("nullable"))})
    known = {f["name"] for f in a.get("fields", [])}
    extra = [{**f, "nullable": True} for f in b.get("fields", []) if f["name"] not in known]
    if not extra and all(x.get("nullable") == y.get("nullable") for x, y in zip(a.get("fields", []), fields,
                                                                                strict=True)):
        return stored
    return json.dumps({**a, "fields": fields + extra}, sort_keys=True, separators=(",", ":"))


def _check_commit_arguments(schema: Any, ledgers: Any, mode: Any, key_column: Any, stream: Any,
                            replace: Any) -> None:
    """Types only, once per commit (ranges and modes are checked where they are used)."""
    check_str("schema", schema)
    check_str("mode", mode)
    check_str("key_column", key_column)
    check_instance("ledgers", ledgers, list, "a list of DatasetLedger")
    for k, ledger in enumerate(ledgers):
        check_instance(f"ledgers[{k}]", ledger, DatasetLedger, "a DatasetLedger")
    if stream is not None:
        if not isinstance(stream, tuple) or len(stream) != 2:
            raise TypeError(f"stream must be a (stream id, batch id) tuple or None, got {type_name(stream)}")
        check_str("stream[0]", stream[0])
        check_int("stream[1]", stream[1])
    if replace is not None:
        check_instance("replace", replace, list, "a list of ledger ids or None")
        for k, ledger_id in enumerate(replace):
            check_int(f"replace[{k}]", ledger_id, minimum=0)


class BlobLedgers:
    """Checkpoints and long commit records that do not fit an etcd value, kept in ledgers (zlib-compressed
    JSON cut into entries). They carry the dataset's name in their metadata, so an abandoned one is an orphan
    like any other; a blob ledger's password is empty (what it holds is metadata, which etcd serves anyway)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def write(self, dataset: str, kind: str, data: bytes, like: int | None) -> int:
        """Write `data` into a new closed ledger; its quorums are those of ledger `like` (one of the dataset's,
        so the blob is as safe as the rows) or, without one, 3/3/2 capped by the writable bookies."""
        ensemble, write_quorum, ack_quorum = 3, 3, 2
        if like is not None:
            try:
                meta, _ = await self._client.metadata_store.read_ledger(like)
                ensemble, write_quorum, ack_quorum = meta.ensemble_size, meta.write_quorum, meta.ack_quorum
            except NoSuchLedgerError:
                pass
        if like is None:
            writable = len(await self._client.writable_bookies())
            ensemble = max(1, min(ensemble, writable))
            write_quorum = min(write_quorum, ensemble)
            ack_quorum = min(ack_quorum, write_quorum)
        packed = zlib.compress(data, 6)
        chunks = [packed[i:i + BLOB_ENTRY_BYTES_MAX] for i in range(0, len(packed), BLOB_ENTRY_BYTES_MAX)] or [b""]
        handle = await self._client.create_ledger(ensemble, write_quorum, ack_quorum,
                                                  metadata={META_DATASET: dataset, META_BLOB: kind})
        try:
            await handle.append_many(chunks)
            await handle.close()
        except BaseException:
            handle.abandon(DatasetError(f"the {kind} of dataset {dataset} could not be written"))
            raise
        return int(handle.ledger_id)

    async def read(self, ledger_id: int) -> bytes:
        handle = await self._client.open_ledger(ledger_id, recovery=False)
        parts = [entry.data async for entry in handle.read(0, handle.last_entry_id)]
        return zlib.decompress(b"".join(parts))


@dataclass
class _State:
    """A dataset's ledgers as of `version`, as the checkpoint and the log records after it say."""

    version: int
    ledgers: list[DatasetLedger]
    retired: list[tuple[int, int]]
    blobs: set[int]  # the blob ledgers this version still needs (its checkpoint's, its log records')
    schema: str = ""  # the schema at the checkpoint this state was loaded from, when it says


def _version_key(prefix: bytes, version: int) -> bytes:
    return prefix + str(version).zfill(_VERSION_DIGITS).encode()


def _records_of(kvs: Iterable[Any]) -> list[dict[str, Any]]:
    return [json.loads(kv.value) for kv in kvs]


class _LogGone(Exception):
    """The log records or the checkpoint a read needed were deleted by a newer checkpoint: read again."""


class DatasetStore:
    """Datasets in etcd. Ledger deletion goes through `delete_ledger` (the client's); checkpoints and long
    commit records that do not fit an etcd value go through `blobs` (without it they must fit)."""

    def __init__(self, etcd: EtcdClient, layout: Layout, delete_ledger: Any,
                 iter_ledgers: Callable[[], AsyncIterator[LedgerMetadata]], blobs: BlobLedgers | None = None) -> None:
        self.etcd = etcd
        self.layout = layout
        self._delete_ledger = delete_ledger
        self._iter_ledgers = iter_ledgers
        self.blobs = blobs

    # -- keys -------------------------------------------------------------------------------------------
    def key(self, name: str) -> bytes:
        """The head key."""
        return self.layout.root + _HEADS + check_name(name).encode()

    def _schema_key(self, name: str) -> bytes:
        return self.layout.root + _SCHEMAS + name.encode()

    def _log_prefix(self, name: str) -> bytes:
        return self.layout.root + _LOG + name.encode() + b"/"

    def _checkpoint_prefix(self, name: str) -> bytes:
        return self.layout.root + _CHECKPOINTS + name.encode() + b"/"

    # -- reads --------------------------------------------------------------------------------------------
    async def _read_head(self, name: str) -> tuple[DatasetHead | None, int, Manifest | None]:
        """(head, its mod revision, the whole manifest if the dataset is still in the format before 2): the
        head and the schema in one transaction, so they agree."""
        key = self.key(name)
        _, resp = await self.etcd.txn(Txn().get(key).get(self._schema_key(name)), read_only=True)
        heads, schemas = resp.responses[0].response_range.kvs, resp.responses[1].response_range.kvs
        if not heads:
            return None, 0, None
        value, revision = bytes(heads[0].value), int(heads[0].mod_revision)
        if b'"ledgers":' in value and b'"format":' not in value:
            manifest = Manifest.decode_v1(value)
            return _head_of_v1(manifest), revision, manifest
        schema = bytes(schemas[0].value).decode() if schemas else ""
        return DatasetHead.decode(value, schema), revision, None

    async def head(self, name: str) -> DatasetHead:
        """The dataset's head (schema, version, next sequence number, counts): two small keys, whatever the
        dataset's size."""
        head, _, _ = await self._read_head(name)
        if head is None:
            raise NoSuchDatasetError(f"dataset {name!r} does not exist")
        return head

    async def read(self, name: str) -> tuple[Manifest | None, int]:
        """The whole dataset and its head's mod revision; (None, 0) if it does not exist."""
        for _ in range(READ_ATTEMPTS_MAX):
            head, revision, v1 = await self._read_head(name)
            if head is None:
                return None, 0
            if v1 is not None:
                return v1, revision
            try:
                state = await self._state_at(name, head)
            except _LogGone:
                continue
            return _manifest(head, state), revision
        raise DatasetError(f"dataset {name!r}: could not read a whole version in {READ_ATTEMPTS_MAX} tries "
                           "(checkpoints kept replacing the log under the read)")

    async def get(self, name: str) -> Manifest:
        manifest, _ = await self.read(name)
        if manifest is None:
            raise NoSuchDatasetError(f"dataset {name!r} does not exist")
        return manifest

    async def names(self) -> list[str]:
        prefix = self.layout.root + _HEADS
        return [kv.key[len(prefix):].decode() for kv in await self.etcd.get_prefix(prefix, keys_only=True)]

    async def seq_before(self, name: str, version: int = 0, unix_ms: int = 0) -> int:
        """Where a streaming read that starts at commit `version` (or at the first commit at or after `unix_ms`)
        begins: the last seq given before that commit. Versions past the newest give the newest seq. The commit
        must still be in the log (the log keeps the records since the checkpoint before the newest one)."""
        head, _, v1 = await self._read_head(name)
        if head is None:
            raise NoSuchDatasetError(f"dataset {name!r} does not exist")
        if version == 1 or (unix_ms and unix_ms <= head.created_unix_ms):
            return 0
        if (version and version > head.version) or (unix_ms and unix_ms > head.updated_unix_ms):
            return head.last_seq
        records = [] if v1 is not None else await self._records(name, 1, head.version)
        for r in records:
            if (version and r["v"] == version) or (unix_ms and r["ms"] >= unix_ms):
                if unix_ms and r["v"] == records[0]["v"] and r["v"] > 1 and r["ms"] > unix_ms:
                    break  # the commit at that time may be older than the log kept
                return int(r["seq"]) - 1
        kept = f"versions {records[0]['v']} to {records[-1]['v']}" if records else "no version"
        wanted = f"version {version}" if version else f"the time {unix_ms} (unix ms)"
        raise DatasetError(f"dataset {name!r}: {wanted} is older than the commit log it keeps ({kept}); start "
                           "from earliest or a later version")

    async def _records(self, name: str, first: int, last: int) -> list[dict[str, Any]]:
        """The log records of versions [first, last], a page at a time (a record is at most
        RECORD_INLINE_BYTES_MAX, a page is 64 of them: no etcd answer nears its message limit)."""
        out: list[dict[str, Any]] = []
        if last < first:
            return out
        prefix = self._log_prefix(name)
        start, end = _version_key(prefix, first), _version_key(prefix, last + 1)
        while True:
            page = await self.etcd.range_page(start, end, 64)
            out += _records_of(page)
            if len(page) < 64:
                return out
            start = page[-1].key + b"\0"

    async def _state_at(self, name: str, head: DatasetHead) -> _State:
        """The dataset's ledgers at the head's version: its checkpoint, then the log records after it."""
        state = _State(0, [], [], set())
        if head.checkpoint:
            kv = await self.etcd.get(_version_key(self._checkpoint_prefix(name), head.checkpoint))
            if kv is None:
                raise _LogGone()
            state = await self._load_checkpoint(json.loads(kv.value))
        return await self._fold_records(name, state, head.version)

    async def _load_checkpoint(self, value: dict[str, Any]) -> _State:
        blobs: set[int] = set()
        if "blob" in value:
            if self.blobs is None:
                raise DatasetError("this dataset's checkpoint is in a ledger: reading it needs a client")
            payload = json.loads(await self.blobs.read(int(value["blob"])))
            blobs.add(int(value["blob"]))
        else:
            payload = value["inline"]
        return _State(int(value["v"]), [DatasetLedger.from_json(x) for x in payload["ledgers"]],
                      [(int(a), int(b)) for a, b in payload.get("retired", [])], blobs, payload.get("schema", ""))

    async def _fold_records(self, name: str, state: _State, version: int) -> _State:
        records = await self._records(name, state.version + 1, version)
        if [r["v"] for r in records] != list(range(state.version + 1, version + 1)):
            raise _LogGone()
        for record in records:
            await self._fold(state, record)
        return state

    async def _catch_up(self, name: str, state: _State | None, head: DatasetHead) -> _State:
        """`state` brought to the head's version (read whole if there is none, or the log it needs is gone)."""
        for _ in range(READ_ATTEMPTS_MAX):
            try:
                if state is not None and state.version <= head.version:
                    return await self._fold_records(name, state, head.version)
                return await self._state_at(name, head)
            except _LogGone:
                state = None
                fresh, _, _ = await self._read_head(name)
                if fresh is None or fresh.version != head.version:
                    raise _Retry() from None  # the head moved on: the caller starts over
        raise DatasetError(f"dataset {name!r}: could not read version {head.version} in {READ_ATTEMPTS_MAX} tries")

    async def _body(self, record: dict[str, Any]) -> dict[str, Any]:
        if "blob" not in record:
            return record
        if self.blobs is None:
            raise DatasetError("this commit record is in a ledger: reading it needs a client")
        body: dict[str, Any] = json.loads(await self.blobs.read(int(record["blob"])))
        return body

    async def _fold(self, state: _State, record: dict[str, Any]) -> None:
        """Apply one commit record to the state (the same rules as the commit that wrote it)."""
        body = await self._body(record)
        if "blob" in record:
            state.blobs.add(int(record["blob"]))
        ms, seq0, op = int(record["ms"]), int(record["seq"]), record["op"]
        added = [DatasetLedger.from_json(x) for x in body.get("add", [])]
        if op == "replace":
            gone = set(body.get("replace", []))
            old = state.ledgers
            first = next((i for i, x in enumerate(old) if x.ledger_id in gone), len(old))
            top = max((x.seq for x in old if x.ledger_id in gone), default=0)
            new = [_replacing(x, top, ms) for x in added]
            state.retired += [(x.ledger_id, ms) for x in old if x.ledger_id in gone]
            state.ledgers = ([x for x in old[:first] if x.ledger_id not in gone] + new
                             + [x for x in old[first:] if x.ledger_id not in gone])
        else:
            new = [DatasetLedger(x.ledger_id, x.rows, x.bytes, x.entries, seq0 + i, ms)
                   for i, x in enumerate(added)]
            if op == "overwrite":
                state.retired += [(x.ledger_id, ms) for x in state.ledgers]
                state.ledgers = new
            else:
                state.ledgers += new
        state.version = int(record["v"])

    # -- commits ------------------------------------------------------------------------------------------
    async def commit(self, name: str, schema: str, ledgers: list[DatasetLedger], mode: str = "append",
                     key_column: str = "", stream: tuple[str, int] | None = None,
                     replace: list[int] | None = None, merge_schema: bool = False) -> CommitResult:
        """Publish `ledgers` in one etcd transaction. `replace` (compaction) swaps exactly those ledgers for the
        new ones, which take the place of the first of them, and fails if any of them is gone; the new
        ledgers' seqs are kept (a merged ledger's segments) or, when they carry none, the highest they replace.
        A commit that loses a race reads the new head and tries again until it lands (backoff with jitter;
        COMMIT_CONTENTION_TIMEOUT_S bounds it). Ledgers of a commit that is not applied (ignored, a replayed
        batch) are deleted; ledgers replaced are retired (deleted after the dataset's retention period)."""
        _check_commit_arguments(schema, ledgers, mode, key_column, stream, replace)
        if mode not in MODES:
            raise DatasetError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        check_name(name)
        if len(schema.encode()) > SCHEMA_BYTES_MAX:
            raise DatasetError(f"the schema is {len(schema.encode())} bytes, over {SCHEMA_BYTES_MAX}")
        op = "replace" if replace is not None else ("overwrite" if mode == "overwrite" else "append")
        ids = [x.ledger_id for x in ledgers]
        if len(set(ids)) != len(ids):
            raise DatasetError(f"dataset {name!r}: a ledger is listed twice in one commit")
        body: dict[str, list[Any]] = {"add": [x.to_json() for x in ledgers], "replace": sorted(set(replace or []))}
        packed = json.dumps(body, separators=(",", ":")).encode()
        blob: int | None = None
        token = uuid.uuid4().hex[:16]
        retry = CasRetry(f"dataset {name}: commit", COMMIT_ATTEMPTS_MAX, delay_ms_max=COMMIT_DELAY_MS_MAX,
                         error=DatasetError)
        deadline = time.monotonic() + COMMIT_CONTENTION_TIMEOUT_S
        state: _State | None = None
        unsure_from = 0  # after a transaction with no answer: the version from which our record may be
        while True:
            head, revision, v1 = await self._read_head(name)
            if v1 is not None:
                await self._migrate(name, v1, revision)
                continue
            if unsure_from and head is not None:
                mine = await self._find_own(name, unsure_from, head, token)
                if mine is not None:
                    return mine
            if head is not None:
                if mode == "error":
                    raise DatasetExistsError(f"dataset {name!r} already exists (mode error-if-exists); use append "
                                             "or overwrite")
                replayed = stream is not None and head.streams.get(stream[0], -1) >= stream[1]
                if mode == "ignore" or replayed:
                    await self._delete_quietly(ids)
                    return CommitResult(head.version, False, [], [], head)
            elif op == "replace":
                raise NoSuchDatasetError(f"dataset {name!r} does not exist (it was dropped under the compaction)")
            now = int(time.time() * 1000)
            new = _successor(head, name, schema, key_column, now)
            if head is not None and op == "append":
                merged = (evolve_schema(head.schema, schema) if merge_schema
                          else merge_schemas(head.schema, schema))
                if merged is None:
                    hint = " (mergeSchema adds columns; it changes the type of none and drops none)" if merge_schema \
                        else ""
                    raise DatasetError(f"dataset {name!r} has another schema; append needs the same columns and "
                                       f"types{hint} (stored: {head.schema}; given: {schema})")
                new.schema = merged
            elif head is not None and op == "overwrite":
                new.schema = schema
                new.key_column = key_column or head.key_column
            removed: list[DatasetLedger] = []
            if head is not None and op != "append":
                try:
                    state = await self._catch_up(name, state, head)
                except _Retry:
                    state = None
                    continue
                if op == "replace":
                    present = {x.ledger_id: x for x in state.ledgers}
                    missing = sorted(set(body["replace"]) - set(present))
                    if missing:
                        raise DatasetConflictError(f"dataset {name!r} changed under the compaction: ledgers "
                                                   f"{missing} are gone")
                    removed = [present[i] for i in body["replace"]]
                else:
                    removed = list(state.ledgers)
            seq0 = new.next_seq
            if op == "replace":
                top = max((x.seq for x in removed), default=0)
                added = [_replacing(x, top, now) for x in ledgers]
            else:
                added = [DatasetLedger(x.ledger_id, x.rows, x.bytes, x.entries, seq0 + i, now)
                         for i, x in enumerate(ledgers)]
                new.next_seq += len(added)
            if op == "overwrite":
                new.rows, new.payload_bytes, new.ledger_count = 0, 0, 0
            new.rows += sum(x.rows for x in added) - (sum(x.rows for x in removed) if op == "replace" else 0)
            new.payload_bytes += (sum(x.bytes for x in added)
                                  - (sum(x.bytes for x in removed) if op == "replace" else 0))
            new.ledger_count += len(added) - (len(removed) if op == "replace" else 0)
            if stream is not None and (refused := remember_stream(new, stream, now, head)):
                raise DatasetError(f"dataset {name!r} refuses stream {stream[0]!r}: {refused}")
            schema_changed = head is None or new.schema != head.schema
            # What `octavo dataset history` shows, and the schema when it changed (a time-travel read needs it).
            record: dict[str, Any] = {"v": new.version, "t": token, "ms": now, "op": op, "seq": seq0,
                                      "rows": sum(x.rows for x in added), "removed": len(removed),
                                      "removed_rows": sum(x.rows for x in removed)}
            if stream is not None:
                record["stream"] = [stream[0], stream[1]]
            if schema_changed:
                record["schema"] = new.schema
            if len(packed) <= RECORD_INLINE_BYTES_MAX:
                record.update(body)
            else:
                if blob is None:
                    if self.blobs is None:
                        raise DatasetError(f"dataset {name!r}: a commit of {len(ledgers)} ledgers needs a client "
                                           "to keep its record in a ledger")
                    blob = await self.blobs.write(name, "commit", packed, ids[0] if ids else None)
                record["blob"] = blob
            key = self.key(name)
            txn = (Txn().mod_revision_is(key, revision)
                   .put(_version_key(self._log_prefix(name), new.version),
                        json.dumps(record, separators=(",", ":")).encode()))
            if schema_changed:
                new.schema_version += 1 if head is not None else 0
                txn.put(self._schema_key(name), new.schema.encode())
            txn.put(key, new.encode())
            try:
                ok, _ = await self.etcd.txn(txn)
            except MetadataUnavailableError as e:
                # No answer: the transaction may have been applied. The next round looks for our record.
                unsure_from = unsure_from or new.version
                if time.monotonic() > deadline:
                    raise
                await retry.lost(f"no answer from etcd ({e})")
                continue
            if ok:
                if new.version - new.checkpoint >= CHECKPOINT_FORCED_COMMITS:
                    await self._checkpoint_quietly(name)
                return CommitResult(new.version, True, [x.ledger_id for x in removed], added, new)
            if time.monotonic() > deadline:
                raise DatasetError(f"dataset {name!r}: commit lost its race for {COMMIT_CONTENTION_TIMEOUT_S:.0f}s "
                                   f"({retry.lost_count} times; COMMIT_CONTENTION_TIMEOUT_S)")
            await retry.lost(f"another commit to the dataset (its head was at version {new.version - 1})")

    async def _find_own(self, name: str, first: int, head: DatasetHead, token: str) -> CommitResult | None:
        """After a transaction that got no answer: our record among versions [first, head], if it landed."""
        try:
            records = await self._records(name, first, head.version)
        except MetadataUnavailableError:
            return None
        for r in records:
            if r.get("t") == token:
                body = await self._body(r)
                added = [DatasetLedger.from_json(x) for x in body.get("add", [])]
                if r["op"] != "replace":
                    added = [DatasetLedger(x.ledger_id, x.rows, x.bytes, x.entries, int(r["seq"]) + i, int(r["ms"]))
                             for i, x in enumerate(added)]
                return CommitResult(int(r["v"]), True, list(body.get("replace", [])), added, head)
        return None

    async def _migrate(self, name: str, manifest: Manifest, revision: int) -> None:
        """Move a dataset from the format before 2 (one value with every ledger) to a head and a checkpoint
        (one transaction on the old value's revision; a lost race is harmless: the caller reads again)."""
        version = max(1, manifest.version)
        state = _State(version, list(manifest.ledgers), [], set())
        value = await self._checkpoint_value(name, state, [], manifest.schema)
        head = DatasetHead(name, manifest.schema, manifest.key_column, version, manifest.next_seq,
                           dict(manifest.streams), manifest.rows, manifest.payload_bytes, len(manifest.ledgers),
                           manifest.created_unix_ms, manifest.updated_unix_ms, checkpoint=version)
        key = self.key(name)
        ok, _ = await self.etcd.txn(
            Txn().mod_revision_is(key, revision).put(key, head.encode())
            .put(self._schema_key(name), manifest.schema.encode())
            .put(_version_key(self._checkpoint_prefix(name), version), value))
        if ok:
            log.info("dataset %s: moved to format %d at version %d (%d ledgers)", name, FORMAT, version,
                     len(manifest.ledgers))

    async def set_retention(self, name: str, retention_s: float) -> None:
        """How long ledgers that left the dataset (overwrite, merge, key compaction) stay readable before
        orphan collection deletes them: long enough for the longest read planned before a swap to finish."""
        retention_s = check_float("retention_s", retention_s, minimum=0)
        if retention_s > RETIRED_RETENTION_S_MAX:
            raise DatasetError(f"retention_s must be at most {RETIRED_RETENTION_S_MAX:.0f}, got {retention_s}")
        retry = CasRetry(f"dataset {name}: retention", COMMIT_ATTEMPTS_MAX, delay_ms_max=COMMIT_DELAY_MS_MAX,
                         error=DatasetError)
        deadline = time.monotonic() + COMMIT_CONTENTION_TIMEOUT_S
        while True:
            head, revision, v1 = await self._read_head(name)
            if head is None:
                raise NoSuchDatasetError(f"dataset {name!r} does not exist")
            if v1 is not None:
                await self._migrate(name, v1, revision)
                continue
            head.retention_s = retention_s
            key = self.key(name)
            ok, _ = await self.etcd.txn(Txn().mod_revision_is(key, revision).put(key, head.encode()))
            if ok:
                return
            if time.monotonic() > deadline:
                raise DatasetError(f"dataset {name!r}: retention change lost its race for "
                                   f"{COMMIT_CONTENTION_TIMEOUT_S:.0f}s")
            await retry.lost("a commit to the dataset")

    # -- checkpoints --------------------------------------------------------------------------------------
    async def _checkpoint_value(self, name: str, state: _State, retired: list[tuple[int, int]],
                                schema: str = "") -> bytes:
        payload = {"v": state.version, "ledgers": [x.to_json() for x in state.ledgers], "retired": retired,
                   "schema": schema}
        data = json.dumps(payload, separators=(",", ":")).encode()
        if len(data) <= CHECKPOINT_INLINE_BYTES_MAX:
            return json.dumps({"v": state.version, "inline": payload}, separators=(",", ":")).encode()
        if self.blobs is None:
            raise DatasetError(f"dataset {name!r}: a checkpoint of {len(state.ledgers)} ledgers needs a client to "
                               "keep it in a ledger")
        like = state.ledgers[0].ledger_id if state.ledgers else None
        blob = await self.blobs.write(name, "checkpoint", data, like)
        return json.dumps({"v": state.version, "blob": blob}, separators=(",", ":")).encode()

    async def checkpoint(self, name: str, min_records: int = CHECKPOINT_EVERY_COMMITS) -> int | None:
        """Fold the log into a checkpoint when it holds at least `min_records` records; returns the version
        checkpointed, or None. Then the records older than the dataset's retention period and before the previous
        checkpoint are deleted, with the checkpoints no kept version needs: a reader of the previous head still
        finds what it needs, and a version within the retention period can still be read (time travel)."""
        check_int("min_records", min_records, minimum=1)
        head, _, v1 = await self._read_head(name)
        if head is None or v1 is not None or head.version - head.checkpoint < min_records:
            return None
        try:
            state = await self._catch_up(name, None, head)
        except _Retry:
            return None
        now = int(time.time() * 1000)
        keep_from = now - int(head.retention_s * 1000)
        retired = [(i, ms) for i, ms in state.retired if ms >= keep_from] + [(b, now) for b in sorted(state.blobs)]
        cp_key = _version_key(self._checkpoint_prefix(name), state.version)
        value = await self._checkpoint_value(name, state, retired, head.schema)
        ok, _ = await self.etcd.txn(Txn().mod_revision_is(cp_key, 0).put(cp_key, value).get_on_failure(cp_key))
        if not ok:  # another maintainer wrote it first: theirs stands, ours (if a ledger) is an orphan
            blob = json.loads(value).get("blob")
            if blob is not None:
                await self._delete_quietly([int(blob)])
        key = self.key(name)
        retry = CasRetry(f"dataset {name}: checkpoint", COMMIT_ATTEMPTS_MAX, delay_ms_max=COMMIT_DELAY_MS_MAX,
                         error=DatasetError)
        deadline = time.monotonic() + COMMIT_CONTENTION_TIMEOUT_S
        while True:
            current, revision, _ = await self._read_head(name)
            if current is None or current.checkpoint >= state.version:
                return None
            cut = await self._expired_through(name, current.checkpoint, keep_from)
            current.checkpoint = state.version
            log_prefix, cp_prefix = self._log_prefix(name), self._checkpoint_prefix(name)
            txn = Txn().mod_revision_is(key, revision).put(key, current.encode())
            if cut:
                base = await self._checkpoint_at_or_before(name, cut)
                txn.delete_range(log_prefix, _version_key(log_prefix, cut + 1))
                txn.delete_range(cp_prefix, _version_key(cp_prefix, base))
            ok, _ = await self.etcd.txn(txn)
            if ok:
                log.info("dataset %s: checkpoint at version %d (%d ledgers)", name, state.version,
                         len(state.ledgers))
                return state.version
            if time.monotonic() > deadline:
                raise DatasetError(f"dataset {name!r}: checkpoint lost its race for "
                                   f"{COMMIT_CONTENTION_TIMEOUT_S:.0f}s")
            await retry.lost("a commit to the dataset")

    async def _expired_through(self, name: str, previous: int, keep_from_ms: int) -> int:
        """The highest version up to `previous` (the checkpoint before the new one) whose record is older than
        the retention period: the records up to it can go. Reads the oldest records a page at a time and stops
        at the first one still kept."""
        if not previous:
            return 0
        prefix = self._log_prefix(name)
        start, end = prefix, _version_key(prefix, previous + 1)
        cut = 0
        while True:
            page = await self.etcd.range_page(start, end, 64)
            for r in _records_of(page):
                if int(r["ms"]) >= keep_from_ms:
                    return cut
                cut = int(r["v"])
            if len(page) < 64:
                return cut
            start = page[-1].key + b"\0"

    async def _checkpoint_at_or_before(self, name: str, version: int) -> int:
        """The newest checkpoint at or before `version` (0: none): the base from which later versions fold."""
        prefix = self._checkpoint_prefix(name)
        keys = await self.etcd.range_page(prefix, _version_key(prefix, version + 1), 10_000, keys_only=True)
        return max((int(kv.key[len(prefix):]) for kv in keys), default=0)

    async def version_at(self, name: str, unix_ms: int) -> int:
        """The version a read `timestampAsOf` unix_ms sees: the newest commit at or before that time."""
        head, _, _ = await self._read_head(name)
        if head is None:
            raise NoSuchDatasetError(f"dataset {name!r} does not exist")
        if unix_ms >= head.updated_unix_ms:
            return head.version
        records = await self._records(name, 1, head.version)
        older = [int(r["v"]) for r in records if int(r["ms"]) <= unix_ms]
        if not older:
            raise DatasetError(f"dataset {name!r} has no version at {unix_ms} (unix ms) that it still keeps: its "
                               f"commit log starts at version {records[0]['v'] if records else head.version}")
        return max(older)

    async def get_version(self, name: str, version: int) -> Manifest:
        """The dataset as it was at `version` (time travel): the newest checkpoint at or before it and the
        records up to it, while the retention period keeps them (and the ledgers they name)."""
        check_int("version", version, minimum=1)
        head, _, v1 = await self._read_head(name)
        if head is None:
            raise NoSuchDatasetError(f"dataset {name!r} does not exist")
        if version > head.version:
            raise DatasetError(f"dataset {name!r} has versions 1 to {head.version}, not {version}")
        if version == head.version:
            return await self.get(name)
        gone = DatasetError(f"version {version} of dataset {name!r} is no longer kept: its commit log and "
                            f"checkpoints keep about the last {head.retention_s:.0f}s (the retention period; "
                            "DatasetStore.set_retention), and the ledgers that left it since were deleted")
        if v1 is not None:
            raise gone
        base = await self._checkpoint_at_or_before(name, version)
        state = _State(0, [], [], set())
        schema = ""
        if base:
            kv = await self.etcd.get(_version_key(self._checkpoint_prefix(name), base))
            if kv is None:
                raise gone
            value = json.loads(kv.value)
            try:
                state = await self._load_checkpoint(value)
            except NoSuchLedgerError:  # its ledger was retired, then collected: the version is past keeping
                raise gone from None
            schema = (value.get("inline") or {}).get("schema", "") or state.schema
        records = await self._records(name, base + 1, version)
        if [r["v"] for r in records] != list(range(base + 1, version + 1)):
            raise gone
        created, updated = head.created_unix_ms, head.created_unix_ms
        for record in records:
            await self._fold(state, record)
            schema = record.get("schema", schema)
            updated = int(record["ms"])
        next_seq = max((x.seq for x in state.ledgers), default=0) + 1  # what a reader of this version needs
        return Manifest(name, schema or head.schema, head.key_column, version, next_seq, state.ledgers, {}, created,
                        updated, state.retired, head.retention_s)

    async def history(self, name: str) -> list[dict[str, Any]]:
        """The commits the log still keeps, oldest first: version, time, operation, stream and batch, ledgers and
        rows added and removed (`octavo dataset history`)."""
        head, _, v1 = await self._read_head(name)
        if head is None:
            raise NoSuchDatasetError(f"dataset {name!r} does not exist")
        if v1 is not None:
            return []
        out = []
        for r in await self._records(name, 1, head.version):
            body = await self._body(r)
            out.append({"version": int(r["v"]), "unix_ms": int(r["ms"]), "operation": r["op"],
                        "stream": r.get("stream"), "ledgers_added": len(body.get("add", [])),
                        "rows_added": r.get("rows"), "ledgers_removed": r.get("removed"),
                        "rows_removed": r.get("removed_rows"), "schema_changed": "schema" in r})
        return out

    async def _checkpoint_quietly(self, name: str) -> None:
        try:
            await self.checkpoint(name, CHECKPOINT_FORCED_COMMITS)
        except OctavoError as e:  # the commit itself landed; the next one or the maintenance tries again
            log.warning("dataset %s: checkpoint failed: %s", name, e)

    # -- deletion -----------------------------------------------------------------------------------------
    async def drop(self, name: str) -> list[int]:
        """Delete a dataset: its keys first (readers stop seeing it), then its ledgers."""
        manifest, revision = await self.read(name)
        if manifest is None:
            raise NoSuchDatasetError(f"dataset {name!r} does not exist")
        state = await self._referenced(name)
        key = self.key(name)
        log_prefix, cp_prefix = self._log_prefix(name), self._checkpoint_prefix(name)
        ok, _ = await self.etcd.txn(Txn().mod_revision_is(key, revision).delete(key).delete(self._schema_key(name))
                                    .delete_range(log_prefix, prefix_end(log_prefix))
                                    .delete_range(cp_prefix, prefix_end(cp_prefix)))
        if not ok:
            raise DatasetError(f"dataset {name!r} changed while it was being dropped; try again")
        ids = [x.ledger_id for x in manifest.ledgers]
        await self._delete_quietly(ids + sorted(state - set(ids)))
        return ids

    async def _referenced(self, name: str, now_ms: float | None = None) -> set[int]:
        """Every ledger the dataset still needs: its ledgers, those retired within the retention period, the
        blob ledgers of its checkpoint and of the log records after it. Empty if it does not exist."""
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        for _ in range(READ_ATTEMPTS_MAX):
            head, _, v1 = await self._read_head(name)
            if head is None:
                return set()
            if v1 is not None:
                return {x.ledger_id for x in v1.ledgers}
            try:
                state = await self._state_at(name, head)
            except _LogGone:
                continue
            keep_from = now_ms - head.retention_s * 1000
            return ({x.ledger_id for x in state.ledgers} | {i for i, ms in state.retired if ms >= keep_from}
                    | state.blobs)
        raise DatasetError(f"dataset {name!r}: could not read a whole version in {READ_ATTEMPTS_MAX} tries")

    async def collect_orphans(self, name: str, grace_s: float) -> list[int]:
        """Delete the ledgers written for `name` that it does not need (see _referenced) and that are older than
        `grace_s` (a write still running has not committed yet). Returns the ids deleted.

        The ledgers' metadata is read a page at a time and each page's orphans are deleted before the next
        is read: memory stays one page (the etcd client's range_page_keys), however many ledgers there are."""
        grace_s = check_float("grace_s", grace_s, minimum=0)
        check_name(name)
        deleted = await self._collect({name}, grace_s)
        return deleted.get(name, [])

    async def collect_all_orphans(self, grace_s: float) -> dict[str, list[int]]:
        """collect_orphans for every dataset in one pass over the cluster's ledgers (the maintenance's)."""
        grace_s = check_float("grace_s", grace_s, minimum=0)
        return await self._collect(None, grace_s)

    async def _collect(self, only: set[str] | None, grace_s: float) -> dict[str, list[int]]:
        now = time.time() * 1000
        cutoff = now - grace_s * 1000
        referenced: dict[str, set[int]] = {}
        deleted: dict[str, list[int]] = {}
        doomed: list[tuple[str, int]] = []

        async def flush() -> None:
            nonlocal doomed
            for dataset, lid in doomed:
                if await self._delete_quietly([lid]):
                    deleted.setdefault(dataset, []).append(lid)
            doomed = []

        async for meta in self._iter_ledgers():
            dataset = meta.custom_metadata.get(META_DATASET)
            if dataset is None or (only is not None and dataset not in only) or meta.created_unix_ms >= cutoff:
                continue
            if dataset not in referenced:
                referenced[dataset] = (await self._referenced(dataset, now) if DATASET_NAME.match(dataset)
                                       else set())
            if meta.ledger_id not in referenced[dataset]:
                doomed.append((dataset, meta.ledger_id))
            if len(doomed) >= ORPHANS_DELETED_PER_STEP:
                await flush()
        await flush()
        for dataset, ids in deleted.items():
            log.info("dataset %s: deleted %d orphan ledgers", dataset, len(ids))
        return deleted

    async def has_ledgers(self, name: str) -> bool:
        """Some ledger was written for dataset `name` (committed or not)."""
        check_name(name)
        async for meta in self._iter_ledgers():
            if meta.custom_metadata.get(META_DATASET) == name:
                return True
        return False

    async def _delete_quietly(self, ledger_ids: list[int]) -> list[int]:
        """Delete ledgers, logging what fails (orphan collection retries it). Returns the ids deleted now."""
        deleted = []
        for lid in ledger_ids:
            try:
                await self._delete_ledger(lid)
            except NoSuchLedgerError:
                continue
            except OctavoError as e:  # orphan collection retries it
                log.warning("could not delete ledger %d: %s", lid, e)
                continue
            deleted.append(lid)
        return deleted


class _Retry(Exception):
    """The head moved while a commit read the dataset: start the round again."""


def _successor(head: DatasetHead | None, name: str, schema: str, key_column: str, now: int) -> DatasetHead:
    if head is None:
        return DatasetHead(name, schema, key_column, version=1, created_unix_ms=now, updated_unix_ms=now)
    new = DatasetHead(**asdict(head))  # asdict copies the streams' maps
    new.version, new.updated_unix_ms, new.key_column = new.version + 1, now, new.key_column or key_column
    return new


def _replacing(x: DatasetLedger, top_seq: int, now: int) -> DatasetLedger:
    """A ledger that replaces others keeps the seqs it was given (a merge's), else takes the highest seq it
    replaces; without a commit time it takes the commit's."""
    seq = x.seq if (x.seq or x.segments) else top_seq
    return DatasetLedger(x.ledger_id, x.rows, x.bytes, x.entries, seq, x.committed_unix_ms or now, x.segments)


def _head_of_v1(m: Manifest) -> DatasetHead:
    return DatasetHead(m.name, m.schema, m.key_column, m.version, m.next_seq, dict(m.streams), m.rows,
                       m.payload_bytes, len(m.ledgers), m.created_unix_ms, m.updated_unix_ms, format=1)


def _manifest(head: DatasetHead, state: _State) -> Manifest:
    return Manifest(head.name, head.schema, head.key_column, head.version, head.next_seq, state.ledgers,
                    dict(head.streams), head.created_unix_ms, head.updated_unix_ms, state.retired, head.retention_s)
