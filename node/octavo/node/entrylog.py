"""One entry log as the engine tracks it, and the write cache of its entries while it is not yet flushed. Pure:
the file is opened and created in entrylogio.py.

States (LogState), each change checked against LEGAL_MOVES: ACTIVE (appended to) -> ROLLED (full; waiting for
the background flush) -> FLUSHED (fsynced, its entries in the durable index, the recovery point past it). A log
startup finds after the recovery point starts ROLLED. Only ACTIVE and ROLLED logs carry a cache.
"""

from __future__ import annotations

from enum import StrEnum

from octavo.node.invariants import InvariantError


class LogState(StrEnum):
    ACTIVE = "active"
    ROLLED = "rolled"
    FLUSHED = "flushed"


ACTIVE, ROLLED, FLUSHED = LogState.ACTIVE, LogState.ROLLED, LogState.FLUSHED
# The only state changes there are: a log is rolled once, flushed once, and never written again after either.
LEGAL_MOVES: dict[LogState, frozenset[LogState]] = {
    ACTIVE: frozenset({ROLLED}),
    ROLLED: frozenset({FLUSHED}),
    FLUSHED: frozenset(),
}

# A cached location packs (offset, record length) in one int: offset << 32 | length.
LOCATION_LENGTH_BITS = 32
LOCATION_LENGTH_MASK = (1 << LOCATION_LENGTH_BITS) - 1
# Rough memory cost of one cached entry (dict slot, int key, int value), for status reports only.
CACHE_ENTRY_BYTES_ESTIMATE = 120


class EntryLog:
    __slots__ = ("_state", "cache", "cache_entries", "fd", "first_write_monotonic", "log_id", "path", "size")

    def __init__(self, log_id: int, path: str, fd: int, size: int, state: LogState) -> None:
        self.log_id = log_id
        self.path = path
        self.fd = fd
        self.size = size  # the end offset: the next record goes here
        self._state = state
        # ledger id -> entry id -> offset << 32 | record length; cleared once the log is flushed
        self.cache: dict[int, dict[int, int]] = {}
        self.cache_entries = 0
        self.first_write_monotonic = 0.0

    @property
    def state(self) -> LogState:
        return self._state

    def move_to(self, state: LogState) -> None:
        """Change state; InvariantError for a change LEGAL_MOVES does not list (the log keeps its state)."""
        if state not in LEGAL_MOVES[self._state]:
            raise InvariantError(f"entry log {self.log_id} cannot go from {self._state} to {state}")
        self._state = state

    def locate(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        entries = self.cache.get(ledger_id)
        if entries is None:
            return None
        loc = entries.get(entry_id)
        if loc is None:
            return None
        return self.log_id, loc >> LOCATION_LENGTH_BITS, loc & LOCATION_LENGTH_MASK
