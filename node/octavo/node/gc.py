"""Garbage collection of entry logs (docs/durability.md, "Garbage collection"): delete the flushed logs none of
whose ledgers is alive. BookKeeper's GarbageCollectorThread does this and then compacts; here compaction is
its own pass (compaction.py) and the two never overlap (Engine.space_lock).

The active log and logs not yet flushed are never candidates (Engine.log_accounting lists only flushed logs).
An interrupted compaction is finished or rolled back first, so its logs are accounted for.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from octavo.node.compaction import recover_interrupted
from octavo.node.engine import Engine

log = logging.getLogger(__name__)


@dataclass
class GcReport:
    """What one garbage-collection pass did."""

    logs_checked: int = 0
    logs_deleted: int = 0
    bytes_reclaimed: int = 0
    ledgers_dropped: int = 0
    duration_s: float = 0.0
    finished_unix_ms: int = 0


def collect_garbage(engine: Engine) -> GcReport:
    """One pass: the dead logs deleted, the directory synced once, then their accounting rows forgotten."""
    t0 = time.monotonic()
    report = GcReport()
    with engine.space_lock:
        recover_interrupted(engine)
        live = engine.ledger_ids()
        deleted = []
        for log_id, meta in engine.log_accounting().items():
            report.logs_checked += 1
            if any(lid in live for lid in meta.ledger_bytes):
                continue
            report.bytes_reclaimed += engine.delete_log_file(log_id, sync_dir=False)
            report.logs_deleted += 1
            deleted.append(log_id)
        if deleted:
            engine.io.fsync_dir(engine.logs_dir)
            for log_id in deleted:
                engine.index.forget_log(log_id)
            log.info("GC deleted %d entry logs, %d bytes", report.logs_deleted, report.bytes_reclaimed)
    report.duration_s = time.monotonic() - t0
    report.finished_unix_ms = int(time.time() * 1000)
    return report
