"""The hand-written encoders parse back to exactly the messages upb builds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from octavo.v1 import bookie_pb2 as pb
from octavo.v1.wire import encode_add_request, encode_read_response, varint

int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
payload = st.binary(max_size=300) | st.sampled_from([b"", b"x" * 70_000, b"\x00" * 128])


@settings(max_examples=200, deadline=None)
@given(request_id=st.integers(min_value=0, max_value=2**64 - 1),
       groups=st.lists(st.tuples(int64, st.binary(min_size=1, max_size=40), int64, st.booleans(),
                                 st.lists(st.tuples(int64, payload), max_size=6)), max_size=5))
def test_add_request_encoding_matches_upb(request_id: int, groups: list) -> None:  # type: ignore[type-arg]
    columns = dict(group_ledger_ids=[g[0] for g in groups], group_master_keys=[g[1] for g in groups],
                   group_lacs=[g[2] for g in groups], group_recovery=[g[3] for g in groups],
                   group_entry_counts=[len(g[4]) for g in groups], entry_ids=[e for g in groups for e, _ in g[4]])
    payloads = [p for g in groups for _, p in g[4]]
    expected = pb.AddRequest(request_id=request_id, payloads=payloads, **columns)  # type: ignore[arg-type]
    for size in (-1, sum(map(len, payloads))):  # by hand, and (small payloads) through upb
        encoded = encode_add_request(pb.AddRequest(request_id=request_id, **columns), payloads, size)  # type: ignore[arg-type]
        assert pb.AddRequest.FromString(encoded) == expected


@settings(max_examples=200, deadline=None)
@given(ledger_id=int64, lac=int64,
       entries=st.lists(st.tuples(int64, st.sampled_from([pb.OK, pb.NO_SUCH_ENTRY, pb.CORRUPT, pb.UNKNOWN]), payload,
                                  st.text(max_size=20)), max_size=8))
def test_read_response_encoding_matches_upb(ledger_id: int, lac: int, entries: list) -> None:  # type: ignore[type-arg]
    expected = pb.ReadResponse(ledger_id=ledger_id, last_add_confirmed=lac, entries=[
        pb.ReadEntry(entry_id=e, code=c, payload=p if c == pb.OK else b"", message=m) for e, c, p, m in entries])
    encoded = encode_read_response(pb.ReadResponse(ledger_id=ledger_id, last_add_confirmed=lac), entries)
    assert pb.ReadResponse.FromString(encoded) == expected


def test_varint() -> None:
    assert [varint(n) for n in (0, 1, 127, 128, 300, 2**63)] == [
        b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\xac\x02", b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"]
