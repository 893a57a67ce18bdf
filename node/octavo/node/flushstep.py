"""One flush step: make the oldest rolled entry log durable, then say so (docs/durability.md, "The flush").

    fsync the log and its directory      (flush.after_log_sync)
 -> commit its index entries and the dirty ledger rows in one synced index transaction
                                         (flush.after_index_commit)
 -> write the recovery point past it     (flush.after_recovery_point)
 -> drop its write cache (adds waiting for room wake up); reads go to the index from now on

Every step is idempotent: a failure (or a crash) leaves the log queued and the next attempt starts over. Except
a failed sync of the log or of its directory: that one is sticky (synclost.py, "fsyncgate"): a retry could
succeed over pages the kernel dropped, so this run records durably that its tail may be lost, turns the engine
read-only and raises SyncLostError, and so does every later run, whichever sync failed first (a failed group
sync under fsync_policy=batch too): the recovery point never moves past that log in this process.
The background flusher (flusher.py) runs this step; so do a clean close and the tests that step by hand.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from octavo.node import faults
from octavo.node.checkpoint import write_recovery_point
from octavo.node.engineflags import EngineFlags
from octavo.node.fileio import FileIO
from octavo.node.index import Index
from octavo.node.ledgers import LedgerTable
from octavo.node.readfds import ReadFds
from octavo.node.recoverypoint import moved_forward
from octavo.node.synclost import SyncLostError, record_sync_lost
from octavo.node.writecache import WriteCache


class FlushStep:
    def __init__(self, io: FileIO, data_dir: str, logs_dir: str, cache: WriteCache, ledgers: LedgerTable,
                 index: Callable[[], Index], read_fds: ReadFds, lock: threading.Lock,
                 index_write_lock: threading.Lock, room: threading.Condition, flags: EngineFlags) -> None:
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
        self._flags = flags  # sync_failed_reason: sticky, set by a failed sync here or by the group sync
        self._lost_recorded = False
        self.flushes = 0

    def run(self) -> bool:
        """Flush the oldest rolled log. Returns False if there was none. Raises on IO failure; SyncLostError
        once a sync of an entry log failed in this process (now or before, here or in the group sync)."""
        if self._flags.sync_failed_reason:
            raise self._lost(self._flags.sync_failed_reason)
        with self._lock:
            entry_log = self._cache.oldest_rolled()
        if entry_log is None:
            return False
        try:
            faults.fail_io(faults.FLUSH_LOG_SYNC_FAILS)
            self._io.fsync(entry_log.fd)
            self._io.fsync_dir(self._logs_dir)
        except OSError as e:  # never retried: a second fsync can succeed over the pages the kernel dropped
            raise self._lost(f"the fsync of entry log {entry_log.log_id} (or of its directory) failed ({e}); its "
                             "bytes may not be on the disk, so nothing is flushed again until a restart") from e
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

    def _lost(self, reason: str) -> SyncLostError:
        """Record, durably and first, that the tail after the recovery point may be lost; then refuse adds."""
        if not self._lost_recorded:
            self._lost_recorded = True
            not_written = record_sync_lost(self._io, self._data_dir, reason)
            if not_written:  # the disk may be gone: adds are refused and the point stays where it is all the same
                reason = f"{reason} (and the node state saying so could not be written: {not_written})"
            self._flags.note_flush_sync_failed(reason)
        return SyncLostError(self._flags.sync_failed_reason)
