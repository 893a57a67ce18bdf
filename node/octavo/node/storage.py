"""The bookie's storage engine, as one facade over its parts. The facade owns the locks and the order of
the steps; each part lives in its own module:

| part | module |
|---|---|
| entry-log files, their states, the roll predicate | `entrylog.py`, `rolling.py` |
| the write cache (unflushed logs, their locations, the recovery point) | `writecache.py` |
| the ledger table (master key, fence, LAC, durable marks) | `ledgers.py` |
| the add path's decisions and encoding | `appends.py` |
| reads and the read-fd cache | `reads.py`, `readfds.py` |
| one flush step (fsync -> index commit -> recovery point) | `flushstep.py`, run by `flusher.py` |
| startup (identity, index, recovery point, replay) | `startup.py`, `startup_cases.py`, `recovery.py` |
| garbage collection, compaction, tail repair | `gc.py`, `compaction.py`, `repair.py` (they see `engine.Engine`) |

Durability model (docs/durability.md):
- An add is acknowledged once its records are written into the active entry log (the OS page cache). The add
  path never fsyncs, unless fsync_policy is "batch": then an add is acknowledged after an fdatasync of its log
  that began after its write, shared by every add written meanwhile (group commit: groupsync.py).
- A full active log is rolled. The flush step fsyncs each rolled log, then commits the index entries that
  cover it (one synced LMDB transaction), then advances the recovery point. The index is therefore never
  durable pointing into bytes that are not.
- Startup scans only the logs at or after the recovery point and hands them to the flusher.
- A fence is synced to the ledger table before it is answered, and survives any restart.

Threads: the gRPC server calls the add, read and fence methods from its event loop (or an executor); the
flusher runs in its own thread. `_lock` guards the write cache and the ledger table; `_room` (a condition on
it) wakes adds waiting for room; `_index_write_lock` serialises ledger-row writes so a fence is never
overwritten by an older row; `space_lock` keeps GC and compaction passes apart.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from octavo.node import appends, faults, gc, startup
from octavo.node.appends import LedgerBatch, Result
from octavo.node.checkpoint import NodeState, write_recovery_point
from octavo.node.compaction import recover_interrupted
from octavo.node.config import FSYNC_POLICY_BATCH, NodeConfig
from octavo.node.engineflags import EngineFlags
from octavo.node.entrylog import EntryLog
from octavo.node.entrylogio import create_entry_log
from octavo.node.errors import Code, StorageError, WriteCacheFull, no_such_ledger, unauthorized
from octavo.node.fileio import FileIO
from octavo.node.files import INDEX_DIR, LOGS_DIR, RUNNING_MARKER_FILE, log_file_name, parse_log_file_name
from octavo.node.flusher import Flusher
from octavo.node.flushstep import FlushStep
from octavo.node.gc import GcReport
from octavo.node.groupsync import GroupSync, failure_message
from octavo.node.index import Index, LogMeta
from octavo.node.ledgerrow import MASTER_KEY_BYTES_MAX
from octavo.node.ledgers import LedgerState, LedgerTable
from octavo.node.ratelimitedlog import RateLimitedLog
from octavo.node.readfds import ReadFds
from octavo.node.reads import Reader, ReadItem
from octavo.node.record import (
    ENTRY_ID_COMPACTED_FROM,
    ENTRY_ID_FENCE,
    ENTRY_ID_LEDGER_KEY,
    LOG_HEADER_BYTES,
    encode_record,
)
from octavo.node.recovery import scan_log
from octavo.node.recoverypoint import RecoveryPoint, moved_forward
from octavo.node.rolling import ActiveLog, Why, should_roll
from octavo.node.startup import RecoveryReport, current_boot_id
from octavo.node.storagestatus import StorageGauges as StorageGauges
from octavo.node.storagestatus import StorageStatus
from octavo.node.writecache import WriteCache
from octavo.v1 import bookie_pb2 as pb

__all__ = ["GcReport", "LacInfo", "LedgerBatch", "Storage"]

log = logging.getLogger(__name__)
# A full or failing disk fails every write alike (each fence, each add): its lines are bounded (ratelimitedlog.py).
write_failures = RateLimitedLog(log)


@dataclass(frozen=True)
class LacInfo:
    last_add_confirmed: int
    last_entry_id: int
    fenced: bool
    tail_maybe_lost: bool


class Storage(EngineFlags, StorageStatus):
    """Open with Storage.open(config); close with close() (clean: syncs all, nothing to replay next time)."""

    def __init__(self, config: NodeConfig, io: FileIO, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()  # the mode and health flags (engineflags.py)
        self.config = config.validate()
        self.io = io
        # The engine's own clock, for how old the active log's first unflushed record is (the age roll). Tests
        # pass a clock they step, with the flusher stepped by hand too, so a seeded run replays exactly.
        self.clock = clock
        self.data_dir = os.path.abspath(config.data_dir)
        self.logs_dir = os.path.join(self.data_dir, LOGS_DIR)
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._index_write_lock = threading.Lock()
        self.read_fds = ReadFds(io, self.logs_dir, config.open_log_files_max)
        # GC and compaction passes never overlap (both delete logs and rewrite the accounting).
        self.space_lock = threading.Lock()
        self._table = LedgerTable()
        self._cache = WriteCache(config.write_cache_entries_max)
        self._reader = Reader(self._cache, self._table, lambda: self.index, self.read_fds,
                              lambda: self.tail_maybe_lost)
        self._flush = FlushStep(io, self.data_dir, self.logs_dir, self._cache, self._table, lambda: self.index,
                                self.read_fds, self._lock, self._index_write_lock, self._room, self)
        self._closed = False
        self._lock_fd = -1
        self.node_state: NodeState | None = None
        self.fresh_instance = False  # this start created the data directory's identity
        self.recovery = RecoveryReport()
        self.started_unix_ms = int(time.time() * 1000)
        self.last_gc: GcReport | None = None
        self.flush_seconds_total = 0.0
        self.gc_runs = 0
        self.gc_logs_deleted_total = 0
        self.gc_bytes_reclaimed_total = 0
        self._flusher: Flusher | None = None
        self._index: Index | None = None
        # The group commit of the active log under fsync_policy = "batch" (groupsync.py); None under "none".
        self.group_sync: GroupSync | None = None

    # ------------------------------------------------------------------------------------------------
    # Opening and closing

    @classmethod
    def open(cls, config: NodeConfig, io: FileIO | None = None, start_flusher: bool = True,
             clock: Callable[[], float] = time.monotonic) -> Storage:
        """Start the engine. start_flusher=False leaves flushing to the caller (flush_one, roll_if_older_than:
        what the flusher thread does, one step at a time)."""
        storage = cls(config, io or FileIO(), clock)
        try:
            storage._open()
        except BaseException:
            storage._release_dir_lock()
            raise
        if start_flusher:
            storage.start_flusher()
        return storage

    def _open(self) -> None:
        """Startup, in the order startup.py documents: directories, lock, identity, index, recovery point,
        interrupted compactions, then the entry logs after the recovery point."""
        startup.prepare_directories(self.io, self.data_dir, self.logs_dir)
        self._lock_fd = startup.take_dir_lock(self.data_dir)
        running_marker = os.path.join(self.data_dir, RUNNING_MARKER_FILE)
        unclean = self.io.read_file(running_marker) is not None
        identity = startup.load_identity(self.io, self.data_dir, unclean, int(time.time() * 1000),
                                         current_boot_id())
        self.node_state, self.fresh_instance, self.tail_maybe_lost = (identity.state, identity.fresh,
                                                                      identity.tail_maybe_lost)
        index_existed = os.path.exists(os.path.join(self.data_dir, INDEX_DIR, "data.mdb"))
        self._index = startup.open_index(self.io, self.data_dir, self.config.index_map_size_bytes)
        self._table.load(self._index.load_ledgers())
        self._cache.start_recovery_point(startup.choose_recovery_point(self.io, self.data_dir, index_existed))
        recover_interrupted(self)  # each roll-back or finish is logged
        replayed = startup.replay_logs(self.io, self.logs_dir, self._cache.recovery_point, unclean, self._table)
        self._cache.adopt_replayed(replayed.logs)
        self._cache.next_log_id = replayed.next_log_id
        active = create_entry_log(self.io, self.logs_dir, self._cache.allocate_log_id())
        self._cache.roll_to(active)
        if self.config.fsync_policy == FSYNC_POLICY_BATCH:  # its first round syncs the directory and the replayed
            self.group_sync = GroupSync(self.io, active.log_id, active.path, active.size,  # logs (a resend of an
                                        lambda: self.io.fsync_dir(self.logs_dir),  # entry in them is answered OK)
                                        [(log.log_id, log.path, log.size) for log in replayed.logs])
        self.recovery = replayed.report
        # The marker says "a bookie runs here"; a start that finds it knows the last stop was unclean.
        self.io.write_file_atomic(running_marker, str(os.getpid()).encode())

    def _release_dir_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def start_flusher(self) -> None:
        self._flusher = Flusher(self)
        self._flusher.start()

    def close(self) -> None:
        """Clean shutdown: flush every log (the active one too), advance the recovery point past all of them,
        remove the running marker. The next start replays nothing."""
        if self._closed or self.sync_failed_reason:  # a failed sync: no flush, no checkpoint (synclost.py)
            return None if self._closed else self.abandon()
        if self._flusher is not None:
            self._flusher.stop()
        with self._lock:
            self._closed = True
            active = self._cache.active
            if self.group_sync is not None:  # syncs the active log's waiters; no round uses its fd after this
                self.group_sync.roll(None, "", 0)
            if active is not None and active.size == LOG_HEADER_BYTES:
                self.io.close(active.fd)  # nothing in it: no need to flush, leave no empty file behind
                self.io.unlink(active.path)
                self._cache.active = None
            elif active is not None:
                self._cache.roll_to(None)
        if self.group_sync is not None:
            self.group_sync.shutdown()
        while self._flush.run():
            pass
        if self._cache.next_log_id > self._cache.recovery_point.log_id:
            # Every log is flushed; compaction logs past the point are durable and indexed: skip them next time.
            point = RecoveryPoint(self._cache.next_log_id)
            write_recovery_point(self.io, self.data_dir, moved_forward(self._cache.recovery_point, point))
            self._cache.advance_recovery_point(point)
        self.io.unlink(os.path.join(self.data_dir, RUNNING_MARKER_FILE))
        self.io.fsync_dir(self.data_dir)
        self._close_files()

    def abandon(self) -> None:
        """Drop everything without syncing or checkpointing, as a crash would (tests only)."""
        if self._flusher is not None:
            self._flusher.stop()
        self._closed = True
        if self.group_sync is not None:
            self.group_sync.abandon()
        self._close_files()

    def _close_files(self) -> None:
        self.read_fds.close_all()
        for entry_log in self._cache.logs():
            self.io.close(entry_log.fd)
        if self._index is not None:
            self._index.close()
            self._index = None
        self._release_dir_lock()

    @property
    def index(self) -> Index:
        if self._index is None:
            raise StorageError(pb.INTERNAL, "storage is closed")
        return self._index

    # ------------------------------------------------------------------------------------------------
    # Adds (the decisions and encoding: appends.py)

    def has_room(self, entries: int) -> bool:
        return self._cache.has_room(entries)

    def wait_for_room(self, entries: int, timeout_s: float) -> bool:
        """Block until the write cache has room for `entries` (the flusher frees it), or the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._room:
            while not self._cache.has_room(entries) and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._room.wait(left)
            return True

    def add_entries(self, ledger_id: int, master_key: bytes, entry_ids: list[int] | Any, payloads: list[bytes] | Any,
                    last_add_confirmed: int = -1, recovery: bool = False) -> Result:
        """Append a batch of one ledger's entries. Returns a result code per entry and the first error's text.

        Raises WriteCacheFull (nothing written) when the cache has no room; the caller waits and retries.
        An entry already stored with the same bytes is OK without a second copy (a resend); with other bytes
        it is DUPLICATE_MISMATCH.
        """
        return self.add_batch([LedgerBatch(ledger_id, master_key, entry_ids, payloads, last_add_confirmed,
                                           recovery)])[0]

    def repair_entries(self, ledger_id: int, master_key: bytes, entry_ids: list[int],
                       payloads: list[bytes]) -> Result:
        """The repair write (damage.py): each entry is written again only where its stored copy fails its
        checksum or its log is gone. A good copy stays (same bytes: OK; other bytes: DUPLICATE_MISMATCH); an
        entry not held here is NO_SUCH_ENTRY. Raises WriteCacheFull as add_entries does."""
        return self.add_batch([LedgerBatch(ledger_id, master_key, entry_ids, payloads, recovery=True,
                                           repair=True)])[0]

    def on_corrupt_read(self, callback: Callable[[int, int, str], None]) -> None:
        """Tell `callback` (ledger id, entry id, message) of every record a read answers CORRUPT."""
        self._reader.on_corrupt = callback

    def verify_entry(self, ledger_id: int, entry_id: int) -> str | None:
        """Re-read one entry's record and check its checksum: "" if it is good, why not if it is damaged
        (a flipped bit, a truncated or missing log), None if this bookie does not hold the entry."""
        try:
            return None if self._reader.read_existing(ledger_id, entry_id) is None else ""
        except StorageError as e:
            if e.code != pb.CORRUPT:
                raise
            return e.message

    def add_batch(self, batches: list[LedgerBatch], sync_wait: bool = True) -> list[Result]:
        """Append the batches of several ledgers (one add request) with one lock and one write: a request with
        many small per-ledger batches costs one syscall, not one per ledger. Results are per batch, in order.
        Raises WriteCacheFull before anything is written. Under fsync_policy=batch, without sync_wait the caller
        waits for `group_sync.point()` taken after this returns and applies `sync_failed` (the data plane)."""
        results: list[Result] = [([], "")] * len(batches)
        with self._lock:
            if self._closed or self._cache.active is None:
                return [([pb.INTERNAL] * len(b.entry_ids), "bookie is shutting down") for b in batches]
            group_sync = self.group_sync
            if group_sync is not None and group_sync.failure is not None:  # nothing more is acknowledged
                return self.sync_failed([([pb.OK] * len(b.entry_ids), "") for b in batches], group_sync.failure)
            if not self._cache.has_room(sum(len(b.entry_ids) for b in batches)):
                raise WriteCacheFull()
            group: list[int] = []
            seen: set[int] = set()
            for i, batch in enumerate(batches):
                if batch.ledger_id in seen:  # a ledger twice in one request: write what came before first
                    self._append_group_locked(batches, group, results)
                    group, seen = [], set()
                group.append(i)
                seen.add(batch.ledger_id)
            self._append_group_locked(batches, group, results)
            if group_sync is None or not sync_wait:
                return results
            point = group_sync.point()
        return self.sync_failed(results, group_sync.wait_blocking(point))

    def sync_failed(self, results: list[Result], error: OSError | None) -> list[Result]:
        """The results of an add once its group sync finished: unchanged if it succeeded; else every OK entry
        gets the failure's code (a full disk turns the bookie read-only) and is not acknowledged."""
        if error is None:
            return results
        code, message = self.sync_failure(error)
        return [([code if c == pb.OK else c for c in codes], text or message) for codes, text in results]

    def sync_failure(self, error: OSError) -> tuple[Code, str]:
        """The code and message of the adds a failed group sync covered; the bookie is read-only from now on."""
        self.note_sync_failed(error)
        return self._write_failed_code(error), failure_message(error)

    def _append_group_locked(self, batches: list[LedgerBatch], group: list[int], results: list[Result]) -> None:
        """Append the batches of `group` (each ledger at most once) with one write: refuse what must be
        refused, roll first if the group would not fit, encode into one buffer, write it, then account for
        what was written. On a failed write nothing of the group is kept and every written entry gets the
        failure's code."""
        accepted = []
        for i in group:
            refused = appends.refusal(batches[i], self.config, self._table, self.read_only_reason)
            if refused is not None:
                results[i] = refused
            else:
                accepted.append(i)
        if not accepted:
            return
        active = self._active_for_group_locked(batches, accepted, results)
        if active is None:
            return
        parts, staged, end = appends.encode_group(active, batches, accepted, results, self._table, self.config,
                                                  self._reader.read_existing)
        if not parts:
            return
        try:
            self.io.write_parts(active.fd, parts, end - active.size)
        except OSError as e:
            appends.unstage(staged)
            self._undo_partial_write_locked(active, e)
            appends.failed(results, accepted, self._write_failed_code(e),
                           f"write to entry log {active.log_id} failed: {e}")
            return
        faults.hit(faults.ADD_AFTER_WRITE)
        appends.account_written(active, staged, end, self._cache, self._table, self.clock())
        if self.group_sync is not None:
            self.group_sync.written(active.log_id, end)

    def _active_for_group_locked(self, batches: list[LedgerBatch], accepted: list[int],
                                 results: list[Result]) -> EntryLog | None:
        """The active log to write the group to, rolled first if the group would not fit it; None (with every
        result set) when a new log cannot be started."""
        cfg = self.config
        active = self._cache.active
        if active is None:  # checked by the caller under the lock
            raise RuntimeError("no active entry log under the engine lock")
        group_bytes, group_entries = appends.group_size(batches, accepted)
        if not should_roll(self._active_shape(active), Why.SIZE, add_bytes=group_bytes, add_entries=group_entries,
                           log_size_bytes_max=cfg.log_size_bytes_max,
                           write_cache_entries_max=cfg.write_cache_entries_max):
            return active
        try:
            return self._roll_locked()
        except OSError as e:
            code = self._write_failed_code(e)
            for i in accepted:
                results[i] = ([code] * len(batches[i].entry_ids), f"cannot start a new entry log: {e}")
            return None

    def _write_failed_code(self, error: OSError) -> Code:
        """The code for entries whose write failed; a full disk turns the bookie read-only at once, so
        writers move to other bookies (the disk monitor releases it below the low-water mark)."""
        if error.errno != errno.ENOSPC:
            return pb.INTERNAL
        self.note_disk_full()
        return pb.READ_ONLY

    def _undo_partial_write_locked(self, active: EntryLog, error: OSError) -> None:
        """A failed write may have left part of a batch in the log: cut it off so the log stays a clean
        sequence of acknowledged records. If even that fails the log cannot be trusted for appends: roll."""
        write_failures.error("append failed", f"append to entry log {active.log_id} failed: {error}")
        try:
            self.io.truncate(active.fd, active.size)
        except OSError as e:
            log.error("could not cut entry log %d back to %d bytes (%s): rolling it", active.log_id, active.size, e)
            try:
                self._roll_locked()
            except OSError as roll_error:
                log.error("could not start a new entry log either: %s", roll_error)

    # ------------------------------------------------------------------------------------------------
    # Rolling

    def _roll_locked(self) -> EntryLog:
        """Seal the active log, queue it for the flusher and start the next one. Returns the new active log."""
        new = create_entry_log(self.io, self.logs_dir, self._cache.allocate_log_id())  # ENOSPC: the old one stays
        if self.group_sync is not None:  # its next round syncs the old log whole and the new one's name
            self.group_sync.roll(new.log_id, new.path, new.size)
        self._cache.roll_to(new)
        if self.on_roll is not None:  # the flusher (its thread, or the caller's loop: start_flusher=False)
            self.on_roll()
        return new

    def allocate_log_id(self) -> int:
        """The next entry-log id: active logs and compaction logs share one increasing sequence."""
        with self._lock:
            return self._cache.allocate_log_id()

    def roll(self, min_bytes: int = 0, why: Why = Why.ASKED) -> bool:
        """Roll the active log if it holds records and more than `min_bytes`. Returns whether it rolled."""
        with self._lock:
            active = self._cache.active
            if self._closed or active is None or not should_roll(self._active_shape(active), why,
                                                                 min_bytes=min_bytes):
                return False
            self._roll_locked()
            return True

    def roll_if_older_than(self, age_s: float) -> bool:
        with self._lock:
            active = self._cache.active
            if self._closed or active is None or not should_roll(self._active_shape(active), Why.AGE,
                                                                 roll_interval_s=age_s):
                return False
            self._roll_locked()
            return True

    def _active_shape(self, active: EntryLog) -> ActiveLog:
        return ActiveLog(active.size, LOG_HEADER_BYTES, active.cache_entries,
                         self.clock() - active.first_write_monotonic)

    # ------------------------------------------------------------------------------------------------
    # Flushing (the step: flushstep.py; the thread: flusher.py)

    def flush_one(self) -> bool:
        """Flush the oldest rolled log: fsync it, commit its index entries, advance the recovery point.

        Returns False if there was nothing to flush. Raises on IO failure, leaving the log queued: the next
        attempt starts over, and every step is idempotent.
        """
        t0 = time.monotonic()
        flushed = self._flush.run()
        if flushed:
            self.flush_seconds_total += time.monotonic() - t0
            if self.on_flush is not None:
                self.on_flush(time.monotonic() - t0)
        return flushed

    def pending_flushes(self) -> int:
        return len(self._cache.rolled)

    @property
    def flushes(self) -> int:
        return self._flush.flushes

    @property
    def recovery_point_log_id(self) -> int:
        """The oldest log not known durable: startup scans from here."""
        return self._cache.recovery_point.log_id

    # ------------------------------------------------------------------------------------------------
    # Reads (reads.py)

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The payload of one entry, checksum verified. StorageError NO_SUCH_LEDGER / NO_SUCH_ENTRY / CORRUPT."""
        return self._reader.read_entry(ledger_id, entry_id)

    def read_many(self, ledger_id: int, ids: Iterable[int], max_entries: int, max_bytes: int,
                  stop_on_failure: bool, skip_missing: bool = False) -> list[ReadItem]:
        """Many entries of one ledger at once (reads.Reader.read_many): (entry id, code, payload, message) each."""
        return self._reader.read_many(ledger_id, ids, max_entries, max_bytes, stop_on_failure, skip_missing)

    def locate(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        """(log id, offset, record length) of a stored entry, None if it is not here."""
        return self._reader.locate(ledger_id, entry_id)

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        """The entry is stored here (in a log's cache or the index); its bytes are not checked."""
        return self._reader.locate(ledger_id, entry_id) is not None

    # ------------------------------------------------------------------------------------------------
    # Ledger state: LAC, fencing, write-close (the table: ledgers.py)

    @property
    def ledgers(self) -> Mapping[int, LedgerState]:
        """The ledger table, read-only (membership tests and iteration; writes go through the engine)."""
        return self._table.view

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        return self._table.get(ledger_id)

    def read_lac(self, ledger_id: int) -> LacInfo:
        state = self._table.get(ledger_id)
        if state is None:
            raise no_such_ledger(ledger_id)
        return LacInfo(state.last_add_confirmed, state.last_entry_id, state.fenced, self.tail_maybe_lost)

    def fence(self, ledger_id: int, master_key: bytes) -> LacInfo:
        """Fence a ledger (creating its state if this bookie never saw it) and sync the fence to disk.

        From the moment this takes the lock, adds without the recovery flag are refused; it returns only
        after the fence is durable in the ledger table.
        """
        if ledger_id < 0:
            raise StorageError(pb.INVALID, f"ledger id must be non-negative, got {ledger_id}")
        if not master_key or len(master_key) > MASTER_KEY_BYTES_MAX:
            raise StorageError(pb.INVALID, f"master key must be 1 to {MASTER_KEY_BYTES_MAX} bytes")
        with self._index_write_lock:
            with self._lock:
                state = self._table.get(ledger_id)
                if state is None:
                    state = self._table.create(ledger_id, master_key, dirty=False)  # its row is written below
                elif state.master_key != master_key:
                    raise unauthorized(ledger_id)
                newly = not state.fenced
                state.fenced = True
                row = state.row()
                active = self._cache.active
                roll = active is not None and ledger_id in active.cache
                self._append_fence_record_locked(ledger_id, state.master_key)
            self.index.put_ledger(ledger_id, row)
        faults.hit(faults.FENCE_AFTER_PERSIST)
        if newly:
            log.info("ledger %d fenced (last entry here %d): adds from its writer are refused from now on", ledger_id,
                     state.last_entry_id, extra={"event": "fence", "ledger_id": ledger_id})
        if roll:
            self.roll(self.config.log_rotate_on_close_bytes_min, Why.CLOSE)
        return LacInfo(state.last_add_confirmed, state.last_entry_id, True, self.tail_maybe_lost)

    def _append_fence_record_locked(self, ledger_id: int, master_key: bytes) -> None:
        """Record the fence in the active log too, so an index rebuilt from the logs keeps it. Best effort: the
        synced ledger table is what makes the fence durable before it is answered."""
        active = self._cache.active
        if active is None:
            return
        parts: list[bytes] = []
        if ledger_id not in active.cache:
            header, _ = encode_record(ledger_id, ENTRY_ID_LEDGER_KEY, master_key)
            parts += (header, master_key)
        header, _ = encode_record(ledger_id, ENTRY_ID_FENCE, b"")
        parts.append(header)
        data = b"".join(parts)
        try:
            self.io.write_at_end(active.fd, data)
        except OSError as e:
            write_failures.error("fence record failed", f"could not record the fence of ledger {ledger_id} in entry "
                                 f"log {active.log_id}: {e}")
            self._undo_partial_write_locked(active, e)
            return
        active.cache.setdefault(ledger_id, {})
        if active.size == LOG_HEADER_BYTES:
            active.first_write_monotonic = self.clock()
        active.size += len(data)

    def write_close(self, ledger_id: int, master_key: bytes) -> None:
        """The writer closed the ledger: from now on it takes recovery adds only, as after a fence, and so it
        stays across a restart. Unlike a fence this does not sync (a writer has closed the ledger in etcd first,
        and its close must stay cheap): the fence record goes in the active log and the row in the next flush,
        so a process crash keeps it and only a machine crash before that flush can forget it."""
        with self._lock:
            state = self._table.get(ledger_id)
            if state is None:
                raise no_such_ledger(ledger_id)
            if state.master_key != master_key:
                raise unauthorized(ledger_id)
            if not state.fenced:
                self._table.seal(ledger_id, state)
                self._append_fence_record_locked(ledger_id, state.master_key)
        self._roll_for(ledger_id)

    def _roll_for(self, ledger_id: int) -> None:
        """Seed 003: roll the active log when a ledger in it is closed or fenced, so its entries get synced
        and the log can later be collected; tiny logs are left to the roll interval."""
        with self._lock:
            active = self._cache.active
            if active is None or ledger_id not in active.cache:
                return
        self.roll(self.config.log_rotate_on_close_bytes_min, Why.CLOSE)

    # ------------------------------------------------------------------------------------------------
    # Space: deleted ledgers, log accounting, garbage collection (gc.py)

    def ledger_ids(self) -> set[int]:
        with self._lock:
            return set(self._table)

    def drop_ledgers(self, ledger_ids: list[int]) -> int:
        """Forget ledgers deleted from the cluster: their state, their cached locations in logs not yet
        flushed, their index entries and rows (one synced transaction). Returns index entries removed.
        Their records stay in the entry logs until collect_garbage deletes logs with nothing alive."""
        with self._index_write_lock:
            with self._room:
                ids = [lid for lid in ledger_ids if self._table.drop(lid)]
                for lid in ids:
                    self._cache.drop_ledger(lid)
                self._room.notify_all()
            removed = self.index.drop_ledgers(ids) if ids else 0
        if ids:
            log.info("dropped %d deleted ledgers (%d index entries)", len(ids), removed)
        return removed

    def log_accounting(self) -> dict[int, LogMeta]:
        """The accounting (size, bytes per ledger) of every flushed log: below the recovery point and not
        queued for the flusher. A log whose row is missing (lost index) is scanned and its row rebuilt."""
        metas = self.index.log_metas()
        with self._lock:
            point = self._cache.recovery_point.log_id
            unflushed = {entry_log.log_id for entry_log in self._cache.logs()}
        out: dict[int, LogMeta] = {}
        for name in sorted(self.io.listdir(self.logs_dir)):
            log_id = parse_log_file_name(name)
            if log_id is None or log_id >= point or log_id in unflushed:
                continue
            meta = metas.get(log_id)
            if meta is None:
                meta = self._scan_log_meta(log_id)
                self.index.put_log_meta(log_id, meta)
            out[log_id] = meta
        return out

    def _scan_log_meta(self, log_id: int) -> LogMeta:
        scan = scan_log(self.io, os.path.join(self.logs_dir, log_file_name(log_id)), log_id)
        ledger_bytes: dict[int, int] = {}
        for rec in scan.records:
            if rec.entry_id == ENTRY_ID_COMPACTED_FROM:
                continue
            ledger_bytes[rec.ledger_id] = ledger_bytes.get(rec.ledger_id, 0) + (rec.length if rec.entry_id >= 0 else 0)
        log.info("entry log %d: accounting rebuilt by a scan (%d ledgers)", log_id, len(ledger_bytes))
        return LogMeta(scan.file_size, ledger_bytes)

    def delete_log_file(self, log_id: int, sync_dir: bool = True) -> int:
        """Delete a flushed log (GC, compaction): close its read fd, unlink it. Returns its size (0 if it was
        already gone). Its accounting row is the caller's to forget, after the directory is synced."""
        size = self.read_fds.delete_file(log_id, os.path.join(self.logs_dir, log_file_name(log_id)))
        if size is None:
            return 0
        if sync_dir:
            self.io.fsync_dir(self.logs_dir)
        return size

    def collect_garbage(self) -> GcReport:
        """Delete the flushed logs none of whose ledgers is alive (gc.py)."""
        self.last_gc = gc.collect_garbage(self)
        self.gc_runs += 1
        self.gc_logs_deleted_total += self.last_gc.logs_deleted
        self.gc_bytes_reclaimed_total += self.last_gc.bytes_reclaimed
        return self.last_gc

    def disk_bytes(self) -> tuple[int, int]:
        """(live bytes, total bytes) of the flushed logs, from the accounting (status and tools)."""
        live = self.ledger_ids()
        metas = self.index.log_metas()
        return sum(m.live_bytes(live) for m in metas.values()), sum(m.total_bytes for m in metas.values())
