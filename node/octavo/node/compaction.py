"""Transactional compaction of entry logs (seed 001's phases with seed 000's fixes; docs/durability.md).

A flushed log whose live bytes (bytes of ledgers still alive, from the per-log accounting in the index) are a
small share of its size is rewritten: its live records are copied into a **separate compaction log** and the
old log is deleted. Several such logs may share one compaction log, as long as their live bytes fit in one
log size, so compaction never needs more than about one log of free space.

Phases, each visible on disk by a file suffix, and what startup (or the next pass) does after a crash in it:

| phase                                  | on disk                          | after a crash                          |
|----------------------------------------|----------------------------------|----------------------------------------|
| 1 copy live records                    | `<C>.log.compacting`             | roll back: delete the compaction log   |
| 2 fsync, then rename: marked complete  | `<C>.log.compacted` (synced)     | finish: phases 3 and 4 from the file   |
| 3 switch the index (synced)            | `<C>.log.compacted`              | finish: phase 3 again is a no-op       |
| 4 delete the old logs, then rename     | `<C>.log` + no sources           | nothing left to do                     |

The compaction log carries its own description: the records are copied byte for byte (a record's checksum
covers its ids and payload, not its place), and the last record (ENTRY_ID_COMPACTED_FROM) lists the logs it
replaces, written after the last copy and before the fsync. Phase 3 points an index entry at the copy only
where it still points into one of those logs, so a ledger dropped meanwhile stays dropped, and redoing the
phase changes nothing. The old logs are deleted before the compaction log gets its normal name, so a crash
can never leave both the copies and the originals behind as live data: repeated failures pile up nothing.

A pass stops at a safe point (between source logs) when its run time is up, its window closes, it is
suspended or the bookie stops; a source log copied only in part is cut off the compaction log again.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field

import crc32c

from octavo.node import compaction_plan, faults
from octavo.node.checkpoint import write_node_state
from octavo.node.compaction_plan import MAJOR, MINOR
from octavo.node.engine import Engine
from octavo.node.files import COMPACTED_SUFFIX, COMPACTING_SUFFIX, CORRUPT_SUFFIX, log_file_name, parse_log_file_name
from octavo.node.index import IndexEntry, LogMeta
from octavo.node.record import (
    ENTRY_ID_COMPACTED_FROM,
    ENTRY_ID_FENCE,
    ENTRY_ID_LEDGER_KEY,
    LOG_HEADER_BYTES,
    RECORD_BODY_BYTES_MAX,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    RECORD_ID_BYTES,
    RecordFormatError,
    decode_log_header,
    decode_record,
    encode_log_header,
    encode_record,
    scan_records,
)
from octavo.node.startup_cases import Action, Kind, LogFacts, decide

log = logging.getLogger(__name__)

# One compaction log replaces at most this many logs (its trailer lists them).
COMPACTION_SOURCES_MAX = 1024
# Copies are written in chunks of about this size, and read in chunks of this size.
COPY_CHUNK_BYTES = 4 * 1024 * 1024
# The node-state keys that persist an administrator's suspend and window across restarts.
STATE_SUSPENDED = "compaction_suspended"
STATE_WINDOW_UNTIL_MS = "compaction_window_until_ms"


def _pack_ids(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}Q", *ids)


def _unpack_ids(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 8}Q", data))


@dataclass
class CompactionReport:
    """What one compaction pass did (also the shape of the last run in status)."""

    kind: str = MINOR
    started_unix_ms: int = 0
    finished_unix_ms: int = 0
    duration_s: float = 0.0
    logs_compacted: int = 0       # old logs deleted after their live records were copied
    compaction_logs: int = 0      # compaction logs written
    entries_copied: int = 0
    bytes_copied: int = 0
    bytes_reclaimed: int = 0      # old logs' sizes minus the compaction logs' sizes
    corrupt_records: int = 0
    stopped: str = ""             # why the pass stopped before its last candidate, empty if it did not
    error: str = ""


@dataclass
class CompactionProgress:
    kind: str
    logs_total: int
    bytes_total: int  # live bytes to copy
    logs_done: int = 0
    bytes_done: int = 0


@dataclass
class InterruptedReport:
    rolled_back: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    quarantined: list[int] = field(default_factory=list)


class CompactionStopped(Exception):
    """Raised inside a copy when the pass must stop at the next safe point."""


def _path(engine: Engine, log_id: int, suffix: str = "") -> str:
    return os.path.join(engine.logs_dir, log_file_name(log_id, suffix))


_HEADER = RECORD_HEADER.unpack_from
_CRC = crc32c.crc32c


def _walk_live(buf: bytes, base: int, live: Container[int]) -> tuple[
        list[tuple[int, int, int, int]], int, str | None, bool]:
    """Walk the records in `buf` (log offset `base`) and return (found, end, error, incomplete): `found` holds
    (offset, length, ledger id, entry id) of the entry and fence records of live ledgers, checksum verified;
    `end` is the offset after the last whole record. Dead records are stepped over on their length alone
    (they are not copied, so their bytes need no check): much cheaper than scan_records on mostly-dead logs."""
    view = memoryview(buf)
    n = len(view)
    pos = 0
    found: list[tuple[int, int, int, int]] = []
    header_bytes, id_bytes = RECORD_HEADER_BYTES, RECORD_ID_BYTES
    while pos < n:
        if n - pos < header_bytes:
            return found, base + pos, None, True
        crc, body_len, lid, eid = _HEADER(view, pos)
        if body_len < id_bytes or body_len > RECORD_BODY_BYTES_MAX or lid < 0:
            return found, base + pos, f"invalid record header (length {body_len}, ledger {lid})", False
        total = header_bytes - id_bytes + body_len
        if n - pos < total:
            return found, base + pos, None, True
        if lid in live and (eid >= 0 or eid == ENTRY_ID_FENCE):
            if _CRC(view[pos + 8:pos + total], _CRC(view[pos + 4:pos + 8])) != crc:
                return found, base + pos, "checksum mismatch", False
            found.append((base + pos, total, lid, eid))
        pos += total
    return found, base + pos, None, False


def recover_interrupted(engine: Engine) -> InterruptedReport:
    """Roll back or finish every compaction a crash (or a failed pass) left behind. Runs at startup, before
    the entry logs are scanned, and at the start of every GC and compaction pass."""
    report = InterruptedReport()
    io = engine.io
    for name in sorted(io.listdir(engine.logs_dir)):
        kind = Kind.COMPACTING
        log_id = parse_log_file_name(name, COMPACTING_SUFFIX)
        if log_id is None:
            kind, log_id = Kind.COMPACTED, parse_log_file_name(name, COMPACTED_SUFFIX)
        if log_id is None:
            continue
        described = None
        error: RecordFormatError | None = None
        if kind is Kind.COMPACTED:
            try:
                described = _describe(engine, log_id)
            except RecordFormatError as e:
                error = e
        # The recovery point does not matter to compaction logs (startup_cases.decide).
        action = decide(LogFacts(kind, log_id, readable=error is None), recovery_point=0)
        if action is Action.ROLL_BACK:
            log.warning("compaction log %d was interrupted while copying: rolling it back", log_id)
            engine.read_fds.unpin(log_id, keep=False)
            io.unlink(os.path.join(engine.logs_dir, name))
            io.fsync_dir(engine.logs_dir)
            report.rolled_back.append(log_id)
        elif action is Action.QUARANTINE:
            # Synced before its rename, so this is damage on disk: keep every original, set the file aside.
            log.error("compaction log %d is unreadable (%s): setting it aside; the logs it replaced stay", log_id,
                      error)
            io.rename(_path(engine, log_id, COMPACTED_SUFFIX),
                      _path(engine, log_id, COMPACTED_SUFFIX + CORRUPT_SUFFIX))
            io.fsync_dir(engine.logs_dir)
            report.quarantined.append(log_id)
        else:
            if action is not Action.FINISH or described is None:
                raise RuntimeError(f"compaction log {log_id}: no way to carry out {action}")
            log.warning("compaction log %d was complete but not switched over: finishing it", log_id)
            _switch_and_delete(engine, log_id, *described)
            report.finished.append(log_id)
    return report


def _describe(engine: Engine, log_id: int) -> tuple[list[int], list[IndexEntry], LogMeta]:
    """Read a complete compaction log back: the logs it replaces (its trailer), its copies and accounting."""
    io = engine.io
    path = _path(engine, log_id, COMPACTED_SUFFIX)
    fd = io.open_read(path)
    try:
        size = io.file_size(path)
        if decode_log_header(io.pread(fd, LOG_HEADER_BYTES, 0)) != log_id:
            raise RecordFormatError("header names another log")
        data = io.pread(fd, size - LOG_HEADER_BYTES, LOG_HEADER_BYTES)
    finally:
        io.close(fd)
    scan = scan_records(data, LOG_HEADER_BYTES)
    if scan.error is not None or scan.incomplete:
        raise RecordFormatError(scan.error or "torn record")
    if not scan.records or scan.records[-1].entry_id != ENTRY_ID_COMPACTED_FROM:
        raise RecordFormatError("no trailer listing the compacted logs")
    sources = _unpack_ids(scan.records[-1].payload)
    moved: list[IndexEntry] = []
    ledger_bytes: dict[int, int] = {}
    for rec in scan.records:
        if rec.entry_id == ENTRY_ID_LEDGER_KEY or rec.entry_id == ENTRY_ID_FENCE:
            ledger_bytes.setdefault(rec.ledger_id, 0)
        elif rec.entry_id >= 0:
            moved.append((rec.ledger_id, rec.entry_id, log_id, rec.offset, rec.length))
            ledger_bytes[rec.ledger_id] = ledger_bytes.get(rec.ledger_id, 0) + rec.length
    return sources, moved, LogMeta(size, ledger_bytes)


def _switch_and_delete(engine: Engine, log_id: int, sources: list[int], moved: list[IndexEntry],
                       meta: LogMeta) -> list[int]:
    """Phases 3 and 4 of a complete compaction log. Returns the sizes of the old logs deleted."""
    io = engine.io
    engine.index.move_entries(set(sources), log_id, moved, meta)
    faults.hit(faults.COMPACTION_AFTER_INDEX_UPDATE)
    sizes = []
    for src in sources:
        sizes.append(engine.delete_log_file(src, sync_dir=False))
    io.fsync_dir(engine.logs_dir)
    for src in sources:
        engine.index.forget_log(src)
    faults.hit(faults.COMPACTION_AFTER_DELETE_SOURCES)
    io.rename(_path(engine, log_id, COMPACTED_SUFFIX), _path(engine, log_id))
    io.fsync_dir(engine.logs_dir)
    engine.read_fds.unpin(log_id, keep=True)
    return sizes


class Compactor:
    """Runs compaction passes for one Engine. Thread-safe: passes take engine.space_lock."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        cfg = engine.config
        self.enabled = cfg.compaction_enabled
        extra = engine.node_state.extra if engine.node_state else {}
        self.suspended = bool(extra.get(STATE_SUSPENDED, False))
        self.window_until_ms = int(extra.get(STATE_WINDOW_UNTIL_MS, 0))
        self.progress: CompactionProgress | None = None
        self.last: CompactionReport | None = None
        self.last_minor_monotonic = time.monotonic()
        self.last_major_monotonic = time.monotonic()
        self.major_skipped = False  # a scheduled major pass was due while blocked (a closed window)
        # Totals since the start, for the metrics: passes by kind, bytes copied and reclaimed, logs compacted.
        self.passes: dict[str, int] = {MINOR: 0, MAJOR: 0}
        self.bytes_copied_total = 0
        self.bytes_reclaimed_total = 0
        self.logs_compacted_total = 0
        self._stop = threading.Event()
        self._manual = False
        self._cancel: threading.Event | None = None
        # The logs a pass is rewriting now (the scrub skips them), and where the damaged records it meets go
        # (ledger id, entry id, reason): damage.DamageFindings.note with its finder, set by the server.
        self.rewriting: frozenset[int] = frozenset()
        self.on_damage: Callable[[int, int, str], None] | None = None

    # Controls (persisted in the node state, so an operator's decision survives a restart)

    def set_suspended(self, suspended: bool) -> None:
        self.suspended = suspended
        self._persist(STATE_SUSPENDED, suspended)

    def set_window(self, until_unix_ms: int) -> bool:
        """Allow scheduled compaction until this time (0: no window, always allowed; a time past: closed until
        the next window). A running pass stops at its next safe point once the window closes. A window that
        opens (it was closed) makes a minor pass due at once, and a major one if one was skipped while closed:
        an operator's window is short and must not wait out an interval. True if it opened."""
        now_ms = int(time.time() * 1000)
        was_open = not compaction_plan.window_closed(now_ms, self.window_until_ms)
        self.window_until_ms = max(0, until_unix_ms)
        self._persist(STATE_WINDOW_UNTIL_MS, self.window_until_ms)
        opened = not was_open and not compaction_plan.window_closed(now_ms, self.window_until_ms)
        if opened:
            self.last_minor_monotonic = float("-inf")
            if self.major_skipped:
                self.last_major_monotonic = float("-inf")
        return opened

    def _persist(self, key: str, value: object) -> None:
        state = self.engine.node_state
        if state is None:
            return
        state.extra[key] = value
        write_node_state(self.engine.io, self.engine.data_dir, state)

    def stop(self) -> None:
        self._stop.set()

    def blocked_reason(self) -> str:
        """Why a scheduled pass may not run now (empty: it may)."""
        return compaction_plan.blocked_reason(self.enabled, self.suspended, self.window_until_ms,
                                              int(time.time() * 1000))

    def due(self) -> str | None:
        """The kind of scheduled pass that is due now, if any (major first)."""
        cfg = self.engine.config
        return compaction_plan.due(time.monotonic(), self.last_major_monotonic, self.last_minor_monotonic,
                                   cfg.compaction_major_interval_ms, cfg.compaction_minor_interval_ms)

    # A pass

    def run(self, kind: str, on_progress: Callable[[CompactionProgress], None] | None = None, manual: bool = False,
            cancel: threading.Event | None = None) -> CompactionReport:
        """One pass: compact every flushed log whose live share is below the kind's threshold, most garbage
        first, within the run-time limit and (unless started by hand) the window. `cancel` stops it at the
        next safe point. Never raises for one bad log: errors are in the report."""
        engine = self.engine
        cfg = engine.config
        threshold = cfg.compaction_major_threshold if kind == MAJOR else cfg.compaction_minor_threshold
        report = CompactionReport(kind=kind, started_unix_ms=int(time.time() * 1000))
        t0 = time.monotonic()
        deadline = t0 + cfg.compaction_run_time_ms_max / 1000
        if kind == MAJOR:
            self.last_major_monotonic = t0
            self.major_skipped = False
        self.last_minor_monotonic = t0
        with engine.space_lock:
            self._manual, self._cancel = manual, cancel
            try:
                recover_interrupted(engine)
                groups = self._plan(threshold)
                total = sum(live for group in groups for _, live, _ in group)
                self.progress = CompactionProgress(kind, sum(map(len, groups)), total)
                if on_progress:
                    on_progress(self.progress)
                for group in groups:
                    why = self._why_stop(deadline)
                    if why:
                        report.stopped = why
                        break
                    self._compact_group(group, report, deadline, on_progress)
                    if report.stopped:
                        break
            except Exception as e:  # a failed pass is retried next time; it never stops the bookie
                log.exception("compaction pass failed")
                report.error = f"{type(e).__name__}: {e}"
            finally:
                self.progress = None
        report.duration_s = time.monotonic() - t0
        report.finished_unix_ms = int(time.time() * 1000)
        self.last = report
        self.passes[kind] = self.passes.get(kind, 0) + 1
        self.bytes_copied_total += report.bytes_copied
        self.bytes_reclaimed_total += max(0, report.bytes_reclaimed)
        self.logs_compacted_total += report.logs_compacted
        log.info("%s compaction: %d logs compacted into %d, %d bytes copied, %d reclaimed in %.2fs%s%s", kind,
                 report.logs_compacted, report.compaction_logs, report.bytes_copied, report.bytes_reclaimed,
                 report.duration_s, f"; stopped: {report.stopped}" if report.stopped else "",
                 f"; error: {report.error}" if report.error else "", extra={"event": "compaction_pass", "kind": kind})
        return report

    def _why_stop(self, deadline: float) -> str:
        return compaction_plan.why_stop(compaction_plan.PassState(
            stopping=self._stop.is_set(), cancelled=self._cancel is not None and self._cancel.is_set(),
            suspended=self.suspended, manual=self._manual, now_s=time.monotonic(), deadline_s=deadline,
            now_unix_ms=int(time.time() * 1000), window_until_ms=self.window_until_ms,
            run_time_ms_max=self.engine.config.compaction_run_time_ms_max))

    def _plan(self, threshold: float) -> list[list[tuple[int, int, int]]]:
        """The groups of logs a pass rewrites (compaction_plan.plan), from the logs' accounting."""
        engine = self.engine
        live = engine.ledger_ids()
        usages = [compaction_plan.LogUsage(log_id, meta.live_bytes(live), meta.total_bytes,
                                           any(lid in live for lid in meta.ledger_bytes))
                  for log_id, meta in engine.log_accounting().items()]
        return compaction_plan.plan(usages, threshold, engine.config.log_size_bytes_max, COMPACTION_SOURCES_MAX)

    def _compact_group(self, group: list[tuple[int, int, int]], report: CompactionReport, deadline: float,
                       on_progress: Callable[[CompactionProgress], None] | None) -> None:
        engine = self.engine
        io = engine.io
        log_id = engine.allocate_log_id()
        path = _path(engine, log_id, COMPACTING_SUFFIX)
        fd = io.open_append(path, create=True)
        out = _Output(engine, log_id, fd, self, deadline, on_progress)
        copied: list[int] = []
        self.rewriting = frozenset(src for src, _, _ in group)
        try:
            io.write_at_end(fd, encode_log_header(log_id))
            out.size = LOG_HEADER_BYTES
            for src, _, _ in group:
                mark = out.mark()
                try:
                    out.copy_log(src, report)
                except CompactionStopped as e:
                    out.rewind(mark)  # a source copied in part is not replaced: cut its copies off again
                    report.stopped = str(e)
                    break
                if src in out.damaged_sources:
                    # The index still points at a damaged record in it: the log stays (and the repair's new
                    # copy makes that record dead) so the entry stays repairable and located; a later pass
                    # compacts it.
                    out.rewind(mark)
                    continue
                copied.append(src)
                faults.hit(faults.COMPACTION_DURING_COPY)
                if self.progress:
                    self.progress.logs_done += 1
            if not copied:
                io.close(fd)
                io.unlink(path)
                return
            out.flush()
            payload = _pack_ids(copied)
            header, length = encode_record(0, ENTRY_ID_COMPACTED_FROM, payload)
            io.write_at_end(fd, header + payload)
            out.size += length
            io.fsync(fd)
            faults.hit(faults.COMPACTION_AFTER_COPY)
            # Phase 2: marked complete. From here a crash finishes the job instead of rolling it back.
            io.rename(path, _path(engine, log_id, COMPACTED_SUFFIX))
            io.fsync_dir(engine.logs_dir)
            faults.hit(faults.COMPACTION_AFTER_MARK_COMPLETE)
        except BaseException:
            io.close(fd)
            if os.path.exists(path):
                io.unlink(path)
            raise
        finally:
            self.rewriting = frozenset()
        io.close(fd)
        # Readers follow the switched index into the file before it has its log name: keep a fd for them.
        read_fd = io.open_read(_path(engine, log_id, COMPACTED_SUFFIX))
        engine.read_fds.pin(log_id, read_fd)
        meta = LogMeta(out.size, out.ledger_bytes)
        sizes = _switch_and_delete(engine, log_id, copied, out.moved, meta)
        report.compaction_logs += 1
        report.logs_compacted += len(copied)
        report.bytes_reclaimed += sum(sizes) - out.size


class _Output:
    """The compaction log being written: buffered copies, the index entries they will replace, accounting."""

    def __init__(self, engine: Engine, log_id: int, fd: int, compactor: Compactor, deadline: float,
                 on_progress: Callable[[CompactionProgress], None] | None) -> None:
        self.engine = engine
        self.log_id = log_id
        self.fd = fd
        self.compactor = compactor
        self.deadline = deadline
        self.on_progress = on_progress
        self.size = 0  # bytes written to the file
        self.buffer: list[bytes | memoryview] = []
        self.buffered = 0
        self.moved: list[IndexEntry] = []
        self.ledger_bytes: dict[int, int] = {}
        self.rate = engine.config.compaction_rate_bytes_per_s
        self.t0 = time.monotonic()
        self.paced_bytes = 0
        self.damaged_sources: set[int] = set()  # sources with a damaged record the index still points at

    def mark(self) -> tuple[int, int, dict[int, int]]:
        self.flush()
        return self.size, len(self.moved), dict(self.ledger_bytes)

    def rewind(self, mark: tuple[int, int, dict[int, int]]) -> None:
        self.buffer, self.buffered = [], 0
        size, moved, ledger_bytes = mark
        self.engine.io.truncate(self.fd, size)
        self.size = size
        del self.moved[moved:]
        self.ledger_bytes = ledger_bytes

    def _open_ledger(self, ledger_id: int) -> None:
        """A ledger's first record in the compaction log is its key record (logs replay on their own)."""
        state = self.engine.ledger_state(ledger_id)
        key = state.master_key if state is not None else b"-"
        header, _ = encode_record(ledger_id, ENTRY_ID_LEDGER_KEY, key)
        self._put(header + key)
        self.ledger_bytes[ledger_id] = 0

    def append(self, ledger_id: int, entry_id: int, raw: bytes | memoryview) -> None:
        if ledger_id not in self.ledger_bytes:
            self._open_ledger(ledger_id)
        offset = self.size + self.buffered
        self._put(bytes(raw))
        if entry_id >= 0:
            self.moved.append((ledger_id, entry_id, self.log_id, offset, len(raw)))
            self.ledger_bytes[ledger_id] += len(raw)

    def _put(self, data: bytes | memoryview) -> None:
        self.buffer.append(data)
        self.buffered += len(data)
        if self.buffered >= COPY_CHUNK_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        self.engine.io.write_parts(self.fd, self.buffer, self.buffered)
        self.size += self.buffered
        self.buffer, self.buffered = [], 0

    def pace(self, nbytes: int) -> None:
        """Count copied bytes against the rate limit (sleeping as needed) and check for a stop."""
        progress = self.compactor.progress
        if progress:
            progress.bytes_done += nbytes
            if self.on_progress:
                self.on_progress(progress)
        self.paced_bytes += nbytes
        while True:
            why = self.compactor._why_stop(self.deadline)
            if why:
                raise CompactionStopped(why)
            if not self.rate:
                return
            ahead = self.paced_bytes / self.rate - (time.monotonic() - self.t0)
            if ahead <= 0:
                return
            time.sleep(min(ahead, 0.2))

    def copy_log(self, src: int, report: CompactionReport) -> None:
        """Copy the live records of one flushed log: the records of live ledgers the index still points at,
        and their fence records. A corrupt record is reported; the rest of the log is still read through the
        index (the scan cannot find the next record boundary after damage)."""
        engine = self.engine
        io = engine.io
        path = _path(engine, src)
        fd = io.open_read(path)
        try:
            size = io.file_size(path)
            offset = LOG_HEADER_BYTES
            chunk = COPY_CHUNK_BYTES
            while offset < size:
                # Each read starts at a record boundary (a record cut by the last chunk is read again whole).
                buf = io.pread(fd, min(chunk, size - offset), offset)
                found, end, error, incomplete = _walk_live(buf, offset, engine.ledgers)
                self._copy_found(src, buf, offset, found, report)
                eof = offset + len(buf) >= size
                if error is not None or (incomplete and (eof or (end == offset and chunk > RECORD_BODY_BYTES_MAX))):
                    report.corrupt_records += 1
                    log.error("compaction: entry log %d has a bad record at offset %d (%s); copying the rest of "
                              "its live entries through the index", src, end, error or "torn record")
                    self._copy_rest_via_index(src, fd, end, report)
                    return
                # A record longer than the chunk: read a chunk big enough for it (records are bounded).
                chunk = chunk * 2 if end == offset else COPY_CHUNK_BYTES
                offset = end
        finally:
            io.close(fd)

    def _copy_found(self, src: int, buf: bytes, base: int, found: list[tuple[int, int, int, int]],
                    report: CompactionReport) -> None:
        """Copy the live records `found` in `buf` (log offset `base`): runs of adjacent records as one slice."""
        if not found:
            return
        engine = self.engine
        locations = engine.index.get_many([(lid, eid) for _, _, lid, eid in found if eid >= 0])
        it = iter(locations)
        view = memoryview(buf)
        run_start = run_end = -1  # the current run of adjacent records to copy, as log offsets
        run_moved: list[tuple[int, int, int, int]] = []
        nbytes = 0
        for offset, length, lid, eid in found:
            if eid >= 0:
                if next(it) != (src, offset, length):
                    continue  # not the indexed copy of this entry (or dropped meanwhile): dead
                report.entries_copied += 1
                report.bytes_copied += length
                nbytes += length
            if offset != run_end or lid not in self.ledger_bytes:
                self._flush_run(view, base, run_start, run_end, run_moved)
                run_start, run_moved = offset, []
                if lid not in self.ledger_bytes:
                    self._open_ledger(lid)
            run_end = offset + length
            run_moved.append((offset, length, lid, eid))
        self._flush_run(view, base, run_start, run_end, run_moved)
        self.pace(nbytes)

    def _flush_run(self, view: memoryview, base: int, start: int, end: int,
                   records: list[tuple[int, int, int, int]]) -> None:
        if not records:
            return
        out = self.size + self.buffered
        ledger_bytes, moved, log_id = self.ledger_bytes, self.moved, self.log_id
        for offset, length, lid, eid in records:
            if eid >= 0:
                moved.append((lid, eid, log_id, out + offset - start, length))
                ledger_bytes[lid] += length
        self._put(view[start - base:end - base])  # no copy: written out with writev

    def _copy_rest_via_index(self, src: int, fd: int, after: int, report: CompactionReport) -> None:
        engine = self.engine
        meta = engine.index.log_metas().get(src)
        ledgers = [lid for lid in (meta.ledger_bytes if meta else engine.ledger_ids()) if lid in engine.ledgers]
        for lid, eid, offset, length in sorted(engine.index.entries_in(src, ledgers, after),
                                               key=lambda e: e[2]):
            try:
                raw = engine.io.pread(fd, length, offset)
                decode_record(raw, lid, eid)
            except (RecordFormatError, OSError) as e:
                if offset != after:  # the record the scan stopped at is counted already
                    report.corrupt_records += 1
                log.error("compaction: entry %d of ledger %d in log %d at %d is unreadable (%s); the log is kept "
                          "until the entry is repaired from another replica", eid, lid, src, offset, e)
                self.damaged_sources.add(src)
                if self.compactor.on_damage is not None:
                    self.compactor.on_damage(lid, eid, f"log {src} offset {offset}: {e}")
                continue
            self.append(lid, eid, raw)
            report.entries_copied += 1
            report.bytes_copied += length
            self.pace(length)

