"""The entry-log record format and the recovery scan, as properties over arbitrary records and damage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octavo.node.files import log_file_name, parse_log_file_name
from octavo.node.record import (
    ENTRY_ID_FENCE,
    ENTRY_ID_LEDGER_KEY,
    LOG_HEADER_BYTES,
    RecordFormatError,
    decode_log_header,
    decode_record,
    encode_log_header,
    encode_record,
    scan_records,
)

ids = st.integers(min_value=0, max_value=2**63 - 1)
payloads = st.binary(max_size=300)
records = st.lists(st.tuples(ids, ids, payloads), max_size=30)


def build(recs: list[tuple[int, int, bytes]]) -> tuple[bytes, list[int]]:
    out = bytearray()
    ends = []
    for ledger, entry, payload in recs:
        header, length = encode_record(ledger, entry, payload)
        out += header + payload
        assert len(header) + len(payload) == length
        ends.append(len(out))
    return bytes(out), ends


@given(ids, ids, payloads)
def test_record_round_trip(ledger: int, entry: int, payload: bytes) -> None:
    header, length = encode_record(ledger, entry, payload)
    rec = decode_record(header + payload, ledger, entry)
    assert (rec.ledger_id, rec.entry_id, rec.payload, rec.length) == (ledger, entry, payload, length)


@given(ids, ids, st.binary(min_size=1, max_size=200), st.data())
def test_any_flipped_bit_is_detected_on_read(ledger: int, entry: int, payload: bytes, data: st.DataObject) -> None:
    header, _ = encode_record(ledger, entry, payload)
    raw = bytearray(header + payload)
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(RecordFormatError):
        decode_record(bytes(raw), ledger, entry)


def test_read_of_another_entrys_record_is_refused() -> None:
    header, _ = encode_record(1, 2, b"x")
    with pytest.raises(RecordFormatError, match="expected 1 3"):
        decode_record(header + b"x", 1, 3)


@given(records)
def test_scan_finds_every_record(recs: list[tuple[int, int, bytes]]) -> None:
    buf, ends = build(recs)
    result = scan_records(buf, 100)
    assert result.error is None and not result.incomplete
    assert [(r.ledger_id, r.entry_id) for r in result.records] == [(lg, e) for lg, e, _ in recs]
    assert [r.offset + r.length - 100 for r in result.records] == ends
    assert result.end == 100 + len(buf)


@given(records, st.data())
def test_scan_of_torn_tail_returns_exactly_the_whole_records(recs: list[tuple[int, int, bytes]],
                                                             data: st.DataObject) -> None:
    buf, ends = build(recs)
    cut = data.draw(st.integers(0, len(buf)))
    result = scan_records(buf[:cut], 0)
    whole = [e for e in ends if e <= cut]
    assert len(result.records) == len(whole)
    assert result.end == (whole[-1] if whole else 0)
    assert result.incomplete == (result.end != cut)
    assert result.error is None


@given(st.lists(st.tuples(ids, ids, payloads), min_size=1, max_size=20), st.data())
@settings(max_examples=300)
def test_scan_stops_at_or_before_corruption(recs: list[tuple[int, int, bytes]], data: st.DataObject) -> None:
    buf, ends = build(recs)
    pos = data.draw(st.integers(0, len(buf) - 1))
    damaged = bytearray(buf)
    damaged[pos] ^= 0xFF
    result = scan_records(bytes(damaged), 0)
    # Nothing at or after the damaged byte is ever returned as a valid record.
    assert all(r.offset + r.length <= pos for r in result.records)
    # Every record wholly before the damage is returned.
    assert len(result.records) == sum(1 for e in ends if e <= pos)
    assert result.error is not None or result.incomplete


def test_control_record_payload_is_kept() -> None:
    header, _ = encode_record(7, ENTRY_ID_LEDGER_KEY, b"secret")
    result = scan_records(header + b"secret", 0)
    assert result.records[0].payload == b"secret"


def test_fence_control_record_is_valid() -> None:
    header, _ = encode_record(7, ENTRY_ID_FENCE, b"")
    result = scan_records(header, 0)
    assert [(r.ledger_id, r.entry_id) for r in result.records] == [(7, ENTRY_ID_FENCE)] and result.error is None


def test_negative_ids_other_than_control_are_invalid() -> None:
    header, _ = encode_record(7, -5, b"p")
    result = scan_records(header + b"p", 0)
    assert result.records == [] and result.error is not None and "invalid ids" in result.error


def test_absurd_length_field_is_invalid_not_a_huge_read() -> None:
    header, _ = encode_record(1, 1, b"abc")
    raw = bytearray(header + b"abc")
    raw[4:8] = (2**31).to_bytes(4, "little")
    result = scan_records(bytes(raw), 0)
    assert result.error is not None and "invalid record length" in result.error


@given(st.integers(0, 2**63))
def test_log_header_round_trip(log_id: int) -> None:
    header = encode_log_header(log_id)
    assert len(header) == LOG_HEADER_BYTES
    assert decode_log_header(header) == log_id
    assert parse_log_file_name(log_file_name(log_id)) == log_id


@pytest.mark.parametrize("damage", ["short", "magic", "crc", "version"])
def test_bad_log_headers_are_rejected(damage: str) -> None:
    header = bytearray(encode_log_header(3))
    if damage == "short":
        header = header[:10]
    elif damage == "magic":
        header[0:8] = b"NOTOURS!"
    elif damage == "crc":
        header[16] ^= 1
    else:
        header[8] = 9
    with pytest.raises(RecordFormatError):
        decode_log_header(bytes(header))


@pytest.mark.parametrize("name", ["x.log", "000000000000000g.log", "0000000000000001.lo", "1.log"])
def test_foreign_file_names_are_not_logs(name: str) -> None:
    assert parse_log_file_name(name) is None


@given(records, st.integers(1, 200), st.data())
@settings(max_examples=150, deadline=None)
def test_file_scan_across_chunk_boundaries(tmp_path_factory: pytest.TempPathFactory,
                                           recs: list[tuple[int, int, bytes]], chunk: int, data: st.DataObject) -> None:
    """scan_log reads a file in chunks: records straddling chunk boundaries, and a cut anywhere, must come out
    exactly as scanning the whole buffer at once."""
    from octavo.node import recovery
    from octavo.node.fileio import FileIO

    body, ends = build(recs)
    cut = data.draw(st.integers(0, len(body)))
    path = tmp_path_factory.mktemp("scan") / log_file_name(5)
    path.write_bytes(encode_log_header(5) + body[:cut])
    old = recovery.SCAN_CHUNK_BYTES
    recovery.SCAN_CHUNK_BYTES = chunk
    try:
        result = recovery.scan_log(FileIO(), str(path), 5)
    finally:
        recovery.SCAN_CHUNK_BYTES = old
    whole = [e for e in ends if e <= cut]
    assert len(result.records) == len(whole)
    assert result.valid_end == LOG_HEADER_BYTES + (whole[-1] if whole else 0)
    assert (result.action == "cut") == (result.valid_end < LOG_HEADER_BYTES + cut)
    assert [(r.ledger_id, r.entry_id) for r in result.records] == [(lg, e) for lg, e, _ in recs[:len(whole)]]
