"""Merging a dataset's small ledgers into ledgers of a target size (Delta Lake's OPTIMIZE, Iceberg's
rewrite_data_files), for every dataset, keyed or not.

A streaming query commits a few small ledgers per micro-batch; months of them make reads plan thousands of
tiny tasks. `merge_dataset` finds runs of ADJACENT ledgers (in dataset order) each smaller than `small_bytes`,
and copies each run, entry by entry and byte for byte (an entry is a self-contained Arrow IPC stream, so no
decoding is needed), into a new ledger of at most `target_bytes`. Then one commit per merged ledger
(`DatasetStore.commit(..., replace=[the run])`) swaps it in, in the place of the run's first ledger.

What keeps it safe:
- **Order.** Only adjacent ledgers are merged, and their entries are copied in order: the dataset's row order
  is kept, so key compaction's "last row per key in dataset order" is unchanged by a merge.
- **Seqs.** The merged ledger's `segments` give each entry the seq of the ledger it came from, so a streaming
  reader resuming from {"seq": N} reads exactly the rows committed after N, before and after the merge. A run
  is only formed where the seqs do not go down (DatasetLedger.entries_in takes a ledger's runs as one range).
- **Concurrent appends.** A replace commit swaps exactly the run's ledgers: ledgers appended meanwhile stay
  after it. A run that an overwrite or another merge took away meanwhile makes that commit fail ("ledgers
  ... are gone"): that merge is abandoned and its new ledger deleted; the other runs go on.
- **Readers of the old ledgers.** The replaced ledgers are retired, not deleted: a read planned before the swap
  finishes within the dataset's retention period (then orphan collection deletes them).
- **Crashes.** Before the commit the new ledger is an orphan (orphan collection deletes it after its grace);
  after it, the sources are retired. Nothing half-written is ever visible.

A merged ledger has its sources' password digest, master key and quorums (a run never mixes them), so it is
read and protected exactly like them; the merge needs no password (the master key is in the metadata).
Work is bounded: one call copies at most `budget_bytes` (the auditor's maintenance calls it every interval
with its own budget, `octavo dataset compact` with the one given).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from octavo.client.client import Client
from octavo.client.colstats import STATS_KEY, LedgerStats, combine
from octavo.client.dataset import (
    META_DATASET,
    META_WRITE,
    DatasetConflictError,
    DatasetError,
    DatasetLedger,
    NoSuchDatasetError,
)
from octavo.client.reader import ReadHandle
from octavo.client.writer import WriteHandle
from octavo.meta.errors import NoSuchLedgerError, OctavoError
from octavo.meta.ledger_metadata import LedgerMetadata

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# A merged ledger holds at most this many payload bytes (Delta's OPTIMIZE aims at 1 GiB files; a ledger is
# read by one Spark task, and 128 MiB is Spark's spark.sql.files.maxPartitionBytes).
MERGE_TARGET_BYTES_DEFAULT = 128 * MIB
# A ledger is small, and merged, when it holds fewer payload bytes than this share of the target: ledgers
# already near the target are left alone (merging two 100 MiB ledgers gains nothing and copies a lot).
MERGE_SMALL_RATIO = 0.5
MERGE_TARGET_BYTES_MIN = 64 * 1024
MERGE_TARGET_BYTES_MAX = 4096 * MIB
# Source ledgers in one merged ledger: bounds the segments a merged ledger carries and the commit's record.
MERGE_LEDGERS_MAX_DEFAULT = 1000
# Bytes one merge_dataset call copies at most (the maintenance passes its own, smaller, per-tick budget).
MERGE_BUDGET_BYTES_DEFAULT = 4096 * MIB
# Appends in flight while copying: groups of about this many bytes, at most this many groups at once.
COPY_GROUP_BYTES = 1 * MIB
COPY_GROUPS_IN_FLIGHT_MAX = 8
# Source ledgers read ahead of the copy, at once: at most this many, holding at most this many bytes.
PREFETCH_LEDGERS_MAX = 16
PREFETCH_BYTES_MAX = 16 * MIB


@dataclass(frozen=True)
class Shape:
    """What ledgers merged together must share: the new ledger takes them (password digest, master key, quorums)."""

    password_digest: str
    master_key_hex: str
    ensemble_size: int
    write_quorum: int
    ack_quorum: int

    @staticmethod
    def of(meta: LedgerMetadata) -> Shape:
        return Shape(meta.password_digest, meta.master_key_hex, meta.ensemble_size, meta.write_quorum,
                     meta.ack_quorum)


@dataclass(frozen=True)
class Merged:
    """One merged ledger: the new ledger and the ids of the ledgers it replaced, in dataset order."""

    ledger: DatasetLedger
    sources: list[int]


@dataclass
class MergeResult:
    """What one merge_dataset call did. `ledgers_before` is the dataset's count when it was read, `ledgers_after`
    its count after the last commit (appends meanwhile included); `abandoned`: merges whose sources an overwrite
    or another merge took away first (their new ledgers were deleted)."""

    dataset: str
    ledgers_before: int
    ledgers_after: int
    merges: int = 0
    ledgers_merged: int = 0
    bytes_merged: int = 0
    rows_merged: int = 0
    abandoned: int = 0
    duration_s: float = 0.0
    merged: list[Merged] = field(default_factory=list)


# -- the plan (pure) ------------------------------------------------------------------------------------
def small_bytes_of(target_bytes: int) -> int:
    return int(target_bytes * MERGE_SMALL_RATIO)


def small_runs(ledgers: list[DatasetLedger], small_bytes: int) -> list[tuple[int, int]]:
    """[first, last] index ranges (inclusive) of the runs of at least two adjacent ledgers each under
    `small_bytes`: the only ledgers worth reading the metadata of."""
    runs: list[tuple[int, int]] = []
    start = -1
    for i, x in enumerate([*ledgers, None]):
        if x is not None and x.bytes < small_bytes:
            start = i if start < 0 else start
            continue
        if start >= 0 and i - start >= 2:
            runs.append((start, i - 1))
        start = -1
    return runs


def plan_merges(candidates: Sequence[tuple[DatasetLedger, Shape | None]], target_bytes: int, small_bytes: int,
                ledgers_max: int, budget_bytes: int) -> list[list[DatasetLedger]]:
    """The groups to merge, each of at least two ledgers adjacent in `candidates` (the dataset's order): every
    ledger under `small_bytes` with a shape (None: not mergeable: open, without a master key, unread), all of
    one shape, seqs never going down, at most `ledgers_max` ledgers and `target_bytes` bytes a group, and at
    most `budget_bytes` over all groups."""
    if not (0 < small_bytes <= target_bytes and ledgers_max >= 2 and budget_bytes >= 0):
        raise ValueError(f"merge plan needs 0 < small_bytes ({small_bytes}) <= target_bytes ({target_bytes}), "
                         f"ledgers_max >= 2 ({ledgers_max}) and budget_bytes >= 0 ({budget_bytes})")
    groups: list[list[DatasetLedger]] = []
    group: list[DatasetLedger] = []
    shape: Shape | None = None
    group_bytes = planned = 0

    def close() -> None:
        nonlocal group, group_bytes, planned
        # Size-tiered, as an LSM tree's size-tiered compaction: a ledger is copied only together with at least as
        # many bytes after it. Without this a merged ledger still under small_bytes was copied again with every
        # few new ledgers (22x the payload copied over a 74-minute stream, bench/dataset_bench.py); with it a
        # byte is copied about log2(small_bytes / the ledgers' size) times.
        while len(group) >= 2 and group[0].bytes > group_bytes - group[0].bytes:
            group_bytes -= group[0].bytes
            group = group[1:]
        if len(group) >= 2:
            groups.append(group)
            planned += group_bytes
        group, group_bytes = [], 0

    for ledger, this in candidates:
        if this is None or ledger.bytes >= small_bytes:
            close()
            continue
        top = max((s for _, _, s in _runs(group[-1])), default=0) if group else 0
        low = min((s for _, _, s in _runs(ledger)), default=top)
        if (this != shape or low < top or len(group) >= ledgers_max or group_bytes + ledger.bytes > target_bytes
                or planned + group_bytes + ledger.bytes > budget_bytes):
            close()
        if planned + ledger.bytes > budget_bytes:
            break
        group.append(ledger)
        group_bytes += ledger.bytes
        shape = this
    close()
    return groups


def _runs(x: DatasetLedger) -> list[tuple[int, int, int]]:
    return x.seq_runs() or [(0, -1, x.seq)]


def merged_ledger(ledger_id: int, sources: list[DatasetLedger]) -> DatasetLedger:
    """The DatasetLedger of `sources` copied in order into ledger `ledger_id`: counts summed, each entry keeps
    its source's seq (consecutive runs of one seq joined), seq the highest, commit time the newest source's."""
    segments: list[tuple[int, int]] = []
    offset = 0
    for x in sources:
        for first, _, seq in x.seq_runs():
            if not segments or segments[-1][1] != seq:
                segments.append((offset + first, seq))
        offset += x.entries
    seqs = [s for _, s in segments]
    if seqs != sorted(seqs):
        raise DatasetError(f"merge of ledgers {[x.ledger_id for x in sources]}: seqs go down ({seqs})")
    return DatasetLedger(ledger_id, sum(x.rows for x in sources), sum(x.bytes for x in sources), offset,
                         max((x.seq for x in sources), default=0), max(x.committed_unix_ms for x in sources),
                         tuple(segments))


# -- the IO -------------------------------------------------------------------------------------------
async def merge_dataset(client: Client, name: str, target_bytes: int = MERGE_TARGET_BYTES_DEFAULT,
                        small_bytes: int | None = None, max_ledgers_per_merge: int = MERGE_LEDGERS_MAX_DEFAULT,
                        budget_bytes: int = MERGE_BUDGET_BYTES_DEFAULT) -> MergeResult:
    """Merge the small ledgers of dataset `name` (see the module's docstring). `small_bytes` defaults to
    MERGE_SMALL_RATIO of the target. One commit per merged ledger: a merge whose sources are gone is abandoned,
    the others land."""
    t0 = time.monotonic()
    if not MERGE_TARGET_BYTES_MIN <= target_bytes <= MERGE_TARGET_BYTES_MAX:
        raise ValueError(f"merge target_bytes must be in [{MERGE_TARGET_BYTES_MIN}, {MERGE_TARGET_BYTES_MAX}], "
                         f"got {target_bytes}")
    small = small_bytes_of(target_bytes) if small_bytes is None else small_bytes
    manifest = await client.datasets.get(name)
    ledgers: list[DatasetLedger] = list(manifest.ledgers)
    result = MergeResult(name, len(ledgers), len(ledgers))
    candidates = await _candidates(client, ledgers, small, budget_bytes)
    groups = plan_merges([(x, shape) for x, (shape, _) in zip(ledgers, candidates, strict=True)], target_bytes,
                         small, max_ledgers_per_merge, budget_bytes)
    metas = {x.ledger_id: meta for x, (_, meta) in zip(ledgers, candidates, strict=True) if meta is not None}
    if groups:
        await client.bookies(refresh=True)
    write_id = os.urandom(8).hex()
    for group in groups:
        try:
            merged = await _merge_group(client, name, manifest.schema, group, metas, write_id)
        except NoSuchDatasetError:
            break  # dropped under the merge
        if merged is None:
            result.abandoned += 1
            continue
        result.merged.append(merged)
        result.merges += 1
        result.ledgers_merged += len(group)
        result.bytes_merged += merged.ledger.bytes
        result.rows_merged += merged.ledger.rows
    if result.merges:
        result.ledgers_after = (await client.datasets.head(name)).ledger_count
    result.duration_s = time.monotonic() - t0
    if result.merges or result.abandoned:
        log.info("dataset %s: merged %d ledgers into %d (%d bytes) in %.2fs; %d merges abandoned", name,
                 result.ledgers_merged, result.merges, result.bytes_merged, result.duration_s, result.abandoned)
    return result


async def _candidates(client: Client, ledgers: list[DatasetLedger], small_bytes: int,
                      budget_bytes: int) -> list[tuple[Shape | None, LedgerMetadata | None]]:
    """(shape, metadata) of each ledger worth merging, read from etcd: those in a run of small ledgers, until the
    budget's worth is read; (None, None) for the others."""
    out: list[tuple[Shape | None, LedgerMetadata | None]] = [(None, None)] * len(ledgers)
    read_bytes = 0
    for first, last in small_runs(ledgers, small_bytes):
        for i in range(first, last + 1):
            x = ledgers[i]
            try:
                meta, _ = await client.metadata_store.read_ledger(x.ledger_id)
            except NoSuchLedgerError:
                continue
            if meta.closed and meta.master_key_hex and meta.last_entry_id + 1 == x.entries:
                out[i] = (Shape.of(meta), meta)
            read_bytes += x.bytes
        if read_bytes > budget_bytes:
            break
    return out


async def _merge_group(client: Client, name: str, schema: str, group: list[DatasetLedger],
                       metas: dict[int, LedgerMetadata], write_id: str) -> Merged | None:
    """Copy `group` into a new ledger and swap it in; None if the swap lost to an overwrite or another merge
    (the new ledger is deleted then)."""
    first = metas[group[0].ledger_id]
    custom = {META_DATASET: name, META_WRITE: write_id}
    # The sources' column statistics combined (data skipping): kept only when every source has them.
    stats = combine([LedgerStats.decode(metas[x.ledger_id].custom_metadata.get(STATS_KEY)) for x in group])
    encoded = stats.encode() if stats is not None else None
    if encoded is not None:
        custom[STATS_KEY] = encoded
    handle = await client._create_keyed_ledger(
        first.ensemble_size, first.write_quorum, first.ack_quorum, first.password_digest,
        bytes.fromhex(first.master_key_hex), custom)
    try:
        copied = await _copy(client, handle, [(metas[x.ledger_id], x.bytes) for x in group])
        await handle.close()
    except BaseException as e:
        handle.abandon(OctavoError(f"the merge of ledgers {[x.ledger_id for x in group]} failed: {e}"))
        await _delete_quietly(client, handle.ledger_id)
        raise
    merged = merged_ledger(handle.ledger_id, group)
    if copied != merged.bytes:
        await _delete_quietly(client, handle.ledger_id)
        raise DatasetError(f"dataset {name!r}: merge copied {copied} bytes from ledgers "
                           f"{[x.ledger_id for x in group]}, whose records say {merged.bytes}")
    ids = [x.ledger_id for x in group]
    try:
        await client.datasets.commit(name, schema, [merged], replace=ids)
    except DatasetConflictError:
        await _delete_quietly(client, handle.ledger_id)
        log.info("dataset %s: merge of ledgers %s abandoned (an overwrite or another merge replaced them first)",
                 name, ids)
        return None
    except NoSuchDatasetError:
        await _delete_quietly(client, handle.ledger_id)
        raise NoSuchDatasetError(f"dataset {name!r} does not exist (it was dropped under the merge)") from None
    return Merged(merged, ids)


async def _read_whole(client: Client, meta: LedgerMetadata) -> list[bytes]:
    reader = ReadHandle(client, meta, meta.last_entry_id)
    return [entry.data async for batch in reader.read_batches(0, meta.last_entry_id) for entry in batch]


async def _source_entries(client: Client, sources: list[tuple[LedgerMetadata, int]]) -> AsyncIterator[list[bytes]]:
    """The entries of `sources` in order, a list at a time. Small ledgers are read ahead, several at once (at
    most PREFETCH_LEDGERS_MAX ledgers and PREFETCH_BYTES_MAX bytes read and not yet copied): one at a time, a
    merge of tiny ledgers waits on a round trip per ledger. A larger ledger is read in its turn, streaming."""
    ahead: deque[asyncio.Task[list[bytes]] | None] = deque()
    ahead_bytes: deque[int] = deque()
    nxt = 0
    try:
        for meta, _ in sources:
            while nxt < len(sources) and len(ahead) < PREFETCH_LEDGERS_MAX and (
                    not ahead or sum(ahead_bytes) + sources[nxt][1] <= PREFETCH_BYTES_MAX):
                m, b = sources[nxt]
                small = b <= PREFETCH_BYTES_MAX and m.last_entry_id >= 0
                ahead.append(asyncio.ensure_future(_read_whole(client, m)) if small else None)
                ahead_bytes.append(b if small else 0)
                nxt += 1
            task = ahead.popleft()
            ahead_bytes.popleft()
            if task is not None:
                yield await task
            elif meta.last_entry_id >= 0:
                reader = ReadHandle(client, meta, meta.last_entry_id)
                async for batch in reader.read_batches(0, meta.last_entry_id):
                    yield [entry.data for entry in batch]
    finally:
        for t in ahead:
            if t is not None:
                t.cancel()


async def _copy(client: Client, handle: WriteHandle, sources: list[tuple[LedgerMetadata, int]]) -> int:
    """Append every entry of `sources` (closed ledgers, with their payload bytes), in order, to `handle`; returns
    the bytes copied. At most COPY_GROUPS_IN_FLIGHT_MAX groups of about COPY_GROUP_BYTES are in flight."""
    in_flight: list[asyncio.Future[list[int]]] = []
    group: list[bytes] = []
    group_bytes = copied = 0

    async def send() -> None:
        nonlocal group, group_bytes
        in_flight.append(asyncio.ensure_future(handle.append_many(group)))
        group, group_bytes = [], 0
        while len(in_flight) >= COPY_GROUPS_IN_FLIGHT_MAX:
            await in_flight.pop(0)

    try:
        async for datas in _source_entries(client, sources):
            for data in datas:
                group.append(data)
                group_bytes += len(data)
                copied += len(data)
                if group_bytes >= COPY_GROUP_BYTES:
                    await send()
        if group:
            await send()
        for f in in_flight:
            await f
    finally:
        for f in in_flight:
            if not f.done():
                f.cancel()
    return copied


async def _delete_quietly(client: Client, ledger_id: int) -> None:
    try:
        await client.delete_ledger(ledger_id)
    except OctavoError as e:  # an orphan then: orphan collection deletes it after its grace period
        log.warning("could not delete ledger %d: %s", ledger_id, e)
