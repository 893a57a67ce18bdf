"""Startup recovery of the entry logs after the recovery point.

Decision table: each on-disk situation found at startup, and what recovery does with it
(docs/durability.md lists the same rows with the test that covers each).

| situation                                              | action                                              |
|--------------------------------------------------------|-----------------------------------------------------|
| log id < recovery point                                | not read: fsynced and indexed before the point moved |
| log id >= recovery point, records valid to the end     | replay: index every record in the write cache       |
| log id >= recovery point, torn or invalid record at X  | cut the file at X, replay the records before X      |
| log id >= recovery point, shorter than its header      | delete it: it never held a whole record             |
| log id >= recovery point, header invalid or foreign    | quarantine it as `<name>.corrupt`, replay nothing   |
| no recovery point file                                 | recovery point 0: scan every log                    |
| recovery point file fails its checksum                 | scan every log (slower, never wrong), log a warning |

Replayed logs are handed to the flusher like rolled logs: it fsyncs them (the cut included), writes their
index entries and advances the recovery point past them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from octavo.node.fileio import FileIO
from octavo.node.record import (
    LOG_HEADER_BYTES,
    RECORD_BODY_BYTES_MAX,
    Record,
    RecordFormatError,
    decode_log_header,
    log_file_name,
    scan_records,
)

log = logging.getLogger(__name__)

SCAN_CHUNK_BYTES = 8 * 1024 * 1024
CORRUPT_SUFFIX = ".corrupt"


@dataclass
class LogScan:
    """The outcome of scanning one log: its valid records, where it ends, what was cut and why."""

    log_id: int
    records: list[Record] = field(default_factory=list)
    valid_end: int = LOG_HEADER_BYTES
    file_size: int = 0
    error: str | None = None
    action: str = "replay"  # replay | cut | delete | quarantine

    @property
    def bytes_truncated(self) -> int:
        return self.file_size - self.valid_end if self.action == "cut" else 0


def scan_log(io: FileIO, path: str, log_id: int) -> LogScan:
    """Scan one log from its header to its first invalid record. Reads in chunks: memory stays bounded by
    SCAN_CHUNK_BYTES plus one record."""
    result = LogScan(log_id, file_size=io.file_size(path))
    if result.file_size < LOG_HEADER_BYTES:
        result.action, result.valid_end, result.error = "delete", 0, "shorter than the log header"
        return result
    fd = io.open_read(path)
    try:
        try:
            found = decode_log_header(io.pread(fd, LOG_HEADER_BYTES, 0))
            if found != log_id:
                raise RecordFormatError(f"header says log {found}, file name says {log_id}")
        except RecordFormatError as e:
            result.action, result.valid_end, result.error = "quarantine", 0, str(e)
            return result
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
    if result.valid_end < result.file_size:
        result.action = "cut"
    return result


def apply_scan(io: FileIO, logs_dir: str, scan: LogScan) -> None:
    """Carry out the decision for one scanned log (cut, delete or quarantine); replay needs no file change."""
    path = os.path.join(logs_dir, log_file_name(scan.log_id))
    if scan.action == "cut":
        log.warning("entry log %d: %s at offset %d; cutting %d bytes", scan.log_id, scan.error, scan.valid_end,
                    scan.bytes_truncated)
        fd = io.open_append(path, create=False)
        try:
            io.truncate(fd, scan.valid_end)
            io.fsync(fd)
        finally:
            io.close(fd)
    elif scan.action == "delete":
        log.warning("entry log %d: %s; deleting it", scan.log_id, scan.error)
        io.unlink(path)
        io.fsync_dir(logs_dir)
    elif scan.action == "quarantine":
        log.error("entry log %d: %s; moving it aside as %s", scan.log_id, scan.error, path + CORRUPT_SUFFIX)
        io.rename(path, path + CORRUPT_SUFFIX)
        io.fsync_dir(logs_dir)
