"""Datasets: named sets of ledgers published atomically through a manifest in etcd.

A dataset is what a Spark job writes and reads (`octavo.spark`). Its rows live in ledgers (Arrow IPC record
batches, many rows per entry); which ledgers make up the dataset is said by one etcd key, its **manifest**:

    /octavo/<cluster>/datasets/<name>   JSON: schema, key column, version, the ledgers with their row and byte
                                        counts and commit sequence, the last batch id of each stream

Every change of a manifest is one compare-and-swap on its mod revision, so a reader sees all of a write or
none of it. Modes: append, overwrite (the ledger list is swapped), error-if-exists, ignore. A streaming batch
records its batch id in the same transaction; a batch id at or below the stream's last one is a replay and is
dropped (exactly once). Ledgers a dataset write creates carry `octavo.dataset` in their custom metadata, so
ledgers that no manifest references (a failed task's, an abandoned write's) are found and deleted after a
grace period (`collect_orphans`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from dataclasses import replace as copy_with
from typing import Any

from octavo.client.arguments import check_float, check_instance, check_int, check_str, type_name
from octavo.meta.errors import NoSuchLedgerError, OctavoError
from octavo.meta.etcd import EtcdClient
from octavo.meta.layout import Layout
from octavo.meta.ledger_metadata import META_DATASET as META_DATASET
from octavo.meta.ledger_metadata import LedgerMetadata
from octavo.meta.retry import CasRetry

log = logging.getLogger(__name__)

DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
# The custom-metadata keys of a dataset's ledgers: META_DATASET (octavo.meta.ledger_metadata) and this.
META_WRITE = "octavo.write"
MODES = ("append", "overwrite", "error", "ignore")
# A manifest is one etcd value: etcd's default request limit is 1.5 MiB.
MANIFEST_BYTES_MAX = 1024 * 1024
# Key compaction (octavo.spark.keycompact): offset-map slots (24 bytes each) and tombstone retention.
KEY_MAP_SLOTS_DEFAULT = 1 << 20
KEY_MAP_SLOTS_MAX = 1 << 28
TOMBSTONE_RETENTION_S_DEFAULT = 24 * 3600.0
# Optimistic retries of a manifest update that lost a race before it is reported.
COMMIT_ATTEMPTS_MAX = 50


# Orphan collection deletes what one pass found this many at a time, so the ids it holds stay bounded too.
ORPHANS_DELETED_PER_STEP = 1000

class DatasetError(OctavoError):
    """A dataset operation that cannot be done; the message says why."""


class DatasetExistsError(DatasetError):
    pass


class NoSuchDatasetError(DatasetError):
    pass


def check_name(name: str) -> str:
    check_str("name", name)
    if not DATASET_NAME.match(name):
        raise DatasetError(f"dataset name must be 1 to 200 letters, digits, '.', '_' or '-' (not first), "
                           f"got {name!r}")
    return name


@dataclass(frozen=True)
class DatasetLedger:
    """One ledger of a dataset: its rows, payload bytes, entries, and when it was committed (seq orders
    commits; a streaming reader's offset is a seq)."""

    ledger_id: int
    rows: int
    bytes: int
    entries: int
    seq: int = 0
    committed_unix_ms: int = 0


@dataclass
class Manifest:
    name: str
    schema: str  # the Spark schema as JSON (StructType.json())
    key_column: str = ""
    version: int = 0
    next_seq: int = 1
    ledgers: list[DatasetLedger] = field(default_factory=list)
    streams: dict[str, int] = field(default_factory=dict)  # stream id -> last committed batch id
    created_unix_ms: int = 0
    updated_unix_ms: int = 0

    @property
    def rows(self) -> int:
        return sum(x.rows for x in self.ledgers)

    @property
    def payload_bytes(self) -> int:
        return sum(x.bytes for x in self.ledgers)

    def encode(self) -> bytes:
        data = json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()
        if len(data) > MANIFEST_BYTES_MAX:
            raise DatasetError(f"the manifest of dataset {self.name} would be {len(data)} bytes, over "
                               f"{MANIFEST_BYTES_MAX}: too many ledgers ({len(self.ledgers)}); compact the dataset "
                               "or write fewer, larger partitions")
        return data

    @staticmethod
    def decode(data: bytes) -> Manifest:
        d = json.loads(data)
        ledgers = [DatasetLedger(**x) for x in d.pop("ledgers", [])]
        return Manifest(ledgers=ledgers, **d)


@dataclass(frozen=True)
class CommitResult:
    manifest: Manifest | None
    applied: bool  # False: ignored (mode ignore on an existing dataset, or a replayed stream batch)
    replaced: list[int]  # ledgers no longer referenced (overwrite, compaction): deleted after the commit


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


class DatasetStore:
    """Dataset manifests in etcd. Ledger deletion goes through `delete_ledger` (the client's)."""

    def __init__(self, etcd: EtcdClient, layout: Layout, delete_ledger: Any,
                 iter_ledgers: Callable[[], AsyncIterator[LedgerMetadata]]) -> None:
        self.etcd = etcd
        self.layout = layout
        self._delete_ledger = delete_ledger
        self._iter_ledgers = iter_ledgers

    def key(self, name: str) -> bytes:
        return self.layout.root + b"datasets/" + check_name(name).encode()

    async def read(self, name: str) -> tuple[Manifest | None, int]:
        kv = await self.etcd.get(self.key(name))
        if kv is None:
            return None, 0
        return Manifest.decode(kv.value), kv.mod_revision

    async def get(self, name: str) -> Manifest:
        manifest, _ = await self.read(name)
        if manifest is None:
            raise NoSuchDatasetError(f"dataset {name!r} does not exist")
        return manifest

    async def names(self) -> list[str]:
        prefix = self.layout.root + b"datasets/"
        return [kv.key[len(prefix):].decode() for kv in await self.etcd.get_prefix(prefix, keys_only=True)]

    async def commit(self, name: str, schema: str, ledgers: list[DatasetLedger], mode: str = "append",
                     key_column: str = "", stream: tuple[str, int] | None = None,
                     replace: list[int] | None = None) -> CommitResult:
        """Publish `ledgers` in one CAS. `replace` (compaction) swaps exactly those ledgers for the new ones
        and fails if any of them is gone. Ledgers that end up unused (ignored, a replayed batch) are deleted;
        ledgers replaced are deleted after the commit. Deletion failures are logged: orphan collection
        retries them."""
        _check_commit_arguments(schema, ledgers, mode, key_column, stream, replace)
        if mode not in MODES:
            raise DatasetError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        key = self.key(name)
        retry = CasRetry(f"dataset {name}: commit", COMMIT_ATTEMPTS_MAX, error=DatasetError)
        while True:
            current, revision = await self.read(name)
            now = int(time.time() * 1000)
            result = self._apply(name, current, schema, ledgers, mode, key_column, stream, replace, now)
            if not result.applied:
                await self._delete_quietly([x.ledger_id for x in ledgers])
                return result
            assert result.manifest is not None
            if await self.etcd.cas_put(key, result.manifest.encode(), revision):
                await self._delete_quietly(result.replaced)
                return result
            await retry.lost(f"another commit to the manifest (read at revision {revision}); try again")

    @staticmethod
    def _apply(name: str, current: Manifest | None, schema: str, ledgers: list[DatasetLedger], mode: str,
               key_column: str, stream: tuple[str, int] | None, replace: list[int] | None,
               now: int) -> CommitResult:
        if current is not None and mode == "error":
            raise DatasetExistsError(f"dataset {name!r} already exists (mode error-if-exists); use append or "
                                     "overwrite")
        if current is not None and mode == "ignore":
            return CommitResult(current, False, [])
        if current is not None and stream is not None and current.streams.get(stream[0], -1) >= stream[1]:
            return CommitResult(current, False, [])  # a replayed batch: already applied once
        if current is None:
            current = Manifest(name, schema, key_column, created_unix_ms=now)
        merged = current.schema
        if mode != "overwrite" and replace is None:
            checked = merge_schemas(current.schema, schema)
            if checked is None:
                raise DatasetError(f"dataset {name!r} has another schema; append needs the same columns and types "
                                   f"(stored: {current.schema}; given: {schema})")
            merged = checked
        manifest = copy_with(current, ledgers=list(current.ledgers), streams=dict(current.streams))
        manifest.schema = merged
        replaced: list[int] = []
        if replace is not None:
            old = manifest.ledgers
            gone = set(replace)
            missing = sorted(gone - {x.ledger_id for x in old})
            if missing:
                raise DatasetError(f"dataset {name!r} changed under the compaction: ledgers {missing} are gone")
            # The compacted ledgers take the place of those they replace (a prefix: appends go to the end), so
            # rows committed after the compaction started still come after them. They keep the highest seq
            # they replace: a streaming reader past it does not read the compacted rows again.
            first = next(i for i, x in enumerate(old) if x.ledger_id in gone)
            seq = max(x.seq for x in old if x.ledger_id in gone)
            new = [DatasetLedger(x.ledger_id, x.rows, x.bytes, x.entries, seq, now) for x in ledgers]
            manifest.ledgers = ([x for x in old[:first] if x.ledger_id not in gone] + new
                                + [x for x in old[first:] if x.ledger_id not in gone])
            replaced = sorted(gone)
        else:
            if mode == "overwrite":
                replaced = [x.ledger_id for x in manifest.ledgers]
                manifest.ledgers = []
                manifest.schema = schema
                if key_column:
                    manifest.key_column = key_column
            new = [DatasetLedger(x.ledger_id, x.rows, x.bytes, x.entries, manifest.next_seq + i, now)
                   for i, x in enumerate(ledgers)]
            manifest.next_seq += len(new)
            manifest.ledgers += new
        if stream is not None:
            manifest.streams[stream[0]] = stream[1]
        if key_column and not manifest.key_column:
            manifest.key_column = key_column
        manifest.version += 1
        manifest.updated_unix_ms = now
        return CommitResult(manifest, True, replaced)

    async def drop(self, name: str) -> list[int]:
        """Delete a dataset: its manifest first (readers stop seeing it), then its ledgers."""
        manifest, revision = await self.read(name)
        if manifest is None:
            raise NoSuchDatasetError(f"dataset {name!r} does not exist")
        if not await self.etcd.cas_delete(self.key(name), revision):
            raise DatasetError(f"dataset {name!r} changed while it was being dropped; try again")
        ids = [x.ledger_id for x in manifest.ledgers]
        await self._delete_quietly(ids)
        return ids

    async def collect_orphans(self, name: str, grace_s: float) -> list[int]:
        """Delete the ledgers written for `name` that its manifest does not reference and that are older than
        `grace_s` (a write still running has not committed yet). Returns the ids deleted.

        The ledgers' metadata is read a page at a time and each page's orphans are deleted before the next
        is read: memory stays one page (the etcd client's range_page_keys), however many ledgers there are."""
        grace_s = check_float("grace_s", grace_s, minimum=0)
        manifest, _ = await self.read(name)
        referenced = {x.ledger_id for x in manifest.ledgers} if manifest else set()
        cutoff = time.time() * 1000 - grace_s * 1000
        deleted: list[int] = []
        doomed: list[int] = []
        async for meta in self._iter_ledgers():
            if (meta.custom_metadata.get(META_DATASET) == name and meta.ledger_id not in referenced
                    and meta.created_unix_ms < cutoff):
                doomed.append(meta.ledger_id)
            if len(doomed) >= ORPHANS_DELETED_PER_STEP:
                deleted += await self._delete_quietly(doomed)
                doomed = []
        deleted += await self._delete_quietly(doomed)
        if deleted:
            log.info("dataset %s: deleted %d orphan ledgers", name, len(deleted))
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
