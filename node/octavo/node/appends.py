"""The add path's decisions and encoding, without IO: what a request may not write, the records a batch
becomes, and what the write cache and the ledger table learn once those records are written.

The engine (storage.py) runs an add as: refuse what must be refused (`refusal`) -> roll first if the group
would not fit the active log (rolling.should_roll with `group_size`) -> encode the group into one buffer
(`encode_group`) -> write it (one syscall) -> on success `account_written`, on failure `unstage`. Everything
here runs under the engine lock and touches only what it is handed.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any

from crc32c import crc32c as _crc32c

from octavo.node.config import NodeConfig
from octavo.node.entrylog import LOCATION_LENGTH_BITS, EntryLog
from octavo.node.errors import Code, StorageError, fenced, unauthorized
from octavo.node.ledgerrow import MASTER_KEY_BYTES_MAX
from octavo.node.ledgers import LedgerState, LedgerTable
from octavo.node.record import (
    CRC_FIELD,
    ENTRY_ID_LEDGER_KEY,
    LOG_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    RECORD_ID_BYTES,
    RECORD_META,
    encode_record,
)
from octavo.node.writecache import WriteCache
from octavo.v1 import bookie_pb2 as pb

OK = pb.OK

# One batch's result: a code per entry and the first error's text.
Result = tuple[list[Code], str]


@dataclass(slots=True)
class LedgerBatch:
    """One ledger's part of an add request."""

    ledger_id: int
    master_key: bytes
    entry_ids: list[int] | Any
    payloads: list[bytes] | Any
    last_add_confirmed: int = -1
    recovery: bool = False
    # A repair write (damage.py): an entry is written only over a stored copy that fails its checksum or is
    # gone; a good copy is never overwritten (same bytes: OK, other bytes: DUPLICATE_MISMATCH), an entry not
    # held here at all is NO_SUCH_ENTRY. Implies recovery (passes a fence and read-only mode).
    repair: bool = False


@dataclass(slots=True)
class Staged:
    """A batch encoded for the active log, to account for once written: its ledger's state, the ledger's
    location cache in the log (new or not), and the entry ids written."""

    batch: LedgerBatch
    state: LedgerState
    cache: dict[int, int]
    new_cache: bool
    written: list[int]


def encode_records(ledger_id: int, entry_ids: Any, payloads: Any, parts: list[bytes], cache: dict[int, int],
                   offset: int) -> int:
    """Append the records of (entry id, payload) pairs to `parts`, note each one's location in `cache`, and
    return the offset after the last one. The hot loop of the add path: record.encode_record inlined (the
    same bytes: crc32c over body length, ids and payload, then the header), without per-call overhead."""
    pack_meta = RECORD_META.pack
    pack_crc = CRC_FIELD.pack
    crc32c = _crc32c
    extend = parts.extend
    overhead = RECORD_HEADER_BYTES
    for eid, payload in zip(entry_ids, payloads, strict=True):
        size = len(payload)
        meta = pack_meta(size + RECORD_ID_BYTES, ledger_id, eid)
        extend((pack_crc(crc32c(payload, crc32c(meta))), meta, payload))
        cache[eid] = offset << LOCATION_LENGTH_BITS | (size + overhead)
        offset += size + overhead
    return offset


def refusal(batch: LedgerBatch, config: NodeConfig, ledgers: LedgerTable, read_only_reason: str) -> Result | None:
    """Why a batch is refused as a whole, or None."""
    n = len(batch.entry_ids)
    ledger_id = batch.ledger_id
    if ledger_id < 0:
        return [pb.INVALID] * n, f"ledger id must be non-negative, got {ledger_id}"
    if len(batch.payloads) != n:
        return [pb.INVALID] * n, f"{n} entry ids but {len(batch.payloads)} payloads"
    if n > config.batch_entries_max:
        return [pb.TOO_LARGE] * n, f"batch of {n} entries is over batch_entries_max={config.batch_entries_max}"
    if n and read_only_reason and not (batch.recovery or batch.repair):
        return [pb.READ_ONLY] * n, f"this bookie is {read_only_reason}"
    if not batch.master_key or len(batch.master_key) > MASTER_KEY_BYTES_MAX:
        return [pb.INVALID] * n, (f"master key must be 1 to {MASTER_KEY_BYTES_MAX} bytes, got "
                                  f"{len(batch.master_key)}")
    state = ledgers.get(ledger_id)
    if state is None and batch.repair:
        return [pb.NO_SUCH_LEDGER] * n, f"ledger {ledger_id} is not known to this bookie: nothing to repair"
    if state is not None:
        if state.master_key != batch.master_key:
            return [pb.UNAUTHORIZED] * n, unauthorized(ledger_id).message
        if state.fenced and not (batch.recovery or batch.repair):
            return [pb.FENCED] * n, fenced(ledger_id).message
    return None


def group_size(batches: list[LedgerBatch], accepted: list[int]) -> tuple[int, int]:
    """(bytes at most, entries) the accepted batches add to a log: records, plus a key record each."""
    size = sum(sum(map(len, batches[i].payloads)) + len(batches[i].entry_ids) * RECORD_HEADER_BYTES
               + len(batches[i].master_key) + RECORD_HEADER_BYTES for i in accepted)
    return size, sum(len(batches[i].entry_ids) for i in accepted)


def encode_group(active: EntryLog, batches: list[LedgerBatch], accepted: list[int], results: list[Result],
                 ledgers: LedgerTable, config: NodeConfig,
                 read_existing: Callable[[int, int], bytes | None]) -> tuple[list[bytes], list[Staged], int]:
    """Encode the accepted batches for the active log: the parts to write, what each batch will add to the
    caches and the ledger table once written, and the log's size after the write. Sets each batch's result
    (the write may still fail them). A ledger met for the first time joins the ledger table here."""
    parts: list[bytes] = []
    offset = active.size
    staged: list[Staged] = []
    for i in accepted:
        batch = batches[i]
        state = ledgers.get(batch.ledger_id)
        if not batch.entry_ids:  # a LAC-only add (the writer went idle): nothing to write
            if state is not None:
                ledgers.raise_lac(batch.ledger_id, state, batch.last_add_confirmed)
            results[i] = ([], "")
            continue
        if state is None:
            state = ledgers.create(batch.ledger_id, batch.master_key)
        codes: list[Code] = [OK] * len(batch.entry_ids)
        cache = active.cache.get(batch.ledger_id)
        new_cache = cache is None
        key_at = -1  # where the ledger's key record went in `parts` (it goes only with an entry record)
        if cache is None:
            cache = {}
            header, key_length = encode_record(batch.ledger_id, ENTRY_ID_LEDGER_KEY, batch.master_key)
            key_at = len(parts)
            parts += (header, batch.master_key)
            offset += key_length
        ids, payloads = batch.entry_ids, batch.payloads
        message = ""
        if not batch.repair and ids and ids[0] > state.last_entry_id \
                and max(map(len, payloads)) <= config.entry_size_bytes_max \
                and all(map(operator.lt, ids, islice(ids, 1, None))):
            # The writer's normal case: new ids, increasing, within limits; no per-entry checks needed.
            offset = encode_records(batch.ledger_id, ids, payloads, parts, cache, offset)
            written = list(ids)
        else:
            offset, written, message = encode_checked(batch.ledger_id, state.last_entry_id, ids, payloads, codes,
                                                      parts, cache, offset, config.entry_size_bytes_max,
                                                      read_existing, batch.repair)
        results[i] = (codes, message)
        if key_at >= 0 and not written:  # nothing of this ledger written (resends, repairs of good copies)
            del parts[key_at:]
            offset -= key_length
            new_cache = False
        staged.append(Staged(batch, state, cache, new_cache, written))
    return parts, staged, offset


def encode_checked(ledger_id: int, last: int, entry_ids: Any, payloads: Any, codes: list[Code], parts: list[bytes],
                   cache: dict[int, int], offset: int, size_max: int,
                   read_existing: Callable[[int, int], bytes | None],
                   repair: bool = False) -> tuple[int, list[int], str]:
    """Encode a batch entry by entry: invalid ids and oversized entries get their codes, entries already
    stored are compared (same bytes: OK, no second copy; other bytes: DUPLICATE_MISMATCH). A stored copy that
    fails its checksum fails only its own entry (CORRUPT), unless this is a repair write, which writes the
    entry again (the index then points at the new copy)."""
    message = ""
    written: list[int] = []
    batch_new: dict[int, bytes] = {}
    for i in range(len(entry_ids)):
        eid = entry_ids[i]
        payload = payloads[i]
        if eid < 0:
            codes[i] = pb.INVALID
            message = message or f"entry id must be non-negative, got {eid}"
            continue
        if len(payload) > size_max:
            codes[i] = pb.TOO_LARGE
            message = message or f"entry {eid} is {len(payload)} bytes, over entry_size_bytes_max={size_max}"
            continue
        if eid <= last or eid in batch_new or repair:
            existing = batch_new.get(eid)
            damaged = False
            if existing is None:
                try:
                    existing = read_existing(ledger_id, eid)
                except StorageError as e:
                    if e.code != pb.CORRUPT or not repair:
                        codes[i] = e.code
                        message = message or e.message
                        continue
                    damaged = True
                if existing is None and repair and not damaged:
                    codes[i] = pb.NO_SUCH_ENTRY
                    message = message or f"entry {eid} of ledger {ledger_id} is not stored here: nothing to repair"
                    continue
            if existing is not None:
                if existing != payload:
                    codes[i] = pb.DUPLICATE_MISMATCH
                    message = message or f"entry {eid} of ledger {ledger_id} is already stored with different bytes"
                continue  # already stored with these bytes: acknowledged without a second copy
        offset = encode_records(ledger_id, (eid,), (payload,), parts, cache, offset)
        batch_new[eid] = payload
        written.append(eid)
    return offset, written, message


def account_written(active: EntryLog, staged: list[Staged], end: int, cache: WriteCache, ledgers: LedgerTable,
                    now: float) -> None:
    """After the write: the log's size, its caches and the ledger table. `now` is the engine clock (the age
    roll counts from a log's first record)."""
    if active.size == LOG_HEADER_BYTES:
        active.first_write_monotonic = now
    active.size = end
    for s in staged:
        if s.new_cache:
            active.cache[s.batch.ledger_id] = s.cache
        cache.added(active, len(s.written))
        if s.written:
            top = max(s.written)
            if top > s.state.last_entry_id:
                s.state.last_entry_id = top
        ledgers.raise_lac(s.batch.ledger_id, s.state, s.batch.last_add_confirmed)


def unstage(staged: list[Staged]) -> None:
    """A write failed: drop the locations its batches would have added to caches that were already there."""
    for s in staged:
        if not s.new_cache:
            for eid in s.written:
                s.cache.pop(eid, None)


def failed(results: list[Result], accepted: list[int], code: Code, message: str) -> None:
    """Every entry of the accepted batches that would have been written gets `code`."""
    for i in accepted:
        codes, _ = results[i]
        results[i] = ([code if c == OK else c for c in codes], message)
