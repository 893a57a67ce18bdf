"""Startup recovery as a decision table (TigerBeetle's `recovery_cases`): every situation a start can find
in a data directory, and what recovery does with it. Pure: the facts come in (from a directory listing and a
scan), the action goes out; recovery.py and compaction.py carry it out. docs/durability.md ("Startup
recovery: the decision table") names the same rows, and node/tests/test_startup_cases.py checks each row and
every combination of facts.

The recovery point itself: missing means 0 (scan every log); failing its checksum means 0 as well, with a
warning (slower, never wrong); an index missing while the point is past 0 also means 0 (the index is rebuilt
from every log). See `recovery_point_to_use`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    SKIP = "skip"                # below the recovery point: fsynced and indexed before the point moved
    REPLAY = "replay"            # index every record in the write cache, hand the log to the flusher
    CUT = "cut"                  # truncate at the first torn or invalid record, then replay what is before it
    DELETE = "delete"            # shorter than its header: it never held a whole record
    QUARANTINE = "quarantine"    # rename to `<name>.corrupt`: nothing in it is trusted
    ROLL_BACK = "roll back"      # an interrupted compaction copy: delete the compaction log
    FINISH = "finish"            # a complete compaction log: switch the index, delete its sources, rename


class Kind(StrEnum):
    LOG = "log"                  # `<id>.log`
    COMPACTING = "compacting"    # `<id>.log.compacting`
    COMPACTED = "compacted"      # `<id>.log.compacted`


@dataclass(frozen=True)
class LogFacts:
    """What a start knows of one file in `logs/`. For an entry log at or past the recovery point, the scan
    fills in header_ok and valid_end; for a complete compaction log, reading it back fills in readable."""

    kind: Kind
    log_id: int
    size_bytes: int = 0
    header_bytes: int = 32
    header_ok: bool = True       # the header decodes and names this log id
    valid_end: int = 0           # offset just past the last whole valid record
    readable: bool = True        # a compaction log's records and trailer read back whole


@dataclass(frozen=True)
class Case:
    name: str
    situation: str
    action: Action
    example: LogFacts
    recovery_point: int = 10


def decide(facts: LogFacts, recovery_point: int) -> Action:
    """The action for one file: the table below, as code."""
    if facts.kind is Kind.COMPACTING:
        return Action.ROLL_BACK
    if facts.kind is Kind.COMPACTED:
        return Action.FINISH if facts.readable else Action.QUARANTINE
    if facts.log_id < recovery_point:
        return Action.SKIP
    if facts.size_bytes < facts.header_bytes:
        return Action.DELETE
    if not facts.header_ok:
        return Action.QUARANTINE
    if facts.valid_end < facts.size_bytes:
        return Action.CUT
    return Action.REPLAY


def needs_scan(kind: Kind, log_id: int, recovery_point: int) -> bool:
    """Whether deciding needs the log's bytes read: only entry logs at or past the recovery point."""
    return kind is Kind.LOG and log_id >= recovery_point


def recovery_point_to_use(stored: int | None, checksum_ok: bool, index_exists: bool) -> int:
    """The recovery point a start goes by: the stored one, or 0 (scan every log) when there is none, when it
    fails its checksum, or when the index it vouches for is missing."""
    if stored is None or not checksum_ok or (stored > 0 and not index_exists):
        return 0
    return stored


CASES: tuple[Case, ...] = (
    Case("below-point", "an entry log below the recovery point", Action.SKIP,
         LogFacts(Kind.LOG, 3, size_bytes=1000, valid_end=1000)),
    Case("whole", "an entry log at or past the point, valid to its end", Action.REPLAY,
         LogFacts(Kind.LOG, 10, size_bytes=1000, valid_end=1000)),
    Case("torn-tail", "an entry log at or past the point with a torn or invalid record", Action.CUT,
         LogFacts(Kind.LOG, 11, size_bytes=1000, valid_end=600)),
    Case("short", "an entry log at or past the point, shorter than its header", Action.DELETE,
         LogFacts(Kind.LOG, 12, size_bytes=20)),
    Case("foreign-header", "an entry log at or past the point whose header is invalid or names another log",
         Action.QUARANTINE, LogFacts(Kind.LOG, 13, size_bytes=1000, header_ok=False)),
    Case("compacting", "a compaction log still being copied (`.compacting`)", Action.ROLL_BACK,
         LogFacts(Kind.COMPACTING, 14, size_bytes=1000)),
    Case("compacted", "a complete compaction log not yet switched over (`.compacted`)", Action.FINISH,
         LogFacts(Kind.COMPACTED, 15, size_bytes=1000)),
    Case("compacted-unreadable", "a complete compaction log that does not read back whole", Action.QUARANTINE,
         LogFacts(Kind.COMPACTED, 16, size_bytes=1000, readable=False)),
)
