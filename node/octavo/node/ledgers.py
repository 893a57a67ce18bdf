"""The ledger table: every ledger one bookie knows, in memory, and which rows the next flush must persist.

A row (`LedgerState`) holds the master key, the fence, the LAC the writer last sent, the highest entry stored
and the highest entry the durable index covers. Rows are persisted in the index: by each flush (the dirty
ones, in the same synced transaction as the log's entries) and at once by a fence. The table is not
thread-safe: the engine (storage.py) calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from octavo.node.ledgerrow import LedgerRow


@dataclass(slots=True)
class LedgerState:
    master_key: bytes
    fenced: bool = False
    last_add_confirmed: int = -1
    last_entry_id: int = -1  # highest entry id stored here, flushed or not
    durable_last_entry_id: int = -1  # highest entry id covered by the durable index

    def row(self) -> LedgerRow:
        return LedgerRow(self.master_key, self.fenced, self.last_add_confirmed, self.durable_last_entry_id)

    @classmethod
    def from_row(cls, row: LedgerRow) -> LedgerState:
        return cls(row.master_key, row.fenced, row.last_add_confirmed, row.durable_last_entry_id,
                   row.durable_last_entry_id)


class LedgerTable:
    def __init__(self) -> None:
        self._states: dict[int, LedgerState] = {}
        self._dirty: set[int] = set()  # rows changed since the last flush took them
        self.view: Mapping[int, LedgerState] = MappingProxyType(self._states)  # read-only, always current

    def load(self, rows: Mapping[int, LedgerRow]) -> None:
        """The rows the durable index holds (startup)."""
        for ledger_id, row in rows.items():
            self._states[ledger_id] = LedgerState.from_row(row)

    def get(self, ledger_id: int) -> LedgerState | None:
        return self._states.get(ledger_id)

    def __contains__(self, ledger_id: object) -> bool:
        return ledger_id in self._states

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[int]:
        return iter(self._states)

    def create(self, ledger_id: int, master_key: bytes, dirty: bool = True) -> LedgerState:
        """A ledger this bookie meets for the first time. Its row is written by the next flush (dirty) or by
        the caller (a fence writes it at once)."""
        state = LedgerState(master_key)
        self._states[ledger_id] = state
        if dirty:
            self._dirty.add(ledger_id)
        return state

    def seal(self, ledger_id: int, state: LedgerState) -> None:
        """Fence a ledger whose writer closed it; its row is written by the next flush."""
        state.fenced = True
        self._dirty.add(ledger_id)

    def raise_lac(self, ledger_id: int, state: LedgerState, last_add_confirmed: int) -> None:
        if last_add_confirmed > state.last_add_confirmed:
            state.last_add_confirmed = last_add_confirmed
            self._dirty.add(ledger_id)

    def note_flushed(self, cache: Mapping[int, Mapping[int, int]]) -> None:
        """A log's entries are about to be committed to the index: raise each ledger's durable mark to the
        highest entry the log holds, and mark its row for the same commit."""
        for ledger_id, entries in cache.items():
            state = self._states[ledger_id]
            top = max(entries, default=-1)
            if top > state.durable_last_entry_id:
                state.durable_last_entry_id = top
            self._dirty.add(ledger_id)

    def take_dirty(self) -> dict[int, LedgerRow]:
        """The rows changed since the last call, now; the caller persists them or hands the ids back."""
        dirty, self._dirty = self._dirty, set()
        return {ledger_id: self._states[ledger_id].row() for ledger_id in dirty}

    def give_back_dirty(self, ledger_ids: set[int] | list[int] | Mapping[int, LedgerRow]) -> None:
        """Rows taken by take_dirty that were not persisted (the commit failed): the next flush retries."""
        self._dirty.update(ledger_id for ledger_id in ledger_ids if ledger_id in self._states)

    def drop(self, ledger_id: int) -> bool:
        """Forget a deleted ledger. Returns whether it was known."""
        self._dirty.discard(ledger_id)
        return self._states.pop(ledger_id, None) is not None
