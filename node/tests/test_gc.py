"""Garbage collection in the storage engine: drop deleted ledgers, delete logs with nothing alive."""

from __future__ import annotations

from pathlib import Path

import pytest

from octavo.node.config import NodeConfig
from octavo.node.errors import StorageError
from octavo.node.files import LOGS_DIR
from octavo.node.storage import Storage
from octavo.node.testing import payload_for, roll_and_flush
from octavo.v1 import bookie_pb2 as pb

KEY = b"k"


def fill(s: Storage, ledgers: list[int], batches: int, first_batch: int = 0) -> None:
    for b in range(first_batch, first_batch + batches):
        for lid in ledgers:
            ids = list(range(b * 50, b * 50 + 50))
            codes, msg = s.add_entries(lid, KEY, ids, [payload_for(lid, e, 1000) for e in ids])
            assert set(codes) == {pb.OK}, msg


def flushed(s: Storage) -> None:
    roll_and_flush(s)


def logs(cfg: NodeConfig) -> set[str]:
    return {p.name for p in (Path(cfg.data_dir) / LOGS_DIR).glob("*.log")}


def test_dropped_ledgers_free_their_logs_and_live_ones_stay(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    fill(s, [3], 10)  # logs holding ledger 3 alone
    fill(s, [1, 2], 10)  # logs shared by ledgers 1 and 2
    fill(s, [1], 10, first_batch=10)  # logs holding ledger 1 alone
    flushed(s)
    before = logs(cfg)
    s.drop_ledgers([1, 3, 99])  # 99 was never here: ignored
    report = s.collect_garbage()
    assert report.logs_deleted >= 2 and report.bytes_reclaimed > 1_000_000
    assert len(logs(cfg)) == len(before) - report.logs_deleted
    for lid in (1, 3):
        with pytest.raises(StorageError) as e:
            s.read_entry(lid, 0)
        assert e.value.code == pb.NO_SUCH_LEDGER
    for e in range(0, 500, 7):
        assert s.read_entry(2, e) == payload_for(2, e, 1000)
    assert s.collect_garbage().logs_deleted == 0  # nothing more to do
    s.close()
    s = Storage.open(cfg)
    try:
        assert s.ledger_state(1) is None and s.ledger_state(3) is None
        assert s.read_entry(2, 499) == payload_for(2, 499, 1000)
    finally:
        s.close()


def test_logs_not_yet_flushed_are_never_collected(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    s._flusher.stop()
    fill(s, [5], 3)
    s.drop_ledgers([5])
    assert s.collect_garbage().logs_deleted == 0
    assert logs(cfg)
    s.close()


def test_a_lost_log_table_is_rebuilt_by_scanning(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    fill(s, [7], 10)
    fill(s, [8], 10)
    flushed(s)
    original = s.index.log_metas()
    assert original and all(m.total_bytes > sum(m.ledger_bytes.values()) > 0 for m in original.values())
    for log_id in list(original):
        s.index.forget_log(log_id)
    assert s.log_accounting() == original  # the scan finds what the flush recorded
    for log_id in list(original):
        s.index.forget_log(log_id)
    s.drop_ledgers([7])
    report = s.collect_garbage()
    assert report.logs_deleted >= 1
    assert s.read_entry(8, 499) == payload_for(8, 499, 1000)
    kept = s.index.log_metas()  # rebuilt for the logs that stay
    assert kept and set(kept) < set(original) and all(kept[i] == original[i] for i in kept)
    s.close()


def test_a_crash_between_drop_and_collect_is_finished_by_the_next_pass(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    fill(s, [1], 10)
    fill(s, [2], 10)
    flushed(s)
    s.drop_ledgers([1])
    s.abandon()  # died before deleting any log
    s = Storage.open(cfg)
    try:
        assert s.ledger_state(1) is None
        assert s.collect_garbage().logs_deleted >= 1
        assert s.read_entry(2, 499) == payload_for(2, 499, 1000)
    finally:
        s.close()
