"""Every file and suffix in a bookie's data directory, in one place (pure: names only, no IO).

    logs/<16 hex>.log                   an entry log: header, then records; fsynced by the flusher
    logs/<16 hex>.log.corrupt           a log whose header was invalid, set aside by startup recovery
    logs/<16 hex>.log.compacting        compaction phase 1: a compaction log being written (rolled back)
    logs/<16 hex>.log.compacted         compaction phase 2: synced and complete (finished)
    logs/<16 hex>.log.compacted.corrupt a complete compaction log found unreadable, set aside
    index/                              LMDB: entry locations, the ledger table, per-log accounting
    recovery-point                      atomic replace: every log below this id is durable and indexed
    node-state                          atomic replace: identity, unclean restarts, forced modes
    running                             present at start: the last stop was unclean
    lock                                flock while the bookie runs: one bookie per directory

Atomic replacement writes `<name>.tmp`, fsyncs it, renames it over `<name>` and fsyncs the directory.
docs/durability.md ("Files in a data directory") is the same table with what restart does with each.
"""

from __future__ import annotations

LOGS_DIR = "logs"
INDEX_DIR = "index"
LOCK_FILE = "lock"
RECOVERY_POINT_FILE = "recovery-point"
NODE_STATE_FILE = "node-state"
RUNNING_MARKER_FILE = "running"

LOG_FILE_SUFFIX = ".log"
LOG_ID_HEX_DIGITS = 16
CORRUPT_SUFFIX = ".corrupt"          # set aside for inspection, never read again
COMPACTING_SUFFIX = ".compacting"    # compaction phase 1: being written; rolled back after a crash
COMPACTED_SUFFIX = ".compacted"      # compaction phase 2 done: synced and complete; finished after a crash
TMP_SUFFIX = ".tmp"                  # an atomic replacement being written


def log_file_name(log_id: int, suffix: str = "") -> str:
    """`<16 hex digits>.log` plus an optional state suffix (COMPACTING_SUFFIX, ...)."""
    if log_id < 0:
        raise ValueError(f"log id must be non-negative, got {log_id}")
    return f"{log_id:0{LOG_ID_HEX_DIGITS}x}{LOG_FILE_SUFFIX}{suffix}"


def parse_log_file_name(name: str, suffix: str = "") -> int | None:
    """The log id of `name` if it is an entry-log file name with exactly `suffix` after `.log`, else None."""
    tail = LOG_FILE_SUFFIX + suffix
    if not name.endswith(tail) or len(name) != LOG_ID_HEX_DIGITS + len(tail):
        return None
    try:
        return int(name[:LOG_ID_HEX_DIGITS], 16)
    except ValueError:
        return None
