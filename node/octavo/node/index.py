"""The durable index and ledger table, in LMDB (bench/index_choice.py and docs/architecture.md say why).

Named databases in one environment under `<data_dir>/index/`:
- `index`: (ledger id, entry id) -> (log id, offset, record length). Keys are big-endian so one ledger's
  entries are contiguous and ordered (range scans for a ledger's last entry and for GC).
- `ledgers`: ledger id -> LedgerRow (master key, fenced, last-add-confirmed, last durable entry id).
- `logs`: log id -> the ids of the ledgers with records in that log, written with the log's index entries:
  garbage collection deletes a flushed log once none of its ledgers is alive.

Written only (a) by the flusher, one transaction per rolled entry log, and (b) by a fence, which must be on
disk before the bookie answers it. Every write transaction is synced before it returns.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import lmdb

from octavo.node.entrylog import LOCATION_LENGTH_BITS, LOCATION_LENGTH_MASK
from octavo.node.fileio import FileIO

INDEX_DIR = "index"
INDEX_KEY = struct.Struct(">QQ")
INDEX_VALUE = struct.Struct("<QQI")
LEDGER_KEY = struct.Struct(">Q")
LEDGER_ROW = struct.Struct("<BqqH")  # flags, last_add_confirmed, durable_last_entry_id, master key length
LEDGER_FLAG_FENCED = 1
MASTER_KEY_BYTES_MAX = 1024


@dataclass(frozen=True, slots=True)
class LedgerRow:
    master_key: bytes
    fenced: bool
    last_add_confirmed: int
    durable_last_entry_id: int

    def encode(self) -> bytes:
        if len(self.master_key) > MASTER_KEY_BYTES_MAX:
            raise ValueError(f"master key is {len(self.master_key)} bytes, limit {MASTER_KEY_BYTES_MAX}")
        flags = LEDGER_FLAG_FENCED if self.fenced else 0
        head = LEDGER_ROW.pack(flags, self.last_add_confirmed, self.durable_last_entry_id, len(self.master_key))
        return head + self.master_key

    @staticmethod
    def decode(data: bytes) -> LedgerRow:
        flags, lac, last, key_len = LEDGER_ROW.unpack_from(data)
        key = bytes(data[LEDGER_ROW.size:LEDGER_ROW.size + key_len])
        if len(key) != key_len:
            raise ValueError("ledger row truncated")
        return LedgerRow(key, bool(flags & LEDGER_FLAG_FENCED), lac, last)


IndexEntry = tuple[int, int, int, int, int]


def _pack_ids(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}Q", *ids)


def _unpack_ids(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 8}Q", data))  # ledger id, entry id, log id, offset, record length


class Index:
    def __init__(self, data_dir: str, io: FileIO, map_size_bytes: int) -> None:
        self.path = os.path.join(data_dir, INDEX_DIR)
        os.makedirs(self.path, exist_ok=True)
        self._io = io
        self._env = lmdb.open(self.path, map_size=map_size_bytes, max_dbs=4, sync=True, metasync=True,
                              max_readers=512, readahead=False)
        self._index = self._env.open_db(b"index")
        self._ledgers = self._env.open_db(b"ledgers")
        self._logs = self._env.open_db(b"logs")

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

    def commit_checkpoint(self, log_id: int, cache: dict[int, dict[int, int]],
                          ledger_rows: dict[int, LedgerRow]) -> int:
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
            txn.put(LEDGER_KEY.pack(log_id), _pack_ids(sorted(cache)), db=self._logs)
        self._env.sync(True)
        self._io.index_synced(self.path)
        return written

    def log_ledgers(self) -> dict[int, list[int]]:
        """Every flushed log's ledger ids (logs flushed before this table existed are missing: callers scan)."""
        with self._env.begin(db=self._logs) as txn:
            return {LEDGER_KEY.unpack(k)[0]: _unpack_ids(v) for k, v in txn.cursor()}

    def put_log_ledgers(self, log_id: int, ledger_ids: list[int]) -> None:
        with self._env.begin(write=True, db=self._logs) as txn:
            txn.put(LEDGER_KEY.pack(log_id), _pack_ids(sorted(ledger_ids)))
        self._env.sync(True)
        self._io.index_synced(self.path)

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

    def forget_log(self, log_id: int) -> None:
        with self._env.begin(write=True, db=self._logs) as txn:
            txn.delete(LEDGER_KEY.pack(log_id))
        self._env.sync(True)
        self._io.index_synced(self.path)

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
