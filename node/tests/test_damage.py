"""Damaged copies on one engine (issue 43): repair writes, an add request with a damaged entry, the scrub.
The cluster's side (marks in etcd, read repair, repair from peers, forged marks) is in
client/tests/test_bitrot.py, on real bookie processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from octavo.meta.damage import DamageMark, entries_of, to_ranges
from octavo.meta.underreplication import DAMAGE_BY, Mark
from octavo.node.appends import LedgerBatch
from octavo.node.damage import DamageFindings
from octavo.node.files import log_file_name
from octavo.node.scrub import Scrubber, check_run, scrub_due_unix_ms, set_scrub_due
from octavo.node.storage import Storage
from octavo.node.testing import payload_for, roll_and_flush
from octavo.v1 import bookie_pb2 as pb

KEY = b"k"
SIZE = 1000


def stored(s: Storage, ledger: int, count: int) -> None:
    ids = list(range(count))
    codes, message = s.add_entries(ledger, KEY, ids, [payload_for(ledger, e, SIZE) for e in ids])
    assert codes == [pb.OK] * count, message


def flip(s: Storage, ledger: int, entry: int) -> tuple[int, int]:
    """Flip one payload byte of a flushed entry's record in place (a bad sector); returns (log id, offset)."""
    log_id, offset, length = s.index.get(ledger, entry)  # type: ignore[misc]
    path = Path(s.logs_dir) / log_file_name(log_id)
    with open(path, "r+b") as f:
        f.seek(offset + length - 10)
        byte = f.read(1)
        f.seek(offset + length - 10)
        f.write(bytes([byte[0] ^ 0x08]))
    return log_id, offset


def log_bytes(s: Storage) -> int:
    return sum(p.stat().st_size for p in Path(s.logs_dir).iterdir())


def test_a_repair_write_over_a_good_copy_changes_nothing(storage: Storage) -> None:
    stored(storage, 1, 10)
    roll_and_flush(storage)
    where = storage.locate(1, 4)
    size = log_bytes(storage)
    codes, _ = storage.repair_entries(1, KEY, [4], [payload_for(1, 4, SIZE)])
    assert codes == [pb.OK]
    codes, message = storage.repair_entries(1, KEY, [5], [b"other bytes"])
    assert codes == [pb.DUPLICATE_MISMATCH] and "different bytes" in message
    codes, _ = storage.repair_entries(1, KEY, [99], [b"never stored here"])
    assert codes == [pb.NO_SUCH_ENTRY]
    codes, _ = storage.repair_entries(7, KEY, [0], [b"unknown ledger"])
    assert codes == [pb.NO_SUCH_LEDGER]
    assert storage.locate(1, 4) == where and log_bytes(storage) == size
    assert storage.read_entry(1, 5) == payload_for(1, 5, SIZE)
    assert storage.verify_entry(1, 4) == "" and storage.verify_entry(1, 99) is None


def test_a_repair_write_replaces_a_damaged_copy_and_reads_back(storage: Storage) -> None:
    stored(storage, 1, 10)
    roll_and_flush(storage)
    flip(storage, 1, 3)
    assert "unreadable" in (storage.verify_entry(1, 3) or "")
    codes, message = storage.repair_entries(1, KEY, [2, 3], [payload_for(1, 2, SIZE), payload_for(1, 3, SIZE)])
    assert codes == [pb.OK, pb.OK], message
    assert storage.read_entry(1, 3) == payload_for(1, 3, SIZE) and storage.verify_entry(1, 3) == ""
    roll_and_flush(storage)  # the index now points at the new copy
    assert storage.read_entry(1, 3) == payload_for(1, 3, SIZE)
    cfg = storage.config
    storage.close()
    reopened = Storage.open(cfg)
    try:
        assert reopened.read_entry(1, 3) == payload_for(1, 3, SIZE)
    finally:
        reopened.close()


def test_an_add_request_with_a_damaged_entry_fails_only_that_entry(storage: Storage) -> None:
    stored(storage, 1, 10)
    stored(storage, 2, 5)
    roll_and_flush(storage)
    flip(storage, 1, 6)
    results = storage.add_batch([
        LedgerBatch(1, KEY, [5, 6, 10], [payload_for(1, 5, SIZE), payload_for(1, 6, SIZE), payload_for(1, 10, SIZE)]),
        LedgerBatch(2, KEY, [5, 6], [payload_for(2, 5, SIZE), payload_for(2, 6, SIZE)]),
        LedgerBatch(3, KEY, [0], [payload_for(3, 0, SIZE)])])
    assert results[0][0] == [pb.OK, pb.CORRUPT, pb.OK] and "entry 6 of ledger 1" in results[0][1]
    assert results[1] == ([pb.OK, pb.OK], "") and results[2] == ([pb.OK], "")
    assert storage.read_entry(1, 10) == payload_for(1, 10, SIZE)
    assert storage.read_entry(2, 6) == payload_for(2, 6, SIZE) and storage.read_entry(3, 0) == payload_for(3, 0, SIZE)


def test_the_scrub_finds_flipped_bytes_and_a_truncated_log(storage: Storage) -> None:
    stored(storage, 1, 20)
    roll_and_flush(storage)
    stored(storage, 2, 20)
    roll_and_flush(storage)
    flip(storage, 1, 7)
    log_id, offset, _ = storage.index.get(2, 15)  # type: ignore[misc]
    os.truncate(Path(storage.logs_dir) / log_file_name(log_id), offset + 10)
    findings = DamageFindings()
    scrubber = Scrubber(storage, findings, 0, "scrub on test")
    report = scrubber.run_pass()
    assert sorted((f.ledger_id, f.entry_id) for f in report.findings) == [(1, 7), *((2, e) for e in range(15, 20))]
    assert report.records == 40 and report.damaged == 6 and scrubber.damaged_records == 6
    taken = findings.take()
    assert taken[1][2] == {7} and taken[2][2] == set(range(15, 20)) and "truncated" in taken[2][0]
    assert taken[1][1] == "scrub on test"
    # Once repaired, the next pass finds nothing.
    for lid, entries in ((1, [7]), (2, list(range(15, 20)))):
        codes, message = storage.repair_entries(lid, KEY, entries, [payload_for(lid, e, SIZE) for e in entries])
        assert codes == [pb.OK] * len(entries), message
    roll_and_flush(storage)
    assert scrubber.run_pass().damaged == 0 and not findings.take()


def test_the_scrub_keeps_to_its_rate(storage: Storage) -> None:
    stored(storage, 1, 300)
    roll_and_flush(storage)
    scrubber = Scrubber(storage, DamageFindings(), 1024 * 1024, "scrub")
    report = scrubber.run_pass()
    assert report.bytes > 300 * SIZE
    assert report.duration_s >= report.bytes / (1024 * 1024) * 0.9


def test_check_run_names_each_failure() -> None:
    assert check_run(b"", 100, [(1, 2, 100, 40)])[0][3].endswith("(truncated)")


@pytest.mark.parametrize("limit", [1, 3])
def test_findings_are_bounded(limit: int) -> None:
    findings = DamageFindings(limit)
    for e in range(5):
        findings.note(1, e, "why", "who")
    assert len(findings.take()[1][2]) == limit and findings.dropped == 5 - limit


def test_damage_ranges_are_sorted_disjoint_and_bounded() -> None:
    assert to_ranges([5, 1, 2, 3, 9, 10]) == ((1, 3), (5, 5), (9, 10))
    assert to_ranges([1, 5, 6, 20], limit=2) == ((1, 6), (20, 20))  # the closest neighbours joined
    assert entries_of(((1, 3), (7, 7))) == [1, 2, 3, 7]
    mark = DamageMark(4, "bookie-1", ((1, 3),), "checksum mismatch", "reader", 123, revision=9)
    assert DamageMark.decode(mark.encode(), 9) == mark and mark.entries == 3
    with pytest.raises(ValueError):
        to_ranges([-1])


def test_a_damage_mark_for_under_replication_is_not_dropped_for_a_registered_bookie() -> None:
    """The workers drop a mark whose bookies are all registered again, but not one made because a live bookie
    could not repair its damaged copies (nor a decommission's)."""
    assert Mark(1, ("bookie-1",), 0, f"{DAMAGE_BY} bookie-1").names_live_bookies
    assert Mark(1, ("bookie-1",), 0, "decommission").names_live_bookies
    assert not Mark(1, ("bookie-1",), 0, "auditor bookie-0").names_live_bookies


def test_an_index_entry_into_a_missing_log_is_damage_and_repairable(storage: Storage) -> None:
    stored(storage, 1, 10)
    roll_and_flush(storage)
    stored(storage, 2, 3)
    log_id, _, _ = storage.index.get(1, 0)  # type: ignore[misc]
    os.unlink(Path(storage.logs_dir) / log_file_name(log_id))
    storage.read_fds.close_all()  # an open descriptor would still read the unlinked file
    findings = DamageFindings()
    report = Scrubber(storage, findings, 0, "scrub").run_pass()
    assert sorted(f.entry_id for f in report.findings if f.ledger_id == 1) == list(range(10))
    assert all("missing" in f.reason for f in report.findings)
    assert storage.verify_entry(1, 4)
    codes, message = storage.repair_entries(1, KEY, [4], [payload_for(1, 4, SIZE)])
    assert codes == [pb.OK], message
    assert storage.read_entry(1, 4) == payload_for(1, 4, SIZE)


def test_the_scrub_schedule_survives_a_restart(storage: Storage) -> None:
    """A bookie restarted more often than scrub_interval_s is still scrubbed: the due time is kept."""
    due = scrub_due_unix_ms(storage, 3600, 1_000_000)
    assert due == 1_000_000 + 3_600_000
    assert scrub_due_unix_ms(storage, 3600, 2_000_000) == due  # not pushed back by asking again
    cfg = storage.config
    storage.close()
    reopened = Storage.open(cfg)
    try:
        assert scrub_due_unix_ms(reopened, 3600, 5_000_000) == due
        set_scrub_due(reopened, 42)
        assert scrub_due_unix_ms(reopened, 3600, 5_000_000) == 42
    finally:
        reopened.close()
