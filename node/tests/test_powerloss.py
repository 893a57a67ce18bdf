"""Power loss: only what was fsynced survives (plus a random torn part of what was not).

A seeded random workload of adds, fences, rolls and pauses runs against the engine over SimIO; then the
"machine" dies mid-flight and the files are put back to what a power cut leaves. After a restart:
- every acknowledged entry in a log below the recovery point reads back byte-identical;
- every other acknowledged entry reads back byte-identical or is cleanly absent (NO_SUCH_ENTRY), never
  different bytes and never a checksum error;
- every index entry points at a whole, valid record (the index never got ahead of synced bytes);
- every log after the recovery point was cut at a record boundary (a rescan finds no error);
- every fence that was answered is still there.
A seed fixes the workload (the adds, fences, rolls and where the power is cut) and which unsynced bytes
survive, not the interleaving with the engine's real flusher thread, which runs on its own clock: a failing
seed reruns the same workload (pytest -k "test_power_loss and 17"), and usually, not always, the same failure.
Making the flusher steppable with an injected clock, so a seed replays exactly, is still to do.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from pathlib import Path

import pytest

from octavo.node.config import KIB
from octavo.node.errors import StorageError
from octavo.node.fileio import FileIO
from octavo.node.files import LOGS_DIR, log_file_name
from octavo.node.recovery import scan_log
from octavo.node.simio import SimIO
from octavo.node.startup import BOOT_ID_ENV
from octavo.node.storage import Storage
from octavo.node.testing import payload_for, small_config
from octavo.v1 import bookie_pb2 as pb

KEY = b"k"
SEEDS = 40


def run_workload(s: Storage, rng: random.Random) -> tuple[dict[tuple[int, int], bytes], set[int]]:
    acked: dict[tuple[int, int], bytes] = {}
    fenced: set[int] = set()
    next_id: dict[int, int] = defaultdict(int)
    for _ in range(rng.randrange(20, 250)):
        r = rng.random()
        ledger = rng.randrange(6)
        if r < 0.86:
            count = rng.randrange(1, 40)
            size = rng.choice([1, 100, 700, 3000])
            ids = list(range(next_id[ledger], next_id[ledger] + count))
            payloads = [payload_for(ledger, e, size) for e in ids]
            codes, _ = s.add_entries(ledger, KEY, ids, payloads, last_add_confirmed=next_id[ledger] - 1)
            if ledger in fenced:
                assert set(codes) == {pb.FENCED}
                continue
            assert set(codes) == {pb.OK}
            acked.update(zip(((ledger, e) for e in ids), payloads, strict=True))
            next_id[ledger] += count
        elif r < 0.90:
            s.fence(ledger, KEY)
            fenced.add(ledger)
        elif r < 0.96:
            time.sleep(rng.random() * 0.02)  # let the flusher get somewhere
        else:
            s.roll()
    return acked, fenced


@pytest.mark.parametrize("seed", range(SEEDS))
def test_power_loss(tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    cfg = small_config(tmp_path / "bookie", log_size_bytes_max=64 * KIB, batch_bytes_max=48 * KIB,
                       entry_size_bytes_max=8 * KIB, read_bytes_max=64 * KIB)
    sim = SimIO(str(tmp_path))
    s = Storage.open(cfg, io=sim)
    acked, fenced = run_workload(s, rng)
    durable_point = s._recovery_point.log_id
    log_of = {}
    for key in acked:
        loc = s._locate(*key)
        assert loc is not None
        log_of[key] = loc[0]
    sim.crash()
    s.abandon()
    sim.power_loss(rng, keep_unsynced=rng.random() < 0.8)
    monkeypatch.setenv(BOOT_ID_ENV, f"rebooted-{seed}")  # a power loss is a reboot

    s = Storage.open(cfg)  # real IO from here on
    try:
        assert s.recovery.unclean and s.tail_maybe_lost
        assert s.recovery.recovery_point_log_id >= durable_point
        lost = 0
        for (ledger, entry), payload in acked.items():
            try:
                got = s.read_entry(ledger, entry)
            except StorageError as e:
                assert log_of[(ledger, entry)] >= durable_point, (
                    f"entry {ledger}/{entry} in synced log {log_of[(ledger, entry)]} lost: {e.message}")
                assert e.code == pb.UNKNOWN, e.message  # never "no such entry": it may have been lost here
                lost += 1
                continue
            assert got == payload, f"entry {ledger}/{entry} came back with other bytes"
        for ledger, entry, *_ in s.index.all_entries():
            assert s.read_entry(ledger, entry) == acked[(ledger, entry)]
        for ledger in fenced:
            state = s.ledger_state(ledger)
            assert state is not None and state.fenced, f"fence of ledger {ledger} forgotten"
        for scan in s.recovery.scans:
            path = Path(cfg.data_dir) / LOGS_DIR / log_file_name(scan.log_id)
            if path.exists():
                again = scan_log(FileIO(), str(path), scan.log_id)
                assert again.error is None, f"log {scan.log_id} still damaged after recovery: {again.error}"
        # The bookie goes on working after the power loss.
        codes, _ = s.add_entries(100, KEY, [0, 1], [b"after", b"power loss"])
        assert codes == [pb.OK, pb.OK]
    finally:
        s.close()
    s = Storage.open(cfg)
    try:
        assert s.read_entry(100, 1) == b"power loss" and s.recovery.logs_scanned == 0 and not s.tail_maybe_lost
    finally:
        s.close()


def test_power_loss_keeps_nothing_unsynced_when_writeback_never_happened(tmp_path: Path) -> None:
    """The harshest case, forced: no unsynced byte survives. Everything flushed before stays."""
    cfg = small_config(tmp_path / "bookie", log_size_bytes_max=64 * KIB, batch_bytes_max=48 * KIB,
                       entry_size_bytes_max=8 * KIB, read_bytes_max=64 * KIB)
    sim = SimIO(str(tmp_path))
    s = Storage.open(cfg, io=sim)
    for first in range(0, 200, 40):
        ids = list(range(first, first + 40))
        codes, _ = s.add_entries(1, KEY, ids, [payload_for(1, e, 1000) for e in ids])
        assert set(codes) == {pb.OK}
    deadline = time.monotonic() + 10
    while s.pending_flushes() and time.monotonic() < deadline:
        time.sleep(0.01)
    flushed_point = s._recovery_point.log_id
    assert flushed_point >= 2
    s._flusher.stop()
    codes, _ = s.add_entries(1, KEY, [200, 201], [b"unsynced", b"tail"])
    assert set(codes) == {pb.OK}
    sim.crash()
    s.abandon()
    sim.power_loss(random.Random(0), keep_unsynced=False)
    s = Storage.open(cfg)
    try:
        with pytest.raises(StorageError):
            s.read_entry(1, 201)
        # What the flushed logs held is all there.
        last_flushed = max(e for lid, e, log_id, *_ in s.index.all_entries() if log_id < flushed_point)
        for e in range(last_flushed + 1):
            assert s.read_entry(1, e) == payload_for(1, e, 1000)
    finally:
        s.close()


@pytest.mark.parametrize("seed", range(10))
def test_fsync_policy_batch_keeps_every_acknowledged_entry_through_power_loss(tmp_path: Path, seed: int) -> None:
    """For one-replica users: with fsync_policy=batch nothing acknowledged may be lost, synced log or not."""
    rng = random.Random(seed)
    cfg = small_config(tmp_path / "bookie", log_size_bytes_max=64 * KIB, batch_bytes_max=48 * KIB,
                       entry_size_bytes_max=8 * KIB, read_bytes_max=64 * KIB, fsync_policy="batch")
    sim = SimIO(str(tmp_path))
    s = Storage.open(cfg, io=sim)
    acked, _ = run_workload(s, rng)
    sim.crash()
    s.abandon()
    sim.power_loss(rng, keep_unsynced=False)
    s = Storage.open(cfg)
    try:
        for (ledger, entry), payload in acked.items():
            assert s.read_entry(ledger, entry) == payload
    finally:
        s.close()
