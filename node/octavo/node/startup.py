"""A bookie's start, step by step, in this order (Storage._open runs them):

1. the data and logs directories exist, and a new one's entries are synced before anything goes in them;
2. the directory lock (`flock`): one bookie per directory;
3. the identity (`node-state`): created on the first start; an unclean stop (the `running` marker is there)
   is counted, and one across a reboot (another kernel boot id) means the unsynced tail may be lost;
4. the index (LMDB) and its ledger table;
5. the recovery point to go by (startup_cases.recovery_point_to_use);
6. interrupted compactions are rolled back or finished (compaction.recover_interrupted);
7. every entry log at or past the recovery point is scanned and decided (startup_cases.decide): replayed
   into the write cache, cut, deleted or quarantined; the replayed logs go to the flusher as rolled logs.

What each situation on disk leads to is the decision table in startup_cases.py; this module does the IO.
"""

from __future__ import annotations

import fcntl
import logging
import os
import uuid
from dataclasses import dataclass, field

import lmdb

from octavo.node.checkpoint import (
    CheckpointError,
    NodeState,
    read_node_state,
    read_recovery_point,
    write_node_state,
)
from octavo.node.entrylog import LOCATION_LENGTH_BITS, ROLLED, EntryLog
from octavo.node.entrylogio import open_entry_log
from octavo.node.errors import StorageError
from octavo.node.fileio import FileIO
from octavo.node.files import INDEX_DIR, LOCK_FILE, log_file_name, parse_log_file_name
from octavo.node.index import Index
from octavo.node.ledgers import LedgerTable
from octavo.node.record import ENTRY_ID_COMPACTED_FROM, ENTRY_ID_FENCE, ENTRY_ID_LEDGER_KEY
from octavo.node.recovery import LogScan, apply_scan, scan_log
from octavo.node.recoverypoint import RecoveryPoint
from octavo.node.startup_cases import Action, Kind, needs_scan, recovery_point_to_use
from octavo.node.synclost import SYNC_LOST_KEY
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# Tests simulate a reboot (after a simulated power loss) by setting this; production never does.
BOOT_ID_ENV = "OCTAVO_BOOT_ID"


def current_boot_id() -> str:
    override = os.environ.get(BOOT_ID_ENV)
    if override:
        return override
    try:
        with open(BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass
class RecoveryReport:
    """What the last startup found and did (shown in status)."""

    unclean: bool = False
    recovery_point_log_id: int = 0
    logs_scanned: int = 0
    records_replayed: int = 0
    bytes_truncated: int = 0
    scans: list[LogScan] = field(default_factory=list)


def prepare_directories(io: FileIO, data_dir: str, logs_dir: str) -> None:
    fresh = not os.path.isdir(logs_dir)
    os.makedirs(logs_dir, exist_ok=True)
    if fresh:  # make the new directories' own entries durable before anything in them is
        io.fsync_dir(os.path.dirname(data_dir))
        io.fsync_dir(data_dir)
        io.fsync_dir(logs_dir)


def take_dir_lock(data_dir: str) -> int:
    """The directory lock's fd (held while the bookie runs); StorageError if another bookie holds it."""
    fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StorageError(pb.INTERNAL, f"data directory {data_dir} is in use by another bookie") from None
    return fd


# The node state's key that says why the tail after the recovery point may be lost: set by the start that finds
# it so (an unclean stop across a reboot, a failed sync), removed once tail repair went through (repair.py). A
# start that still finds it doubts again, whatever the boot id and however the last run stopped: a crash (or a
# clean stop) before the repair finished does not make the bookie sure of what it may still lack.
TAIL_MAYBE_LOST_KEY = "tail_maybe_lost"


@dataclass(frozen=True)
class Identity:
    state: NodeState
    fresh: bool            # this start created the data directory's identity
    tail_maybe_lost: bool  # the last stop was unclean and crossed a reboot, or followed a failed sync


def load_identity(io: FileIO, data_dir: str, unclean: bool, now_ms: int, boot: str) -> Identity:
    try:
        state = read_node_state(io, data_dir)
    except CheckpointError as e:
        raise StorageError(pb.INTERNAL, f"{e}: the bookie's identity in {data_dir} cannot be trusted; "
                                        "restore the file from a backup (removing it makes a new bookie id)"
                           ) from e
    fresh = False
    if state is None:
        state = NodeState(instance_id=str(uuid.uuid4()), created_unix_ms=now_ms)
        write_node_state(io, data_dir, state)
        fresh = True
    tail_maybe_lost = False
    if unclean:
        state.unclean_restart_count += 1
        state.last_unclean_restart_unix_ms = now_ms
        # A process crash leaves the page cache, and so every acknowledged entry, in place; only a stop
        # across a reboot (power loss, kernel crash) can lose the unsynced tail. The kernel's boot id
        # tells them apart; an unknown boot id counts as a reboot.
        tail_maybe_lost = not boot or state.extra.get("boot_id") != boot
        log.warning("the last stop of this bookie was unclean (%d so far), %s", state.unclean_restart_count,
                    "across a reboot: the unsynced tail may be lost" if tail_maybe_lost
                    else "without a reboot: the page cache kept every acknowledged entry",
                    extra={"event": "unclean_restart"})
    lost = state.extra.pop(SYNC_LOST_KEY, "")
    if lost:  # the last run's sync failed (synclost.py): what it wrote after the recovery point may be gone
        tail_maybe_lost = True
        log.warning("the last run of this bookie stopped after a failed sync (%s): the unsynced tail may be lost",
                    lost, extra={"event": "unclean_restart"})
    pending = str(state.extra.get(TAIL_MAYBE_LOST_KEY) or "")
    if pending:
        log.warning("the tail repair after %s has not finished yet: the unsynced tail may still be lost", pending,
                    extra={"event": "unclean_restart"})
    elif tail_maybe_lost:
        state.extra[TAIL_MAYBE_LOST_KEY] = f"a failed sync ({lost})" if lost else "an unclean stop across a reboot"
    if state.extra.get("boot_id") != boot or unclean or lost:
        state.extra["boot_id"] = boot
        write_node_state(io, data_dir, state)
    return Identity(state, fresh, tail_maybe_lost or bool(pending))


def tail_repair_done(io: FileIO, data_dir: str, state: NodeState | None) -> None:
    """Tail repair copied back everything the bookie may have lost: the next start need not doubt (the marker
    TAIL_MAYBE_LOST_KEY goes, synced). Raises OSError when the node state cannot be written."""
    if state is not None and state.extra.pop(TAIL_MAYBE_LOST_KEY, None) is not None:
        write_node_state(io, data_dir, state)


def open_index(io: FileIO, data_dir: str, map_size_bytes: int) -> Index:
    try:
        return Index(data_dir, io, map_size_bytes)
    except lmdb.Error as e:
        raise StorageError(pb.INTERNAL, f"the index in {os.path.join(data_dir, INDEX_DIR)} is unreadable "
                                        f"({e}); move that directory aside and restart: the bookie rebuilds "
                                        "it from the entry logs") from e


def choose_recovery_point(io: FileIO, data_dir: str, index_existed: bool) -> RecoveryPoint:
    stored: RecoveryPoint | None = None
    checksum_ok = True
    try:
        stored = read_recovery_point(io, data_dir)
    except CheckpointError as e:
        log.warning("recovery point unreadable (%s): scanning every entry log", e)
        checksum_ok = False
    point = RecoveryPoint(recovery_point_to_use(stored.log_id if stored else None, checksum_ok, index_existed))
    if stored is not None and stored.log_id > 0 and point.log_id == 0 and checksum_ok:
        log.warning("the index is missing but the recovery point is at log %d: rebuilding the index from "
                    "every entry log", stored.log_id)
    return point


@dataclass
class Replayed:
    logs: list[EntryLog]        # rolled logs for the flusher, oldest first
    next_log_id: int
    report: RecoveryReport


def replay_logs(io: FileIO, logs_dir: str, point: RecoveryPoint, unclean: bool,
                ledgers: LedgerTable) -> Replayed:
    """Scan and decide every entry log at or past the recovery point; replay the kept ones into their write
    caches and into `ledgers` (the ledger table, updated in place; a ledger first met in these logs gets its
    row written by the next flush)."""
    report = RecoveryReport(unclean=unclean, recovery_point_log_id=point.log_id)
    log_ids = sorted(i for i in map(parse_log_file_name, io.listdir(logs_dir)) if i is not None)
    logs: list[EntryLog] = []
    for log_id in log_ids:
        if not needs_scan(Kind.LOG, log_id, point.log_id):
            continue  # Action.SKIP: fsynced and indexed before the point moved past it
        scan = scan_log(io, os.path.join(logs_dir, log_file_name(log_id)), log_id)
        report.scans.append(scan)
        report.logs_scanned += 1
        apply_scan(io, logs_dir, scan)
        if scan.action in (Action.DELETE, Action.QUARANTINE):
            continue
        report.bytes_truncated += scan.bytes_truncated
        entry_log = open_entry_log(io, logs_dir, log_id, ROLLED)
        _replay(entry_log, scan, ledgers)
        report.records_replayed += len(scan.records)
        scan.records = []  # replayed: the report keeps what happened, not the payloads of the whole tail
        logs.append(entry_log)
    log.info("recovery: point %d, %d logs scanned, %d records replayed, %d bytes cut", point.log_id,
             report.logs_scanned, report.records_replayed, report.bytes_truncated)
    return Replayed(logs, max([point.log_id, *(i + 1 for i in log_ids)]), report)


def _replay(entry_log: EntryLog, scan: LogScan, ledgers: LedgerTable) -> None:
    """Index a recovered log's records in its cache and rebuild the ledger states they imply."""
    for rec in scan.records:
        if rec.entry_id == ENTRY_ID_LEDGER_KEY:
            if rec.ledger_id not in ledgers:
                ledgers.create(rec.ledger_id, rec.payload)
            entry_log.cache.setdefault(rec.ledger_id, {})
            continue
        if rec.entry_id == ENTRY_ID_COMPACTED_FROM:
            continue
        state = ledgers.get(rec.ledger_id)
        if state is None:  # cannot happen: a ledger's key record precedes its entries in every log
            raise StorageError(pb.INTERNAL, f"entry log {entry_log.log_id} holds ledger {rec.ledger_id} "
                                            "entries without its key record")
        if rec.entry_id == ENTRY_ID_FENCE:
            state.fenced = True
            continue
        entries = entry_log.cache.setdefault(rec.ledger_id, {})
        if rec.entry_id not in entries:
            entry_log.cache_entries += 1
        entries[rec.entry_id] = rec.offset << LOCATION_LENGTH_BITS | rec.length
        if rec.entry_id > state.last_entry_id:
            state.last_entry_id = rec.entry_id
