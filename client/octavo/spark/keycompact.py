"""Key compaction of keyed datasets (seed 002, Kafka's log cleaner): keep the latest row of every key.

Two passes over the dataset's ledgers, in manifest order (the order rows were committed):

1. **Offset map**: every row's key is hashed (BLAKE2b-128 keyed with a seed that changes every run) into a
   fixed-size open-addressing table of `slots` entries (two uint64 digest halves and an int64 position;
   up to 32 probes), and the row's position (its rank in manifest order) is stored in the key's slot.
   Memory is fixed: 24 bytes x slots, a named limit (KEY_MAP_SLOTS_MAX). A key that finds no free slot
   (the map is too small for the dataset's keys) is not tracked.
2. **Rewrite**: a row is dropped only when the map holds its key's digest with a *later* position (a newer
   row of the same key exists). An untracked key says nothing, so its rows are kept: a collision only lets
   a duplicate survive this run, never loses the latest row of a key; the next run, with another seed and
   a map sized for the keys, removes it. The digests are compared whole (128 bits), so two keys are never
   taken for one. A key whose latest row is a tombstone (the
   `tombstone_column` is true) is dropped once that row is older than `tombstone_retention_s` (measured from
   its ledger's commit), so readers had time to see the delete.

The kept rows go to new ledgers; one manifest CAS swaps them in for exactly the ledgers that were compacted
(ledgers appended meanwhile stay, after them); then the old ledgers are deleted. Interrupted before the swap,
the new ledgers are orphans (collected after the grace period); after it, the old ones are (their deletion is
retried by orphan collection). Running it again is harmless: it is idempotent.

`compact_dataset` runs in one process (`octavo dataset compact NAME`, or a call from a Spark driver): memory is
the offset map plus one entry at a time, whatever the dataset's size.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from array import array
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from octavo.client.client import Client
from octavo.client.dataset import (
    KEY_MAP_SLOTS_DEFAULT,
    KEY_MAP_SLOTS_MAX,
    TOMBSTONE_RETENTION_S_DEFAULT,
    DatasetConflictError,
    DatasetError,
    DatasetLedger,
    Manifest,
)
from octavo.meta.errors import OctavoError
from octavo.spark.arrowio import Options, client_options, decode_entry, new_write_id, write_ledger


def key_bytes(value: Any) -> bytes:
    """A key's bytes for hashing: the same value always gives the same bytes within one column type."""
    if isinstance(value, bytes):
        return b"b" + value
    if isinstance(value, str):
        return b"s" + value.encode()
    return b"r" + repr(value).encode()


class OffsetMap:
    """A fixed-size map from a key's 128-bit digest to the latest position seen (open addressing: up to
    PROBES_MAX slots are tried, starting where the digest says). A key that finds no free slot is not
    tracked (`untracked` counts them): its rows are all kept this run."""

    PROBES_MAX = 32

    def __init__(self, slots: int, seed: bytes) -> None:
        if not 1 <= slots <= KEY_MAP_SLOTS_MAX:
            raise ValueError(f"key map slots must be in [1, {KEY_MAP_SLOTS_MAX}], got {slots}")
        self.slots = slots
        self.seed = seed
        self.hi = array("Q", bytes(8 * slots))
        self.lo = array("Q", bytes(8 * slots))
        self.pos = array("q", b"\xff" * (8 * slots))  # -1: empty
        self.untracked = 0

    def to_bytes(self) -> tuple[int, bytes, bytes, bytes]:
        """The map's arrays as bytes (to broadcast to Spark tasks)."""
        return self.slots, self.hi.tobytes(), self.lo.tobytes(), self.pos.tobytes()

    @classmethod
    def from_bytes(cls, data: tuple[int, bytes, bytes, bytes], seed: bytes) -> OffsetMap:
        slots, hi, lo, pos = data
        m = cls.__new__(cls)
        m.slots, m.seed, m.untracked = slots, seed, 0
        m.hi, m.lo, m.pos = array("Q", hi), array("Q", lo), array("q", pos)
        return m

    def digest(self, key: Any) -> tuple[int, int]:
        d = hashlib.blake2b(key_bytes(key), digest_size=16, key=self.seed).digest()
        return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little")

    def _find(self, hi: int, lo: int) -> int:
        """The slot holding this digest, or the empty slot where it would go; -1 if the probes are full."""
        slots, his, los, pos = self.slots, self.hi, self.lo, self.pos
        start = hi % slots
        for i in range(min(self.PROBES_MAX, slots)):
            slot = (start + i) % slots
            if pos[slot] < 0 or (his[slot] == hi and los[slot] == lo):
                return slot
        return -1

    def put(self, key: Any, position: int) -> None:
        self.put_digest(*self.digest(key), position)

    def put_digest(self, hi: int, lo: int, position: int) -> None:
        """Record a position for a digest; the highest position wins whatever the order of the calls."""
        slot = self._find(hi, lo)
        if slot < 0:
            self.untracked += 1
            return
        if position > self.pos[slot]:
            self.hi[slot], self.lo[slot], self.pos[slot] = hi, lo, position

    def _position(self, key: Any) -> int:
        slot = self._find(*self.digest(key))
        return -1 if slot < 0 else self.pos[slot]

    def superseded(self, key: Any, position: int) -> bool:
        """True only if a later row of this very key is known: the row can go."""
        return self._position(key) > position

    def latest(self, key: Any, position: int) -> bool:
        """True if this row is known to be its key's latest (for tombstone removal)."""
        return self._position(key) == position


@dataclass
class CompactionResult:
    dataset: str
    rows_before: int
    rows_after: int
    ledgers_before: int
    ledgers_after: int
    tombstones_dropped: int
    duration_s: float


def seq_of_entry(ledger: DatasetLedger, entry_id: int) -> int:
    """The commit seq of an entry's rows (a merged or compacted ledger's entries keep theirs)."""
    seq = ledger.seq
    for first, _, run_seq in ledger.seq_runs():
        if first > entry_id:
            break
        seq = run_seq
    return seq


def _rows(client: Client, opts: Options, ledgers: list[DatasetLedger]) -> Any:
    """Async iterator of (ledger, seq, record batch) in dataset order."""

    async def gen() -> Any:
        for x in ledgers:
            if x.entries <= 0:
                continue
            handle = await client.open_ledger(x.ledger_id, password=opts.password, recovery=False)
            async for entry in handle.read(0, x.entries - 1):
                seq = seq_of_entry(x, entry.entry_id)
                for batch in decode_entry(entry.data):
                    yield x, seq, batch

    return gen()


def _keep_mask(batch: pa.RecordBatch, key_column: str, tombstone_column: str, offset_map: OffsetMap,
               first_position: int, tombstone_expired: bool) -> tuple[list[bool], int]:
    keys = batch.column(key_column).to_pylist()
    tombs = (batch.column(tombstone_column).to_pylist() if tombstone_column in batch.schema.names
             else [False] * len(keys))
    mask = []
    dropped_tombstones = 0
    for i, key in enumerate(keys):
        position = first_position + i
        if key is None:
            mask.append(True)  # rows without a key are never compacted away
        elif offset_map.superseded(key, position):
            mask.append(False)
        elif tombs[i] and tombstone_expired and offset_map.latest(key, position):
            mask.append(False)
            dropped_tombstones += 1
        else:
            mask.append(True)
    return mask, dropped_tombstones


# A compaction whose swap finds its ledgers gone (a merge by the auditor's dataset maintenance, an overwrite)
# starts over from the new version this many times before it gives up.
COMPACTION_ATTEMPTS_MAX = 3


async def compact_dataset(opts: Options, slots: int = KEY_MAP_SLOTS_DEFAULT, tombstone_column: str = "deleted",
                          tombstone_retention_s: float = TOMBSTONE_RETENTION_S_DEFAULT,
                          seed: bytes | None = None) -> CompactionResult:
    """Compact a keyed dataset in this process (bounded memory: the offset map plus one entry at a time)."""
    for attempt in range(1, COMPACTION_ATTEMPTS_MAX + 1):
        try:
            return await _compact_once(opts, slots, tombstone_column, tombstone_retention_s, seed)
        except DatasetConflictError:
            if attempt == COMPACTION_ATTEMPTS_MAX:
                raise
    raise AssertionError("unreachable")


async def _compact_once(opts: Options, slots: int, tombstone_column: str, tombstone_retention_s: float,
                        seed: bytes | None) -> CompactionResult:
    t0 = time.monotonic()
    seed = seed or os.urandom(16)
    async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
        manifest: Manifest = await client.datasets.get(opts.dataset)
        key = manifest.key_column or opts.key_column
        if not key:
            raise DatasetError(f"dataset {opts.dataset!r} has no key column (write it with option key_column)")
        snapshot = list(manifest.ledgers)
        offset_map = OffsetMap(slots, seed)
        position = 0
        async for _, _, batch in _rows(client, opts, snapshot):
            if key not in batch.schema.names:
                raise DatasetError(f"dataset {opts.dataset!r}: key column {key!r} is not in its rows")
            for value in batch.column(key).to_pylist():
                if value is not None:
                    offset_map.put(value, position)
                position += 1
        now_ms = time.time() * 1000
        state = {"position": 0, "tombstones": 0}

        async def kept() -> Any:
            async for ledger, seq, batch in _rows(client, opts, snapshot):
                expired = now_ms - ledger.committed_unix_ms >= tombstone_retention_s * 1000
                mask, dropped = _keep_mask(batch, key, tombstone_column, offset_map, state["position"], expired)
                state["position"] += batch.num_rows
                state["tombstones"] += dropped
                filtered = batch.filter(pa.array(mask, type=pa.bool_()))
                if filtered.num_rows:
                    yield seq, filtered

        # Each kept row keeps its commit seq (the new ledger's segments), so a streaming reader resuming from
        # any offset neither reads a row again nor skips one.
        new = await write_ledger(opts, kept(), new_write_id(), with_seqs=True)
        ledgers = [] if new is None else [new]
        try:
            await client.datasets.commit(opts.dataset, manifest.schema, ledgers,
                                         replace=[x.ledger_id for x in snapshot])
        except DatasetConflictError:
            await _delete_quietly(client, [x.ledger_id for x in ledgers])
            raise
        return CompactionResult(opts.dataset, sum(x.rows for x in snapshot), new.rows if new else 0, len(snapshot),
                                len(ledgers), state["tombstones"], time.monotonic() - t0)


def _ledger_rows(opts: Options, ledger: DatasetLedger) -> Any:
    """(seq, batch) of one ledger, in order, through a blocking client (inside a Spark task)."""
    from octavo.client.client import SyncClient

    if ledger.entries <= 0:
        return
    with SyncClient(opts.etcd, opts.cluster, client_options(opts)) as client:
        handle = client.open_ledger(ledger.ledger_id, password=opts.password, recovery=False)
        for entry in handle.read(0, ledger.entries - 1):
            seq = seq_of_entry(ledger, entry.entry_id)
            for batch in decode_entry(entry.data):
                yield seq, batch


def _kept_rows(opts: Options, ledger: DatasetLedger, index: int, key: str, tombstone_column: str,
               offset_map: OffsetMap, expired: bool, counts: dict[str, int]) -> Any:
    rank = 0
    for seq, batch in _ledger_rows(opts, ledger):
        mask, dropped = _keep_mask(batch, key, tombstone_column, offset_map,
                                   (index << POSITION_LEDGER_SHIFT) | rank, expired)
        rank += batch.num_rows
        counts["tombstones"] += dropped
        filtered = batch.filter(pa.array(mask, type=pa.bool_()))
        if filtered.num_rows:
            yield seq, filtered


# A row's position in a Spark pass: its ledger's index in the manifest, then its rank in the ledger.
POSITION_LEDGER_SHIFT = 40


async def _delete_quietly(client: Client, ledger_ids: list[int]) -> None:
    for lid in ledger_ids:
        with contextlib.suppress(OctavoError):  # else an orphan: orphan collection deletes it
            await client.delete_ledger(lid)


def compact_with_spark(spark: Any, opts: Options, slots: int = KEY_MAP_SLOTS_DEFAULT,
                       tombstone_column: str = "deleted",
                       tombstone_retention_s: float = TOMBSTONE_RETENTION_S_DEFAULT,
                       seed: bytes | None = None) -> CompactionResult:
    """_compact_spark_once, started over (COMPACTION_ATTEMPTS_MAX times) when its swap finds its ledgers gone."""
    for attempt in range(1, COMPACTION_ATTEMPTS_MAX + 1):
        try:
            return _compact_spark_once(spark, opts, slots, tombstone_column, tombstone_retention_s, seed)
        except DatasetConflictError:
            if attempt == COMPACTION_ATTEMPTS_MAX:
                raise
    raise AssertionError("unreachable")


def _compact_spark_once(spark: Any, opts: Options, slots: int, tombstone_column: str, tombstone_retention_s: float,
                        seed: bytes | None) -> CompactionResult:
    """Key compaction as two Spark jobs, one task per ledger: (1) each task hashes its keys and sends back the
    latest position of each digest it saw, which the driver folds into the offset map (memory: the map);
    (2) the map is broadcast and each task writes the rows it keeps into a new ledger; the driver swaps them
    in with one CAS. Same map, same guarantees as compact_dataset."""
    import asyncio

    t0 = time.monotonic()
    seed = seed or os.urandom(16)

    async def snapshot() -> Manifest:
        async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
            return await client.datasets.get(opts.dataset)

    manifest = asyncio.run(snapshot())
    key = manifest.key_column or opts.key_column
    if not key:
        raise DatasetError(f"dataset {opts.dataset!r} has no key column (write it with option key_column)")
    ledgers = list(manifest.ledgers)
    if len(ledgers) >= 1 << (63 - POSITION_LEDGER_SHIFT):
        raise DatasetError(f"dataset {opts.dataset!r} has too many ledgers for one Spark compaction")
    sc = spark.sparkContext
    indexed = sc.parallelize(list(enumerate(ledgers)), max(1, len(ledgers)))

    def digests(part: Any) -> Any:
        probe = OffsetMap(1, seed)  # only its digest function
        for index, ledger in part:
            latest: dict[tuple[int, int], int] = {}
            rank = 0
            for _, batch in _ledger_rows(opts, ledger):
                for value in batch.column(key).to_pylist():
                    if value is not None:
                        latest[probe.digest(value)] = (index << POSITION_LEDGER_SHIFT) | rank
                    rank += 1
            for (hi, lo), position in latest.items():
                yield hi, lo, position

    offset_map = OffsetMap(slots, seed)
    for hi, lo, position in indexed.mapPartitions(digests).toLocalIterator():
        offset_map.put_digest(hi, lo, position)
    shared = sc.broadcast(offset_map.to_bytes())
    now_ms = time.time() * 1000
    write_id = new_write_id()

    def rewrite(part: Any) -> Any:
        local = OffsetMap.from_bytes(shared.value, seed)
        for index, ledger in part:
            expired = now_ms - ledger.committed_unix_ms >= tombstone_retention_s * 1000
            counts = {"tombstones": 0}
            batches = _kept_rows(opts, ledger, index, key, tombstone_column, local, expired, counts)
            written = asyncio.run(write_ledger(opts, batches, write_id, with_seqs=True))
            yield written, counts["tombstones"]

    results = indexed.mapPartitions(rewrite).collect()
    new = [x for x, _ in results if x is not None]

    async def swap() -> None:
        async with Client(opts.etcd, opts.cluster, client_options(opts)) as client:
            try:
                await client.datasets.commit(opts.dataset, manifest.schema, new,
                                             replace=[x.ledger_id for x in ledgers])
            except DatasetConflictError:
                await _delete_quietly(client, [x.ledger_id for x in new])
                raise

    asyncio.run(swap())
    return CompactionResult(opts.dataset, sum(x.rows for x in ledgers), sum(x.rows for x in new), len(ledgers),
                            len(new), sum(t for _, t in results), time.monotonic() - t0)
