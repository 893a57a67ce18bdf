"""The entry-log format: the file header and the records. Pure: bytes in, bytes out, no IO.

An entry log is a file `<log_id as 16 hex digits>.log`:

    file header (LOG_HEADER_BYTES = 32 bytes)
        magic "OCTAVOEL" | version u16 | reserved u16 | header length u32 | log id u64 | crc32c u32 | pad u32
    records, back to back
        crc32c u32 | body length u32 | ledger id i64 | entry id i64 | payload
        the crc covers everything after itself: body length, ids and payload.
        body length = 16 + len(payload).

All integers are little-endian. A record whose entry id is negative is a control record, never indexed:
ENTRY_ID_LEDGER_KEY carries the ledger's master key, written the first time a ledger appears in a log, so
a log replayed after a crash can rebuild the ledger's state on its own; ENTRY_ID_FENCE records a fence (the
fence is made durable by the synced ledger table; the record lets an index rebuilt from the logs keep it);
ENTRY_ID_COMPACTED_FROM closes a compaction log (its trailer, compaction.py) and lists the logs it replaces.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

LOG_MAGIC = b"OCTAVOEL"
LOG_FORMAT_VERSION = 1
LOG_HEADER = struct.Struct("<8sHHIQII")
LOG_HEADER_BYTES = LOG_HEADER.size  # 32

RECORD_HEADER = struct.Struct("<IIqq")
RECORD_HEADER_BYTES = RECORD_HEADER.size  # 24
# The header is the crc field followed by the part the crc covers (body length, ledger id, entry id).
CRC_FIELD = struct.Struct("<I")
RECORD_META = struct.Struct("<Iqq")
RECORD_ID_BYTES = 16
# A record's body may never exceed this, whatever the configuration: a larger length field is garbage.
RECORD_BODY_BYTES_MAX = 64 * 1024 * 1024

ENTRY_ID_LEDGER_KEY = -1
ENTRY_ID_FENCE = -2
# The last record of a compaction log (its trailer, written after every copied record and before the log is
# synced and marked complete): its payload lists the ids of the logs it was compacted from, so a compaction
# interrupted after its log was marked complete can be finished from the file alone.
ENTRY_ID_COMPACTED_FROM = -3
CONTROL_ENTRY_IDS = frozenset({ENTRY_ID_LEDGER_KEY, ENTRY_ID_FENCE, ENTRY_ID_COMPACTED_FROM})

_crc = crc32c.crc32c


class RecordFormatError(ValueError):
    """Bytes that are not a valid record or log header."""


def encode_log_header(log_id: int) -> bytes:
    if log_id < 0:
        raise ValueError(f"log id must be non-negative, got {log_id}")
    body = struct.pack("<8sHHIQ", LOG_MAGIC, LOG_FORMAT_VERSION, 0, LOG_HEADER_BYTES, log_id)
    return LOG_HEADER.pack(LOG_MAGIC, LOG_FORMAT_VERSION, 0, LOG_HEADER_BYTES, log_id, _crc(body), 0)


def decode_log_header(data: bytes) -> int:
    """The log id in a file header; RecordFormatError if the header is torn, foreign or corrupt."""
    if len(data) < LOG_HEADER_BYTES:
        raise RecordFormatError(f"log header is {len(data)} bytes, expected {LOG_HEADER_BYTES}")
    magic, version, _reserved, header_len, log_id, crc, _pad = LOG_HEADER.unpack_from(data)
    if magic != LOG_MAGIC:
        raise RecordFormatError(f"not an Octavo entry log (magic {magic!r})")
    if _crc(bytes(data[:24])) != crc:
        raise RecordFormatError("log header checksum mismatch")
    if version != LOG_FORMAT_VERSION:
        raise RecordFormatError(f"unsupported entry-log format version {version}")
    if header_len != LOG_HEADER_BYTES:
        raise RecordFormatError(f"unexpected log header length {header_len}")
    return int(log_id)


def encode_record(ledger_id: int, entry_id: int, payload: bytes) -> tuple[bytes, int]:
    """The record header for a payload, and the record's total length. The caller writes header + payload."""
    body_len = RECORD_ID_BYTES + len(payload)
    meta = RECORD_META.pack(body_len, ledger_id, entry_id)
    crc = _crc(payload, _crc(meta))
    return RECORD_HEADER.pack(crc, body_len, ledger_id, entry_id), RECORD_HEADER_BYTES - RECORD_ID_BYTES + body_len


@dataclass(frozen=True, slots=True)
class Record:
    offset: int  # of the record's first byte in the log
    length: int  # the whole record, header included
    ledger_id: int
    entry_id: int
    payload: bytes


def decode_record(data: bytes | memoryview, expected_ledger: int | None = None,
                  expected_entry: int | None = None) -> Record:
    """Decode one whole record read back from a log (offset 0 of `data`), checking its checksum.

    The pair of encode_record: a read never returns bytes whose crc or ids do not match.
    """
    if len(data) < RECORD_HEADER_BYTES:
        raise RecordFormatError(f"record is {len(data)} bytes, shorter than its header")
    crc, body_len, ledger_id, entry_id = RECORD_HEADER.unpack_from(data)
    total = RECORD_HEADER_BYTES - RECORD_ID_BYTES + body_len
    if body_len < RECORD_ID_BYTES or total != len(data):
        raise RecordFormatError(f"record length field {body_len} does not match {len(data)} bytes read")
    view = memoryview(data)
    if _crc(view[8:], _crc(view[4:8])) != crc:
        raise RecordFormatError(f"checksum mismatch in record of ledger {ledger_id} entry {entry_id}")
    if expected_ledger is not None and (ledger_id, entry_id) != (expected_ledger, expected_entry):
        raise RecordFormatError(
            f"record holds ledger {ledger_id} entry {entry_id}, expected {expected_ledger} {expected_entry}")
    return Record(0, total, ledger_id, entry_id, bytes(view[RECORD_HEADER_BYTES:]))


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What scan_records found in a buffer.

    records: the valid records, in order.
    end: the offset just past the last valid record: the log is cut here if scanning stopped on an error.
    error: why scanning stopped before the end of the buffer, or None if it reached the end cleanly or the
        buffer ends in the middle of a record (`incomplete`).
    incomplete: the buffer ends inside a record; with more bytes the scan could go on.
    """

    records: list[Record]
    end: int
    error: str | None
    incomplete: bool


def scan_records(data: bytes | memoryview, base_offset: int, keep_payloads: bool = False) -> ScanResult:
    """Scan back-to-back records in `data`, which starts at log offset `base_offset`.

    Stops at the first record that is invalid (length out of range, checksum mismatch, negative ids other
    than a control record) and reports where: everything before is intact, nothing after is trusted.
    """
    view = memoryview(data)
    n = len(view)
    pos = 0
    records: list[Record] = []
    unpack = RECORD_HEADER.unpack_from
    while pos < n:
        if n - pos < RECORD_HEADER_BYTES:
            return ScanResult(records, base_offset + pos, None, True)
        crc, body_len, ledger_id, entry_id = unpack(view, pos)
        if body_len < RECORD_ID_BYTES or body_len > RECORD_BODY_BYTES_MAX:
            return ScanResult(records, base_offset + pos, f"invalid record length {body_len}", False)
        total = RECORD_HEADER_BYTES - RECORD_ID_BYTES + body_len
        if n - pos < total:
            return ScanResult(records, base_offset + pos, None, True)
        if _crc(view[pos + 8:pos + total], _crc(view[pos + 4:pos + 8])) != crc:
            return ScanResult(records, base_offset + pos, "checksum mismatch", False)
        if ledger_id < 0 or (entry_id < 0 and entry_id not in CONTROL_ENTRY_IDS):
            return ScanResult(records, base_offset + pos, f"invalid ids {ledger_id}/{entry_id}", False)
        payload = bytes(view[pos + RECORD_HEADER_BYTES:pos + total]) if keep_payloads or entry_id < 0 else b""
        records.append(Record(base_offset + pos, total, ledger_id, entry_id, payload))
        pos += total
    return ScanResult(records, base_offset + pos, None, False)
