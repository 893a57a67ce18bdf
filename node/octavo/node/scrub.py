"""The scrub: re-read every flushed record the index points at and check its checksum, in the background, at a
rate limit, so that bit rot in data nobody reads is found (HDFS's block scanner, Ceph's deep scrub,
BookKeeper's local scrubber; unlike BookKeeper's, what it finds is repaired: damage.py).

A pass walks the flushed logs (the index's log accounting) one at a time, oldest first. For each it takes the
index entries that point into it, in offset order, and reads them in runs of at most SCRUB_READ_BYTES_MAX with
one pread each, pacing the bytes to scrub_rate_bytes_per_s. A record that fails its checksum, a log cut short
(the record lies past its end) or a log that is gone is damage. A failure is checked again through the index
as it is now (Engine.verify_entry) before it counts: compaction may have moved the entry meanwhile (its old
log deleted), or a repair written a new copy. Logs compaction is rewriting at that moment are skipped. Unflushed
logs are not scrubbed: their records are in the page cache, written moments ago, and a restart checks them.

What a pass finds goes to DamageFindings, which the repair task publishes as damage marks in etcd.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field

import crc32c

from octavo.node.checkpoint import write_node_state
from octavo.node.damage import DamageFindings
from octavo.node.engine import Engine
from octavo.node.files import log_file_name
from octavo.node.record import RECORD_HEADER

log = logging.getLogger(__name__)

# One pread covers at most this many bytes of back-to-back records.
SCRUB_READ_BYTES_MAX = 1024 * 1024
# Findings a pass keeps to show (RunScrub, `octavo bookie scrub`); all of them go to DamageFindings.
SCRUB_FINDINGS_SHOWN_MAX = 1000
# The pacing sleeps at most this long at a time, so a stop is seen quickly.
SCRUB_SLEEP_S_MAX = 0.2

# The node-state key that keeps when the next scheduled pass is due (unix ms) across restarts: a bookie restarted
# more often than scrub_interval_s is still scrubbed.
STATE_SCRUB_DUE_UNIX_MS = "scrub_due_unix_ms"

_HEADER = RECORD_HEADER.unpack_from
_CRC = crc32c.crc32c


@dataclass
class Finding:
    ledger_id: int
    entry_id: int
    log_id: int
    offset: int
    reason: str


@dataclass
class ScrubPass:
    started_unix_ms: int = 0
    finished_unix_ms: int = 0
    duration_s: float = 0.0
    logs: int = 0
    logs_skipped: int = 0
    records: int = 0
    bytes: int = 0
    damaged: int = 0
    stopped: bool = False
    findings: list[Finding] = field(default_factory=list)


class ScrubStopped(Exception):
    pass


def check_run(data: bytes, base: int, run: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, str]]:
    """The records of `run` ((ledger id, entry id, offset, length), offsets from `base`) that `data` (read at
    `base`) does not hold intact: (ledger id, entry id, offset, reason) each. Pure."""
    bad = []
    view = memoryview(data)
    for lid, eid, offset, length in run:
        pos = offset - base
        if pos + length > len(view):
            bad.append((lid, eid, offset, f"the log ends at {base + len(view)}, before the record's end "
                                          f"{offset + length} (truncated)"))
            continue
        crc, body_len, rec_lid, rec_eid = _HEADER(view, pos)
        if body_len + 8 != length or rec_lid != lid or rec_eid != eid:
            bad.append((lid, eid, offset, f"record header names ledger {rec_lid} entry {rec_eid} length "
                                          f"{body_len + 8}, the index ledger {lid} entry {eid} length {length}"))
        elif _CRC(view[pos + 8:pos + length], _CRC(view[pos + 4:pos + 8])) != crc:
            bad.append((lid, eid, offset, "checksum mismatch"))
    return bad


def scrub_due_unix_ms(engine: Engine, interval_s: int, now_unix_ms: int) -> int:
    """When the next scheduled pass is due: as kept in the node state, else one interval from now (kept)."""
    state = engine.node_state
    due = int(state.extra.get(STATE_SCRUB_DUE_UNIX_MS, 0)) if state is not None else 0
    if not due:
        due = now_unix_ms + interval_s * 1000
        set_scrub_due(engine, due)
    return due


def set_scrub_due(engine: Engine, due_unix_ms: int) -> None:
    state = engine.node_state
    if state is not None:
        state.extra[STATE_SCRUB_DUE_UNIX_MS] = due_unix_ms
        write_node_state(engine.io, engine.data_dir, state)


class Scrubber:
    """Scrub passes over one engine's flushed logs. run_pass blocks: run it in an executor thread."""

    def __init__(self, engine: Engine, findings: DamageFindings, rate_bytes_per_s: int, finder: str,
                 rewriting: Callable[[], Container[int]] = frozenset) -> None:
        self.engine = engine
        self.findings = findings
        self.rate_bytes_per_s = rate_bytes_per_s
        self.finder = finder
        self._rewriting = rewriting  # the logs compaction is rewriting now
        self._lock = threading.Lock()
        self.stop_event = threading.Event()
        self.running = False
        self.passes = 0
        self.bytes_verified = 0
        self.records_verified = 0
        self.damaged_records = 0
        self.current = ScrubPass()
        self.last: ScrubPass | None = None

    def run_pass(self) -> ScrubPass:
        """One pass over every flushed log; ValueError if a pass is running already."""
        with self._lock:
            if self.running:
                raise ValueError("a scrub pass is running already")
            self.running = True
        report = self.current = ScrubPass(started_unix_ms=int(time.time() * 1000))
        t0 = time.monotonic()
        try:
            for log_id in sorted(self.engine.index.log_metas()):
                if log_id in self._rewriting():
                    report.logs_skipped += 1
                    continue
                self._scrub_log(log_id, report, t0)
                report.logs += 1
        except ScrubStopped:
            report.stopped = True
        finally:
            report.duration_s = time.monotonic() - t0
            report.finished_unix_ms = int(time.time() * 1000)
            with self._lock:
                self.running = False
                self.passes += 1
                self.last = report
        if report.damaged:
            log.error("scrub: %d damaged records in %d logs (%d bytes verified in %.1fs)", report.damaged,
                      report.logs, report.bytes, report.duration_s)
        else:
            log.info("scrub: %d records in %d logs verified (%d bytes in %.1fs), no damage", report.records,
                     report.logs, report.bytes, report.duration_s)
        return report

    def _scrub_log(self, log_id: int, report: ScrubPass, t0: float) -> None:
        engine = self.engine
        meta = engine.index.log_metas().get(log_id)
        if meta is None:
            return  # deleted meanwhile (GC, compaction)
        ledgers = [lid for lid in meta.ledger_bytes if lid in engine.ledgers]
        entries = sorted(engine.index.entries_in(log_id, ledgers), key=lambda e: e[2])
        if not entries:
            return
        path = os.path.join(engine.logs_dir, log_file_name(log_id))
        try:
            fd = engine.io.open_read(path)
        except FileNotFoundError:
            for lid, eid, offset, _ in entries:
                self._damaged(lid, eid, log_id, offset, f"entry log {log_id} is missing", report)
            return
        try:
            i = 0
            while i < len(entries):
                j, start = i + 1, entries[i][2]
                end = start + entries[i][3]
                while j < len(entries) and entries[j][2] + entries[j][3] - start <= SCRUB_READ_BYTES_MAX:
                    end = entries[j][2] + entries[j][3]
                    j += 1
                run = entries[i:j]
                try:
                    data = engine.io.pread(fd, end - start, start)
                except OSError as e:
                    data = b""
                    log.error("scrub: reading entry log %d at %d failed: %s", log_id, start, e)
                for lid, eid, offset, why in check_run(data, start, run):
                    self._damaged(lid, eid, log_id, offset, why, report)
                report.records += len(run)
                report.bytes += end - start
                self.records_verified += len(run)
                self.bytes_verified += end - start
                self._pace(report.bytes, t0)
                i = j
        finally:
            engine.io.close(fd)

    def _damaged(self, ledger_id: int, entry_id: int, log_id: int, offset: int, why: str, report: ScrubPass) -> None:
        """A record failed: count it only if the entry, looked up again, still fails (compaction or a repair
        may have given it a new copy since the index was read)."""
        try:
            now = self.engine.verify_entry(ledger_id, entry_id)
        except Exception as e:  # a ledger dropped meanwhile, the engine closing: not damage
            log.info("scrub: entry %d of ledger %d not checked again (%s)", entry_id, ledger_id, e)
            return
        if not now:
            return
        reason = f"log {log_id} offset {offset}: {why}"
        report.damaged += 1
        self.damaged_records += 1
        if len(report.findings) < SCRUB_FINDINGS_SHOWN_MAX:
            report.findings.append(Finding(ledger_id, entry_id, log_id, offset, why))
        self.findings.note(ledger_id, entry_id, reason, self.finder)
        log.error("scrub: entry %d of ledger %d is damaged here (%s)", entry_id, ledger_id, reason)

    def _pace(self, done_bytes: int, t0: float) -> None:
        while True:
            if self.stop_event.is_set():
                raise ScrubStopped()
            if not self.rate_bytes_per_s:
                return
            ahead = done_bytes / self.rate_bytes_per_s - (time.monotonic() - t0)
            if ahead <= 0:
                return
            time.sleep(min(ahead, SCRUB_SLEEP_S_MAX))
