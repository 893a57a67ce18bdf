"""One flush step: make the oldest rolled entry log durable, then say so (docs/durability.md, "The flush").

    fsync the log and its directory      (flush.after_log_sync)
 -> commit its index entries and the dirty ledger rows in one synced index transaction
                                         (flush.after_index_commit)
 -> write the recovery point past it     (flush.after_recovery_point)
 -> drop its write cache (adds waiting for room wake up); reads go to the index from now on

Every step is idempotent: a failure (or a crash) leaves the log queued and the next attempt starts over.
The background flusher (flusher.py) runs this step; so do a clean close and the tests that step by hand.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from octavo.node import faults
from octavo.node.checkpoint import write_recovery_point
from octavo.node.fileio import FileIO
from octavo.node.index import Index
from octavo.node.ledgers import LedgerTable
from octavo.node.readfds import ReadFds
from octavo.node.recoverypoint import moved_forward
from octavo.node.writecache import WriteCache


class FlushStep:
    def __init__(self, io: FileIO, data_dir: str, logs_dir: str, cache: WriteCache, ledgers: LedgerTable,
                 index: Callable[[], Index], read_fds: ReadFds, lock: threading.Lock,
                 index_write_lock: threading.Lock, room: threading.Condition) -> None:
        self._io = io
        self._data_dir = data_dir
        self._logs_dir = logs_dir
        self._cache = cache
        self._ledgers = ledgers
        self._index = index
        self._read_fds = read_fds
        self._lock = lock  # the engine lock: the cache and the ledger table
        self._index_write_lock = index_write_lock  # ledger rows: a fence's row is never overwritten by an older one
        self._room = room  # the condition on the engine lock that adds waiting for room wait on
        self.flushes = 0

    def run(self) -> bool:
        """Flush the oldest rolled log. Returns False if there was none. Raises on IO failure."""
        with self._lock:
            entry_log = self._cache.oldest_rolled()
        if entry_log is None:
            return False
        self._io.fsync(entry_log.fd)
        self._io.fsync_dir(self._logs_dir)
        faults.hit(faults.FLUSH_AFTER_LOG_SYNC)
        with self._index_write_lock:
            with self._lock:
                self._ledgers.note_flushed(entry_log.cache)
                rows = self._ledgers.take_dirty()
            try:
                self._index().commit_checkpoint(entry_log.log_id, entry_log.cache, rows, entry_log.size)
            except BaseException:
                with self._lock:
                    self._ledgers.give_back_dirty(rows)
                raise
        faults.hit(faults.FLUSH_AFTER_INDEX_COMMIT)
        with self._lock:
            point = moved_forward(self._cache.recovery_point, self._cache.point_after_oldest())  # before the write
        write_recovery_point(self._io, self._data_dir, point)
        faults.hit(faults.FLUSH_AFTER_RECOVERY_POINT)
        with self._room:
            self._cache.flushed(entry_log, point)
            self._room.notify_all()
        self._read_fds.adopt(entry_log.log_id, entry_log.fd)
        self.flushes += 1
        return True
