"""The bookie's storage engine: entry logs, the write cache, the durable index, ledger state, recovery.

Durability model (docs/durability.md):
- An add is acknowledged once its records are written into the active entry log (the OS page cache). The add
  path never fsyncs, unless fsync_policy is "batch".
- A full active log is rolled. The background flusher (flusher.py) fsyncs each rolled log, then commits the
  index entries that cover it (one synced LMDB transaction), then advances the recovery point. The index is
  therefore never durable pointing into bytes that are not.
- Startup scans only the logs at or after the recovery point (recovery.py) and hands them to the flusher.
- A fence is synced to the ledger table before it is answered, and survives any restart.

Threads: the gRPC server calls the add, read and fence methods from its event loop (or an executor); the
flusher runs in its own thread. `_lock` guards the active log, the rolled list, the ledger table and the
caches; `_index_write_lock` serialises ledger-row writes so a fence is never overwritten by an older row.
"""

from __future__ import annotations

import errno
import logging
import operator
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import islice
from types import MappingProxyType
from typing import Any

from crc32c import crc32c as _crc32c

from octavo.node import faults, startup
from octavo.node.checkpoint import (
    NodeState,
    RecoveryPoint,
    write_recovery_point,
)
from octavo.node.compaction import recover_interrupted
from octavo.node.config import FSYNC_POLICY_BATCH, NodeConfig
from octavo.node.entrylog import (
    CACHE_ENTRY_BYTES_ESTIMATE,
    FLUSHED,
    LOCATION_LENGTH_BITS,
    ROLLED,
    EntryLog,
)
from octavo.node.errors import Code, StorageError, WriteCacheFull, fenced, no_such_entry, no_such_ledger, unauthorized
from octavo.node.fileio import FileIO
from octavo.node.files import INDEX_DIR, LOGS_DIR, RUNNING_MARKER_FILE, log_file_name, parse_log_file_name
from octavo.node.flusher import Flusher
from octavo.node.index import MASTER_KEY_BYTES_MAX, Index, LogMeta
from octavo.node.ledgers import LedgerState
from octavo.node.readfds import ReadFds
from octavo.node.record import (
    CRC_FIELD,
    ENTRY_ID_COMPACTED_FROM,
    ENTRY_ID_FENCE,
    ENTRY_ID_LEDGER_KEY,
    LOG_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    RECORD_ID_BYTES,
    RECORD_META,
    RecordFormatError,
    decode_record,
    encode_record,
)
from octavo.node.recovery import scan_log
from octavo.node.rolling import ActiveLog, Why, should_roll
from octavo.node.startup import RecoveryReport, current_boot_id
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

OK = pb.OK


def _encode_records(ledger_id: int, entry_ids: Any, payloads: Any, parts: list[bytes], cache: dict[int, int],
                    offset: int) -> int:
    """Append the records of (entry id, payload) pairs to `parts`, note each one's location in `cache`, and
    return the offset after the last one. The hot loop of the add path: record.encode_record inlined (the
    same bytes: crc32c over body length, ids and payload, then the header), without per-call overhead."""
    pack_meta = RECORD_META.pack
    pack_crc = CRC_FIELD.pack
    crc32c = _crc32c
    extend = parts.extend
    overhead = RECORD_HEADER_BYTES
    for eid, payload in zip(entry_ids, payloads, strict=True):
        size = len(payload)
        meta = pack_meta(size + RECORD_ID_BYTES, ledger_id, eid)
        extend((pack_crc(crc32c(payload, crc32c(meta))), meta, payload))
        cache[eid] = offset << LOCATION_LENGTH_BITS | (size + overhead)
        offset += size + overhead
    return offset


# A batch encoded for the active log, to account for once written: the batch, its ledger's state, the
# ledger's cache in the log, whether that cache is new, and the entry ids written.
_Staged = tuple["LedgerBatch", LedgerState, dict[int, int], bool, list[int]]


@dataclass
class GcReport:
    """What one garbage-collection pass did."""

    logs_checked: int = 0
    logs_deleted: int = 0
    bytes_reclaimed: int = 0
    ledgers_dropped: int = 0
    duration_s: float = 0.0
    finished_unix_ms: int = 0


@dataclass(slots=True)
class LedgerBatch:
    """One ledger's part of an add request."""

    ledger_id: int
    master_key: bytes
    entry_ids: list[int] | Any
    payloads: list[bytes] | Any
    last_add_confirmed: int = -1
    recovery: bool = False


@dataclass(frozen=True)
class LacInfo:
    last_add_confirmed: int
    last_entry_id: int
    fenced: bool
    tail_maybe_lost: bool


class Storage:
    """Open with Storage.open(config); close with close() (clean: syncs all, nothing to replay next time)."""

    def __init__(self, config: NodeConfig, io: FileIO, clock: Callable[[], float] = time.monotonic) -> None:
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
        self._next_log_id = 0
        # GC and compaction passes never overlap (both delete logs and rewrite the accounting).
        self.space_lock = threading.Lock()
        # Why adds are refused (the disk monitor sets it: disk.py); empty while the bookie is writable.
        self.read_only_reason = ""
        # An add failed with ENOSPC: the disk monitor turns the bookie read-only at its next check.
        self.disk_full_seen = False
        self._ledgers: dict[int, LedgerState] = {}
        self._ledgers_view = MappingProxyType(self._ledgers)
        self._dirty_ledgers: set[int] = set()
        self._rolled: deque[EntryLog] = deque()
        self._active: EntryLog | None = None
        self._cache_entries = 0
        self._recovery_point = RecoveryPoint(0)
        self._closed = False
        self._lock_fd = -1
        self.node_state: NodeState | None = None
        self.fresh_instance = False  # this start created the data directory's identity
        # True after an unclean stop across a reboot (or power loss): the unsynced tail may be gone, so "no
        # such entry" becomes UNKNOWN and fenced LAC reads say tail_maybe_lost (BookKeeper's BP-46).
        self.tail_maybe_lost = False
        self.recovery = RecoveryReport()
        self.started_unix_ms = int(time.time() * 1000)
        self.last_flush_error = ""
        self.flushes = 0
        self.last_gc: GcReport | None = None
        self._flusher: Any = None
        self._index: Index | None = None

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
        for lid, row in self._index.load_ledgers().items():
            self._ledgers[lid] = LedgerState(row.master_key, row.fenced, row.last_add_confirmed,
                                             row.durable_last_entry_id, row.durable_last_entry_id)
        point = startup.choose_recovery_point(self.io, self.data_dir, index_existed)
        self._recovery_point = point
        recover_interrupted(self)  # each roll-back or finish is logged
        replayed = startup.replay_logs(self.io, self.logs_dir, point, unclean, self._ledgers)
        self._dirty_ledgers |= replayed.new_ledgers
        self._rolled.extend(replayed.logs)
        self._cache_entries += sum(entry_log.cache_entries for entry_log in replayed.logs)
        self._next_log_id = replayed.next_log_id
        self._active = self._create_active_log(self._allocate_log_id_locked())
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
        if self._closed:
            return
        if self._flusher is not None:
            self._flusher.stop()
        with self._lock:
            self._closed = True
            active = self._active
            if active is not None and active.size == LOG_HEADER_BYTES:
                self.io.close(active.fd)  # nothing in it: no need to flush, leave no empty file behind
                self.io.unlink(active.path)
                self._active = None
            elif active is not None:
                active.state = ROLLED
                self._rolled.append(active)
                self._active = None
        while self._rolled:
            self.flush_one()
        if self._next_log_id > self._recovery_point.log_id:
            # Every log is flushed; compaction logs past the point are durable and indexed: skip them next time.
            self._recovery_point = RecoveryPoint(self._next_log_id)
            write_recovery_point(self.io, self.data_dir, self._recovery_point)
        self.io.unlink(os.path.join(self.data_dir, RUNNING_MARKER_FILE))
        self.io.fsync_dir(self.data_dir)
        self._close_files()

    def abandon(self) -> None:
        """Drop everything without syncing or checkpointing, as a crash would (tests only)."""
        if self._flusher is not None:
            self._flusher.stop()
        self._closed = True
        self._close_files()

    def _close_files(self) -> None:
        self.read_fds.close_all()
        for entry_log in [*self._rolled, *([self._active] if self._active else [])]:
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
    # Adds

    def has_room(self, entries: int) -> bool:
        return self._cache_entries + entries <= self.config.write_cache_entries_max

    def wait_for_room(self, entries: int, timeout_s: float) -> bool:
        """Block until the write cache has room for `entries` (the flusher frees it), or the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._room:
            while not self.has_room(entries) and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._room.wait(left)
            return True

    def add_entries(self, ledger_id: int, master_key: bytes, entry_ids: list[int] | Any, payloads: list[bytes] | Any,
                    last_add_confirmed: int = -1, recovery: bool = False) -> tuple[list[Code], str]:
        """Append a batch of one ledger's entries. Returns a result code per entry and the first error's text.

        Raises WriteCacheFull (nothing written) when the cache has no room; the caller waits and retries.
        An entry already stored with the same bytes is OK without a second copy (a resend); with other bytes
        it is DUPLICATE_MISMATCH.
        """
        return self.add_batch([LedgerBatch(ledger_id, master_key, entry_ids, payloads, last_add_confirmed,
                                           recovery)])[0]

    def add_batch(self, batches: list[LedgerBatch]) -> list[tuple[list[Code], str]]:
        """Append the batches of several ledgers (one add request) with one lock and one write: a request with
        many small per-ledger batches costs one syscall, not one per ledger. Results are per batch, in order.
        Raises WriteCacheFull before anything is written."""
        results: list[tuple[list[Code], str]] = [([], "")] * len(batches)
        with self._lock:
            if self._closed or self._active is None:
                return [([pb.INTERNAL] * len(b.entry_ids), "bookie is shutting down") for b in batches]
            if not self.has_room(sum(len(b.entry_ids) for b in batches)):
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
        return results

    def _refusal(self, batch: LedgerBatch) -> tuple[list[Code], str] | None:
        """Why a batch is refused as a whole, or None."""
        cfg = self.config
        n = len(batch.entry_ids)
        ledger_id = batch.ledger_id
        if ledger_id < 0:
            return [pb.INVALID] * n, f"ledger id must be non-negative, got {ledger_id}"
        if len(batch.payloads) != n:
            return [pb.INVALID] * n, f"{n} entry ids but {len(batch.payloads)} payloads"
        if n > cfg.batch_entries_max:
            return [pb.TOO_LARGE] * n, f"batch of {n} entries is over batch_entries_max={cfg.batch_entries_max}"
        if n and self.read_only_reason and not batch.recovery:
            return [pb.READ_ONLY] * n, f"this bookie is {self.read_only_reason}"
        if not batch.master_key or len(batch.master_key) > MASTER_KEY_BYTES_MAX:
            return [pb.INVALID] * n, (f"master key must be 1 to {MASTER_KEY_BYTES_MAX} bytes, got "
                                      f"{len(batch.master_key)}")
        state = self._ledgers.get(ledger_id)
        if state is not None:
            if state.master_key != batch.master_key:
                return [pb.UNAUTHORIZED] * n, unauthorized(ledger_id).message
            if state.fenced and not batch.recovery:
                return [pb.FENCED] * n, fenced(ledger_id).message
        return None

    def _append_group_locked(self, batches: list[LedgerBatch], group: list[int],
                             results: list[tuple[list[Code], str]]) -> None:
        """Append the batches of `group` (each ledger at most once) with one write: refuse what must be
        refused, roll first if the group would not fit, encode into one buffer, write it, then account for
        what was written. On a failed write nothing of the group is kept and every written entry gets the
        failure's code."""
        accepted = self._accepted_locked(batches, group, results)
        if not accepted:
            return
        active = self._active_for_group_locked(batches, accepted, results)
        if active is None:
            return
        parts, staged, end = self._encode_group_locked(active, batches, accepted, results)
        if not parts:
            return
        try:
            self.io.write_parts(active.fd, parts, end - active.size)
            if self.config.fsync_policy == FSYNC_POLICY_BATCH:
                self.io.fdatasync(active.fd)
        except OSError as e:
            self._write_failed_locked(active, e, batches, accepted, staged, results)
            return
        faults.hit(faults.ADD_AFTER_WRITE)
        self._account_written_locked(active, staged, end)

    def _accepted_locked(self, batches: list[LedgerBatch], group: list[int],
                         results: list[tuple[list[Code], str]]) -> list[int]:
        """The batches of the group that are not refused as a whole (their results are set)."""
        accepted = []
        for i in group:
            refused = self._refusal(batches[i])
            if refused is not None:
                results[i] = refused
            else:
                accepted.append(i)
        return accepted

    def _active_for_group_locked(self, batches: list[LedgerBatch], accepted: list[int],
                                 results: list[tuple[list[Code], str]]) -> EntryLog | None:
        """The active log to write the group to, rolled first if the group would not fit it; None (with every
        result set) when a new log cannot be started."""
        cfg = self.config
        active = self._active
        if active is None:  # checked by the caller under the lock
            raise RuntimeError("no active entry log under the engine lock")
        group_bytes = sum(sum(map(len, batches[i].payloads)) + len(batches[i].entry_ids) * RECORD_HEADER_BYTES
                          + len(batches[i].master_key) + RECORD_HEADER_BYTES for i in accepted)
        group_entries = sum(len(batches[i].entry_ids) for i in accepted)
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

    def _encode_group_locked(self, active: EntryLog, batches: list[LedgerBatch], accepted: list[int],
                             results: list[tuple[list[Code], str]]) -> tuple[list[bytes], list[_Staged], int]:
        """Encode the accepted batches for the active log: the parts to write, what each batch will add to
        the caches and the ledger table once written, and the log's size after the write."""
        cfg = self.config
        parts: list[bytes] = []
        offset = active.size
        staged: list[_Staged] = []
        for i in accepted:
            batch = batches[i]
            state = self._ledgers.get(batch.ledger_id)
            if not batch.entry_ids:  # a LAC-only add (the writer went idle): nothing to write
                if state is not None and batch.last_add_confirmed > state.last_add_confirmed:
                    state.last_add_confirmed = batch.last_add_confirmed
                    self._dirty_ledgers.add(batch.ledger_id)
                results[i] = ([], "")
                continue
            if state is None:
                state = LedgerState(batch.master_key)
                self._ledgers[batch.ledger_id] = state
                self._dirty_ledgers.add(batch.ledger_id)
            codes: list[Code] = [OK] * len(batch.entry_ids)
            cache = active.cache.get(batch.ledger_id)
            new_cache = cache is None
            if cache is None:
                cache = {}
                header, length = encode_record(batch.ledger_id, ENTRY_ID_LEDGER_KEY, batch.master_key)
                parts += (header, batch.master_key)
                offset += length
            ids, payloads = batch.entry_ids, batch.payloads
            message = ""
            if ids and ids[0] > state.last_entry_id and max(map(len, payloads)) <= cfg.entry_size_bytes_max \
                    and all(map(operator.lt, ids, islice(ids, 1, None))):
                # The writer's normal case: new ids, increasing, within limits; no per-entry checks needed.
                offset = _encode_records(batch.ledger_id, ids, payloads, parts, cache, offset)
                written = list(ids)
            else:
                offset, written, message = self._encode_checked_locked(batch.ledger_id, state.last_entry_id, ids,
                                                                       payloads, codes, parts, cache, offset)
            results[i] = (codes, message)
            staged.append((batch, state, cache, new_cache, written))
        return parts, staged, offset

    def _write_failed_locked(self, active: EntryLog, error: OSError, batches: list[LedgerBatch],
                             accepted: list[int], staged: list[_Staged],
                             results: list[tuple[list[Code], str]]) -> None:
        """Undo a failed write: drop the locations it would have added, cut the log back, fail its entries."""
        for _, _, cache, new_cache, written in staged:
            if not new_cache:
                for eid in written:
                    cache.pop(eid, None)
        self._undo_partial_write_locked(active, error)
        failed = self._write_failed_code(error)
        for i in accepted:
            codes, _ = results[i]
            results[i] = ([failed if c == OK else c for c in codes],
                          f"write to entry log {active.log_id} failed: {error}")

    def _account_written_locked(self, active: EntryLog, staged: list[_Staged], end: int) -> None:
        """After the write: the log's size, its caches and the ledger table."""
        if active.size == LOG_HEADER_BYTES:
            active.first_write_monotonic = self.clock()
        active.size = end
        for batch, state, cache, new_cache, written in staged:
            if new_cache:
                active.cache[batch.ledger_id] = cache
            active.cache_entries += len(written)
            self._cache_entries += len(written)
            if written:
                top = max(written)
                if top > state.last_entry_id:
                    state.last_entry_id = top
            if batch.last_add_confirmed > state.last_add_confirmed:
                state.last_add_confirmed = batch.last_add_confirmed
                self._dirty_ledgers.add(batch.ledger_id)

    def _encode_checked_locked(self, ledger_id: int, last: int, entry_ids: Any, payloads: Any, codes: list[Code],
                               parts: list[bytes], cache: dict[int, int], offset: int) -> tuple[int, list[int], str]:
        """Encode a batch entry by entry: invalid ids and oversized entries get their codes, entries already
        stored are compared (same bytes: OK, no second copy; other bytes: DUPLICATE_MISMATCH)."""
        size_max = self.config.entry_size_bytes_max
        message = ""
        written: list[int] = []
        batch_new: dict[int, bytes] = {}
        for i in range(len(entry_ids)):
            eid = entry_ids[i]
            payload = payloads[i]
            if eid < 0:
                codes[i] = pb.INVALID
                message = message or f"entry id must be non-negative, got {eid}"
                continue
            if len(payload) > size_max:
                codes[i] = pb.TOO_LARGE
                message = message or f"entry {eid} is {len(payload)} bytes, over entry_size_bytes_max={size_max}"
                continue
            if eid <= last or eid in batch_new:
                existing = batch_new.get(eid)
                if existing is None:
                    existing = self._read_existing_locked(ledger_id, eid)
                if existing is not None:
                    if existing != payload:
                        codes[i] = pb.DUPLICATE_MISMATCH
                        message = message or f"entry {eid} of ledger {ledger_id} is already stored with different bytes"
                    continue  # already stored with these bytes: acknowledged without a second copy
            offset = _encode_records(ledger_id, (eid,), (payload,), parts, cache, offset)
            batch_new[eid] = payload
            written.append(eid)
        return offset, written, message

    def _write_failed_code(self, error: OSError) -> Code:
        """The code for entries whose write failed; a full disk turns the bookie read-only at once, so
        writers move to other bookies (the disk monitor releases it below the low-water mark)."""
        if error.errno != errno.ENOSPC:
            return pb.INTERNAL
        self.disk_full_seen = True
        self.read_only_reason = self.read_only_reason or "read-only: the disk is full (ENOSPC on an add)"
        return pb.READ_ONLY

    def _undo_partial_write_locked(self, active: EntryLog, error: OSError) -> None:
        """A failed write may have left part of a batch in the log: cut it off so the log stays a clean
        sequence of acknowledged records. If even that fails the log cannot be trusted for appends: roll."""
        log.error("append to entry log %d failed: %s", active.log_id, error)
        try:
            self.io.truncate(active.fd, active.size)
        except OSError as e:
            log.error("could not cut entry log %d back to %d bytes (%s): rolling it", active.log_id, active.size, e)
            try:
                self._roll_locked()
            except OSError as roll_error:
                log.error("could not start a new entry log either: %s", roll_error)

    def _read_existing_locked(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The stored payload of an entry, None if this bookie does not hold it. Looks the location up
        directly: read_entry's UNKNOWN (a bookie in doubt after a reboot) is for readers, and must not stop
        the lost entry from being written back."""
        if self._locate(ledger_id, entry_id) is None:
            return None
        return self.read_entry(ledger_id, entry_id)

    def _roll_locked(self) -> EntryLog:
        """Seal the active log, queue it for the flusher and start the next one. Returns the new active log."""
        old = self._active
        assert old is not None
        new = self._create_active_log(self._allocate_log_id_locked())  # may raise (ENOSPC): the old log stays active
        old.state = ROLLED
        self._rolled.append(old)
        self._active = new
        if self._flusher is not None:
            self._flusher.wake()
        return self._active

    def allocate_log_id(self) -> int:
        """The next entry-log id: active logs and compaction logs share one increasing sequence."""
        with self._lock:
            return self._allocate_log_id_locked()

    def _allocate_log_id_locked(self) -> int:
        log_id = self._next_log_id
        self._next_log_id += 1
        return log_id

    def _create_active_log(self, log_id: int) -> EntryLog:
        entry_log = EntryLog.create(self.io, self.logs_dir, log_id)
        if self.config.fsync_policy == FSYNC_POLICY_BATCH:
            # Under the paranoid policy an acknowledged entry must survive a power loss on its own: the new
            # file's directory entry has to be durable before the first fdatasync of its records counts.
            self.io.fsync_dir(self.logs_dir)
        return entry_log

    def roll(self, min_bytes: int = 0, why: Why = Why.ASKED) -> bool:
        """Roll the active log if it holds records and more than `min_bytes`. Returns whether it rolled."""
        with self._lock:
            active = self._active
            if self._closed or active is None or not should_roll(self._active_shape(active), why,
                                                                 min_bytes=min_bytes):
                return False
            self._roll_locked()
            return True

    def roll_if_older_than(self, age_s: float) -> bool:
        with self._lock:
            active = self._active
            if self._closed or active is None or not should_roll(self._active_shape(active), Why.AGE,
                                                                 roll_interval_s=age_s):
                return False
            self._roll_locked()
            return True

    def _active_shape(self, active: EntryLog) -> ActiveLog:
        return ActiveLog(active.size, LOG_HEADER_BYTES, active.cache_entries,
                         self.clock() - active.first_write_monotonic)

    # ------------------------------------------------------------------------------------------------
    # Background flush (called by the flusher thread, and by close())

    def flush_one(self) -> bool:
        """Flush the oldest rolled log: fsync it, commit its index entries, advance the recovery point.

        Returns False if there was nothing to flush. Raises on IO failure, leaving the log queued: the next
        attempt starts over, and every step is idempotent.
        """
        with self._lock:
            if not self._rolled:
                return False
            entry_log = self._rolled[0]
        self.io.fsync(entry_log.fd)
        self.io.fsync_dir(self.logs_dir)
        faults.hit(faults.FLUSH_AFTER_LOG_SYNC)
        with self._index_write_lock:
            with self._lock:
                for lid, cached in entry_log.cache.items():
                    state = self._ledgers[lid]
                    top = max(cached, default=-1)
                    if top > state.durable_last_entry_id:
                        state.durable_last_entry_id = top
                    self._dirty_ledgers.add(lid)
                dirty = self._dirty_ledgers
                self._dirty_ledgers = set()
                rows = {lid: self._ledgers[lid].row() for lid in dirty}
            try:
                self.index.commit_checkpoint(entry_log.log_id, entry_log.cache, rows, entry_log.size)
            except BaseException:
                with self._lock:
                    self._dirty_ledgers |= dirty
                raise
        faults.hit(faults.FLUSH_AFTER_INDEX_COMMIT)
        with self._lock:
            # The point moves to the oldest log not flushed yet. Compaction logs (ids from the same sequence)
            # in between are durable and indexed before they get a log name, so the point may pass them.
            if len(self._rolled) > 1:
                next_unflushed = self._rolled[1].log_id
            else:
                next_unflushed = self._active.log_id if self._active is not None else self._next_log_id
        point = RecoveryPoint(next_unflushed)
        write_recovery_point(self.io, self.data_dir, point)
        faults.hit(faults.FLUSH_AFTER_RECOVERY_POINT)
        with self._room:
            self._recovery_point = point
            self._rolled.popleft()
            entry_log.state = FLUSHED
            entry_log.cache = {}
            self._cache_entries -= entry_log.cache_entries
            entry_log.cache_entries = 0
            self._room.notify_all()
        self.read_fds.adopt(entry_log.log_id, entry_log.fd)
        self.flushes += 1
        return True

    def pending_flushes(self) -> int:
        return len(self._rolled)

    # ------------------------------------------------------------------------------------------------
    # Reads

    def _locate(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        # Caches first, newest log first, then the index: a cache is dropped only after its entries are
        # committed to the index, so an entry is always in one or the other.
        active = self._active
        if active is not None:
            found = active.locate(ledger_id, entry_id)
            if found is not None:
                return found
        for entry_log in reversed(list(self._rolled)):
            found = entry_log.locate(ledger_id, entry_id)
            if found is not None:
                return found
        return self.index.get(ledger_id, entry_id)

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The payload of one entry, checksum verified. StorageError NO_SUCH_LEDGER / NO_SUCH_ENTRY / CORRUPT."""
        if ledger_id < 0 or entry_id < 0:
            raise StorageError(pb.INVALID, f"ids must be non-negative, got ledger {ledger_id} entry {entry_id}")
        loc = self._locate(ledger_id, entry_id)
        if loc is None:
            if self.tail_maybe_lost:
                raise StorageError(pb.UNKNOWN, f"entry {entry_id} of ledger {ledger_id} is not here, but this "
                                               "bookie restarted after a machine crash and may have lost it")
            if ledger_id not in self._ledgers:
                raise no_such_ledger(ledger_id)
            raise no_such_entry(ledger_id, entry_id)
        log_id, offset, length = loc
        try:
            try:
                data = self._pread(log_id, length, offset)
            except FileNotFoundError:
                # Compaction deleted the log after we looked its location up; the index already points at
                # the copy (it is switched before the old log goes).
                loc = self._locate(ledger_id, entry_id)
                if loc is None or loc[0] == log_id:
                    raise
                log_id, offset, length = loc
                data = self._pread(log_id, length, offset)
            return decode_record(data, ledger_id, entry_id).payload
        except (RecordFormatError, OSError) as e:
            log.error("entry %d of ledger %d in log %d at %d: %s", entry_id, ledger_id, log_id, offset, e)
            raise StorageError(pb.CORRUPT, f"entry {entry_id} of ledger {ledger_id} is unreadable on this "
                                           f"bookie (log {log_id} offset {offset}): {e}") from e

    def _pread(self, log_id: int, length: int, offset: int) -> bytes:
        return self.read_fds.pread(log_id, length, offset, self._unflushed_fd)

    def _unflushed_fd(self, log_id: int) -> int | None:
        """The fd of the active or a rolled log (not yet flushed), None for any other log."""
        active = self._active
        if active is not None and active.log_id == log_id:
            return active.fd
        for entry_log in self._rolled:
            if entry_log.log_id == log_id:
                return entry_log.fd
        return None

    # ------------------------------------------------------------------------------------------------
    # Ledger state: LAC, fencing, write-close

    @property
    def ledgers(self) -> Mapping[int, LedgerState]:
        """The ledger table, read-only (membership tests and iteration; writes go through the engine)."""
        return self._ledgers_view

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        """The entry is stored here (in a log's cache or the index); its bytes are not checked."""
        return self._locate(ledger_id, entry_id) is not None

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        return self._ledgers.get(ledger_id)

    def read_lac(self, ledger_id: int) -> LacInfo:
        state = self._ledgers.get(ledger_id)
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
                state = self._ledgers.get(ledger_id)
                if state is None:
                    state = LedgerState(master_key)
                    self._ledgers[ledger_id] = state
                elif state.master_key != master_key:
                    raise unauthorized(ledger_id)
                state.fenced = True
                row = state.row()
                roll = self._active is not None and ledger_id in self._active.cache
                self._append_fence_record_locked(ledger_id, state.master_key)
            self.index.put_ledger(ledger_id, row)
        faults.hit(faults.FENCE_AFTER_PERSIST)
        if roll:
            self.roll(self.config.log_rotate_on_close_bytes_min, Why.CLOSE)
        return LacInfo(state.last_add_confirmed, state.last_entry_id, True, self.tail_maybe_lost)

    def _append_fence_record_locked(self, ledger_id: int, master_key: bytes) -> None:
        """Record the fence in the active log too, so an index rebuilt from the logs keeps it. Best effort: the
        synced ledger table is what makes the fence durable before it is answered."""
        active = self._active
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
            log.error("could not record the fence of ledger %d in entry log %d: %s", ledger_id, active.log_id, e)
            self._undo_partial_write_locked(active, e)
            return
        active.cache.setdefault(ledger_id, {})
        if active.size == LOG_HEADER_BYTES:
            active.first_write_monotonic = self.clock()
        active.size += len(data)

    def write_close(self, ledger_id: int, master_key: bytes) -> None:
        state = self._ledgers.get(ledger_id)
        if state is None:
            raise no_such_ledger(ledger_id)
        if state.master_key != master_key:
            raise unauthorized(ledger_id)
        self._roll_for(ledger_id)

    def _roll_for(self, ledger_id: int) -> None:
        """Seed 003: roll the active log when a ledger in it is closed or fenced, so its entries get synced
        and the log can later be collected; tiny logs are left to the roll interval."""
        with self._lock:
            active = self._active
            if active is None or ledger_id not in active.cache:
                return
        self.roll(self.config.log_rotate_on_close_bytes_min, Why.CLOSE)

    # ------------------------------------------------------------------------------------------------
    # Garbage collection (docs/durability.md, "Garbage collection")

    def ledger_ids(self) -> set[int]:
        with self._lock:
            return set(self._ledgers)

    def drop_ledgers(self, ledger_ids: list[int]) -> int:
        """Forget ledgers deleted from the cluster: their state, their cached locations in logs not yet
        flushed, their index entries and rows (one synced transaction). Returns index entries removed.
        Their records stay in the entry logs until collect_garbage deletes logs with nothing alive."""
        with self._index_write_lock:
            with self._room:
                ids = [lid for lid in ledger_ids if lid in self._ledgers]
                for lid in ids:
                    del self._ledgers[lid]
                    self._dirty_ledgers.discard(lid)
                    for entry_log in [*self._rolled, *([self._active] if self._active else [])]:
                        entries = entry_log.cache.pop(lid, None)
                        if entries:
                            entry_log.cache_entries -= len(entries)
                            self._cache_entries -= len(entries)
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
            point = self._recovery_point.log_id
            unflushed = {entry_log.log_id for entry_log in [*self._rolled, *([self._active] if self._active else [])]}
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
        scan = scan_log(self.io, os.path.join(self.logs_dir, f"{log_id:016x}.log"), log_id)
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
        """Delete the flushed logs (below the recovery point) none of whose ledgers is alive. The active log
        and logs not yet flushed are never candidates. An interrupted compaction is finished first."""
        t0 = time.monotonic()
        report = GcReport()
        with self.space_lock:
            recover_interrupted(self)
            live = self.ledger_ids()
            deleted = []
            for log_id, meta in self.log_accounting().items():
                report.logs_checked += 1
                if any(lid in live for lid in meta.ledger_bytes):
                    continue
                report.bytes_reclaimed += self.delete_log_file(log_id, sync_dir=False)
                report.logs_deleted += 1
                deleted.append(log_id)
            if deleted:
                self.io.fsync_dir(self.logs_dir)
                for log_id in deleted:
                    self.index.forget_log(log_id)
                log.info("GC deleted %d entry logs, %d bytes", report.logs_deleted, report.bytes_reclaimed)
        report.duration_s = time.monotonic() - t0
        report.finished_unix_ms = int(time.time() * 1000)
        self.last_gc = report
        return report

    def disk_bytes(self) -> tuple[int, int]:
        """(live bytes, total bytes) of the flushed logs, from the accounting (status and tools)."""
        live = self.ledger_ids()
        metas = self.index.log_metas()
        return sum(m.live_bytes(live) for m in metas.values()), sum(m.total_bytes for m in metas.values())

    # ------------------------------------------------------------------------------------------------
    # Status

    def status(self) -> dict[str, Any]:
        with self._lock:
            logs = [(entry_log.log_id, entry_log.size, entry_log.state)
                    for entry_log in [*self._rolled, *([self._active] if self._active else [])]]
            active_id = self._active.log_id if self._active else -1
        live = {i for i, _, _ in logs}
        for name in self.io.listdir(self.logs_dir):
            log_id = parse_log_file_name(name)
            if log_id is not None and log_id not in live:
                try:
                    logs.append((log_id, self.io.file_size(os.path.join(self.logs_dir, name)), FLUSHED))
                except FileNotFoundError:
                    continue
        logs.sort()
        assert self.node_state is not None
        return {
            "instance_id": self.node_state.instance_id,
            "recovery_point_log_id": self._recovery_point.log_id,
            "active_log_id": active_id,
            "entry_logs": logs,
            "write_cache_entries": self._cache_entries,
            "write_cache_entries_max": self.config.write_cache_entries_max,
            "write_cache_bytes_estimate": self._cache_entries * CACHE_ENTRY_BYTES_ESTIMATE,
            "ledger_count": len(self._ledgers),
            "unclean_restart_count": self.node_state.unclean_restart_count,
            "last_unclean_restart_unix_ms": self.node_state.last_unclean_restart_unix_ms,
            "last_start_was_unclean": self.recovery.unclean,
            "tail_maybe_lost": self.tail_maybe_lost,
            "recovery": self.recovery,
            "last_flush_error": self.last_flush_error,
        }

