"""The storage engine in-process, on real files: adds, reads, rolls, flushes, restarts, bad input."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octavo.node import startup
from octavo.node.checkpoint import read_recovery_point
from octavo.node.config import ConfigError, NodeConfig
from octavo.node.errors import StorageError, WriteCacheFull
from octavo.node.fileio import FileIO
from octavo.node.files import LOGS_DIR, RECOVERY_POINT_FILE, log_file_name
from octavo.node.flusher import Flusher
from octavo.node.record import LOG_HEADER_BYTES
from octavo.node.recovery import scan_log
from octavo.node.storage import LedgerBatch, Storage
from octavo.node.testing import payload_for, small_config
from octavo.v1 import bookie_pb2 as pb

KEY = b"master-key"


def add(s: Storage, ledger: int, first: int, count: int, size: int = 200, **kw: object) -> None:
    ids = list(range(first, first + count))
    codes, msg = s.add_entries(ledger, kw.pop("key", KEY), ids, [payload_for(ledger, e, size) for e in ids],  # type: ignore[arg-type]
                               **kw)  # type: ignore[arg-type]
    assert codes == [pb.OK] * count, msg


def wait_flushed(s: Storage, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while s.pending_flushes() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.pending_flushes() == 0


def test_add_then_read_back(storage: Storage) -> None:
    add(storage, 1, 0, 100)
    add(storage, 2, 0, 10, size=5000)
    for e in range(100):
        assert storage.read_entry(1, e) == payload_for(1, e)
    assert storage.read_entry(2, 9) == payload_for(2, 9, 5000)


def test_logs_roll_at_their_size_limit_and_flush_moves_the_recovery_point(storage: Storage) -> None:
    for batch in range(20):
        add(storage, 1, batch * 100, 100, size=1000)  # ~2 MB over 256 KiB logs
    wait_flushed(storage)
    st = storage.status()
    assert len(st["entry_logs"]) >= 7
    assert all(size <= storage.config.log_size_bytes_max for _, size, _ in st["entry_logs"])
    assert st["recovery_point_log_id"] == st["active_log_id"]
    point = read_recovery_point(FileIO(), storage.data_dir)
    assert point is not None and point.log_id == st["recovery_point_log_id"]
    # Everything before the recovery point is in the durable index; the rest is in the write cache.
    indexed = {(lid, eid) for lid, eid, *_ in storage.index.all_entries()}
    assert len(indexed) + st["write_cache_entries"] == 2000
    for e in range(0, 2000, 37):
        assert storage.read_entry(1, e) == payload_for(1, e, 1000)


def test_clean_restart_replays_nothing(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    add(s, 1, 0, 500, size=1000)
    s.close()
    s = Storage.open(cfg)
    try:
        assert s.recovery.logs_scanned == 0 and not s.recovery.unclean
        assert s.read_entry(1, 499) == payload_for(1, 499, 1000)
    finally:
        s.close()


def test_restart_reads_only_logs_after_the_recovery_point(cfg: NodeConfig) -> None:
    """Restart cost depends on the unsynced tail, not the total: by structure, not by clock."""
    s = Storage.open(cfg)
    for batch in range(30):
        add(s, 1, batch * 100, 100, size=1000)
    wait_flushed(s)
    flushed_logs = s.status()["recovery_point_log_id"]
    assert flushed_logs >= 10
    s._flusher.stop()  # from here on nothing is flushed: the tail stays after the recovery point
    for batch in range(30, 36):
        add(s, 1, batch * 100, 100, size=1000)
    tail_logs = len(s.status()["entry_logs"]) - flushed_logs
    s.abandon()
    s = Storage.open(cfg)
    try:
        assert s.recovery.unclean and not s.tail_maybe_lost  # same boot: a process crash loses nothing
        assert s.recovery.recovery_point_log_id == flushed_logs
        assert s.recovery.logs_scanned == tail_logs
        assert {scan.log_id for scan in s.recovery.scans} == set(range(flushed_logs, flushed_logs + tail_logs))
        assert s.recovery.records_replayed >= 600
        # The report says what was replayed; it does not keep the replayed payloads (the whole tail) alive.
        assert all(scan.records == [] for scan in s.recovery.scans)
        for e in range(0, 3600, 53):
            assert s.read_entry(1, e) == payload_for(1, e, 1000)
    finally:
        s.close()


def test_torn_tail_is_cut_at_the_last_whole_record(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    s._flusher.stop()
    add(s, 1, 0, 50, size=1000)
    active = s.status()["active_log_id"]
    s.abandon()
    path = Path(cfg.data_dir) / LOGS_DIR / log_file_name(active)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 500)  # half of the last record is gone
    s = Storage.open(cfg)
    try:
        assert s.recovery.bytes_truncated == 1024 - 500  # the rest of the torn record (24-byte header + 1000)
        assert s.read_entry(1, 48) == payload_for(1, 48, 1000)
        with pytest.raises(StorageError) as e:
            s.read_entry(1, 49)
        assert e.value.code == pb.NO_SUCH_ENTRY
        scan = scan_log(FileIO(), str(path), active)
        assert scan.error is None and scan.valid_end == scan.file_size
        add(s, 1, 49, 10, size=1000)  # the lost entry can be written again
        assert s.read_entry(1, 49) == payload_for(1, 49, 1000)
    finally:
        s.close()


def test_garbage_in_the_tail_is_cut(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    s._flusher.stop()
    add(s, 1, 0, 20)
    active = s.status()["active_log_id"]
    s.abandon()
    path = Path(cfg.data_dir) / LOGS_DIR / log_file_name(active)
    with open(path, "ab") as f:
        f.write(os.urandom(3000))
    s = Storage.open(cfg)
    try:
        assert s.recovery.bytes_truncated == 3000
        assert s.read_entry(1, 19) == payload_for(1, 19)
    finally:
        s.close()


def test_flipped_byte_in_a_flushed_log_is_an_error_for_that_entry_only(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    add(s, 1, 0, 10, size=1000)
    s.close()
    path = Path(cfg.data_dir) / LOGS_DIR / log_file_name(0)
    raw = bytearray(path.read_bytes())
    # ledger key record first (24 + 10 bytes), then entry 0 (24 + 1000), then entry 1: flip a byte of entry 1.
    raw[LOG_HEADER_BYTES + 34 + 1024 + 500] ^= 0x40
    path.write_bytes(bytes(raw))
    s = Storage.open(cfg)
    try:
        with pytest.raises(StorageError) as e:
            s.read_entry(1, 1)
        assert e.value.code == pb.CORRUPT and "entry 1 of ledger 1" in e.value.message
        assert s.read_entry(1, 0) == payload_for(1, 0, 1000)
        assert s.read_entry(1, 2) == payload_for(1, 2, 1000)
    finally:
        s.close()


def test_truncated_flushed_log_is_reported_on_read(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    add(s, 1, 0, 10, size=1000)
    s.close()
    path = Path(cfg.data_dir) / LOGS_DIR / log_file_name(0)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 2000)
    s = Storage.open(cfg)
    try:
        with pytest.raises(StorageError) as e:
            s.read_entry(1, 9)
        assert e.value.code == pb.CORRUPT
        assert s.read_entry(1, 7) == payload_for(1, 7, 1000)
    finally:
        s.close()


def test_corrupt_recovery_point_falls_back_to_a_full_scan(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    add(s, 1, 0, 300, size=1000)
    s.close()
    (Path(cfg.data_dir) / RECOVERY_POINT_FILE).write_text('{"body": {"version": 1, "recovery_point_log_id": 99}}')
    s = Storage.open(cfg)
    try:
        assert s.recovery.recovery_point_log_id == 0
        assert s.recovery.logs_scanned == len(list((Path(cfg.data_dir) / LOGS_DIR).glob("*.log"))) - 1
        assert s.read_entry(1, 299) == payload_for(1, 299, 1000)
    finally:
        s.close()


def test_foreign_log_after_recovery_point_is_quarantined(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    add(s, 1, 0, 5)
    s.close()
    rp = read_recovery_point(FileIO(), cfg.data_dir)
    assert rp is not None
    bogus = Path(cfg.data_dir) / LOGS_DIR / log_file_name(rp.log_id)
    bogus.write_bytes(b"this is not an entry log at all" * 10)
    s = Storage.open(cfg)
    try:
        assert [scan.action for scan in s.recovery.scans] == ["quarantine"]
        assert Path(str(bogus) + ".corrupt").exists()
        assert s.read_entry(1, 4) == payload_for(1, 4)
    finally:
        s.close()


def test_duplicate_entry_same_bytes_is_ok_without_a_second_copy(storage: Storage) -> None:
    add(storage, 1, 0, 10)
    size_before = storage.status()["entry_logs"][-1][1]
    add(storage, 1, 5, 5)  # a resend of the same entries
    assert storage.status()["entry_logs"][-1][1] == size_before
    codes, msg = storage.add_entries(1, KEY, [3, 10], [b"other bytes", payload_for(1, 10)])
    assert codes == [pb.DUPLICATE_MISMATCH, pb.OK]
    assert "entry 3 of ledger 1 is already stored with different bytes" in msg
    assert storage.read_entry(1, 3) == payload_for(1, 3)


def test_duplicate_within_one_batch(storage: Storage) -> None:
    codes, _ = storage.add_entries(1, KEY, [0, 0, 1, 1], [b"a", b"a", b"b", b"c"])
    assert codes == [pb.OK, pb.OK, pb.OK, pb.DUPLICATE_MISMATCH]
    assert storage.read_entry(1, 1) == b"b"


def test_duplicate_of_a_flushed_entry_is_detected(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    add(s, 1, 0, 10)
    s.close()
    s = Storage.open(cfg)
    try:
        add(s, 1, 0, 10)
        codes, _ = s.add_entries(1, KEY, [2], [b"different"])
        assert codes == [pb.DUPLICATE_MISMATCH]
    finally:
        s.close()


@pytest.mark.parametrize(("ledger", "ids", "payloads", "key", "code", "text"), [
    (-1, [0], [b"x"], KEY, pb.INVALID, "ledger id must be non-negative"),
    (1, [-3], [b"x"], KEY, pb.INVALID, "entry id must be non-negative"),
    (1, [0, 1], [b"x"], KEY, pb.INVALID, "2 entry ids but 1 payloads"),
    (1, [0], [b"x" * (64 * 1024 + 1)], KEY, pb.TOO_LARGE, "over entry_size_bytes_max=65536"),
    (1, list(range(1001)), [b"x"] * 1001, KEY, pb.TOO_LARGE, "over batch_entries_max=1000"),
    (1, [0], [b"x"], b"", pb.INVALID, "master key must be 1 to"),
])
def test_bad_adds_get_clear_codes(storage: Storage, ledger: int, ids: list[int], payloads: list[bytes],
                                  key: bytes, code: int, text: str) -> None:
    codes, msg = storage.add_entries(ledger, key, ids, payloads)
    assert code in codes and text in msg


def test_one_bad_entry_does_not_fail_the_rest_of_the_batch(storage: Storage) -> None:
    codes, _ = storage.add_entries(1, KEY, [0, -1, 2], [b"a", b"b", b"c"])
    assert codes == [pb.OK, pb.INVALID, pb.OK]
    assert storage.read_entry(1, 2) == b"c"


def test_wrong_master_key_is_refused(storage: Storage) -> None:
    add(storage, 1, 0, 1)
    codes, msg = storage.add_entries(1, b"another key", [1], [b"x"])
    assert codes == [pb.UNAUTHORIZED] and "wrong master key for ledger 1" in msg
    with pytest.raises(StorageError) as e:
        storage.fence(1, b"another key")
    assert e.value.code == pb.UNAUTHORIZED


def test_fence_refuses_the_writer_but_not_recovery_adds(storage: Storage) -> None:
    add(storage, 1, 0, 5, last_add_confirmed=3)
    info = storage.fence(1, KEY)
    assert info.fenced and info.last_add_confirmed == 3 and info.last_entry_id == 4
    codes, msg = storage.add_entries(1, KEY, [5], [b"late"])
    assert codes == [pb.FENCED] and "fenced" in msg
    add(storage, 1, 5, 1, recovery=True)
    assert storage.read_entry(1, 5) == payload_for(1, 5)


def test_fence_of_an_unknown_ledger_creates_it_fenced(storage: Storage) -> None:
    info = storage.fence(9, KEY)
    assert info.fenced and info.last_entry_id == -1
    codes, _ = storage.add_entries(9, KEY, [0], [b"x"])
    assert codes == [pb.FENCED]


def test_fence_survives_a_crash_right_after_it_is_answered(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    s._flusher.stop()
    add(s, 1, 0, 5)
    s.fence(1, KEY)
    s.abandon()  # no flush, no checkpoint: the fence must already be on disk
    s = Storage.open(cfg)
    try:
        state = s.ledger_state(1)
        assert state is not None and state.fenced
        codes, _ = s.add_entries(1, KEY, [5], [b"x"])
        assert codes == [pb.FENCED]
    finally:
        s.close()


def test_a_later_checkpoint_never_unfences(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    add(s, 1, 0, 5)
    s.fence(1, KEY)
    for batch in range(10):  # roll and flush logs that carry other ledgers' rows
        add(s, 2, batch * 100, 100, size=1000, last_add_confirmed=batch * 100)
    wait_flushed(s)
    s.abandon()
    s = Storage.open(cfg)
    try:
        state = s.ledger_state(1)
        assert state is not None and state.fenced
    finally:
        s.close()


def test_fence_and_write_close_rotate_the_active_log(storage: Storage) -> None:
    add(storage, 1, 0, 5)
    before = storage.status()["active_log_id"]
    storage.write_close(1, KEY)
    assert storage.status()["active_log_id"] == before + 1
    add(storage, 2, 0, 5)
    storage.fence(2, KEY)
    assert storage.status()["active_log_id"] == before + 2
    storage.fence(1, KEY)  # ledger 1 has nothing in the active log: no rotation
    assert storage.status()["active_log_id"] == before + 2


def test_write_close_of_unknown_ledger(storage: Storage) -> None:
    with pytest.raises(StorageError) as e:
        storage.write_close(5, KEY)
    assert e.value.code == pb.NO_SUCH_LEDGER


def test_reads_of_unknown_ledger_and_entry(storage: Storage) -> None:
    with pytest.raises(StorageError) as e:
        storage.read_entry(3, 0)
    assert e.value.code == pb.NO_SUCH_LEDGER and "ledger 3 is not known" in e.value.message
    add(storage, 3, 0, 1)
    with pytest.raises(StorageError) as e:
        storage.read_entry(3, 1)
    assert e.value.code == pb.NO_SUCH_ENTRY
    with pytest.raises(StorageError) as e:
        storage.read_entry(3, -1)
    assert e.value.code == pb.INVALID


def test_full_write_cache_makes_adds_wait_for_the_flusher(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "b", write_cache_entries_max=2000)
    s = Storage.open(cfg, start_flusher=False)
    try:
        for batch in range(30):
            try:
                add(s, 1, batch * 100, 100)
            except WriteCacheFull:
                break
        else:
            pytest.fail("the write cache never filled")
        assert s.status()["write_cache_entries"] <= 2000
        assert not s.wait_for_room(100, timeout_s=0.05)
        s.start_flusher()
        assert s.wait_for_room(100, timeout_s=10)
        add(s, 1, batch * 100, 100)
    finally:
        s.close()


def test_lac_is_tracked_and_survives_restart(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    add(s, 1, 0, 10, last_add_confirmed=7)
    add(s, 1, 10, 1, last_add_confirmed=5)  # a smaller piggybacked LAC never moves it back
    assert s.read_lac(1).last_add_confirmed == 7
    s.close()
    s = Storage.open(cfg)
    try:
        info = s.read_lac(1)
        assert (info.last_add_confirmed, info.last_entry_id, info.fenced) == (7, 10, False)
    finally:
        s.close()


def test_second_bookie_on_the_same_directory_is_refused(storage: Storage, cfg: NodeConfig) -> None:
    with pytest.raises(StorageError, match="in use by another bookie"):
        Storage.open(cfg)


def test_unclean_restarts_are_counted(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    s.abandon()
    s = Storage.open(cfg)
    s.abandon()
    s = Storage.open(cfg)
    try:
        st = s.status()
        assert st["unclean_restart_count"] == 2 and st["last_start_was_unclean"]
        assert s.read_lac if True else None
    finally:
        s.close()
    s = Storage.open(cfg)
    try:
        assert not s.status()["last_start_was_unclean"] and s.status()["unclean_restart_count"] == 2
    finally:
        s.close()


class FlakyIO(FileIO):
    """Fails the first `failures` fsyncs, as a transient disk error would."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def fsync(self, fd: int) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise OSError(5, "injected fsync failure")
        super().fsync(fd)


def test_a_failed_fsync_is_reported_and_never_retried(cfg: NodeConfig) -> None:
    """The flusher thread's fsync of a rolled log fails: the failure is reported (last_flush_error, the engine's
    on_sync_lost, which the server makes an exit), never retried (Linux may have dropped the pages, synclost.py),
    the recovery point stays before that log, and adds are refused."""
    io = FlakyIO(failures=0)
    # The flusher starts once the logs have rolled: started at once, it could fail the first rolled log's fsync
    # while the adds went on, and refuse the later ones (a flake under load).
    s = Storage.open(cfg, io=io, start_flusher=False)
    lost: list[str] = []
    told = threading.Event()
    s.on_sync_lost = lambda reason: (lost.append(reason), told.set())
    try:
        point = s.recovery_point_log_id
        io.failures = 1  # the next fsync fails; a retry would succeed
        for batch in range(5):
            add(s, 1, batch * 100, 100, size=1000)
        assert s.pending_flushes() >= 1
        s.start_flusher()
        assert told.wait(30)
        assert "injected fsync failure" in s.last_flush_error and f"entry log {point}" in lost[0]
        assert "could not be written" not in lost[0]  # the node state says the tail may be lost
        time.sleep(0.2)  # the retries the flusher made before (after 50 ms) would have moved the point by now
        assert s.recovery_point_log_id == point, "the failed fsync was retried into success"
        assert s.read_entry(1, 499) == payload_for(1, 499, 1000)  # from the write cache
        codes, message = s.add_batch([LedgerBatch(2, KEY, [0], [payload_for(2, 0)])])[0]
        assert list(codes) == [pb.READ_ONLY] and "injected fsync failure" in message
    finally:
        s.close()  # abandons: no checkpoint past the failed log


def test_roll_interval_rolls_a_quiet_log(tmp_path: Path) -> None:
    s = Storage.open(small_config(tmp_path / "b", log_roll_interval_ms=50))
    try:
        add(s, 1, 0, 3)
        deadline = time.monotonic() + 10
        while s.status()["recovery_point_log_id"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.status()["recovery_point_log_id"] >= 1
    finally:
        s.close()


def test_the_flusher_sleeps_until_the_age_roll_is_due_and_a_roll_wakes_it(tmp_path: Path) -> None:
    """Idle, the flusher sleeps a whole roll interval, not a tick; with records in the active log, until their age
    roll is due (a tick at least); with a log queued, a tick. Each roll calls the engine's wake hook."""
    now = [100.0]
    s = Storage.open(small_config(tmp_path / "b", log_roll_interval_ms=1000), start_flusher=False,
                     clock=lambda: now[0])
    try:
        flusher = Flusher(s)
        assert flusher.tick_s == 0.25 and flusher.wait_s() == 1.0  # nothing in the active log
        add(s, 1, 0, 3)
        now[0] += 0.4
        assert flusher.wait_s() == pytest.approx(0.6)
        now[0] += 0.5
        assert flusher.wait_s() == 0.25  # due in 0.1 s
        woken: list[int] = []
        s.wake_on_roll(lambda: woken.append(s.pending_flushes()))
        assert s.roll()
        assert woken == [1] and flusher.wait_s() == 0.25  # the queued log is flushed a tick later at the latest
        assert flusher.step() == 1 and flusher.wait_s() == 1.0
    finally:
        s.close()


@pytest.mark.parametrize(("field", "value", "text"), [
    ("fsync_policy", "sometimes", "fsync_policy must be one of"),
    ("log_size_bytes_max", 1000, "log_size_bytes_max must be in"),
    ("write_cache_entries_max", 10, "must be at least twice batch_entries_max"),
    ("port", 70000, "port must be in"),
    ("batch_bytes_max", 1024, "batch_bytes_max must be in"),
    ("lost_bookie_delay_s", -1.0, "lost_bookie_delay_s must be in"),
    ("audit_interval_s", 0.5, "audit_interval_s must be in"),
    ("open_ledger_grace_s", -5.0, "open_ledger_grace_s must be in"),
    ("replication_rate_bytes_per_s", -1, "replication_rate_bytes_per_s must be >= 0"),
    ("replication_batch_bytes_max", 1024, "replication_batch_bytes_max must be in"),
    ("replication_workers_max", 0, "replication_workers_max must be in"),
])
def test_config_limits_are_checked(tmp_path: Path, field: str, value: object, text: str) -> None:
    with pytest.raises(ConfigError, match=text):
        small_config(tmp_path, **{field: value}).validate()


def test_fsync_policy_batch_syncs_every_add(tmp_path: Path) -> None:
    class CountingIO(FileIO):
        datasyncs = 0

        def fdatasync(self, fd: int) -> None:
            CountingIO.datasyncs += 1
            super().fdatasync(fd)

    s = Storage.open(small_config(tmp_path / "b", fsync_policy="batch"), io=CountingIO())
    try:
        for batch in range(5):
            add(s, 1, batch * 10, 10)
        assert CountingIO.datasyncs == 5
    finally:
        s.close()


def test_a_lost_index_is_rebuilt_from_the_entry_logs(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    for batch in range(10):
        add(s, 1, batch * 100, 100, size=1000)
    s.fence(1, KEY)
    s.close()
    shutil.rmtree(Path(cfg.data_dir) / "index")
    s = Storage.open(cfg)
    try:
        assert s.recovery.recovery_point_log_id == 0 and s.recovery.logs_scanned >= 4
        for e in range(0, 1000, 41):
            assert s.read_entry(1, e) == payload_for(1, e, 1000)
        state = s.ledger_state(1)
        assert state is not None and state.fenced  # from the fence record in the entry log
        assert s.add_entries(1, KEY, [1000], [b"x"])[0] == [pb.FENCED]
    finally:
        s.close()


def test_an_unreadable_index_stops_the_bookie_with_advice(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    add(s, 1, 0, 10)
    s.close()
    (Path(cfg.data_dir) / "index" / "data.mdb").write_bytes(b"garbage" * 1000)
    with pytest.raises(StorageError, match="move that directory aside and restart"):
        Storage.open(cfg)


def test_a_corrupt_identity_file_stops_the_bookie_with_a_message(cfg: NodeConfig) -> None:
    Storage.open(cfg).close()
    (Path(cfg.data_dir) / "node-state").write_text("{not json")
    with pytest.raises(StorageError, match=r"identity .* cannot be trusted"):
        Storage.open(cfg)


def test_a_log_shorter_than_its_header_is_deleted(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    add(s, 1, 0, 5)
    s.close()
    rp = read_recovery_point(FileIO(), cfg.data_dir)
    assert rp is not None
    stub = Path(cfg.data_dir) / LOGS_DIR / log_file_name(rp.log_id)
    stub.write_bytes(b"OCTAV")  # a crash right after creating the file, mid-header
    s = Storage.open(cfg)
    try:
        assert [scan.action for scan in s.recovery.scans] == ["delete"]
        assert not stub.exists() or stub.stat().st_size >= LOG_HEADER_BYTES  # the new active log may reuse the id
        assert s.read_entry(1, 4) == payload_for(1, 4)
    finally:
        s.close()


@given(st.lists(st.tuples(st.integers(0, 2**62), st.binary(max_size=2000)), max_size=40), st.integers(0, 2**62))
def test_the_fast_encoder_writes_exactly_the_record_format(items: list[tuple[int, bytes]], ledger: int) -> None:
    from octavo.node.appends import encode_records as _encode_records
    from octavo.node.record import encode_record

    ids = [eid for eid, _ in items]
    payloads = [p for _, p in items]
    parts: list[bytes] = []
    cache: dict[int, int] = {}
    end = _encode_records(ledger, ids, payloads, parts, cache, 100)
    expected = b"".join(encode_record(ledger, eid, p)[0] + p for eid, p in items)
    assert b"".join(parts) == expected
    assert end == 100 + len(expected)


class FailingWriteIO(FileIO):
    """Writes half of the next batch and then fails, as a disk error mid-write would."""

    fail_next = False

    def write_parts(self, fd: int, parts: list[bytes], total_bytes: int) -> None:
        if self.fail_next:
            self.fail_next = False
            data = b"".join(parts)
            super().write_at_end(fd, data[: len(data) // 2])
            raise OSError(5, "injected write failure")
        super().write_parts(fd, parts, total_bytes)


def test_a_failed_write_is_reported_and_cut_off_the_log(cfg: NodeConfig) -> None:
    io = FailingWriteIO()
    s = Storage.open(cfg, io=io)
    add(s, 1, 0, 10)
    io.fail_next = True
    codes, msg = s.add_entries(1, KEY, [10, 11, 12], [payload_for(1, e) for e in (10, 11, 12)])
    assert codes == [pb.INTERNAL] * 3 and "injected write failure" in msg
    with pytest.raises(StorageError) as e:
        s.read_entry(1, 10)
    assert e.value.code == pb.NO_SUCH_ENTRY
    add(s, 1, 10, 5)  # the writer retries the same entries: they are written whole
    s.abandon()
    s = Storage.open(cfg)
    try:
        assert s.recovery.bytes_truncated == 0  # the half-written batch was cut off at once
        for e in range(15):
            assert s.read_entry(1, e) == payload_for(1, e)
    finally:
        s.close()


def test_unclean_stop_across_a_reboot_answers_unknown(cfg: NodeConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Storage.open(cfg)
    add(s, 1, 0, 5)
    s.abandon()
    monkeypatch.setenv("OCTAVO_BOOT_ID", "another-boot")
    s = Storage.open(cfg)
    try:
        assert s.tail_maybe_lost and s.read_lac(1).tail_maybe_lost
        with pytest.raises(StorageError) as e:
            s.read_entry(1, 5)
        assert e.value.code == pb.UNKNOWN and "may have lost it" in e.value.message
        assert s.read_entry(1, 4) == payload_for(1, 4)
    finally:
        s.abandon()
    # A crash before the tail repair went through, then a start on the same boot: still in doubt (it was sure
    # again here, and would have answered "no such entry" for what the reboot took), and so after a clean stop.
    s = Storage.open(cfg)
    try:
        assert s.tail_maybe_lost and s.recovery.unclean
    finally:
        s.close()
    s = Storage.open(cfg)
    try:
        assert s.tail_maybe_lost
        startup.tail_repair_done(s.io, s.data_dir, s.node_state)  # what repair.py does once it went through
        s.tail_repaired()
    finally:
        s.close()
    s = Storage.open(cfg)  # repaired, then a clean stop: certain again
    try:
        assert not s.tail_maybe_lost
    finally:
        s.close()


def test_entries_lost_in_a_reboot_can_be_written_back(cfg: NodeConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bookie in doubt after a reboot-crash answers UNKNOWN for what it lacks, but must still accept the
    lost entries back (tail repair, recovery adds, a writer's resend): the duplicate check may not trip on
    its own doubt."""
    s = Storage.open(cfg)
    s._flusher.stop()
    add(s, 1, 0, 10, size=1000)
    active = s.status()["active_log_id"]
    s.abandon()
    path = Path(cfg.data_dir) / LOGS_DIR / log_file_name(active)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 5 * 1024)  # entries 5..9 lost
    monkeypatch.setenv("OCTAVO_BOOT_ID", "rebooted")
    s = Storage.open(cfg)
    try:
        assert s.tail_maybe_lost
        with pytest.raises(StorageError) as e:
            s.read_entry(1, 7)
        assert e.value.code == pb.UNKNOWN
        add(s, 1, 9, 1, size=1000, recovery=True)  # a later entry first: 5..8 are now holes below it
        codes, msg = s.add_entries(1, KEY, [5, 6, 7], [payload_for(1, e, 1000) for e in (5, 6, 7)], recovery=True)
        assert codes == [pb.OK] * 3, msg
        assert s.read_entry(1, 7) == payload_for(1, 7, 1000)
        codes, _ = s.add_entries(1, KEY, [7], [b"other bytes"], recovery=True)
        assert codes == [pb.DUPLICATE_MISMATCH]
    finally:
        s.close()
