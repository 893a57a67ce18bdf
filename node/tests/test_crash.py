"""SIGKILL: a real bookie process under a pipelined add load, killed at random moments and at every named
fault point; after each restart every acknowledged entry reads back byte-identical."""

from __future__ import annotations

import random
import time
from pathlib import Path

import grpc
import pytest

from octavo.node import faults
from octavo.node.testing import BookieConnection, BookieProcess, PipelinedWriter, entry_size, payload_for
from octavo.v1 import bookie_pb2 as pb

KEY = b"crash-key"
ARGS = ["--log-size-bytes-max", "262144", "--log-roll-interval-ms", "100", "--batch-bytes-max", "131072",
        "--entry-size-bytes-max", "16384", "--write-cache-entries-max", "20000", "--batch-entries-max", "1000"]
KILL_ROUNDS = 15


def verify(address: str, acked: dict[int, int]) -> int:
    checked = 0
    with BookieConnection(address) as conn:
        for ledger, last in acked.items():
            got = conn.read_all(ledger, 0, last)
            for e in range(last + 1):
                code, payload = got[e]
                assert code == pb.OK, f"acknowledged entry {ledger}/{e} lost after restart (code {code})"
                assert payload == payload_for(ledger, e, entry_size(ledger)), f"entry {ledger}/{e} changed"
                checked += 1
    return checked


@pytest.mark.slow
def test_sigkill_at_random_moments_under_load(tmp_path: Path) -> None:
    rng = random.Random(20261122)
    bookie = BookieProcess(str(tmp_path / "bookie"), args=ARGS)
    acked: dict[int, int] = {}
    total_acked_requests = 0
    for round_no in range(KILL_ROUNDS):
        address = bookie.start()
        verify(address, acked)
        ledgers = [round_no * 10 + i for i in range(3)] + [i for i in range(3)]  # new ledgers and old ones
        writer = PipelinedWriter(address, acked, ledgers, seed=round_no, master_key=KEY)
        writer.start()
        time.sleep(rng.uniform(0.1, 0.7))
        bookie.kill()
        writer.join(timeout=30)
        assert not writer.errors, writer.errors
        total_acked_requests += writer.requests_acked
    address = bookie.start()
    checked = verify(address, acked)
    with BookieConnection(address) as conn:
        st = conn.status()
    bookie.stop()
    assert total_acked_requests > KILL_ROUNDS * 5, "the load was too light to mean anything"
    assert st.unclean_restart_count == KILL_ROUNDS
    assert st.recovery_point_log_id > 0, "no log was ever flushed: the kills never met a flush"
    assert checked > 10_000


@pytest.mark.parametrize("point", [
    f"{faults.FLUSH_AFTER_LOG_SYNC}@2",
    f"{faults.FLUSH_AFTER_INDEX_COMMIT}@2",
    f"{faults.FLUSH_AFTER_RECOVERY_POINT}@2",
    f"{faults.ADD_AFTER_WRITE}@40",
])
def test_sigkill_at_fault_point(tmp_path: Path, point: str) -> None:
    bookie = BookieProcess(str(tmp_path / "bookie"), args=ARGS, env={faults.FAULT_POINTS_ENV: point})
    acked: dict[int, int] = {}
    address = bookie.start()
    writer = PipelinedWriter(address, acked, [1, 2, 3], seed=1, master_key=KEY)
    writer.start()
    writer.join(timeout=60)
    assert not writer.errors, writer.errors
    assert bookie.proc is not None and bookie.proc.wait(timeout=30) == -9, "the fault point never fired"
    bookie.proc = None
    bookie.env = {}
    address = bookie.start()
    assert verify(address, acked) > 0
    with BookieConnection(address) as conn:  # and it goes on: writes after recovery, flushes included
        writer = PipelinedWriter(address, acked, [1, 2, 3], seed=2, master_key=KEY)
        writer.start()
        time.sleep(0.5)
        writer.stop.set()
        writer.join(timeout=30)
        assert not writer.errors, writer.errors
        assert conn.status().last_start_was_unclean
    assert bookie.stop() == 0
    verify(bookie.start(), acked)
    bookie.stop()


def test_sigkill_right_after_a_fence_is_persisted(tmp_path: Path) -> None:
    bookie = BookieProcess(str(tmp_path / "bookie"), args=ARGS,
                           env={faults.FAULT_POINTS_ENV: faults.FENCE_AFTER_PERSIST})
    with BookieConnection(bookie.start()) as conn:
        conn.add(7, KEY, [0, 1, 2], [b"a", b"b", b"c"], last_add_confirmed=1)
        with pytest.raises(grpc.RpcError):
            conn.read_lac(7, fence=True, master_key=KEY)
    assert bookie.proc is not None and bookie.proc.wait(timeout=30) == -9
    bookie.proc = None
    bookie.env = {}
    with BookieConnection(bookie.start()) as conn:
        lac = conn.read_lac(7)
        assert lac.fenced and lac.last_entry_id == 2
        resp = conn.add(7, KEY, [3], [b"d"])
        assert list(resp.results[0].codes) == [pb.FENCED]
        assert conn.read_all(7, 0, 2) == {0: (pb.OK, b"a"), 1: (pb.OK, b"b"), 2: (pb.OK, b"c")}
    bookie.stop()


def test_a_failing_fsync_in_a_real_process_exits_it_and_the_restart_loses_nothing(tmp_path: Path) -> None:
    """A real bookie under load whose second fsync of a rolled log fails with EIO (the fault point
    flush.log_sync_fails, not a kill): it refuses adds, exits with code 3 (synclost.py), and the restart, with the
    same disk, comes up doubting its tail (a sync it relied on failed) and reads back every acknowledged entry
    byte-identical (the page cache kept them: the process died, not the machine)."""
    from octavo.node.synclost import EXIT_SYNC_LOST

    bookie = BookieProcess(str(tmp_path / "bookie"), args=ARGS,
                           env={faults.FAULT_POINTS_ENV: f"{faults.FLUSH_LOG_SYNC_FAILS}@2"})
    acked: dict[int, int] = {}
    address = bookie.start()
    writer = PipelinedWriter(address, acked, [1, 2, 3], seed=3, master_key=KEY)
    writer.start()
    writer.join(timeout=60)
    assert bookie.proc is not None and bookie.proc.wait(timeout=60) == EXIT_SYNC_LOST, "the fsync never failed"
    bookie.proc = None
    assert "exiting with code 3" in bookie.log_tail() and "simulated disk error" in bookie.log_tail()
    assert writer.entries_acked > 0, "nothing was acknowledged before the failure: the test proves nothing"
    assert not writer.errors or all("read-only" in e.lower() or "read only" in e.lower() for e in writer.errors), \
        writer.errors
    bookie.env = {}
    address = bookie.start()
    with BookieConnection(address) as conn:
        assert conn.status().tail_maybe_lost, "the restart after a failed sync must doubt its unsynced tail"
    assert verify(address, acked) == sum(last + 1 for last in acked.values())
    assert bookie.stop() == 0
