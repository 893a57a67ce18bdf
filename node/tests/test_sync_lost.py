"""A failed fsync of a rolled entry log is sticky ("fsyncgate", synclost.py, docs/durability.md row "fsync of a
rolled log fails"): the retry that Linux would let succeed over dropped pages never happens, the recovery point
stays before the log, adds are refused, and the next start comes up with tail_maybe_lost.

The disk is a SimIO whose first fsync of a chosen log fails and drops that log's unsynced pages, as Linux does
after a writeback error: later fsyncs of it succeed and make nothing more durable."""

from __future__ import annotations

import errno
import os
import random
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from octavo.node import startup
from octavo.node.config import NodeConfig
from octavo.node.dataplane import BookieService, bookie_handler
from octavo.node.errors import StorageError
from octavo.node.simio import SimIO
from octavo.node.storage import LedgerBatch, Storage
from octavo.node.synclost import EXIT_SYNC_LOST, SyncLostError
from octavo.node.testing import payload_for, small_config
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc

KEY = b"k"


class FsyncgateIO(SimIO):
    """SimIO with Linux's behaviour after a writeback error: once `fail_next` is set, the next fsync of an entry
    log fails with EIO and its pages count as clean: every later fsync of that file succeeds without making its
    bytes durable (a power cut loses them)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.fail_next = False
        self._dropped: set[int] = set()  # inodes whose dirty pages the kernel dropped

    def fsync(self, fd: int) -> None:
        ino = os.fstat(fd).st_ino
        if self.fail_next:
            self.fail_next = False
            self._dropped.add(ino)
            raise OSError(errno.EIO, "simulated writeback error")
        if ino in self._dropped:
            self._check()  # "succeeds": the pages are clean, nothing reaches the disk
            return
        super().fsync(fd)


def config(data_dir: Path) -> NodeConfig:
    return small_config(data_dir)


def add(s: Storage, ledger: int, entry: int) -> tuple[list[int], str]:
    codes, message = s.add_batch([LedgerBatch(ledger, KEY, [entry], [payload_for(ledger, entry)])])[0]
    return list(codes), message


def failed_flush(tmp_path: Path) -> tuple[FsyncgateIO, Storage, int]:
    """A bookie with entries 0-2 of ledger 1 in a rolled log whose fsync failed. Returns the IO, the engine and
    the log's id (the recovery point's log id before the failure: the log after it is the one that failed)."""
    io = FsyncgateIO(str(tmp_path))
    s = Storage.open(config(tmp_path / "b"), io=io, start_flusher=False)
    for entry in range(3):
        assert add(s, 1, entry)[0] == [pb.OK]
    point_before = s.recovery_point_log_id
    assert s.roll()
    io.fail_next = True
    with pytest.raises(SyncLostError) as lost:
        s.flush_one()
    assert f"entry log {point_before}" in str(lost.value)
    return io, s, point_before


def test_a_failed_fsync_is_not_retried_into_success(tmp_path: Path) -> None:
    """(a) The fsync fails once and would succeed on a retry: the recovery point never moves past the log."""
    _, s, point_before = failed_flush(tmp_path)
    try:
        for _ in range(3):  # what the flusher's retries did: each would now succeed
            with pytest.raises(SyncLostError):
                s.flush_one()
        assert s.recovery_point_log_id == point_before
        assert s.pending_flushes() == 1
        assert s.read_entry(1, 2) == payload_for(1, 2)  # still served, from the write cache
    finally:
        s.abandon()


def test_adds_are_refused_read_only_naming_the_log_and_the_error(tmp_path: Path) -> None:
    """(c) While the condition holds, adds get READ_ONLY with the log and the error in the message; recovery
    adds are not refused by it (re-replication towards this bookie still lands in the write cache)."""
    _, s, log_id = failed_flush(tmp_path)
    try:
        codes, message = add(s, 2, 0)
        assert codes == [pb.READ_ONLY]
        assert f"entry log {log_id}" in message and "simulated writeback error" in message
        assert s.read_only_reason.startswith("read-only: ")
        assert s.sync_failed_reason
    finally:
        s.abandon()


async def test_adds_over_grpc_get_read_only(tmp_path: Path) -> None:
    """(c) Over a real gRPC server: the add stream answers READ_ONLY with the reason."""
    _, s, log_id = failed_flush(tmp_path)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((bookie_handler(BookieService(s)),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    async def one() -> pb.AddRequest:
        yield pb.AddRequest(request_id=1, group_ledger_ids=[3], group_master_keys=[KEY], group_lacs=[-1],
                            group_entry_counts=[1], entry_ids=[0], payloads=[payload_for(3, 0)])

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = pb_grpc.BookieStub(channel).AddEntries(one())
            answer = await call.read()
            codes = [c for g in answer.refused_groups for c in g.codes] + [c for r in answer.results for c in r.codes]
            messages = [g.message for g in answer.refused_groups] + [r.message for r in answer.results]
            assert codes == [pb.READ_ONLY], answer
            assert any(f"entry log {log_id}" in m for m in messages), answer
    finally:
        await server.stop(None)
        s.abandon()


def test_after_a_power_cut_the_restart_knows_its_tail_may_be_lost(tmp_path: Path) -> None:
    """(b) The bookie stops (a close no longer flushes nor checkpoints past the failed log), the power goes and the
    dropped pages with it; the restart (same boot id: only the node state can say so) comes up with
    tail_maybe_lost, replays from the same recovery point, and answers UNKNOWN, never NO_SUCH_ENTRY, for what
    it lost, so that readers go to the replicas and tail repair copies it back."""
    io, s, point_before = failed_flush(tmp_path)
    s.close()
    io.crash()
    io.power_loss(random.Random(0), keep_unsynced=False)
    s = Storage.open(config(tmp_path / "b"), start_flusher=False)
    try:
        assert s.tail_maybe_lost
        assert s.recovery_point_log_id == point_before
        assert s.recovery.unclean
        with pytest.raises(StorageError) as missing:
            s.read_entry(1, 2)
        assert missing.value.code == pb.UNKNOWN
        assert add(s, 1, 3)[0] == [pb.OK]  # writable again: the condition was this process's
    finally:
        s.close()
    s = Storage.open(config(tmp_path / "b"), start_flusher=False)
    try:  # no tail repair went through: a clean stop does not bring back what the disk lost
        assert s.tail_maybe_lost, "the doubt lasts until the tail repair went through"
        startup.tail_repair_done(s.io, s.data_dir, s.node_state)
    finally:
        s.close()
    s = Storage.open(config(tmp_path / "b"), start_flusher=False)
    try:
        assert s.tail_maybe_lost is False, "repaired, then a clean stop: the start is sure again"
    finally:
        s.close()


def test_a_marker_that_cannot_be_written_still_refuses_adds_and_keeps_the_point(tmp_path: Path) -> None:
    """The disk is gone: the node state cannot be written either. Adds are refused all the same and the
    recovery point does not move."""
    io = FsyncgateIO(str(tmp_path))
    s = Storage.open(config(tmp_path / "b"), io=io, start_flusher=False)
    try:
        assert add(s, 1, 0)[0] == [pb.OK]
        point_before = s.recovery_point_log_id
        assert s.roll()
        io.fail_next = True
        io.crash()  # every later IO call fails (the marker's write too)
        with pytest.raises(SyncLostError) as lost:
            s.flush_one()
        assert "could not be written" in str(lost.value)
        assert add(s, 2, 0)[0] == [pb.READ_ONLY]
        with pytest.raises(SyncLostError):
            s.flush_one()
        assert s.recovery_point_log_id == point_before
    finally:
        s.abandon()


def test_the_process_exits_with_its_own_code_and_says_why() -> None:
    """What the server installs as on_sync_lost: a real process exits at once with EXIT_SYNC_LOST (no clean close,
    which would checkpoint past the failed log), the reason on stderr for whoever restarts it."""
    code = "from octavo.node.synclost import exit_sync_lost; exit_sync_lost('the fsync of entry log 7 failed'); " \
           "print('still running')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_SYNC_LOST == 3
    assert "octavo node: the fsync of entry log 7 failed; exiting with code 3" in done.stderr
    assert "still running" not in done.stdout
