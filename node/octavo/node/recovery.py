"""Startup recovery of the entry logs after the recovery point: scan each one, then carry out what the
decision table (`startup_cases.py`: every situation a start can find and its action) says for it.

Replayed logs are handed to the flusher like rolled logs: it fsyncs them (the cut included), writes their
index entries and advances the recovery point past them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from octavo.node.fileio import FileIO
from octavo.node.files import CORRUPT_SUFFIX, log_file_name
from octavo.node.record import (
    LOG_HEADER_BYTES,
    RECORD_BODY_BYTES_MAX,
    Record,
    RecordFormatError,
    decode_log_header,
    scan_records,
)
from octavo.node.startup_cases import Action, Kind, LogFacts, decide

log = logging.getLogger(__name__)

SCAN_CHUNK_BYTES = 8 * 1024 * 1024


@dataclass
class LogScan:
    """The outcome of scanning one log: its valid records, where it ends, what was cut and why."""

    log_id: int
    records: list[Record] = field(default_factory=list)
    valid_end: int = LOG_HEADER_BYTES
    file_size: int = 0
    error: str | None = None
    action: Action = Action.REPLAY  # REPLAY, CUT, DELETE or QUARANTINE (startup_cases.decide)

    @property
    def bytes_truncated(self) -> int:
        return self.file_size - self.valid_end if self.action is Action.CUT else 0


def scan_log(io: FileIO, path: str, log_id: int) -> LogScan:
    """Scan one log at or past the recovery point from its header to its first invalid record, and decide
    what to do with it. Reads in chunks: memory stays bounded by SCAN_CHUNK_BYTES plus one record."""
    result = LogScan(log_id, file_size=io.file_size(path))
    header_ok = True
    if result.file_size < LOG_HEADER_BYTES:
        result.valid_end, result.error = 0, "shorter than the log header"
    else:
        try:
            header_ok = _scan_records(io, path, log_id, result)
        except RecordFormatError as e:
            header_ok = False
            result.valid_end, result.error = 0, str(e)
    result.action = decide(LogFacts(Kind.LOG, log_id, size_bytes=result.file_size, header_bytes=LOG_HEADER_BYTES,
                                    header_ok=header_ok, valid_end=result.valid_end), recovery_point=log_id)
    return result


def _scan_records(io: FileIO, path: str, log_id: int, result: LogScan) -> bool:
    """Fill `result` with the log's valid records and where they end; RecordFormatError for a bad header."""
    fd = io.open_read(path)
    try:
        found = decode_log_header(io.pread(fd, LOG_HEADER_BYTES, 0))
        if found != log_id:
            raise RecordFormatError(f"header says log {found}, file name says {log_id}")
        offset = LOG_HEADER_BYTES  # file offset of buf[0]
        buf = b""
        while True:
            data = io.pread(fd, SCAN_CHUNK_BYTES, offset + len(buf))
            eof = len(data) == 0
            buf = buf + data if buf else data
            scan = scan_records(buf, offset)
            result.records.extend(scan.records)
            result.valid_end = scan.end
            if scan.error is not None:
                result.error = scan.error
                break
            if eof:
                if scan.incomplete:
                    result.error = "torn record at the end of the log"
                break
            buf = buf[scan.end - offset:]
            offset = scan.end
            if len(buf) > RECORD_BODY_BYTES_MAX + SCAN_CHUNK_BYTES:  # cannot happen: scan_records bounds lengths
                raise RuntimeError("scan buffer grew past its bound")
    finally:
        io.close(fd)
    return True


def apply_scan(io: FileIO, logs_dir: str, scan: LogScan) -> None:
    """Carry out the decision for one scanned log (cut, delete or quarantine); replay needs no file change."""
    path = os.path.join(logs_dir, log_file_name(scan.log_id))
    if scan.action is Action.CUT:
        log.warning("entry log %d: %s at offset %d; cutting %d bytes", scan.log_id, scan.error, scan.valid_end,
                    scan.bytes_truncated)
        fd = io.open_append(path, create=False)
        try:
            io.truncate(fd, scan.valid_end)
            io.fsync(fd)
        finally:
            io.close(fd)
    elif scan.action is Action.DELETE:
        log.warning("entry log %d: %s; deleting it", scan.log_id, scan.error)
        io.unlink(path)
        io.fsync_dir(logs_dir)
    elif scan.action is Action.QUARANTINE:
        log.error("entry log %d: %s; moving it aside as %s", scan.log_id, scan.error, path + CORRUPT_SUFFIX)
        io.rename(path, path + CORRUPT_SUFFIX)
        io.fsync_dir(logs_dir)
