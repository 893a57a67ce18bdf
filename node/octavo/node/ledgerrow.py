"""A ledger's durable row (master key, fenced, last-add-confirmed, last durable entry id) and its encoding, as
the index stores it (index.py) and the ledger table keeps it (ledgers.py). Pure: no IO."""

from __future__ import annotations

import struct
from dataclasses import dataclass

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
