"""Reading many entries at once (Storage.read_many, behind ReadEntries and ReadTail): the same bytes and codes as
one read_entry per entry, across unflushed and flushed logs, interleaved ledgers, limits, corruption and
entries this bookie does not hold."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octavo.node.config import NodeConfig
from octavo.node.errors import StorageError
from octavo.node.files import LOGS_DIR, log_file_name
from octavo.node.record import LOG_HEADER_BYTES
from octavo.node.storage import Storage
from octavo.node.testing import payload_for
from octavo.v1 import bookie_pb2 as pb

KEY = b"master-key"


def add(s: Storage, ledger: int, ids: list[int], size: int = 200) -> None:
    codes, msg = s.add_entries(ledger, KEY, ids, [payload_for(ledger, e, size) for e in ids])
    assert codes == [pb.OK] * len(ids), msg


def one_by_one(s: Storage, ledger: int, ids: list[int]) -> list[tuple[int, int, bytes]]:
    out = []
    for e in ids:
        try:
            out.append((e, pb.OK, s.read_entry(ledger, e)))
        except StorageError as err:
            out.append((e, err.code, b""))
    return out


def many(s: Storage, ledger: int, ids: list[int] | range, **kw: object) -> list[tuple[int, int, bytes]]:
    args: dict[str, object] = {"max_entries": 100_000, "max_bytes": 1 << 30, "stop_on_failure": False}
    args.update(kw)
    return [(e, code, bytes(p)) for e, code, p, _ in s.read_many(ledger, ids, **args)]  # type: ignore[arg-type]


def test_interleaved_ledgers_across_unflushed_and_flushed_logs(storage: Storage) -> None:
    for k in range(30):  # two ledgers interleaved batch by batch: runs break at every other batch
        add(storage, 1, list(range(k * 10, k * 10 + 10)), size=300 + k)
        add(storage, 2, list(range(k * 5, k * 5 + 5)), size=100)
        if k == 10:
            storage.roll()
    deadline = time.monotonic() + 10
    while storage.pending_flushes() and time.monotonic() < deadline:
        time.sleep(0.01)
    ids = list(range(0, 305))  # 300..304 are not stored
    assert many(storage, 1, ids) == one_by_one(storage, 1, ids)
    assert many(storage, 1, range(0, 300)) == [(e, pb.OK, payload_for(1, e, 300 + e // 10)) for e in range(300)]
    assert many(storage, 2, [7, 3, 149, 150]) == one_by_one(storage, 2, [7, 3, 149, 150])


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=60), max_entries=st.integers(1, 70),
       max_bytes=st.integers(1, 40_000), first=st.integers(0, 70))
def test_limits_match_one_by_one_reads(tmp_path_factory: pytest.TempPathFactory, sizes: list[int],
                                       max_entries: int, max_bytes: int, first: int) -> None:
    from octavo.node.testing import small_config
    s = Storage.open(small_config(tmp_path_factory.mktemp("many") / "b"))
    try:
        for e, size in enumerate(sizes):
            codes, _ = s.add_entries(5, KEY, [e], [payload_for(5, e, size)])
            assert codes == [pb.OK]
        got = many(s, 5, range(first, first + 100), max_entries=max_entries, max_bytes=max_bytes,
                   stop_on_failure=True)
        # The reference: one read per entry, the same limits applied by hand.
        want: list[tuple[int, int, bytes]] = []
        total = 0
        for e, code, payload in one_by_one(s, 5, list(range(first, first + 100))):
            if len(want) >= max_entries or (code == pb.OK and want and total + len(payload) > max_bytes):
                break
            want.append((e, code, payload))
            total += len(payload)
            if code != pb.OK:
                break
        assert got == want
    finally:
        s.close()


def test_corrupt_record_fails_only_its_entry_or_ends_a_range(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    add(s, 1, list(range(10)), size=1000)
    s.close()
    path = Path(cfg.data_dir) / LOGS_DIR / log_file_name(0)
    raw = bytearray(path.read_bytes())
    raw[LOG_HEADER_BYTES + 34 + 1024 * 3 + 500] ^= 0x40  # inside entry 3 (after the ledger key record)
    path.write_bytes(bytes(raw))
    s = Storage.open(cfg)
    try:
        listed = many(s, 1, list(range(10)))
        assert [code for _, code, _ in listed] == [pb.OK] * 3 + [pb.CORRUPT] + [pb.OK] * 6
        assert listed[4][2] == payload_for(1, 4, 1000)
        ranged = many(s, 1, range(0, 10), stop_on_failure=True)
        assert [code for _, code, _ in ranged] == [pb.OK, pb.OK, pb.OK, pb.CORRUPT]
    finally:
        s.close()


def test_skip_missing_lists_only_what_is_held(storage: Storage) -> None:
    add(storage, 3, [0, 2, 4, 6])  # a striped ledger's share on one bookie
    assert [e for e, _, _ in many(storage, 3, range(0, 8), skip_missing=True)] == [0, 2, 4, 6]
    assert [c for _, c, _ in many(storage, 3, range(0, 3))] == [pb.OK, pb.NO_SUCH_ENTRY, pb.OK]
    assert [c for _, c, _ in many(storage, 99, [0])] == [pb.NO_SUCH_LEDGER]
    with pytest.raises(StorageError) as e:
        storage.read_many(3, [1, -1], 10, 1000, False)
    assert e.value.code == pb.INVALID
