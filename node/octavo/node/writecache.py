"""The write cache: the entry logs not yet flushed (the active log and the rolled ones, oldest first), where
their entries are, and how many entries that is; with them the entry-log id sequence and the recovery point
(the oldest log not flushed), which move with the queue.

Each unflushed log carries a location cache (ledger id -> entry id -> offset << 32 | record length) because
its entries are not in the durable index yet; a log's cache is dropped only after the flush committed its
entries to the index, so an entry is always in one or the other. The entry count is bounded by
write_cache_entries_max: adds wait for the flusher when it is reached.

Not thread-safe: the engine (storage.py) calls it under its lock. Reads look up locations without the lock
(a dict lookup is atomic under the GIL; a stale miss falls through to the index, which the flush updated
before the cache went).
"""

from __future__ import annotations

from collections import deque

from octavo.node.entrylog import FLUSHED, ROLLED, EntryLog
from octavo.node.recoverypoint import RecoveryPoint, moved_forward


class WriteCache:
    def __init__(self, entries_max: int) -> None:
        self.entries_max = entries_max
        self.active: EntryLog | None = None
        self.rolled: deque[EntryLog] = deque()  # waiting for the flusher, oldest first
        self.entries = 0  # cached locations over all unflushed logs
        self.next_log_id = 0  # active logs and compaction logs share one increasing sequence
        self._recovery_point = RecoveryPoint(0)  # as last written to disk

    @property
    def recovery_point(self) -> RecoveryPoint:
        return self._recovery_point

    def start_recovery_point(self, point: RecoveryPoint) -> None:
        """The point startup goes by (startup.choose_recovery_point), before any flush."""
        self._recovery_point = point

    def advance_recovery_point(self, point: RecoveryPoint) -> None:
        """The point was written to disk past flushed logs: InvariantError if it would move back."""
        self._recovery_point = moved_forward(self._recovery_point, point)

    def allocate_log_id(self) -> int:
        log_id = self.next_log_id
        self.next_log_id += 1
        return log_id

    # -- the logs ------------------------------------------------------------------------------------
    def logs(self) -> list[EntryLog]:
        """Every unflushed log: the rolled ones oldest first, then the active one."""
        return [*self.rolled, *([self.active] if self.active is not None else [])]

    def adopt_replayed(self, logs: list[EntryLog]) -> None:
        """Logs startup replayed (rolled, their caches rebuilt): the flusher takes them first."""
        self.rolled.extend(logs)
        self.entries += sum(entry_log.cache_entries for entry_log in logs)

    def roll_to(self, new: EntryLog | None) -> None:
        """Seal the active log (queue it for the flusher) and make `new` the active one (None: at close)."""
        old = self.active
        if old is not None:
            old.move_to(ROLLED)
            self.rolled.append(old)
        self.active = new

    def oldest_rolled(self) -> EntryLog | None:
        return self.rolled[0] if self.rolled else None

    def point_after_oldest(self) -> RecoveryPoint:
        """Where the recovery point moves once the oldest rolled log is flushed: the oldest log that stays
        unflushed. Compaction logs (ids from the same sequence) in between are durable and indexed before they
        get a log name, so the point may pass them."""
        if len(self.rolled) > 1:
            return RecoveryPoint(self.rolled[1].log_id)
        return RecoveryPoint(self.active.log_id if self.active is not None else self.next_log_id)

    def flushed(self, entry_log: EntryLog, point: RecoveryPoint) -> None:
        """The oldest rolled log is flushed (its entries are in the index, the recovery point written past
        it): drop it and its cache."""
        if not self.rolled or self.rolled[0] is not entry_log:
            raise RuntimeError(f"entry log {entry_log.log_id} is not the oldest rolled log")
        self.advance_recovery_point(point)
        self.rolled.popleft()
        entry_log.move_to(FLUSHED)
        entry_log.cache = {}
        self.entries -= entry_log.cache_entries
        entry_log.cache_entries = 0

    # -- entries -------------------------------------------------------------------------------------
    def has_room(self, entries: int) -> bool:
        return self.entries + entries <= self.entries_max

    def added(self, entry_log: EntryLog, entries: int) -> None:
        entry_log.cache_entries += entries
        self.entries += entries

    def locate(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        """(log id, offset, length) of an unflushed entry: the active log first, then the rolled ones newest
        first (a resent entry's newest copy wins). None if no unflushed log holds it."""
        active = self.active
        if active is not None:
            found = active.locate(ledger_id, entry_id)
            if found is not None:
                return found
        for entry_log in reversed(list(self.rolled)):
            found = entry_log.locate(ledger_id, entry_id)
            if found is not None:
                return found
        return None

    def unflushed_fd(self, log_id: int) -> int | None:
        """The fd of the active or a rolled log, None for any other log."""
        active = self.active
        if active is not None and active.log_id == log_id:
            return active.fd
        for entry_log in self.rolled:
            if entry_log.log_id == log_id:
                return entry_log.fd
        return None

    def drop_ledger(self, ledger_id: int) -> int:
        """Forget a deleted ledger's cached locations. Returns how many there were."""
        dropped = 0
        for entry_log in self.logs():
            entries = entry_log.cache.pop(ledger_id, None)
            if entries:
                entry_log.cache_entries -= len(entries)
                dropped += len(entries)
        self.entries -= dropped
        return dropped
