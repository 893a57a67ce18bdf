"""Transactional compaction in the storage engine: what it reclaims, what it keeps, and every way it can stop.

Crashes here are simulated in-process (a fault point raises, the storage is abandoned without syncing and
reopened); test_crash.py kills a real bookie with SIGKILL at the same points.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.node import compaction, faults
from octavo.node.compaction import Compactor
from octavo.node.compaction_plan import MAJOR, MINOR
from octavo.node.config import NodeConfig
from octavo.node.errors import StorageError
from octavo.node.fileio import FileIO
from octavo.node.files import COMPACTED_SUFFIX, COMPACTING_SUFFIX, LOGS_DIR
from octavo.node.storage import Storage
from octavo.node.testing import payload_for, roll_and_flush, small_config
from octavo.v1 import bookie_pb2 as pb

KEY = b"k"
SIZE = 1000
PER_BATCH = 20


@pytest.fixture
def cfg(tmp_path: Path) -> NodeConfig:
    return small_config(tmp_path / "bookie", compaction_rate_bytes_per_s=0)


def fill(s: Storage, ledgers: list[int], batches: int) -> None:
    """Interleave the ledgers' entries batch by batch, so every log holds some of each."""
    for b in range(batches):
        for lid in ledgers:
            ids = list(range(b * PER_BATCH, (b + 1) * PER_BATCH))
            codes, msg = s.add_entries(lid, KEY, ids, [payload_for(lid, e, SIZE) for e in ids])
            assert set(codes) == {pb.OK}, msg


def flushed(s: Storage) -> None:
    roll_and_flush(s)


def log_files(cfg: NodeConfig) -> dict[str, int]:
    d = Path(cfg.data_dir) / LOGS_DIR
    return {p.name: p.stat().st_size for p in d.iterdir()}


def logs_bytes(cfg: NodeConfig) -> int:
    return sum(log_files(cfg).values())


def check_all(s: Storage, ledgers: list[int], batches: int) -> None:
    for lid in ledgers:
        for e in range(batches * PER_BATCH):
            assert s.read_entry(lid, e) == payload_for(lid, e, SIZE), (lid, e)


def build(cfg: NodeConfig, keep: list[int], drop: list[int], batches: int = 40) -> Storage:
    s = Storage.open(cfg)
    fill(s, sorted(keep + drop), batches)
    flushed(s)
    s.drop_ledgers(drop)
    return s


def test_major_compaction_reclaims_dead_bytes_and_keeps_every_live_entry(cfg: NodeConfig) -> None:
    s = build(cfg, keep=[1], drop=[2, 3, 4])  # each log is about 25% live
    before = logs_bytes(cfg)
    old_logs = set(s.log_accounting())
    assert s.collect_garbage().logs_deleted == 0  # every log still holds ledger 1
    report = Compactor(s).run(MAJOR)
    assert not report.error and not report.stopped
    assert report.logs_compacted == len(old_logs) and report.compaction_logs >= 1
    assert report.entries_copied == 40 * PER_BATCH
    after = logs_bytes(cfg)
    assert report.bytes_reclaimed == before - after
    assert after < before * 0.3
    assert not set(s.log_accounting()) & old_logs  # every old log is gone
    live, total = s.disk_bytes()
    assert live > 0.95 * total  # the compaction logs hold live records only (and ledger-key records)
    check_all(s, [1], 40)
    assert not any(n.endswith((COMPACTING_SUFFIX, COMPACTED_SUFFIX)) for n in log_files(cfg))
    assert Compactor(s).run(MAJOR).logs_compacted == 0  # nothing left to do
    s.close()
    s = Storage.open(cfg)  # the compaction logs are normal logs now; the index points into them
    try:
        check_all(s, [1], 40)
        assert s.recovery.records_replayed == 0
    finally:
        s.close()


def test_minor_compaction_leaves_logs_above_its_threshold(cfg: NodeConfig) -> None:
    s = build(cfg, keep=[1], drop=[2])  # each log is about 50% live: above minor (0.2), below major (0.8)
    try:
        assert Compactor(s).run(MINOR).logs_compacted == 0
        assert Compactor(s).run(MAJOR).logs_compacted > 0
        check_all(s, [1], 40)
    finally:
        s.close()


def test_a_fenced_ledger_stays_fenced_in_an_index_rebuilt_from_compacted_logs(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    fill(s, [1, 2], 20)
    s.fence(1, KEY)
    fill(s, [2], 20)
    flushed(s)
    s.drop_ledgers([2])
    assert Compactor(s).run(MAJOR).logs_compacted > 0
    s.close()
    index_dir = Path(cfg.data_dir) / "index"
    for f in index_dir.iterdir():
        f.unlink()
    index_dir.rmdir()
    s = Storage.open(cfg)  # rebuilt from the logs alone
    try:
        state = s.ledger_state(1)
        assert state is not None and state.fenced
        check_all(s, [1], 20)
    finally:
        s.close()


def test_peak_extra_disk_stays_within_about_one_log(cfg: NodeConfig) -> None:
    s = build(cfg, keep=[1, 2], drop=[3], batches=60)  # about 67% live: a major candidate
    base = logs_bytes(cfg)
    peak = [base]

    def sample(_: object) -> None:
        peak[0] = max(peak[0], logs_bytes(cfg))

    try:
        report = Compactor(s).run(MAJOR, on_progress=sample)
        assert report.logs_compacted > 3 and report.compaction_logs > 1
        extra = peak[0] - base
        assert extra <= cfg.log_size_bytes_max * 1.1, (extra, cfg.log_size_bytes_max)
        check_all(s, [1, 2], 60)
    finally:
        s.close()


def test_a_corrupt_record_is_reported_and_its_log_kept_until_the_entry_is_repaired(cfg: NodeConfig) -> None:
    """Compaction over a damaged log (issue 43): the other logs are compacted, the damaged one stays (the index
    still points into it), the damage is recorded, and the entry stays repairable; once repaired, the next pass
    compacts that log too."""
    s = build(cfg, keep=[1], drop=[2, 3])
    metas = s.log_accounting()
    victim = min(metas)
    entries = sorted(s.index.entries_in(victim, [1]), key=lambda e: e[2])
    assert len(entries) > 10
    _, bad_entry, bad_offset, _ = entries[3]
    path = Path(cfg.data_dir) / LOGS_DIR / f"{victim:016x}.log"
    with open(path, "r+b") as f:  # flip a payload byte: the record's checksum no longer matches
        f.seek(bad_offset + 30)
        byte = f.read(1)
        f.seek(bad_offset + 30)
        f.write(bytes([byte[0] ^ 0xFF]))
    try:
        compactor = Compactor(s)
        found: list[tuple[int, int, str]] = []
        compactor.on_damage = lambda lid, eid, why: found.append((lid, eid, why))
        report = compactor.run(MAJOR)
        assert report.corrupt_records == 1 and not report.error
        assert report.logs_compacted == len(metas) - 1  # every other log
        assert path.exists() and victim in s.log_accounting()
        assert [(lid, eid) for lid, eid, _ in found] == [(1, bad_entry)] and f"log {victim}" in found[0][2]
        for e in range(40 * PER_BATCH):
            if e == bad_entry:
                with pytest.raises(StorageError) as err:
                    s.read_entry(1, e)
                assert err.value.code == pb.CORRUPT
            else:
                assert s.read_entry(1, e) == payload_for(1, e, SIZE)
        codes, message = s.repair_entries(1, KEY, [bad_entry], [payload_for(1, bad_entry, SIZE)])
        assert codes == [pb.OK], message
        assert s.read_entry(1, bad_entry) == payload_for(1, bad_entry, SIZE)
        flushed(s)
        report = compactor.run(MAJOR)
        assert not path.exists() and not report.error  # the dead damaged record is stepped over
        check_all(s, [1], 40)
    finally:
        s.close()


class FlakyIndexIO(FileIO):
    """FileIO whose next index sync fails once armed: an index flush failure (seed 000)."""

    def __init__(self) -> None:
        self.fail_next = False

    def index_synced(self, index_dir: str) -> None:
        if self.fail_next:
            self.fail_next = False
            raise OSError(5, "injected index flush failure")


def test_an_index_flush_failure_is_retried_by_the_next_pass_and_never_stalls_gc(cfg: NodeConfig) -> None:
    io = FlakyIndexIO()
    s = Storage.open(cfg, io)
    try:
        fill(s, [1, 2, 3], 40)
        flushed(s)
        s.drop_ledgers([2, 3])
        io.fail_next = True  # the index switch of the first compaction log fails
        first = Compactor(s).run(MAJOR)
        assert "injected index flush failure" in first.error
        assert any(n.endswith(COMPACTED_SUFFIX) for n in log_files(cfg))  # complete, not switched yet
        check_all(s, [1], 40)  # reads are served from the old logs meanwhile
        s.drop_ledgers([1])  # GC goes on: it finishes the compaction, then deletes what is dead
        gc = s.collect_garbage()
        assert gc.logs_deleted > 0
        assert not any(n.endswith((COMPACTING_SUFFIX, COMPACTED_SUFFIX)) for n in log_files(cfg))
        assert logs_bytes(cfg) == 0 or all(not m.ledger_bytes for m in s.log_accounting().values())
    finally:
        s.close()


class Crash(Exception):
    pass


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Arm a fault point in this process: hitting it raises Crash (the storage is then abandoned)."""
    armed: list[str] = []
    real_hit = faults.hit

    def hit(name: str) -> None:
        if name in armed:
            armed.remove(name)
            raise Crash(name)
        real_hit(name)

    monkeypatch.setattr(faults, "hit", hit)
    monkeypatch.setattr(compaction.faults, "hit", hit)
    yield armed


@pytest.mark.parametrize("point", faults.COMPACTION_POINTS)
def test_a_crash_at_each_phase_is_rolled_back_or_finished_and_piles_up_nothing(
        cfg: NodeConfig, crash_at: list[str], point: str) -> None:
    s = build(cfg, keep=[1], drop=[2, 3])
    s.close()
    clean = None
    for attempt in range(3):  # crash at the same point again and again: nothing may accumulate
        s = Storage.open(cfg)
        check_all(s, [1], 40)
        crash_at.append(point)
        report = Compactor(s).run(MAJOR)
        if not report.error:  # the point was passed without a hit (already compacted): done
            s.close()
            break
        assert f"Crash: {point}" in report.error
        s.abandon()
        s = Storage.open(cfg)  # startup rolls the compaction back or finishes it
        names = log_files(cfg)
        assert not any(n.endswith((COMPACTING_SUFFIX, COMPACTED_SUFFIX)) for n in names), names
        check_all(s, [1], 40)
        size = logs_bytes(cfg)
        clean = size if clean is None else clean
        # A rolled-back copy leaves the originals; a finished one leaves the copies: never both.
        assert size <= clean + cfg.log_size_bytes_max, (attempt, size, clean)
        s.close()
    s = Storage.open(cfg)
    try:
        crash_at.clear()
        Compactor(s).run(MAJOR)  # the next pass finishes the job
        assert Compactor(s).run(MAJOR).logs_compacted == 0
        live, total = s.disk_bytes()
        assert live > 0.95 * total
        check_all(s, [1], 40)
    finally:
        s.close()


def test_a_pass_stops_at_a_safe_point_when_its_window_closes(cfg: NodeConfig) -> None:
    s = build(cfg, keep=[1], drop=[2, 3])
    c = Compactor(s)
    calls = [0]

    def close_window(_: object) -> None:
        calls[0] += 1
        if calls[0] == 3:
            c.set_window(int(time.time() * 1000) - 1)

    try:
        report = c.run(MAJOR, on_progress=close_window)
        assert report.stopped == "the compaction window closed"
        assert 0 < report.logs_compacted < len(s.log_accounting()) + report.logs_compacted
        assert not any(n.endswith((COMPACTING_SUFFIX, COMPACTED_SUFFIX)) for n in log_files(cfg))
        check_all(s, [1], 40)
        assert c.blocked_reason() == "the compaction window closed"
        c.set_window(0)
        assert c.blocked_reason() == ""
        assert c.run(MAJOR).logs_compacted > 0
        check_all(s, [1], 40)
    finally:
        s.close()


def test_suspend_and_window_survive_a_restart(cfg: NodeConfig) -> None:
    s = Storage.open(cfg)
    c = Compactor(s)
    c.set_suspended(True)
    c.set_window(123)
    s.close()
    s = Storage.open(cfg)
    try:
        c = Compactor(s)
        assert c.suspended and c.window_until_ms == 123
        assert "suspended" in c.blocked_reason()
    finally:
        s.close()


def test_the_rate_limit_paces_the_copy(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "b", compaction_rate_bytes_per_s=1024 * 1024)
    s = build(cfg, keep=[1], drop=[2, 3])
    try:
        report = Compactor(s).run(MAJOR)
        # ~800 KB at 1 MiB/s: the pass cannot finish much faster than the limit allows.
        assert report.bytes_copied > 700_000
        assert report.duration_s >= report.bytes_copied / (1024 * 1024) * 0.9
    finally:
        s.close()


def test_compaction_settings_are_checked(tmp_path: Path) -> None:
    from octavo.node.config import ConfigError

    for bad in ({"compaction_minor_threshold": 0.8, "compaction_major_threshold": 0.8},
                {"compaction_minor_threshold": 0.5, "compaction_major_threshold": 0.2},
                {"compaction_rate_bytes_per_s": -1}):
        with pytest.raises(ConfigError, match="compaction"):
            small_config(tmp_path, **bad).validate()


def test_a_pass_stops_at_its_run_time_limit_and_the_next_one_goes_on(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "b", compaction_rate_bytes_per_s=1024 * 1024, compaction_run_time_ms_max=300)
    s = build(cfg, keep=[1], drop=[2, 3])
    try:
        first = Compactor(s).run(MAJOR)
        assert first.stopped.startswith("run time limit reached") and first.logs_compacted < len(s.log_accounting()) + 1
        assert not any(n.endswith((COMPACTING_SUFFIX, COMPACTED_SUFFIX)) for n in log_files(cfg))
        check_all(s, [1], 40)
        done = first.logs_compacted
        for _ in range(40):
            report = Compactor(s).run(MAJOR)
            done += report.logs_compacted
            if not report.stopped:
                break
        assert not report.stopped and done > first.logs_compacted
        check_all(s, [1], 40)
    finally:
        s.close()
