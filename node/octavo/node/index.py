"""The durable index and ledger table, in LMDB (bench/index_choice.py and docs/architecture.md say why).

Named databases in one environment under `<data_dir>/index/`:
- `index`: (ledger id, entry id) -> (log id, offset, record length). Keys are big-endian so one ledger's
  entries are contiguous and ordered (range scans for a ledger's last entry and for GC).
- `ledgers`: ledger id -> LedgerRow (master key, fenced, last-add-confirmed, last durable entry id).
- `log_meta`: log id -> LogMeta: the log's size and the payload bytes each ledger has in it, written with the
  log's index entries. Live bytes of a log = the bytes of its ledgers still alive: garbage collection deletes
  a flushed log with none, compaction picks logs by live/total ratio. Rebuilt by scanning a log if missing.

Written (a) by the flusher, one transaction per rolled entry log, (b) by a fence, which must be on disk before
the bookie answers it, (c) by GC (dropped ledgers, forgotten logs) and (d) by compaction (index entries moved
to a compaction log, only where they still point into the compacted log). Every write transaction is synced
before it returns.

A write LMDB refuses (a full disk, a failing one, a full map) raises OSError, as every other disk write of
the engine does, so the callers' disk-failure handling covers the index too: a fence on a full disk answers
RESOURCE_EXHAUSTED naming the data directory, not gRPC's UNKNOWN.
"""

from __future__ import annotations

import errno
import functools
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import lmdb

from octavo.node.entrylog import LOCATION_LENGTH_BITS, LOCATION_LENGTH_MASK
from octavo.node.fileio import FileIO
from octavo.node.files import INDEX_DIR
from octavo.node.ledgerrow import LedgerRow

INDEX_KEY = struct.Struct(">QQ")
INDEX_VALUE = struct.Struct("<QQI")
LEDGER_KEY = struct.Struct(">Q")
IndexEntry = tuple[int, int, int, int, int]  # ledger id, entry id, log id, offset, record length
LOG_META_HEAD = struct.Struct("<QI")  # total bytes, ledger count; then (ledger id, bytes) pairs

P = ParamSpec("P")
R = TypeVar("R")


def as_os_error(error: lmdb.Error) -> OSError:
    """An LMDB failure as the OSError the engine handles: ENOSPC for LMDB's DiskError (its ENOSPC), EIO for the
    rest (a failing disk, a full map, a corrupt environment), with LMDB's own words."""
    code = errno.ENOSPC if isinstance(error, lmdb.DiskError) else errno.EIO
    return OSError(code, f"index {type(error).__name__}: {error}")


def disk_errors(write: Callable[P, R]) -> Callable[P, R]:
    """A write of the index whose LMDB failures surface as OSError (module docstring)."""
    @functools.wraps(write)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return write(*args, **kwargs)
        except lmdb.Error as e:
            raise as_os_error(e) from e
    return wrapped


@dataclass(frozen=True, slots=True)
class LogMeta:
    """A flushed log's accounting: its size and each ledger's record bytes in it."""

    total_bytes: int
    ledger_bytes: dict[int, int]

    def live_bytes(self, live: set[int] | dict[int, object]) -> int:
        return sum(n for lid, n in self.ledger_bytes.items() if lid in live)

    def encode(self) -> bytes:
        items = sorted(self.ledger_bytes.items())
        flat = [x for pair in items for x in pair]
        return LOG_META_HEAD.pack(self.total_bytes, len(items)) + struct.pack(f"<{len(flat)}Q", *flat)

    @staticmethod
    def decode(data: bytes) -> LogMeta:
        total, n = LOG_META_HEAD.unpack_from(data)
        flat = struct.unpack_from(f"<{2 * n}Q", data, LOG_META_HEAD.size)
        return LogMeta(total, dict(zip(flat[0::2], flat[1::2], strict=True)))


def cache_ledger_bytes(cache: dict[int, dict[int, int]]) -> dict[int, int]:
    """Record bytes per ledger in a log's cache (ledger id -> entry id -> offset << 32 | length)."""
    mask = LOCATION_LENGTH_MASK
    return {lid: sum(loc & mask for loc in entries.values()) for lid, entries in cache.items()}


class Index:
    def __init__(self, data_dir: str, io: FileIO, map_size_bytes: int) -> None:
        self.path = os.path.join(data_dir, INDEX_DIR)
        os.makedirs(self.path, exist_ok=True)
        self._io = io
        self._env = lmdb.open(self.path, map_size=map_size_bytes, max_dbs=6, sync=True, metasync=True,
                              max_readers=512, readahead=False)
        self._index = self._env.open_db(b"index")
        self._ledgers = self._env.open_db(b"ledgers")
        self._log_meta = self._env.open_db(b"log_meta")

    def close(self) -> None:
        self._env.close()

    def get(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        """(log id, offset, length) of a durable entry, or None."""
        with self._env.begin(db=self._index, buffers=True) as txn:
            raw = txn.get(INDEX_KEY.pack(ledger_id, entry_id))
            if raw is None:
                return None
            log_id, offset, length = INDEX_VALUE.unpack(raw)
            return log_id, offset, length

    @disk_errors
    def commit_checkpoint(self, log_id: int, cache: dict[int, dict[int, int]],
                          ledger_rows: dict[int, LedgerRow], log_size: int) -> int:
        """Write one log's cached locations (ledger id -> entry id -> offset << 32 | length) and the ledger rows
        in one transaction, and sync it. Returns the entries written.

        The flusher's hot loop: ledger by ledger (keys are then mostly in order: a writer's entries arrive in
        id order), one struct.pack per key and value, no intermediate tuples.
        """
        key_pack = INDEX_KEY.pack
        value_pack = INDEX_VALUE.pack
        shift, mask = LOCATION_LENGTH_BITS, LOCATION_LENGTH_MASK
        written = 0
        with self._env.begin(write=True) as txn:
            cursor = txn.cursor(db=self._index)
            for ledger_id in sorted(cache):
                entries = cache[ledger_id]
                cursor.putmulti([(key_pack(ledger_id, eid), value_pack(log_id, loc >> shift, loc & mask))
                                 for eid, loc in entries.items()])
                written += len(entries)
            for lid, row in ledger_rows.items():
                txn.put(LEDGER_KEY.pack(lid), row.encode(), db=self._ledgers)
            meta = LogMeta(log_size, cache_ledger_bytes(cache))
            txn.put(LEDGER_KEY.pack(log_id), meta.encode(), db=self._log_meta)
        self._env.sync(True)
        self._io.index_synced(self.path)
        return written

    def log_metas(self) -> dict[int, LogMeta]:
        """Every flushed log's accounting (a log whose row is missing is rebuilt by a scan: put_log_meta)."""
        with self._env.begin(db=self._log_meta) as txn:
            return {LEDGER_KEY.unpack(k)[0]: LogMeta.decode(v) for k, v in txn.cursor()}

    @disk_errors
    def put_log_meta(self, log_id: int, meta: LogMeta) -> None:
        with self._env.begin(write=True, db=self._log_meta) as txn:
            txn.put(LEDGER_KEY.pack(log_id), meta.encode())
        self._env.sync(True)
        self._io.index_synced(self.path)

    @disk_errors
    def move_entries(self, sources: set[int], new_log_id: int, moved: list[IndexEntry], meta: LogMeta) -> int:
        """Compaction's index phase: point each (ledger, entry) of `moved` at its copy in `new_log_id`, only where
        the index still points into one of the `sources` (a ledger dropped meanwhile stays dropped), and record
        the new log's accounting, in one synced transaction. Idempotent. Returns the entries moved."""
        key_pack, value_pack, value_unpack = INDEX_KEY.pack, INDEX_VALUE.pack, INDEX_VALUE.unpack
        changed = 0
        with self._env.begin(write=True) as txn:
            for lid, eid, _, offset, length in moved:
                key = key_pack(lid, eid)
                raw = txn.get(key, db=self._index)
                if raw is None or value_unpack(raw)[0] not in sources:
                    continue
                txn.put(key, value_pack(new_log_id, offset, length), db=self._index)
                changed += 1
            txn.put(LEDGER_KEY.pack(new_log_id), meta.encode(), db=self._log_meta)
        self._env.sync(True)
        self._io.index_synced(self.path)
        return changed

    def get_many(self, keys: list[tuple[int, int]]) -> list[tuple[int, int, int] | None]:
        """(log id, offset, length) of each (ledger id, entry id), None where absent; one read transaction."""
        key_pack, value_unpack = INDEX_KEY.pack, INDEX_VALUE.unpack
        with self._env.begin(db=self._index, buffers=True) as txn:
            get = txn.get
            out: list[tuple[int, int, int] | None] = []
            for lid, eid in keys:
                raw = get(key_pack(lid, eid))
                out.append(None if raw is None else value_unpack(raw))
            return out

    def entries_in(self, log_id: int, ledger_ids: Iterable[int],
                   after_offset: int = 0) -> list[tuple[int, int, int, int]]:
        """(ledger id, entry id, offset, length) of these ledgers' entries indexed in `log_id` at or after
        `after_offset`: a range scan per ledger (compaction's way past a damaged record; checks in tests)."""
        out = []
        with self._env.begin(db=self._index) as txn:
            cursor = txn.cursor()
            for lid in ledger_ids:
                prefix = LEDGER_KEY.pack(lid)
                if not cursor.set_range(INDEX_KEY.pack(lid, 0)):
                    continue
                for k, v in cursor:
                    if k[:8] != prefix:
                        break
                    in_log, offset, length = INDEX_VALUE.unpack(v)
                    if in_log == log_id and offset >= after_offset:
                        out.append((lid, INDEX_KEY.unpack(k)[1], offset, length))
        return out

    @disk_errors
    def drop_ledgers(self, ledger_ids: list[int]) -> int:
        """Delete the ledgers' rows and index entries in one synced transaction; returns entries removed."""
        removed = 0
        with self._env.begin(write=True) as txn:
            cursor = txn.cursor(db=self._index)
            for lid in ledger_ids:
                txn.delete(LEDGER_KEY.pack(lid), db=self._ledgers)
                prefix = LEDGER_KEY.pack(lid)
                if cursor.set_range(INDEX_KEY.pack(lid, 0)):
                    while cursor.key()[:8] == prefix:
                        removed += 1
                        if not cursor.delete():
                            break
        self._env.sync(True)
        self._io.index_synced(self.path)
        return removed

    @disk_errors
    def forget_log(self, log_id: int) -> None:
        with self._env.begin(write=True, db=self._log_meta) as txn:
            txn.delete(LEDGER_KEY.pack(log_id))
        self._env.sync(True)
        self._io.index_synced(self.path)

    @disk_errors
    def put_ledger(self, ledger_id: int, row: LedgerRow) -> None:
        """Persist one ledger row and sync it (used by fencing: the fence is durable when this returns)."""
        with self._env.begin(write=True, db=self._ledgers) as txn:
            txn.put(LEDGER_KEY.pack(ledger_id), row.encode())
        self._env.sync(True)
        self._io.index_synced(self.path)

    def load_ledgers(self) -> dict[int, LedgerRow]:
        out: dict[int, LedgerRow] = {}
        with self._env.begin(db=self._ledgers) as txn:
            for k, v in txn.cursor():
                out[LEDGER_KEY.unpack(k)[0]] = LedgerRow.decode(v)
        return out

    def all_entries(self) -> list[IndexEntry]:
        """Every index entry, for checks in tests and tools (not for the serving path)."""
        out: list[IndexEntry] = []
        with self._env.begin(db=self._index) as txn:
            for k, v in txn.cursor():
                lid, eid = INDEX_KEY.unpack(k)
                log_id, off, length = INDEX_VALUE.unpack(v)
                out.append((lid, eid, log_id, off, length))
        return out
