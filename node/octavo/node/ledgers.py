"""A ledger as one bookie knows it: one row of the ledger table (in memory, persisted in the index)."""

from __future__ import annotations

from dataclasses import dataclass

from octavo.node.index import LedgerRow


@dataclass(slots=True)
class LedgerState:
    master_key: bytes
    fenced: bool = False
    last_add_confirmed: int = -1
    last_entry_id: int = -1  # highest entry id stored here, flushed or not
    durable_last_entry_id: int = -1  # highest entry id covered by the durable index

    def row(self) -> LedgerRow:
        return LedgerRow(self.master_key, self.fenced, self.last_add_confirmed, self.durable_last_entry_id)
