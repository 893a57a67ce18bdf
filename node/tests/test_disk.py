"""The disk monitor's watermarks and the read-only mode, on a storage engine with a capacity override."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import grpc
import lmdb
import pytest

from octavo.node.config import ConfigError, NodeConfig
from octavo.node.dataplane import BookieService, bookie_handler
from octavo.node.disk import DiskMonitor, tree_bytes
from octavo.node.entrylog import LOCATION_LENGTH_BITS
from octavo.node.fileio import FileIO
from octavo.node.index import Index, as_os_error
from octavo.node.ratelimitedlog import RateLimit
from octavo.node.rpc import disk_failures
from octavo.node.storage import Storage, write_failures
from octavo.node.testing import payload_for, small_config
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc

KEY = b"k"


def make(tmp_path: Path) -> tuple[Storage, DiskMonitor, Path]:
    cfg = small_config(tmp_path / "b", disk_capacity_bytes=0)
    s = Storage.open(cfg)
    base = tree_bytes(cfg.data_dir)
    s.close()
    capacity = base + 10 * 1024 * 1024  # usage ratios below are set with a filler file
    cfg = small_config(tmp_path / "b", disk_capacity_bytes=capacity, disk_warn_ratio=0.7, disk_readonly_ratio=0.9,
                       disk_writable_ratio=0.6)
    s = Storage.open(cfg)
    return s, DiskMonitor(s), Path(cfg.data_dir) / "filler"


def fill_to(s: Storage, filler: Path, ratio: float) -> None:
    cap = s.config.disk_capacity_bytes
    filler.unlink(missing_ok=True)
    other = tree_bytes(s.data_dir)
    filler.write_bytes(b"\1" * max(0, int(cap * ratio) - other))


def add(s: Storage, lid: int, eid: int, recovery: bool = False) -> tuple[list[int], str]:
    return s.add_entries(lid, KEY, [eid], [payload_for(lid, eid)], recovery=recovery)


def test_the_high_and_low_marks_switch_the_mode_without_flapping(tmp_path: Path) -> None:
    s, monitor, filler = make(tmp_path)
    try:
        seen = []
        for ratio in (0.3, 0.75, 0.85, 0.92, 0.85, 0.7, 0.61, 0.55, 0.8):
            fill_to(s, filler, ratio)
            monitor.check()
            seen.append(monitor.read_only)
        # writable up to the high mark; read-only from it until below the low mark; writable between again
        assert seen == [False, False, False, True, True, True, True, False, False]
    finally:
        s.close()


def test_a_read_only_bookie_refuses_adds_but_serves_reads_and_recovery(tmp_path: Path) -> None:
    s, monitor, filler = make(tmp_path)
    try:
        assert add(s, 1, 0)[0] == [pb.OK]
        fill_to(s, filler, 0.95)
        assert monitor.check()
        codes, message = add(s, 1, 1)
        assert codes == [pb.READ_ONLY] and "disk of" in message and "95" in message
        assert add(s, 1, 1, recovery=True)[0] == [pb.OK]  # recovery writes still land
        assert s.read_entry(1, 0) == payload_for(1, 0)
        fill_to(s, filler, 0.1)
        assert monitor.check() and not monitor.read_only
        assert add(s, 1, 2)[0] == [pb.OK]
    finally:
        s.close()


def test_forced_read_only_survives_a_restart_and_only_the_administrator_releases_it(tmp_path: Path) -> None:
    s, monitor, _ = make(tmp_path)
    monitor.set_forced(True)
    assert add(s, 1, 0)[0] == [pb.READ_ONLY]
    cfg = s.config
    s.close()
    s = Storage.open(cfg)
    try:
        monitor = DiskMonitor(s)
        monitor.check()  # plenty of space: the forced mode stays
        assert monitor.read_only and "forced" in monitor.reason()
        assert add(s, 1, 0)[0] == [pb.READ_ONLY]
        monitor.set_forced(False)
        assert not monitor.read_only and add(s, 1, 0)[0] == [pb.OK]
    finally:
        s.close()


def test_watermarks_are_checked_at_startup(tmp_path: Path) -> None:
    for bad in ({"disk_writable_ratio": 0.95, "disk_readonly_ratio": 0.95},
                {"disk_writable_ratio": 0.9, "disk_readonly_ratio": 0.8},
                {"disk_readonly_ratio": 1.5},
                {"disk_warn_ratio": 0.99, "disk_readonly_ratio": 0.95}):
        with pytest.raises(ConfigError, match="disk"):
            NodeConfig(data_dir=str(tmp_path), **bad).validate()  # type: ignore[arg-type]


def test_the_watermark_policy_as_a_table() -> None:
    """Pure: every (mode, usage) pair against the marks, ENOSPC included, with no disk."""
    from octavo.node.watermarks import Watermarks, disk_full_next, warning_due

    marks = Watermarks(warn_ratio=0.90, readonly_ratio=0.95, writable_ratio=0.85)
    rows = [  # (read-only now, worst usage, ENOSPC seen) -> read-only next
        (False, 0.50, False, False), (False, 0.90, False, False), (False, 0.95, False, True),
        (False, 0.99, False, True), (False, 0.50, True, True),
        (True, 0.99, False, True), (True, 0.90, False, True), (True, 0.85, False, True),  # between: stays
        (True, 0.849, False, False), (True, 0.10, False, False), (True, 0.10, True, True),
    ]
    for full, ratio, enospc, expected in rows:
        assert disk_full_next(full, ratio, enospc, marks) is expected, (full, ratio, enospc)
    # Hysteresis: a usage moving inside the band never changes the mode, whichever way it came in.
    for start in (False, True):
        mode = start
        for ratio in (0.86, 0.94, 0.90, 0.88, 0.9499):
            mode = disk_full_next(mode, ratio, False, marks)
        assert mode is start
    assert warning_due(0.91, False, marks) is True and warning_due(0.91, True, marks) is None
    assert warning_due(0.50, True, marks) is False and warning_due(0.50, False, marks) is None


class FullDiskIO(FileIO):
    """Writes fail with ENOSPC while `full` (a full disk, as the simulation's FaultyIO makes one); reads work."""

    def __init__(self) -> None:
        self.full = False

    def write_at_end(self, fd: int, data: bytes | memoryview) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write_at_end(fd, data)

    def write_parts(self, fd: int, parts: list[bytes] | list[bytes | memoryview], total_bytes: int) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write_parts(fd, parts, total_bytes)


async def test_a_fence_on_a_full_disk_answers_resource_exhausted_naming_the_disk(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 20024: the log roll after a fence hit ENOSPC and the OSError reached gRPC, which answered UNKNOWN
    and logged a traceback per fence. Now: RESOURCE_EXHAUSTED naming the data directory, and the lines a flood
    of such fences costs are bounded by the rate limit."""
    for limited in (disk_failures, write_failures):  # a fresh window: earlier tests may have used this one's
        monkeypatch.setattr(limited, "limit", RateLimit())
    io = FullDiskIO()
    s = Storage.open(small_config(tmp_path / "b"), io=io)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((bookie_handler(BookieService(s)),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    fences = disk_failures.limit.lines_max + 5
    try:
        assert add(s, 1, 0)[0] == [pb.OK]  # ledgers 1 and 2 in the active log: a fence or close rolls the log
        assert add(s, 2, 0)[0] == [pb.OK]
        io.full = True
        caplog.set_level(logging.WARNING)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.BookieStub(channel)
            for _ in range(fences):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.ReadLastAddConfirmed(pb.ReadLacRequest(ledger_id=1, master_key=KEY, fence=True))
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert f"the disk is full in {s.data_dir}" in (refused.value.details() or "")
            closed = await stub.WriteClose(pb.WriteCloseRequest(ledger_id=2, master_key=KEY))
            assert closed.code == pb.INTERNAL and f"the disk is full in {s.data_dir}" in closed.message
        state = s.ledger_state(1)
        assert state is not None and state.fenced  # the fence itself was synced before the roll failed
        lines = [r for r in caplog.records if r.name == "octavo.node.rpc" and "fence of ledger 1" in r.getMessage()]
        assert 1 <= len(lines) <= disk_failures.limit.lines_max < fences
        # The engine's own lines (the fence record and the append it could not write) are bounded too.
        engine_lines = [r for r in caplog.records if r.name == "octavo.node.storage"]
        assert 1 <= len(engine_lines) <= 2 * write_failures.limit.lines_max < 2 * fences
    finally:
        await server.stop(None)
        io.full = False
        s.close()


def test_an_index_write_lmdb_refuses_raises_an_oserror_with_lmdbs_words(tmp_path: Path) -> None:
    """Noticed beside seed 20024: a synced index write that LMDB refuses (a fence's ledger row on a full disk)
    raised lmdb.Error, which no disk-failure handler catches, so the data plane answered gRPC's UNKNOWN. The
    index now raises OSError like every other disk write (ENOSPC for LMDB's DiskError, EIO for the rest). A real
    refusal: a checkpoint larger than the index's map."""
    index = Index(str(tmp_path), FileIO(), map_size_bytes=64 * 1024)
    try:
        cache = {7: {entry_id: (entry_id * 100) << LOCATION_LENGTH_BITS | 100 for entry_id in range(20_000)}}
        with pytest.raises(OSError) as refused:
            index.commit_checkpoint(1, cache, {}, 2_000_000)
        assert refused.value.errno == errno.EIO and "MapFullError" in str(refused.value)
        assert isinstance(refused.value.__cause__, lmdb.MapFullError)
        assert as_os_error(lmdb.DiskError("mdb_txn_commit: No space left on device")).errno == errno.ENOSPC
        assert index.get(7, 0) is None  # the refused transaction left nothing behind
    finally:
        index.close()
